"""The four decode policies `ar`, `verified`, `hybrid`, `nar` (docs/design.md §2); `modes.py` names them
(and `anchor.py`'s two).

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

How many drafts to verify is a cost question (`best_length`): the k with the most expected tokens per
unit of step cost (the cost curve measured for the model on the machine), by the NAR block's own
`AcceptanceRecord` (threshold 1) or the router's predictions scaled by it (below 1). `verified` also
drafts from free sources (`decode/sources.py`): tokens copied from the context where it has a match,
or chained from the model's corpus of its own answers. They cost no drafting pass, each source keeps a
record per length of the context it matched, and the one whose record promises the most tokens per
unit of cost is drafted where it promises more than the NAR block's (`VerifiedPolicy.copy`).

In a batch each row accepts its own number of drafts (per-row acceptance: `Advance.keep` and
`Advance.accepted` are per row; the loop's cache leaves holes where a row kept fewer columns than
another). What stays shared is the shape of the next step: one draft length k for the batch (the
router's `draft_length` weighs every row), so `next_fed` is rectangular. Rows that joined a running
batch may carry fewer drafts than the others for one step (`LoopState.n_drafts` is per row; a row's
drafts are the tail of its `fed`). The acceptance records are the batch's (a lone request's own), and
free drafts are drafted only where every row has some.
"""

from __future__ import annotations

import time

import torch

from yue.config import DecodeConfig
from yue.decode import profile
from yue.decode.costs import StepCosts
from yue.decode.sampling import (
    apply_logit_bias,
    apply_openai_penalties,
    apply_repetition_penalty,
    choose_rows,
    judged_rates,
    one_hot_logprobs,
    sample_rows,
    speculative_accept,
    warp,
    within_tolerance,
)
from yue.decode.state import Advance, LoopState
from yue.model.mot import StepOutput
from yue.model.router import Router


def adjusted_ar_logits(st: LoopState, out: StepOutput, rows: int = 1) -> torch.Tensor:
    """The last `rows` AR logits (B, rows, V), adjusted as the request asks (`DecodeConfig.adjusts_logits`):
    repetition penalty over each row's context, OpenAI's presence / frequency penalties over the tokens
    generated before it, then the logit bias.

    With drafts fed = [p0, d1..dk] and rows = k + 1, row i's context also holds d1..di.
    """
    logits = out.ar_logits[:, -rows:]
    cfg = st.cfg
    if not cfg.adjusts_logits:
        return logits
    later = None  # (B, rows, V): how often each token occurs among the drafts before each row
    if rows > 1 and (st.seen is not None or st.counts is not None):
        B, V = logits.shape[0], logits.shape[-1]
        onehot = logits.new_zeros(B, rows, V, dtype=torch.int32)
        onehot[:, 1:].scatter_(2, st.fed[:, -rows + 1 :, None], 1)
        later = torch.cumsum(onehot, dim=1)
    if st.seen is not None:
        seen = st.seen[:, None, :] if later is None else st.seen[:, None, :] | (later > 0)
        logits = apply_repetition_penalty(logits, seen, cfg.repetition_penalty)
    if st.counts is not None:
        counts = st.counts[:, None, :] if later is None else st.counts[:, None, :] + later
        logits = apply_openai_penalties(logits, counts, cfg.presence_penalty, cfg.frequency_penalty)
    if cfg.logit_bias:
        logits = apply_logit_bias(logits, cfg.logit_bias)
    return logits


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
    paths = [["ar"] + ["nar"] * m for _ in emitted]  # the slots are the NAR set's, by path and source
    adv = Advance([st.fed.shape[1]] * B, emitted, paths, [list(p) for p in paths], next_fed)
    adv.mode, adv.drafted, adv.accepted = ("NAR" if m else "AR"), [m] * B, [m] * B
    adv.ar_first, adv.ar_count = [st.max_drafts] * B, [1] * B  # the AR token: the last verifying row
    return adv


def best_length(st: LoopState, survival: list[float], draft_pass: bool = True, sized: bool = False) -> int:
    """`best_draft`'s k: the number of drafts to verify next step (0 = none pays)."""
    return best_draft(st, survival, draft_pass, sized)[0]


