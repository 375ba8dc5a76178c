"""Hugging Face integration: Auto* registration, safe loading, AR-set export and Llama import.

Design decisions:
- The AR set's parameter names are `LlamaForCausalLM`'s, so export is a filter on the state dict
  (drop `nar_*` and `router.*`) and import is the same filter read the other way.
- Loading goes through `from_pretrained(use_safetensors=True)` after checking the files ourselves, so
  a missing, truncated or corrupt checkpoint fails with a message naming the file, and no pickle
  (`*.bin`) is ever read.
- A model may come in parts (`model_files`): a yue folder whose ar_source.json names a GGUF (the AR
  set, converted once by `gguf.py`) and which holds the rest; or a plain Llama folder or GGUF file,
  loaded as an AR set alone (`nar_layers=0`). `assemble` builds the model on the meta device and
  assigns the tensors (no copy, no random init), after checking that the parts give every parameter
  exactly once.
"""

from __future__ import annotations

import json
import math
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from accelerate import init_empty_weights
from safetensors import safe_open
from torch import nn
from transformers import AutoConfig, AutoModelForCausalLM, LlamaConfig, LlamaForCausalLM
from transformers.initialization import no_init_weights
from transformers.utils import logging as hf_logging

from yue.config import YueConfig
from yue.errors import CheckpointError
from yue.model import gguf_load
from yue.model.family import FAMILIES, yue_fields
from yue.model.gguf_file import GGUFFile
from yue.model.mot import YueForCausalLM
from yue.model.prepared import PreparedModel
from yue.registry import ar_source

AutoConfig.register("yue", YueConfig, exist_ok=True)
# Installs a GGUF's own codes into a meta-device model: (model, file, its transformers config, the
# vector state, from which it takes the matrices' biases) -> None (`yue.kernels.file_codes`).
FileCodes = Callable[[YueForCausalLM, GGUFFile, object, dict], None]
AutoModelForCausalLM.register(YueConfig, YueForCausalLM, exist_ok=True)


def is_nar_or_router(name: str) -> bool:
    """Entries outside the AR set's checkpoint: the NAR set, the router, the slot entry and the
    drafting vocabulary."""
    return name.startswith(("router.", "draft_vocab", "model.slot_entry.")) or ".nar_" in name


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
    weights = weight_files(path)
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


@dataclass(frozen=True)
class ModelFiles:
    """Where one model's parts are.

    Attributes:
        yue_dir: the yue folder (YueConfig, NAR set, router); None for a plain Llama loaded as an AR set.
        ar_dir: the Llama folder holding the AR set when yue_dir does not (a Llama folder, a converted
            GGUF), else None.
        tokenizer_dir: the folder whose tokenizer.json (and tokenizer_config.json) the model uses.
        gguf: the GGUF file holding the AR set (a .gguf loaded alone, or a yue folder's ar_source), read
            straight into the model (`gguf_load`); None where the AR set is in a folder.
    """

    yue_dir: Path | None
    ar_dir: Path | None
    tokenizer_dir: Path
    gguf: Path | None = None


def model_files(path: str | Path) -> ModelFiles:
    """Find a model's parts: a yue folder (its AR set inside, or named by its ar_source.json), a plain
    Llama folder, or a .gguf file (converted once into a cached Llama folder, `gguf.py`).

    Raises:
        CheckpointError: a missing, corrupt or unsupported folder or file (named in the message).
        ModelNotInstalledError: an ar_source.json naming a package that is not installed.
    """
    path = Path(path)
    if path.is_file() and path.suffix.lower() == ".gguf":
        return ModelFiles(None, None, GGUFFile.open(path).tokenizer_dir(), path)
    path = check_checkpoint(path)
    model_type = json.loads((path / "config.json").read_text()).get("model_type")
    if model_type in FAMILIES:
        return ModelFiles(None, path, path)
    if model_type != "yue":
        raise CheckpointError(
            f"{path / 'config.json'}: model_type {model_type!r} is not supported ('yue' or one of "
            f"{', '.join(FAMILIES)})"
        )
    source = ar_source(path)
    if source is None:
        return ModelFiles(path, None, path)
    gguf, expected = source
    if gguf.is_dir():  # a Hugging Face folder (`ar_path`)
        return ModelFiles(path, gguf, path if (path / "tokenizer.json").is_file() else gguf)
    opened = GGUFFile.open(gguf)
    if expected is not None and opened.sha256() != expected:
        raise CheckpointError(
            f"{path.name}'s NAR set was trained over a GGUF with sha256 {expected[:16]}..., but {gguf} "
            f"has {opened.sha256()[:16]}... (another version of its package?)"
        )
    tokenizer = path if (path / "tokenizer.json").is_file() else opened.tokenizer_dir()
    return ModelFiles(path, None, tokenizer, gguf)


