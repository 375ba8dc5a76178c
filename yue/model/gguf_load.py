"""A GGUF's AR set straight into a yue model: in the file's own codes (the `file` precision: each matrix
stays in its ggml block format, `ggml_modules`), or dequantized to float32 in memory (`float32`).

Design decisions:
- One pass, top to bottom: the file's index (`gguf_file.GGUFFile`), its config (`gguf_names.config_from_gguf`),
  shapes checked against the metadata, memory checked against what is free, then the model on the meta
  device with each tensor given its value once. Nothing is written to disk but the index.
- In the file's precision a matrix's bytes are read in place from the file's mapping (O and down, the
  token table and a tied head), or into one buffer per fused matmul (Q/K/V and gate/up of a format,
  side by side, so the decode path runs each as one matmul with no copy: `ggml_modules.fused`). A
  Llama's Q and K rows, which llama.cpp's converter permuted for its interleaved RoPE, are put back in
  Hugging Face's rotate-half order as they are read (`gguf_names.unpermute_index`).
- Norms, biases and other vectors are dequantized to float32 (a few kilobytes a layer); Gemma's norms
  are stored as 1 + w and read back as w, as transformers' GGUF loader does.
- The memory check adds the weights at the chosen precision, the KV cache at the context size and the
  RoPE tables, and compares them with what the system says is available (`available_bytes`), before
  anything is allocated.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

import numpy as np
import torch

from yue.errors import CheckpointError
from yue.model import gguf_names as names
from yue.model.gguf_file import GGUFFile

logger = logging.getLogger("yue")

# Runtime memory beyond weights and cache (torch and the process, activations, logits): a margin, not a
# measurement of any one model.
OVERHEAD_BYTES = 400 * 2**20
MATRICES = ("attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down")
FLOAT_TYPES = (0, 1, 30)  # F32, F16, BF16: dequantized exactly, whatever the precision


class InsufficientMemoryError(CheckpointError):
    """A model that will not fit in the memory available; the message says what to change."""


def hf_config(g: GGUFFile):
    """The transformers config of the file's family (`gguf_names.config_from_gguf`), its vocabulary the token
    table's rows."""
    rope_freqs = g.dequantized(names.ROPE_FREQS).reshape(-1) if names.ROPE_FREQS in g.tensors else None
    config = names.config_from_gguf(g.metadata, set(g.tensors), g.path, rope_freqs)
    if "token_embd.weight" not in g.tensors:
        raise CheckpointError(f"{g.path}: no token_embd.weight tensor")
    config.vocab_size = g.tensors["token_embd.weight"].shape[0]
    return config


def check_shapes(g: GGUFFile, config) -> None:
    """Every matrix's shape against the metadata's (`config`), naming the first that differs."""
    D, F, L = config.hidden_size, config.intermediate_size, config.num_hidden_layers
    H, Hkv, Dh = config.num_attention_heads, config.num_key_value_heads, config.head_dim
    want = {"token_embd.weight": (config.vocab_size, D), "output_norm.weight": (D,)}
    if "output.weight" in g.tensors:
        want["output.weight"] = (config.vocab_size, D)
    shapes = {
        "attn_q": (H * Dh, D),
        "attn_k": (Hkv * Dh, D),
        "attn_v": (Hkv * Dh, D),
        "attn_output": (D, H * Dh),
    }
    shapes |= {"ffn_gate": (F, D), "ffn_up": (F, D), "ffn_down": (D, F), "attn_norm": (D,)}
    for i in range(L):
        want |= {f"blk.{i}.{part}.weight": shape for part, shape in shapes.items()}
    for name, shape in want.items():
        info = g.tensors.get(name)
        if info is None:
            raise CheckpointError(f"{g.path}: tensor {name} is missing (the metadata says {L} layers)")
        if info.shape != shape:
            raise CheckpointError(
                f"{g.path}: tensor {name} has shape {list(info.shape)}, but the metadata implies {list(shape)}"
            )
    extra = sorted(n for n in g.tensors if n.startswith("blk.") and int(n.split(".")[1]) >= L)
    if extra:
        raise CheckpointError(f"{g.path}: tensor {extra[0]} is past the metadata's {L} layers")


