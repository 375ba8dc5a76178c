"""The one KV cache: preallocated, written at a shared pointer, rollback is a pointer move.

Design decisions:
- One (L, B, Hkv, T_max, Dh) buffer for keys and one for values; a decode step never allocates cache
  memory. `k`, `v` are the first B rows of buffers that may hold spare rows: rows leaving (`select`)
  close up in place, moving only the rows behind a leaver, and rows joining (`join`) are copied into
  spare rows; only a join past the spare rows (which then doubles them) or a buffer outgrown
  (`make_room`) allocates and copies the whole cache. Why: a continuous batch's rows come and go all
  the time, and copying the whole cache each time (46 KiB a token for SmolLM2) cost a batched server
  a sizeable share of its steps (measured: docs/results-log.md, issue 46).
- `length` is the write pointer shared by every row: a step writes its new tokens (and its slots, as
  scratch) at columns [length, length + T); committing advances it; whatever lies beyond `length` is
  overwritten by the next write.
- Rows of a batch may diverge: row b keeps keep[b] of a step's columns and the pointer advances by
  max(keep) (`commit`). The columns a row did not keep are holes: `key_valid` (B, T_max) marks them,
  and left padding, False, so no query attends to them. A column index is therefore not a position:
  `seq_lens[b]` counts the tokens in row b's sequence, and its next token's RoPE position is that
  count (`positions`). A single row never has holes, and keeps `key_valid` None (no mask needed).
- Holes cost columns, not compute of their own; `make_room` compacts them away (each row's valid
  columns gathered to the left) before it grows the buffer.
- The cache is a plain object, not a module buffer: it never enters a checkpoint.
- Its capacity is a multiple of 64 columns (`padded_capacity`): row-exact attention reads keys in
  ranges padded to that multiple (`decode_set.ExactAttention`).
"""

from __future__ import annotations

import itertools

import torch

from yue.model.layers import EXACT_KEY_PAD, round_up


def padded_capacity(columns: int) -> int:
    """Columns rounded up to a multiple of `layers.EXACT_KEY_PAD`, so row-exact attention's padded key
    range (`ExactAttention`) always lies inside the buffers."""
    return round_up(columns, EXACT_KEY_PAD)