def load_model(
    path: str | Path | ModelFiles,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = None,
    file_codes: FileCodes | None = None,
    ctx_size: int | None = None,
) -> YueForCausalLM:
    """Load a model onto `device`, in eval mode: a yue folder (safetensors only; its AR set inside or
    from the GGUF its ar_source.json names), a plain Llama folder or a .gguf file (an AR set only:
    `nar_layers=0`), or the parts `model_files` found.

    Args:
        file_codes: for a GGUF's AR set in the file's own codes (the `file` precision), the function
            that installs them (`yue.kernels.file_codes.install_file_codes`: the kernels' floor, so
            handed in); None: dequantized to `dtype`.
        ctx_size: the model's context (positions: RoPE tables, the KV cache's limit), capped at the
            model's own; None keeps the model's.
    """
    files = path if isinstance(path, ModelFiles) else model_files(path)
    if files.ar_dir is None and files.gguf is None:
        model = _from_pretrained(files.yue_dir, dtype, ctx_size)
    else:
        model = assemble(files, dtype, file_codes, ctx_size)
    return model.to(device).eval()


def _from_pretrained(path: Path, dtype: torch.dtype | None, ctx_size: int | None = None) -> YueForCausalLM:
    """A yue folder that holds all its weights, through transformers' loader."""
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()  # a per-load "Loading weights" bar is noise on a CLI's stdout
    config = YueConfig.from_pretrained(str(path)) if (path / "config.json").is_file() else None
    if config is not None and ctx_size is not None:
        config.max_position_embeddings = min(ctx_size, config.max_position_embeddings)
    try:
        extra = {} if config is None else {"config": config}
        model = AutoModelForCausalLM.from_pretrained(str(path), use_safetensors=True, dtype=dtype, **extra)
    except (OSError, ValueError, RuntimeError) as e:
        raise CheckpointError(f"could not load the model in {path}: {e}") from e
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    if not isinstance(model, YueForCausalLM):
        raise CheckpointError(f"{path / 'config.json'} is not a yue model (model_type must be 'yue')")
    return model


def assemble(
    files: ModelFiles,
    dtype: torch.dtype | None = None,
    file_codes: FileCodes | None = None,
    ctx_size: int | None = None,
) -> YueForCausalLM:
    """A yue model whose AR set is read from `files.gguf` (`gguf_load`: in the file's codes, installed
    by `file_codes`, else dequantized) or `files.ar_dir` (a Llama folder), and everything else from
    `files.yue_dir` (None: an AR set only, `nar_layers=0`).

    The model's parameters are built on the meta device and the tensors assigned, not copied (a
    135M-parameter model loads in well under a second). Together the two sources must give every
    parameter exactly once. A GGUF's shapes are checked against its metadata, and its memory against
    what is available, before anything is allocated (`gguf_load.check_memory`).

    Raises:
        CheckpointError: shapes that disagree, or parameters missing or given twice (named);
            `gguf_load.InsufficientMemoryError` where the model will not fit.
    """
    g = None if files.gguf is None else GGUFFile.open(files.gguf)
    source = files.gguf if g is not None else check_checkpoint(files.ar_dir)
    llama = gguf_load.hf_config(g) if g is not None else AutoConfig.from_pretrained(str(source))
    check_llama(llama, source)
    if g is not None:
        gguf_load.check_shapes(g, llama)
    if files.yue_dir is None:
        config = yue_config_from_llama(llama, nar_layers=0)
    else:
        config = YueConfig.from_pretrained(str(files.yue_dir))
        _check_same_ar_shape(config, yue_config_from_llama(llama), files.yue_dir, source)
    if ctx_size is not None:
        config.max_position_embeddings = min(ctx_size, config.max_position_embeddings)
    target = dtype or torch.float32
    if g is not None:
        precision = "float32" if file_codes is None else "file"
        gguf_load.check_memory(g, llama, precision, config.max_position_embeddings)
        state = gguf_load.float32_state(g, llama) if file_codes is None else gguf_load.vector_state(g, llama)
        state = {k: v.to(target) for k, v in state.items()}
    else:
        state = _read_weights(source, target, drop_lm_head=config.tie_word_embeddings)
    if files.yue_dir is not None:
        rest = _read_weights(files.yue_dir, target)
        if twice := sorted(state.keys() & rest.keys()):
            raise CheckpointError(f"{files.yue_dir} and {source} both give {', '.join(twice[:3])}")
        state |= rest
    # Parameters on meta, buffers computed as usual, and no initialization at all: every parameter is
    # assigned below (or filled by `_fill_unused`), and transformers' init of meta tensors alone costs
    # a sixth of a small model's load.
    with init_empty_weights(include_buffers=False), no_init_weights():
        model = YueForCausalLM(config)
    if file_codes is not None:
        file_codes(model, g, llama, state)
    tied = config.tie_word_embeddings and file_codes is None
    expected = {k for k in model.state_dict() if not (k == "lm_head.weight" and tied)}
    if unexpected := sorted(state.keys() - expected):
        raise CheckpointError(f"tensors the model does not have: {', '.join(unexpected[:5])}")
    missing = sorted(expected - state.keys())
    if files.yue_dir is None:
        missing = [k for k in missing if not is_nar_or_router(k)]
    if missing:
        where = f"{files.yue_dir} and {source}" if files.yue_dir else str(source)
        raise CheckpointError(
            f"{where} leave {len(missing)} parameters without values: {', '.join(missing[:5])}"
        )
    model.load_state_dict(state, strict=False, assign=True)
    if tied:
        model.lm_head.weight = model.model.embed_tokens.weight
    _fill_unused(model, target)
    return model


