"""Tiny random models of each family yue loads (test helper): transformers' own config and model classes
at tiny sizes, weights randomised large enough that greedy decoding has few near-ties.

`tiny_family(name)` returns the transformers model; `save_family(name, folder)` writes it as a Hugging
Face folder (safetensors + config.json), the form a user's download has.
"""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import numpy as np
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
    vocab_size=320,  # gguf_utils.tiny_tokenizer's
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
        **SHAPE,
        sliding_window=WINDOW,
        tie_word_embeddings=False,
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
    ),
}
FAMILY_NAMES = tuple(FAMILY_CONFIGS)


def tiny_family(name: str, seed: int = 0, **overrides):
    """transformers' model of family `name` (config fields `overrides` changed), float32, eval, random
    weights: matrices N(0, 0.25), vectors (norm weights, biases) their init plus N(0, 0.1)."""
    torch.manual_seed(seed)
    config = FAMILY_CONFIGS[name]()
    for key, value in overrides.items():
        setattr(config, key, value)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32).eval()
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


# The families as llama.cpp writes them: its architecture name, and the config fields its Gemma 3 fixes
# (every 6th layer global, local RoPE base 10k, queries scaled by 1/sqrt(head_dim)).
GGUF_ARCHS = {"llama3": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3"}
GGUF_OVERRIDES = {
    "gemma3": dict(
        num_hidden_layers=6,
        layer_types=["sliding_attention"] * 5 + ["full_attention"],
        query_pre_attn_scalar=SHAPE["head_dim"],
    )
}
_GGUF_LAYER_NAMES = {
    "input_layernorm": "attn_norm",
    "self_attn.q_proj": "attn_q",
    "self_attn.k_proj": "attn_k",
    "self_attn.v_proj": "attn_v",
    "self_attn.o_proj": "attn_output",
    "self_attn.q_norm": "attn_q_norm",
    "self_attn.k_norm": "attn_k_norm",
    "post_attention_layernorm": "ffn_norm",
    "mlp.gate_proj": "ffn_gate",
    "mlp.up_proj": "ffn_up",
    "mlp.down_proj": "ffn_down",
}
_GEMMA_GGUF_NAMES = _GGUF_LAYER_NAMES | {
    "post_attention_layernorm": "post_attention_norm",
    "pre_feedforward_layernorm": "ffn_norm",
    "post_feedforward_layernorm": "post_ffw_norm",
}


def gguf_name(hf_name: str, arch: str) -> str:
    """llama.cpp's tensor name for a transformers one (`blk.N.attn_q.weight`, ...)."""
    glob = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight"}
    if hf_name in glob or hf_name == "lm_head.weight":
        return glob.get(hf_name, "output.weight")
    _, _, layer, rest = hf_name.split(".", 3)  # model.layers.N.self_attn.q_proj.weight
    module, kind = rest.rsplit(".", 1)
    names = _GEMMA_GGUF_NAMES if arch == "gemma3" else _GGUF_LAYER_NAMES
    return f"blk.{layer}.{names[module]}.{kind}"


def write_family_gguf(path: str | Path, name: str, quant: str = "F32", seed: int = 0, **overrides):
    """Write a tiny random model of family `name` (`GGUF_ARCHS`; config fields `overrides` changed) as
    llama.cpp's converter would: Gemma's norm weights as 1 + w, a gpt2 byte-level tokenizer, and every
    2-d tensor in `quant` (a `gguf.GGMLQuantizationType` name: quantized by `gguf.quants` where it can,
    random valid blocks for the K-quants, whose inputs must then be a multiple of 256).

    Returns:
        transformers' model of the family holding exactly the values a faithful reader recovers (by
        `quant_reference.dequantize`, not the converter's dequantizer).
    """
    from tests import quant_reference
    from tests.gguf_utils import CHATML_TEMPLATE, CONTROL_TOKENS, _permute, _permute_back, tiny_tokenizer

    rng = np.random.default_rng(seed)
    arch = GGUF_ARCHS[name]
    model = tiny_family(name, seed, **(GGUF_OVERRIDES.get(name, {}) | overrides))
    cfg = model.config
    tok = tiny_tokenizer()
    vocab = [t for t, _ in sorted(tok.get_vocab().items(), key=lambda kv: kv[1])]
    merges = [m if isinstance(m, str) else " ".join(m) for m in json.loads(tok.to_str())["model"]["merges"]]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    rope = cfg.rope_parameters
    w.add_rope_freq_base((rope.get("full_attention") or rope)["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    if arch == "gemma3":
        w.add_sliding_window(cfg.sliding_window)
    if rope.get("rope_type") == "llama3":  # llama.cpp keeps Llama 3's scaling as a factor per frequency
        from yue.model.gguf_names import llama3_factors

        w.add_tensor("rope_freqs.weight", llama3_factors(rope["rope_theta"], cfg.head_dim, rope))
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(vocab)
    w.add_token_types([3 if t in CONTROL_TOKENS else 1 for t in vocab])
    w.add_token_merges(merges)
    w.add_bos_token_id(cfg.bos_token_id)
    w.add_eos_token_id(cfg.eos_token_id)
    w.add_pad_token_id(cfg.pad_token_id)
    w.add_add_bos_token(False)
    w.add_chat_template(CHATML_TEMPLATE)
    qtype = gguf.GGMLQuantizationType[quant]
    F32, F16 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16
    K_QUANTS = (
        gguf.GGMLQuantizationType.Q4_K,
        gguf.GGMLQuantizationType.Q5_K,
        gguf.GGMLQuantizationType.Q6_K,
    )
    recovered = {}
    for hf, value in model.state_dict().items():
        if hf == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        values = value.numpy().astype(np.float32)
        gemma_norm = arch == "gemma3" and hf.endswith("norm.weight")
        if gemma_norm:
            values = values + np.float32(1)
        # llama.cpp's Llama: Q and K rows permuted to GGML's rotary layout (a row order, undone on reading)
        heads = {"q_proj": cfg.num_attention_heads, "k_proj": cfg.num_key_value_heads}.get(hf.split(".")[-2])
        heads = heads if arch == "llama" else None
        if heads:
            values = _permute(values, heads)
        stored_type = qtype if values.ndim == 2 else F32
        if stored_type == F32:
            data = values
        elif stored_type in K_QUANTS:  # `gguf.quants` cannot quantize these: random valid blocks
            data = quant_reference.random_blocks(values.shape, stored_type, rng)
        else:
            data = gguf.quants.quantize(values, stored_type)
        back = quant_reference.dequantize(data, stored_type, values.shape)  # not the converter's code
        back = _permute_back(back, heads) if heads else back
        recovered[hf] = torch.from_numpy(back - np.float32(1) if gemma_norm else back)
        w.add_tensor(gguf_name(hf, arch), data, raw_dtype=None if stored_type in (F32, F16) else stored_type)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with torch.no_grad():
        model.load_state_dict(recovered, strict=False)
        if cfg.tie_word_embeddings:
            model.tie_weights()
    return model
