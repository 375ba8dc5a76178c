"""Running the app under uvicorn, with a SIGTERM that drains instead of dropping requests.

Design decisions:
- The first SIGTERM does not stop the listener: the server marks itself draining (`/health` answers
  503, new generations get 503 + Retry-After, so a load balancer moves traffic away) and waits for
  running and queued requests to finish, at most `drain_timeout_s`. Requests still running then end
  with a 503 `draining` error (non-streamed: the JSON error; streamed: an error chunk and `[DONE]`),
  never a cut connection; then uvicorn's own graceful shutdown closes connections and the lifespan
  stops the workers. Exit status 0.
- SIGINT (Ctrl+C) and a second SIGTERM keep uvicorn's behaviour (graceful, then forced).
- A model that fails to load in the background stops the server with exit status 1.
"""

from __future__ import annotations

import logging
import signal
import threading
import time
from types import FrameType

import uvicorn

from yue.serve.app import ServerState, create_app, draining_error
from yue.serve.config import ServeConfig

log = logging.getLogger("yue.serve")


class DrainingServer(uvicorn.Server):
    """uvicorn.Server whose first SIGTERM drains in-flight requests before shutting down."""

    def __init__(self, config: uvicorn.Config, state: ServerState) -> None:
        super().__init__(config)
        self.state = state
        self.drain_deadline: float | None = None

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        if sig == signal.SIGTERM and self.drain_deadline is None:
            log.info("SIGTERM: draining (health 503, new requests refused)")
            self.state.draining = True
            self.drain_deadline = time.monotonic() + self.state.config.drain_timeout_s
            return
        super().handle_exit(sig, frame)

    async def on_tick(self, counter: int) -> bool:
        if self.drain_deadline is not None and not self.should_exit:
            scheduler = self.state.scheduler
            if scheduler is not None and not scheduler.idle and time.monotonic() > self.drain_deadline:
                ended = scheduler.abort(draining_error(self.state, "the drain time ran out"))
                log.warning("drain time ran out: %d request(s) ended with a 503", ended)
            if scheduler is None or scheduler.idle or time.monotonic() > self.drain_deadline:
                log.info("drained; shutting down")
                self.should_exit = True
        if self.state.failed and not self.should_exit:
            self.should_exit = True
        return await super().on_tick(counter)


def serve(engine, config: ServeConfig, *, chat_template: str | None = None, log_level: str = "info") -> int:
    """Serve until SIGTERM/SIGINT; returns the process exit status.

    Args:
        engine: an `Engine` or a zero-argument loader (the model then loads while `/health` says 503).
        config: host, port and limits.
        chat_template: Jinja source; None = the one stored with the model.
    """
    _log_like_uvicorn(log_level)
    app = create_app(engine, config, chat_template=chat_template)
    uv_config = uvicorn.Config(
        app, host=config.host, port=config.port, log_level=log_level, timeout_graceful_shutdown=5
    )
    server = DrainingServer(uv_config, app.state.yue)
    server.run()
    return 1 if app.state.yue.failed else 0


def _log_like_uvicorn(level: str) -> None:
    """Show the `yue` loggers (model ready, draining, engine warnings) beside uvicorn's own lines."""
    logger = logging.getLogger("yue")
    if not logger.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(logging.Formatter("%(levelname)s:     [yue] %(message)s"))
        logger.addHandler(handler)
    logger.setLevel(level.upper())


class LocalServer:
    """`create_app(engine, config)` under uvicorn on 127.0.0.1 (a free port) in a thread, for the serving
    bench and the tests. A context manager: entered, the model is loaded and `.url` is the base URL;
    `.state` is the app's ServerState.
    """

    def __init__(self, engine, config: ServeConfig, start_timeout_s: float = 60.0, **kw) -> None:
        self.app = create_app(engine, config, **kw)
        self.state = self.app.state.yue
        self.start_timeout_s = start_timeout_s
        uv = uvicorn.Config(
            self.app, host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=2
        )
        self.server = uvicorn.Server(uv)
        self.thread = threading.Thread(target=self.server.run, name="uvicorn-local", daemon=True)
        self.url = ""

    def __enter__(self) -> LocalServer:
        self.thread.start()
        deadline = time.monotonic() + self.start_timeout_s
        while not (self.server.started and self.state.status == "ok"):
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError("the local server did not start")
            time.sleep(0.02)
        port = self.server.servers[0].sockets[0].getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        return self

    def __exit__(self, *exc) -> None:
        self.server.should_exit = True
        self.thread.join(30)
