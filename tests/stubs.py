"""Stub models whose logits the test chooses, to pin down never/always/sometimes-accept behaviour.

A stub is a first-order Markov "language model" over a tiny vocabulary: the AR logits at a position
depend only on the token there (`ar_table[token]`), and slot i of a block anchored at token a gets
`slot_table[i-1][a]`. Blocks are told apart by their RoPE positions (a block's slots sit at its
anchor's position + 1, + 2, ...), and anchors are looked up among every token fed so far by position,
so fused multi-block steps and separate drafting passes (anchored at a cached token) both work: the
stub keeps each fed token and its position in its own KV cache (k holds the token, v the position), so
rows that accept different counts, leave or join a batch keep their history. It
implements just what the decode loop calls: config, device, router (router_features), new_cache() and step(), and
counts its forward passes (drafting passes apart).
"""

from __future__ import annotations

from types import SimpleNamespace

import torch

from yue.model.cache import KVCache
from yue.model.mot import StepOutput


class AcceptAllRouter:
    """Router stand-in: every slot's acceptance is ~1 (p_ar ~ 0)."""

    def features(self, hidden_last, ar_logits_last, slot_logits, slot1_revealed=False):
        return torch.zeros(slot_logits.shape[0], slot_logits.shape[1])

    def __call__(self, features):
        return torch.full_like(features, 30.0)


class MarkovStub:
    def __init__(self, ar_table: torch.Tensor, slot_table: torch.Tensor) -> None:
        """ar_table: (V, V) next-token logits by current token; slot_table: (K, V, V) by anchor token."""
        V = ar_table.shape[0]
        K = slot_table.shape[0]
        self.ar_table, self.slot_table = ar_table, slot_table
        self.config = SimpleNamespace(
            pad_token_id=0,
            mask_token_id=V - 1,
            eos_token_id=None,
            vocab_size=V,
            block_size=K,
            drafting_slots=None,
            draft_gate=1.0,
            free_draft_rates=None,
        )
        self.device = torch.device("cpu")
        self.router = AcceptAllRouter()
        self.forwards = 0
        self.draft_passes = 0  # forwards with no committed token (separate drafting)

    def router_features(
        self, hidden_last, ar_logits_last, slot_logits, slot1_revealed=False, ar_entropy=None
    ):
        return self.router.features(
            hidden_last, ar_logits_last, slot_logits, slot1_revealed, ar_entropy=ar_entropy
        )

    def new_cache(self, batch_size: int, capacity: int) -> KVCache:
        return KVCache(1, batch_size, 1, 1, capacity, "cpu", torch.float32)

    def step(
        self,
        tokens,
        positions,
        n_committed,
        mask,
        cache,
        n_logits=None,
        anchor_entry=None,
        top1=False,
        ar_entropy=False,
    ) -> StepOutput:
        self.forwards += 1
        self.draft_passes += n_committed == 0
        B = tokens.shape[0]
        committed = tokens[:, :n_committed]
        n_slots = tokens.shape[1] - n_committed
        ar = self.ar_table[committed]  # (B, n_c, V)
        pos = positions.expand(B, -1)
        start, end = cache.length, cache.length + n_committed
        cache.k[0, :, 0, start:end, 0] = committed.float()
        cache.v[0, :, 0, start:end, 0] = pos[:, :n_committed].float()
        known = torch.ones(B, end, dtype=torch.bool) if cache.key_valid is None else cache.key_valid[:, :end]
        rows = []
        for j in range(n_committed, n_committed + n_slots):
            if j == n_committed or bool((pos[:, j] != pos[:, j - 1] + 1).any()):  # a new block starts here
                # Each row's anchor: the last valid column holding position pos - 1.
                hit = known & (cache.v[0, :, 0, :end, 0] == (pos[:, j] - 1).float()[:, None])
                col = end - 1 - hit.flip(1).int().argmax(1)
                anchor, i = cache.k[0, torch.arange(B), 0, col, 0].long(), 0
            rows.append(self.slot_table[i][anchor])
            i += 1
        slots = torch.stack(rows, dim=1) if rows else ar.new_zeros(B, 0, ar.shape[-1])
        hidden = torch.zeros(B, tokens.shape[1], 1)
        return StepOutput(ar if n_logits is None else ar[:, n_committed - n_logits :], slots, hidden)


def chain_stub(V: int, K: int, slots_match: bool) -> MarkovStub:
    """Greedy AR walks the cycle t -> t+1 (mod V-1, never the mask id V-1). Slots either predict that
    walk exactly (always accepted) or a token that is always wrong (never accepted)."""
    n = V - 1
    nxt = lambda t, i: (t + i) % n  # noqa: E731
    ar = torch.full((V, V), -10.0)
    for t in range(V):
        ar[t, nxt(t, 1)] = 10.0
    slots = torch.full((K, V, V), -10.0)
    for i in range(K):
        for a in range(V):
            slots[i, a, nxt(a, i + 1) if slots_match else nxt(a, i + 2)] = 10.0
    return MarkovStub(ar, slots)
