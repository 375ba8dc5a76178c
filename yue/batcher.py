"""Continuous batching over an Engine: requests join and leave a running batch between decode steps.

Design decisions:
- Single-threaded by contract: one thread (the server's scheduler, or a library caller's loop) calls
  `submit`, `cancel` and `step`; nothing here locks.
- Requests are rows of `decode.loop.DecodeBatch`es, one batch per `batch_key` (mode, K, drafting,
  threshold, sampling warp): rows that may share a forward do. Requests whose keys differ decode in
  different batches, which `step` takes in turn (round-robin), so each key gets every n-th step.
- At most `max_batch_size` requests run at once, over all batches; more wait in `submit` order and
  join as rows leave. `max_batch_tokens` bounds the prompt tokens prefilled in one step (in chunks,
  `chunks.PREFILL_CHUNK`), so a burst of arrivals or a long prompt is prefilled over several steps
  instead of stalling the running rows for all of it.
- Text stays the engine's: each request has an `engine.RowStream` (detokenizing, stop strings,
  stats), and a request that meets a stop string is removed from its batch at once.
- With a prefix cache (`decode/prefix.py`), every batch resumes prefills from it and stores its chunks
  in it, and each finished request's prompt + answer (+ EOS, where it ended there: a chat template
  closes the turn with it) is queued to extend it: `step` feeds one chunk of such a fill once no
  request has run for `fill_after_s` (clients sending request after request never meet one; a
  request arriving during one waits one chunk at most), so the next turn of a conversation finds its
  earlier turns prefilled. The last `FILL_QUEUE` finished requests are kept.
- One request never fails another. A step that raises takes down only its own batch (its cache may be
  half-written); each of its requests is then retried alone, in a batch of its own. A retry of an
  exact request (greedy `ar` / `verified`, or `ar` with its seed, which `submit` fixes for every sampled
  request) re-makes the tokens already sent, checks them and sends only what follows; any other
  request continues from the tokens it had (its prompt plus them: the same distribution). A batch of
  one that raises fails its request alone, with the error, through `on_error`.
"""

from __future__ import annotations

import itertools
import logging
import random
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace

from yue.config import DecodeConfig
from yue.decode.chunks import fill_plan
from yue.decode.loop import DecodeBatch, PhaseTimes, StepEmission, batch_key
from yue.decode.prefix import PrefixCache, PrefixFill, split_exact
from yue.decode.types import StreamEvent

log = logging.getLogger("yue.batcher")

# Finished requests whose sequences wait to extend the prefix cache, at most; older ones are dropped.
FILL_QUEUE = 4
# Seconds without a running request before a prefix-cache fill may start (`Batcher.fill_wait`).
FILL_AFTER_IDLE_S = 0.5


@dataclass
class Request:
    """One submitted generation: its tokenized prompt, settings, where its events go, and its row.

    Attributes:
        ids: prompt token ids.
        config: the resolved decode config.
        sink: called with each StreamEvent (the last has finish_reason), on the stepping thread.
        on_error: called with the exception when the request fails (alone: see the module's notes);
            None = the batcher logs it and sends a last "error" event instead.
        row: (batch key, row id) once the request runs; None while it waits.
        done: set after the last event was delivered.
        sent: token ids delivered so far (what a retry re-makes and checks).
        skip: tokens a retry still has to re-make before it sends anything (0 unless retrying).
    """

    ids: list[int]
    config: DecodeConfig
    sink: Callable[[StreamEvent], None]
    on_error: Callable[[Exception], None] | None = None
    row: tuple[object, int] | None = None
    done: bool = False
    stream: object | None = field(default=None, repr=False)  # engine.RowStream, once running
    sent: list[int] = field(default_factory=list)
    skip: int = 0


@dataclass
class BatchStep:
    """What one `Batcher.step` did: requests that took part (0: nothing to do), tokens they got, and the
    time and tokens of its prefill and decode phases (`loop.PhaseTimes`)."""

    rows: int
    tokens: int
    phases: PhaseTimes = field(default_factory=PhaseTimes)


