"""Draft sources (`decode/sources.py`): what each proposes, the records it keeps, the NAR block's
back-off, and a new source added as one class."""

from __future__ import annotations

import math

import pytest

from tests.stubs import chain_stub
from yue.config import DecodeConfig
from yue.decode import loop
from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import StepCosts
from yue.decode.lookup import NgramIndex
from yue.decode.sources import (
    MAX_BACKOFF_DOUBLINGS,
    ContextCopies,
    CorpusDrafts,
    DraftSources,
    FreeSource,
    NarBlock,
)


def test_a_batch_proposal_is_cut_to_its_shortest_row_and_judged_by_its_shortest_match():
    # Row 0 ends in a repeated 3-gram (1 2 3: copies 4 5 1 2), row 1 in a repeated 2-gram (8 9: copies 7 8 9).
    contexts = [NgramIndex([1, 2, 3, 4, 5, 1, 2, 3]), NgramIndex([8, 9, 7, 8, 9])]
    proposal = ContextCopies().propose(contexts, 4)
    assert proposal.drafts == [[4, 5, 1], [7, 8, 9]] and proposal.key == 2
    assert ContextCopies().propose([contexts[0], NgramIndex([1, 2, 3])], 4) is None  # a row without any


def test_each_match_length_keeps_its_own_record_started_from_its_kinds_rates():
    rates = {"copy:2": [0.5], "corpus:2": [0.25]}
    copies = ContextCopies(rates)
    assert copies.record(2).survival(2) == [0.5, 0.25] and copies.record(3).survival(1) == [1.0]
    assert copies.record(2) is copies.record(2) and set(copies.records) == {2, 3}
    corpus = CorpusNgrams.build([([0, 1, 2, 3], 1)], 5, min_order=2, max_order=2, min_count=1, min_share=0.0)
    corpus_drafts = CorpusDrafts(corpus, rates)
    assert corpus_drafts.match(NgramIndex([4, 1, 2]), 3) == (2, [3])
    assert corpus_drafts.record(2).survival(1) == [0.25]
    assert NarBlock().record().survival(1) == [1.0]  # the NAR block's record has no prior


def test_the_record_in_flight_learns_from_the_next_verification():
    sources = DraftSources(free=[ContextCopies()], contexts=[NgramIndex([1])])
    sources.observe(3, 0)  # no free drafts in flight: the NAR block's record (draft 1 was judged)
    assert sources.block.record().reached == [1, 0, 0]
    sources.in_flight = sources.free[0].record(2)
    sources.observe(2, 2)
    assert sources.free[0].record(2).held == [1, 1] and sources.block.record().reached == [1, 0, 0]


def test_contexts_follow_rows_that_leave_and_join():
    a = DraftSources(free=[ContextCopies()], contexts=[NgramIndex([1]), NgramIndex([2])])
    b = DraftSources(free=[ContextCopies()], contexts=[NgramIndex([3])])
    a.select([1])
    a.join(b)
    a.extend([[4], [5]])
    assert [c.tokens for c in a.contexts] == [[2, 4], [3, 5]]


def test_the_nar_blocks_back_off_doubles_up_to_its_cap_and_ends_with_a_probe():
    block = NarBlock()
    stretches = []
    for _ in range(MAX_BACKOFF_DOUBLINGS + 2):
        block.back_off(reeval_every=3, probe=True)
        stretches.append(block.ar_stretch)
    assert stretches == [3, 6, 12, 24, 24]
    for _ in range(30):
        block.rest()
    assert block.ar_stretch == 0
    assert block.look() and not block.look()  # one probe after the stretch
    block.drafted(probing=True)  # a probe's drafts do not end the back-off
    assert block.futile_probes == MAX_BACKOFF_DOUBLINGS + 2
    block.drafted(probing=False)
    assert block.futile_probes == 0


class Walk(FreeSource):
    """A new source in one class: drafts the chain stub's walk (t -> t + 1 mod V - 1) from the last token."""

    name = "walk"

    def __init__(self, V: int) -> None:
        super().__init__()
        self.n = V - 1

    def match(self, context: NgramIndex, n: int) -> tuple[int, list[int]]:
        last = context.tokens[-1]
        return 1, [(last + i) % self.n for i in range(1, n + 1)]


@pytest.mark.parametrize("mode", ["verified", "hybrid"])
def test_a_new_free_source_is_drafted_verified_and_recorded(mode, monkeypatch):
    """Listed among the free sources, a `FreeSource` subclass is weighed by its record like the built-in
    ones: its drafts (always right here) are verified, kept, and the output is `ar`'s."""
    V, K, N = 12, 4, 40
    stub = chain_stub(V=V, K=K, slots_match=False)  # the NAR set's drafts never hold
    walk = Walk(V)
    monkeypatch.setattr(loop, "free_sources", lambda *args: [walk])
    flat = StepCosts((1.0,) * 16, (0.0,))
    cfg = DecodeConfig(
        mode=mode, max_new_tokens=N, router_threshold=0.0 if mode == "hybrid" else 1.0, block_size=K
    )
    ar = [
        t for em in loop.decode(stub, [[1]], DecodeConfig(mode="ar", max_new_tokens=N)) for t in em.tokens[0]
    ]
    stub.forwards = 0
    got = [t for em in loop.decode(stub, [[1]], cfg, costs=flat) for t in em.tokens[0]]
    assert got == ar
    assert stub.forwards <= math.ceil(N / K) + 2  # K - 1 walk drafts + the AR token per step
    assert walk.record(1).reached and walk.record(1).held[0] == walk.record(1).reached[0]
