"""Drafts from a corpus of the model's own answers: a static n-gram table shipped with the model.

Design decisions:
- The model's greedy answers are deterministic, and a small chat model's are formulaic ("Here are
  some tips", "I hope this helps!", list scaffolding), so what followed an n-gram in its answers to
  other prompts is a good guess of what follows it now. Retrieval drafting (REST, He et al. 2023;
  llama.cpp's static n-gram cache) over the answers its NAR set was trained on: no forward, like
  copies from the context (`decode/lookup.py`), and verified like any draft, so `verified` stays
  exactly `ar` (`hybrid` drafts from it too). It drafts where the context has no match, so many more
  positions of yue-smol's held-out answers have a free draft than with context copies alone (the
  figures: docs/results-log.md; the table's settings were chosen on the calibration split; model
  card).
- One table per context length n = `min_order`..`max_order`: the n tokens packed into one uint64
  (`bits` per token), sorted, beside the token that most often followed them (kept where it
  followed at least `min_count` times and in at least `min_share` of them). A draft chains: the
  longest context that is in the table gives the next token, which joins the context. Lookups are
  binary searches on the arrays (no Python dict: ~800k entries would cost ~80 MB of objects).
- Stored as safetensors (never pickle) beside the NAR set: `ngrams.safetensors` in the model folder,
  its build settings in the metadata.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import numpy as np
from safetensors import SafetensorError, safe_open
from safetensors.numpy import save_file

from yue.errors import CheckpointError
from yue.model.hf import NGRAMS_FILE


class CorpusNgrams:
    """The n-gram table of a corpus: for each context of `min_order`..`max_order` tokens, the token
    that most often followed it.

    Attributes:
        keys: per order n (index n - min_order), the packed contexts, sorted (uint64).
        nexts: per order, the token that followed each context most often (uint16, or uint32 for a
            vocabulary over 65,536).
        bits: bits per token in a packed context (16 for a vocabulary of at most 65,536).
        min_order / max_order: the shortest and longest context looked up.
        vocab_size: the tokenizer's vocabulary the ids belong to.
        source: where the answers came from (the file's metadata; "" when not said).
    """

    def __init__(
        self,
        keys: list[np.ndarray],
        nexts: list[np.ndarray],
        bits: int,
        min_order: int,
        vocab_size: int,
        source: str = "",
    ) -> None:
        if len(keys) != len(nexts) or not keys:
            raise ValueError("keys and nexts: one array per order, at least one")
        self.keys, self.nexts, self.bits, self.source = keys, nexts, bits, source
        self.min_order, self.max_order = min_order, min_order + len(keys) - 1
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return sum(len(k) for k in self.keys)

    def _next(self, context: Sequence[int]) -> tuple[int, int | None]:
        """(n, token): the token that followed the longest of the context's trailing n-grams in the
        table, and that n; (0, None) when none is."""
        for n in range(min(self.max_order, len(context)), self.min_order - 1, -1):
            key = 0
            for t in context[-n:]:
                key = (key << self.bits) | t
            table = self.keys[n - self.min_order]
            i = int(np.searchsorted(table, np.uint64(key)))
            if i < len(table) and int(table[i]) == key:
                return n, int(self.nexts[n - self.min_order][i])
        return 0, None

    def match(self, context: Sequence[int], n: int) -> tuple[int, list[int]]:
        """(order, drafts): up to n tokens chained from the table after `context` (its last
        `max_order` tokens matter), and the context length that gave the first of them (a longer
        context is a surer guess: on yue-smol's calibration answers a draft's first token held 0.33 of
        the time from a 2-token context, 0.58 from a 4-token one); (0, []) when none of its trailing
        n-grams is in the table."""
        ctx, out = list(context[-self.max_order :]), []
        order = 0
        while len(out) < n:
            m, t = self._next(ctx)
            if t is None:
                break
            order = order or m
            out.append(t)
            ctx = ctx[1:] + [t] if len(ctx) == self.max_order else ctx + [t]
        return order, out

    @classmethod
    def build(
        cls,
        sequences: Iterable[tuple[Sequence[int], int]],
        vocab_size: int,
        min_order: int = 2,
        max_order: int = 4,
        min_count: int = 2,
        min_share: float = 0.3,
    ) -> CorpusNgrams:
        """The table of (token ids, prompt length) sequences: the tokens after each prompt (the
        answers) are what is predicted; contexts may reach back into the prompt."""
        bits = max(16, (vocab_size - 1).bit_length())
        if max_order * bits > 64:
            raise ValueError(f"max_order {max_order}: {bits}-bit tokens fit at most {64 // bits} to a key")
        if not 1 <= min_order <= max_order:
            raise ValueError(f"need 1 <= min_order <= max_order, got {min_order}, {max_order}")
        seqs = [(np.asarray(ids, dtype=np.uint64), p) for ids, p in sequences]
        keys, nexts = [], []
        for n in range(min_order, max_order + 1):
            ctx, nxt = [], []
            for ids, p in seqs:
                pos = np.arange(max(n, p), len(ids))  # predicted positions: the answer's
                key = np.zeros(len(pos), dtype=np.uint64)
                for j in range(n):
                    key = (key << np.uint64(bits)) | ids[pos - n + j]
                ctx.append(key), nxt.append(ids[pos])
            k, t = _most_frequent(np.concatenate(ctx), np.concatenate(nxt), min_count, min_share)
            keys.append(k), nexts.append(t.astype(np.uint16 if bits == 16 else np.uint32))
        return cls(keys, nexts, bits, min_order, vocab_size)

    def extended(self, other: CorpusNgrams) -> CorpusNgrams:
        """This table plus the contexts of `other` that it lacks (its own entries win where both have
        one): a table grown with answers to new prompts, when the old answers are not at hand."""
        if (other.bits, other.min_order, other.max_order, other.vocab_size) != (
            self.bits,
            self.min_order,
            self.max_order,
            self.vocab_size,
        ):
            raise ValueError("extended: the tables differ in orders, bits or vocabulary")
        keys, nexts = [], []
        for k, t, k2, t2 in zip(self.keys, self.nexts, other.keys, other.nexts, strict=True):
            new = ~np.isin(k2, k, assume_unique=True)
            both_k, both_t = np.concatenate([k, k2[new]]), np.concatenate([t, t2[new]])
            order = np.argsort(both_k, kind="stable")
            keys.append(both_k[order]), nexts.append(both_t[order])
        return CorpusNgrams(keys, nexts, self.bits, self.min_order, self.vocab_size)

    def save(self, path: str | Path, **metadata: str) -> None:
        """Write the table (safetensors; `metadata`, e.g. where the corpus came from, goes along)."""
        tensors = {}
        for n, (k, t) in enumerate(zip(self.keys, self.nexts, strict=True), start=self.min_order):
            tensors[f"keys.{n}"] = k
            tensors[f"next.{n}"] = t
        meta = {"bits": str(self.bits), "min_order": str(self.min_order), "vocab_size": str(self.vocab_size)}
        save_file(tensors, str(path), metadata=meta | metadata)

    @classmethod
    def load(cls, path: str | Path, vocab_size: int) -> CorpusNgrams:
        """Read a table written by `save`, checked against the model's vocabulary.

        Raises:
            CheckpointError: a truncated or corrupt file, or a table for another vocabulary.
        """
        path = Path(path)
        try:
            with safe_open(str(path), "np") as f:
                meta = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
            bits, min_order = int(meta["bits"]), int(meta["min_order"])
            stored_vocab = int(meta["vocab_size"])
        except (SafetensorError, OSError, KeyError, ValueError) as e:
            raise CheckpointError(f"{path}: not a readable n-gram table ({e})") from e
        if stored_vocab != vocab_size:
            raise CheckpointError(
                f"{path}: an n-gram table for a vocabulary of {stored_vocab}, not {vocab_size}"
            )
        orders = range(min_order, min_order + len(tensors) // 2)
        try:
            keys = [tensors[f"keys.{n}"] for n in orders]
            nexts = [tensors[f"next.{n}"] for n in orders]
        except KeyError as e:
            raise CheckpointError(f"{path}: the n-gram table lacks {e}") from e
        for k, t in zip(keys, nexts, strict=True):
            if k.dtype != np.uint64 or len(k) != len(t) or np.any(k[1:] <= k[:-1]) or np.any(t >= vocab_size):
                raise CheckpointError(f"{path}: a corrupt n-gram table (unsorted keys or bad token ids)")
        return cls(keys, nexts, bits, min_order, vocab_size, meta.get("source", ""))


def _most_frequent(ctx: np.ndarray, nxt: np.ndarray, min_count: int, min_share: float):
    """Per distinct context, the token that followed it most often, where that token followed it
    >= min_count times and in >= min_share of its occurrences -> (sorted contexts, their tokens)."""
    if len(ctx) == 0:  # no answer long enough for this order
        return ctx, nxt
    order = np.lexsort((nxt, ctx))
    ctx, nxt = ctx[order], nxt[order]
    # Runs of equal (context, next) pairs, then of equal contexts among those runs.
    pair_start = np.flatnonzero(np.r_[True, (ctx[1:] != ctx[:-1]) | (nxt[1:] != nxt[:-1])])
    count = np.diff(np.r_[pair_start, len(ctx)])
    pair_ctx, pair_next = ctx[pair_start], nxt[pair_start]
    group_start = np.flatnonzero(np.r_[True, pair_ctx[1:] != pair_ctx[:-1]])
    total = np.add.reduceat(count, group_start)
    group = np.repeat(np.arange(len(group_start)), np.diff(np.r_[group_start, len(pair_ctx)]))
    by_count = np.lexsort((-count, group))  # within each context, its most frequent pair first
    top = by_count[np.r_[0, np.flatnonzero(np.diff(group[by_count])) + 1]]
    keep = (count[top] >= min_count) & (count[top] >= min_share * total)
    return pair_ctx[top][keep], pair_next[top][keep]


def load_ngrams(model_dir: Path | None, vocab_size: int) -> CorpusNgrams | None:
    """The model folder's n-gram table, or None where it has none."""
    if model_dir is None or not (model_dir / NGRAMS_FILE).is_file():
        return None
    return CorpusNgrams.load(model_dir / NGRAMS_FILE, vocab_size)