def weight_bytes(g: GGUFFile, precision: str) -> int:
    """The AR set's bytes in memory at `precision` ("file": the file's; "float32": 4 a value)."""
    if precision == "file":
        return sum(t.nbytes for t in g.tensors.values())
    return sum(4 * int(np.prod(t.shape)) for t in g.tensors.values())


def cache_bytes(config, ctx_size: int) -> int:
    """A one-request float32 KV cache of `ctx_size` positions, and the RoPE tables (cos and sin)."""
    kv = 2 * config.num_hidden_layers * config.num_key_value_heads * config.head_dim * ctx_size * 4
    return kv + 2 * ctx_size * config.head_dim * 4


def available_bytes() -> int | None:
    """Memory this process may still take: the system's MemAvailable, or less under a cgroup limit."""
    try:
        info = dict(line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())
        free = int(info["MemAvailable"].split()[0]) * 1024
    except (OSError, KeyError, ValueError):
        return None
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            free = min(free, int(limit) - used)
    except (OSError, ValueError):
        pass
    return free


def check_memory(g: GGUFFile, config, precision: str, ctx_size: int) -> None:
    """Raise `InsufficientMemoryError` before loading where weights + cache will not fit."""
    weights, cache = weight_bytes(g, precision), cache_bytes(config, ctx_size)
    need = weights + cache + OVERHEAD_BYTES
    free = available_bytes()
    if os.environ.get("YUE_MEMORY_AVAILABLE"):  # tests and operators may state the budget
        free = int(os.environ["YUE_MEMORY_AVAILABLE"])
    if free is None or need <= free:
        return
    gib = 2**30
    hints = [f"a smaller --ctx-size (now {ctx_size})"] if cache > weights / 8 else []
    if precision != "file":
        hints.append(f"the file's own precision ({weight_bytes(g, 'file') / gib:.1f} GiB of weights)")
    hints = hints or ["a smaller model or a machine with more memory"]
    raise InsufficientMemoryError(
        f"{g.path.name} needs ~{need / gib:.1f} GiB ({weights / gib:.1f} GiB of {precision} weights, "
        f"{cache / gib:.2f} GiB of KV cache at ctx {ctx_size}), but {free / gib:.1f} GiB is available; "
        f"try {' or '.join(hints)}"
    )


def vector_state(g: GGUFFile, config) -> dict[str, torch.Tensor]:
    """Every tensor that is not a matrix of a layer or the token table, as float32 under the family's
    transformers names (Gemma's 1 + w norms read back as w)."""
    arch, out = config.model_type, {}
    for name in g.tensors:
        if name == names.ROPE_FREQS or name in ("token_embd.weight", "output.weight"):
            continue
        if name.startswith("blk.") and name.split(".")[2] in MATRICES and name.endswith(".weight"):
            continue
        hf = names.hf_name(name, arch)
        if hf is None:
            raise CheckpointError(f"{g.path}: tensor {name} is not part of a {arch}")
        values = g.dequantized(name)
        if arch == "gemma3_text" and hf.endswith("norm.weight"):
            values = values - 1
        out[hf] = torch.from_numpy(np.ascontiguousarray(values, np.float32))
    return out


def float32_state(g: GGUFFile, config) -> dict[str, torch.Tensor]:
    """The whole AR set dequantized to float32 (the `float32` precision), with a progress bar."""
    from tqdm.auto import tqdm

    arch, state = config.model_type, vector_state(g, config)
    matrices = [n for n in g.tensors if names.hf_name(n, arch) not in state and n != names.ROPE_FREQS]
    for name in tqdm(
        matrices, desc=f"dequantizing {g.path.name} to float32", unit="tensor", leave=False, disable=None
    ):
        values = g.dequantized(name)
        hf = names.hf_name(name, arch)
        if arch == "llama" and hf.endswith(("q_proj.weight", "k_proj.weight")):
            heads = config.num_attention_heads if "q_proj" in hf else config.num_key_value_heads
            values = values[names.unpermute_index(values.shape[0], heads)]
        state[hf] = torch.from_numpy(np.ascontiguousarray(values))
    return state
