"""Runs generations off the event loop: one scheduler thread stepping every running request together.

Design decisions:
- Continuous batching (`yue.batcher.Batcher`): one thread owns the engine and, each step, admits
  waiting jobs (up to `max_batch_size` running), removes cancelled ones, and runs one decode step of
  a running batch. New requests join between steps; finished and cancelled ones leave within one
  step. `max_batch_size` 1 runs one request at a time.
- Admission is decided on the loop thread, in `submit_all` (a request's generations all or none): running + waiting beyond
  `max_batch_size + max_queue` is refused at once (the app answers 503 + Retry-After), so overload
  costs the server almost nothing.
- Every job carries a `threading.Event`; the scheduler thread checks it before every step. Cancelling
  a job that is still waiting removes it from the line at once, so its slot is free immediately.
- Chunks cross from the scheduler thread to the loop with `call_soon_threadsafe` into an
  `asyncio.Queue`; a job whose loop has gone away is cancelled.
- Other work on the model (scoring a prompt: `call`) runs on the same thread, between steps: the
  engine is never used by two threads at once.
- With a prefix cache, an idle thread wakes for the batcher's fills (`Batcher.fill_wait`: finished
  answers prefilled into the cache a chunk a step, once no request has run for a moment), then sleeps.
- A step that raises fails no one but its cause: the batcher retries the batch's rows alone and hands
  the exception to the one request that still fails (`Job.deliver`). Only if the batcher's own step
  raises (a bug) are all running jobs failed, and still not the server.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Future

from yue.batcher import Batcher, Request
from yue.config import DecodeConfig
from yue.decode.prefix import PrefixCache
from yue.decode.types import StreamEvent

log = logging.getLogger("yue.serve")
_DONE = object()


class Overloaded(Exception):
    """Raised by `Scheduler.submit_all` when every running and waiting slot is taken."""


class Job:
    """One admitted request: what to generate, its cancel flag, and the chunks coming back."""

    def __init__(
        self, prompt: str | list[int], config: DecodeConfig, loop: asyncio.AbstractEventLoop
    ) -> None:
        self.prompt = prompt
        self.config = config
        self.loop = loop
        self.chunks: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.enqueued = time.perf_counter()
        self.started: float | None = None  # set by the scheduler when the job joins a batch
        self.request: Request | None = None  # its row in the batcher, once admitted there

    def deliver(self, item: object) -> None:
        """Hand a chunk (or the end, or an exception) to the loop; called from the scheduler thread."""
        try:
            self.loop.call_soon_threadsafe(self.chunks.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

    def on_event(self, event: StreamEvent) -> None:
        """The batcher's sink: each event, then the end after the last one."""
        self.deliver(event)
        if event.finish_reason is not None:
            self.deliver(_DONE)

    async def events(self) -> AsyncIterator[StreamEvent]:
        """The engine's chunks, in order; re-raises what the engine raised."""
        while True:
            item = await self.chunks.get()
            if item is _DONE:
                return
            if isinstance(item, BaseException):
                raise item
            yield item


