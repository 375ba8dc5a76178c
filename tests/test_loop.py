"""Invariants of the decode loop: verified == ar, the fused one-forward step, speculative sampling."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import replace

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from scipy.stats import chi2_contingency, chisquare

import yue
from tests.stubs import MarkovStub, chain_stub
from yue.config import DecodeConfig
from yue.decode.costs import StepCosts
from yue.decode.lookup import NgramIndex
from yue.decode.loop import decode
from yue.decode.sampling import sample_from_probs, within_tolerance
from yue.decode.sources import AcceptanceRecord

PROMPT_PIECES = [
    "def ",
    "alpha",
    "_3",
    "(x):\n",
    "    return ",
    "beta",
    "(x) + 7\n",
    "\n",
    "class ",
    "gamma",
    "中文",
    " ",
]


# Step costs under which drafting is free: every block is drafted whole (at threshold 1, the request's
# acceptance record never finds a draft not worth verifying), so the drafting mechanics are tested
# apart from the cost model (tested below with the default costs).
FLAT = StepCosts((1.0,) * 16, (0.0,))


@pytest.fixture(scope="module")
def trained(trained_model_dir):
    engine = yue.load(trained_model_dir)
    engine.costs = FLAT
    return engine


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.sampled_from(PROMPT_PIECES), min_size=0, max_size=6),
    threshold=st.sampled_from([0.0, 0.3, 0.65, 1.0]),
    block_size=st.sampled_from([1, 4, 8]),
    drafting=st.sampled_from(["separate", "fused"]),
    drafting_slots=st.sampled_from([None, 1, 2, 3]),
)
def test_verified_greedy_equals_ar_token_for_token(
    trained, pieces, threshold, block_size, drafting, drafting_slots
):
    prompt = "".join(pieces)
    ar = trained.generate(prompt, mode="ar", max_new_tokens=40)
    ver = trained.generate(
        prompt,
        mode="verified",
        max_new_tokens=40,
        router_threshold=threshold,
        block_size=block_size,
        drafting=drafting,
        drafting_slots=None if drafting_slots is None else min(drafting_slots, block_size),
    )
    assert ver.token_ids == ar.token_ids
    assert ver.text == ar.text


def test_verified_really_accepts_and_rejects_drafts(trained):
    """Guard against a vacuous equality test: the trained tiny model's drafts are sometimes kept."""
    prompts = ["def alpha_1(x):\n", "def beta", "    return gamma(x) + 4\n\ndef "]
    stats = [
        trained.generate(p, mode="verified", max_new_tokens=40, router_threshold=1.0).stats for p in prompts
    ]
    assert sum(s.accepted for s in stats) > 0
    assert sum(s.drafted - s.accepted for s in stats) > 0


def test_verified_with_repetition_penalty_equals_ar(trained):
    for prompt in ["def alpha_1(x):\n", "class "]:
        kw = dict(max_new_tokens=40, repetition_penalty=1.3)
        ar = trained.generate(prompt, mode="ar", **kw)
        ver = trained.generate(prompt, mode="verified", router_threshold=1.0, **kw)
        assert ver.token_ids == ar.token_ids


@pytest.mark.parametrize("drafting", ["separate", "fused"])
def test_batched_verified_equals_single_prompt_ar(trained, drafting):
    prompts = ["def alpha_1(x):\n", "x", "class Point:\n    def "]
    kw = dict(mode="verified", max_new_tokens=30, router_threshold=1.0, drafting=drafting)
    batch = trained.generate(prompts, **kw)
    for p, r in zip(prompts, batch, strict=True):
        assert r.token_ids == trained.generate(p, mode="ar", max_new_tokens=30).token_ids


