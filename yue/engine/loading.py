"""Loading a model into an Engine: `load` (a name, a folder or a .gguf), `load_from` (the CLI's
`LoadConfig`), and `load_unprepared` (as stored, for training commands). docs/architecture.md,
"Loading, top to bottom", names each step.

The precisions `load(dtype=...)` takes:
- None / "auto": a .gguf file's own ("file") on a CPU where yue's kernels build; else "float32".
- "file": a GGUF's AR set in the file's own codes, each matrix in its ggml block format on yue's
  kernels for it, activations quantized to int8 as llama.cpp does: no conversion, about the file's
  memory (`gguf_load`).
- "float32": as saved, a GGUF's values dequantized.
- "bfloat16" / torch.bfloat16, a separate, named precision: weights and activations in bfloat16 (as
  `LlamaForCausalLM` in bfloat16), attention and KV cache in float32 on a CPU; `ar` and `verified` are
  exact against each other in it (`prepare.py`).
- "int4" (CPU), another named precision: the AR layers' weights in 4 bits per group of 32 (a Q4_1
  GGUF's own codes) on activations quantized to int8 per group of 32 (yue's row kernel, as llama.cpp's
  Q4_1 x Q8_1), the head float32; where that kernel does not build, on bfloat16 activations (torch's
  int4pack), the head bfloat16; `ar` and `verified` exact against each other too (`matmuls.int4_matmul`).

`low_memory` (float32 on a CPU) holds each AR matmul's weight once. With yue's row kernel
(`matmuls.StreamedLinear`) the layers do anyway and the head keeps only its input-major copy, the
embedding table (yue-smol: ~0.1 GB less, verifying rows dearer); without it, not twice (an input-major
copy for one-row steps and a packed one for verifying rows): yue-smol ~0.4 GB less, and one of the two
step kinds gets slower (which, by CPU: `kernels.KernelChoice.float32_one_copy`; README, Portability).
`ar` and `verified` stay exact against each other.
"""

from __future__ import annotations

from pathlib import Path

import torch

from yue.chat import find_chat_template
from yue.config import LoadConfig, YueConfig
from yue.decode.corpus import load_ngrams
from yue.engine.core import Engine
from yue.kernels import float_codes, prepare_for_decoding
from yue.kernels.file_codes import install_file_codes
from yue.kernels.matmuls import int4_unavailable
from yue.kernels.prepare import resolve_drafting_dtype, resolve_dtype
from yue.kernels.prepare_codes import ggml_unavailable
from yue.model.adapters import apply_adapter
from yue.model.hf import CheckpointError, ModelFiles, load_model, model_files
from yue.model.mot import YueForCausalLM
from yue.registry import model_name, resolve
from yue.settings import DEFAULT_CTX_SIZE
from yue.tokenizer import YueTokenizer


def load(
    path: str | Path | None = None,
    device: str = "cpu",
    dtype: torch.dtype | str | None = None,
    nar_dtype: torch.dtype | str | None = "auto",
    adapter: str | Path | None = None,
    low_memory: bool = False,
    ctx_size: int | None = DEFAULT_CTX_SIZE,
    threads: int | None = None,
) -> Engine:
    """Load a model (default: `registry.DEFAULT_MODEL`) into an Engine.

    Args:
        path: a shipped model's name ("yue-smol", "yue-code-mini"), a model folder (a yue folder, or a
            Llama folder with safetensors + tokenizer.json), or a .gguf file (converted once and cached,
            `model/gguf.py`); None = the default model.
        device: "cpu", "cuda", "cuda:N" or "auto" (CUDA when available).
        dtype: the precision the model runs in: None / "auto", "file", "float32", "bfloat16", "int4"
            (the module docstring says what each is).
        nar_dtype: the drafting weights' precision (NAR set, slot rows' head; `prepare.py`): "auto" (int8
            on a CPU with torch's int8 engine, else as loaded), "int8" / torch.qint8, "bfloat16" /
            torch.bfloat16, "float32" / None (as loaded). `ar`/`verified` output is the same whatever it
            is; `hybrid`/`nar` commit drafts, so theirs may shift slightly.
        adapter: a `yue finetune` adapter folder: its LoRA is merged into the AR set and its refreshed
            drafts applied (`model/adapters.py`); it must have been trained on this model.
        low_memory: float32 on a CPU: hold each AR matmul's weight once (the module docstring).
        ctx_size, threads: the context to allocate for (capped at the model's own) and torch's threads.
    Raises:
        CheckpointError: an unknown name, missing, truncated or corrupt files (the message names the
            file), or an adapter for another base model (`AdapterError`, naming the mismatch).
        ModelNotInstalledError: a named model whose weights come from a package that is not installed.
        ValueError: an unavailable device, a bad ctx_size or threads, or the file precision without a
            GGUF or off the CPU.
        InsufficientMemoryError: a GGUF that will not fit in the memory available (what it needs, what
            is free, what to change).
    """
    device = checked_device(device)
    drafting = resolve_drafting_dtype(nar_dtype, device)  # bad names fail before any loading
    for name, value in (("ctx_size", ctx_size), ("threads", threads)):
        if value is not None and (not isinstance(value, int) or value < 1):
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if threads is not None:
        torch.set_num_threads(threads)
    source = resolve(path)
    files = model_files(source)
    precision = file_or_named_precision(dtype, files, device)
    if precision == "int4" and (why := int4_unavailable(device)):
        raise ValueError(f"the int4 precision needs {why}")
    dtype, codes = (None, install_file_codes) if precision == "file" else (resolve_dtype(precision), None)
    if codes is None and from_codes(files, precision, device, adapter):
        codes = float_codes.install_float_codes  # the layers' kernels built from the file's blocks
    model = load_model(files, device=device, dtype=dtype, file_codes=codes, ctx_size=ctx_size)
    if codes is float_codes.install_float_codes:
        float_codes.tie_head(model)
    tokenizer = model_tokenizer(files.tokenizer_dir, model.config)
    model = apply_adapter(model, adapter)
    drafting = drafting if model.config.nar_layers != 0 else None
    model = prepare_for_decoding(model, drafting, int4=precision == "int4", low_memory=low_memory)
    template = find_chat_template(files.yue_dir or files.tokenizer_dir, default=None)
    corpus = load_ngrams(files.yue_dir, model.config.vocab_size)
    source = None if adapter is not None else source  # an adapter's merge is not in the files
    return Engine(model, tokenizer, model_name(path), template, corpus, source)