def best_draft(
    st: LoopState, survival: list[float], draft_pass: bool = True, sized: bool = False
) -> tuple[int, float]:
    """The number of drafts k to verify next step that writes the most tokens per unit of cost (0 if
    none beats a plain AR step), and those expected tokens per unit of cost. survival[j - 1]:
    expected P(drafts 1..j all accepted) (in a batch, the rows' mean: each row accepts its own drafts).

    Verifying k drafts writes 1 + sum_{j<=k} survival[j-1] tokens for a step feeding k drafts plus the
    block's drafting pass (`st.costs`: measured for the model on this machine; fused drafting: a
    block per fed position, approximated as k + 1 passes; none for copied drafts, `draft_pass`
    False); a plain AR step writes one for `costs.verify(0)`. `sized`: the separate pass runs over
    just the k + 1 slots those k drafts need (`Advance.pass_slots`), at its measured cost by slots;
    else over the whole block (the router reads every slot).
    """
    # A batch step's costs grow with its rows (`StepCosts.for_batch`): a large batch drafts less.
    costs = (st.costs or StepCosts.default(st.cfg.block_size)).for_batch(st.fed.shape[0], st.cfg.block_size)
    # A NAR block must beat a plain step by DRAFT_MARGIN: what the curve leaves out is on its side.
    margin = DRAFT_MARGIN if draft_pass else 0.0
    best_k, best_rate, gain = 0, (1.0 + margin) / costs.verify(0), 1.0
    sized = sized and st.cfg.drafting == "separate"
    for k, s_k in enumerate(survival, start=1):
        gain += s_k
        passes = (k + 1 if st.cfg.drafting == "fused" else 1) if draft_pass else 0
        pass_cost = costs.draft_pass(k + 1 if sized else st.cfg.draft_block) * passes if passes else 0.0
        rate = gain / (costs.verify(k) + pass_cost)
        if rate > best_rate:
            best_k, best_rate = k, rate
    return best_k, best_rate


def probe_length(st: LoopState, n: int) -> int:
    """How many of a block's n drafts a probe verifies (the first block after an AR stretch, threshold
    1): the most whose step costs at most `PROBE_COST` plain AR steps, at least one. It refreshes the
    record whatever the record says; where verifying rows cost little (float32 on the row kernel) that
    is the whole block, where they cost much (int4, whose one-row step is compute-bound) a short one."""
    costs = (st.costs or StepCosts.default(st.cfg.block_size)).for_batch(st.fed.shape[0], st.cfg.block_size)
    limit = PROBE_COST * costs.verify(0)
    return max(1, max((k for k in range(1, n + 1) if costs.verify(k) <= limit), default=1))


# A probe's step may cost this many plain AR steps (`probe_length`). Chosen by measurement on the
# calibration split, int4 and bfloat16 against whole-block probes (docs/results-log.md, "Figures that
# were in code comments"); held-out figures in the README.
PROBE_COST = 1.25

# How much more a NAR block's drafts must promise, in tokens per unit of cost, than a plain AR step
# (`best_draft`; free drafts, which cost no pass, need no margin). The cost curve times the forwards
# (and the speculative rule, the drafts' choice), not the policy's work around a drafting pass (the
# router, the records, the draws), and on a shared CPU its medians carry a few percent of noise; blocks
# promising less than this were measured to lose to `ar` (yue-code-mini at temperature 0.7: issue
# 60's profile, docs/results/profile-xeon-2026-12-07.json); a margin on free drafts too cost yue-smol.
DRAFT_MARGIN = 0.05


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

    def argmax_only(self, cfg: DecodeConfig, model_config) -> bool:
        """Whether a step's AR logits serve only their argmax, so the model may compute them where they
        may be the largest (`YueForCausalLM.step`'s top1): greedy, no penalty or logit bias, no trace (it
        records the AR entropy). Log-probs are asked per row: the loop checks those."""
        return cfg.greedy and not cfg.adjusts_logits and not cfg.trace

    def asks_router(self, cfg: DecodeConfig, model_config) -> bool:
        """Whether a request's drafting steps ask the router (so a screened step brings each AR row's
        entropy, `YueForCausalLM.step`'s ar_entropy)."""
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
            adv.draft_pass = self.worth_a_pass(model, st, adv)
            return adv
        K = st.cfg.block_size
        logits = out.slot_logits  # (B, blocks * K, V)
        if logits.shape[1] > K:  # row b's block: anchor_rows[b]
            first = torch.tensor(adv.anchor_rows, device=logits.device)[:, None] * K
            index = first + torch.arange(K, device=logits.device)  # (B, K)
            logits = logits.gather(1, index[:, :, None].expand(-1, -1, logits.shape[2]))
        return self.draft(model, st, adv, out, logits)

    def worth_a_pass(self, model, st: LoopState, adv: Advance) -> bool:
        """Whether to run the drafting pass this step asks for (False: its block would not be drafted, a
        decision `draft` would take from what the pass cannot change; the policy has taken it)."""
        return True

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        """Use a block anchored at the last kept token (fed[adv.keep - 1]). logits: (B, K, V)."""
        raise NotImplementedError

    def draft_mask(self, model, st: LoopState, base: torch.Tensor | None, start: int, n: int):
        """The drafting pass's attention mask for its n slots at cache index `start`: `base` (from
        `decode_mask`), unless the policy shapes the pass's attention (`anchor`'s pull toward anchors)."""
        return base


