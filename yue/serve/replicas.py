"""`yue serve --replicas N`: the same server as N replicas of one Ray Serve application.

Design decisions:
- Ray Serve runs the replicas, routes requests, restarts dead replicas and autoscales; yue writes no
  cluster manager. Each replica is the single-process server as it stands: its FastAPI app
  (`create_app`, so the routes, streaming, errors, limits and metrics are the same code) under
  Ray Serve's ASGI ingress, with one model copy and one continuous-batching scheduler.
- A replica loads its model in its constructor (`load`, a picklable zero-argument callable), so Ray
  counts it ready only once it can answer; the app is built afterwards (`__serve_build_asgi_app__`).
- Each replica asks Ray for `threads` CPUs and runs `threads` torch threads: by default this machine's
  cores divided among the (most) replicas, so replicas do not fight over cores.
- A replica is sent at most `max_batch_size` requests at once (`max_ongoing_requests`): what it can
  batch now. Ray's proxy queues the rest (up to `max_queue`, then a 503 "overloaded" with Retry-After,
  in OpenAI's shape: `proxy.py`) and sends each to the first replica with room. With the replica's own
  queue as the bound instead, part of a burst could wait in one replica's queue while another had room
  (docs/results-log.md, "Session 7").
  Autoscaling (`MIN:MAX`) aims at `max_batch_size` ongoing requests per replica: a full batch.
- A replica that dies mid-request is replaced by Ray; its requests end with OpenAI's error (a stream
  with an error event then `[DONE]`, a response not started with a 503), written by a middleware in
  Ray's proxy (`proxy.py`), since the replica that would have written them is gone.
- Ray is imported here only; the single-process server never imports this module (`pip install
  'yue[ray]'` brings Ray).
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from collections.abc import Callable
from dataclasses import dataclass

import ray
import torch
from ray import serve
from ray.serve.config import BackpressureConfig

from yue.serve.app import create_app
from yue.serve.config import ServeConfig
from yue.serve.proxy import PROXY_CALLBACK, PROXY_CALLBACK_ENV

log = logging.getLogger("yue.serve")
APP_NAME = "yue"


@dataclass(frozen=True)
class ReplicaConfig:
    """How many replicas run and what each gets. Validated once; bad values raise `ValueError`.

    Attributes:
        replicas: replicas when not autoscaling.
        autoscale: (min, max) replicas, scaled on ongoing requests per replica; None = fixed `replicas`.
        threads: torch threads (and Ray CPUs) per replica; None = this machine's cores divided among
            the replicas (the most replicas when autoscaling), at least 1.
        address: an existing Ray cluster to join ("auto" or "ray://host:10001"); None = start a local one.
    """

    replicas: int = 1
    autoscale: tuple[int, int] | None = None
    threads: int | None = None
    address: str | None = None

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ValueError(f"replicas must be >= 1, got {self.replicas}")
        if self.autoscale is not None:
            low, high = self.autoscale
            if not 0 <= low <= high or high < 1:
                raise ValueError(
                    f"autoscale must be MIN:MAX with 0 <= MIN <= MAX, MAX >= 1, got {low}:{high}"
                )
        if self.threads is not None and self.threads < 1:
            raise ValueError(f"threads must be >= 1, got {self.threads}")

    @property
    def threads_per_replica(self) -> int:
        most = self.autoscale[1] if self.autoscale else self.replicas
        return self.threads or max(1, (os.cpu_count() or 1) // most)


def parse_autoscale(text: str) -> tuple[int, int]:
    """'MIN:MAX' -> (min, max); anything else raises `ValueError` naming the option."""
    try:
        low, high = (int(part) for part in text.split(":"))
    except ValueError:
        raise ValueError(f"autoscale must be MIN:MAX (two integers), got {text!r}") from None
    return low, high


@serve.deployment
@serve.ingress()
class Replica:
    """One replica: a model copy, `threads` torch threads, and the single-process server's app."""

    def __init__(
        self, load: Callable, config: ServeConfig, threads: int, chat_template: str | None = None
    ) -> None:
        torch.set_num_threads(threads)
        self.engine = load()
        self.config = config
        self.chat_template = chat_template
        self.state = None

    def __serve_build_asgi_app__(self):
        app = create_app(self.engine, self.config, chat_template=self.chat_template)
        app.add_middleware(ReplicaHeader, replica=serve.get_replica_context().replica_id.unique_id)
        self.state = app.state.yue
        return app

    def check_health(self) -> None:
        """Ray's health probe: a replica whose server failed is replaced."""
        if self.state is not None and self.state.failed:
            raise RuntimeError(self.state.failed)


