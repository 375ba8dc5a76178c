"""The ASGI middleware that turns requests away before anything parses them: API key, body size.

Design decisions:
- A pure ASGI middleware (not Starlette's BaseHTTPMiddleware, which would break streaming and
  disconnect detection). The key is compared in constant time (`hmac.compare_digest`).
- The body is read here, counting bytes as they arrive, so a chunked body (no Content-Length) or one
  that lies about its length cannot exceed the limit; the app then gets the buffered body replayed,
  and after it the real `receive`, so disconnects still reach the app.
"""

from __future__ import annotations

import hmac
import time
from collections.abc import Callable

from yue.serve.config import ServeConfig
from yue.serve.errors import ApiError, error_response

# What the API key guards: the API, and its schema and docs (which describe it).
PROTECTED = ("/v1/", "/generate", "/eval", "/infill", "/openapi.json", "/docs")


class Gate:
    """Pure ASGI middleware: API key (401), then body size (413), before the body is parsed."""

    def __init__(self, app, config: ServeConfig, book: Callable[[str, str], None]) -> None:
        self.app, self.config, self.book = app, config, book

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        scope["yue.arrival"] = time.perf_counter()  # latencies count from here
        config, path = self.config, scope["path"]
        if config.api_key and path.startswith(PROTECTED) and not self._authorized(scope, config.api_key):
            error = ApiError(
                401,
                "missing or invalid API key",
                type="authentication_error",
                code="invalid_api_key",
                headers={"WWW-Authenticate": "Bearer"},
            )
            return await self._reject(scope, send, error)
        if scope["method"] not in ("POST", "PUT", "PATCH"):
            return await self.app(scope, receive, send)
        # Count bytes as they arrive: Content-Length may be absent (chunked) or lie.
        limit, chunks, size, more = config.max_body_bytes, [], 0, True
        too_large = ApiError(413, f"request body exceeds {limit} bytes", code="request_too_large")
        declared = dict(scope["headers"]).get(b"content-length", b"")
        if declared.isdigit() and int(declared) > limit:
            return await self._reject(scope, send, too_large)
        while more:
            message = await receive()
            if message["type"] == "http.disconnect":
                return
            chunks.append(message.get("body", b""))
            size += len(chunks[-1])
            if size > limit:
                return await self._reject(scope, send, too_large)
            more = message.get("more_body", False)
        body, replayed = b"".join(chunks), False

        async def replay():
            nonlocal replayed
            if replayed:
                return await receive()  # after the body: disconnect notices
            replayed = True
            return {"type": "http.request", "body": body, "more_body": False}

        await self.app(scope, replay, send)

    @staticmethod
    def _authorized(scope, key: str) -> bool:
        header = dict(scope["headers"]).get(b"authorization", b"")
        scheme, _, token = header.partition(b" ")
        return scheme.lower() == b"bearer" and hmac.compare_digest(token.strip(), key.encode())

    async def _reject(self, scope, send, error: ApiError) -> None:
        self.book(scope["path"], error.code)
        await error_response(error)(scope, _no_receive, send)


async def _no_receive():
    return {"type": "http.disconnect"}
