"""The router's cost model: measured once per model shape and machine, cached, never trusted when corrupt,
and draft lengths follow it."""

from __future__ import annotations

import torch

import yue.decode.costs as costs_mod
from yue.config import DecodeConfig
from yue.decode.costs import CostCurve, StepCosts, cost_cache_key, measured_costs
from yue.decode.policies import DRAFT_MARGIN, VerifiedPolicy, best_draft, probe_length
from yue.decode.state import LoopState


def test_verify_costs_extrapolate_past_the_measured_rows():
    c = StepCosts((1.0, 1.5, 1.7), (0.2,))
    assert [round(c.verify(k), 6) for k in range(5)] == [1.0, 1.5, 1.7, 1.9, 2.1]
    assert StepCosts.default(8).verify(0) < StepCosts.default(8).verify(8)


def test_a_drafting_pass_costs_what_its_slots_cost():
    c = StepCosts(tuple(1.0 + 0.1 * k for k in range(9)), (0.2, 0.25, 0.3))  # 2, 3, 4 slots
    assert [c.draft_pass(n) for n in (1, 2, 3, 4, 8)] == [0.2, 0.2, 0.25, 0.3, 0.3]  # clamped
    b2 = c.for_batch(2, 8)  # 2 rows x n slots cost what 2n positions cost over what n do
    assert b2.draft_pass(3) == 0.25 * c.verify(5) / c.verify(2)


def _policy_length(costs: StepCosts, accept: float, K: int = 8, rows: int = 1) -> int:
    cfg = DecodeConfig(mode="verified", router_threshold=0.99, block_size=K)
    st = LoopState(cfg, [None] * rows, torch.zeros(rows, 1, dtype=torch.long), costs=costs)
    # p_ar(i) = 1 - accept**(i-1): slot 1 (the AR token) certain, each later slot survives w.p. `accept`.
    p_ar = 1.0 - torch.tensor([[accept ** (i - 1) for i in range(1, K + 1)]] * rows)
    return VerifiedPolicy().draft_length(st, p_ar, cfg.router_threshold)


def test_a_batch_step_costs_what_its_positions_cost_so_big_batches_draft_less():
    c = StepCosts(tuple(1.0 + 0.1 * k for k in range(9)), (0.5,))  # a fixed cost, then 0.1 a position
    assert c.for_batch(1, 8) is c
    b4 = c.for_batch(4, 8)
    assert b4.verify(0) == c.verify(3) and b4.verify(1) == c.verify(7)  # 4 and 8 positions
    assert b4.verify(2) / b4.verify(0) > c.verify(2) / c.verify(0)  # drafts are dearer, relatively
    lengths = [_policy_length(c, 0.8, rows=r) for r in (1, 4, 16)]
    assert lengths == sorted(lengths, reverse=True) and lengths[0] > lengths[-1]


def test_draft_length_follows_the_measured_cost_curve():
    cheap_rows = StepCosts(tuple(1.0 + 0.02 * k for k in range(9)), (0.1,))  # verifying rows nearly free
    dear_rows = StepCosts(tuple(1.0 + 0.3 * k for k in range(9)), (0.1,))  # each row ~0.3 of a step (AVX2)
    assert _policy_length(cheap_rows, 0.8) > _policy_length(dear_rows, 0.8) >= 1
    # Poor drafts on a CPU where rows are dear: plain AR steps are the better deal.
    assert _policy_length(StepCosts(tuple(1.0 + 0.5 * k for k in range(9)), (0.5,)), 0.2) == 0


def test_a_probe_verifies_as_many_drafts_as_its_cost_allows():
    cfg = DecodeConfig(mode="verified", router_threshold=1.0, block_size=8)

    def probe(costs: StepCosts, rows: int = 1) -> int:
        return probe_length(
            LoopState(cfg, [None] * rows, torch.zeros(rows, 1, dtype=torch.long), costs=costs), 7
        )

    flat = StepCosts((1.0, 1.09, 1.09, 1.04, 1.05, 1.07, 1.27, 1.30, 1.33), (0.1,))  # float32 on this CPU
    steep = StepCosts((1.0, 1.22, 1.37, 1.54, 1.94, 2.10, 2.29, 2.47, 2.93), (0.3,))  # int4
    assert probe(flat) == 5 and probe(steep) == 1
    assert probe(StepCosts((1.0, 2.0, 3.0), (0.1,))) == 1  # at least one draft, whatever it costs
    assert probe(flat, rows=4) < probe(flat)  # a batch step's rows cost more


def test_measured_costs_are_cached_and_a_corrupt_cache_is_remeasured(
    trained_model_dir, tmp_path, monkeypatch
):
    import yue

    model = yue.load(trained_model_dir).model
    calls = []
    real = costs_mod.verify_cost_curve

    def counting(*args, **kwargs) -> CostCurve:
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(costs_mod, "verify_cost_curve", counting)
    first = measured_costs(model, cache_dir=tmp_path, tries=1)
    second = measured_costs(model, cache_dir=tmp_path, tries=1)
    assert len(calls) == 1 and first == second
    assert (
        len(first.step) == 9
        and all(s > 0 for s in first.step)
        and len(first.passes) == 7
        and all(p > 0 for p in first.passes)
    )
    (file,) = (tmp_path / "costs").glob("*.json")
    file.write_text("{not json")
    third = measured_costs(model, cache_dir=tmp_path, tries=1)
    assert len(calls) == 2 and len(third.step) == 9


