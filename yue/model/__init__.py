"""The AR-NAR Mixture-of-Transformers model. Importing this package registers it with transformers' Auto classes."""

from yue.model.cache import KVCache
from yue.model.hf import CheckpointError, export_ar, from_llama, load_model
from yue.model.mot import StepOutput, YueForCausalLM

__all__ = [
    "CheckpointError",
    "KVCache",
    "StepOutput",
    "YueForCausalLM",
    "export_ar",
    "from_llama",
    "load_model",
]
