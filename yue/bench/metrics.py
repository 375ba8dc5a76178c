"""Quality and statistics helpers for the benchmark: percentiles, repetition, chrF, AR-path NLL.

Design decisions:
- Every metric is a pure function of token ids or text, so the harness can score any mode (ours or a
  peer) the same way.
- NLL is scored by the AR path alone: one uncached plain forward (`YueForCausalLM.forward`, the same
  weights the Hugging Face peers run) over prompt + output, averaged over the output tokens.
- chrF is sacrebleu's maintained implementation (character 6-grams, beta 2), at corpus level.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import torch
import torch.nn.functional as F

from yue.errors import require

REPEAT_N = 4  # n of the n-grams the repetition rate counts


def percentile(values: Sequence[float], q: float) -> float | None:
    """The q-th percentile (0..100) with linear interpolation; None for no values."""
    if not values:
        return None
    xs = sorted(values)
    pos = (len(xs) - 1) * q / 100.0
    lo, hi = math.floor(pos), math.ceil(pos)
    return xs[lo] + (xs[hi] - xs[lo]) * (pos - lo)


def repeated_ngrams(tokens: Sequence[int], n: int = REPEAT_N) -> tuple[int, int]:
    """(repeated, total) token n-grams of one output; an n-gram is repeated when it already occurred
    earlier in the same output. The repetition rate of a mode is sum(repeated) / sum(total)."""
    seen: set[tuple[int, ...]] = set()
    repeated = total = 0
    for i in range(len(tokens) - n + 1):
        gram = tuple(tokens[i : i + n])
        total += 1
        repeated += gram in seen
        seen.add(gram)
    return repeated, total


def repetition_rate(outputs: Sequence[Sequence[int]], n: int = REPEAT_N) -> float | None:
    """Fraction of repeated token n-grams over all outputs (None when no output has n tokens)."""
    pairs = [repeated_ngrams(t, n) for t in outputs]
    total = sum(t for _, t in pairs)
    return sum(r for r, _ in pairs) / total if total else None


def chrf(hypotheses: Sequence[str], references: Sequence[str | None]) -> float | None:
    """Corpus chrF (0..100) over the prompts that have a reference; None when none has one."""
    pairs = [(h, r) for h, r in zip(hypotheses, references, strict=True) if r is not None]
    if not pairs:
        return None
    CHRF = require("sacrebleu.metrics", "bench", "chrF").CHRF
    hyps, refs = zip(*pairs, strict=True)
    return CHRF().corpus_score(list(hyps), [list(refs)]).score


@torch.inference_mode()
def ar_nll(model, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[float, int]:
    """Summed negative log-likelihood (nats) of `output_ids` given `prompt_ids` under the AR path,
    and the number of tokens scored. One uncached forward over prompt + output.

    Args:
        model: a YueForCausalLM (its plain `forward` is the AR path) or any HF causal LM.
        prompt_ids: the exact ids the output was generated from (non-empty).
        output_ids: the generated tokens.
    """
    if not output_ids:
        return 0.0, 0
    ids = torch.tensor([list(prompt_ids) + list(output_ids)], device=model.device)
    logits = model(input_ids=ids).logits[0].float()  # (T, V)
    n_prompt = len(prompt_ids)
    # Row t predicts token t + 1: the outputs sit at n_prompt.., predicted by rows n_prompt - 1 .. T - 2.
    pred = logits[n_prompt - 1 : -1]
    target = ids[0, n_prompt:]
    return float(F.cross_entropy(pred, target, reduction="sum")), len(output_ids)
