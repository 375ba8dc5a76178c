"""Continuous batching over an Engine: requests join and leave a running batch between decode steps.

Design decisions:
- Single-threaded by contract: one thread (the server's scheduler, or a library caller's loop) calls
  `submit`, `cancel` and `step`; nothing here locks.
- Requests are rows of `decode.loop.DecodeBatch`es, one batch per `batch_key` (mode, K, drafting,
  threshold, sampling warp): rows that may share a forward do. Requests whose keys differ decode in
  different batches, which `step` takes in turn (round-robin), so each key gets every n-th step.
- At most `max_batch_size` requests run at once, over all batches; more wait in `submit` order and
  join as rows leave. `max_batch_tokens` bounds the prompt tokens prefilled in one step (in chunks,
  `loop.PREFILL_CHUNK`), so a burst of arrivals or a long prompt is prefilled over several steps
  instead of stalling the running rows for all of it.
- Text stays the engine's: each request has an `engine.RowStream` (detokenizing, stop strings,
  stats), and a request that meets a stop string is removed from its batch at once.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

from yue.config import DecodeConfig
from yue.decode.loop import DecodeBatch, StepEmission, batch_key
from yue.decode.types import StreamEvent


@dataclass
class Request:
    """One submitted generation: its tokenized prompt, settings, where its events go, and its row.

    Attributes:
        ids: prompt token ids.
        config: the resolved decode config.
        sink: called with each StreamEvent (the last has finish_reason), on the stepping thread.
        row: (batch key, row id) once the request runs; None while it waits.
        done: set after the last event was delivered.
    """

    ids: list[int]
    config: DecodeConfig
    sink: Callable[[StreamEvent], None]
    row: tuple[DecodeConfig, int] | None = None
    done: bool = False
    stream: object | None = field(default=None, repr=False)  # engine.RowStream, once running


@dataclass
class BatchStep:
    """What one `Batcher.step` did: requests that took part (0: nothing to do), tokens they got."""

    rows: int
    tokens: int


class Batcher:
    """Steps every running request of an engine together.

    Args:
        engine: a loaded `Engine` (its `decode_batch` opens the DecodeBatches).
        max_batch_size: requests running at once; 1 = one request at a time.
        max_batch_tokens: prompt tokens prefilled per step (at least one chunk); None = no bound.
    """

    def __init__(self, engine, max_batch_size: int = 16, max_batch_tokens: int | None = None) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.waiting: deque[Request] = deque()
        self.batches: dict[DecodeConfig, DecodeBatch] = {}
        self.rows: dict[tuple[DecodeConfig, int], Request] = {}
        self._turn = 0

    @property
    def running(self) -> int:
        return len(self.rows)

    def submit(
        self, prompt: str | list[int], config: DecodeConfig, sink: Callable[[StreamEvent], None]
    ) -> Request:
        """Queue a request (text, or prompt token ids); raises ValueError for a bad config or a prompt
        that does not fit the context, before anything runs."""
        ids, cfg = self.engine.request(prompt, config, {})
        if not ids:
            raise ValueError("prompt: no tokens")
        request = Request(ids, cfg, sink)
        self.waiting.append(request)
        return request

    def cancel(self, request: Request) -> None:
        """Stop a request now: it leaves its batch (or the line) and gets a last "cancelled" event."""
        if request.done:
            return
        if request in self.waiting:
            self.waiting.remove(request)
        elif request.row is not None:
            self._leave(request)
        request.done = True
        stream = request.stream or self.engine.row_stream(request.config)
        request.sink(stream.fold(_cancelled(), 0))

    def step(self) -> BatchStep:
        """Admit waiting requests, then run one step of one batch (the next in turn)."""
        self._admit()
        keys = [k for k, b in self.batches.items() if len(b)]
        if not keys:
            return BatchStep(0, 0)
        key = keys[self._turn % len(keys)]
        self._turn += 1
        batch = self.batches[key]
        report = BatchStep(len(batch), 0)
        for em in batch.step():
            report.tokens += sum(len(t) for t in em.tokens)
            self._deliver(key, em)
        if not len(batch):
            del self.batches[key]
        return report

    def _admit(self) -> None:
        while self.waiting and self.running < self.max_batch_size:
            request = self.waiting.popleft()
            key = batch_key(request.config)
            batch = self.batches.get(key)
            if batch is None:
                batch = self.batches[key] = self.engine.decode_batch(request.config, self.max_batch_tokens)
            request.row = (key, batch.add(request.ids, request.config))
            request.stream = self.engine.row_stream(request.config)
            self.rows[request.row] = request

    def _deliver(self, key: DecodeConfig, em: StepEmission) -> None:
        stopped = []  # rows finished here (a stop string): still in their batch, which dropped the others
        for i, row in enumerate(em.rows):
            request = self.rows[(key, row)]
            event = request.stream.fold(em, i)
            if event.finish_reason is not None:
                del self.rows[request.row]
                request.done = True
                if em.finished[i] is None:
                    stopped.append(row)
            request.sink(event)
        if stopped:
            self.batches[key].remove(*stopped)

    def _leave(self, request: Request) -> None:
        key, row = request.row
        self.batches[key].remove(row)
        del self.rows[request.row]

    def fail(self, error: Exception) -> list[Request]:
        """After a step raised: every running request is dropped (their batches may be inconsistent);
        returns them, for the caller to report the error to."""
        failed = list(self.rows.values())
        for request in failed:
            request.done = True
        self.rows.clear()
        self.batches.clear()
        return failed


def _cancelled() -> StepEmission:
    """The emission a cancelled row folds as its last: no tokens, no forward."""
    return StepEmission([[]], [[]], ["cancelled"], None, [0], [0], "cancelled", 0)