def test_both_draftings_draft_after_partial_rejections(trained):
    """Whichever prefix of a draft is accepted, the next step verifies a fresh draft (a block anchored
    at the last accepted token), in both draftings, for the same (exact) tokens."""
    prompts = ["def alpha_1(x):\n", "def beta", "    return gamma(x) + 4\n\ndef ", "class "]
    kw = dict(mode="verified", max_new_tokens=40, router_threshold=1.0)
    ar = [trained.generate(p, mode="ar", max_new_tokens=40).token_ids for p in prompts]
    for drafting in ("separate", "fused"):
        runs = [trained.generate(p, drafting=drafting, **kw) for p in prompts]
        assert [r.token_ids for r in runs] == ar
        assert sum(r.stats.drafted - r.stats.accepted for r in runs) > 0  # partial rejections happened
        for r in runs:
            steps = r.stats.forwards - r.stats.draft_passes  # the verifying forwards, prefill included
            assert r.stats.draft_passes == (steps if drafting == "separate" else 0) or r.stats.new_tokens < 40
            if r.stats.new_tokens == 40:  # every step after the prefill verified 7 drafts
                assert r.stats.drafted >= (steps - 1) * 7


def _run(stub, cfg, prompt=(1,), costs=FLAT):
    return [t for em in decode(stub, [list(prompt)], cfg, costs=costs) for t in em.tokens[0]]


def _nar_drafts(N: int, K: int, **kw) -> DecodeConfig:
    """`verified` at threshold 1 drafting the NAR set's blocks only (no copies from the context), so a
    stub's slot tables alone decide what is accepted."""
    return DecodeConfig(
        mode="verified", max_new_tokens=N, router_threshold=1.0, block_size=K, prompt_lookup=False, **kw
    )


@pytest.mark.parametrize("drafting", ["separate", "fused"])
@pytest.mark.parametrize("K", [2, 4, 8])
def test_always_matching_drafts_need_at_most_n_over_k_plus_2_steps(K, drafting):
    N = 64
    stub = chain_stub(V=12, K=K, slots_match=True)
    cfg = _nar_drafts(N, K, drafting=drafting)
    tokens = _run(stub, cfg)
    assert tokens == _run(chain_stub(12, K, True), DecodeConfig(mode="ar", max_new_tokens=N))
    steps = stub.forwards - stub.draft_passes
    assert steps <= math.ceil(N / K) + 2
    # Separate drafting adds one NAR-only pass per step that drafts; fused adds none.
    assert stub.draft_passes == (0 if drafting == "fused" else pytest.approx(steps, abs=1))


@pytest.mark.parametrize("slots", [2, 3, 5])
def test_a_drafting_pass_computes_drafting_slots_and_verifies_at_most_their_drafts(slots):
    """`drafting_slots` slots a pass (slot 1 revealed): always-matching slots give slots - 1 drafts a
    step, not K - 1, with the same tokens as `ar`."""
    N, K = 48, 8
    stub = chain_stub(V=12, K=K, slots_match=True)
    seen = []
    step = stub.step

    def counting(tokens, positions, n_committed, *args, **kwargs):
        if n_committed == 0:
            seen.append(tokens.shape[1])
        return step(tokens, positions, n_committed, *args, **kwargs)

    stub.step = counting
    cfg = _nar_drafts(N, K, drafting_slots=slots)
    assert _run(stub, cfg) == _run(chain_stub(12, K, True), DecodeConfig(mode="ar", max_new_tokens=N))
    assert seen and set(seen) == {slots}
    steps = stub.forwards - stub.draft_passes
    assert steps >= N // slots  # each step writes at most slots - 1 drafts + the AR token


def test_drafting_slots_default_to_the_models_and_are_checked():
    from yue.config import YueConfig

    config = YueConfig(block_size=8, drafting_slots=3)
    assert DecodeConfig(mode="verified").resolved(config).drafting_slots == 3
    assert DecodeConfig(mode="verified", block_size=2).resolved(config).drafting_slots == 2  # capped
    assert DecodeConfig(mode="nar").resolved(config).drafting_slots == 8  # nar commits whole blocks
    assert DecodeConfig(mode="verified").resolved(YueConfig(block_size=8)).drafting_slots == 8
    with pytest.raises(ValueError, match="drafting_slots"):
        DecodeConfig(mode="verified", block_size=4, drafting_slots=5).resolved(config)
    with pytest.raises(ValueError, match="drafting_slots"):
        DecodeConfig(drafting_slots=0)
    with pytest.raises(ValueError, match="drafting_slots"):
        YueConfig(block_size=4, drafting_slots=5)


