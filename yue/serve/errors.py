"""One error shape everywhere: OpenAI's `{"error": {message, type, param, code}}`.

Design decisions:
- Everything a client can get wrong raises `ApiError`, rendered by one handler; FastAPI's 422 becomes a
  400 naming the offending field (`messages[0].role`), in the responses and in the OpenAPI document.
- A 500 says "internal server error" and nothing else; the traceback goes to the log. It is rendered by
  a pure ASGI middleware (`InternalErrors`) that does not re-raise: Starlette's own last-resort handler
  re-raises after answering, and uvicorn then drops the keep-alive connection, so the client's next
  request on it failed.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.utils import get_openapi
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from yue.serve.api_error import ApiError

log = logging.getLogger("yue.serve")


def error_response(error: ApiError) -> JSONResponse:
    return JSONResponse(error.body(), status_code=error.status, headers=error.headers)


def install_error_handlers(app: FastAPI, book: Callable[[str, str], None]) -> None:
    """Render every error in the one shape; `book(path, reason)` counts the failure."""

    @app.exception_handler(ApiError)
    async def api_error(request: Request, exc: ApiError) -> JSONResponse:
        if not exc.counted:
            book(request.url.path, exc.code or "invalid_request")
        return error_response(exc)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError) -> JSONResponse:
        book(request.url.path, "invalid_request")
        return error_response(validation_to_api_error(exc, request.headers.get("content-type")))

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        # FastAPI's own 400 is a body it could not parse (bytes that are not UTF-8, JSON nested too deep).
        code = {400: "invalid_json", 404: "not_found", 405: "method_not_allowed"}.get(exc.status_code)
        error = ApiError(exc.status_code, str(exc.detail), code=code, headers=dict(exc.headers or {}))
        return error_response(error)

    app.add_middleware(InternalErrors, book=book)


def internal_error() -> ApiError:
    return ApiError(500, "internal server error", type="server_error", code="internal_error")


class InternalErrors:
    """Pure ASGI middleware: an unhandled exception becomes OpenAI's 500 (no traceback), and the
    connection stays usable. A response already started (a stream) cannot change its status: its own
    code ends it with an error chunk."""

    def __init__(self, app, book: Callable[[str, str], None]) -> None:
        self.app, self.book = app, book

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def watch(message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, watch)
        except Exception as exc:  # noqa: BLE001 - the last resort: logged with its traceback
            log.error("unhandled error on %s", scope["path"], exc_info=exc)
            self.book(scope["path"], "internal")
            if not started:
                await error_response(internal_error())(scope, receive, send)


_NESTED = {"role", "content", "type", "text", "include_usage"}


def validation_to_api_error(exc: RequestValidationError, content_type: str | None = None) -> ApiError:
    """FastAPI's 422 -> our 400, naming the first offending field as `messages[0].role`. content_type:
    the request's header (a body sent as a form, curl -d's default, is not read as JSON)."""
    first = exc.errors()[0]
    loc = [p for p in first.get("loc", ()) if p != "body"]
    if first.get("type") == "json_invalid":
        return ApiError(400, f"malformed JSON: {first.get('msg', '')}", code="invalid_json")
    if not loc or not isinstance(loc[0], str):
        if content_type and content_type.split(";")[0].strip().lower() != "application/json":
            return ApiError(
                400,
                f"the body was sent as {content_type.split(';')[0]}; send JSON with the header "
                "'Content-Type: application/json'",
                code="invalid_request",
            )
        return ApiError(400, "the request body must be a JSON object", code="invalid_request")
    param = loc[0]
    for part in loc[1:]:
        if isinstance(part, int):
            param += f"[{part}]"
        elif part in _NESTED:
            param += f".{part}"
        else:
            break
    return ApiError(400, f"{param}: {first.get('msg', 'invalid value')}", param=param, code="invalid_value")


def openapi_without_422(app: FastAPI) -> None:
    """Our validation errors are 400s in OpenAI's shape; say so in the OpenAPI document too."""

    def openapi() -> dict:
        if app.openapi_schema is None:
            schema = get_openapi(title=app.title, version=app.version, routes=app.routes)
            for item in schema.get("paths", {}).values():
                for operation in item.values():
                    operation.get("responses", {}).pop("422", None)
            for name in ("HTTPValidationError", "ValidationError"):
                schema.get("components", {}).get("schemas", {}).pop(name, None)
            app.openapi_schema = schema
        return app.openapi_schema

    app.openapi = openapi