class KVCache:
    """Preallocated keys/values for every layer.

    Attributes:
        k, v: (L, B, Hkv, T_max, Dh), the first B rows of the buffers (each layer's (B, Hkv, T_max, Dh)
            contiguous).
        length: columns written and committed, shared by every row (the write pointer).
        key_valid: (B, T_max) bool, False on left padding and holes; None when every column < length
            holds a token of every row.
        seq_lens: (B,) long, tokens in each row's sequence (its next RoPE position).
    """

    def __init__(
        self,
        n_layers: int,
        batch_size: int,
        n_kv_heads: int,
        head_dim: int,
        capacity: int,
        device: torch.device | str,
        dtype: torch.dtype,
    ) -> None:
        shape = (n_layers, batch_size, n_kv_heads, padded_capacity(capacity), head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self._buffers = (self.k, self.v)  # (L, rows >= B, Hkv, T_max, Dh): k, v are their first B rows
        self.length = 0
        self.key_valid: torch.Tensor | None = None
        self.seq_lens = torch.zeros(batch_size, dtype=torch.long, device=device)

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    @property
    def batch_size(self) -> int:
        return self.k.shape[1]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) views of layer i, each (B, Hkv, T_max, Dh)."""
        return self.k[i], self.v[i]

    def set_padding(self, pad_lengths: list[int]) -> None:
        """Mark the first pad_lengths[b] positions of row b as padding (left-padded batch); a row's
        positions count from its first real token (its prompt starts at position 0)."""
        if not any(pad_lengths):
            self.key_valid = None
            return
        idx = torch.arange(self.capacity, device=self.k.device)
        pads = torch.tensor(pad_lengths, device=self.k.device)
        self.key_valid = idx[None, :] >= pads[:, None]
        self.seq_lens -= pads.to(self.seq_lens.device)

    def key_positions(self, n: int) -> torch.Tensor:
        """RoPE positions of cache columns [0, n), (1|B, n): each row's valid columns counted from 0
        (a sliding window is over positions, `mot.MoTModel._local`); a hole or padding column, which
        every mask blocks, gets its predecessor's (or -1)."""
        if self.key_valid is None:
            return torch.arange(n, device=self.k.device)[None]
        return self.key_valid[:, :n].long().cumsum(-1) - 1

    def positions(self, offsets: torch.Tensor, padded: bool = False) -> torch.Tensor:
        """RoPE positions of a step's new tokens: seq_lens[b] + offsets, (B, T). offsets: (T,) long,
        each token's place after the row's last token (a slot block: its anchor's place + 1, ...).
        padded: a left-padded prefill, whose padding columns get position 0 instead of negative ones."""
        pos = self.seq_lens[:, None] + offsets[None, :]
        return pos.clamp_(min=0) if padded else pos

    def advance(self, n: int) -> None:
        """Commit the next n written columns in every row."""
        assert self.length + n <= self.capacity, "KV cache overflow"
        self.length += n
        self.seq_lens += n

    def commit(self, keep: list[int]) -> None:
        """Row b keeps the first keep[b] columns of the last write; the pointer moves by max(keep) and
        each row's columns [keep[b], max) of that write become holes."""
        top = max(keep)
        if min(keep) == top:  # every row kept as many: no holes (always so for a single row)
            return self.advance(top)
        assert self.length + top <= self.capacity, "KV cache overflow"
        valid = self._valid()
        for b, n in enumerate(keep):
            valid[b, self.length + n : self.length + top] = False
        self.length += top
        self.seq_lens += torch.tensor(keep, device=self.seq_lens.device)

    def rollback(self, length: int) -> None:
        """Forget every column from `length` on: a pointer move, nothing is cleared."""
        assert 0 <= length <= self.length
        self.length = length

    def _valid(self) -> torch.Tensor:
        """key_valid, materialized (all True) if it was None."""
        if self.key_valid is None:
            self.key_valid = torch.ones(
                self.batch_size, self.capacity, dtype=torch.bool, device=self.k.device
            )
        return self.key_valid

    def select(self, rows: list[int]) -> None:
        """Keep only these rows (a gather on the batch dimension): rows that left stop costing compute.
        A lone row left is compacted: without holes it decodes without a mask (the batch-1 fast path)."""
        # Rows move in place: buffers made in inference mode (a decode step) take writes only there.
        with torch.inference_mode(self.k.is_inference()):
            index = torch.tensor(rows, dtype=torch.long, device=self.k.device)
            if all(a < b for a, b in itertools.pairwise(rows)) and rows[-1] < self.batch_size:
                # Ascending (rows leaving): close up in place; row j's source rows[j] >= j is never a row
                # already written. Columns past the pointer are scratch (the next write's), not copied.
                n = self.length
                for j, r in enumerate(rows):
                    if r != j:
                        self.k[:, j, :, :n] = self.k[:, r, :, :n]
                        self.v[:, j, :, :n] = self.v[:, r, :, :n]
                self._rows(len(rows))
            else:  # a reordering (beam search's `_reorder_cache`): a gathered copy
                self.k, self.v = self.k.index_select(1, index), self.v.index_select(1, index)
                self._buffers = (self.k, self.v)
            self.seq_lens = self.seq_lens.index_select(0, index)
            if self.key_valid is not None:
                self.key_valid = self.key_valid.index_select(0, index)
                self._drop_mask_if_whole()
            if len(rows) == 1 and self.key_valid is not None:
                self.compact()

    def make_room(self, n: int) -> None:
        """Ensure n columns can be written at the pointer: compact the holes away, then grow if needed."""
        if self.length + n <= self.capacity:
            return
        if self.key_valid is not None:
            self.compact()
        if self.length + n > self.capacity:
            self._resize(max(2 * self.capacity, self.length + n))

    def compact(self) -> None:
        """Gather each row's valid columns to the left, in order; the pointer becomes the longest row's
        count, and a shorter row's columns after its own are holes."""
        valid = self._valid()[:, : self.length]  # (B, length)
        counts = valid.sum(1)  # (B,)
        new_len = int(counts.max()) if counts.numel() else 0
        # Row b's j-th valid column, for j < counts[b]; column 0 (masked) after that. (B, new_len)
        order = torch.argsort((~valid).int(), dim=1, stable=True)[:, :new_len]
        slot = torch.arange(new_len, device=valid.device)[None, :]
        index = torch.where(slot < counts[:, None], order, torch.zeros_like(order))
        gather = index[None, :, None, :, None].expand(
            self.k.shape[0], -1, self.k.shape[2], -1, self.k.shape[4]
        )
        self.k[:, :, :, :new_len] = self.k.gather(3, gather)
        self.v[:, :, :, :new_len] = self.v.gather(3, gather)
        columns = torch.arange(self.capacity, device=valid.device)[None, :]
        self.key_valid = (columns < counts[:, None]) | (columns >= new_len)  # past the pointer: written later
        self.length = new_len
        self._drop_mask_if_whole()

    def _drop_mask_if_whole(self) -> None:
        """key_valid back to None when no row has a hole or padding left (a lone row's fast path)."""
        if self.key_valid is not None and bool(self.key_valid[:, : self.length].all()):
            self.key_valid = None

    def _rows(self, n: int) -> None:
        """k, v as the buffers' first n rows."""
        self.k, self.v = self._buffers[0][:, :n], self._buffers[1][:, :n]

    def _resize(self, capacity: int, rows: int | None = None) -> None:
        """Copy into buffers of a new capacity (>= length) and `rows` rows (>= B; None: B); new columns
        are valid (written later)."""
        L, B, H, T, D = self.k.shape
        capacity = padded_capacity(capacity)
        k = self.k.new_zeros(L, rows or B, H, capacity, D)
        v = self.v.new_zeros(L, rows or B, H, capacity, D)
        n = min(T, capacity)
        k[:, :B, :, :n], v[:, :B, :, :n] = self.k[:, :, :, :n], self.v[:, :, :, :n]
        self._buffers = (k, v)
        self._rows(B)
        if self.key_valid is not None:
            valid = torch.ones(B, capacity, dtype=torch.bool, device=k.device)
            valid[:, :n] = self.key_valid[:, :n]
            self.key_valid = valid

    def join(self, other: KVCache) -> None:
        """Append other's rows below this cache's, both committed up to their own pointers.

        The pointer becomes the larger of the two; a row's columns between its cache's old pointer and
        the new one are holes. Positions stay per row (`seq_lens`), so nothing needs shifting.
        """
        with torch.inference_mode(self.k.is_inference()):  # as `select`
            length = max(self.length, other.length)
            capacity = max(self.capacity, other.capacity)
            B, n = self.batch_size, other.batch_size
            parts = []
            for c in (self, other):  # (B|n, capacity): holes between a cache's pointer and the new one
                valid = torch.ones(c.batch_size, capacity, dtype=torch.bool, device=c.k.device)
                valid[:, : c.capacity] = c._valid()
                valid[:, c.length : length] = False
                parts.append(valid)
            if self.capacity < capacity or self._buffers[0].shape[1] < B + n:
                # No room: new buffers with spare rows (doubled), so the joins that follow copy only theirs.
                self._resize(capacity, max(B + n, 2 * self._buffers[0].shape[1]))
            self._rows(B + n)
            cols = other.length  # its columns past its pointer are scratch
            self.k[:, B:, :, :cols] = other.k[:, :, :, :cols]
            self.v[:, B:, :, :cols] = other.v[:, :, :, :cols]
            self.key_valid = torch.cat(parts, dim=0)
            self.seq_lens = torch.cat([self.seq_lens, other.seq_lens])
            self.length = length
