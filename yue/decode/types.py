"""Results of decoding, as dataclasses (never tuples): one `Step` per forward, a `Trace`, the stats.

Design decisions:
- Every forward is recorded as counts (cheap integers) in `GenerationStats`; the per-step `Step`
  records (with p_ar and entropy) are only built when `DecodeConfig.trace` is on.
- Token provenance ("ar" or "nar") travels with every streamed chunk so the demo page and the
  metrics can show who wrote what. In `verified` mode an accepted draft token counts as "nar" (the NAR
  set wrote it, the AR path only checked it); the AR path's own bonus/correction token is "ar".
- Apart from that path, each token is counted by the draft source that wrote it (`Writer`: the NAR set,
  context copies, the corpus table, or the AR path): an accepted draft is its proposer's, even a free
  draft that `verified` labels "ar" (the AR path would have written it, but a copy did, at no step's
  cost). `GenerationStats.token_sources` sums them per request (integers).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from typing import Literal

# Who wrote a token: the AR path ("ar"; the anchor modes' "anchor") or the NAR set ("nar"; "fill").
Source = Literal["ar", "nar", "anchor", "fill"]
NAR_SOURCES = ("nar", "fill")
# Which draft source wrote a committed token (`decode/sources.py`'s names), or the AR path.
Writer = Literal["nar", "copy", "corpus", "ar"]
WRITERS: tuple[Writer, ...] = ("nar", "copy", "corpus", "ar")
FinishReason = Literal["stop", "length", "eos", "cancelled", "error"]


@dataclass
class Step:
    """One forward pass of the decode loop.

    Attributes:
        index: 0-based step number.
        mode: "AR" when the step drafted nothing, "NAR" when it drafted (or committed) slots.
        drafted: draft tokens this step verified (verified, hybrid) or slots it committed unverified (nar).
        accepted: of those, how many were kept.
        p_ar: the router's p_ar(i) for the block drafted this step (empty when no block).
        entropy: AR next-token entropy (nats) at the last committed position.
        time_ms: wall time of the step.
    """

    index: int
    mode: str
    drafted: int
    accepted: int
    p_ar: list[float]
    entropy: float
    time_ms: float

    def format(self) -> str:
        p = f"{self.p_ar[0]:.2f}" if self.p_ar else "-"
        return (
            f"[router] step {self.index}: {self.mode} k={self.drafted} accepted={self.accepted} "
            f"p_ar={p} H={self.entropy:.2f} ({self.time_ms:.1f} ms)"
        )


@dataclass
class GenerationStats:
    """Counters for one sequence (in a batch: the forwards its row took part in, its own drafts).

    Attributes:
        forwards: model forward passes, prefill included.
        draft_passes: of those, NAR-only drafting passes (`verified` with separate drafting); the
            others are steps, each verifying and emitting.
        new_tokens: tokens generated.
        ar_tokens / nar_tokens: generated tokens by the path that wrote them.
        token_sources: generated tokens by the source that wrote them (`WRITERS`): an accepted draft
            counts for the source that proposed it, every token the AR path chose for "ar"; they sum
            to new_tokens.
        drafted / accepted: draft tokens proposed for verification (or unverified commit) and kept.
        accepted_per_pos: accepted_per_pos[i] counts steps whose (i+1)-th draft token was accepted.
        accept_lengths: per drafting step, the number of draft tokens accepted (for histograms).
        router_decisions: block positions (slots 2..K of each drafted block) by the path chosen for
            them, {"ar": n, "nar": m}: "nar" = drafted (`verified`) or committed unverified
            (`hybrid`, `nar`), "ar" = left to the AR path.
        ttft_s: seconds to the first generated token; total_s: seconds for the whole request.
    """

    forwards: int = 0
    draft_passes: int = 0
    new_tokens: int = 0
    ar_tokens: int = 0
    nar_tokens: int = 0
    token_sources: dict[str, int] = field(default_factory=lambda: dict.fromkeys(WRITERS, 0))
    drafted: int = 0
    accepted: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)
    accept_lengths: list[int] = field(default_factory=list)
    router_decisions: dict[str, int] = field(default_factory=lambda: {"ar": 0, "nar": 0})
    ttft_s: float = 0.0
    total_s: float = 0.0

    @property
    def tokens_per_forward(self) -> float:
        """Generated tokens per forward pass, the prefill forward included (it writes the first token)."""
        return self.new_tokens / self.forwards if self.forwards else 0.0

    @property
    def tokens_per_step(self) -> float:
        """Generated tokens per verifying forward (drafting passes not counted)."""
        steps = self.forwards - self.draft_passes
        return self.new_tokens / steps if steps else 0.0

    @property
    def token_shares(self) -> dict[str, float]:
        """`token_sources` as shares of the generated tokens (all 0 when none)."""
        return {w: n / self.new_tokens if self.new_tokens else 0.0 for w, n in self.token_sources.items()}

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tokens_per_forward"] = self.tokens_per_forward
        d["tokens_per_step"] = self.tokens_per_step
        return d


@dataclass
class TokenLogprob:
    """A generated token's log-probability under the AR path (raw log-softmax of its logits).

    Attributes:
        token: the token id.
        logprob: its log-probability; None for a token committed unverified (no AR log-prob then).
        top: the most likely tokens at that position, id -> log-probability, most likely first.
    """

    token: int
    logprob: float | None
    top: dict[int, float] = field(default_factory=dict)


@dataclass
class GenerationResult:
    """The outcome of `Engine.generate` for one prompt."""

    text: str
    token_ids: list[int]
    finish_reason: FinishReason
    prompt_tokens: int
    stats: GenerationStats
    trace: list[Step] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None  # per token, when `DecodeConfig.logprobs` is set

    def trace_json(self) -> str:
        return json.dumps([asdict(s) for s in self.trace])


@dataclass
class StreamEvent:
    """One chunk of `Engine.stream`: the text completed since the last event and who wrote it.

    Attributes:
        delta: new text (never splits a UTF-8 character; may be "" when bytes are held back).
        token_ids: tokens committed since the last event.
        sources: "ar"/"nar" for each of `token_ids`.
        finish_reason: set on the last event only.
        stats: set on the last event only.
        trace: steps since the last event (when tracing).
        logprobs: per token of `token_ids`, when `DecodeConfig.logprobs` is set.
    """

    delta: str
    token_ids: list[int]
    sources: list[Source]
    finish_reason: FinishReason | None = None
    stats: GenerationStats | None = None
    trace: list[Step] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
