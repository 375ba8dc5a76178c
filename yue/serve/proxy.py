"""What the Ray Serve proxy wraps itself in (`yue serve --replicas`): a request whose replica dies ends
with OpenAI's error, as the single-process server ends its own failures, and so does one the proxy turns
away itself (its queue full).

Design decisions:
- Ray Serve's proxy relays a replica's ASGI messages. When the replica dies mid-request, the proxy stops
  relaying and sends nothing more: a stream was cut off without an error (the client saw a connection
  that ended mid-body) and a response not yet started became uvicorn's plain-text 500. Only the proxy
  outlives the replica, so the fix sits there: `ReplicaLost`, an ASGI middleware around the proxy,
  finishes what the replica left unfinished.
- It reaches the proxy through Ray Serve's hook for proxy middlewares, the environment variable
  `PROXY_CALLBACK_ENV` naming `middlewares` (read as each proxy starts; `replicas.start` sets it for the
  Ray it starts or joins). A cluster whose Serve proxies already run keeps its own.
- Past its queue (`max_queued_requests`, `replicas.deployment_options`) the proxy answers a 503 of its
  own in plain text; the middleware sends the single-process server's "overloaded" error instead, with
  the proxy's Retry-After.
- The proxy imports this module (and with it the package, torch included) once, as it starts; the
  middleware itself is a few checks per message.
"""

from __future__ import annotations

import json
import logging

from starlette.middleware import Middleware

from yue.serve.api_error import ApiError, overloaded
from yue.serve.streaming import DONE, sse

log = logging.getLogger("yue.serve")
PROXY_CALLBACK_ENV = "RAY_SERVE_HTTP_PROXY_CALLBACK_IMPORT_PATH"
PROXY_CALLBACK = "yue.serve.proxy:middlewares"


def replica_lost() -> ApiError:
    """The error of a request whose replica stopped before it finished: a 503 (another replica takes the
    request when it is sent again; Ray Serve replaces the dead one)."""
    return ApiError(
        503,
        "the replica serving this request stopped before it finished; send the request again",
        type="server_error",
        code="replica_lost",
        headers={"Retry-After": "1"},
    )


class ReplicaLost:
    """ASGI middleware around the Ray Serve proxy: a response the proxy leaves unfinished (its replica
    died) ends in OpenAI's shape. A stream gets an error event then `[DONE]` (`streaming.sse_events`
    ends its own failures so); a response not started gets the 503 error body (`replica_lost`); any
    other started response is closed (its status is sent already). A client that went away hears nothing.
    The proxy's own 503 past its queue becomes the single-process server's "overloaded" (`overloaded`)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started, finished, streaming, gone, replaced = False, False, False, False, False

        async def listen():
            nonlocal gone
            message = await receive()
            gone = gone or message["type"] == "http.disconnect"
            return message

        async def send_error(error: ApiError) -> None:
            headers = [(b"content-type", b"application/json")]
            headers += [(k.lower().encode(), v.encode()) for k, v in error.headers.items()]
            await send({"type": "http.response.start", "status": error.status, "headers": headers})
            await send({"type": "http.response.body", "body": json.dumps(error.body()).encode()})

        async def watch(message) -> None:
            nonlocal started, finished, streaming, replaced
            if replaced:  # the proxy's own body after its start, answered already
                return
            if message["type"] == "http.response.start":
                started = True
                headers = dict(message.get("headers", []))
                kind = headers.get(b"content-type", b"")
                streaming = kind.startswith(b"text/event-stream")
                # The proxy's own 503 past its queue: plain text with the Retry-After it was configured with
                # (a deployment with no replica up answers a plain 503 without one: left as it is).
                if (
                    message["status"] == 503
                    and b"retry-after" in headers
                    and not kind.startswith(b"application/json")
                ):
                    replaced = finished = True
                    return await send_error(overloaded({"Retry-After": headers[b"retry-after"].decode()}))
            elif message["type"] == "http.response.body" and not message.get("more_body", False):
                finished = True
            await send(message)

        try:
            await self.app(scope, listen, watch)
        except Exception:  # noqa: BLE001 - the proxy's own failure: the client still hears of it
            log.exception("the proxy failed on %s", scope.get("path"))
        if finished or gone:
            return
        error = replica_lost()
        log.warning("a replica stopped mid-request on %s: answering %s", scope.get("path"), error.code)
        if not started:
            await send_error(error)
        else:
            body = sse(error.body()) + DONE if streaming else b""
            await send({"type": "http.response.body", "body": body})


def middlewares() -> list[Middleware]:
    """Ray Serve's proxy callback (`PROXY_CALLBACK_ENV`): the middlewares the proxy wraps itself in."""
    return [Middleware(ReplicaLost)]
