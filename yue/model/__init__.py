"""The AR-NAR Mixture-of-Transformers model. Importing this package registers it with transformers' Auto classes."""

from yue.model.cache import KVCache
from yue.model.hf import CheckpointError, export_ar, from_llama, load_model
from yue.model.mot import StepOutput, YueForCausalLM
from yue.model.prepared import PreparedModel

__all__ = [
    "CheckpointError",
    "KVCache",
    "PreparedModel",
    "StepOutput",
    "YueForCausalLM",
    "export_ar",
    "from_llama",
    "load_model",
]
