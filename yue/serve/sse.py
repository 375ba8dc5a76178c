"""Server-sent events as every stream of the server writes them: one `data:` line of compact JSON per
event, `data: [DONE]` last. Apart from the web stack and the engine, so that the Ray Serve proxy's
middleware (`proxy.py`) writes them without importing either."""

from __future__ import annotations

import json

DONE = b"data: [DONE]\n\n"


def sse(obj: dict) -> bytes:
    return b"data: " + json.dumps(obj, ensure_ascii=False, separators=(",", ":")).encode() + b"\n\n"
