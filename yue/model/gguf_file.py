"""A GGUF file opened for loading: its metadata, its tensor table and its tokenizer, read through the `gguf`
package's public reader (`gguf.GGUFReader`), the weights left in the file until a loader reads them.

Design decisions:
- The reader parses the header once per file version (seconds for a 128k-token vocabulary: it builds a
  Python object per entry); what a load needs of it (the metadata's scalars, the tensor table, the
  tokenizer as tokenizer.json, built from the same parse by `gguf_tokenizer`) is cached under `<cache root>/gguf-index/<key>/`.
  The key is the file's size, its mtime and a sha256 of its first `HEADER_BYTES`, never a hash of the
  whole file: a warm load reads a few kilobytes of JSON, not gigabytes (`GGUFReader` builds a Python
  object per vocabulary entry, slow for a large vocabulary).
- The index is written into a temporary folder and renamed into place whole; a folder without its
  `index.json` (a killed write) is rebuilt, and temporary folders older than an hour are removed.
- Every tensor is checked against the file before anything is allocated: a known ggml type, its bytes
  inside the file. A file the reader refuses is walked once more (`_diagnose`) to say which tensor or
  which header field is wrong, and where: the reader's own errors are numpy's ("cannot reshape array of
  size 0") and name neither.
- Weights are read with `read` (into memory the caller owns: tensors transformed on load, such as a
  Llama's permuted Q/K rows) or `mapped` (a copy-on-write view of the file: the page cache's pages,
  no copy; the tensors the kernels read in place).
"""

from __future__ import annotations

import hashlib
import json
import logging
import mmap
import os
import shutil
import struct
import tempfile
import time
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from yue.errors import CheckpointError
from yue.model import gguf_tokenizer
from yue.registry import cache_root

logger = logging.getLogger("yue")

INDEX_FORMAT = 1  # bump when the index's contents change; older indexes are then rebuilt
HEADER_BYTES = 1 << 20  # the bytes of a file's start that its index key hashes
INDEX = "index.json"
# Metadata arrays longer than this are kept as their length only (the vocabulary, merges, scores).
SMALL_ARRAY = 64
STALE_TMP_S = 3600  # temporary index folders older than this are a killed write's


@dataclass(frozen=True)
class TensorInfo:
    """One tensor of the file: name, ggml type (`gguf.GGMLQuantizationType`'s value), shape in torch order
    ((out, in) for a matrix: the file's dims reversed), absolute byte offset and byte count."""

    name: str
    ggml_type: int
    shape: tuple[int, ...]
    offset: int
    nbytes: int


@dataclass
class GGUFFile:
    """An opened GGUF file (`GGUFFile.open`). `metadata` holds the header's key/values (long arrays as
    their lengths); `tensors` the table by name; `index_dir` the cached index (and tokenizer)."""

    path: Path
    size: int
    metadata: dict
    tensors: dict[str, TensorInfo]
    index_dir: Path
    _map: torch.Tensor | None = None  # the whole file, mapped (`mapped`)

    @classmethod
    def open(cls, path: str | Path, cache_dir: str | Path | None = None) -> GGUFFile:
        """Open `path`, from its cached index where one matches the file, else through `gguf.GGUFReader`.

        Raises:
            CheckpointError: a missing file, not a GGUF, a truncated or corrupt header, a tensor of an
                unknown type or one whose bytes run past the end of the file (each names the file, and
                the tensor or offset).
        """
        path = Path(path)
        if not path.is_file():
            raise CheckpointError(f"GGUF file not found: {path}")
        stat = path.stat()
        folder = index_folder(path, cache_dir, stat)
        parent = folder.parent
        try:
            index = json.loads((folder / INDEX).read_text())
            if index.get("format") != INDEX_FORMAT:
                raise ValueError("old index format")
        except (OSError, ValueError):
            index = None
        if index is None:
            index, tokenizer_fields = _read_index(path, stat.st_size)
            _write_index(parent, folder, index, path, tokenizer_fields)
        tensors = {t["name"]: TensorInfo(**{**t, "shape": tuple(t["shape"])}) for t in index["tensors"]}
        return cls(path, stat.st_size, index["metadata"], tensors, folder)

    def read(self, name: str, out: np.ndarray | None = None) -> np.ndarray:
        """Tensor `name`'s bytes read into memory of the caller's (uint8 (nbytes,); `out` if given):
        pages of the caller's, never the file's mapping."""
        info = self.tensors[name]
        buf = np.empty(info.nbytes, np.uint8) if out is None else out
        with open(self.path, "rb") as f:
            f.seek(info.offset)
            if f.readinto(memoryview(buf)) != info.nbytes:
                raise CheckpointError(f"{self.path}: {name} is cut short (the file changed while loading?)")
        return buf

    def mapped(self, name: str) -> torch.Tensor:
        """Tensor `name`'s bytes as a copy-on-write view of the file (uint8 (nbytes,)): no copy; the
        kernels read it in place, from the page cache. Every view shares one storage (the whole file), so
        neighbouring tensors can be one matmul (`file_codes.fused`)."""
        if self._map is None:
            with open(self.path, "rb") as f:
                self._map = torch.frombuffer(
                    mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_COPY), dtype=torch.uint8
                )
        info = self.tensors[name]
        return self._map[info.offset : info.offset + info.nbytes]

    def dequantized(self, name: str) -> np.ndarray:
        """Tensor `name`'s values as float32, in its torch shape (`gguf.quants.dequantize`)."""
        from gguf import GGMLQuantizationType, quants

        info = self.tensors[name]
        values = quants.dequantize(self.read(name), GGMLQuantizationType(info.ggml_type))
        return np.ascontiguousarray(values, np.float32).reshape(info.shape)

    def sha256(self) -> str:
        """The file's sha256, hashed once per file version (kept in its index folder): a yue folder's
        ar_source names the GGUF its NAR set was trained over by it."""
        saved = self.index_dir / "sha256"
        if saved.is_file():
            return saved.read_text().strip()
        h = hashlib.sha256()
        with open(self.path, "rb") as f:
            while block := f.read(1 << 22):
                h.update(block)
        saved.write_text(h.hexdigest())
        return h.hexdigest()

    def tokenizer_dir(self) -> Path:
        """The folder of this file's tokenizer (tokenizer.json, tokenizer_config.json with the chat
        template): written with the index for a byte-level vocabulary (`gguf_tokenizer`), else built
        here once by transformers' GGUF tokenizer conversion."""
        if not (self.index_dir / "tokenizer.json").is_file():
            save_tokenizer(self.path, self.index_dir)
        return self.index_dir


