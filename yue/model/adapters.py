"""LoRA adapters on the AR set: which modules they target, the base model they belong to, applying them.

An adapter folder (written by `yue finetune`) holds:

    adapter_config.json          peft's LoraConfig (target_modules: the AR-set regex below)
    adapter_model.safetensors    the LoRA A/B matrices, peft's names
    base_model.json              the base model's identity: its shape config and a probe of its AR weights
    drafts.safetensors           optional: the NAR set and router refreshed for the adapted model

Design decisions:
- The LoRA itself is peft's (`PeftModel`), never hand-written. At load it is merged into the AR set's
  weights (`merge_and_unload`), so decoding runs the plain model: the fused decode matmuls of
  `prepare_for_decoding`, the KV cache and every mode work unchanged, at the base model's speed.
- Targets are the AR set only. The AR set's modules carry Llama's names (`self_attn.q_proj`, ...), the
  NAR set's the same behind `nar_`; peft matches a plain name list by suffix and would hit both, so
  targets are always a regex anchored on `.self_attn.` / `.mlp.` (the `nar_` modules have `_self_attn`).
- Identity: the adapter records its base's shape config and a few values of every AR tensor (a probe
  at fixed strided indices). Matching is tolerant (rtol 1e-2), so the base loaded in bfloat16 still
  matches, while another model (other training, other seed) differs at the first probed tensor, which
  the error names. Dequantized GGUF weights are deterministic, so a GGUF-sourced AR set matches too.
- The refreshed drafts are whole tensors under the model's own names (NAR set, router), applied after
  the merge with a strict name and shape check.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file

from yue.model.hf import AR_SHAPE_FIELDS, CheckpointError, is_nar_or_router
from yue.model.mot import YueForCausalLM

# The AR set's linear layers, Llama's names. Attention projections then MLP projections.
AR_ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
AR_MLP = ("gate_proj", "up_proj", "down_proj")
AR_PROJECTIONS = AR_ATTENTION + AR_MLP
IDENTITY_FILE = "base_model.json"
DRAFTS_FILE = "drafts.safetensors"
ADAPTER_FILES = ("adapter_config.json", "adapter_model.safetensors")
# Config fields that fix the AR set's shapes and numerics: an adapter for another value cannot apply.
IDENTITY_FIELDS = AR_SHAPE_FIELDS
PROBES_PER_TENSOR = 8
PROBE_RTOL, PROBE_ATOL = 1e-2, 1e-4


class AdapterError(CheckpointError):
    """An adapter folder is missing files, corrupt, or made for another base model."""


def ar_target_regex(modules: tuple[str, ...] | list[str] = AR_PROJECTIONS) -> str:
    """A peft `target_modules` regex (full match) hitting the named projections of the AR set only.

    Args:
        modules: Llama projection names, a subset of `AR_PROJECTIONS`.
    Raises:
        ValueError: an unknown name (the message lists the valid ones).
    """
    unknown = [m for m in modules if m not in AR_PROJECTIONS]
    if unknown or not modules:
        raise ValueError(
            f"target_modules must be names among {', '.join(AR_PROJECTIONS)}, got {list(modules)}"
        )
    attn = [m for m in AR_PROJECTIONS if m in modules and m in AR_ATTENTION]
    mlp = [m for m in AR_PROJECTIONS if m in modules and m in AR_MLP]
    parts = ([rf"self_attn\.({'|'.join(attn)})"] if attn else []) + (
        [rf"mlp\.({'|'.join(mlp)})"] if mlp else []
    )
    # `\.` before self_attn/mlp: the NAR set's `nar_self_attn` / `nar_mlp` never match.
    return rf".*\.layers\.\d+\.({'|'.join(parts)})"


# --------------------------------------------------------------------------------------------------
# Identity of the base model


def probe_indices(numel: int, n: int) -> torch.Tensor:
    """`n` indices spread evenly over [0, numel), first and last included. float64: in float32 the
    last index of a 28M-entry table (SmolLM2's embedding) rounds past its end."""
    return torch.linspace(0, numel - 1, min(n, numel), dtype=torch.float64).long()


def base_identity(model: YueForCausalLM, name: str = "") -> dict:
    """The base model's identity: shape config, and PROBES_PER_TENSOR values of every AR tensor.

    Returns:
        {"name", "config": {field: value}, "probe": {tensor name: [floats]}, "digest": short hex id}.
    """
    config = {f: getattr(model.config, f, None) for f in IDENTITY_FIELDS}
    probe = {}
    for key, tensor in sorted(model.state_dict().items()):
        if is_nar_or_router(key) or key == "lm_head.weight" and model.config.tie_word_embeddings:
            continue
        flat = tensor.detach().flatten()
        idx = probe_indices(flat.numel(), PROBES_PER_TENSOR)
        probe[key] = [round(v, 6) for v in flat[idx].float().cpu().tolist()]
    digest = hashlib.sha256(json.dumps([config, probe], sort_keys=True).encode()).hexdigest()[:16]
    return {"name": name, "config": config, "probe": probe, "digest": digest}


def check_base(adapter_dir: Path, model: YueForCausalLM) -> dict:
    """Raise AdapterError naming the first difference between the adapter's recorded base and `model`."""
    file = adapter_dir / IDENTITY_FILE
    try:
        want = json.loads(file.read_text())
        want_config, want_probe = want["config"], want["probe"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise AdapterError(f"missing or corrupt {file} (the adapter's base-model identity): {e}") from e
    have = base_identity(model)
    label = (
        f"adapter {adapter_dir} was trained on base model {want.get('name') or '?'} ({want.get('digest')})"
    )
    for field in IDENTITY_FIELDS:
        if want_config.get(field) != have["config"][field]:
            raise AdapterError(
                f"{label}; this model differs in {field}: {have['config'][field]} (adapter's base: "
                f"{want_config.get(field)})"
            )
    if set(want_probe) != set(have["probe"]):
        extra = sorted(set(want_probe) ^ set(have["probe"]))[:3]
        raise AdapterError(f"{label}; this model's AR set has other tensors ({', '.join(extra)} ...)")
    for key, values in want_probe.items():
        if not torch.allclose(
            torch.tensor(have["probe"][key]), torch.tensor(values), rtol=PROBE_RTOL, atol=PROBE_ATOL
        ):
            raise AdapterError(f"{label}; this model's AR weights differ from it, first at {key}")
    return want


# --------------------------------------------------------------------------------------------------
# Files


def check_adapter_folder(adapter_dir: str | Path) -> Path:
    """Every adapter file present and readable, before any model work. Raises AdapterError naming it."""
    folder = Path(adapter_dir)
    if not folder.is_dir():
        raise AdapterError(f"adapter folder not found: {folder}")
    for name in (*ADAPTER_FILES, IDENTITY_FILE):
        if not (folder / name).is_file():
            raise AdapterError(f"{folder} is not a yue adapter folder: {name} is missing")
    try:
        config = json.loads((folder / "adapter_config.json").read_text())
    except ValueError as e:
        raise AdapterError(f"corrupt {folder / 'adapter_config.json'}: {e}") from e
    if config.get("peft_type") != "LORA":
        raise AdapterError(
            f"{folder / 'adapter_config.json'}: peft_type must be LORA, got {config.get('peft_type')}"
        )
    for name in ("adapter_model.safetensors", DRAFTS_FILE):
        file = folder / name
        if not file.is_file():
            continue
        try:
            with safe_open(str(file), framework="pt") as f:
                for key in f.keys():  # touching each tensor validates its byte range
                    f.get_slice(key)
        except Exception as e:  # safetensors raises its own error types; report them uniformly
            raise AdapterError(f"corrupt or truncated adapter file {file}: {e}") from e
    return folder


def draft_state(model: YueForCausalLM) -> dict[str, torch.Tensor]:
    """The NAR set and router tensors (what `drafts.safetensors` holds), contiguous, on the CPU."""
    return {k: v.detach().cpu().contiguous() for k, v in model.state_dict().items() if is_nar_or_router(k)}


def apply_drafts(model: YueForCausalLM, file: Path) -> None:
    """Load refreshed NAR/router tensors into `model`; every name and shape must exist in it."""
    drafts = load_file(str(file))
    state = model.state_dict()
    bad = [k for k, v in drafts.items() if k not in state or state[k].shape != v.shape]
    if bad:
        raise AdapterError(f"{file} does not fit this model: {', '.join(bad[:3])} (name or shape)")
    with torch.no_grad():
        for k, v in drafts.items():
            state[k].copy_(v)


# --------------------------------------------------------------------------------------------------
# Applying


def apply_adapter(model: YueForCausalLM, adapter_dir: str | Path | None) -> YueForCausalLM:
    """Merge the adapter's LoRA into `model`'s AR set and apply its refreshed drafts; returns the model.

    `model` must be as loaded (not prepared for decoding). None = no adapter: `model` unchanged.

    Raises:
        AdapterError: missing or corrupt adapter files, or an adapter made for another base model.
    """
    if adapter_dir is None:
        return model
    from peft import PeftModel

    if not isinstance(model, YueForCausalLM) or model.consumed:
        raise ValueError("apply_adapter needs the model as loaded, before prepare_for_decoding")
    folder = check_adapter_folder(adapter_dir)
    check_base(folder, model)
    try:
        peft_model = PeftModel.from_pretrained(model, str(folder), is_trainable=False)
    except (OSError, ValueError, RuntimeError, KeyError) as e:
        raise AdapterError(f"could not apply the adapter in {folder}: {e}") from e
    model = peft_model.merge_and_unload()
    if (folder / DRAFTS_FILE).is_file():
        apply_drafts(model, folder / DRAFTS_FILE)
    return model.eval()
