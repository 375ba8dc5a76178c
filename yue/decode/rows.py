"""A batch's rows and the groups of rows that run the same forwards: leaving, joining.

Design decisions:
- A `Group` is what one forward serves: its rows, their KV cache and the policy state (`LoopState`),
  all row-aligned. Rows leave by a gather on the batch dimension (`select`), so a finished or
  cancelled row stops costing compute at once; a group of freshly prefilled rows joins a running one
  by `merge`.
- The policy state is rectangular (`fed` is (B, n)); a joining group's fed block may be wider or
  narrower than the running one's, so `merge` brings both to one width: trailing drafts can always be
  dropped (they are proposals); a narrower block (hybrid only: its committed counts differ by group)
  gets filler drafts, which verification handles by its exact rule.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from yue.config import DecodeConfig
from yue.decode.sampling import one_hot_logprobs
from yue.decode.state import LoopState
from yue.model.cache import KVCache


@dataclass
class Row:
    """One request in a batch: its settings, its generator, tokens left, and why it stopped."""

    id: int
    prompt: list[int]
    cfg: DecodeConfig
    generator: torch.Generator | None
    budget: int
    eos_ids: frozenset[int]
    finish: str | None = None


@dataclass
class Group:
    """Rows decoded by the same forwards: their cache rows and the policy state, row-aligned."""

    rows: list[Row]
    cache: KVCache
    st: LoopState
    index: int = 0  # steps run (the trace's step number)


def select(g: Group, keep: list[int]) -> Group | None:
    """The group with only rows `keep` (indices), or None when none is left."""
    if not keep:
        return None
    if len(keep) == len(g.rows):
        return g
    st = g.st
    index = torch.tensor(keep, device=st.fed.device)
    g.cache.select(keep)
    st.fed = st.fed.index_select(0, index)
    st.n_drafts = [st.n_drafts[i] for i in keep]
    st.generators = [st.generators[i] for i in keep]
    st.drafts.select(keep)
    if st.draft_logprobs is not None:
        st.draft_logprobs = st.draft_logprobs.index_select(0, index)
    if st.seen is not None:
        st.seen = st.seen.index_select(0, index)
    if st.counts is not None:
        st.counts = st.counts.index_select(0, index)
    g.rows = [g.rows[i] for i in keep]
    return g


def without_finished(g: Group) -> Group | None:
    return select(g, [i for i, r in enumerate(g.rows) if r.finish is None])


def merge(a: Group, b: Group, vocab: int) -> Group:
    """Group b's rows appended to group a's: caches joined, fed blocks brought to one width.

    A row's fed is its committed tokens (always fed) then its drafts (optional). The common width is
    the narrower group's, or every row's committed count if that is more: wider rows drop trailing
    drafts (always safe: drafts are only proposals), narrower ones (hybrid only, whose committed counts
    differ) get filler drafts, their last token repeated, with a one-hot q when sampling, which
    verification rejects or accepts by the exact rule.
    """
    committed = max(w - n for g in (a, b) for w, n in ((g.st.fed.shape[1], n) for n in g.st.n_drafts))
    width = max(committed, min(a.st.fed.shape[1], b.st.fed.shape[1]))
    for g in (a, b):
        _fit_width(g.st, width, vocab)
    a.cache.join(b.cache)
    sa, sb = a.st, b.st
    k = max(sa.max_drafts, sb.max_drafts)
    if sa.draft_logprobs is not None or sb.draft_logprobs is not None:
        sa.draft_logprobs = torch.cat([_tail_logprobs(s, k, vocab) for s in (sa, sb)])
    sa.fed = torch.cat([sa.fed, sb.fed])
    sa.n_drafts = sa.n_drafts + sb.n_drafts
    sa.generators = sa.generators + sb.generators
    sa.drafts.join(sb.drafts)
    if sa.seen is not None:
        sa.seen = torch.cat([sa.seen, sb.seen])
    if sa.counts is not None:
        sa.counts = torch.cat([sa.counts, sb.counts])
    a.rows = a.rows + b.rows
    return a


def _fit_width(st: LoopState, width: int, vocab: int) -> None:
    """Bring st.fed to `width` columns by dropping trailing drafts or appending filler drafts."""
    W = st.fed.shape[1]
    if W > width:
        st.fed = st.fed[:, :width]
        st.n_drafts = [n - (W - width) for n in st.n_drafts]
        if st.draft_logprobs is not None:
            st.draft_logprobs = st.draft_logprobs[:, : st.draft_logprobs.shape[1] - (W - width)]
    elif W < width:
        filler = st.fed[:, -1:].expand(-1, width - W)
        st.fed = torch.cat([st.fed, filler], dim=1)
        st.n_drafts = [n + width - W for n in st.n_drafts]
        if not st.cfg.greedy:
            q = one_hot_logprobs(filler, vocab)
            st.draft_logprobs = q if st.draft_logprobs is None else torch.cat([st.draft_logprobs, q], dim=1)


def _tail_logprobs(st: LoopState, k: int, vocab: int) -> torch.Tensor:
    """st.draft_logprobs as (B, k, V), aligned to the tail (leading entries unused); zeros for a group
    with no drafts in flight (its acceptance record stopped drafting), whose entries are all unused."""
    q = st.draft_logprobs
    if q is None:
        assert st.max_drafts == 0, "a sampled group with drafts has their log-probs"
        return torch.zeros(st.fed.shape[0], k, vocab, device=st.fed.device)
    if q.shape[1] == k:
        return q
    return torch.cat([q.new_zeros(q.shape[0], k - q.shape[1], q.shape[2]), q], dim=1)
