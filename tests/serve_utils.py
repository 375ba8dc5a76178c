"""Helpers for the server tests: a real uvicorn on 127.0.0.1, engine wrappers, an SSE parser."""

from __future__ import annotations

import json
import time

from yue.serve import ServeConfig
from yue.serve.server import LocalServer


class LiveServer(LocalServer):
    """`LocalServer` with the default ServeConfig unless given; `.url`, `.state` as there."""

    def __init__(self, engine, config: ServeConfig | None = None, **kw) -> None:
        super().__init__(engine, config or ServeConfig(), start_timeout_s=30.0, **kw)


class Paced:
    """Wraps an engine so each decode step takes at least `delay` seconds (cancel still checked)."""

    def __init__(self, engine, delay: float) -> None:
        self._engine, self.delay = engine, delay

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def decode_batch(self, *args, **kw):
        return _StepHook(self._engine.decode_batch(*args, **kw), lambda: time.sleep(self.delay))


class FailsMidStream:
    """Wraps an engine so a decode step raises after `after` steps."""

    def __init__(self, engine, after: int = 2) -> None:
        self._engine, self.after = engine, after

    def __getattr__(self, name):
        return getattr(self._engine, name)

    def decode_batch(self, *args, **kw):
        steps = iter(range(1 << 30))

        def maybe_fail():
            if next(steps) == self.after:
                raise RuntimeError("secret internal detail")

        return _StepHook(self._engine.decode_batch(*args, **kw), maybe_fail)


class _StepHook:
    """A DecodeBatch whose `step` calls `hook` after each real step."""

    def __init__(self, batch, hook) -> None:
        self._batch, self._hook = batch, hook

    def __getattr__(self, name):
        return getattr(self._batch, name)

    def __len__(self) -> int:
        return len(self._batch)

    def step(self):
        emissions = self._batch.step()
        self._hook()
        return emissions


def parse_sse(text: str) -> list[dict | str]:
    """The `data:` payloads of an event stream: dicts, and the string "[DONE]"."""
    out = []
    for block in text.split("\n\n"):
        if block.startswith("data: "):
            data = block[len("data: ") :]
            out.append(data if data == "[DONE]" else json.loads(data))
        else:
            assert block == "", f"unexpected SSE block {block!r}"
    return out
