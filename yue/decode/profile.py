"""Where a decode step's wall time goes, phase by phase (`yue profile`): opt-in, and free when off.

Design decisions:
- One module-level slot, `ACTIVE`: None unless a `profiling()` block is running. The loop reads it once
  a step and each timed phase tests it (`if prof:`), so a step that is not profiled pays a global read
  and a few None tests, no clock call.
- A step is a sequence of phases timed back to back with `time.perf_counter` (`mark`: the time since the
  previous mark goes to the named phase), so the phases of a step add up to its wall time. A phase
  timed inside another (a draft source's lookup inside acceptance) is `inner`: it is booked under its
  own name and taken out of the enclosing phase, never counted twice.
- A group's first step feeds its prompt's last chunk (the prefill): its phases are booked under
  "prefill ..." names, apart from the decode steps that `yue profile` reports as fractions of an `ar`
  step.
- Phase names: "propose" (the step's inputs, mask and positions), "forward:N" (the model's forward over
  N fed positions), "accept" (verification and the policy's choices), "draft:<source>" (each draft
  source: "draft:copy" and "draft:corpus" lookups, "draft:contexts" keeping the rows' contexts indexed,
  "draft:nar" the drafting pass's forward, "draft:nar choose" drafting from its logits), "cache" (the
  commit), "bookkeeping" (what the step emits: truncation, penalties' counts, the trace).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

PREFILL = "prefill "  # the prefix of a prefill step's phases

ACTIVE: StepProfile | None = None  # the profile being taken, or None (profiling off)


@dataclass
class StepProfile:
    """Seconds spent per phase, summed over the steps profiled, and how often each phase ran.

    Attributes:
        seconds / calls: phase name -> total seconds / times it was booked.
        steps / prefill_steps: decode steps and prefill (first) steps profiled.
    """

    seconds: Counter = field(default_factory=Counter)
    calls: Counter = field(default_factory=Counter)
    steps: int = 0
    prefill_steps: int = 0
    _prefix: str = ""
    _last: float = 0.0
    _inner: float = 0.0

    def start(self, prefill: bool) -> None:
        """A step begins now; `prefill`: it is a group's first step (booked under PREFILL names)."""
        self._prefix = PREFILL if prefill else ""
        self.prefill_steps += prefill
        self.steps += not prefill
        self._inner, self._last = 0.0, time.perf_counter()

    def mark(self, phase: str) -> None:
        """Book the time since the previous mark (less the inner phases timed in it) to `phase`."""
        now = time.perf_counter()
        self._book(phase, now - self._last - self._inner)
        self._inner, self._last = 0.0, now

    def inner(self, phase: str, seconds: float) -> None:
        """Book `seconds` spent inside the phase now running to `phase` (and out of the enclosing one)."""
        self._book(phase, seconds)
        self._inner += seconds

    def _book(self, phase: str, seconds: float) -> None:
        self.seconds[self._prefix + phase] += seconds
        self.calls[self._prefix + phase] += 1

    def decode_phases(self) -> dict[str, float]:
        """Seconds per phase over the decode steps (prefill steps left out)."""
        return {k: v for k, v in self.seconds.items() if not k.startswith(PREFILL)}


@contextmanager
def profiling() -> Iterator[StepProfile]:
    """Profile every decode step run inside the block (this process, any thread: a CLI's tool)."""
    global ACTIVE
    if ACTIVE is not None:
        raise RuntimeError("a profile is already being taken")
    ACTIVE = StepProfile()
    try:
        yield ACTIVE
    finally:
        ACTIVE = None
