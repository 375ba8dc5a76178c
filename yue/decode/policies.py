"""The four decode policies, chosen by name: `ar`, `verified`, `hybrid`, `nar` (DESIGN §2).

Every step of the loop is one forward over `fed` (committed tokens whose K/V are not cached yet), and,
when the step drafts, a block of K slots anchored at the last kept token. Slot i sits i positions after
the anchor, so slot 1 is at the position of the AR path's next token (the "bonus") and the usable
drafts are slots 2..K: they guess the tokens after it. Where the block is computed is
`cfg.drafting`:
  "separate" (default)  after the step's forward, in a NAR-only drafting pass (the loop runs it when
                        `Advance.draft_pass` is set). The bonus is known by then, so slot 1 goes in
                        revealed and slots 2.. are drafted knowing it.
  "fused"               in the step's own forward (`n_slots`, `anchors`), slot 1 a mask.

A policy decides around the forward(s):
  `drafts_now(state)`     whether this step drafts a block;
  `advance(state, out)`   from the step's logits, which fed tokens to keep, which tokens to emit, and
                          what to feed next;
  `draft(..., logits)`    from the block's logits, what to draft or commit next.

The verification rule (greedy): fed = [p0, d1..dk]; AR row i predicts the token after fed[i];
accept the longest prefix of drafts equal to the AR choices, then emit the AR's own token at the
first mismatch (or the bonus after dk). Sampling uses `sampling.speculative_accept` instead. Either
way the output equals `ar` decoding: exactly (greedy) or in distribution (sampling).

`verified` needs a block anchored at the last *accepted* token. A separate pass is anchored there by
construction. Fused, the step appends a block at every fed position (k + 1 blocks of K slots, each
seeing the committed tokens up to its anchor), so the block on the last accepted token is there
whatever is accepted: one forward per step, but K slot rows per draft, which only pays where a
forward's cost hardly depends on its rows (a GPU at batch 1), not on a small CPU.

In a batch each row accepts its own number of drafts (per-row acceptance: `Advance.keep` and
`Advance.accepted` are per row; the loop's cache leaves holes where a row kept fewer columns than
another). What stays shared is the shape of the next step: one draft length k for the batch (the
router's `draft_length` weighs every row), so `next_fed` is rectangular. Rows that joined a running
batch may carry fewer drafts than the others for one step (`LoopState.n_drafts` is per row; a row's
drafts are the tail of its `fed`). Hybrid's unverified commits stay a batch minimum (lossy anyway).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from yue.config import DecodeConfig
from yue.decode.costs import StepCosts
from yue.decode.sampling import (
    apply_repetition_penalty,
    choose_rows,
    sample_rows,
    speculative_accept,
    warp,
)
from yue.model.mot import StepOutput
from yue.model.router import Router

# verified: after futile probes the AR stretch doubles, up to reeval_every * 2**3 steps.
MAX_BACKOFF_DOUBLINGS = 3


@dataclass
class LoopState:
    """Mutable decode state of a batch, which the policies read and update.

    Attributes:
        cfg: resolved decode config (threshold, K, reeval filled in); the fields a batch shares (its
            `loop.batch_key`): policies never read a row's seed, budget or stop strings.
        generators: each row's random generator (None when greedy).
        fed: (B, n) tokens to feed as committed positions next step. fed[:, 0] is always a token the
            AR path (or an unverified commit) already emitted; in `verified` fed[:, 1:] are drafts.
        n_drafts: per row, how many trailing tokens of `fed` are unverified drafts.
        draft_logprobs: (B, max(n_drafts), V) warped NAR log-probs the drafts were sampled from
            (sampling), aligned to the tail: row b's are the last n_drafts[b].
        seen: (B, V) bool, tokens in each row's context (for repetition penalty), or None.
        ar_stretch: AR-only steps (verified) or AR-written tokens (hybrid) left before the router is
            asked again.
        futile_probes: verified: consecutive steps whose slots the router found not worth drafting;
            each doubles the next AR stretch (capped), since a probe costs a whole NAR pass.
        costs: the step costs `draft_length` weighs (measured for the model on this machine,
            `decode.costs`); None = `StepCosts.default`.
    """

    cfg: DecodeConfig
    generators: list[torch.Generator | None]
    fed: torch.Tensor
    n_drafts: list[int] = field(default_factory=list)
    draft_logprobs: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    ar_stretch: int = 0
    futile_probes: int = 0
    costs: StepCosts | None = None

    def __post_init__(self) -> None:
        if not self.n_drafts:
            self.n_drafts = [0] * self.fed.shape[0]

    @property
    def max_drafts(self) -> int:
        """k: the verifying rows of a step are the last k + 1 fed positions."""
        return max(self.n_drafts)


@dataclass
class Advance:
    """What one step decided, per row: emitted/sources in order; keep: fed positions whose K/V stay;
    drafted/accepted: draft tokens verified (or committed unverified) and kept."""

    keep: list[int]
    emitted: list[list[int]]
    sources: list[list[str]]
    next_fed: torch.Tensor
    next_drafts: list[int] | None = None  # None: no drafts
    next_draft_logprobs: torch.Tensor | None = None
    mode: str = "AR"
    draft_pass: bool = False  # run a NAR-only pass anchored at each row's fed[keep - 1], then `draft`
    drafted: list[int] = field(default_factory=list)
    accepted: list[int] = field(default_factory=list)
    # Per row, the emitted tokens the AR path chose or verified: the first ar_count[b] of them, each
    # predicted by AR row ar_first[b] + j of the step's verifying rows (for their log-probs).
    ar_first: list[int] = field(default_factory=list)
    ar_count: list[int] = field(default_factory=list)
    p_ar: list[float] = field(default_factory=list)
    # Slots 2..K of the block drafted this step, by the path chosen for them: (to AR, to NAR).
    routed: tuple[int, int] = (0, 0)

    @property
    def anchor_rows(self) -> list[int]:
        """Per row, the last kept token's index among the step's verifying rows (the last k + 1 fed
        positions, k = max drafts): its AR logits row, and its fused block's index."""
        top = max(self.drafted, default=0)
        return [top - d + a for d, a in zip(self.drafted, self.accepted, strict=True)]


