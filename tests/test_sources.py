"""Draft sources (`decode/sources.py`): what each proposes, the records it keeps, the NAR block's
back-off, and a new source added as one class."""

from __future__ import annotations

import math

import pytest

import yue
from tests.stubs import chain_stub
from yue.config import DecodeConfig, YueConfig
from yue.decode import loop
from yue.decode.corpus import CorpusNgrams
from yue.decode.costs import StepCosts
from yue.decode.lookup import NgramIndex
from yue.decode.sources import (
    MAX_BACKOFF_DOUBLINGS,
    AcceptanceRecord,
    ContextCopies,
    CorpusDrafts,
    DraftSources,
    FreeSource,
    NarBlock,
    draft_rates,
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


def test_a_sampled_request_starts_from_the_rates_measured_at_the_nearest_temperature():
    """Greedy requests start their records from the greedy rates; sampled ones from the rates measured
    on answers sampled at the temperature nearest theirs; a model without sampled rates: the greedy."""
    greedy = {"copy:2": [0.5]}
    sampled = {"0.7": {"copy:2": [0.4]}, "1.2": {"copy:2": [0.3]}}
    config = YueConfig(free_draft_rates=greedy, sampled_draft_rates=sampled)
    assert draft_rates(config, 0.0) == greedy
    assert draft_rates(config, 0.5) == sampled["0.7"] and draft_rates(config, 0.7) == sampled["0.7"]
    assert draft_rates(config, 1.0) == sampled["1.2"]
    assert draft_rates(YueConfig(free_draft_rates=greedy), 0.7) == greedy
    assert draft_rates(YueConfig(), 0.7) == {}


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


# Which source wrote each output token (`GenerationStats.token_sources`, `StepEmission.writers`).
REPEATS = "def alpha_1(x):\n    return beta(x) + 1\n\n" * 2 + "def alpha_1(x):\n"


@pytest.mark.parametrize("mode", ["ar", "verified", "hybrid", "nar"])
def test_token_sources_sum_to_the_output_length(trained_model_dir, mode):
    """Per request, ended by EOS or by the budget, alone or in a batch: every token is counted once."""
    engine = yue.load(trained_model_dir)
    runs = [engine.generate("def alpha_1(x):\n", mode=mode, max_new_tokens=48)]  # ends at EOS
    runs += engine.generate([REPEATS, "class Point:\n"], mode=mode, max_new_tokens=40, ignore_eos=True)
    assert any(r.finish_reason == "eos" for r in runs) and any(r.finish_reason == "length" for r in runs)
    for r in runs:
        s = r.stats
        assert sum(s.token_sources.values()) == s.new_tokens == len(r.token_ids)
        assert sum(s.token_shares.values()) == pytest.approx(1.0)
        # An accepted NAR draft is the NAR set's on both counts; `hybrid` labels kept free drafts "nar"
        # too (they may not be the AR path's choice), but counts them for their source.
        drafted = s.new_tokens - s.token_sources["ar"]
        if mode == "hybrid":
            assert drafted == s.nar_tokens
        else:
            assert s.token_sources["nar"] == s.nar_tokens
    if mode == "ar":
        assert all(r.stats.token_sources["ar"] == r.stats.new_tokens for r in runs)
    if mode == "nar":
        assert all(r.stats.token_sources["nar"] > 0 for r in runs)


def test_without_nar_drafts_the_nar_share_is_zero_and_copies_write_the_repeats(trained_model_dir):
    """`drafting_slots=1` runs no NAR drafting pass; on a prompt that repeats itself, context copies
    write tokens, and the output is `ar`'s."""
    engine = yue.load(trained_model_dir)
    kw = dict(max_new_tokens=48, ignore_eos=True)
    ar = engine.generate(REPEATS, mode="ar", **kw)
    r = engine.generate(REPEATS, mode="verified", drafting_slots=1, **kw)
    assert r.token_ids == ar.token_ids
    assert r.stats.token_sources["nar"] == 0 and r.stats.token_sources["copy"] > 0
    assert r.stats.token_sources["copy"] + r.stats.token_sources["ar"] == 48
    off = engine.generate(REPEATS, mode="verified", drafting_slots=1, prompt_lookup=False, **kw)
    assert off.stats.token_sources == {"nar": 0, "copy": 0, "corpus": 0, "ar": 48}


def test_corpus_drafts_are_counted_for_the_corpus_and_a_new_source_by_its_name(monkeypatch):
    """The chain stub's NAR drafts never hold: with a corpus of its walk, the kept drafts are the
    corpus's; with a new source listed, its own. Each step's writers line up with its tokens."""
    V, K, N = 12, 4, 40
    path = [(1 + i) % (V - 1) for i in range(1, N + 1)]  # the stub's greedy walk after token 1
    walk_corpus = CorpusNgrams.build([([0, *path], 1)], V, min_count=1, min_share=0.0)
    cfg = DecodeConfig(
        mode="verified", max_new_tokens=N, router_threshold=1.0, block_size=K, prompt_lookup=False
    )

    def writers(corpus=None) -> list[str]:
        out = []
        for em in loop.decode(chain_stub(V=V, K=K, slots_match=False), [[1]], cfg, corpus=corpus):
            assert [len(w) for w in em.writers] == [len(t) for t in em.tokens]
            out += em.writers[0]
        return out

    got = writers(walk_corpus)
    assert len(got) == N and got.count("corpus") > N / 2 and "nar" not in got and "copy" not in got
    walk = Walk(V)
    monkeypatch.setattr(loop, "free_sources", lambda *args: [walk])
    got = writers()
    assert got.count("walk") > N / 2 and set(got) == {"walk", "ar"}


def test_a_sampled_step_judges_every_drafted_position_by_its_chance():
    """Sampling: each drafted position counts (past the first rejection too), held by the chance the
    rule accepted it (`judged`), not by the draw."""
    rec = AcceptanceRecord()
    rec.observe(3, 0, judged=[0.5, 0.25, 1.0])
    assert rec.reached == [1, 1, 1] and rec.held == [0.5, 0.25, 1.0]
    greedy = AcceptanceRecord()
    greedy.observe(3, 0)
    assert greedy.reached == [1, 0, 0] and greedy.held == [0, 0, 0]


def test_judged_rates_are_min_1_p_over_q_averaged_over_the_rows_that_drafted_each_position():
    import math

    import torch

    from yue.decode.sampling import judged_rates

    V = 4
    p = torch.full((2, 2, V), math.log(0.25))  # the target: uniform
    q = torch.full((2, 2, V), -math.inf)
    q[:, :, 1] = 0.0  # drafts proposed with certainty (free drafts): accepted with p(x) = 0.25
    q[1, 1] = math.log(0.25)  # row 1's second draft from q == p: accepted for sure
    drafts = torch.ones(2, 2, dtype=torch.long)
    assert judged_rates(p, q, drafts, [2, 2]) == pytest.approx([0.25, 0.625])
    # row 0 drafted only its last column (its first is filler): position 1 is row 0's column 1
    assert judged_rates(p, q, drafts, [1, 2]) == pytest.approx([0.25, 1.0])
