"""A prompt's prefill in chunks: where each chunk ends, what it weighs, and a bucket being prefilled.

Design decisions (the decode loop's joining rules, `decode/loop.py`):
- The chunks are fixed by the prompt's positions (and, on a `prefix.split_exact` model, its length),
  never by what else is queued or by the budget, so a prompt's bits are the same however it is
  scheduled, alone or in a server's batch.
- A chunk's attention costs its length times the keys before it, so chunks shrink along the prompt:
  each holds about the same work (`chunk_work`), and a long prompt stalls the running rows no longer at
  its end than at its start.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from yue.decode.prefix import BLOCK, MIN_ROWS
from yue.decode.rows import Row
from yue.model.cache import KVCache

# Prompt tokens one prefill forward takes at most (a prompt's first chunk). A chunk starting at
# position p takes about PREFILL_CHUNK * PREFILL_KEYS / (p + PREFILL_KEYS) tokens (a multiple of 16):
# a prompt token's weight matmuls cost about what attending to PREFILL_KEYS keys costs (the ratio
# measured on SmolLM2 on a CPU: docs/serve.md), so every chunk holds about the same work.
PREFILL_CHUNK = 128
PREFILL_KEYS = 1280


def chunk_end(done: int, length: int, exact: bool = False) -> int:
    """Where the prefill chunk starting at prompt position `done` ends: a function of positions alone;
    `exact` (a `prefix.split_exact` model), cut so that any cut keeps the bits: position 0's chunk is
    [0, BLOCK) (or the whole prompt, where fewer than MIN_ROWS would follow it), and no forward past it,
    the last (the first decode step's) included, takes fewer than MIN_ROWS rows."""
    quantum = min(16, PREFILL_CHUNK)
    n = PREFILL_CHUNK * PREFILL_KEYS // (done + PREFILL_KEYS) // quantum * quantum
    end = min(done + max(quantum, min(PREFILL_CHUNK, n)), length)
    if not exact:
        return end
    if done == 0:
        return BLOCK if length >= BLOCK + MIN_ROWS else length
    if end < length and length - end < MIN_ROWS:  # leave the last forward MIN_ROWS rows, or take them all
        end = (length - MIN_ROWS) // BLOCK * BLOCK
        return end if end > done else length
    return end


def chunk_work(done: int, n: int) -> int:
    """A chunk's prefill work in tokens at a prompt's start: n tokens after `done` weigh
    (done + PREFILL_KEYS) / PREFILL_KEYS each (their attention grows with the keys before them)."""
    return -(-n * (done + PREFILL_KEYS) // PREFILL_KEYS)


def grid_ends(length: int, inclusive: bool = False) -> list[int]:
    """The chunk grid's boundaries inside `length` tokens, ascending: where a prompt of that length's
    prefill chunks end before its last chunk (which its first decode step feeds); `inclusive`: up to
    `length` itself, where it is one (a sequence fed whole, `prefix.PrefixFill`)."""
    ends, end = [], 0
    while (end := chunk_end(end, length + 1)) < length + inclusive:
        ends.append(end)
    return ends


def lookup_ends(length: int, exact: bool) -> list[int]:
    """Where a prompt of `length` tokens may resume its prefill from the prefix cache, ascending: the grid's
    boundaries (`grid_ends`), or, `exact`, every BLOCK boundary that leaves at least MIN_ROWS tokens to
    feed (`chunk_end`'s rule)."""
    if not exact:
        return grid_ends(length)
    return list(range(BLOCK, length - MIN_ROWS + 1, BLOCK)) if length >= BLOCK + MIN_ROWS else []


def fill_plan(length: int, exact: bool) -> tuple[list[int], list[int], int | None]:
    """How `prefix.PrefixFill` extends the cache with a finished sequence of `length` tokens: (the
    boundaries it looks up, where its chunks end, the block size it stores or None): the grid's up to its
    last boundary, or, `exact`, every BLOCK up to the last whole one, fed in the grid's chunks."""
    if not exact:
        ends = grid_ends(length, inclusive=True)
        return ends, ends, None
    last = length // BLOCK * BLOCK
    ends = list(range(BLOCK, last + 1, BLOCK))
    chunks, end = [BLOCK] if last else [], BLOCK
    while last and (end := chunk_end(end, last)) < last:
        chunks.append(end)
    return ends, chunks + [last] if last > BLOCK else chunks, BLOCK


@dataclass
class Prefill:
    """A bucket of rows (one prompt length) being prefilled, a chunk at a time, before it joins the batch.

    Attributes:
        rows: its rows; cache: their KV cache, holding the first `done` prompt tokens.
        prompt: (B, T) the rows' prompts.
    """

    rows: list[Row]
    cache: KVCache
    prompt: torch.Tensor
    done: int = 0
    exact: bool = False  # cut on `chunk_end`'s exact rule (`prefix.split_exact`)

    def next_end(self) -> int:
        """Where the next chunk ends (`chunk_end`)."""
        return chunk_end(self.done, self.prompt.shape[1], self.exact)

    def next_work(self) -> int:
        """Its next chunk's prefill work (`chunk_work`), every row's counted."""
        return len(self.rows) * chunk_work(self.done, self.next_end() - self.done)
