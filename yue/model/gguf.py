"""A GGUF file of a family yue runs (llama, qwen2, qwen3, gemma3) -> a Hugging Face folder of that family
(Llama, Qwen2, Qwen3, Gemma 3), converted once and cached by content hash.

Design decisions:
- The cache is keyed by the GGUF's sha256 (`<root>/gguf/<first 16 hex>/`, root `$YUE_CACHE_DIR` or
  `~/.cache/yue`), so a renamed or moved file reuses its conversion and an updated one never does.
- A conversion is written into a temporary folder beside the cache and renamed into place at the end,
  with a manifest (the source's sha256 and size, each written file's size and sha256) written last:
  an interrupted conversion leaves no folder that looks complete. Every load re-hashes the files
  (sha256 is fast next to loading a model: docs/results-log.md); a folder that fails the check is
  rebuilt with a warning, never trusted.
- Values are the GGUF's own: each tensor is dequantized by `gguf.quants` (llama.cpp's reference Python
  dequantizers) to float32, once, here (F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K, Q6_K, and any
  other type it reads); then what llama.cpp's converter did is undone exactly as transformers' GGUF
  loader undoes it: a Llama's Q/K row permutation (`LlamaTensorProcessor._reverse_permute_weights`),
  Gemma's norm weights stored as 1 + w (`Gemma2TensorProcessor`: minus 1, in float32). Names are the
  family's transformers names, so the folder loads with `from_pretrained` as well as into yue's AR set.
  Which of the dequantized weights then run from codes on yue's row kernel is found there, by value
  (`rowkernel.q4_block`, `q8_block`); the conversion logs the file's types.
- Metadata and the tensor table are read through `gguf_file.GGUFFile` (the `gguf` package's reader,
  its index cached per file version). This module converts a GGUF into a Hugging Face folder for the
  training commands (`yue distill`, the NAR-set recipes), which start from a transformers checkpoint;
  `yue.load` reads a GGUF straight into the model instead (`gguf_load`). The tokenizer is transformers' own GGUF conversion
  (`AutoTokenizer.from_pretrained(..., gguf_file=...)`) saved as tokenizer.json + tokenizer_config.json
  (chat template, add_bos_token, special tokens), so encoding equals transformers' by construction.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import shutil
import tempfile
from pathlib import Path
from typing import NamedTuple

import numpy as np
import torch
from safetensors.torch import save_file
from transformers import AutoConfig, GenerationConfig, PreTrainedConfig

from yue.errors import CheckpointError
from yue.model.gguf_file import GGUFFile
from yue.registry import cache_root

logger = logging.getLogger("yue")

MANIFEST = "manifest.json"
FORMAT = 2  # bump when the converter's output changes; older folders are then rebuilt

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


def file_sha256(path: str | Path, chunk: int = 1 << 22) -> str:
    """Hex sha256 of a file's bytes, read in 4 MiB chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def source_sha256(folder: str | Path) -> str | None:
    """The sha256 of the GGUF a cached folder was converted from (None if it has no manifest)."""
    try:
        return json.loads((Path(folder) / MANIFEST).read_text())["source"]["sha256"]
    except (OSError, ValueError, KeyError, TypeError):
        return None


def convert_gguf(gguf_path: str | Path, cache_dir: str | Path | None = None) -> Path:
    """The cached Hugging Face Llama folder converted from `gguf_path`, converting it first if needed.

    Args:
        gguf_path: a Llama-architecture GGUF file (F32/F16/BF16 or any block type `gguf.quants` reads).
        cache_dir: cache root (default `$YUE_CACHE_DIR` or `~/.cache/yue`); the folder is
            `<root>/gguf/<sha256[:16]>/`.
    Returns:
        The folder: config.json (LlamaConfig), model.safetensors (float32, LlamaForCausalLM's names),
        tokenizer.json, tokenizer_config.json, generation_config.json, manifest.json.
    Raises:
        CheckpointError: the file is missing, not a GGUF, or not a Llama this converter supports.
    """
    gguf_path = Path(gguf_path)
    if not gguf_path.is_file():
        raise CheckpointError(f"GGUF file not found: {gguf_path}")
    sha = file_sha256(gguf_path)
    parent = cache_root(cache_dir) / "gguf"
    folder = parent / sha[:16]
    if folder.exists():
        problem = _cache_problem(folder, sha, gguf_path.stat().st_size)
        if problem is None:
            return folder
        logger.warning(
            "cached conversion %s is unusable (%s); converting %s again", folder, problem, gguf_path
        )
        shutil.rmtree(folder, ignore_errors=True)
    parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{sha[:16]}-", dir=parent))
    try:
        logger.warning("converting %s once into %s (float32)", gguf_path, folder)
        _convert(gguf_path, tmp)
        _write_manifest(tmp, gguf_path, sha)
        try:
            os.rename(tmp, folder)
        except OSError:  # another process finished the same conversion first: use theirs if sound
            if _cache_problem(folder, sha, gguf_path.stat().st_size) is not None:
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return folder


def _cache_problem(folder: Path, sha: str, size: int) -> str | None:
    """Why a cached folder cannot be used (None: it is complete and unchanged)."""
    try:
        manifest = json.loads((folder / MANIFEST).read_text())
    except (OSError, ValueError) as e:
        return f"no readable {MANIFEST}: {e}"
    if manifest.get("format") != FORMAT:
        return f"converter format {manifest.get('format')} != {FORMAT}"
    if manifest.get("source", {}).get("sha256") != sha or manifest["source"].get("size") != size:
        return "converted from a different file"
    for name, entry in manifest.get("files", {}).items():
        file = folder / name
        if not file.is_file() or file.stat().st_size != entry["size"]:
            return f"{name} is missing or has the wrong size"
        if file_sha256(file) != entry["sha256"]:
            return f"{name} does not match its recorded sha256"
    return None