class Scheduler:
    """One thread stepping every admitted job together, first come first served.

    Args:
        engine: the loaded Engine.
        max_batch_size: jobs generating at once (rows of the running batches).
        max_queue: admitted jobs waiting beyond those.
        max_batch_tokens: prompt tokens prefilled per step (None = no bound).
        on_step: called after each step that ran with its `BatchStep` and its seconds (metrics).
        prefix_cache: the batcher's prefix cache (`decode/prefix.py`), or None.
    """

    def __init__(
        self,
        engine,
        max_batch_size: int,
        max_queue: int,
        max_batch_tokens: int | None = None,
        on_step=None,
        prefix_cache: PrefixCache | None = None,
    ) -> None:
        self.batcher = Batcher(engine, max_batch_size, max_batch_tokens, prefix_cache)
        self.max_batch_size = max_batch_size
        self.max_queue = max_queue
        self.on_step = on_step
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: set[Job] = set()
        self._calls: deque[tuple[Callable[[], object], Future]] = deque()
        self._closed = False
        self._thread = threading.Thread(target=self._work, name="yue-scheduler", daemon=True)
        self._thread.start()

    @property
    def running(self) -> int:
        return len(self._running)

    @property
    def waiting(self) -> int:
        return len(self._waiting)

    @property
    def idle(self) -> bool:
        with self._cv:
            return not self._running and not self._waiting

    def submit_all(self, items: list[tuple[str | list[int], DecodeConfig]]) -> list[Job]:
        """Admit every job of a request (its choices), or none: raise `Overloaded`."""
        loop = asyncio.get_running_loop()
        jobs = [Job(prompt, config, loop) for prompt, config in items]
        with self._cv:
            taken = len(self._running) + len(self._waiting)
            if self._closed or taken + len(jobs) > self.max_batch_size + self.max_queue:
                raise Overloaded
            self._waiting.extend(jobs)
            self._cv.notify()
        return jobs

    def call(self, fn: Callable[[], object]) -> Future:
        """Run `fn` on the scheduler thread before its next step (work on the engine outside the
        batches, e.g. `Engine.score`); its result or exception comes back in the Future."""
        future: Future = Future()
        with self._cv:
            if self._closed:
                raise Overloaded
            self._calls.append((fn, future))
            self._cv.notify()
        return future

    def cancel(self, job: Job) -> None:
        """Stop a job: dropped from the line if waiting, out of its batch before the next step if running."""
        job.cancelled.set()
        with self._cv:
            if job in self._waiting:
                self._waiting.remove(job)
            self._cv.notify()

    def abort(self, error: Exception) -> int:
        """End every running and waiting job now with `error` (the drain ran out); returns how many.
        Each reader gets the error after the chunks already on their way; the scheduler thread then
        takes the rows out of their batches at its next step."""
        with self._cv:
            jobs = [*self._waiting, *self._running]
            self._waiting.clear()
            for job in jobs:
                job.deliver(error)
                job.cancelled.set()
            self._cv.notify()
        return len(jobs)

    def close(self, timeout: float = 5.0) -> None:
        """Cancel everything and stop the scheduler thread (waits up to `timeout` for its step to end)."""
        with self._cv:
            self._closed = True
            for job in [*self._waiting, *self._running]:
                job.cancelled.set()
            self._waiting.clear()
            for _, future in self._calls:
                future.cancel()
            self._calls.clear()
            self._cv.notify_all()
        self._thread.join(timeout)

    def _work(self) -> None:
        while True:
            with self._cv:
                while not (self._waiting or self._running or self._calls or self._closed):
                    wait = self.batcher.fill_wait()  # None: no fill queued, sleep until notified
                    if wait == 0:
                        break
                    self._cv.wait(wait)
                if self._closed:
                    break
                admitted, calls = self._take(), list(self._calls)
                self._calls.clear()
            for fn, future in calls:
                if future.set_running_or_notify_cancel():
                    try:
                        future.set_result(fn())
                    except Exception as e:  # noqa: BLE001 - handed to the caller
                        future.set_exception(e)
            for job in admitted:
                self._start(job)
            self._reap()
            try:
                t0 = time.perf_counter()
                report = self.batcher.step()
                if self.on_step is not None and report.rows:
                    self.on_step(report, time.perf_counter() - t0)
            except Exception as e:  # handed to each running request, which answers 500 or an error chunk
                log.exception("the batcher's step failed")
                failed = {id(r) for r in self.batcher.fail_all()}
                for job in list(self._running):
                    if id(job.request) in failed:
                        job.deliver(e)
            self._reap()
        self._reap()  # closed: `close` flagged every running job, which ends "cancelled": no reader waits

    def _take(self) -> list[Job]:
        """Waiting jobs that fit in the running set now (under the lock)."""
        taken = []
        while self._waiting and len(self._running) < self.max_batch_size:
            job = self._waiting.popleft()
            self._running.add(job)
            taken.append(job)
        return taken

    def _start(self, job: Job) -> None:
        job.started = time.perf_counter()
        try:
            job.request = self.batcher.submit(job.prompt, job.config, job.on_event, job.deliver)
        except Exception as e:  # the engine refused it (ValueError: 400)
            job.deliver(e)
            job.request = None
            with self._cv:
                self._running.discard(job)

    def _reap(self) -> None:
        """Cancel the running jobs whose flag is set; forget the finished ones."""
        for job in list(self._running):
            request = job.request
            if job.cancelled.is_set() and request is not None:
                self.batcher.cancel(request)  # a no-op for a request already done
            if request is None or request.done:
                with self._cv:
                    self._running.discard(job)
