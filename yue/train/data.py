"""Training corpora: read, split by file, tokenize once, pack into fixed-length sequences.

Design decisions:
- A corpus is a list of `Document`s (relative path, text). Readers exist for a plain text file (one
  document), JSONL (`{"text": ...}` per line, one document each), a folder of source files, and the
  built-in `stdlib` recipe (the running interpreter's `Lib/**/*.py`, test folders and site-packages
  excluded).
- The train/validation split is by document and depends only on a hash of its relative path, so it is
  the same on every machine, for every seed, and a file is never on both sides.
- Tokens are computed once and cached as `.npy` (never pickle) in the run folder, keyed by a hash of
  the corpus and tokenizer, so a resumed run reads exactly the same array.
- Documents are shuffled with the seed, joined with `<|eos|>` and cut into sequences of `seq_len`;
  which sequences make up batch `step` is a pure function of (seed, step), so the data position of a
  run is just its step counter and `--resume` sees the same order as an uninterrupted run.
"""

from __future__ import annotations

import hashlib
import json
import logging
import sysconfig
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from yue.tokenizer import YueTokenizer

log = logging.getLogger(__name__)

# Source-file suffixes read from a folder corpus (the stdlib recipe reads only `.py`).
SOURCE_SUFFIXES = frozenset(
    ".py .pyi .txt .md .rst .c .h .cc .cpp .hpp .rs .go .js .ts .java .kt .rb .sh .toml .yaml .yml .json "
    ".html .css .sql .lua .jl .r .scala .swift .m .cs .php .pl .tex".split()
)
# Any path part with one of these names marks a test folder (idlelib/idle_test, lib2to3/tests, ...).
TEST_DIR_NAMES = frozenset({"test", "tests", "idle_test", "testing", "unittest_data"})
EXCLUDED_DIR_NAMES = frozenset({"site-packages", "dist-packages", "__pycache__"})


@dataclass(frozen=True)
class Document:
    """One unit of the corpus; `name` is its path relative to the corpus root (the split key)."""

    name: str
    text: str


def stdlib_root() -> Path:
    """The running interpreter's standard library folder (`Lib/`)."""
    return Path(sysconfig.get_paths()["stdlib"])


def is_test_path(rel: Path) -> bool:
    """True when any folder of `rel` is a test folder (`test`, `tests`, `idle_test`, ...) or `test_*`."""
    parts = rel.parts[:-1]
    return any(p in TEST_DIR_NAMES or p.startswith("test_") for p in parts)


def _read_text(path: Path) -> str | None:
    """Decode a file as UTF-8; None when it is not valid UTF-8 (the caller counts the skip)."""
    try:
        return path.read_bytes().decode("utf-8")
    except UnicodeDecodeError:
        return None


def read_folder(
    root: Path, suffixes: Iterable[str] = SOURCE_SUFFIXES, skip_tests: bool = False
) -> list[Document]:
    """Every source file under `root` (sorted, relative names), skipping undecodable ones with a count."""
    suffixes = frozenset(suffixes)
    docs, skipped = [], 0
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root)
        if not path.is_file() or path.suffix not in suffixes:
            continue
        if any(p in EXCLUDED_DIR_NAMES for p in rel.parts[:-1]) or (skip_tests and is_test_path(rel)):
            continue
        text = _read_text(path)
        if text is None:
            skipped += 1
            continue
        if text.strip():
            docs.append(Document(rel.as_posix(), text))
    if skipped:
        log.warning("skipped %d undecodable file(s) under %s", skipped, root)
    return docs


def read_stdlib() -> list[Document]:
    """The built-in recipe: the interpreter's `Lib/**/*.py`, without test folders or site-packages."""
    return read_folder(stdlib_root(), suffixes={".py"}, skip_tests=True)


