"""Runs generations off the event loop: a fixed pool of worker threads fed by a bounded waiting line.

Design decisions:
- `max_concurrency` threads each run one `Engine.stream` at a time; the event loop only moves
  chunks. Thread count never changes after start, so load cannot grow threads.
- Admission is decided on the loop thread, in `submit`: running + waiting beyond
  `max_concurrency + max_queue` is refused at once (the app answers 503 + Retry-After), so overload
  costs the server almost nothing.
- Every job carries a `threading.Event`; `Engine.stream` polls it every decode step. Cancelling a
  job that is still waiting removes it from the line at once, so its slot is free immediately.
- Chunks cross from the worker to the loop with `call_soon_threadsafe` into an `asyncio.Queue`; a
  worker whose loop has gone away cancels its own job.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import deque
from collections.abc import AsyncIterator

from yue.config import DecodeConfig
from yue.decode.types import StreamEvent

log = logging.getLogger("yue.serve")
_DONE = object()


class Overloaded(Exception):
    """Raised by `Scheduler.submit` when every running and waiting slot is taken."""


class Job:
    """One admitted request: what to generate, its cancel flag, and the chunks coming back."""

    def __init__(self, prompt: str, config: DecodeConfig, loop: asyncio.AbstractEventLoop) -> None:
        self.prompt = prompt
        self.config = config
        self.loop = loop
        self.chunks: asyncio.Queue = asyncio.Queue()
        self.cancelled = threading.Event()
        self.enqueued = time.perf_counter()
        self.started: float | None = None  # set by the worker when it picks the job up

    def deliver(self, item: object) -> None:
        """Hand a chunk (or the end, or an exception) to the loop; called from the worker thread."""
        try:
            self.loop.call_soon_threadsafe(self.chunks.put_nowait, item)
        except RuntimeError:  # the loop is closed: nobody is listening any more
            self.cancelled.set()

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
    """A pool of worker threads running `engine.stream` for admitted jobs, first come first served."""

    def __init__(self, engine, max_concurrency: int, max_queue: int) -> None:
        self.engine = engine
        self.max_concurrency = max_concurrency
        self.max_queue = max_queue
        self._cv = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: set[Job] = set()
        self._closed = False
        self._threads = [
            threading.Thread(target=self._work, name=f"yue-worker-{i}", daemon=True)
            for i in range(max_concurrency)
        ]
        for t in self._threads:
            t.start()

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

    def submit(self, prompt: str, config: DecodeConfig) -> Job:
        """Admit a job or raise `Overloaded`; call from the event loop."""
        job = Job(prompt, config, asyncio.get_running_loop())
        with self._cv:
            if (
                self._closed
                or len(self._running) + len(self._waiting) >= self.max_concurrency + self.max_queue
            ):
                raise Overloaded
            self._waiting.append(job)
            self._cv.notify()
        return job

    def cancel(self, job: Job) -> None:
        """Stop a job: dropped from the line if waiting, stopped at the next decode step if running."""
        job.cancelled.set()
        with self._cv:
            if job in self._waiting:
                self._waiting.remove(job)

    def close(self, timeout: float = 5.0) -> None:
        """Cancel everything and stop the workers (waits up to `timeout` for running jobs to notice)."""
        with self._cv:
            self._closed = True
            for job in [*self._waiting, *self._running]:
                job.cancelled.set()
            self._waiting.clear()
            self._cv.notify_all()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.0, deadline - time.monotonic()))

    def _work(self) -> None:
        while True:
            with self._cv:
                while not self._waiting and not self._closed:
                    self._cv.wait()
                if self._closed:
                    return
                job = self._waiting.popleft()
                self._running.add(job)
            try:
                self._run(job)
            finally:
                with self._cv:
                    self._running.discard(job)

    def _run(self, job: Job) -> None:
        job.started = time.perf_counter()
        try:
            for event in self.engine.stream(job.prompt, job.config, cancel=job.cancelled.is_set):
                job.deliver(event)
            job.deliver(_DONE)
        except Exception as e:  # handed to the request, which answers 400/500 or an error chunk
            job.deliver(e)