def from_codes(files: ModelFiles, precision: str, device: str, adapter) -> bool:
    """Whether a float32 or int4 load of a GGUF's AR set keeps the file's codes until preparing builds the
    kernels from them (`kernels.float_codes`): on a CPU where yue's row kernel builds, without an adapter
    (whose merge needs the float weights)."""
    on_cpu = files.gguf is not None and device == "cpu" and adapter is None
    return on_cpu and precision in ("float32", "int4") and not ggml_unavailable()


def checked_device(device: str) -> str:
    """`load`'s device: "auto" made "cuda" where CUDA is available, else "cpu".

    Raises:
        ValueError: CUDA asked for where it is not available, or not a device name.
    """
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if str(device).startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} requested but CUDA is not available")
    if device != "cpu" and not str(device).startswith("cuda"):
        raise ValueError(f"device must be 'cpu', 'cuda[:N]' or 'auto', got {device!r}")
    return device


def file_or_named_precision(
    dtype: torch.dtype | str | None, files: ModelFiles, device: str
) -> torch.dtype | str:
    """The precision `load` runs: "auto" / None is a lone GGUF's own ("file") on a CPU where yue's
    kernels build, else "float32"; "file" is checked to apply (a GGUF, the CPU, the kernels).

    Raises:
        ValueError: "file" without a GGUF, off the CPU, or where the kernels do not build.
    """
    if dtype not in (None, "auto", "file"):
        return dtype
    why = ""
    if files.gguf is None:
        why = "a model whose AR set is a GGUF file"
    elif device != "cpu":
        why = "the CPU (on a GPU load float32 or bfloat16)"
    elif reason := ggml_unavailable():
        why = f"yue's kernels ({reason})"
    if dtype == "file" and why:
        raise ValueError(f"the file precision needs {why}")
    if dtype == "file" or (not why and files.yue_dir is None):
        return "file"
    return "float32"


def load_from(config: LoadConfig) -> Engine:
    """`load` with its options as one `LoadConfig` (the CLI's loading options)."""
    return load(
        config.model,
        device=config.device,
        dtype=config.dtype,
        nar_dtype=config.draft_dtype,
        adapter=config.adapter,
        low_memory=config.low_memory,
        ctx_size=config.ctx_size or DEFAULT_CTX_SIZE,
        threads=config.threads,
    )


def load_unprepared(
    path: str | Path | None = None, device: str = "cpu", dtype: torch.dtype | None = None
) -> tuple[YueForCausalLM, YueTokenizer, ModelFiles]:
    """A model as stored (trainable: not prepared for decoding), its tokenizer and where its files
    are; `path` as `load` takes it. Training commands (`finetune`, `merge`) start from this."""
    files = model_files(resolve(path))
    model = load_model(files, device=device, dtype=dtype)
    return model, model_tokenizer(files.tokenizer_dir, model.config), files


def model_tokenizer(folder: str | Path, config: YueConfig) -> YueTokenizer:
    """The tokenizer in `folder`, with the special ids of a model of `config`.

    Raises:
        CheckpointError: a missing or corrupt tokenizer (named).
    """
    eos = config.eos_token_id[0] if isinstance(config.eos_token_id, list) else config.eos_token_id
    ids = {
        "pad": config.pad_token_id if config.pad_token_id is not None else eos,
        "bos": config.bos_token_id,
        "eos": eos,
        "mask": config.mask_token_id,
    }
    try:
        return YueTokenizer.load(folder, special_ids=ids)
    except (FileNotFoundError, ValueError) as e:
        raise CheckpointError(str(e)) from e
