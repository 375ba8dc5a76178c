"""`yue serve`: an OpenAI-compatible HTTP server over `Engine.stream` (see app.py for the design).

The server stack (FastAPI, uvicorn) loads on first use of `create_app` or `serve`, not on importing the
settings: the CLI reads `ServeConfig`'s fields for every command's start.
"""

from __future__ import annotations

import importlib

from yue.serve.config import ServeConfig

__all__ = ["ServeConfig", "create_app", "serve"]
_LAZY = {"create_app": "yue.serve.app", "serve": "yue.serve.server"}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'yue.serve' has no attribute {name!r}")