def test_engine_measures_costs_only_when_a_mode_drafts(trained_model_dir, tmp_path, monkeypatch):
    import yue

    monkeypatch.setenv("YUE_CACHE_DIR", str(tmp_path))
    engine = yue.load(trained_model_dir)
    engine.generate("def f(x):", mode="ar", max_new_tokens=4)
    assert engine.costs_by_use == {}  # nothing drafted: nothing to weigh
    engine.generate("def f(x):", mode="verified", router_threshold=1.0, max_new_tokens=4)
    assert set(engine.costs_by_use) == {"argmax"} and len(list((tmp_path / "costs").glob("*.json"))) == 1


def test_a_sampled_request_weighs_its_drafts_against_what_its_rows_cost(
    trained_model_dir, tmp_path, monkeypatch
):
    """Greedy rows serve their argmax (the head's screen), sampled rows their whole warped distribution:
    each use has its own measured curve and file, and a request's batch weighs the one it runs."""
    import yue

    monkeypatch.setenv("YUE_CACHE_DIR", str(tmp_path))
    engine = yue.load(trained_model_dir)
    uses = []
    real = costs_mod.verify_cost_curve

    def recording(*args, **kwargs) -> CostCurve:
        uses.append(kwargs["use"])
        return real(*args, **kwargs)

    monkeypatch.setattr(costs_mod, "verify_cost_curve", recording)
    greedy = engine.request("def f(x):", None, {"mode": "verified", "router_threshold": 1.0})[1]
    sampled = engine.request(
        "def f(x):", None, {"mode": "verified", "router_threshold": 1.0, "temperature": 0.7}
    )[1]
    hybrid = engine.request("def f(x):", None, {"mode": "hybrid", "router_threshold": 0.1})[1]
    assert engine.decode_batch(sampled).costs is engine.costs_by_use["sampled"]
    assert engine.decode_batch(greedy).costs is engine.costs_by_use["argmax"]
    assert engine.decode_batch(hybrid).costs is engine.costs_by_use["logits"]  # greedy, but reads p_AR
    engine.decode_batch(sampled)  # measured once per use
    assert uses == ["sampled", "argmax", "logits"] and len(list((tmp_path / "costs").glob("*.json"))) == 3
    out = engine.generate("def f(x):", mode="verified", max_new_tokens=8, temperature=0.7, seed=0)
    assert len(out.token_ids) == 8
    engine.costs = StepCosts.default(8)  # set by hand: every request weighs it
    assert (
        engine.decode_batch(sampled).costs is engine.costs
        and engine.decode_batch(greedy).costs is engine.costs
    )


def test_the_free_draft_priors_leave_the_step_costs_key_as_it_is(trained_model_dir):
    """The rates that prime a request's free-draft records (`costs.RECORD_PRIORS`) change what it drafts,
    not what a step costs: a model given other rates keeps its measured costs' key; another shape does not."""
    import yue

    model = yue.load(trained_model_dir).model
    key = cost_cache_key(model)
    model.config.free_draft_rates = {"copy:2": [0.5, 0.25]}
    model.config.sampled_draft_rates = {"0.7": {"copy:2": [0.4]}}
    assert cost_cache_key(model) == key
    model.config.hybrid_tolerance = model.config.hybrid_tolerance + 0.01  # any other field: a new key
    assert cost_cache_key(model) != key


def test_measured_costs_never_fall_with_more_rows_or_slots():
    """A median that says a 2-row step costs less than a 1-row one is noise; the router reads a running
    maximum (`StepCosts.monotone`)."""
    costs = StepCosts((1.0, 0.9, 1.2), (0.5, 0.4, 0.6), ((16, 1.1), (32, 2.0))).monotone()
    assert costs.step == (1.0, 1.0, 1.2)
    assert costs.passes == (0.5, 0.5, 0.6)
    assert costs.wide == ((16, 1.2), (32, 2.0))


def test_a_draft_must_beat_a_plain_step_by_the_margin():
    """`best_draft` takes a NAR block (a drafting pass) only where it promises DRAFT_MARGIN more tokens
    per unit of cost; free drafts (no pass) need only beat a plain step."""
    st = LoopState(DecodeConfig(block_size=4), [None], torch.zeros(1, 1, dtype=torch.long))
    st.costs = StepCosts((1.0,) * 5, (0.0,))  # rows and passes free: a draft's gain is its survival
    assert best_draft(st, [DRAFT_MARGIN / 2])[0] == 0
    assert best_draft(st, [2 * DRAFT_MARGIN])[0] == 1
    assert best_draft(st, [DRAFT_MARGIN / 2], draft_pass=False)[0] == 1