def index_folder(path: Path, cache_dir: str | Path | None = None, stat: os.stat_result | None = None) -> Path:
    """Where the index of this version of the file is (or would be) cached."""
    return cache_root(cache_dir) / "gguf-index" / index_key(path, stat or path.stat())


def index_key(path: Path, stat: os.stat_result) -> str:
    """A file version's index key: its size, mtime and the sha256 of its first HEADER_BYTES."""
    h = hashlib.sha256(f"{stat.st_size}:{stat.st_mtime_ns}:".encode())
    with open(path, "rb") as f:
        h.update(f.read(HEADER_BYTES))
    return h.hexdigest()[:20]


def _reader(path: Path):
    """`gguf.GGUFReader(path)`, its mapping held as a plain array.

    The reader slices its `data` (a `numpy.memmap`) once per part of every field, a million times for a
    128k vocabulary with its merges, and each slice of a memmap runs memmap's `__array_finalize__` in
    Python: two thirds of the parse. A plain `ndarray` view of the same mapping (its base keeps the
    mapping open) slices in C, and the reader's fields and tensors are the same bytes.
    """
    from gguf import GGUFReader

    class PlainReader(GGUFReader):
        @property
        def data(self) -> np.ndarray:
            return self._plain

        @data.setter
        def data(self, mapped: np.ndarray) -> None:
            self._plain = mapped.view(np.ndarray)

    return PlainReader(path)


