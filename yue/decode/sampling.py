"""Sampling: pure functions on logits, shared by the AR step, the drafter and the verifier.

Design decisions:
- `warp()` turns raw logits into the distribution actually sampled from (repetition penalty, then
  temperature, top-k, top-p), so the verifier's p and the drafter's q are warped identically, which
  the speculative-sampling rule requires.
- Temperature 0 means greedy; that is decided in exactly one place, `DecodeConfig.greedy`, and greedy
  never touches a random generator.
- Randomness comes only from an explicit `torch.Generator`: same seed, same sample.
- `hybrid`'s lossy acceptance (`within_tolerance`) bounds a draft by the AR path's own distribution,
  p(d) >= (1 - t) * max p, never by the drafter's or the router's confidence: the bound means the same
  on any text (each accepted token costs at most -log(1 - t) nats of AR log-likelihood against the AR
  path's own choice at that position), which a router trained on one source does not.
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F

from yue.config import DecodeConfig


def apply_repetition_penalty(logits: torch.Tensor, seen: torch.Tensor, penalty: float) -> torch.Tensor:
    """CTRL-style penalty (Keskar et al. 2019): divide positive / multiply negative logits of seen tokens.

    Args:
        logits: (..., V).
        seen: bool, broadcastable to logits: True where the token already occurs in the context.
        penalty: > 1 discourages repeats; 1 is a no-op.
    """
    if penalty == 1.0:
        return logits
    penalised = torch.where(logits > 0, logits / penalty, logits * penalty)
    return torch.where(seen, penalised, logits)


def apply_openai_penalties(
    logits: torch.Tensor, counts: torch.Tensor, presence: float, frequency: float
) -> torch.Tensor:
    """OpenAI's presence and frequency penalties: logit - frequency * count - presence * (count > 0).

    Args:
        logits: (..., V).
        counts: integers broadcastable to logits: how often each token was generated before this position.
    """
    counts = counts.to(logits.dtype)
    return logits - frequency * counts - presence * (counts > 0).to(logits.dtype)


def apply_logit_bias(logits: torch.Tensor, bias: tuple[tuple[int, float], ...]) -> torch.Tensor:
    """`DecodeConfig.logit_bias`'s (token id, bias) pairs added to (..., V) logits."""
    return logits + _bias_vector(bias, logits.shape[-1], logits.dtype, logits.device)