class Batcher:
    """Steps every running request of an engine together.

    Args:
        engine: a loaded `Engine` (its `decode_batch` opens the DecodeBatches).
        max_batch_size: requests running at once; 1 = one request at a time.
        max_batch_tokens: prompt tokens prefilled per step (at least one chunk); None = no bound.
        prefix_cache: earlier prompts' prefill chunks to resume from and extend; None = none.
        fill_after_s: seconds without a running request before `step` feeds a prefix-cache fill.
    """

    def __init__(
        self,
        engine,
        max_batch_size: int = 16,
        max_batch_tokens: int | None = None,
        prefix_cache: PrefixCache | None = None,
        fill_after_s: float = FILL_AFTER_IDLE_S,
    ) -> None:
        if max_batch_size < 1:
            raise ValueError(f"max_batch_size must be >= 1, got {max_batch_size}")
        self.engine = engine
        self.max_batch_size = max_batch_size
        self.max_batch_tokens = max_batch_tokens
        self.prefix_cache = prefix_cache
        self._fills: deque[list[int]] = deque(maxlen=FILL_QUEUE)  # finished sequences to fill, oldest first
        self._filling: PrefixFill | None = None
        self.fill_after_s = fill_after_s
        self._last_busy = time.perf_counter()  # when a step last ran requests
        self.waiting: deque[Request] = deque()
        # Shared batches are keyed by `batch_key`; a request retried alone has ("alone", n).
        self.batches: dict[object, DecodeBatch] = {}
        self.rows: dict[tuple[object, int], Request] = {}
        self._turn = 0
        self._alone = itertools.count()

    @property
    def running(self) -> int:
        return len(self.rows)

    @property
    def filling(self) -> bool:
        """Whether finished sequences wait to extend the prefix cache (`step` works on them when idle)."""
        return self._filling is not None or bool(self._fills)

    def fill_wait(self) -> float | None:
        """Seconds until `step` may feed a prefix-cache fill (0: now); None when none is queued."""
        if not self.filling:
            return None
        return max(0.0, self._last_busy + self.fill_after_s - time.perf_counter())

    def submit(
        self,
        prompt: str | list[int],
        config: DecodeConfig,
        sink: Callable[[StreamEvent], None],
        on_error: Callable[[Exception], None] | None = None,
    ) -> Request:
        """Queue a request (text, or prompt token ids); raises ValueError for a bad config or a prompt
        that does not fit the context, before anything runs."""
        ids, cfg = self.engine.request(prompt, config, {})
        if not ids:
            raise ValueError("prompt: no tokens")
        if not cfg.greedy and cfg.seed is None:  # fixed now, so a retry alone can re-make its samples
            cfg = replace(cfg, seed=random.getrandbits(63))
        request = Request(ids, cfg, sink, on_error)
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
        request.sink(stream.fold(_ended("cancelled"), 0))

    def step(self) -> BatchStep:
        """Admit waiting requests, then run one step of one batch (the next in turn); with no request
        running, feed one chunk of a prefix-cache fill, if one is due (`fill_wait`)."""
        self._admit()
        keys = [k for k, b in self.batches.items() if len(b)]
        if not keys:
            if self.fill_wait() == 0:
                self._fill()
            return BatchStep(0, 0)
        key = keys[self._turn % len(keys)]
        self._turn += 1
        batch = self.batches[key]
        report = BatchStep(len(batch), 0)
        try:
            emissions = batch.step()
        except Exception as error:  # noqa: BLE001 - any failure of a step is isolated, then reported
            self._isolate(key, error)
            return report
        finally:
            self._last_busy = time.perf_counter()
        report.phases = batch.phases
        for em in emissions:
            report.tokens += sum(len(t) for t in em.tokens)
            self._deliver(key, em)
        if key in self.batches and not len(batch):
            del self.batches[key]
        return report

    def _admit(self) -> None:
        while self.waiting and self.running < self.max_batch_size:
            request = self.waiting.popleft()
            key = batch_key(request.config)
            try:
                batch = self.batches.get(key)
                if batch is None:
                    batch = self.batches[key] = self.engine.decode_batch(
                        request.config, self.max_batch_tokens, self.prefix_cache
                    )
                request.stream = self.engine.row_stream(request.config)
                request.row = (key, batch.add(request.ids, request.config))
            except Exception as error:  # noqa: BLE001 - this request cannot start: it alone fails
                self._fail(request, error)
                continue
            self.rows[request.row] = request

    def _deliver(self, key: object, em: StepEmission) -> None:
        stopped = []  # rows finished here (a stop string): still in their batch, which dropped the others
        for i, row in enumerate(em.rows):
            request = self.rows.get((key, row))
            if request is None:  # failed earlier in this loop
                continue
            try:
                one = self._unsent(request, em, i)
                if one is None:
                    continue
                event = request.stream.fold(one, 0)
                request.sent.extend(event.token_ids)
                if event.finish_reason is not None:
                    del self.rows[request.row]
                    request.done = True
                    self._remember(request, event.finish_reason)
                    if em.finished[i] is None:
                        stopped.append(row)
                request.sink(event)
            except Exception as error:  # noqa: BLE001 - this row's text or sink failed: it alone fails
                self._fail(request, error)
        if stopped and key in self.batches:
            self.batches[key].remove(*stopped)

    def _unsent(self, request: Request, em: StepEmission, i: int) -> StepEmission | None:
        """Row i of `em` as a one-row emission of what `request` has not been sent yet; None when a retry
        only re-made sent tokens. A retry whose tokens part from those sent continues from them instead."""
        tokens = em.tokens[i]
        n = min(request.skip, len(tokens))
        if n:
            start = len(request.sent) - request.skip
            if tokens[:n] != request.sent[start : start + n]:
                log.warning("a retried request parted from the tokens it had sent; it continues from them")
                self._retry_alone(request, exact=False)
                return None
            request.skip -= n
            if n == len(tokens) and em.finished[i] is None:
                return None
        lp = None if em.logprobs is None else [None if em.logprobs[i] is None else em.logprobs[i][n:]]
        return replace(
            em,
            tokens=[tokens[n:]],
            sources=[em.sources[i][n:]],
            writers=[em.writers[i][n:]],
            finished=[em.finished[i]],
            drafted=[em.drafted[i]],
            accepted=[em.accepted[i]],
            rows=[em.rows[i]],
            logprobs=lp,
        )

    def _remember(self, request: Request, finish_reason: str) -> None:
        """Queue a finished request's sequence to extend the prefix cache: its prompt, its answer and the
        EOS it ended at (the start of its conversation's next turn)."""
        if self.prefix_cache is None or finish_reason not in ("eos", "length", "stop"):
            return
        eos = [self.engine.tokenizer.eos_id] if finish_reason == "eos" else []
        self._fills.append(request.ids + request.sent + eos)

    def _fill(self) -> None:
        """Feed one chunk of the oldest queued fill the prefix cache lacks (`PrefixFill`); a fill that
        fails is dropped, and logged: it costs no request anything."""
        while self._filling is not None or self._fills:
            if self._filling is None:
                tokens, model = self._fills.popleft(), self.engine.model
                plan = fill_plan(len(tokens), split_exact(model))
                self._filling = PrefixFill(model, self.prefix_cache, tokens, *plan)
            try:
                fed = self._filling.step()
            except Exception as error:  # noqa: BLE001 - a fill is an optimization: drop it, serve on
                log.warning("a prefix-cache fill raised %r; dropped", error)
                fed = 0
                self._filling = None
            if self._filling is not None and self._filling.finished:
                self._filling = None
            if fed:
                return

    def _leave(self, request: Request) -> None:
        key, row = request.row
        batch = self.batches.get(key)
        if batch is not None:
            batch.remove(row)
            if not len(batch) and isinstance(key, tuple):  # a retry's own batch
                del self.batches[key]
        del self.rows[request.row]

    def _isolate(self, key: object, error: Exception) -> None:
        """A step of batch `key` raised. Its cache may be half-written, so the batch goes; a lone row is
        the cause and fails, each row of a larger batch is retried alone."""
        members = [r for r in self.rows.values() if r.row[0] == key]
        del self.batches[key]
        for request in members:
            del self.rows[request.row]
            request.row = None
        if len(members) == 1:
            self._fail(members[0], error)
            return
        log.warning("a decode step of %d requests raised %r; retrying each alone", len(members), error)
        for request in members:
            cfg = request.config
            self._retry_alone(request, exact=cfg.mode == "ar" or (cfg.greedy and cfg.mode == "verified"))

    def _retry_alone(self, request: Request, exact: bool) -> None:
        """Run `request` again in a batch of its own: from its prompt, re-making (and checking) the tokens
        it has sent (`exact`), or from its prompt plus them."""
        if request.row is not None:
            self._leave(request)
        ids, cfg, skip = request.ids, request.config, len(request.sent)
        if not exact:
            left = cfg.max_new_tokens - len(request.sent)
            ids, cfg, skip = ids + request.sent, replace(cfg, max_new_tokens=max(left, 1)), 0
        key = ("alone", next(self._alone))
        batch = self.batches[key] = self.engine.decode_batch(cfg, self.max_batch_tokens, self.prefix_cache)
        request.row, request.skip = (key, batch.add(ids, cfg)), skip
        self.rows[request.row] = request

    def _fail(self, request: Request, error: Exception) -> None:
        """This request, and no other, ends with `error`."""
        if request.row is not None and request.row in self.rows:
            self._leave(request)
        request.done = True
        if request.on_error is not None:
            request.on_error(error)
            return
        log.error("a request failed: %r", error)
        stream = request.stream or self.engine.row_stream(request.config)
        request.sink(stream.fold(_ended("error"), 0))


def _ended(reason: str) -> StepEmission:
    """The emission a cancelled (or failed) row folds as its last: no tokens, no forward."""
    return StepEmission([[]], [[]], [[]], [reason], None, [0], [0], "cancelled", 0)
