"""A GGUF's names and config, as the family's transformers model has them: tensor names (`hf_name`), the
config its metadata describes (`config_from_gguf`, Llama 3's RoPE scaling from its `rope_freqs`), and
llama.cpp's Q/K row permutation undone (`unpermute_index`). Shared by the straight load
(`gguf_load`) and the Hugging Face folder conversion (`gguf`).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import torch
from transformers import AutoConfig, PreTrainedConfig

from yue.errors import CheckpointError

# GGUF tensor names (llama.cpp's `blk.N.*`) -> LlamaForCausalLM's.
_GLOBAL_NAMES = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER_NAMES = {
    "attn_norm": "input_layernorm",
    "attn_q": "self_attn.q_proj",
    "attn_k": "self_attn.k_proj",
    "attn_v": "self_attn.v_proj",
    "attn_output": "self_attn.o_proj",
    "attn_q_norm": "self_attn.q_norm",
    "attn_k_norm": "self_attn.k_norm",
    "ffn_norm": "post_attention_layernorm",
    "ffn_gate": "mlp.gate_proj",
    "ffn_up": "mlp.up_proj",
    "ffn_down": "mlp.down_proj",
}
# Gemma's layer: the norm after attention is its own tensor, `ffn_norm` the MLP's input norm.
_GEMMA_LAYER_NAMES = _LAYER_NAMES | {
    "post_attention_norm": "post_attention_layernorm",
    "ffn_norm": "pre_feedforward_layernorm",
    "post_ffw_norm": "post_feedforward_layernorm",
}
# GGUF `general.architecture` -> transformers' model_type (the family, `family.FAMILIES`).
ARCHITECTURES = {"llama": "llama", "qwen2": "qwen2", "qwen3": "qwen3", "gemma3": "gemma3_text"}
# llama.cpp's Gemma 3: every 6th layer global, the rest sliding-window with RoPE base 10k (its
# `set_swa_pattern(6)` and `rope_freq_base_train_swa`; the GGUF states neither).
GEMMA3_GLOBAL_EVERY, GEMMA3_LOCAL_THETA = 6, 10000.0
ROPE_FREQS = "rope_freqs.weight"  # llama.cpp's Llama 3 RoPE scaling (`llama3_rope_parameters`)


def config_from_gguf(
    metadata: dict, tensor_names: set[str], source: Path, rope_freqs: np.ndarray | None = None
) -> PreTrainedConfig:
    """The transformers config (of the family, `ARCHITECTURES`) a GGUF's metadata describes (and, for a
    Llama 3, its `rope_freqs` tensor's values), or a CheckpointError naming what is unsupported."""
    arch = metadata.get("general.architecture")
    if arch not in ARCHITECTURES:
        raise CheckpointError(
            f"{source}: GGUF architecture {arch!r} is not supported ({', '.join(ARCHITECTURES)})"
        )
    scaling = metadata.get(f"{arch}.rope.scaling.type")
    if scaling not in (None, "none") or (ROPE_FREQS in tensor_names and arch != "llama"):
        raise CheckpointError(
            f"{source}: RoPE scaling ({scaling or ROPE_FREQS}) in a GGUF is not supported (default, "
            "and a Llama 3's rope_freqs)"
        )
    for cap in ("final_logit_softcapping", "attn_logit_softcapping"):  # Gemma 2's; none in a Gemma 3
        if metadata.get(f"{arch}.{cap}") is not None:
            raise CheckpointError(
                f"{source}: {cap} = {metadata[f'{arch}.{cap}']} is not supported by the yue layer"
            )
    qkv_bias = (".attn_q.bias", ".attn_k.bias", ".attn_v.bias") if arch == "qwen2" else ()
    biases = sorted(n for n in tensor_names if n.endswith(".bias") and not n.endswith(qkv_bias))
    if biases:
        raise CheckpointError(f"{source}: biases are not supported by the yue layer ({biases[0]}, ...)")

    def key(name: str, default=None):
        value = metadata.get(f"{arch}.{name}", default)
        if value is None:
            raise CheckpointError(f"{source}: GGUF metadata lacks {arch}.{name}")
        return value

    heads = key("attention.head_count")
    hidden = key("embedding_length")
    layers = key("block_count")
    theta = float(key("rope.freq_base", 10000.0))
    fields = dict(
        vocab_size=metadata.get(f"{arch}.vocab_size") or metadata["tokenizer.ggml.tokens"],
        hidden_size=hidden,
        intermediate_size=key("feed_forward_length"),
        num_hidden_layers=layers,
        num_attention_heads=heads,
        num_key_value_heads=key("attention.head_count_kv", heads),
        head_dim=key("attention.key_length", metadata.get(f"{arch}.rope.dimension_count") or hidden // heads),
        max_position_embeddings=key("context_length"),
        rms_norm_eps=key("attention.layer_norm_rms_epsilon"),
        rope_parameters={"rope_type": "default", "rope_theta": theta},
        tie_word_embeddings="output.weight" not in tensor_names,
        bos_token_id=metadata.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=metadata.get("tokenizer.ggml.eos_token_id"),
        pad_token_id=metadata.get("tokenizer.ggml.padding_token_id"),
    )
    if rope_freqs is not None:
        fields["rope_parameters"] = llama3_rope_parameters(
            rope_freqs, theta, fields["head_dim"], metadata, source
        )
    if arch == "gemma3":
        fields |= dict(
            # llama.cpp scales queries by 1/sqrt(head_dim) for every Gemma 3 but the 27B
            query_pre_attn_scalar=fields["head_dim"],
            sliding_window=key("attention.sliding_window"),
            layer_types=[
                "full_attention" if (i + 1) % GEMMA3_GLOBAL_EVERY == 0 else "sliding_attention"
                for i in range(layers)
            ],
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": theta},
                "sliding_attention": {"rope_type": "default", "rope_theta": GEMMA3_LOCAL_THETA},
            },
        )
    return AutoConfig.for_model(ARCHITECTURES[arch], **fields)


