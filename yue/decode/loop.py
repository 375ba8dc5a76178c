"""The one decode loop: propose -> forward -> accept -> advance, for every policy.

Design decisions:
- Token level only: the loop yields, per step, the tokens each row committed and who wrote them. Text
  (detokenizing, stop strings) is the engine's business; it simply stops iterating.
- One forward per step over `fed` (+ a fused block of mask slots), and, with separate drafting (the
  default), a second, NAR-only forward over a block anchored at the last kept token. The KV cache is
  allocated once; after the forward, `cache.advance(keep)` commits the kept positions and everything
  past them (rejected drafts, slots) is scratch that the next write overwrites: rollback is a pointer
  move.
- Per-step work outside the forward is kept small: positions are slices of a precomputed table, the
  mask is built from two aranges (or skipped for a single unpadded token), and tracing is opt-in.
- A batch is left-padded and decoded in lockstep (see policies.py); `key_valid` hides padding keys.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch

from yue.config import DecodeConfig
from yue.decode.costs import StepCosts
from yue.decode.lookup import NgramIndex
from yue.decode.policies import Advance, LoopState, get_policy
from yue.decode.types import Step
from yue.model.masks import decode_mask
from yue.model.mot import YueForCausalLM
from yue.model.router import entropy


@dataclass
class StepEmission:
    """Tokens committed by one step. tokens/sources: per row (empty for finished rows)."""

    tokens: list[list[int]]
    sources: list[list[str]]
    finished: list[str | None]
    step: Step | None
    drafted: int
    accepted: int
    mode: str
    forwards: int = 1  # 2 when a drafting pass followed the step's forward
    routed: tuple[int, int] = (0, 0)  # the step's block positions by the path chosen: (to AR, to NAR)


@dataclass
class _Rows:
    """Per-row bookkeeping: tokens left before max_new_tokens, and why a row stopped."""

    budget: list[int]
    finish: list[str | None] = field(default_factory=list)


def slot_capacity(cfg: DecodeConfig) -> int:
    """Cache positions a request may need beyond prompt + max_new_tokens (drafts and slots)."""
    k = cfg.block_size or 1
    return (k + 1) * (k + 1) + 1 if cfg.drafting == "fused" else 2 * k + 2


def _positions(pad: list[int], capacity: int, device) -> torch.Tensor:
    """RoPE position of every cache index: (capacity,) unpadded, (B, capacity) left-padded."""
    idx = torch.arange(capacity, device=device)
    if not any(pad):
        return idx
    return (idx[None, :] - torch.tensor(pad, device=device)[:, None]).clamp(min=0)


def _truncate(adv: Advance, rows: _Rows, eos_ids: frozenset[int]) -> tuple[list[list[int]], list[list[str]]]:
    """Cut each row's emitted tokens at EOS and at its max_new_tokens budget; mark finished rows."""
    toks, srcs = [], []
    for b, (t, s) in enumerate(zip(adv.emitted, adv.sources, strict=True)):
        if rows.finish[b] is not None:
            toks.append([]), srcs.append([])
            continue
        cut = next((i for i, x in enumerate(t) if x in eos_ids), None)
        if cut is not None:
            t, s = t[:cut], s[:cut]
            rows.finish[b] = "eos"
        if len(t) >= rows.budget[b]:
            t, s = t[: rows.budget[b]], s[: rows.budget[b]]
            rows.finish[b] = rows.finish[b] or "length"
        rows.budget[b] -= len(t)
        toks.append(t), srcs.append(s)
    return toks, srcs


