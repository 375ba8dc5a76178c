"""The decode loop's state and a step's decision, which the policies read and write.

`LoopState` is a batch's mutable decode state (what to feed next, penalties' counts, the draft
sources with their acceptance records: `decode/sources.py`); `Advance` is what one step decided per
row. Kept apart from the policies (`policies.py`) so that the loop (`loop.py`), batching (`rows.py`)
and tests share them without the policies' code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from yue.config import DecodeConfig
from yue.decode.costs import StepCosts
from yue.decode.sources import DraftSources


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
        counts: (B, V) int32, how often each row generated each token (OpenAI's presence / frequency
            penalties), or None.
        costs: the step costs `draft_length` weighs (measured for the model on this machine,
            `decode.costs`); None = `StepCosts.default`.
        drafts: verified / hybrid: the draft sources, their acceptance records and the rows' contexts
            they read (`decode/sources.py`).
    """

    cfg: DecodeConfig
    generators: list[torch.Generator | None]
    fed: torch.Tensor
    n_drafts: list[int] = field(default_factory=list)
    draft_logprobs: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    costs: StepCosts | None = None
    drafts: DraftSources = field(default_factory=DraftSources)
    # Sampling: per draft position, the chance the step now verifying accepted each draft given those
    # before it (`sampling.judged_rates`), for the record; None: judged by the accepted count.
    judged: list[float] | None = None
    # `anchor` / `anchor-verified` (`decode/anchor.py`): the gap between anchor spans (planned at the
    # first step), each row's predicted anchor count (None without a count head), and the confidences
    # (B,) of the current span's anchors.
    anchor_gap: int | None = None
    anchor_counts: list[int] | None = None
    anchor_conf: list[torch.Tensor] = field(default_factory=list)

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
    drafted/accepted: draft tokens verified (or committed unverified) and kept; writers: per emitted
    token, the draft source that wrote it or "ar" (`types.Writer`)."""

    keep: list[int]
    emitted: list[list[int]]
    sources: list[list[str]]
    writers: list[list[str]]
    next_fed: torch.Tensor
    next_drafts: list[int] | None = None  # None: no drafts
    next_draft_logprobs: torch.Tensor | None = None
    mode: str = "AR"
    draft_pass: bool = False  # run a NAR-only pass anchored at each row's fed[keep - 1], then `draft`
    pass_slots: int | None = None  # that pass's slots (slot 1 revealed, then the drafts); None = the block
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
