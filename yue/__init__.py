"""yue: fast text generation with an AR-NAR Mixture-of-Transformers.

import yue
engine = yue.load()                      # the default model; or a name ("yue-code-mini"), a folder, a .gguf
print(engine.generate("def fibonacci(n):", mode="verified").text)

The names below load on first use (PEP 562), so `import yue` (and the `yue` command's --version,
--help and argument errors) import no torch or transformers until a model is needed.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

__version__ = "0.1.0"
__all__ = ["DecodeConfig", "Engine", "YueConfig", "YueForCausalLM", "load"]

# Each public name -> the module that defines it, imported when the name is first read.
_HOMES = {
    "DecodeConfig": "yue.settings",
    "Engine": "yue.engine",
    "YueConfig": "yue.config",
    "YueForCausalLM": "yue.model",
    "load": "yue.engine",
}

if TYPE_CHECKING:
    from yue.config import YueConfig
    from yue.engine import Engine, load
    from yue.model import YueForCausalLM
    from yue.settings import DecodeConfig


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'yue' has no attribute {name!r}")
    value = getattr(importlib.import_module(_HOMES[name]), name)
    globals()[name] = value  # read once: later lookups skip this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