@torch.inference_mode()
def decode(
    model: YueForCausalLM,
    prompts: list[list[int]],
    cfg: DecodeConfig,
    cancel: Callable[[], bool] | None = None,
    costs: StepCosts | None = None,
) -> Iterator[StepEmission]:
    """Decode a batch of tokenized prompts; yield what each step commits.

    Args:
        model: the MoT model (eval mode).
        prompts: B non-empty token lists; they are left-padded to a common length.
        cfg: a config already `resolved()` against the model's config.
        cancel: checked before every step; when it returns True the loop stops (rows finish "cancelled").
        costs: step costs for the router's draft lengths (`decode.costs.measured_costs`); None = defaults.
    Yields:
        One StepEmission per forward pass, the prefill included.
    """
    device = model.device
    policy = get_policy(cfg.mode)
    B, T0 = len(prompts), max(len(p) for p in prompts)
    pad = [T0 - len(p) for p in prompts]
    capacity = T0 + cfg.max_new_tokens + slot_capacity(cfg)
    cache = model.new_cache(B, capacity)
    cache.set_padding(pad)
    positions = _positions(pad, capacity, device)
    prompt = torch.tensor(
        [[model.config.pad_token_id or 0] * p + q for p, q in zip(pad, prompts, strict=True)]
    )
    generator = None
    if not cfg.greedy:
        generator = torch.Generator(device=device)
        generator.manual_seed(cfg.seed if cfg.seed is not None else int(torch.randint(2**62, ()).item()))
    st = LoopState(cfg, generator, prompt.to(device), costs=costs)
    if cfg.mode == "verified" and cfg.drafting == "separate" and cfg.prompt_lookup:
        st.contexts = [NgramIndex(p) for p in prompts]
    if cfg.repetition_penalty != 1.0:
        st.seen = torch.zeros(B, model.config.vocab_size, dtype=torch.bool, device=device)
        st.seen.scatter_(1, st.fed, True)
    rows = _Rows([cfg.max_new_tokens] * B, [None] * B)
    mask_id = model.config.mask_token_id
    eos = model.config.eos_token_id
    eos_ids = frozenset(eos if isinstance(eos, list) else [] if eos is None or cfg.ignore_eos else [eos])
    index = 0
    while True:
        if cancel is not None and cancel():
            yield StepEmission(
                [[] for _ in range(B)], [[] for _ in range(B)], ["cancelled"] * B, None, 0, 0, "cancelled"
            )
            return
        t0 = time.perf_counter()
        # 1. Propose: committed tokens to feed, then the policy's block(s) of mask slots.
        n_c, size, anchors = st.fed.shape[1], policy.n_slots(st), policy.anchors(st)
        n_s = size * (len(anchors) if anchors else 1)
        tokens = st.fed if n_s == 0 else torch.cat([st.fed, st.fed.new_full((B, n_s), mask_id)], dim=1)
        start = cache.length
        if not anchors:  # one block at the last fed token: positions run on contiguously
            pos = positions[..., start : start + n_c + n_s]
        else:  # block m's slots sit at its anchor's position + 1 .. + size
            idx = torch.arange(start, start + n_c)
            offsets = torch.tensor(anchors)[:, None] + torch.arange(1, size + 1)  # (blocks, size)
            pos = positions[..., torch.cat([idx, start + offsets.flatten()]).to(device)]
        mask = decode_mask(start, n_c, n_s, cache.key_valid, device, anchors)
        # 2. Forward: AR logits for the fed tokens, NAR logits for the slots.
        out = model.step(tokens, pos, n_c, mask, cache, st.n_drafts + 1)
        # 3. Accept: the policy verifies / commits and says what to keep and feed next.
        adv = policy.advance(model, st, out)
        cache.advance(adv.keep)
        forwards = 1
        if adv.draft_pass:
            # 3b. Drafting pass: K slots anchored at the last kept token, NAR set only; they see the
            # cache up to that token and each other, and sit in scratch space past it. Slot 1's token
            # is known by now (the AR path's, next_fed[:, 0]), so it goes in revealed, as training's
            # mask-predict reveals do, and slots 2.. are drafted knowing it.
            L, K = cache.length, cfg.block_size
            slots = st.fed.new_full((B, K), mask_id)
            slots[:, 0] = adv.next_fed[:, 0]
            mask = decode_mask(L, 0, K, cache.key_valid, device)
            # A top-layer NAR set's slots enter from the anchor's hidden state at their first layer.
            entry = None if out.entry is None else out.entry[:, adv.keep - 1 : adv.keep]
            draft = model.step(slots, positions[..., L : L + K], 0, mask, cache, 0, entry)
            adv = policy.draft(model, st, adv, out, draft.slot_logits)
            forwards = 2
        # 4. Advance: bookkeeping for the next step.
        st.fed, st.n_drafts, st.draft_logprobs = adv.next_fed, adv.next_drafts, adv.next_draft_logprobs
        toks, srcs = _truncate(adv, rows, eos_ids)
        if st.seen is not None:
            for b, t in enumerate(toks):
                st.seen[b, t] = True
        step = None
        if cfg.trace:
            h = float(entropy(out.ar_logits[0, -1]))
            dt = (time.perf_counter() - t0) * 1e3
            step = Step(index, adv.mode, adv.drafted, adv.accepted, adv.p_ar, h, dt)
        yield StepEmission(
            toks, srcs, list(rows.finish), step, adv.drafted, adv.accepted, adv.mode, forwards, adv.routed
        )
        index += 1
        if all(f is not None for f in rows.finish):
            return
