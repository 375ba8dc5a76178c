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
  The values are `gguf_load.float32_state`'s and the names and config `gguf_names`' (shared with the
  straight load); the conversion logs the file's types.
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
import os
import shutil
import tempfile
from pathlib import Path

from safetensors.torch import save_file
from transformers import GenerationConfig

from yue.errors import CheckpointError
from yue.model import gguf_load
from yue.model.gguf_file import GGUFFile, save_tokenizer
from yue.registry import cache_root

logger = logging.getLogger("yue")

MANIFEST = "manifest.json"
FORMAT = 2  # bump when the converter's output changes; older folders are then rebuilt


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
    """Write the Hugging Face folder for `gguf_path` into `out` (config, weights, tokenizer): the values
    `gguf_load.float32_state` reads, under the family's transformers names."""
    from gguf import GGMLQuantizationType

    g = GGUFFile.open(gguf_path)
    config = gguf_load.hf_config(g)
    types = sorted({GGMLQuantizationType(t.ggml_type).name for t in g.tensors.values()})
    logger.warning(
        "%s: a %s, its %s tensors dequantized once to float32",
        gguf_path.name,
        config.model_type,
        "/".join(types),
    )
    save_file(gguf_load.float32_state(g, config), str(out / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(str(out))
    GenerationConfig(
        bos_token_id=config.bos_token_id, eos_token_id=config.eos_token_id, pad_token_id=config.pad_token_id
    ).save_pretrained(str(out))
    save_tokenizer(gguf_path, out)
