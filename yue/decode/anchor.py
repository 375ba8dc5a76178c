"""`anchor` and `anchor-verified`: anchor planning (issue 47; docs/design.md §2), an experiment.

The design articles: the AR path writes a few key anchors, their number predicted from the prompt,
each with a confidence; the NAR set fills what lies between them in one pass, its attention pulled
toward the anchors by their confidence. The AR path here is causal, so anchors come in order, one
span of `ANCHOR_SPAN` (2) tokens before each gap:

    step i      AR writes anchor a1 (confidence c1 = p_AR(a1))                       tag "anchor"
    step i+1    AR writes anchor a2 (c2); a NAR-only fill pass over one block at the last committed
                token, slot 1 revealed as a2, its attention logits + anchor_bias * c on the keys of
                a1 and a2 (`model/anchors.fill_bias`); slots 2..g+1 are the fill   tag "fill"

The gap g is planned once per request from the prompt: the count head (`AnchorHead`, on the prompt's
last hidden state) predicts n anchors (2..12) over a horizon of 64 tokens, and g = ceil(64 / n) - 2, in
[1, K - 1] (`anchors.gap_for`). A model without the head fills whole blocks (g = K - 1).

- `anchor` (lossy) commits the fill unverified: 2 + g tokens for two steps and one fill pass.
- `anchor-verified` (lossless) feeds the fill as drafts to the next step, which verifies them as
  `verified` does (greedy: longest prefix equal to the AR choices, then the AR's own token; sampling:
  the speculative rule). The AR's own token is the next span's first anchor. Output equals `ar`'s.
"""

from __future__ import annotations

import torch

from yue.config import DecodeConfig
from yue.decode.policies import (
    Policy,
    VerifiedPolicy,
    adjusted_ar_logits,
    commit_unverified,
    draft_slots,
    rows_at,
)
from yue.decode.sampling import choose_rows
from yue.decode.state import Advance, LoopState
from yue.model.anchors import ANCHOR_SPAN, fill_bias, gap_for
from yue.model.mot import StepOutput


def confidence(logits: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
    """The AR path's probability of each chosen token: logits (B, V), tokens (B,) -> (B,)."""
    return logits.float().softmax(-1).gather(-1, tokens[:, None])[:, 0]


class AnchorPlan:
    """The anchor policies' shared parts: the plan (gap), the span's confidences, the fill's bias."""

    def argmax_only(self, cfg: DecodeConfig, model_config) -> bool:
        """Never: each anchor's confidence is its AR probability (the whole softmax)."""
        return False

    @staticmethod
    def plan(model, st: LoopState, out: StepOutput) -> None:
        """At a request's first step (its prefill), the gap g between anchor spans: from the count head
        on the prompt's last hidden state, the smallest row's (one shape per batch)."""
        if st.anchor_gap is not None:
            return
        K = st.cfg.draft_block
        head = model.anchor_head
        counts = head.count(out.hidden[:, -1].float()) if head is not None else None
        st.anchor_gap = K - 1 if counts is None else min(gap_for(n, K) for n in counts)
        st.anchor_counts = counts

    @staticmethod
    def span_done(st: LoopState, conf: torch.Tensor) -> bool:
        """Record an anchor's confidence (B,); True when it closes its span (a fill follows)."""
        st.anchor_conf.append(conf)
        return len(st.anchor_conf) >= ANCHOR_SPAN

    def draft_mask(self, model, st: LoopState, base: torch.Tensor | None, start: int, n: int):
        """The fill pass's mask: `base` plus anchor_bias * confidence on the span's keys (the last
        committed token, cache index start - 1, and slot 1 at start), where the model has a bias."""
        scale = model.config.anchor_bias
        if not scale or len(st.anchor_conf) < ANCHOR_SPAN:
            return base
        conf = torch.stack(st.anchor_conf[-ANCHOR_SPAN:], dim=1)  # (B, 2)
        return fill_bias(base, start + n, n, [start - 1, start], conf, scale)


class AnchorPolicy(AnchorPlan, Policy):
    """Lossy: anchor spans by the AR path, each gap filled by one NAR pass and committed unverified."""

    name = "anchor"

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        self.plan(model, st, out)
        logits = adjusted_ar_logits(st, out)[:, -1]  # (B, V)
        token = choose_rows(logits, st.cfg, st.generators)
        adv = commit_unverified(st, token)
        adv.sources = [["anchor"] for _ in adv.sources]
        adv.mode = "ANCHOR"
        if not self.span_done(st, confidence(logits, token)):
            return adv
        adv.draft_pass = True  # the fill: a NAR pass anchored at the last kept token, slot 1 = token
        return adv

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        g = st.anchor_gap
        slots, _ = draft_slots(st, logits)  # (B, K)
        filled = commit_unverified(st, adv.next_fed[:, 0], slots[:, 1 : 1 + g])
        filled.sources = [["anchor"] + ["fill"] * g for _ in filled.sources]
        filled.mode, filled.routed = "FILL", (0, g)
        st.anchor_conf = []
        return filled


class AnchorVerifiedPolicy(AnchorPlan, VerifiedPolicy):
    """Lossless: as `anchor`, but each fill is verified by the next step as `verified` verifies drafts."""

    name = "anchor-verified"

    def advance(self, model, st: LoopState, out: StepOutput) -> Advance:
        self.plan(model, st, out)
        k = st.max_drafts
        target = adjusted_ar_logits(st, out, k + 1)  # (B, k + 1, V)
        n_acc, token = self.verify(st, target)
        W, fed = st.fed.shape[1], st.fed.tolist()
        emitted = [
            row[W - d : W - d + n] + [t]
            for row, d, n, t in zip(fed, st.n_drafts, n_acc, token.tolist(), strict=True)
        ]
        sources = [["fill"] * n + ["anchor"] for n in n_acc]
        writers = [["nar"] * n + ["ar"] for n in n_acc]  # a fill is the NAR set's, an anchor the AR path's
        keep = [W - d + n for d, n in zip(st.n_drafts, n_acc, strict=True)]
        adv = Advance(keep, emitted, sources, writers, token[:, None], mode="FILL" if k else "ANCHOR")
        adv.drafted, adv.accepted = list(st.n_drafts), n_acc
        adv.ar_first = [k - d for d in st.n_drafts]
        adv.ar_count = [n + 1 for n in n_acc]
        if st.n_drafts and k:  # a fill was judged: the span restarts at the AR's token
            st.anchor_conf = []
        row = [k - d + n for d, n in zip(st.n_drafts, n_acc, strict=True)]  # each row's token's AR row
        if self.span_done(st, confidence(rows_at(target, row), token)):
            adv.draft_pass = True
        return adv

    def draft(self, model, st: LoopState, adv: Advance, out: StepOutput, logits: torch.Tensor) -> Advance:
        slots, q = draft_slots(st, logits)
        gap = st.anchor_gap
        self.feed(adv, slots[:, 1 : 1 + gap], None if q is None else q[:, 1 : 1 + gap])
        adv.routed = (0, st.anchor_gap)
        return adv