def _read_index(path: Path, size: int) -> tuple[dict, dict]:
    """The index of a file (metadata scalars and short arrays, the tensor table), checked against its size,
    and its `tokenizer.*` fields in full (`gguf_tokenizer.fields_of`), from the one parse."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        if f.read(4) != b"GGUF":
            raise CheckpointError(f"{path} is not a GGUF file (its first bytes are not 'GGUF')")
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            reader = _reader(path)
    except (ValueError, IndexError, KeyError, struct.error, OverflowError) as e:
        raise CheckpointError(_diagnose(path, size) or f"{path}: corrupt GGUF ({e})") from None
    metadata = {}
    for key, field in reader.fields.items():
        if key.startswith("GGUF."):
            continue
        if len(field.data) > SMALL_ARRAY:
            metadata[key] = len(field.data)
        else:
            value = field.contents()
            metadata[key] = value.item() if isinstance(value, np.generic) else value
    tensors = []
    for t in reader.tensors:
        ggml_type = int(t.tensor_type)
        block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        shape = tuple(int(d) for d in reversed(t.shape.tolist()))
        nbytes = int(t.n_elements) // block * block_bytes
        if t.data_offset + nbytes > size:
            raise CheckpointError(_past_end(path, t.name, t.data_offset, nbytes, size))
        tensors.append(
            dict(name=t.name, ggml_type=ggml_type, shape=shape, offset=int(t.data_offset), nbytes=nbytes)
        )
    index = {"format": INDEX_FORMAT, "metadata": metadata, "tensors": tensors}
    return index, gguf_tokenizer.fields_of(reader)


def _past_end(path: Path, name: str, offset: int, nbytes: int, size: int) -> str:
    return (
        f"{path}: tensor {name} (offset {offset}, {nbytes} bytes) runs past the end of the file "
        f"({size} bytes): the file is truncated"
    )


def _write_index(parent: Path, folder: Path, index: dict, path: Path, tokenizer_fields: dict) -> None:
    """Write `index` as `folder` (atomically: a temporary folder renamed), with the tokenizer where
    `gguf_tokenizer` builds it from `tokenizer_fields` (else `tokenizer_dir` converts it on first use),
    removing stale temporaries."""
    parent.mkdir(parents=True, exist_ok=True)
    for stale in parent.glob(".tmp-*"):
        try:
            if time.time() - stale.stat().st_mtime > STALE_TMP_S:
                shutil.rmtree(stale, ignore_errors=True)
        except OSError:
            pass
    tmp = Path(tempfile.mkdtemp(prefix=".tmp-", dir=parent))
    try:
        _write_tokenizer(tokenizer_fields, tmp, path)
        (tmp / INDEX).write_text(json.dumps(index))
        shutil.rmtree(folder, ignore_errors=True)  # an incomplete folder (no index) of a killed write
        os.rename(tmp, folder)
    except OSError as e:
        if not (folder / INDEX).is_file():  # another process won the race: theirs is as good
            logger.warning("cannot cache the index of %s (%s); it is read again next time", path, e)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write_tokenizer(fields: dict, out: Path, path: Path) -> None:
    """The tokenizer built from the parsed fields (byte-level BPE vocabularies); on failure, none is
    written and the transformers conversion builds it on first use."""
    try:
        gguf_tokenizer.write(fields, out)
    except Exception as e:  # tokenizers raises bare Exceptions on a vocabulary it refuses
        logger.warning(
            "%s: building its tokenizer from the header failed (%s); converting it instead", path, e
        )
        for name in ("tokenizer.json", "tokenizer_config.json"):
            (out / name).unlink(missing_ok=True)


def save_tokenizer(gguf_path: Path, out: Path) -> None:
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
    tmp = Path(tempfile.mkdtemp(prefix=".tok-", dir=out))
    try:
        tokenizer.save_pretrained(str(tmp), save_jinja_files=False)
        for name in ("tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja"):
            if (tmp / name).is_file():
                os.replace(tmp / name, out / name)
        os.replace(tmp / "tokenizer.json", out / "tokenizer.json")  # last: its presence says complete
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


# ---- Saying what is wrong with a file the reader refused ----
# GGUF's header (its spec, version 2 and 3): magic, version u32, tensor count u64, key/value count u64;
# each key/value: a string key (u64 length + bytes), a value type u32, the value; each tensor: a string
# name, n_dims u32, dims u64 each, ggml type u32, offset u64 (from the data section's start, which is
# the next multiple of general.alignment (32) after the table).
_SCALARS = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
STRING, ARRAY = 8, 9


class _Cut(Exception):
    """The header ends inside a field."""


def _diagnose(path: Path, size: int) -> str | None:
    """Which part of a refused file is wrong, with its offset (None: nothing found)."""
    from gguf import GGML_QUANT_SIZES, GGMLQuantizationType

    with open(path, "rb") as f:
        blob = f.read()
    pos = 0

    def take(fmt: str):
        nonlocal pos
        n = struct.calcsize("<" + fmt)
        if pos + n > len(blob):
            raise _Cut
        value = struct.unpack_from("<" + fmt, blob, pos)
        pos += n
        return value[0]

    def string() -> str:
        nonlocal pos
        n = take("Q")
        if pos + n > len(blob):
            raise _Cut
        pos += n
        return blob[pos - n : pos].decode("utf-8", "replace")

    def value(kind: int):
        if kind == STRING:
            return string()
        if kind == ARRAY:
            item, count = take("I"), take("Q")
            return [value(item) for _ in range(count)]
        if kind not in _SCALARS:
            raise ValueError(f"value type {kind}")
        return take(_SCALARS[kind])

    try:
        take("I"), take("I")
        n_tensors, n_kv = take("Q"), take("Q")
        alignment = 32
        for _ in range(n_kv):
            at = pos
            key = string()
            try:
                v = value(take("I"))
            except ValueError as e:
                return f"{path}: metadata {key!r} at offset {at} has an unknown {e}"
            alignment = v if key == "general.alignment" else alignment
        table = []
        for _ in range(n_tensors):
            at = pos
            name = string()
            dims = [take("Q") for _ in range(take("I"))]
            ggml_type, offset = take("I"), take("Q")
            table.append((at, name, dims, ggml_type, offset))
    except _Cut:
        return f"{path}: the header is cut short at offset {pos} (file size {size}): the file is truncated"
    start = -(-pos // alignment) * alignment
    for at, name, dims, ggml_type, offset in table:
        try:
            block, block_bytes = GGML_QUANT_SIZES[GGMLQuantizationType(ggml_type)]
        except (ValueError, KeyError):
            return f"{path}: tensor {name} (table entry at offset {at}) has unknown ggml type {ggml_type}"
        n = int(np.prod(dims, dtype=np.int64))
        if n % block:
            return f"{path}: tensor {name} has {n} values, not a multiple of its type's block of {block}"
        if start + offset + n // block * block_bytes > size:
            return _past_end(path, name, start + offset, n // block * block_bytes, size)
    return None