@pytest.mark.parametrize("drafting", ["separate", "fused"])
@pytest.mark.parametrize("K", [4, 8])
def test_drafts_half_match_every_step_still_verifies_a_fresh_draft(K, drafting):
    """Slots right at 1 and wrong after: every verify step accepts 1 draft, and the next step still
    verifies a fresh draft (anchored at the accepted one): 2 tokens per step."""
    N, V = 64, 12
    nxt = lambda t, i: (t + i) % (V - 1)  # noqa: E731
    s = chain_stub(V, K, slots_match=True)
    for i in range(2, K):  # slot 3.. (draft 2..) wrong
        for a in range(V):
            s.slot_table[i, a] = -10.0
            s.slot_table[i, a, nxt(a, i + 2)] = 10.0
    ar = _run(chain_stub(V, K, True), DecodeConfig(mode="ar", max_new_tokens=N))
    cfg = _nar_drafts(N, K, drafting=drafting)
    assert _run(s, cfg) == ar
    assert s.forwards - s.draft_passes <= N // 2 + 2


@pytest.mark.parametrize("drafting", ["separate", "fused"])
def test_never_matching_drafts_cost_about_one_step_per_token(drafting):
    N = 64
    stub = chain_stub(V=12, K=4, slots_match=False)
    cfg = _nar_drafts(
        N, 4, drafting=drafting, reeval_every=5
    )  # the margin may stop drafting (`DRAFT_MARGIN`)
    tokens = _run(stub, cfg)
    assert tokens == _run(chain_stub(12, 4, False), DecodeConfig(mode="ar", max_new_tokens=N))
    assert N - 1 <= stub.forwards - stub.draft_passes <= N + 1


def test_acceptance_record_stops_drafting_drafts_that_never_match():
    """Threshold 1 with real (default) step costs: after a few rejected blocks the request's record
    finds no draft worth its verifying rows and drafting pass, so steps go plain AR, with a whole-block
    probe after each (doubling) AR stretch; output stays exact."""
    N = 128
    stub = chain_stub(V=12, K=8, slots_match=False)
    cfg = _nar_drafts(N, 8, reeval_every=5)
    assert _run(stub, cfg, costs=None) == _run(
        chain_stub(12, 8, False), DecodeConfig(mode="ar", max_new_tokens=N)
    )
    assert stub.draft_passes < N / 4  # drafting every step would be one pass per token


def test_acceptance_record_keeps_drafting_drafts_that_match():
    """The same costs, drafts that always match: the record keeps the whole block drafted."""
    N, K = 128, 8
    stub = chain_stub(V=12, K=K, slots_match=True)
    cfg = _nar_drafts(N, K, reeval_every=5)
    _run(stub, cfg, costs=None)
    assert stub.forwards - stub.draft_passes <= math.ceil(N / K) + 2


def test_record_survival_estimates_follow_what_was_accepted():
    rec = AcceptanceRecord()
    assert rec.survival(3) == [1.0, 1.0, 1.0] and rec.ratio == 1.0  # the priors: draft
    for _ in range(8):
        rec.observe(drafted=3, accepted=1)  # draft 1 always held, draft 2 never
    s = rec.survival(4)
    # Draft 2 was judged 8 times and never held; drafts 3-4, never judged, inherit draft 2's rate.
    assert s[0] == 1.0 and s[1] == pytest.approx(2 / 10)
    assert s[2] == pytest.approx((2 / 10) ** 2) and s[3] == pytest.approx((2 / 10) ** 3)
    rec.pending = 2.0
    rec.observe(drafted=3, accepted=0)  # the router expected 2 and none held
    assert rec.ratio == pytest.approx(2 / 4)
    assert rec.reached[:2] == [9, 8] and rec.held[:2] == [8, 0]  # only draft 1 was judged


