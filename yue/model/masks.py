"""The committed/slot attention masks, in one place (docs/design.md §1).

A forward sees committed positions (AR set) and NAR blocks of mask slots (NAR set). Who may attend to
whom, for a sequence c0..c5 with one block of K=3 slots anchored at c3 (so s1..s3 sit at positions
4..6 and predict x4..x6):

              keys:  c0 c1 c2 c3 c4 c5 | s1 s2 s3
    query c3          x  x  x  x  .  . |  .  .  .     committed -> committed: causal
    query c5          x  x  x  x  x  x |  .  .  .     committed -> slot: blocked
    query s1          x  x  x  x  .  . |  x  x  x     slot -> committed: up to its anchor
    query s3          x  x  x  x  .  . |  x  x  x     slot <-> slot: bidirectional, own block only

Consequence: no committed position ever depends on a slot, so a decode step may append slots after
the committed tokens and drop them afterwards at no cost to the KV cache (tested in test_masks).

`True` means "may attend" (the convention of `F.scaled_dot_product_attention`'s boolean mask).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def decode_mask(
    start: int,
    n_committed: int,
    n_slots: int,
    key_valid: torch.Tensor | None = None,
    device: torch.device | str | None = None,
    anchors: Sequence[int] | None = None,
) -> torch.Tensor | None:
    """Mask for one decode step: `n_committed` new committed tokens then `n_slots` slots in blocks.

    The new tokens sit at cache indices [start, start + T), T = n_committed + n_slots. By default the
    slots form one block anchored at the last new committed token, so they see every committed key and
    each other. With `anchors`, the slots form len(anchors) equal blocks; block m is anchored at new
    committed token anchors[m] (an index in [0, n_committed)) and sees committed keys up to it and its
    own block (`verified` drafts from every draft position this way, see `policies.VerifiedPolicy`).

    Args:
        start: cache index of the first new token (= number of positions already cached).
        n_committed: new committed tokens this step (>= 1), or 0 for a drafting pass: one block of
            slots anchored at the cache's last token (cache index start - 1).
        n_slots: slots appended after them (>= 0), len(anchors) blocks of equal size.
        key_valid: (B, S_max) bool, False at left-padding positions of a batch; None when unpadded.
        device: where to build the mask (default: key_valid's device, else CPU).
        anchors: block anchors as indices into the new committed tokens; None = one block at the last.
    Returns:
        (1|B, 1, T, start + T) bool, or None when every query may see every key (at most one new
        committed token and one block, without padding).
    """
    T = n_committed + n_slots
    S = start + T
    if n_committed <= 1 and anchors is None and key_valid is None:
        return None  # at most one new committed token and one block after it: every key is visible
    if key_valid is not None:
        device = key_valid.device
    # Committed query i (cache index start + i) sees keys up to its own: a lower triangle offset by
    # start (two calls; a decode step pays per call). Slots see every key, or, in blocks, as below.
    mask = torch.ones(T, S, dtype=torch.bool, device=device).tril_(start)  # (T, S)
    if anchors is not None:
        keys = torch.arange(S, device=device)  # (S,)
        if not anchors or n_slots % len(anchors):
            raise ValueError(f"{n_slots} slots do not split into {len(anchors)} equal blocks")
        size = n_slots // len(anchors)
        block = torch.arange(n_slots, device=device) // size  # (n_slots,) block of each slot
        anchor_key = start + torch.as_tensor(anchors, device=device)[block]  # (n_slots,)
        key_block = (keys - start - n_committed).div(size, rounding_mode="floor")  # (S,), < 0: committed
        committed_ok = keys[None, :] <= anchor_key[:, None]
        mask[n_committed:] = committed_ok | (key_block[None, :] == block[:, None])
    elif n_slots:
        mask[n_committed:] = True
    if key_valid is None:
        return mask[None, None]
    return mask[None, None] & key_valid[:, None, None, :S]


def training_mask(seq_len: int, anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """Mask for a training forward: a full committed sequence then M blocks of K slots.

    Block m's slots are anchored at committed index anchors[b, m] and predict x[anchor+1 .. anchor+K].

    Args:
        seq_len: T, committed positions.
        anchors: (B, M) long, anchor index of each block, in [0, T - 1).
        block_size: K, slots per block.
    Returns:
        (B, 1, T + M*K, T + M*K) bool.
    """
    B, M = anchors.shape
    K, T = block_size, seq_len
    device = anchors.device
    n = T + M * K
    mask = torch.zeros(B, n, n, dtype=torch.bool, device=device)
    pos = torch.arange(T, device=device)
    mask[:, :T, :T] = pos[None, :] <= pos[:, None]  # committed -> committed: causal
    # slot -> committed: up to and including the anchor. (B, M*K, T)
    slot_anchor = anchors.repeat_interleave(K, dim=1)  # (B, M*K)
    mask[:, T:, :T] = pos[None, None, :] <= slot_anchor[:, :, None]
    # slot <-> slot: within the same block only.
    block_id = torch.arange(M, device=device).repeat_interleave(K)  # (M*K,)
    mask[:, T:, T:] = block_id[None, :, None] == block_id[None, None, :]
    return mask[:, None]


def slot_positions(anchors: torch.Tensor, block_size: int) -> torch.Tensor:
    """RoPE positions of the slots of each block: anchor + 1 .. anchor + K. anchors: (B, M) -> (B, M*K)."""
    offsets = torch.arange(1, block_size + 1, device=anchors.device)
    return (anchors[:, :, None] + offsets[None, None, :]).flatten(1)