def llama3_factors(theta: float, head_dim: int, rope: dict) -> np.ndarray:
    """The `rope_freqs` values llama.cpp's converter writes for Llama 3's RoPE scaling `rope` (its
    `LlamaModel.generate_extra_tensors`: a divisor per frequency, computed as it computes them, on
    float32 torch scalars)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim))
    factor, low, high = rope["factor"], rope["low_freq_factor"], rope["high_freq_factor"]
    old = rope["original_max_position_embeddings"]
    out = []
    for freq in inv:
        wavelen = 2 * math.pi / freq
        if wavelen < old / high:
            out.append(1.0)
        elif wavelen > old / low:
            out.append(factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append(1 / ((1 - smooth) / factor + smooth))
    return torch.tensor(out, dtype=torch.float32).numpy()


def llama3_rope_parameters(
    rope_freqs: np.ndarray, theta: float, head_dim: int, metadata: dict, source: Path
) -> dict:
    """Llama 3's RoPE scaling parameters whose `llama3_factors` are exactly the file's `rope_freqs`.

    The GGUF keeps only the factors; Llama 3's parameters (low and high frequency factors 1 and 4, the
    largest factor the scaling factor) give them back with the original context length, read from the
    metadata where stated, else solved from a frequency between the bands (or Llama 3's 8192). A file
    whose factors no such parameters give is refused, never approximated."""
    if rope_freqs.shape != (head_dim // 2,):
        raise CheckpointError(f"{source}: {ROPE_FREQS} has shape {rope_freqs.shape}, not ({head_dim // 2},)")
    factor = float(rope_freqs.max())
    low, high = 1.0, 4.0
    lengths = [metadata.get("llama.rope.scaling.original_context_length"), 8192]
    inv = 1.0 / (theta ** (np.arange(0, head_dim, 2, dtype=np.float32) / head_dim)).astype(np.float64)
    for f, freq in zip(rope_freqs.astype(np.float64), inv, strict=True):
        # Between the bands: 1 / f = (1 - s) / factor + s, where s = (L / wavelength - low) / (high - low).
        if 1.0 < f < factor:
            s = (1 / f - 1 / factor) / (1 - 1 / factor)
            lengths.append(round(2 * math.pi / freq * (low + s * (high - low))))
    for length in (n for n in lengths if n):
        rope = dict(
            rope_type="llama3",
            rope_theta=theta,
            factor=factor,
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position_embeddings=int(length),
        )
        if np.array_equal(llama3_factors(theta, head_dim, rope), rope_freqs):
            return rope
    raise CheckpointError(
        f"{source}: its {ROPE_FREQS} are not Llama 3's RoPE scaling (no parameters give them)"
    )


def hf_name(gguf_name: str, arch: str = "llama") -> str | None:
    """The family's transformers name for a GGUF tensor name (None: not a tensor of that family)."""
    if gguf_name in _GLOBAL_NAMES:
        return _GLOBAL_NAMES[gguf_name]
    names = _GEMMA_LAYER_NAMES if arch == "gemma3_text" else _LAYER_NAMES
    parts = gguf_name.split(".")  # blk.N.attn_q.weight
    if len(parts) == 4 and parts[0] == "blk" and parts[2] in names:
        return f"model.layers.{parts[1]}.{names[parts[2]]}.{parts[3]}"
    return None


def unpermute_index(rows: int, n_head: int) -> np.ndarray:
    """Row indices undoing llama.cpp's Q/K row permutation (its converter's `permute`), per head: GGML's
    interleaved rotary pairs back to Hugging Face's rotate-half order; new row r is the file's row idx[r]
    (transformers' `LlamaTensorProcessor._reverse_permute_weights` on row numbers)."""
    return np.arange(rows).reshape(n_head, rows // n_head // 2, 2).swapaxes(1, 2).reshape(-1)