def test_record_survival_starts_from_measured_rates_where_given():
    """A record with a prior (`YueConfig.free_draft_rates`) starts from its rates, past them from the
    last one, and the request's own steps pull it toward what they saw (the prior worth PRIOR steps)."""
    rec = AcceptanceRecord(prior=(0.5, 0.8))
    assert rec.survival(3) == pytest.approx([0.5, 0.4, 0.32])
    for _ in range(8):
        rec.observe(drafted=1, accepted=1)  # draft 1 held every time it was judged
    assert rec.survival(1) == pytest.approx([(8 + 2 * 0.5) / 10])


def test_record_survival_decays_past_the_positions_it_has_seen():
    """One step whose whole block failed at its first draft: the estimate of a long prefix falls
    geometrically (each later draft inherits draft 1's rate), so a costly block is not drafted again
    on the strength of the prior alone."""
    rec = AcceptanceRecord()
    rec.observe(drafted=8, accepted=0)
    s = rec.survival(8)
    assert s[0] == pytest.approx(2 / 3) and s[7] == pytest.approx((2 / 3) ** 8)
    assert all(a >= b for a, b in zip(s, s[1:], strict=False))


def _random_stub(seed: int, V: int = 5, K: int = 4) -> MarkovStub:
    g = torch.Generator().manual_seed(seed)
    ar = torch.randn(V, V, generator=g) * 1.5
    slots = torch.randn(K, V, V, generator=g) * 1.5  # q differs from p: many rejections
    ar[:, V - 1] = slots[:, :, V - 1] = -1e9  # never emit the mask id
    return MarkovStub(ar, slots)


def _sample_prefixes(
    mode: str,
    n: int,
    seed: int,
    length: int = 3,
    drafting: str = "separate",
    threshold: float = 1.0,
    lookup: bool = False,
    tail: int = 3,
    temperature: float = 1.0,
    top_p: float = 1.0,
) -> Counter:
    """Joint distribution of tokens length - tail .. length over n lockstep rows (one decode call)."""
    stub = _random_stub(0)
    cfg = DecodeConfig(
        mode=mode,
        max_new_tokens=length,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
        router_threshold=threshold,
        block_size=4,
        drafting=drafting,
        prompt_lookup=lookup,
    )
    rows: list[list[int]] = [[] for _ in range(n)]
    for em in decode(stub, [[1]] * n, cfg, costs=FLAT):
        for r, t in zip(rows, em.tokens, strict=True):
            r.extend(t)
    return Counter(tuple(r[length - tail : length]) for r in rows)


def _chi2_pvalue(a: Counter, b: Counter) -> float:
    cells = sorted(set(a) | set(b))
    table = [[a.get(c, 0) + 0.5 for c in cells], [b.get(c, 0) + 0.5 for c in cells]]
    return chi2_contingency(table)[1]


def test_verified_sampling_matches_ar_distribution_chi_square():
    ar = _sample_prefixes("ar", 6000, seed=1)
    ver = _sample_prefixes("verified", 6000, seed=2)
    assert _chi2_pvalue(ar, ver) > 1e-3
    # Fused blocks: the third token is verified from the block anchored after the first.
    assert _chi2_pvalue(ar, _sample_prefixes("verified", 6000, seed=4, drafting="fused")) > 1e-3
    # Power check: the same test does detect a real difference (unverified drafts, `nar` mode).
    assert _chi2_pvalue(ar, _sample_prefixes("nar", 6000, seed=3)) < 1e-6


def test_the_sampler_draws_each_token_in_proportion_to_its_weight_and_never_a_zero_weight():
    """`sample_from_probs` (inverse CDF in float64) against the weights it is given, by chi-square;
    zero-weight tokens (a nucleus cut, a speculative residual) never come out; a seed repeats its draws."""
    w = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 5.5])  # unnormalized, as a residual is
    g = torch.Generator().manual_seed(0)
    draws = sample_from_probs(w.expand(20000, -1), g)  # (20000,)
    counts = torch.bincount(draws, minlength=len(w))
    assert counts[w == 0].sum() == 0
    assert chisquare(counts[w > 0].numpy(), (w[w > 0] / w.sum() * len(draws)).numpy()).pvalue > 1e-3
    again = sample_from_probs(w.expand(20000, -1), torch.Generator().manual_seed(0))
    assert torch.equal(draws, again)
    assert sample_from_probs(torch.tensor([[0.0, 0.0, 2.0]]), g).tolist() == [2]  # one token of weight


