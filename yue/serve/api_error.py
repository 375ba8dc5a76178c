"""The one exception a client-caused error raises (`errors.py` renders it), apart from the web stack so that
the settings (`config.py`) and the CLI's options import no web framework."""

from __future__ import annotations


class ApiError(Exception):
    """An error the client caused (or must hear about), rendered as OpenAI's error object.

    Attributes:
        status: HTTP status code.
        message: human-readable text; never a traceback.
        type: OpenAI error type ("invalid_request_error", "authentication_error", ...).
        param: the request field at fault, if any.
        code: machine-readable code ("context_length_exceeded", ...).
        headers: extra response headers (e.g. Retry-After).
        counted: the failure metric already booked it (per choice), so the handler does not again.
    """

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}
        self.counted = False

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def overloaded(headers: dict[str, str]) -> ApiError:
    """The 503 of a request the server has no room for (its queue full: the scheduler's, or Ray's proxy's
    in front of replicas); `headers` carry its Retry-After."""
    return ApiError(
        503,
        "the server is at capacity; retry shortly",
        type="service_unavailable_error",
        code="overloaded",
        headers=headers,
    )