def rows_at(t: torch.Tensor, index: list[int]) -> torch.Tensor:
    """Row b's position index[b] of t (B, T, ...) -> (B, ...): a slice when every row takes the same
    position (always so for a lone request), else a gather."""
    if len(set(index)) == 1:
        return t[:, index[0]]
    return t[torch.arange(len(index), device=t.device), torch.tensor(index, device=t.device)]


def anchor_p_ar(model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> torch.Tensor:
    """The router's p_ar(i) = 1 - a_i for a block anchored at each row's last kept token,
    fed[b, adv.keep[b] - 1]: its AR logits are row `adv.anchor_rows[b]` of the step's AR rows (the
    last row when nothing was verified). logits: (B, n, V), the block's slots -> (B, n).

    A separate drafting pass reveals slot 1 (its token, next_fed[:, 0], is known; see loop.py). A
    revealed slot's own output is untrained, so the router is shown what is true of it instead:
    certain (`Router.features`' slot1_revealed). A greedy step's AR rows are screened whatever the
    router threshold (`StepOutput.screened`: the screen costs less than the whole head, measured on
    SmolLM2: docs/results-log.md); the router then reads the anchor row's entropy over its screened
    logits (`StepOutput.ar_entropy`: the loop asks for it where the router is asked, `Policy.asks_router`).
    """
    revealed = st.cfg.drafting == "separate"
    hidden = rows_at(out.hidden, [k - 1 for k in adv.keep])
    ar_logits, ar_entropy = None, None
    if out.ar_entropy is not None:
        ar_entropy = rows_at(out.ar_entropy, adv.anchor_rows)
    else:  # screened rows hold their candidates only: their entropy must come with the step
        assert not out.screened, "a screened step asked for the router needs step(..., ar_entropy=True)"
        ar_logits = rows_at(out.ar_logits, adv.anchor_rows)
    feats = model.router_features(hidden, ar_logits, logits, revealed, ar_entropy=ar_entropy)
    return 1.0 - Router.log_acceptance(model.router(feats)).exp()[:, : logits.shape[1]]


class ARPolicy(Policy):
    """One token per forward: the reference."""

    name = "ar"

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        tok = choose_rows(adjusted_ar_logits(st, out)[:, -1], st.cfg, st.generators)  # (B,)
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
        return st.cfg.router_threshold > 0 and st.drafts.block.ar_stretch == 0 and st.cfg.draft_block >= 2

    def asks_router(self, cfg: DecodeConfig, model_config) -> bool:
        """Below threshold 1 (`draft` asks it where not every slot is drafted)."""
        return cfg.draft_gate(model_config) < 1.0

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
        Each row accepts its own longest verified prefix (no batch minimum: per-row acceptance). A
        draft is accepted where it is the AR path's choice, or within `tolerance` of it (`hybrid`).
        """
        k, t = st.max_drafts, self.tolerance(st)
        drafts = st.fed[:, st.fed.shape[1] - k :]  # (B, k); row b's drafts are its last n_drafts[b]
        if st.cfg.greedy:
            choice = target.argmax(-1)  # (B, k+1)
            if k == 0:
                return [0] * len(choice), choice[:, 0]
            ok = choice[:, :k] == drafts  # (B, k)
            if t > 0:
                ok |= within_tolerance(target[:, :k], drafts, t)
            if min(st.n_drafts) == k:  # every row verifies k drafts (a lone row always)
                run = ok.int().cumprod(-1).sum(-1)  # (B,)
                return run.tolist(), choice.gather(1, run[:, None])[:, 0]
            # A row with k_b < k drafts has k - k_b leading columns that are not drafts: count them as
            # matched, so run = those + the row's accepted drafts, and choice[b, run] is its next token.
            lead = k - torch.tensor(st.n_drafts, device=choice.device)  # (B,)
            pad = torch.arange(k, device=choice.device)[None, :] < lead[:, None]  # (B, k)
            run = (ok | pad).int().cumprod(-1).sum(-1)  # (B,)
            return (run - lead).tolist(), choice.gather(1, run[:, None])[:, 0]
        if k == 0:
            return [0] * len(target), choose_rows(target[:, 0], st.cfg, st.generators)
        logp = warp(target, st.cfg)
        st.judged = judged_rates(logp[:, :k], st.draft_logprobs, drafts, st.n_drafts)
        rows = [
            speculative_accept(logp[b, k - kb :], st.draft_logprobs[b, k - kb :], drafts[b, k - kb :], g, t)
            for b, (kb, g) in enumerate(zip(st.n_drafts, st.generators, strict=True))
        ]
        return [r[0] for r in rows], torch.tensor([r[1] for r in rows], device=target.device)

    @staticmethod
    def tolerance(st: LoopState) -> float:
        """How far below the AR path's choice a draft may be and still be accepted: none (exact)."""
        return 0.0

    def record_length(self, st: LoopState, n: int) -> int:
        """How many of a block's n drafts to verify next step when the router is not asked (threshold
        1): the k with the most expected tokens per unit of cost under the acceptance record
        (`AcceptanceRecord.survival`); 0 = drafting does not pay on this text so far."""
        return best_length(st, st.drafts.block.record().survival(n), sized=True)

    def draft_length(self, st: LoopState, p_ar: torch.Tensor, gate: float) -> int:
        """How many drafts (slots 2..) to verify next step; 0 = draft nothing. p_ar: (B, n), slots 1..n.

        Draft j survives with A_j = a_{j+1} / a_1 (slot 1 is the position of the AR token already
        chosen). Among the leading drafts with p_ar(i) <= gate (docs/design.md's one rule;
        `DecodeConfig.draft_gate`), we take the k with the most expected tokens per unit of cost
        (`best_length`), each A_j scaled by how the router's predictions have held on this request
        (`AcceptanceRecord.ratio`). In a batch, k is one number for every row: A_j is the rows' mean
        (each row accepts its own drafts). (At gate 1 the router is not asked: see `record_length`.)
        """
        acc = 1.0 - p_ar  # (B, n)
        A = (acc[:, 1:] / acc[:, :1].clamp(min=1e-6)).clamp(max=1.0).mean(0).tolist()
        allowed = (p_ar[:, 1:] <= gate).all(0).tolist()
        A = A[: next((j for j, ok in enumerate(allowed) if not ok), len(A))]
        # The router's predictions, scaled by how they have held on this request so far.
        record = st.drafts.block.record()
        k = best_length(st, [min(a * record.ratio, 1.0) for a in A])
        record.pending = sum(A[:k]) if k else None
        return k

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        n_acc, nxt = self.verify(st, adjusted_ar_logits(st, out, st.max_drafts + 1))
        adv = self.accept(st, n_acc, nxt)
        drafts = st.drafts
        if drafts.contexts is not None:
            prof = profile.ACTIVE
            t0 = time.perf_counter() if prof else 0.0
            drafts.extend(adv.emitted)
            if prof:
                prof.inner("draft:contexts", time.perf_counter() - t0)
            if self.copy(model, st, adv):  # free drafts: no drafting pass this step
                drafts.block.rest()
                return adv
        if not self.drafts_now(st):
            drafts.block.rest()
            return adv
        # Fused: one block (at the last fed token) when nothing was drafted, else one per verifying
        # position; each row drafts from the block on its last accepted token (`with_block`).
        return self.with_block(model, st, adv, out)

    def accept(self, st: LoopState, n_acc: list[int], nxt: torch.Tensor) -> Advance:
        """What a verifying step keeps and emits: per row, its `n_acc` accepted drafts then the AR
        path's token nxt (B,), which is fed next; the drafts' source's record learns how they fared."""
        drafts = st.drafts
        if st.max_drafts:  # the record counts the rows' mean (sampled: each draft's chance, `judged_rates`)
            drafts.observe(round(sum(st.n_drafts) / len(n_acc)), round(sum(n_acc) / len(n_acc)), st.judged)
        st.judged = None
        W, fed = st.fed.shape[1], st.fed.tolist()
        rows = zip(fed, st.n_drafts, n_acc, nxt.tolist(), strict=True)
        emitted = [row[W - k : W - k + n] + [t] for row, k, n, t in rows]
        # Accepted free drafts are the AR path's tokens in `verified` (it would have written them; no
        # NAR set did); `hybrid`'s tolerance may keep ones the AR path did not choose: drafts, as the NAR's.
        free_are_ar = drafts.in_flight is not None and self.tolerance(st) == 0
        sources = [["ar" if free_are_ar else "nar"] * n + ["ar"] for n in n_acc]
        # Counted by who proposed them, whatever the path (`GenerationStats.token_sources`).
        writers = [[drafts.verifying.source] * n + ["ar"] for n in n_acc]
        keep = [W - k + n for k, n in zip(st.n_drafts, n_acc, strict=True)]  # prefill: the whole prompt
        adv = Advance(keep, emitted, sources, writers, nxt[:, None], mode="NAR" if st.max_drafts else "AR")
        adv.drafted, adv.accepted = list(st.n_drafts), n_acc
        adv.ar_first = [st.max_drafts - k for k in st.n_drafts]
        adv.ar_count = [n + 1 for n in n_acc]
        drafts.in_flight = None
        return adv

    def copy(self, model, st: LoopState, adv: Advance) -> bool:
        """Feed free drafts next where every row has some and their record says they pay: from the
        source (`sources.FreeSource`: context copies, corpus n-grams) whose record for its match
        promises the most tokens per unit of cost, where that beats what the NAR block's record
        promises. Sets adv.next_* and returns True, else leaves adv as it is."""
        n = st.cfg.block_size - 1
        if n < 1:
            return False
        best, best_k, best_rate = None, 0, 0.0
        prof = profile.ACTIVE
        for source in st.drafts.free:  # in order: a tie goes to the first
            t0 = time.perf_counter() if prof else 0.0
            proposal = source.propose(st.drafts.contexts, n)
            if prof:
                prof.inner(f"draft:{source.name}", time.perf_counter() - t0)
            if proposal is None:
                continue
            # Free drafts cost no drafting pass, only their verifying rows.
            k, rate = best_draft(st, proposal.record.survival(len(proposal.drafts[0])), draft_pass=False)
            if k and (best is None or rate > best_rate):
                best, best_k, best_rate = proposal, k, rate
        if best is None or best_rate < self.nar_rate(model, st, n):  # the NAR set's drafts promise more
            return False
        drafts = torch.tensor([d[:best_k] for d in best.drafts], device=adv.next_fed.device)  # (B, k)
        adv.next_fed = torch.cat([adv.next_fed, drafts], dim=1)
        adv.next_drafts, st.drafts.in_flight = [best_k] * len(best.drafts), best.record
        if not st.cfg.greedy:  # free drafts are certain proposals: q is one-hot on each (speculative rule)
            adv.next_draft_logprobs = one_hot_logprobs(drafts, model.config.vocab_size)
        return True

    def nar_rate(self, model, st: LoopState, n: int) -> float:
        """The expected tokens per unit of cost of drafting n NAR slots next step, under the record
        (threshold 1; 0 where the NAR set would not draft now, or the router decides its drafts)."""
        if not self.drafts_now(st) or st.cfg.draft_gate(model.config) < 1.0:
            return 0.0
        return best_draft(st, st.drafts.block.record().survival(n), sized=True)[1]

    def worth_a_pass(self, model, st: LoopState, adv: Advance) -> bool:
        """Where the router is not asked (threshold 1, no trace), `draft` sizes a block from the
        acceptance record alone (`record_length`; a probe, `probe_length`), which the pass's logits do
        not change. So the pass is sized here: over the k + 1 slots that k drafts need
        (`Advance.pass_slots`: a pass's cost falls with its slots, measured by `decode.costs`), and
        where k is 0 the block is declined, as `draft` would decline it, without paying for the pass (a
        batch's pass over rows x slots costs more than a step)."""
        block, n = st.drafts.block, st.cfg.draft_block - 1
        if st.cfg.draft_gate(model.config) < 1.0 or st.cfg.trace or n < 1:
            return True
        k = probe_length(st, n) if block.probe else self.record_length(st, n)
        if k:
            adv.pass_slots = k + 1
            return True
        block.look()
        adv.routed = (n, 0)
        block.back_off(st.cfg.reeval_every, probe=True)
        return False

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        """Choose the next draft from a block anchored at the last accepted token; sets adv.next_*."""
        # Fused blocks: slots 2.. are drafted even where slot 1 guessed another token than the AR
        # path's: they predict fixed positions, and often still hold (dev set, threshold 1: 2.34 ->
        # 2.69 tokens per forward); verification keeps the output exact either way. A separate pass
        # revealed slot 1, so its slots 2.. already know the AR token (3.63 -> 4.38 tokens per step).
        n = logits.shape[1] - 1
        gate = st.cfg.draft_gate(model.config)
        every_slot = gate >= 1.0  # the router is not asked: the record decides
        p_ar = self.ask_router(model, st, adv, out, logits, needed=not every_slot)
        block = st.drafts.block
        probing = block.look()  # the first block after an AR stretch (threshold 1) is a probe
        if not every_slot:
            k_next = self.draft_length(st, p_ar, gate)
        else:
            k_next = probe_length(st, n) if probing else self.record_length(st, n)
        # Routed over the whole block, also where a sized pass ran fewer slots (`worth_a_pass`).
        adv.routed = (max(n, st.cfg.draft_block - 1) - k_next, k_next)
        if k_next == 0:
            # No draft is worth its cost here; a block costs a whole NAR pass, so write plain AR steps
            # for a while and look again, backing off further after each futile look.
            block.back_off(st.cfg.reeval_every, probe=every_slot)
            return adv
        block.drafted(probing)
        # Only the slots drafted are drawn (sampling: a draw over the vocabulary each), once their
        # number is known; slot 1 is the AR token's position, never a draft.
        drafts, q = draft_slots(st, logits[:, 1 : 1 + k_next])
        self.feed(adv, drafts, q)
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
    def feed(adv: Advance, drafts: torch.Tensor, q: torch.Tensor | None) -> None:
        """Feed next, after the AR token, a block's drafts to verify (slots 2.., with their sampling
        log-probs q (B, k, V), if sampled). drafts: (B, k)."""
        adv.next_fed = torch.cat([adv.next_fed, drafts], dim=1)
        adv.next_drafts = [drafts.shape[1]] * len(adv.next_fed)
        adv.next_draft_logprobs = q


class HybridPolicy(VerifiedPolicy):
    """`verified` with a lossy acceptance rule: a draft is kept when the AR path finds it nearly as
    likely as its own choice. The one dial is the tolerance t (`router_threshold` in this mode).

    Drafting is `verified`'s at the model's default (`DecodeConfig.draft_gate`): the same blocks, fed as
    drafts to the next forward, whose AR rows give p_AR at every draft position at no extra cost. The
    rule (greedy), left to right over fed = [p0, d1..dk], p_i = the AR distribution at d_i's position:

        accept d_i  iff  d_i = argmax p_i  or  p_i(d_i) >= (1 - t) * max p_i        (`within_tolerance`)

    and at the first rejection (or after d_k) write the AR path's own token. Medusa's "typical
    acceptance" (Cai et al. 2024) in its probability-ratio form: each accepted token costs at most
    -log(1 - t) nats of AR log-likelihood against the AR path's choice at that position, whatever the
    text, where the router-trust rule it replaces committed slots on the router's word and lost its
    fidelity off the text the router was calibrated on (issue 13: NLL ratio 1.164 held-out, 1.036 dev).
    t = 0 is `verified` (exact); t = 1 accepts every draft. Sampling: speculative sampling on the warped
    distributions, plus the same bound on the warped p (`sampling.speculative_accept`'s tolerance).
    """

    name = "hybrid"

    def argmax_only(self, cfg: DecodeConfig, model_config) -> bool:
        """Never: the tolerance reads p_AR at each draft."""
        return False

    def drafts_now(self, st: LoopState) -> bool:
        """`verified`'s, except that t = 0 still drafts (it is `verified`, not `ar`)."""
        return st.drafts.block.ar_stretch == 0 and st.cfg.draft_block >= 2

    @staticmethod
    def tolerance(st: LoopState) -> float:
        """The acceptance rule's t: `router_threshold` in this mode (`VerifiedPolicy.verify` applies it)."""
        return st.cfg.router_threshold


class NARPolicy(Policy):
    """Commit the whole block every step, unverified: the fastest and least faithful baseline."""

    name = "nar"

    def drafts_now(self, st: LoopState) -> bool:
        return True

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        bonus = choose_rows(adjusted_ar_logits(st, out)[:, -1], st.cfg, st.generators)
        return self.with_block(model, st, commit_unverified(st, bonus), out)

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        slots, _ = draft_slots(st, logits)
        adv = commit_unverified(st, adv.next_fed[:, 0], slots[:, 1:])
        adv.routed = (0, slots.shape[1] - 1)
        return adv