def test_verified_sampling_at_a_chat_temperature_and_nucleus_matches_ar_distribution():
    """At the settings `yue bench --temperature 0.7 --top-p 0.9` runs with, `verified`'s tokens follow
    `ar`'s distribution (the nucleus cut applies to the target the drafts are verified against)."""
    kw = dict(temperature=0.7, top_p=0.9)
    ar = _sample_prefixes("ar", 6000, seed=1, **kw)
    assert _chi2_pvalue(ar, _sample_prefixes("verified", 6000, seed=2, **kw)) > 1e-3
    assert _chi2_pvalue(ar, _sample_prefixes("nar", 6000, seed=3, **kw)) < 1e-6  # the test's power


def test_verified_sampling_with_copied_drafts_matches_ar_distribution():
    """Copied drafts are certain proposals (q one-hot): the speculative rule keeps the distribution.
    Tokens 6-8 of 10, where a 5-token vocabulary makes repeated n-grams, so copies are drafted."""
    ar = _sample_prefixes("ar", 6000, seed=1, length=8)
    ver = _sample_prefixes("verified", 6000, seed=2, length=8, lookup=True)
    assert _chi2_pvalue(ar, ver) > 1e-3


def test_ngram_index_copies_what_followed_the_latest_longest_match():
    idx = NgramIndex([1, 2, 3, 4, 9, 2, 3, 5, 6])
    assert idx.match(3)[1] == []  # the trailing (5, 6) never occurred before
    idx.extend([7, 2, 3])
    assert idx.match(3)[1] == [5, 6, 7]  # (2, 3) last occurred before 5; the latest occurrence wins
    idx.extend([4])
    assert idx.match(2)[1] == [9, 2]  # (2, 3, 4) beats the shorter (3, 4) and (4,) is too short
    assert idx.match(2) == (3, [9, 2])  # ... and says how long a match it copies after
    idx.extend([8])
    assert idx.match(2) == (0, [])


def test_copied_drafts_follow_a_repeating_answer_and_stay_exact():
    """The AR walk repeats every 11 tokens and the NAR drafts never match: with prompt lookup the
    steps after the first cycle verify copies (no drafting pass), several tokens a step; output = ar."""
    N, K = 96, 8
    cfg = DecodeConfig(mode="verified", max_new_tokens=N, router_threshold=1.0, block_size=K, reeval_every=5)
    ar = _run(chain_stub(12, K, False), DecodeConfig(mode="ar", max_new_tokens=N))
    stub = chain_stub(V=12, K=K, slots_match=False)
    assert _run(stub, cfg, costs=None) == ar
    steps = stub.forwards - stub.draft_passes
    assert steps < N / 3 and stub.draft_passes < N / 8
    off = chain_stub(V=12, K=K, slots_match=False)
    _run(off, replace(cfg, prompt_lookup=False), costs=None)
    assert off.forwards - off.draft_passes > N - 2  # without copies: a token per step


def test_hybrid_drafts_copies_too_and_labels_them_drafts():
    """`hybrid` drafts copies from the context as `verified` does; its tolerance could keep a copy the
    AR path did not choose, so kept copies are labelled as drafts ("nar"), never as the AR path's."""
    N, K = 96, 8
    ar = _run(chain_stub(12, K, False), DecodeConfig(mode="ar", max_new_tokens=N))
    stub = chain_stub(V=12, K=K, slots_match=False)
    cfg = DecodeConfig(mode="hybrid", max_new_tokens=N, router_threshold=0.3, block_size=K, reeval_every=5)
    tokens, sources = [], []
    for em in decode(stub, [[1]], cfg, costs=None):
        tokens += em.tokens[0]
        sources += em.sources[0]
    assert tokens == ar  # the copies are the AR walk's own tokens
    assert stub.forwards - stub.draft_passes < N / 3 and sources.count("nar") > N / 2


