"""The decode loop's state and a step's decision, which the policies read and write.

`LoopState` is a batch's mutable decode state (what to feed next, penalties' counts, the drafting
records); `AcceptanceRecord` is how drafts fared on the text at hand, learnt as a request decodes;
`Advance` is what one step decided per row. Kept apart from the policies (`policies.py`) so that the
loop (`loop.py`), batching (`rows.py`) and tests share them without the policies' code.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from yue.config import DecodeConfig
from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import StepCosts
from yue.decode.lookup import NgramIndex


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
        ar_stretch: AR-only steps (verified) or AR-written tokens (hybrid) left before the router is
            asked again.
        futile_probes: verified: consecutive steps whose slots the router found not worth drafting;
            each doubles the next AR stretch (capped), since a probe costs a whole NAR pass.
        costs: the step costs `draft_length` weighs (measured for the model on this machine,
            `decode.costs`); None = `StepCosts.default`.
        probe: verified at threshold 1: the next block is drafted as far as a probe may cost
            (`probe_length`), whatever the record says (set when an AR stretch starts).
        contexts: verified / hybrid: each row's context, indexed for copied and corpus drafts
            (`decode/lookup.py`); None = no lookup.
        corpus: verified / hybrid: the model's n-gram table of its own answers, for corpus drafts
            (`decode/corpus.py`); None = none.
        free_records: the acceptance records of copied and corpus drafts, one per source and match
            length: (`"copy"` | `"corpus"`, n), n the length of the context whose continuation the
            first draft is (they cost no drafting pass, and fare otherwise than the NAR set's and each
            other's: see `VerifiedPolicy.copy`).
        free_rates: their records' priors, `YueConfig.free_draft_rates` ("copy:2" -> c_1, c_2, ...).
        copied: the record of the free drafts in flight (one of free_records); None when they are the
            NAR set's (or none).
        record: verified: the NAR drafts' acceptance record over this batch's verifying steps (a lone
            request's own; rows that join a running batch share the batch's, `rows.merge`).
    """

    cfg: DecodeConfig
    generators: list[torch.Generator | None]
    fed: torch.Tensor
    n_drafts: list[int] = field(default_factory=list)
    draft_logprobs: torch.Tensor | None = None
    seen: torch.Tensor | None = None
    counts: torch.Tensor | None = None
    ar_stretch: int = 0
    futile_probes: int = 0
    costs: StepCosts | None = None
    probe: bool = False
    contexts: list[NgramIndex] | None = None
    corpus: CorpusNgrams | None = None
    free_records: dict[tuple[str, int], AcceptanceRecord] = field(default_factory=dict)
    free_rates: dict[str, list[float]] = field(default_factory=dict)
    copied: AcceptanceRecord | None = None
    record: AcceptanceRecord = field(default_factory=lambda: AcceptanceRecord())
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
class AcceptanceRecord:
    """How drafts fare on the text at hand, learnt as a request decodes (`verified`).

    Drafting pays only where enough drafts are accepted to cover the verifying rows and the drafting
    pass; how many are depends on the text. yue-smol's drafts, trained on model-written answers,
    accept several times more per step on its calibration split than on hand-written held-out chat,
    where drafting every block made `verified` slower than `ar` (docs/results-log.md). So each verifying step is recorded:
    - per draft position j, how often draft j held where it was judged (verified, with drafts
      1..j-1 held) (`survival`: this request's own estimate, used when the router is not asked,
      threshold 1);
    - what the router expected of the drafts it chose against what was accepted (`ratio`: scales
      the router's predictions, which the drafting data's distribution calibrated, to this text).
    Both start from priors worth `PRIOR` steps (survival 1, ratio 1: draft), so a few bad steps are
    needed to stop drafting, and AR stretches end with a probe that refreshes the record.

    Survival is a chain of per-position rates: c_j, the chance that draft j holds where drafts 1..j-1
    did, is estimated from the steps that judged it, with a prior worth `PRIOR` steps whose mean is
    c_{j-1} (1 for draft 1); P(drafts 1..j) = c_1 ... c_j. A position no step has judged yet so
    inherits its predecessor's rate, and the estimate decays geometrically past the data: after one
    step whose 8 drafts all failed at the first, P(1..8) reads 0.67^8 = 0.04, not 0.67, which on a
    CPU whose verifying rows cost much (AVX2's, docs/results-log.md) would keep drafting whole blocks.

    A record may start from measured rates instead (`prior`: the c_j the model's calibration answers
    gave its kind of drafts, `YueConfig.free_draft_rates`): then c_j's prior mean is prior[j - 1].

    Attributes:
        reached / held: per draft position (index j - 1), steps that verified >= j drafts and accepted
            >= j - 1 (so judged draft j), and of those the steps that accepted >= j (batch mean).
        predicted / accepted: the router's expected accepted drafts and the accepted ones, summed.
        pending: the router's expectation for the drafts now in flight (None: not the router's).
        prior: per draft position, the prior mean of c_j where measured (past its end, c_{j-1}).
    """

    prior: tuple[float, ...] = ()
    reached: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    predicted: float = 0.0
    accepted: float = 0.0
    pending: float | None = None

    PRIOR = 2.0

    @property
    def ratio(self) -> float:
        return (self.accepted + self.PRIOR) / (self.predicted + self.PRIOR)

    def survival(self, n: int) -> list[float]:
        """Estimated P(drafts 1..j all accepted) for j = 1..n, non-increasing."""
        out, rate, last = [], 1.0, 1.0
        for j in range(n):
            reached, held = (self.reached[j], self.held[j]) if j < len(self.reached) else (0, 0)
            mean = self.prior[j] if j < len(self.prior) else rate
            rate = (held + self.PRIOR * mean) / (reached + self.PRIOR)
            last *= rate
            out.append(last)
        return out

    def observe(self, drafted: int, accepted: int) -> None:
        """Fold in a verifying step that verified `drafted` drafts and accepted `accepted` of them."""
        while len(self.reached) < drafted:
            self.reached.append(0), self.held.append(0)
        for j in range(min(drafted, accepted + 1)):  # drafts 1..accepted + 1 were judged
            self.reached[j] += 1
            self.held[j] += accepted > j
        if self.pending is not None:
            self.predicted += self.pending
            self.accepted += accepted
            self.pending = None


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