def check_llama(config, folder: Path) -> None:
    """Refuse what the yue layer cannot run, naming it: a family outside `family.FAMILIES`, or a feature
    of one that the layer lacks (`family.yue_fields`)."""
    yue_fields(config, folder)


def _check_same_ar_shape(config: YueConfig, llama: YueConfig, yue_dir: Path, ar_dir: Path) -> None:
    """A yue folder's config must describe the AR set its ar_source provides, field by field (floats to
    float32 precision: a GGUF stores rms_norm_eps 1e-5 as 9.99999975e-06)."""
    for field in (*AR_SHAPE_FIELDS, "family", "layer_features"):  # the layer's family and its features too
        ours, theirs = getattr(config, field), getattr(llama, field)
        if ours != theirs and not (isinstance(ours, float) and math.isclose(ours, theirs, rel_tol=1e-6)):
            raise CheckpointError(
                f"{yue_dir / 'config.json'}: {field} = {ours}, but its AR set ({ar_dir}) has {theirs}"
            )


# Config fields that fix the AR set's shapes and numerics (an ar_source or an adapter must agree on them).
AR_SHAPE_FIELDS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "head_dim",
    "rms_norm_eps",
    "rope_theta",
    "tie_word_embeddings",
)


# A model folder's safetensors file that holds no weights: `decode/corpus.py`'s n-gram table.
NGRAMS_FILE = "ngrams.safetensors"


def weight_files(folder: Path) -> list[Path]:
    """A model folder's safetensors weights files, sorted (every *.safetensors but `NGRAMS_FILE`)."""
    return sorted(p for p in folder.glob("*.safetensors") if p.name != NGRAMS_FILE)


def _read_weights(folder: Path, dtype: torch.dtype, drop_lm_head: bool = False) -> dict[str, torch.Tensor]:
    """Every tensor of a folder's safetensors files (checked by `check_checkpoint` first), floats in
    `dtype`; integer tensors (token-id tables) as stored."""
    state = {}
    for file in weight_files(folder):
        state |= {k: v.to(dtype) if v.is_floating_point() else v for k, v in _read_unmapped(file)}
    if drop_lm_head:  # a tied head some checkpoints store anyway: the embedding is the head
        state.pop("lm_head.weight", None)
    return state


# safetensors dtype names -> torch (the format's spec; the ones a model checkpoint holds).
SAFETENSORS_DTYPES = {
    "F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
    "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8, "U8": torch.uint8,
    "BOOL": torch.bool,
}  # fmt: skip


def _read_unmapped(file: Path) -> Iterator[tuple[str, torch.Tensor]]:
    """A safetensors file's tensors, each read into memory of its own with plain reads, not mapped.

    safetensors' loaders map the file: every page read stays resident as long as the mapping lives,
    so copying the tensors out (which a model prepared for decoding needs: it replaces most weights)
    held the file and the copies at once, SmolLM2's 540 MB twice (a 1.40 GB load peak against
    0.99 GB after it, measured). Read tensor by tensor, the peak is the model's own bytes. The format
    is an 8-byte header length, a JSON header of name -> dtype, shape, byte range, then the bytes."""
    with open(file, "rb") as f:
        size = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(size))
        for name, info in header.items():
            if name == "__metadata__":
                continue
            if info["dtype"] not in SAFETENSORS_DTYPES:
                raise CheckpointError(
                    f"{file}: tensor {name} has dtype {info['dtype']}, which yue does not load"
                )
            start, end = info["data_offsets"]
            t = torch.empty(info["shape"], dtype=SAFETENSORS_DTYPES[info["dtype"]])
            f.seek(8 + size + start)
            if (
                end - start != t.numel() * t.element_size()
                or f.readinto(t.view(-1).view(torch.uint8).numpy()) != end - start
            ):
                raise CheckpointError(f"corrupt or truncated weights file {file} (tensor {name})")
            yield name, t