def test_hybrid_sampling_at_tolerance_zero_matches_ar_and_is_lossy_above():
    """Sampled hybrid is speculative sampling plus the tolerance bound: at t = 0 it is exact in
    distribution; at t = 1 every draft is kept, which the same test detects."""
    ar = _sample_prefixes("ar", 6000, seed=1)
    assert _chi2_pvalue(ar, _sample_prefixes("hybrid", 6000, seed=5, threshold=0.0)) > 1e-3
    assert _chi2_pvalue(ar, _sample_prefixes("hybrid", 6000, seed=6, threshold=1.0)) < 1e-6


def test_same_seed_same_sample(trained):
    kw = dict(mode="verified", max_new_tokens=30, temperature=1.2, top_p=0.95, top_k=50, router_threshold=1.0)
    a = trained.generate("def alpha", seed=7, **kw)
    b = trained.generate("def alpha", seed=7, **kw)
    assert a.token_ids == b.token_ids
    others = {tuple(trained.generate("def alpha", seed=s, **kw).token_ids) for s in range(8, 14)}
    assert len(others | {tuple(a.token_ids)}) > 1  # the seed matters


@pytest.mark.parametrize("mode", ["hybrid", "nar"])
def test_lossy_modes_write_nar_tokens_and_respect_the_budget(trained, mode):
    nar_tokens = 0
    for prompt in ["def alpha_1(x):\n", "def beta", "    return gamma(x) + 4\n\ndef "]:
        r = trained.generate(prompt, mode=mode, max_new_tokens=33, router_threshold=1.0)
        assert len(r.token_ids) == 33 if r.finish_reason == "length" else r.finish_reason == "eos"
        assert len(r.token_ids) <= 33
        nar_tokens += r.stats.nar_tokens
    assert nar_tokens > 0


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    pieces=st.lists(st.sampled_from(PROMPT_PIECES), min_size=0, max_size=6),
    block_size=st.sampled_from([1, 4, 8]),
    drafting=st.sampled_from(["separate", "fused"]),
)
def test_hybrid_at_tolerance_zero_equals_verified_and_ar(trained, pieces, block_size, drafting):
    """Tolerance 0 accepts only the AR path's own choices: `verified`'s tokens and forwards, `ar`'s text."""
    prompt = "".join(pieces)
    kw = dict(max_new_tokens=40, block_size=block_size, drafting=drafting)
    ar = trained.generate(prompt, mode="ar", max_new_tokens=40)
    ver = trained.generate(prompt, mode="verified", router_threshold=1.0, **kw)
    hy = trained.generate(prompt, mode="hybrid", router_threshold=0.0, **kw)
    assert hy.token_ids == ver.token_ids == ar.token_ids
    assert (hy.stats.forwards, hy.stats.accepted) == (ver.stats.forwards, ver.stats.accepted)


def test_hybrid_accepts_more_as_the_tolerance_grows(trained):
    """A loose tolerance keeps drafts the AR path would not have chosen: more accepted, fewer forwards."""
    prompts = ["def alpha_1(x):\n", "def beta", "    return gamma(x) + 4\n\ndef ", "class "]

    def totals(t: float) -> tuple[int, int, int]:
        runs = [trained.generate(p, mode="hybrid", max_new_tokens=40, router_threshold=t) for p in prompts]
        return tuple(sum(getattr(r.stats, k) for r in runs) for k in ("accepted", "forwards", "new_tokens"))

    strict, loose = totals(0.0), totals(0.9)
    assert loose[0] / loose[1] > strict[0] / strict[1]  # accepted drafts per forward
    assert loose[2] / loose[1] > strict[2] / strict[1]  # tokens per forward