def _write_manifest(folder: Path, gguf_path: Path, sha: str) -> None:
    files = {
        p.name: {"size": p.stat().st_size, "sha256": file_sha256(p)}
        for p in sorted(folder.iterdir())
        if p.is_file()
    }
    manifest = {
        "format": FORMAT,
        "source": {"path": str(gguf_path.resolve()), "sha256": sha, "size": gguf_path.stat().st_size},
        "files": files,
    }
    (folder / MANIFEST).write_text(json.dumps(manifest, indent=1))


def _convert(gguf_path: Path, out: Path) -> None:
    """Write the Hugging Face folder for `gguf_path` into `out` (config, weights, tokenizer)."""
    from gguf import GGMLQuantizationType, quants

    metadata, tensors = read_tensors(gguf_path)
    names = {t.name for t in tensors}
    rope_freqs = None
    if ROPE_FREQS in names:  # llama.cpp's form of Llama 3's RoPE scaling: a factor per frequency
        info = next(t for t in tensors if t.name == ROPE_FREQS)
        rope_freqs = quants.dequantize(np.asarray(info.data), GGMLQuantizationType(info.ggml_type)).reshape(
            -1
        )
    config = config_from_gguf(metadata, names, gguf_path, rope_freqs)
    types = sorted({GGMLQuantizationType(t.ggml_type).name for t in tensors})
    logger.warning(
        "%s: a %s, its %s tensors dequantized once to float32",
        gguf_path.name,
        config.model_type,
        "/".join(types),
    )
    save_file(
        _state_dict(tensors, config, gguf_path), str(out / "model.safetensors"), metadata={"format": "pt"}
    )
    config.save_pretrained(str(out))
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(out))
    _save_tokenizer(gguf_path, out)


class GgufTensor(NamedTuple):
    """One tensor of a GGUF file: its name, shape (torch order), ggml type and bytes (a memory map)."""

    name: str
    shape: tuple[int, ...]
    ggml_type: int
    data: np.ndarray


def read_tensors(gguf_path: Path) -> tuple[dict, list[GgufTensor]]:
    """A GGUF file's metadata (long arrays such as the vocabulary as their lengths) and its tensors, none
    of them read yet (`gguf_file.GGUFFile`: the `gguf` package's reader, its index cached).

    Raises:
        CheckpointError: not a GGUF file, a truncated one, or a tensor of a ggml type the `gguf`
            package does not know (`GGUFFile.open`).
    """
    g = GGUFFile.open(gguf_path)
    tensors = [GgufTensor(t.name, t.shape, t.ggml_type, g.mapped(t.name).numpy()) for t in g.tensors.values()]
    return g.metadata, tensors


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


def unpermute_rows(w: np.ndarray, n_head: int) -> np.ndarray:
    """Undo llama.cpp's Q/K row permutation (its converter's `permute`), per head: GGML's interleaved
    rotary pairs back to Hugging Face's rotate-half order. (out, in) -> (out, in); exactly transformers'
    `LlamaTensorProcessor._reverse_permute_weights`."""
    return w.reshape(n_head, w.shape[0] // n_head // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


def _state_dict(tensors: list[GgufTensor], config: PreTrainedConfig, source: Path) -> dict[str, torch.Tensor]:
    """Every tensor dequantized to float32 under the family's transformers names, with a progress bar."""
    from gguf import GGMLQuantizationType, quants
    from tqdm.auto import tqdm

    arch = config.model_type
    tensors = [t for t in tensors if t.name != ROPE_FREQS]  # read into the config
    unknown = sorted(t.name for t in tensors if hf_name(t.name, arch) is None)
    if unknown:
        raise CheckpointError(f"{source}: tensors a {arch} does not have: {', '.join(unknown[:5])}")
    out = {}
    for info in tqdm(tensors, desc=f"converting {source.name}", unit="tensor"):
        data = np.asarray(info.data)  # the file's bytes (a memory map)
        values = quants.dequantize(data, GGMLQuantizationType(info.ggml_type)).reshape(info.shape)
        name = hf_name(info.name, arch)
        if arch == "llama" and name.endswith("q_proj.weight"):  # only llama.cpp's Llama permutes them
            values = unpermute_rows(values, config.num_attention_heads)
        elif arch == "llama" and name.endswith("k_proj.weight"):
            values = unpermute_rows(values, config.num_key_value_heads)
        elif arch == "gemma3_text" and name.endswith("norm.weight"):  # stored as 1 + w
            values = values.astype(np.float32) - 1
        out[name] = torch.from_numpy(np.require(values, np.float32, ["C", "W"]))  # a copy only if needed
    return out


def _save_tokenizer(gguf_path: Path, out: Path) -> None:
    """transformers' tokenizer for the GGUF, saved with its chat template inside tokenizer_config.json."""
    from transformers import AutoTokenizer
    from transformers.utils import logging as hf_logging

    verbosity = hf_logging.get_verbosity()
    hf_logging.set_verbosity_error()  # it reports every metadata key it does not use
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    except (ValueError, OSError, KeyError) as e:
        raise CheckpointError(f"{gguf_path}: cannot build its tokenizer: {e}") from e
    finally:
        hf_logging.set_verbosity(verbosity)
    tokenizer.save_pretrained(str(out), save_jinja_files=False)
