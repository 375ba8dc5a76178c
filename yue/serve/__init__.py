"""`yue serve`: an OpenAI-compatible HTTP server over `Engine.stream` (see app.py for the design)."""

from yue.serve.app import create_app
from yue.serve.config import ServeConfig
from yue.serve.server import serve

__all__ = ["ServeConfig", "create_app", "serve"]