def ar_logits_with_penalty(st: LoopState, out: StepOutput, rows: int = 1) -> torch.Tensor:
    """The last `rows` AR logits (B, rows, V), with the repetition penalty of each row's context.

    With drafts fed = [p0, d1..dk] and rows = k + 1, row i's context also holds d1..di.
    """
    logits = out.ar_logits[:, -rows:]
    if st.seen is None:
        return logits
    seen = st.seen[:, None, :].expand(-1, rows, -1)
    if rows > 1:
        onehot = torch.zeros_like(seen[:, 1:]).scatter_(2, st.fed[:, -rows + 1 :, None], True)
        later = torch.cumsum(onehot.int(), dim=1) > 0  # (B, rows-1, V)
        seen = torch.cat([seen[:, :1], seen[:, 1:] | later], dim=1)
    return apply_repetition_penalty(logits, seen, st.cfg.repetition_penalty)


def draft_slots(st: LoopState, slot_logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Slot tokens (B, n): argmax when greedy, else samples of the warped slot distribution q."""
    if st.cfg.greedy:
        return slot_logits.argmax(-1), None
    q = warp(slot_logits, st.cfg)
    return sample_rows(q, st.generators), q


def commit_unverified(st: LoopState, token: torch.Tensor, extra: torch.Tensor | None = None) -> Advance:
    """Emit each row's AR token then `extra` slot tokens without verification, and feed them all next.

    token: (B,) the AR path's token; extra: (B, m) slot tokens, or None for none. Every fed position is kept.
    """
    if extra is None:
        extra = token.new_empty(token.shape[0], 0)
    B, m = extra.shape
    emitted = [[t] + e for t, e in zip(token.tolist(), extra.tolist(), strict=True)]
    next_fed = torch.cat([token[:, None], extra], dim=1)
    adv = Advance([st.fed.shape[1]] * B, emitted, [["ar"] + ["nar"] * m for _ in emitted], next_fed)
    adv.mode, adv.drafted, adv.accepted = ("NAR" if m else "AR"), [m] * B, [m] * B
    adv.ar_first, adv.ar_count = [st.max_drafts] * B, [1] * B  # the AR token: the last verifying row
    return adv


class Policy:
    """Base: whether and where a step drafts a block of slots, by `cfg.drafting`.

    "fused": the block rides in the step's own forward (`n_slots` slots, at `anchors`) and `advance`
    hands its logits to `draft`. "separate": the step's forward has no slots; `advance` sets
    `Advance.draft_pass` and the loop runs a NAR-only pass over a block anchored at the last kept token,
    then calls `draft` with its logits. `draft` returns the Advance to use (what to emit and feed).
    """

    def drafts_now(self, st: LoopState) -> bool:
        """Whether this step drafts a block (read before `advance` updates the state)."""
        return False

    def n_slots(self, st: LoopState) -> int:
        return st.cfg.block_size if st.cfg.drafting == "fused" and self.drafts_now(st) else 0

    def anchors(self, st: LoopState) -> tuple[int, ...] | None:
        """Indices into `fed` at which fused blocks are anchored; None = one block at the last."""
        return None

    def with_block(self, model, st: LoopState, adv: Advance, out: StepOutput) -> Advance:
        """Draft from the step's fused block anchored at each row's last kept token (one block, or one
        per verifying row: `anchors`), or ask the loop for a drafting pass."""
        if st.cfg.drafting == "separate":
            adv.draft_pass = True
            return adv
        K = st.cfg.block_size
        logits = out.slot_logits  # (B, blocks * K, V)
        if logits.shape[1] > K:  # row b's block: anchor_rows[b]
            first = torch.tensor(adv.anchor_rows, device=logits.device)[:, None] * K
            index = first + torch.arange(K, device=logits.device)  # (B, K)
            logits = logits.gather(1, index[:, :, None].expand(-1, -1, logits.shape[2]))
        return self.draft(model, st, adv, out, logits)

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        """Use a block anchored at the last kept token (fed[adv.keep - 1]). logits: (B, K, V)."""
        raise NotImplementedError


def anchor_p_ar(model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> torch.Tensor:
    """The router's p_ar(i) = 1 - a_i for a block anchored at each row's last kept token,
    fed[b, adv.keep[b] - 1]: its AR logits are row `adv.anchor_rows[b]` of the step's AR rows (the
    last row when nothing was verified). logits: (B, n, V), the block's slots -> (B, n).

    A separate drafting pass reveals slot 1 (its token, next_fed[:, 0], is known; see loop.py). A
    revealed slot's own output is untrained, so the router is shown what is true of it instead:
    certain (`Router.features`' slot1_revealed).
    """
    revealed = st.cfg.drafting == "separate"
    anchor = adv.anchor_rows
    if len(set(adv.keep)) == 1 and len(set(anchor)) == 1:  # every row alike (a lone row): slices
        hidden, ar_logits = out.hidden[:, adv.keep[0] - 1], out.ar_logits[:, anchor[0]]
    else:  # per row: gathers
        rows = torch.arange(len(anchor), device=logits.device)
        keep = torch.tensor(adv.keep, device=logits.device)
        hidden = out.hidden[rows, keep - 1]
        ar_logits = out.ar_logits[rows, torch.tensor(anchor, device=logits.device)]
    feats = model.router.features(hidden, ar_logits, logits, revealed)
    return 1.0 - Router.log_acceptance(model.router(feats)).exp()[:, : logits.shape[1]]


class ARPolicy(Policy):
    """One token per forward: the reference."""

    name = "ar"

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        tok = choose_rows(ar_logits_with_penalty(st, out)[:, -1], st.cfg, st.generators)  # (B,)
        return commit_unverified(st, tok)


class VerifiedPolicy(Policy):
    """Verify the previous draft and draft the next block; lossless.

    Where the next block comes from is `cfg.drafting`: "separate" asks the loop for a NAR-only pass
    after verification (`Advance.draft_pass`), anchored at the last accepted token; "fused" puts blocks
    in the verifying forward itself, one at every fed position (see the module docstring).
    """

    name = "verified"

    def drafts_now(self, st: LoopState) -> bool:
        """Whether this step drafts a block (not in an AR stretch, drafting not switched off)."""
        return st.cfg.router_threshold > 0 and st.ar_stretch == 0 and st.cfg.block_size >= 2

    def anchors(self, st: LoopState) -> tuple[int, ...] | None:
        """Fused drafting: a block at every fed position from p0 on; whichever prefix of the drafts the
        AR path accepts, the block anchored at its last token is a valid next draft."""
        k = st.max_drafts
        if st.cfg.drafting != "fused" or k == 0:
            return None
        n = st.fed.shape[1]
        return tuple(range(n - k - 1, n))

    def verify(self, st: LoopState, target: torch.Tensor) -> tuple[list[int], torch.Tensor]:
        """Per row, the accepted draft count and the next token (B,). target: (B, k+1, V), k = max drafts.

        Row b's k_b drafts are the tail of its fed; their targets are the last k_b + 1 rows of target.
        Each row accepts its own longest verified prefix (no batch minimum: per-row acceptance).
        """
        k = st.max_drafts
        drafts = st.fed[:, st.fed.shape[1] - k :]  # (B, k); row b's drafts are its last n_drafts[b]
        if st.cfg.greedy:
            choice = target.argmax(-1)  # (B, k+1)
            if k == 0:
                return [0] * len(choice), choice[:, 0]
            if min(st.n_drafts) == k:  # every row verifies k drafts (a lone row always)
                run = (choice[:, :k] == drafts).int().cumprod(-1).sum(-1)  # (B,)
                return run.tolist(), choice.gather(1, run[:, None])[:, 0]
            # A row with k_b < k drafts has k - k_b leading columns that are not drafts: count them as
            # matched, so run = those + the row's accepted drafts, and choice[b, run] is its next token.
            lead = k - torch.tensor(st.n_drafts, device=choice.device)  # (B,)
            pad = torch.arange(k, device=choice.device)[None, :] < lead[:, None]  # (B, k)
            run = ((choice[:, :k] == drafts) | pad).int().cumprod(-1).sum(-1)  # (B,)
            return (run - lead).tolist(), choice.gather(1, run[:, None])[:, 0]
        if k == 0:
            return [0] * len(target), choose_rows(target[:, 0], st.cfg, st.generators)
        logp = warp(target, st.cfg)
        rows = [
            speculative_accept(logp[b, k - kb :], st.draft_logprobs[b, k - kb :], drafts[b, k - kb :], g)
            for b, (kb, g) in enumerate(zip(st.n_drafts, st.generators, strict=True))
        ]
        return [r[0] for r in rows], torch.tensor([r[1] for r in rows], device=target.device)

    def draft_length(self, st: LoopState, p_ar: torch.Tensor) -> int:
        """How many drafts (slots 2..) to verify next step; 0 = draft nothing. p_ar: (B, n), slots 1..n.

        Draft j survives with A_j = a_{j+1} / a_1 (slot 1 is the position of the AR token already
        chosen), so verifying k drafts yields 1 + sum_{j<=k} A_j tokens for the cost of a step feeding
        k drafts plus the block's drafting pass (`st.costs`: measured for this model on this machine;
        fused: a block per fed position, approximated as k + 1 drafting passes), where a plain AR step
        writes one token for `costs.verify(0)`. We take the k with the most expected tokens per unit of
        cost among the leading drafts with p_ar(i) <= router_threshold (DESIGN's one rule), and draft
        only if that beats plain AR steps. (At threshold 1 every slot is drafted, without asking: see
        `draft`.) In a batch, k is one number for every row: A_j is the rows' mean (each row accepts its
        own drafts), and the costs are a batch step's (`StepCosts.for_batch`), which grow with its rows,
        so a large batch drafts less than a lone request.
        """
        B = p_ar.shape[0]
        costs = (st.costs or StepCosts.default(st.cfg.block_size)).for_batch(B, st.cfg.block_size)
        acc = 1.0 - p_ar  # (B, n)
        # Rows accept their own drafts, so a batch's expected gain per draft is the rows' mean (per row).
        A = (acc[:, 1:] / acc[:, :1].clamp(min=1e-6)).clamp(max=1.0).mean(0).tolist()
        allowed = (p_ar[:, 1:] <= st.cfg.router_threshold).all(0).tolist()
        best_k, best_rate, gain = 0, 1.0 / costs.verify(0), 1.0
        passes = 1
        for k, (a_k, ok) in enumerate(zip(A, allowed, strict=True), start=1):
            if not ok:
                break
            gain += a_k
            if st.cfg.drafting == "fused":
                passes = k + 1
            rate = gain / (costs.verify(k) + costs.draft_pass * passes)
            if rate > best_rate:
                best_k, best_rate = k, rate
        return best_k

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        n_acc, nxt = self.verify(st, ar_logits_with_penalty(st, out, st.max_drafts + 1))
        W, fed = st.fed.shape[1], st.fed.tolist()
        rows = zip(fed, st.n_drafts, n_acc, nxt.tolist(), strict=True)
        emitted = [row[W - k : W - k + n] + [t] for row, k, n, t in rows]
        sources = [["nar"] * n + ["ar"] for n in n_acc]
        keep = [W - k + n for k, n in zip(st.n_drafts, n_acc, strict=True)]  # prefill: the whole prompt
        adv = Advance(keep, emitted, sources, nxt[:, None], mode="NAR" if st.max_drafts else "AR")
        adv.drafted, adv.accepted = list(st.n_drafts), n_acc
        adv.ar_first = [st.max_drafts - k for k in st.n_drafts]
        adv.ar_count = [n + 1 for n in n_acc]
        if not self.drafts_now(st):
            st.ar_stretch = max(st.ar_stretch - 1, 0)
            return adv
        # Fused: one block (at the last fed token) when nothing was drafted, else one per verifying
        # position; each row drafts from the block on its last accepted token (`with_block`).
        return self.with_block(model, st, adv, out)

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        """Choose the next draft from a block anchored at the last accepted token; sets adv.next_*."""
        # Fused blocks: slots 2.. are drafted even where slot 1 guessed another token than the AR
        # path's: they predict fixed positions, and often still hold (dev set, threshold 1: 2.34 ->
        # 2.69 tokens per forward); verification keeps the output exact either way. A separate pass
        # revealed slot 1, so its slots 2.. already know the AR token (3.63 -> 4.38 tokens per step).
        slots, q = draft_slots(st, logits)
        every_slot = st.cfg.router_threshold >= 1.0  # "pure NAR": the router has nothing to decide
        p_ar = self.ask_router(model, st, adv, out, logits, needed=not every_slot)
        k_next = logits.shape[1] - 1 if every_slot else self.draft_length(st, p_ar)
        adv.routed = (logits.shape[1] - 1 - k_next, k_next)
        if k_next == 0:
            # The router sees no draft worth its cost here; a block costs a whole NAR pass, so write
            # plain AR steps for a while and ask again, backing off further after each futile ask.
            st.ar_stretch = st.cfg.reeval_every * 2 ** min(st.futile_probes, MAX_BACKOFF_DOUBLINGS)
            st.futile_probes += 1
            return adv
        st.futile_probes = 0
        self.feed(adv, slots, q, 0, k_next)
        return adv

    @staticmethod
    def ask_router(model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor, needed: bool):
        """The block's p_ar (B, K) when the policy `needed` it, or a trace records it (adv.p_ar); else None."""
        if not (needed or st.cfg.trace):
            return None
        p_ar = anchor_p_ar(model, st, adv, out, logits)
        adv.p_ar = p_ar[0].tolist()
        return p_ar

    @staticmethod
    def feed(adv: Advance, slots: torch.Tensor, q: torch.Tensor | None, trusted: int, drafts: int) -> None:
        """Feed next, after the AR token: slots 2..1+trusted (already committed), then the next `drafts`
        slots as drafts to verify (with their sampling log-probs q, if sampled). slots: (B, K)."""
        end = 1 + trusted + drafts
        adv.next_fed = torch.cat([adv.next_fed, slots[:, 1:end]], dim=1)
        adv.next_drafts = [drafts] * len(adv.next_fed)
        adv.next_draft_logprobs = None if q is None else q[:, 1 + trusted : end]


