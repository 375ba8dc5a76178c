"""transformers' `generate()` on a yue model, run by yue's decode loop.

Design decisions:
- The seam: `YueForCausalLM.generate` (and `PreparedModel.generate`, the engine's model) asks the
  class's `decode_generate` hook first. The model layer
  may not import the decode loop (docs/design.md's floors), so the engine installs `generate` here as
  that hook (`engine/core.py`); a hook answering NotImplemented leaves transformers' own generate (the plain
  AR path, on yue's KV cache: `YueForCausalLM.forward`).
- What is taken: greedy and sampling (`do_sample`, `temperature`, `top_k`, `top_p`,
  `repetition_penalty`), `max_new_tokens` / `max_length`, `eos_token_id`, `pad_token_id`, a left-padded
  batch's `attention_mask`, a streamer (transformers' protocol: `put` the prompt, then each step's
  tokens, then `end`), and yue's own `mode` (default: the model's `default_mode`). Settings resolve as
  transformers resolves them (`_prepare_generation_config`: call > `model.generation_config` >
  defaults). Anything else (beams, several sequences, logits processors, returned scores) goes to
  transformers' generate.
- Output as transformers gives it: the input ids as passed, then each row's new tokens, its EOS
  included, rows that end sooner padded with `pad_token_id` (else the first EOS id).
- EOS is the caller's (`eos_token_id`, else the generation config's, else the model config's): the loop
  runs with `ignore_eos` and each row is cut here after its first EOS; the loop stops once every row
  has ended. The tokens up to it are the loop's own, so `ar` here writes what `yue generate --mode ar`
  writes.
- Sampling draws its seed from torch's global generator, so `torch.manual_seed` before `generate`
  repeats a sample, as it does with transformers.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from yue.config import DecodeConfig
from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import StepCosts
from yue.decode.loop import decode

# The keyword arguments taken here; any other goes to transformers' generate.
TAKEN = {
    "attention_mask",
    "max_new_tokens",
    "max_length",
    "do_sample",
    "temperature",
    "top_k",
    "top_p",
    "repetition_penalty",
    "eos_token_id",
    "pad_token_id",
    "use_cache",
}


def generate(
    model,
    inputs: torch.Tensor | None,
    generation_config,
    streamer,
    mode: str | None,
    kwargs: dict,
    costs: Callable[[DecodeConfig], StepCosts | None],
    corpus: CorpusNgrams | None = None,
) -> torch.Tensor:
    """`model.generate(inputs, ...)` through `decode.loop.decode`, or NotImplemented for what only
    transformers' generate does (see the module docstring).

    Args:
        inputs: (B, T) prompt ids (or `kwargs["input_ids"]`), left-padded where `kwargs["attention_mask"]`
            says.
        costs: the step costs a config's drafting weighs (the engine's measurement).
        corpus: the model's n-gram table for corpus drafts, where an engine holds one.
    Returns:
        (B, T + n) ids: the inputs, then the new tokens (EOS included), padded.
    Raises:
        ValueError: a streamer with several rows (as transformers' streamers), a mode the model cannot
            run, a bad setting (DecodeConfig names it), or no room for a new token.
    """
    kwargs = dict(kwargs)  # the caller's stay whole for transformers' generate, should it run instead
    if inputs is None:  # `model.generate(**tokenizer(text, return_tensors="pt"))`
        inputs = kwargs.pop("input_ids", None)
    if not isinstance(inputs, torch.Tensor) or inputs.dim() != 2 or set(kwargs) - TAKEN:
        return NotImplemented
    mask = kwargs.pop("attention_mask", None)
    gc, _ = model._prepare_generation_config(generation_config, **kwargs)
    if (gc.num_beams or 1) > 1 or (gc.num_return_sequences or 1) > 1 or gc.return_dict_in_generate:
        return NotImplemented
    B, T = inputs.shape
    if streamer is not None and B > 1:
        raise ValueError("a streamer takes one row at a time (batch size 1), as transformers' streamers do")
    max_new = gc.max_new_tokens if gc.max_new_tokens is not None else (gc.max_length or 0) - T
    if max_new < 1:
        raise ValueError(f"no room for a new token: max_new_tokens {max_new} (max_length {gc.max_length})")
    sampling = bool(gc.do_sample)
    cfg = DecodeConfig(
        mode=mode or model.config.decode_mode,
        max_new_tokens=max_new,
        temperature=float(gc.temperature if gc.temperature is not None else 1.0) if sampling else 0.0,
        top_k=int(gc.top_k or 0) if sampling else 0,
        top_p=float(gc.top_p if gc.top_p is not None else 1.0) if sampling else 1.0,
        repetition_penalty=float(gc.repetition_penalty or 1.0),
        seed=int(torch.randint(0, 2**62, ())) if sampling else None,
        ignore_eos=True,
    ).resolved(model.config)
    eos = _ids(gc.eos_token_id) or _ids(model.config.eos_token_id)
    pad = gc.pad_token_id if gc.pad_token_id is not None else (eos[0] if eos else 0)
    rows = (
        [row[m.bool()].tolist() for row, m in zip(inputs, mask, strict=True)]
        if mask is not None
        else inputs.tolist()
    )
    new: list[list[int]] = [[] for _ in range(B)]
    ended = [False] * B
    if streamer is not None:
        streamer.put(inputs.cpu())
    for em in decode(model, rows, cfg, lambda: all(ended), costs(cfg), corpus):
        for b in range(B):
            if ended[b] or not em.tokens[b]:
                continue
            tokens = em.tokens[b][: max_new - len(new[b])]
            cut = next((i for i, t in enumerate(tokens) if t in eos), None)
            tokens = tokens if cut is None else tokens[: cut + 1]
            new[b] += tokens
            ended[b] = cut is not None or len(new[b]) >= max_new or em.finished[b] is not None
            if streamer is not None and tokens:
                streamer.put(torch.tensor(tokens))
    if streamer is not None:
        streamer.end()
    width = max(map(len, new))
    out = torch.full((B, T + width), pad, dtype=inputs.dtype, device=inputs.device)
    out[:, :T] = inputs
    for b, tokens in enumerate(new):
        out[b, T : T + len(tokens)] = torch.tensor(tokens, dtype=inputs.dtype)
    return out


def _ids(eos: int | list[int] | None) -> list[int]:
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
