"""Hugging Face integration: Auto* registration, safe loading, AR-set export and Llama import.

Design decisions:
- The AR set's parameter names are `LlamaForCausalLM`'s, so export is a filter on the state dict
  (drop `nar_*` and `router.*`) and import is the same filter read the other way.
- Loading goes through `from_pretrained(use_safetensors=True)` after checking the files ourselves, so
  a missing, truncated or corrupt checkpoint fails with a message naming the file, and no pickle
  (`*.bin`) is ever read.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.utils import logging as hf_logging

from yue.config import YueConfig
from yue.model.mot import YueForCausalLM

AutoConfig.register("yue", YueConfig, exist_ok=True)
AutoModelForCausalLM.register(YueConfig, YueForCausalLM, exist_ok=True)


class CheckpointError(ValueError):
    """A model folder is missing, truncated or corrupt. The message names the file."""


def is_nar_or_router(name: str) -> bool:
    """Entries outside the AR set's checkpoint: the NAR set, the router, and what
    `prepare_for_decoding` adds (fused decode matmuls, a lowered drafting head)."""
    return (
        name.startswith(("router.", "draft_head.", "draft_vocab", "model.slot_entry."))
        or ".nar_" in name
        or ".decode_sets." in name
    )


def check_checkpoint(path: str | Path) -> Path:
    """Verify a model folder can be loaded safely, before any weights are read.

    Raises:
        CheckpointError: naming the missing, unreadable or corrupt file.
    """
    path = Path(path)
    if not path.is_dir():
        raise CheckpointError(f"model folder not found: {path}")
    config_file = path / "config.json"
    if not config_file.is_file():
        raise CheckpointError(f"missing {config_file}")
    try:
        json.loads(config_file.read_text())
    except (OSError, ValueError) as e:
        raise CheckpointError(f"corrupt {config_file}: {e}") from e
    weights = sorted(path.glob("*.safetensors"))
    if not weights:
        pickles = [p.name for p in path.glob("*.bin")] + [p.name for p in path.glob("*.pt")]
        hint = f" (found {', '.join(pickles)}: pickle files are never loaded)" if pickles else ""
        raise CheckpointError(f"no .safetensors weights in {path}{hint}")
    for file in weights:
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # touching each tensor validates its byte range
                    f.get_slice(key)
        except Exception as e:  # safetensors raises its own error types; we report them uniformly
            raise CheckpointError(f"corrupt or truncated weights file {file}: {e}") from e
    return path


def load_model(path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype | None = None):
    """Load a yue checkpoint folder (safetensors only) onto `device`, in eval mode."""
    path = check_checkpoint(path)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a per-load "Loading weights" bar is noise on a CLI's stdout
    try:
        model = AutoModelForCausalLM.from_pretrained(str(path), use_safetensors=True, dtype=dtype)
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"could not load the model in {path}: {e}") from e
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if not isinstance(model, YueForCausalLM):
        raise CheckpointError(f"{path / 'config.json'} is not a yue model (model_type must be 'yue')")
    return model.to(device).eval()


def llama_config_from(config: YueConfig) -> LlamaConfig:
    """The `LlamaConfig` whose model has exactly our AR set's shapes."""
    return LlamaConfig(
        vocab_size=config.vocab_size,
        hidden_size=config.hidden_size,
        intermediate_size=config.intermediate_size,
        num_hidden_layers=config.num_hidden_layers,
        num_attention_heads=config.num_attention_heads,
        num_key_value_heads=config.num_key_value_heads,
        head_dim=config.head_dim,
        max_position_embeddings=config.max_position_embeddings,
        rms_norm_eps=config.rms_norm_eps,
        rope_parameters={"rope_type": "default", "rope_theta": config.rope_theta},
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def ar_state_dict(model: YueForCausalLM) -> dict[str, torch.Tensor]:
    """The AR set (plus shared embedding, final norm, head) under Llama's names."""
    return {k: v for k, v in model.state_dict().items() if not is_nar_or_router(k)}


def export_ar(model: YueForCausalLM, out_dir: str | Path, tokenizer_file: str | Path | None = None) -> Path:
    """Write the AR set as a plain `LlamaForCausalLM` checkpoint (safetensors) to `out_dir`."""
    out_dir = Path(out_dir)
    llama = LlamaForCausalLM(llama_config_from(model.config)).to(model.dtype)
    missing, unexpected = llama.load_state_dict(ar_state_dict(model), strict=False)
    # A tied head appears as "missing" lm_head.weight; anything else is a real mismatch.
    missing = [m for m in missing if not (m == "lm_head.weight" and model.config.tie_word_embeddings)]
    if missing or unexpected:
        raise RuntimeError(f"AR export mismatch: missing={missing} unexpected={unexpected}")
    if model.config.tie_word_embeddings:
        llama.tie_weights()
    llama.generation_config.pad_token_id = model.config.pad_token_id
    llama.generation_config.eos_token_id = model.config.eos_token_id
    llama.save_pretrained(str(out_dir))
    if tokenizer_file is not None and Path(tokenizer_file).is_file():
        shutil.copy(tokenizer_file, out_dir / "tokenizer.json")
    return out_dir


def from_llama(llama: LlamaForCausalLM, block_size: int = 8, mask_token_id: int | None = None, **overrides):
    """A yue model whose AR set is `llama`'s weights and whose NAR set starts as a copy of them.

    Args:
        llama: a Llama-family causal LM (its names must match `LlamaForCausalLM`'s).
        block_size: K for the new NAR set.
        mask_token_id: id of the `<|mask|>` token in the llama's vocabulary (default: its pad or eos id).
        overrides: further `YueConfig` fields (router_threshold, ...).
    """
    lc = llama.config
    rope_theta = (getattr(lc, "rope_parameters", None) or {}).get("rope_theta", 10000.0)
    if mask_token_id is None:
        mask_token_id = lc.pad_token_id if lc.pad_token_id is not None else lc.eos_token_id
    config = YueConfig(
        vocab_size=lc.vocab_size,
        hidden_size=lc.hidden_size,
        intermediate_size=lc.intermediate_size,
        num_hidden_layers=lc.num_hidden_layers,
        num_attention_heads=lc.num_attention_heads,
        num_key_value_heads=lc.num_key_value_heads,
        head_dim=getattr(lc, "head_dim", None) or lc.hidden_size // lc.num_attention_heads,
        max_position_embeddings=lc.max_position_embeddings,
        rms_norm_eps=lc.rms_norm_eps,
        rope_theta=rope_theta,
        tie_word_embeddings=lc.tie_word_embeddings,
        bos_token_id=lc.bos_token_id,
        eos_token_id=lc.eos_token_id,
        pad_token_id=lc.pad_token_id,
        mask_token_id=mask_token_id,
        block_size=block_size,
        **overrides,
    )
    model = YueForCausalLM(config).to(llama.dtype)
    src = llama.state_dict()
    state = model.state_dict()
    for name in state:
        ar_name = name.replace(".nar_", ".") if ".nar_" in name else name
        if ar_name in src:
            state[name] = src[ar_name].clone()
    model.load_state_dict(state)
    return model