@functools.lru_cache(maxsize=8)
def _bias_vector(
    bias: tuple[tuple[int, float], ...], vocab: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """(V,) each token's bias, 0 for most: built once per request's bias, not once a step."""
    ids, values = zip(*bias, strict=True)
    out = torch.zeros(vocab, dtype=dtype, device=device)
    out[list(ids)] = torch.tensor(values, dtype=dtype, device=device)
    return out


def warp(logits: torch.Tensor, cfg: DecodeConfig) -> torch.Tensor:
    """Temperature, top-k and top-p applied to (..., V) logits; returns log-probabilities.

    Only meaningful for sampling (cfg.temperature > 0). Filtered tokens get -inf.
    """
    # Shift by the max first, and floor the temperature, so a tiny (valid) temperature means "nearly
    # greedy" instead of inf - inf = NaN. Scores that overflowed upstream (penalties, bias) are guarded
    # here, where sampling would see them: NaN never wins, +inf becomes the largest finite score.
    logits = torch.nan_to_num(logits.float(), nan=float("-inf"), posinf=torch.finfo(torch.float32).max)
    logits = (logits - logits.max(-1, keepdim=True).values) / max(cfg.temperature, 1e-5)
    if cfg.top_k:
        kth = torch.topk(logits, min(cfg.top_k, logits.shape[-1]), dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if cfg.top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        cum = sorted_logits.softmax(-1).cumsum(-1)
        # Drop a token when the mass before it already reaches top_p (always keep the first).
        drop_sorted = (cum - sorted_logits.softmax(-1)) >= cfg.top_p
        drop_sorted[..., 0] = False  # the most likely token always stays (top_p may underflow to 0)
        drop = drop_sorted.scatter(-1, order, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return F.log_softmax(logits, dim=-1)


def sample_from_logprobs(logprobs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of (..., V) log-probabilities -> (...)."""
    return sample_from_probs(logprobs.exp(), generator)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of (..., V) non-negative weights, each row drawn in proportion to them -> (...).

    Inverse-CDF sampling: one uniform u per row, scaled to the row's total, and the first token whose
    running sum of weights exceeds it (a zero-weight token never does). The sums are float64, so their
    rounding moves a token's probability by ~1e-12 at a 49k vocabulary. `torch.multinomial` draws the
    same distribution, but on a CPU it cost a sizeable share of a sampled step at that vocabulary (the
    timings: docs/results-log.md), paid on every sampled token and by every rejected draft.
    """
    V = probs.shape[-1]
    cdf = probs.reshape(-1, V).double().cumsum(-1)  # (N, V)
    u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64, device=cdf.device)
    token = torch.searchsorted(cdf, u * cdf[:, -1:], right=True)  # (N, 1)
    if bool((token >= V).any()):  # u * total rounded up to the total: the last token of positive weight
        token = torch.minimum(token, torch.searchsorted(cdf, cdf[:, -1:]))
    return token.view(probs.shape[:-1])


def within_tolerance(logits: torch.Tensor, tokens: torch.Tensor, tolerance: float) -> torch.Tensor:
    """Whether each token is within `tolerance` of the most likely: p(x) >= (1 - tolerance) * max p.

    A probability-ratio form of Medusa's typical acceptance (Cai et al. 2024): the bound follows the AR
    distribution itself (sharp where it is sure, loose where it is not), so one tolerance means the same
    on any text. Tolerance 0 admits only a most likely token, 1 admits every token. The ratio is the
    same for logits and log-probabilities (log-softmax only shifts a row), so either may be passed.

    Args:
        logits: (..., V) logits or log-probabilities (-inf for filtered tokens).
        tokens: (...) token ids.
        tolerance: t in [0, 1].
    Returns:
        (...) bool.
    """
    lp = logits.float()
    x = lp.gather(-1, tokens[..., None])[..., 0]
    if tolerance >= 1.0:
        return x > float("-inf")  # everything but a filtered token
    return x >= lp.max(-1).values + math.log1p(-tolerance)


def choose_rows(
    logits: torch.Tensor, cfg: DecodeConfig, generators: list[torch.Generator | None]
) -> torch.Tensor:
    """The token the AR path writes for each row of (B, V) logits -> (B,): argmax when greedy, else a
    sample of `warp(logits)`, row b from generators[b] (a request's samples do not depend on its
    batch-mates)."""
    if cfg.greedy:
        return logits.argmax(-1)
    return sample_rows(warp(logits, cfg), generators)


def sample_rows(logprobs: torch.Tensor, generators: list[torch.Generator | None]) -> torch.Tensor:
    """One token per (b, i) of (B, n, V) log-probabilities, row b from generators[b] -> (B, n)."""
    return torch.stack([sample_from_logprobs(logprobs[b], g) for b, g in enumerate(generators)])


def one_hot_logprobs(tokens: torch.Tensor, vocab: int) -> torch.Tensor:
    """Log-probs of a certain proposal: 0 at each token, -inf elsewhere. tokens (...) -> (..., vocab).

    The q of drafts that were not sampled (copied from the context, fillers): the speculative rule
    then accepts token x with probability p(x) and resamples from p without x, exact in distribution."""
    q = torch.full((*tokens.shape, vocab), float("-inf"), device=tokens.device)
    return q.scatter_(-1, tokens[..., None], 0.0)


def speculative_accept(
    target_logprobs: torch.Tensor,
    draft_logprobs: torch.Tensor,
    drafts: torch.Tensor,
    generator: torch.Generator | None,
    tolerance: float = 0.0,
) -> tuple[int, int]:
    """The speculative-sampling rule for one row (Leviathan et al. 2023; Chen et al. 2023).

    Accept draft x_i with probability min(1, p_i(x_i) / q_i(x_i)), left to right; at the first
    rejection sample the replacement from norm(max(0, p_i - q_i)); if all k are accepted, sample the
    bonus token from p_k. The result is distributed exactly as sampling from p, whatever q is.
    With tolerance t > 0 (`hybrid`, lossy) a draft is also accepted outright when
    p_i(x_i) >= (1 - t) * max p_i (`within_tolerance`); the output then leans toward q by that much.

    Args:
        target_logprobs: (k + 1, V) warped AR log-probs; row i is p for the position of draft i+1,
            row k the position after the last draft.
        draft_logprobs: (k, V) warped NAR log-probs the drafts were sampled from.
        drafts: (k,) draft tokens.
        tolerance: `within_tolerance`'s t; 0 = the exact rule.
    Returns:
        (n_accepted, next_token): drafts[:n_accepted] are kept, then next_token.
    """
    k = drafts.shape[0]
    idx = torch.arange(k, device=drafts.device)
    p_x = target_logprobs[idx, drafts].exp()  # (k,)
    q_x = draft_logprobs[idx, drafts].exp()
    u = torch.rand(k, generator=generator, device=drafts.device)
    ok = u * q_x <= p_x  # u < p/q without dividing by a tiny q
    if tolerance > 0:
        ok |= within_tolerance(target_logprobs[:k], drafts, tolerance)
    ok = ok.tolist()
    n = next((i for i, a in enumerate(ok) if not a), k)
    if n == k:
        return k, int(sample_from_logprobs(target_logprobs[k], generator))
    residual = (target_logprobs[n].exp() - draft_logprobs[n].exp()).clamp(min=0)
    if residual.sum() <= 0:  # p == q exactly: any rejection is measure-zero; fall back to p
        residual = target_logprobs[n].exp()
    return n, int(sample_from_probs(residual, generator))


def judged_rates(
    target_logprobs: torch.Tensor, draft_logprobs: torch.Tensor, drafts: torch.Tensor, n_drafts: list[int]
) -> list[float]:
    """Per draft position j, the chance the speculative rule accepts draft j given drafts 1..j-1 were,
    min(1, p_j(x_j) / q_j(x_j)), averaged over the rows that drafted position j: every drafted position
    is judged, not just those up to the first rejection, and by its chance, not a 0/1 draw, so a
    sampled request's record (`sources.AcceptanceRecord.observe`) learns from each step what its drafts are
    worth (p_j is the target given the drafts before j: what it is where they were accepted).

    Args:
        target_logprobs: (B, k, V) warped AR log-probs at the k draft positions.
        draft_logprobs: (B, k, V) the drafts' proposal log-probs q (one-hot for free drafts).
        drafts: (B, k) draft tokens; row b's drafts are its last n_drafts[b].
    """
    x = drafts[:, :, None]
    log_ratio = (target_logprobs.gather(2, x) - draft_logprobs.gather(2, x))[:, :, 0]  # (B, k)
    rates = log_ratio.clamp(max=0.0).exp()  # min(1, p / q)
    k = drafts.shape[1]
    if min(n_drafts) == k:
        return rates.mean(0).tolist()
    out = []
    for j in range(k):  # row b's draft j (of its own) sits at column k - n_drafts[b] + j
        cols = [(b, k - kb + j) for b, kb in enumerate(n_drafts) if j < kb]
        if cols:
            out.append(sum(float(rates[b, c]) for b, c in cols) / len(cols))
    return out
