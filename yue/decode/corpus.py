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
- One table per context length n = `min_order`..`max_order`: a 32-bit hash of the n tokens
  (`context_hashes`), sorted, beside the token that most often followed them (kept where it followed at
  least `min_count` times and in at least `min_share` of them). A draft chains: the longest context that
  is in the table gives the next token, which joins the context. Lookups are binary searches on the
  arrays (no Python dict: ~800k entries would cost ~80 MB of objects).
- A hash, not the tokens: 6 bytes a context (4 of hash, 2 of token) where the packed tokens took 10 and
  capped a context at 4 tokens of 16 bits, so the same package budget holds more of the model's
  answers, and longer contexts. Two contexts may share a hash (a lookup of an absent context finds
  another's with probability (contexts of its order) / 2^32); the draft it gives is then a
  wrong guess, which verification rejects like any other: the output stays `ar`'s either way.
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

# The context hash (`context_hashes`, `_hash_columns`): the newest token first, each mixed in by
# h = (h ^ t) * MIX mod 2^64, then a final mix whose high 32 bits are kept, so one backward pass over a
# context gives the hashes of its trailing 1, 2, ... tokens.
SEED, MIX, FINAL = 0x243F6A8885A308D3, 0x9E3779B97F4A7C15, 0xBF58476D1CE4E5B9
MASK64 = 2**64 - 1
HASH_FORMAT = "hash32-v1"  # the file's "key" metadata: contexts stored as these hashes


def context_hashes(context: Sequence[int], max_order: int) -> list[int]:
    """The hashes of the context's trailing 1..max_order tokens (fewer where the context is shorter)."""
    h, out = SEED, []
    for t in reversed(context[-max_order:]):
        h = ((h ^ t) * MIX) & MASK64
        f = ((h ^ (h >> 31)) * FINAL) & MASK64
        out.append(f >> 32)
    return out


def _hash_columns(columns: list[np.ndarray]) -> np.ndarray:
    """`context_hashes`' hash of n-token contexts given as n columns (oldest first) -> uint32."""
    h = np.full(len(columns[0]), SEED, dtype=np.uint64)
    for col in reversed(columns):
        h = (h ^ col.astype(np.uint64)) * np.uint64(MIX)  # uint64 arrays wrap: mod 2^64
    h = (h ^ (h >> np.uint64(31))) * np.uint64(FINAL)
    return (h >> np.uint64(32)).astype(np.uint32)


class CorpusNgrams:
    """The n-gram table of a corpus: for each context of `min_order`..`max_order` tokens, the token
    that most often followed it.

    Attributes:
        keys: per order n (index n - min_order), the contexts' hashes, sorted and distinct (uint32).
        nexts: per order, the token that followed each context most often (uint16, or uint32 for a
            vocabulary over 65,536).
        min_order / max_order: the shortest and longest context looked up.
        vocab_size: the tokenizer's vocabulary the ids belong to.
        source: where the answers came from (the file's metadata; "" when not said).
    """

    def __init__(
        self,
        keys: list[np.ndarray],
        nexts: list[np.ndarray],
        min_order: int,
        vocab_size: int,
        source: str = "",
    ) -> None:
        if len(keys) != len(nexts) or not keys:
            raise ValueError("keys and nexts: one array per order, at least one")
        self.keys, self.nexts, self.source = keys, nexts, source
        self.min_order, self.max_order = min_order, min_order + len(keys) - 1
        self.vocab_size = vocab_size

    def __len__(self) -> int:
        return sum(len(k) for k in self.keys)

    def _next(self, context: Sequence[int]) -> tuple[int, int | None]:
        """(n, token): the token that followed the longest of the context's trailing n-grams in the
        table, and that n; (0, None) when none is."""
        hashes = context_hashes(context, self.max_order)
        for n in range(len(hashes), self.min_order - 1, -1):
            table, key = self.keys[n - self.min_order], hashes[n - 1]
            i = int(np.searchsorted(table, np.uint32(key)))
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
        if not 1 <= min_order <= max_order:
            raise ValueError(f"need 1 <= min_order <= max_order, got {min_order}, {max_order}")
        seqs = [(np.asarray(ids, dtype=np.int64), p) for ids, p in sequences]
        keys, nexts = [], []
        for n in range(min_order, max_order + 1):
            ctx, nxt = [], []
            for ids, p in seqs:
                pos = np.arange(max(n, p), len(ids))  # predicted positions: the answer's
                columns = [ids[pos - n + j] for j in range(n)]
                ctx.append(_hash_columns(columns) if len(pos) else pos.astype(np.uint32))
                nxt.append(ids[pos])
            k, t = _most_frequent(np.concatenate(ctx), np.concatenate(nxt), min_count, min_share)
            keys.append(k), nexts.append(t.astype(_token_dtype(vocab_size)))
        return cls(keys, nexts, min_order, vocab_size)

    def extended(self, other: CorpusNgrams) -> CorpusNgrams:
        """This table plus the contexts of `other` that it lacks (its own entries win where both have
        one), orders either has: a table grown with answers to new prompts, when the old answers are
        not at hand (so a longer order may come from the new answers alone)."""
        if (other.min_order, other.vocab_size) != (self.min_order, self.vocab_size):
            raise ValueError("extended: the tables differ in their shortest order or vocabulary")
        keys, nexts = [], []
        for i in range(max(len(self.keys), len(other.keys))):
            if i >= len(other.keys) or i >= len(self.keys):  # an order only one of them has
                only = self if i < len(self.keys) else other
                keys.append(only.keys[i]), nexts.append(only.nexts[i])
                continue
            k, t, k2, t2 = self.keys[i], self.nexts[i], other.keys[i], other.nexts[i]
            new = ~np.isin(k2, k, assume_unique=True)
            both_k, both_t = np.concatenate([k, k2[new]]), np.concatenate([t, t2[new]])
            order = np.argsort(both_k, kind="stable")
            keys.append(both_k[order]), nexts.append(both_t[order])
        return CorpusNgrams(keys, nexts, self.min_order, self.vocab_size)

    def save(self, path: str | Path, **metadata: str) -> None:
        """Write the table (safetensors; `metadata`, e.g. where the corpus came from, goes along)."""
        tensors = {}
        for n, (k, t) in enumerate(zip(self.keys, self.nexts, strict=True), start=self.min_order):
            tensors[f"keys.{n}"] = k
            tensors[f"next.{n}"] = t
        meta = {"key": HASH_FORMAT, "min_order": str(self.min_order), "vocab_size": str(self.vocab_size)}
        save_file(tensors, str(path), metadata=meta | metadata)

    @classmethod
    def load(cls, path: str | Path, vocab_size: int) -> CorpusNgrams:
        """Read a table written by `save` (or by yue before 2026-12-05, whose contexts were packed
        tokens: hashed as they load), checked against the model's vocabulary.

        Raises:
            CheckpointError: a truncated or corrupt file, or a table for another vocabulary.
        """
        path = Path(path)
        try:
            with safe_open(str(path), "np") as f:
                meta = f.metadata() or {}
                tensors = {name: f.get_tensor(name) for name in f.keys()}  # noqa: SIM118 (not a dict)
            min_order, stored_vocab = int(meta["min_order"]), int(meta["vocab_size"])
            packed = None if meta.get("key") == HASH_FORMAT else int(meta["bits"])
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
            want = np.uint32 if packed is None else np.uint64
            if k.dtype != want or len(k) != len(t) or np.any(k[1:] <= k[:-1]) or np.any(t >= vocab_size):
                raise CheckpointError(f"{path}: a corrupt n-gram table (unsorted keys or bad token ids)")
        if packed is not None:
            rehashed = [_rehash(k, t, n, packed) for n, k, t in zip(orders, keys, nexts, strict=True)]
            keys, nexts = [k for k, _ in rehashed], [t for _, t in rehashed]
        return cls(keys, nexts, min_order, vocab_size, meta.get("source", ""))


def _token_dtype(vocab_size: int):
    return np.uint16 if vocab_size <= 2**16 else np.uint32


def _rehash(packed: np.ndarray, nexts: np.ndarray, n: int, bits: int) -> tuple[np.ndarray, np.ndarray]:
    """An older table's order-n contexts, n tokens of `bits` bits packed into a uint64 (the oldest
    highest), as sorted distinct hashes and their tokens (of two contexts that share a hash, the first)."""
    mask = np.uint64(2**bits - 1)
    columns = [(packed >> np.uint64(bits * (n - 1 - j))) & mask for j in range(n)]
    keys = _hash_columns(columns)
    keys, first = np.unique(keys, return_index=True)
    return keys, nexts[first]


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
