"""The one KV cache: preallocated, indexed by absolute position, rollback is a pointer move.

Design decisions:
- One (L, B, Hkv, T_max, Dh) buffer for keys and one for values, allocated once per request batch;
  the decode loop never allocates cache memory per step.
- `length` counts the positions whose K/V are committed. A step writes its new tokens (and its slots,
  as scratch) at [length, length + T); accepting j tokens advances `length`, rejecting drafts simply
  does not advance it; whatever lies beyond `length` is overwritten by the next write.
- A batch of prompts is left-padded and decoded in lockstep; `key_valid` (B, T_max) marks padding
  keys so no query ever attends to them.
- The cache is a plain object, not a module buffer: it never enters a checkpoint.
"""

from __future__ import annotations

import torch


class KVCache:
    """Preallocated keys/values for every layer.

    Attributes:
        k, v: (L, B, Hkv, T_max, Dh) buffers.
        length: number of committed positions whose K/V are valid.
        key_valid: (B, T_max) bool, False on left padding; None for an unpadded batch.
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
        shape = (n_layers, batch_size, n_kv_heads, capacity, head_dim)
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0
        self.key_valid: torch.Tensor | None = None

    @property
    def capacity(self) -> int:
        return self.k.shape[3]

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(k, v) views of layer i, each (B, Hkv, T_max, Dh)."""
        return self.k[i], self.v[i]

    def set_padding(self, pad_lengths: list[int]) -> None:
        """Mark the first pad_lengths[b] positions of row b as padding (left-padded batch)."""
        if not any(pad_lengths):
            self.key_valid = None
            return
        idx = torch.arange(self.capacity, device=self.k.device)
        pads = torch.tensor(pad_lengths, device=self.k.device)
        self.key_valid = idx[None, :] >= pads[:, None]

    def advance(self, n: int) -> None:
        """Commit the next n written positions."""
        assert self.length + n <= self.capacity, "KV cache overflow"
        self.length += n

    def rollback(self, length: int) -> None:
        """Forget every position from `length` on: a pointer move, nothing is cleared."""
        assert 0 <= length <= self.length
        self.length = length
