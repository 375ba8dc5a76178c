"""Atomic, pickle-free training checkpoints.

Layout of a run folder's `checkpoints/`:

    step-000400/  model.safetensors       weights (tied embedding stored once)
                  optimizer.safetensors   AdamW moments and step counters, flattened "state.<i>.<key>"
                  rng.safetensors         torch CPU RNG state (uint8)
                  state.json              step, optimizer param_groups, anything JSON-able

Design decisions:
- Atomic: everything is written into `.tmp-step-N-<pid>/`, fsynced, then `os.replace`d onto
  `step-N/` in one rename. A kill at any moment leaves either the old set of `step-*` folders or the new
  one; a leftover `.tmp-*` folder is never read (and is cleaned up by the next save).
- `latest_checkpoint` walks `step-*` folders newest first and returns the first one whose files all
  open, so even a folder damaged after the rename (a truncated disk write) falls back to the previous.
- Never pickle: `torch.save`/`torch.load` are not used; tensors go to safetensors, the rest to JSON.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, load_model, save_file, save_model
from torch import nn

from yue.train.sharding import shard_like

FILES = ("model.safetensors", "optimizer.safetensors", "rng.safetensors", "state.json")


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> tuple[dict[str, torch.Tensor], list[dict]]:
    """Split `optimizer.state_dict()` into flat tensors (safetensors) and JSON-able param_groups (an
    FSDP optimizer's moments are shards here: `Trainer.save` gathers them)."""
    sd = optimizer.state_dict()
    tensors = {}
    for idx, state in sd["state"].items():
        for key, value in state.items():
            t = value if torch.is_tensor(value) else torch.tensor(value)
            tensors[f"state.{idx}.{key}"] = t.detach().cpu().contiguous()
    return tensors, sd["param_groups"]


def load_optimizer_tensors(
    optimizer: torch.optim.Optimizer, tensors: dict[str, torch.Tensor], param_groups: list[dict]
) -> None:
    """Inverse of `optimizer_tensors`. Whole moments become shards where the optimizer steps FSDP
    shards (each process keeps its part), so a checkpoint resumes with or without FSDP."""
    params = [p for group in optimizer.param_groups for p in group["params"]]  # the state's indices
    state: dict[int, dict[str, torch.Tensor]] = {}
    for name, t in tensors.items():
        _, idx, key = name.split(".", 2)
        state.setdefault(int(idx), {})[key] = shard_like(t, params[int(idx)])
    optimizer.load_state_dict({"state": state, "param_groups": param_groups})


def save_checkpoint(
    run_dir: Path,
    step: int,
    model: nn.Module,
    optimizer: torch.optim.Optimizer | tuple[dict[str, torch.Tensor], list[dict]],
    extra: dict,
    keep: int = 2,
) -> Path:
    """Write checkpoint `step` atomically and keep only the newest `keep`. Returns its folder.

    Args:
        optimizer: the optimizer, or its `optimizer_tensors` already gathered (FSDP).
    """
    root = Path(run_dir) / "checkpoints"
    root.mkdir(parents=True, exist_ok=True)
    for stale in root.glob(".tmp-*"):  # an earlier save killed mid-write
        shutil.rmtree(stale, ignore_errors=True)
    final = root / f"step-{step:06d}"
    tmp = root / f".tmp-step-{step:06d}-{os.getpid()}"
    tmp.mkdir()
    # 1. Write every file into the temporary folder.
    save_model(model, str(tmp / "model.safetensors"))
    opt_tensors, groups = optimizer if isinstance(optimizer, tuple) else optimizer_tensors(optimizer)
    save_file(opt_tensors, str(tmp / "optimizer.safetensors"))
    save_file({"torch_cpu": torch.get_rng_state()}, str(tmp / "rng.safetensors"))
    (tmp / "state.json").write_text(json.dumps({"step": step, "param_groups": groups, **extra}, indent=2))
    # 2. Make the bytes durable before the rename makes them visible.
    for name in FILES:
        with open(tmp / name, "rb") as f:
            os.fsync(f.fileno())
    _fsync_dir(tmp)
    # 3. Publish in one rename (replacing a same-step folder from an earlier, identical save).
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    _fsync_dir(root)
    # 4. Prune old checkpoints, oldest first.
    for old in sorted(root.glob("step-*"))[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def is_complete(path: Path) -> bool:
    """True when every file of the checkpoint exists and opens (state.json parses, tensors are intact)."""
    try:
        json.loads((path / "state.json").read_text())
        for name in FILES[:3]:
            with safe_open(str(path / name), framework="pt") as f:
                for key in f.keys():
                    f.get_slice(key)
        return True
    except Exception:  # any damage (missing, truncated, bad header) means "not this one"
        return False


def latest_checkpoint(run_dir: Path) -> Path | None:
    """Newest complete `step-*` checkpoint of a run, or None. Temporary folders are never considered."""
    root = Path(run_dir) / "checkpoints"
    for path in sorted(root.glob("step-*"), reverse=True):
        if is_complete(path):
            return path
    return None


def load_checkpoint(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    """Restore weights, optimizer and RNG from `path`; returns the JSON state (with `step`)."""
    state = json.loads((path / "state.json").read_text())
    missing, unexpected = load_model(model, str(path / "model.safetensors"), strict=False)
    real_missing = [k for k in missing if k != "lm_head.weight"]  # tied: stored once as the embedding
    if real_missing or unexpected:
        raise ValueError(
            f"checkpoint {path} does not match the model: missing {real_missing}, extra {unexpected}"
        )
    load_optimizer_tensors(optimizer, load_file(str(path / "optimizer.safetensors")), state["param_groups"])
    torch.set_rng_state(load_file(str(path / "rng.safetensors"))["torch_cpu"])
    return state
