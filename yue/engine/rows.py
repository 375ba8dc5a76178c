"""One request's text and counters over the decode steps (`RowStream`), shared by `Engine.stream`,
`Engine.generate` of a batch and the server's continuous batcher (`yue.batcher`).

Text concerns live here, token concerns in `decode.loop`: detokenizing without splitting a UTF-8
character, stop strings (text is cut before the first stop string; a streamed delta is held back while
it could still be the start of one), and finish reasons.
"""

from __future__ import annotations

import logging
import time

from yue.config import DecodeConfig
from yue.decode.loop import StepEmission
from yue.decode.types import NAR_SOURCES, GenerationStats, StreamEvent
from yue.tokenizer import IncrementalDetokenizer, YueTokenizer

logger = logging.getLogger("yue")


# Router-collapse warning: at a threshold in this range, a router that sends every drafted block
# position one way (over at least this many: 8 blocks of K = 8) is probably miscalibrated for the input.
COLLAPSE_RANGE, COLLAPSE_MIN_DECISIONS = (0.2, 0.8), 56


class TextTracker:
    """One row's text: incremental detokenizing plus stop strings, with safe streaming deltas."""

    def __init__(self, tokenizer: YueTokenizer, stop: tuple[str, ...]) -> None:
        self.detok = IncrementalDetokenizer(tokenizer)
        self.stop = stop
        self.hold = max((len(s) for s in stop), default=1) - 1  # chars that might start a stop string
        self.emitted = 0  # chars of detok.text already handed out
        self.stopped = False

    def push(self, ids: list[int], final: bool = False) -> str:
        """Add tokens; return the text now safe to emit."""
        self.detok.push(ids)
        if final:
            self.detok.flush()
        text = self.detok.text
        for s in self.stop:
            cut = text.find(s, max(0, self.emitted - len(s)))
            if cut != -1:
                text, self.stopped = text[:cut], True
        end = len(text) if (final or self.stopped) else max(self.emitted, len(text) - self.hold)
        delta = text[self.emitted : end]
        self.emitted = end
        return delta


class RowStream:
    """One request's view of the decode steps: its text (detokenized, stop strings), its counters, and
    the `StreamEvent` each step makes of them. Shared by `Engine.stream`, `Engine.generate` of a
    list and the server's continuous batcher.

    Attributes:
        stats: the request's counters; forwards count every forward its row took part in.
        finish_reason: set once the row has finished (its last event carried it).
    """

    def __init__(self, tokenizer: YueTokenizer, cfg: DecodeConfig, gate: float) -> None:
        self.cfg, self.gate = cfg, gate  # gate: the router threshold gating draft lengths (`draft_gate`)
        self.text = TextTracker(tokenizer, cfg.stop)
        self.stats = GenerationStats(accepted_per_pos=[0] * (cfg.block_size or 1))
        self.t0 = time.perf_counter()
        self.finish_reason: str | None = None

    def fold(self, em: StepEmission, i: int) -> StreamEvent:
        """The event for row i of a step (its index in `em`'s lists); the last one carries the finish
        reason and the stats."""
        self._count(em, i)
        finish = em.finished[i]
        delta = self.text.push(em.tokens[i], final=finish is not None)
        if self.text.stopped:
            finish = "stop"
        if finish is not None:
            self.finish_reason = finish
            self.stats.total_s = time.perf_counter() - self.t0
            warn_if_collapsed(self.stats, self.cfg, self.gate)
        trace = [em.step] if em.step is not None else []
        stats = self.stats if finish else None
        logprobs = None if em.logprobs is None else em.logprobs[i]
        return StreamEvent(delta, em.tokens[i], em.sources[i], finish, stats, trace, logprobs)

    def _count(self, em: StepEmission, i: int) -> None:
        """Fold row i of one step into the counters."""
        if em.mode == "cancelled":  # no forward ran
            return
        stats, cfg = self.stats, self.cfg
        stats.forwards += em.forwards
        stats.draft_passes += em.forwards - 1
        tokens, sources = em.tokens[i], em.sources[i]
        if tokens and stats.new_tokens == 0:
            stats.ttft_s = time.perf_counter() - self.t0
        stats.new_tokens += len(tokens)
        nar = sum(s in NAR_SOURCES for s in sources)
        stats.nar_tokens += nar
        stats.ar_tokens += len(sources) - nar
        for writer in em.writers[i]:
            stats.token_sources[writer] = stats.token_sources.get(writer, 0) + 1
        if cfg.mode != "ar":
            drafted, accepted = em.drafted[i], em.accepted[i]
            if drafted:
                stats.drafted += drafted
                stats.accepted += accepted
                stats.accept_lengths.append(accepted)
                for j in range(min(accepted, len(stats.accepted_per_pos))):
                    stats.accepted_per_pos[j] += 1
            stats.router_decisions["ar"] += em.routed[0]
            stats.router_decisions["nar"] += em.routed[1]


def warn_if_collapsed(stats: GenerationStats, cfg: DecodeConfig, gate: float) -> None:
    """Warn where the router, gating draft lengths at `gate` (hybrid's own dial is its tolerance, not
    this), sent every block position one way."""
    if cfg.mode not in ("hybrid", "verified"):
        return
    lo, hi = COLLAPSE_RANGE
    d = stats.router_decisions
    total = d["ar"] + d["nar"]
    if lo <= gate <= hi and total >= COLLAPSE_MIN_DECISIONS:
        for mode, other in (("ar", "nar"), ("nar", "ar")):
            if d[other] == 0:
                logger.warning(
                    "router decisions collapsed to %s for all %d block positions at router_threshold=%.2f; "
                    "the router may be miscalibrated for this input",
                    mode.upper(),
                    total,
                    gate,
                )