def _fill_unused(model: YueForCausalLM, dtype: torch.dtype) -> None:
    """Give values to the parameters an AR-only model (nar_layers=0) has but never uses: NAR-set
    tensors alias the AR set's (no memory), the rest (the router) are zeros. Without a NAR set in the
    stack (YueConfig.nar_layers honoured by mot.py) only the router is left here."""
    ar = dict(model.named_parameters())
    for name, param in list(model.named_parameters()):
        if not param.is_meta:
            continue
        module_name, _, attr = name.rpartition(".")
        module = model.get_submodule(module_name)
        twin = ar.get(name.replace(".nar_", "."))
        if ".nar_" in name and twin is not None and not twin.is_meta:
            value = twin
        else:
            value = nn.Parameter(torch.zeros(param.shape, dtype=dtype), requires_grad=param.requires_grad)
        setattr(module, attr, value)


def llama_config_from(config: YueConfig) -> LlamaConfig:
    """The `LlamaConfig` whose model has exactly our AR set's shapes (and Llama 3's RoPE scaling).

    Raises:
        ValueError: an AR set of another family (`config.family`): not a Llama's layer.
    """
    features = config.layer_features
    if config.family != "llama" or features.to_dict().keys() - {"llama3_rope"}:
        raise ValueError(
            f"the AR set is a {config.family}, not a Llama: it does not export as LlamaForCausalLM"
        )
    rope = {"rope_type": "default", "rope_theta": config.rope_theta}
    if features.llama3_rope is not None:
        factor, low, high, original = features.llama3_rope
        rope |= dict(
            rope_type="llama3",
            factor=factor,
            low_freq_factor=low,
            high_freq_factor=high,
            original_max_position_embeddings=original,
        )
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
        rope_parameters=rope,
        tie_word_embeddings=config.tie_word_embeddings,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def ar_state_dict(model: YueForCausalLM) -> dict[str, torch.Tensor]:
    """The AR set (plus shared embedding, final norm, head) under Llama's names."""
    return {k: v for k, v in model.state_dict().items() if not is_nar_or_router(k)}


def export_ar(
    model: YueForCausalLM | PreparedModel, out_dir: str | Path, tokenizer_file: str | Path | None = None
) -> Path:
    """Write the AR set as a plain `LlamaForCausalLM` checkpoint (safetensors) to `out_dir`; a
    PreparedModel's trained weights (same values, whatever their storage).

    Raises:
        ValueError: a model prepared for decoding whose AR layers are held only packed
            (`prepare.release_unpacked`): export the model as loaded (`engine.load_unprepared`).
    """
    out_dir = Path(out_dir)
    model = model.trained if isinstance(model, PreparedModel) else model
    if any(w.numel() == 0 for w in ar_state_dict(model).values()):  # released (`release_unpacked`)
        raise ValueError(
            "this model was prepared for decoding and holds its AR layers only packed; "
            "export the AR set from the model as stored (yue.engine.load_unprepared)"
        )
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
    if mask_token_id is None:
        mask_token_id = lc.pad_token_id if lc.pad_token_id is not None else lc.eos_token_id
    config = yue_config_from_llama(lc, block_size=block_size, mask_token_id=mask_token_id, **overrides)
    model = YueForCausalLM(config).to(llama.dtype)
    src = llama.state_dict()
    state = model.state_dict()
    for name in state:
        ar_name = name.replace(".nar_", ".") if ".nar_" in name else name
        if ar_name in src:
            state[name] = src[ar_name].clone()
    model.load_state_dict(state)
    return model


def yue_config_from_llama(lc, **overrides) -> YueConfig:
    """The YueConfig whose AR set has exactly a Llama-family config's shapes, token ids and family
    features (`family.yue_fields`: Llama, Qwen2, Qwen3, Gemma 3, Mistral).

    Args:
        lc: a transformers config of one of `family.FAMILIES`.
        overrides: further YueConfig fields (block_size, mask_token_id, nar_layers, ...). The mask id
            defaults to the pad id, else the EOS id: an AR-only model never feeds it, and a NAR set
            learns the embedding it gives slots.
    """
    return YueConfig(**(yue_fields(lc) | overrides))