def test_within_tolerance_never_admits_a_token_below_the_bound():
    """Constructed logits: a token passes iff p(x) >= (1 - t) max p; t = 0 admits only the argmax
    (and exact ties), t = 1 every unfiltered token; logits and log-probs give the same answer."""
    g = torch.Generator().manual_seed(0)
    logits = torch.randn(64, 9, generator=g) * 3
    logits[:, 8] = float("-inf")  # a filtered token (top-k / top-p)
    p = logits.softmax(-1)
    top = p.max(-1).values
    for t in (0.0, 0.1, 0.5, 0.9, 1.0):
        for x in range(9):
            tokens = torch.full((64,), x)
            ok = within_tolerance(logits, tokens, t)
            assert torch.equal(ok, within_tolerance(logits.log_softmax(-1), tokens, t))
            px = p[:, x]
            assert not (ok & (px < (1 - t) * top * (1 - 1e-5))).any()  # never below the bound
            assert ok[px > (1 - t) * top * (1 + 1e-5)].all()  # always above it
            if t == 0.0:
                assert torch.equal(ok, logits.argmax(-1) == x)
            if t == 1.0:
                assert torch.equal(ok, torch.full((64,), x != 8))


def _near_tie_stub(V: int = 12, K: int = 4, ratio: float = 0.5) -> MarkovStub:
    """Greedy AR walks t -> t+1; t -> t+2 is its runner-up at `ratio` of its probability. Slot 1 of a
    block anchored at a guesses the AR token a+1, the later slots the runner-up walk from it (a+3, a+5,
    ...): drafts `verified` never keeps, within any tolerance above 1 - ratio."""
    n = V - 1
    ar = torch.full((V, V), -20.0)
    slots = torch.full((K, V, V), -20.0)
    for t in range(V):
        ar[t, (t + 1) % n] = 10.0
        ar[t, (t + 2) % n] = 10.0 + math.log(ratio)
        for i in range(K):
            slots[i, t, (t + 1 + 2 * i) % n] = 10.0
    return MarkovStub(ar, slots)


@pytest.mark.parametrize("drafting", ["separate", "fused"])
@pytest.mark.parametrize("tolerance, kept", [(0.0, False), (0.45, False), (0.55, True), (1.0, True)])
def test_hybrid_keeps_a_draft_only_within_the_tolerance(drafting, tolerance, kept):
    """Drafts at half the AR path's probability are rejected below t = 0.5 (the output is `ar`'s) and
    accepted above it; every token the NAR set wrote has p_AR >= (1 - t) max p_AR at its position."""
    N, K = 40, 4
    ar = _run(_near_tie_stub(K=K), DecodeConfig(mode="ar", max_new_tokens=N))
    stub = _near_tie_stub(K=K)
    cfg = DecodeConfig(  # the NAR set's drafts only (no copies from the context)
        mode="hybrid",
        max_new_tokens=N,
        router_threshold=tolerance,
        block_size=K,
        drafting=drafting,
        prompt_lookup=False,
    )
    tokens, sources = [], []
    for em in decode(stub, [[1]], cfg, costs=FLAT):
        tokens += em.tokens[0]
        sources += em.sources[0]
    assert len(tokens) == N
    p = stub.ar_table.softmax(-1)
    for prev, tok, src in zip([1] + tokens, tokens, sources, strict=False):
        if src == "nar":
            assert p[prev, tok] >= (1 - tolerance) * p[prev].max() - 1e-6
    if kept:
        assert tokens != ar and sources.count("nar") > N / 2
        assert stub.forwards - stub.draft_passes <= math.ceil(N / K) + 2
    else:
        assert tokens == ar and "nar" not in sources


def test_batched_hybrid_rows_keep_the_bound(trained):
    """Lockstep rows at a loose tolerance: each row's output continues with its own accepted drafts,
    and the batch writes what its rows would within the budget (no crash, full length)."""
    prompts = ["def alpha_1(x):\n", "x", "class Point:\n    def "]
    batch = trained.generate(prompts, mode="hybrid", max_new_tokens=30, router_threshold=0.7, ignore_eos=True)
    assert [len(r.token_ids) for r in batch] == [30, 30, 30]
    assert sum(r.stats.nar_tokens for r in batch) > 0


def test_hybrid_sampling_runs_and_is_seeded(trained):
    kw = dict(mode="hybrid", max_new_tokens=30, temperature=0.9, top_p=0.95, top_k=40, router_threshold=0.6)
    a = trained.generate("def alpha", seed=3, **kw)
    b = trained.generate("def alpha", seed=3, **kw)
    assert a.token_ids == b.token_ids and len(a.token_ids) > 0
    batch = trained.generate(["def alpha", "class "], seed=3, **kw)  # row b seeded 3 + b
    again = trained.generate(["def alpha", "class "], seed=3, **kw)
    assert [r.token_ids for r in batch] == [r.token_ids for r in again] and len(batch[0].token_ids) > 0