def read_jsonl(path: Path) -> list[Document]:
    """One document per line `{"text": ...}`; malformed lines are a ValueError naming the line."""
    docs = []
    with path.open(encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                text = json.loads(line)["text"]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(f'{path}:{i}: expected a JSON object with a "text" string ({e})') from e
            if not isinstance(text, str):
                raise ValueError(f'{path}:{i}: "text" must be a string')
            if text.strip():
                docs.append(Document(f"{path.name}:{i}", text))
    return docs


def read_corpus(spec: str | Path) -> list[Document]:
    """Read `stdlib`, a `.jsonl` file, any other text file, or a folder of source files.

    Raises:
        ValueError: the path does not exist, or the corpus holds no text at all.
    """
    if str(spec) == "stdlib":
        docs = read_stdlib()
    else:
        path = Path(spec)
        if path.is_dir():
            docs = read_folder(path)
        elif path.is_file() and path.suffix == ".jsonl":
            docs = read_jsonl(path)
        elif path.is_file():
            text = _read_text(path)
            if text is None:
                log.warning("skipped 1 undecodable file: %s", path)
            docs = [Document(path.name, text)] if text and text.strip() else []
        else:
            raise ValueError(f"corpus not found: {spec} (expected 'stdlib', a file or a folder)")
    if not docs:
        raise ValueError(f"corpus {spec} is empty: no decodable, non-blank text found")
    return docs


def is_validation(name: str, val_fraction: float) -> bool:
    """Deterministic split by name: the first 8 bytes of sha256(name) as a fraction of 2**64."""
    h = int.from_bytes(hashlib.sha256(name.encode("utf-8")).digest()[:8], "big")
    return h / 2**64 < val_fraction


def split_documents(docs: list[Document], val_fraction: float) -> tuple[list[Document], list[Document]]:
    """(train, validation) by file. Train is never empty; with >= 2 documents neither side is."""
    val = [d for d in docs if is_validation(d.name, val_fraction)]
    train = [d for d in docs if not is_validation(d.name, val_fraction)]
    if len(docs) == 1:  # nothing to hold out: train on it (the loop evaluates on it too)
        return list(docs), []
    if val_fraction > 0 and not val:  # tiny corpora: hold out the last file
        train, val = train[:-1], train[-1:]
    if not train:
        train, val = val[:1], val[1:]
    return train, val


def encode_documents(docs: list[Document], tokenizer: YueTokenizer, seed: int) -> np.ndarray:
    """Shuffle documents with `seed`, encode, join with `<|eos|>`. Returns (N,) int32 token ids."""
    order = torch.randperm(len(docs), generator=torch.Generator().manual_seed(seed)).tolist()
    texts = [docs[i].text for i in order]
    encodings = tokenizer.tokenizer.encode_batch(texts, add_special_tokens=False)
    pieces = []
    for enc in encodings:
        pieces.append(np.asarray(enc.ids, dtype=np.int32))
        pieces.append(np.asarray([tokenizer.eos_id], dtype=np.int32))
    return np.concatenate(pieces) if pieces else np.zeros(0, dtype=np.int32)


def corpus_key(docs: list[Document], tokenizer: YueTokenizer, seed: int) -> str:
    """A hash of everything the token array depends on (document names and texts, tokenizer, seed)."""
    h = hashlib.sha256()
    h.update(tokenizer.tokenizer.to_str().encode("utf-8"))
    h.update(str(seed).encode())
    for d in docs:
        h.update(d.name.encode("utf-8") + b"\0" + d.text.encode("utf-8") + b"\0")
    return h.hexdigest()[:16]


def cached_tokens(docs: list[Document], tokenizer: YueTokenizer, seed: int, cache_file: Path) -> np.ndarray:
    """`encode_documents`, cached as `.npy` (allow_pickle=False) with a key file beside it."""
    key = corpus_key(docs, tokenizer, seed)
    key_file = cache_file.with_suffix(".key")
    if cache_file.is_file() and key_file.is_file() and key_file.read_text() == key:
        return np.load(cache_file, allow_pickle=False)
    tokens = encode_documents(docs, tokenizer, seed)
    cache_file.parent.mkdir(parents=True, exist_ok=True)
    tmp = cache_file.with_suffix(".tmp.npy")
    np.save(tmp, tokens, allow_pickle=False)
    tmp.replace(cache_file)
    key_file.write_text(key)
    return tokens


class PackedSequences:
    """Token stream cut into non-overlapping sequences of `seq_len`; batches are a function of the step.

    Global sample `i` (= step * global_batch + row) comes from epoch `i // n` and is sequence
    `perm_epoch[i % n]`, where `perm_epoch` is a permutation seeded by (seed, epoch).
    """

    def __init__(self, tokens: np.ndarray, seq_len: int, seed: int) -> None:
        n = len(tokens) // seq_len
        if n < 1:
            raise ValueError(f"corpus too small: {len(tokens)} tokens is less than one sequence of {seq_len}")
        self.data = torch.from_numpy(tokens[: n * seq_len].astype(np.int64)).view(n, seq_len)  # (n, T)
        self.seed = seed
        self._perms: dict[int, torch.Tensor] = {}

    def __len__(self) -> int:
        return self.data.shape[0]

    def _perm(self, epoch: int) -> torch.Tensor:
        if epoch not in self._perms:
            g = torch.Generator().manual_seed(self.seed * 1_000_003 + epoch)
            self._perms = {epoch: torch.randperm(len(self), generator=g)}  # keep one epoch in memory
        return self._perms[epoch]

    def batch(self, step: int, batch_size: int, rank: int = 0, world: int = 1) -> torch.Tensor:
        """Rows for process `rank` of global batch `step`. Returns (batch_size, T) long."""
        start = (step * world + rank) * batch_size
        idx = [self._perm(i // len(self))[i % len(self)] for i in range(start, start + batch_size)]
        return self.data[torch.stack(idx)]


def train_tokenizer(corpus: str | Path, vocab_size: int, out: str | Path, val_fraction: float = 0.02) -> Path:
    """Train a byte-level BPE on the corpus's train split (validation files never seen); returns the file."""
    train_docs, _ = split_documents(read_corpus(corpus), val_fraction)
    tokenizer = YueTokenizer.train((d.text for d in train_docs), vocab_size=vocab_size)
    return tokenizer.save(Path(out))