class ReplicaHeader:
    """ASGI middleware: every response names the replica that made it (`x-yue-replica`), so a client
    or an operator can tell which replica answered (each has its own /metrics and /health)."""

    def __init__(self, app, replica: str) -> None:
        self.app, self.header = app, (b"x-yue-replica", replica.encode())

    async def __call__(self, scope, receive, send) -> None:
        async def send_named(message) -> None:
            if message["type"] == "http.response.start":
                message = {**message, "headers": [*message.get("headers", []), self.header]}
            await send(message)

        await self.app(scope, receive, send_named)


def deployment_options(config: ServeConfig, replicas: ReplicaConfig) -> dict:
    """The Ray Serve deployment options for these settings (see the module docstring)."""
    options = {
        "max_ongoing_requests": config.max_batch_size,
        "max_queued_requests": config.max_queue,
        "backpressure_config": BackpressureConfig(status_code=503, retry_after_s=config.retry_after_s),
        "ray_actor_options": {"num_cpus": replicas.threads_per_replica},
        "graceful_shutdown_timeout_s": config.drain_timeout_s,
    }
    if replicas.autoscale:
        low, high = replicas.autoscale
        options["autoscaling_config"] = {
            "min_replicas": low,
            "max_replicas": high,
            "target_ongoing_requests": config.max_batch_size,
        }
    else:
        options["num_replicas"] = replicas.replicas
    return options


def start(
    load: Callable, config: ServeConfig, replicas: ReplicaConfig, chat_template: str | None = None
) -> str:
    """Start (or join) Ray, deploy the replicas and wait until they are ready; returns the base URL.

    Args:
        load: a picklable zero-argument callable returning an `Engine` (run once in each replica).
        config: the server's settings (host and port are the Ray Serve proxy's).
        replicas: how many replicas and what each gets.
        chat_template: Jinja source overriding the model's.
    """
    if not ray.is_initialized():
        # Ray Serve's proxies, started below, wrap themselves in `proxy.middlewares` (a user's own
        # callback, set in the environment, is kept).
        env = {PROXY_CALLBACK_ENV: os.environ.get(PROXY_CALLBACK_ENV, PROXY_CALLBACK)}
        ray.init(
            address=replicas.address,
            include_dashboard=False,
            logging_level=logging.WARNING,
            runtime_env={"env_vars": env},
        )
    serve.start(http_options={"host": config.host, "port": config.port})
    app = Replica.options(**deployment_options(config, replicas)).bind(
        load, config, replicas.threads_per_replica, chat_template
    )
    serve.run(app, name=APP_NAME, route_prefix="/")
    return f"http://{config.host}:{config.port}"


def stop() -> None:
    """Delete the application and stop Ray Serve (and the local Ray, if this process started it)."""
    serve.shutdown()
    ray.shutdown()


def serve_replicas(
    load: Callable, config: ServeConfig, replicas: ReplicaConfig, chat_template: str | None = None
) -> int:
    """Serve on Ray Serve until SIGTERM/SIGINT; returns the exit status. Ray drains each replica (at
    most `drain_timeout_s`) as the application is deleted."""
    url = start(load, config, replicas, chat_template)
    log.info(
        "%s replica(s) of %d thread(s) ready at %s",
        f"{replicas.autoscale[0]}-{replicas.autoscale[1]}" if replicas.autoscale else replicas.replicas,
        replicas.threads_per_replica,
        url,
    )
    done = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    log.info("stopping the replicas")
    stop()
    return 0
