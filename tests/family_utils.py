"""Tiny random models of each family yue loads (test helper): transformers' own config and model classes
at tiny sizes, weights randomised large enough that greedy decoding has few near-ties.

`tiny_family(name)` returns the transformers model; `save_family(name, folder)` writes it as a Hugging
Face folder (safetensors + config.json), the form a user's download has.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import (
    AutoModelForCausalLM,
    Gemma3TextConfig,
    LlamaConfig,
    MistralConfig,
    Qwen2Config,
    Qwen3Config,
)

SHAPE = dict(
    vocab_size=128,
    hidden_size=64,
    intermediate_size=96,
    num_hidden_layers=3,
    num_attention_heads=4,
    num_key_value_heads=2,
    head_dim=16,
    max_position_embeddings=256,
    rms_norm_eps=1e-6,
)
WINDOW = 5  # sliding-window layers see 5 keys: the tests' prompts are longer

# name -> a transformers config of that family with each of its differences from Llama switched on.
FAMILY_CONFIGS = {
    "llama3": lambda: LlamaConfig(
        **SHAPE,
        rope_parameters={
            "rope_type": "llama3",
            "rope_theta": 500000.0,
            "factor": 8.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 64,  # some of the 8 frequencies fall in each band
        },
        tie_word_embeddings=True,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    ),
    "qwen2": lambda: Qwen2Config(
        **SHAPE, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0
    ),
    "qwen3": lambda: Qwen3Config(
        **SHAPE, tie_word_embeddings=True, bos_token_id=1, eos_token_id=2, pad_token_id=0
    ),
    "gemma3": lambda: Gemma3TextConfig(
        **SHAPE,
        query_pre_attn_scalar=24,  # not head_dim: the scale is its own
        sliding_window=WINDOW,
        layer_types=["sliding_attention", "full_attention", "sliding_attention"],
        rope_parameters={
            "full_attention": {"rope_type": "default", "rope_theta": 1000000.0},
            "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0},
        },
    ),
    "mistral": lambda: MistralConfig(
        **SHAPE, sliding_window=WINDOW, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2, pad_token_id=0
    ),
}
FAMILY_NAMES = tuple(FAMILY_CONFIGS)


def tiny_family(name: str, seed: int = 0):
    """transformers' model of family `name`, float32, eval, random weights: matrices N(0, 0.25), vectors
    (norm weights, biases) their init plus N(0, 0.1)."""
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(FAMILY_CONFIGS[name](), dtype=torch.float32).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.25)
            else:
                p.add_(torch.randn_like(p) * 0.1)
    return model


def save_family(name: str, folder: str | Path, seed: int = 0):
    """Write `tiny_family(name)` to `folder` as a Hugging Face folder; returns the model."""
    model = tiny_family(name, seed)
    model.save_pretrained(str(folder))
    return model
