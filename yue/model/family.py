"""Model families: a Hugging Face config (Llama, Qwen2, Qwen3, Gemma 3, Mistral) -> the YueConfig fields of
an AR set with its shapes, and the named differences from Llama's layer (`config.Features`).

Design decisions:
- A family is data: one function per `model_type` reads what the family's transformers config says and
  returns the shared fields plus a `Features`; the layer code (`layers.py`, `mot.py`) applies them. A new
  family is a new reader here, not a fork of the model.
- Whatever a config turns on that yue's layer does not compute is refused by name
  (`UnsupportedFeature`, a `CheckpointError`): a logit softcap, another RoPE scaling, attention or MLP
  biases where the family's layer has none. Nothing is dropped silently.
- transformers' implementation of each family is the reference: the tests check our float32 logits
  against its on the same weights.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from yue.config import Features
from yue.errors import CheckpointError


def _refuse(source, feature: str, value) -> None:
    """The error for a feature the yue layer lacks: it names the source and the feature."""
    raise CheckpointError(f"{source}: {feature} = {value!r} is not supported by the yue layer")


def _rope(cfg, source, params: dict | None = None) -> tuple[float, tuple | None]:
    """(rope_theta, llama3 scaling or None) from a rope_parameters dict: default or Llama 3's only."""
    params = params if params is not None else (getattr(cfg, "rope_parameters", None) or {})
    kind = params.get("rope_type", "default")
    theta = float(params.get("rope_theta", 10000.0))
    if kind == "default":
        return theta, None
    if kind != "llama3":
        _refuse(source, "rope_type", kind)
    if params.get("partial_rotary_factor", 1.0) != 1.0:
        _refuse(source, "partial_rotary_factor", params["partial_rotary_factor"])
    original = params.get("original_max_position_embeddings") or cfg.max_position_embeddings
    scaling = (
        float(params["factor"]),
        float(params["low_freq_factor"]),
        float(params["high_freq_factor"]),
        int(original),
    )
    return theta, scaling


def _plain_rope(cfg, source, params: dict | None = None) -> float:
    """rope_theta of a family whose RoPE is unscaled (`_rope`, Llama 3's refused too)."""
    theta, llama3 = _rope(cfg, source, params)
    if llama3 is not None:
        _refuse(source, "rope_type", "llama3")
    return theta


def _silu_only(cfg, source, key: str = "hidden_act") -> None:
    if getattr(cfg, key, "silu") != "silu":
        _refuse(source, key, getattr(cfg, key))


def _no_sliding(cfg, source) -> None:
    """Qwen's sliding window (`use_sliding_window`, off in every released Qwen2/2.5/3 config)."""
    if getattr(cfg, "use_sliding_window", False):
        _refuse(source, "use_sliding_window", True)
    types = getattr(cfg, "layer_types", None) or []
    if any(t != "full_attention" for t in types):
        _refuse(source, "layer_types", sorted(set(types)))


def _llama(cfg, source) -> tuple[float, Features]:
    for key in ("attention_bias", "mlp_bias"):
        if getattr(cfg, key, False):
            _refuse(source, key, True)
    _silu_only(cfg, source)
    theta, llama3 = _rope(cfg, source)
    return theta, Features(llama3_rope=llama3)


def _mistral(cfg, source) -> tuple[float, Features]:
    _silu_only(cfg, source)
    return _plain_rope(cfg, source), Features(sliding_window=getattr(cfg, "sliding_window", None))


def _qwen2(cfg, source) -> tuple[float, Features]:
    _silu_only(cfg, source)
    _no_sliding(cfg, source)
    return _plain_rope(cfg, source), Features(qkv_bias=True)


def _qwen3(cfg, source) -> tuple[float, Features]:
    if getattr(cfg, "attention_bias", False):  # Qwen3's would bias o_proj too
        _refuse(source, "attention_bias", True)
    _silu_only(cfg, source)
    _no_sliding(cfg, source)
    return _plain_rope(cfg, source), Features(qk_norm=True)


def _gemma3(cfg, source) -> tuple[float, Features]:
    for key in ("final_logit_softcapping", "attn_logit_softcapping"):
        if getattr(cfg, key, None) is not None:
            _refuse(source, key, getattr(cfg, key))
    for key in ("attention_bias", "use_bidirectional_attention"):
        if getattr(cfg, key, False):
            _refuse(source, key, True)
    if cfg.hidden_activation != "gelu_pytorch_tanh":
        _refuse(source, "hidden_activation", cfg.hidden_activation)
    types = list(cfg.layer_types)
    if set(types) - {"sliding_attention", "full_attention"}:
        _refuse(source, "layer_types", sorted(set(types)))
    theta = _plain_rope(cfg, source, cfg.rope_parameters["full_attention"])
    local_theta = _plain_rope(cfg, source, cfg.rope_parameters["sliding_attention"])
    return theta, Features(
        qk_norm=True,
        norm_offset=1.0,
        sandwich_norms=True,
        activation="gelu_tanh",
        embed_scale=True,
        attn_scale=cfg.query_pre_attn_scalar**-0.5,
        sliding_window=cfg.sliding_window,
        sliding_layers=tuple(t == "sliding_attention" for t in types),
        local_rope_theta=local_theta,
    )


# transformers' model_type -> reader: (rope_theta, Features) from the config, refusing what yue lacks.
FAMILIES: dict[str, Callable] = {
    "llama": _llama,
    "mistral": _mistral,
    "qwen2": _qwen2,
    "qwen3": _qwen3,
    "gemma3_text": _gemma3,
}


def yue_fields(cfg, source: str | Path = "config") -> dict:
    """The YueConfig fields of an AR set with `cfg`'s shapes, family and features.

    Args:
        cfg: a transformers config of one of `FAMILIES`.
        source: what to name in an error (the folder or file).
    Raises:
        CheckpointError: a family yue does not run, or a feature of it that the layer lacks (named).
    """
    reader = FAMILIES.get(cfg.model_type)
    if reader is None:
        raise CheckpointError(
            f"{source}: model_type {cfg.model_type!r} is not supported (supported: {', '.join(FAMILIES)})"
        )
    theta, features = reader(cfg, source)
    eos = cfg.eos_token_id[0] if isinstance(cfg.eos_token_id, list) else cfg.eos_token_id
    return dict(
        vocab_size=cfg.vocab_size,
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        head_dim=getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rms_norm_eps=cfg.rms_norm_eps,
        rope_theta=theta,
        tie_word_embeddings=cfg.tie_word_embeddings,
        bos_token_id=cfg.bos_token_id,
        eos_token_id=cfg.eos_token_id,
        pad_token_id=cfg.pad_token_id,
        mask_token_id=cfg.pad_token_id if cfg.pad_token_id is not None else eos,
        family=cfg.model_type,
        features=features.to_dict() or None,
    )