class HybridPolicy(VerifiedPolicy):
    """Router-gated, lossy: `verified`, except that the leading slots of a block that the router
    trusts (p_ar(i) <= threshold) are committed without verification.

    The rest of each block goes to the AR path the way `verified` sends drafts there: fed as drafts in
    the next forward, which accepts those equal to the AR path's choices and writes its own token at the
    first that is not. Where the router distrusts the block's first unknown slot (slot 2 after a
    separate pass revealed slot 1; slot 1 fused), the AR path writes the next `reeval_every` tokens
    before the router is asked again (DESIGN §2's AR stretch), by verification, so the stretch costs
    no more forwards than `verified`. Threshold 0 is `verified` (exact); 1 commits whole blocks.
    """

    name = "hybrid"

    def drafts_now(self, st: LoopState) -> bool:
        return st.cfg.block_size >= 2

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        """After the AR token: commit the trusted leading slots, feed the rest as drafts; sets adv.next_*."""
        slots, q = draft_slots(st, logits)
        st.ar_stretch = max(st.ar_stretch - len(adv.emitted[0]), 0)  # this step's tokens were the AR path's
        m = 0
        p_ar = self.ask_router(model, st, adv, out, logits, needed=st.ar_stretch == 0)
        if st.ar_stretch == 0:
            first_unknown = 1 if st.cfg.drafting == "separate" else 0
            if bool((p_ar[:, first_unknown] > st.cfg.router_threshold).any()):
                st.ar_stretch = st.cfg.reeval_every
            elif first_unknown or not st.cfg.greedy or bool((slots[:, 0] == adv.next_fed[:, 0]).all()):
                # (greedy, fused: a slot 1 that disagrees with the AR token means the block was drafted
                # for another context, so none of it is trusted; it is still verified)
                m = self.committed_slots(st, p_ar)
            adv.routed = (slots.shape[1] - 1 - m, m)
        for row, sources, trusted in zip(adv.emitted, adv.sources, slots[:, 1 : 1 + m].tolist(), strict=True):
            row.extend(trusted)
            sources.extend(["nar"] * m)
        self.feed(adv, slots, q, m, slots.shape[1] - 1 - m)
        adv.drafted, adv.accepted = [d + m for d in adv.drafted], [a + m for a in adv.accepted]
        adv.mode = "NAR" if m else "AR"  # the router's decision for this block
        return adv

    @staticmethod
    def committed_slots(st: LoopState, p_ar: torch.Tensor) -> int:
        """Leading slots 2.. with p_ar(i) <= threshold (batch minimum). p_ar: (B, n)."""
        ok = (p_ar[:, 1:] <= st.cfg.router_threshold).int().cumprod(-1).sum(-1)
        return int(ok.min()) if ok.numel() else 0


class NARPolicy(Policy):
    """Commit the whole block every step, unverified: the fastest and least faithful baseline."""

    name = "nar"

    def drafts_now(self, st: LoopState) -> bool:
        return True

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        bonus = choose_rows(ar_logits_with_penalty(st, out)[:, -1], st.cfg, st.generators)
        return self.with_block(model, st, commit_unverified(st, bonus), out)

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        slots, _ = draft_slots(st, logits)
        adv = commit_unverified(st, adv.next_fed[:, 0], slots[:, 1:])
        adv.routed = (0, slots.shape[1] - 1)
        return adv


POLICIES = {p.name: p for p in (ARPolicy, VerifiedPolicy, HybridPolicy, NARPolicy)}


def get_policy(mode: str):
    """The policy object for a mode name."""
    if mode not in POLICIES:
        raise ValueError(f"mode must be one of {', '.join(POLICIES)}; got {mode!r}")
    return POLICIES[mode]()