@pytest.mark.parametrize("mode", ["verified", "hybrid", "nar"])
def test_a_separate_drafting_pass_reveals_the_next_token_in_slot_1(trained, mode, monkeypatch):
    """Each drafting pass (no committed token) has slot 1 = the token fed next, known by then; the
    other slots are masks. hybrid/nar still commit drafted tokens this way."""
    model, calls = trained.model, []
    real_step = model.step

    def spy(tokens, positions, n_committed, *args, **kwargs):
        calls.append((tokens.clone(), n_committed))
        return real_step(tokens, positions, n_committed, *args, **kwargs)

    monkeypatch.setattr(model, "step", spy)
    r = trained.generate(
        "def alpha_1(x):\n", mode=mode, drafting="separate", max_new_tokens=30, router_threshold=1.0
    )
    passes = [i for i, (_, n_c) in enumerate(calls) if n_c == 0]
    assert passes and len(passes) == r.stats.draft_passes
    mask_id = model.config.mask_token_id
    for i in passes:
        slots = calls[i][0]
        assert (slots[:, 1:] == mask_id).all() and (slots[:, 0] != mask_id).all()
        if i + 1 < len(calls):  # the next step feeds that token first
            assert torch.equal(calls[i + 1][0][:, 0], slots[:, 0])
    assert r.stats.nar_tokens > 0


class _TrustSlot1Only:
    """Router stand-in: slot 1 certain, every later slot hopeless (p_ar(1) ~ 0, p_ar(2..) ~ 1)."""

    calls = 0

    def features(
        self, hidden_last, ar_logits_last, slot_logits, slot1_revealed=False, ar_entropy=None, stats=None
    ):
        self.calls += 1
        return torch.zeros(slot_logits.shape[0], slot_logits.shape[1])

    def __call__(self, features):
        z = torch.full_like(features, -30.0)
        z[:, 0] = 30.0
        return z


class _TrustAll(_TrustSlot1Only):
    """Router stand-in: every slot certain (p_ar ~ 0)."""

    def __call__(self, features):
        return torch.full_like(features, 30.0)


class _TrustFirstThree(_TrustSlot1Only):
    """Router stand-in: slots 1..3 certain, later slots hopeless."""

    def __call__(self, features):
        z = torch.full_like(features, -30.0)
        z[:, :3] = 30.0
        return z


@pytest.mark.parametrize(
    "router, collapsed", [(_TrustAll, "NAR"), (_TrustSlot1Only, "AR"), (_TrustFirstThree, None)]
)
def test_router_collapse_warning_counts_block_positions(trained, monkeypatch, caplog, router, collapsed):
    """verified at a mid-range threshold (the router gates its draft lengths): a router that sends
    every block position one way is flagged; one that trusts slots 2..3 and not the rest is not."""
    monkeypatch.setitem(trained.model.trained._modules, "router", router())  # (a stand-in, not a Module)
    # Free drafting (the fixture's FLAT costs): the draft length is the router's gate alone, not the
    # acceptance record's judgement of the drafts, so what the router decides is what is counted.
    assert trained.costs is FLAT
    with caplog.at_level("WARNING", logger="yue"):
        r = trained.generate(
            "def alpha_1(x):\n",
            mode="verified",
            max_new_tokens=120,
            router_threshold=0.5,
            reeval_every=1,  # futile probes back off to AR stretches of 1..8 steps: enough decisions
            ignore_eos=True,
            prompt_lookup=False,  # every drafted block is the router's to judge
        )
    d = r.stats.router_decisions
    assert d["ar"] + d["nar"] >= 56
    warned = [rec.getMessage() for rec in caplog.records if "collapsed" in rec.getMessage()]
    if collapsed is None:
        assert d["ar"] > 0 and d["nar"] > 0 and not warned
    else:
        assert len(warned) == 1 and f"collapsed to {collapsed} " in warned[0]
