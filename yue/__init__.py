"""yue: fast text generation with an AR-NAR Mixture-of-Transformers.

import yue
engine = yue.load()                      # the default model; or a name ("yue-code-mini"), a folder, a .gguf
print(engine.generate("def fibonacci(n):", mode="verified").text)
"""

from yue.config import DecodeConfig, YueConfig
from yue.engine import Engine, load
from yue.model import YueForCausalLM

__version__ = "0.1.0"
__all__ = ["DecodeConfig", "Engine", "YueConfig", "YueForCausalLM", "load"]
