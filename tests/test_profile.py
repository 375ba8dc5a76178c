"""The step profile (`decode/profile.py`, `yue profile`): phases booked by name, adding up to the wall
time, never counted twice, and off unless asked."""

from __future__ import annotations

import time

import pytest

import yue
from tests.test_loop import FLAT
from yue.bench.profile import ModeTotals, ProfileConfig, document
from yue.decode import profile
from yue.decode.profile import PREFILL, StepProfile, profiling


@pytest.fixture(scope="module")
def trained(trained_model_dir):
    engine = yue.load(trained_model_dir)
    engine.costs = FLAT  # drafting is free: every verified step drafts, so the drafting pass is booked
    return engine


def test_no_profile_is_active_outside_a_profiling_block_and_none_nests():
    assert profile.ACTIVE is None
    with profiling() as prof:
        assert profile.ACTIVE is prof
        with pytest.raises(RuntimeError, match="already"):
            with profiling():
                pass
    assert profile.ACTIVE is None


def test_an_inner_phase_is_taken_out_of_the_phase_around_it():
    prof = StepProfile()
    prof.start(prefill=False)
    time.sleep(0.02)
    prof.inner("draft:copy", 0.015)
    prof.mark("accept")
    assert prof.seconds["draft:copy"] == 0.015
    assert 0.004 < prof.seconds["accept"] < 0.02  # the 20 ms less the 15 ms booked inside it
    prof.start(prefill=True)
    prof.mark("propose")
    assert prof.steps == 1 and prof.prefill_steps == 1
    assert set(prof.decode_phases()) == {"draft:copy", "accept"}
    assert PREFILL + "propose" in prof.seconds


def test_an_ar_request_books_one_one_position_forward_per_decode_step(trained):
    with profiling() as prof:
        t0 = time.perf_counter()
        result = trained.generate("def alpha", mode="ar", max_new_tokens=12, ignore_eos=True)
        wall = time.perf_counter() - t0
    assert len(result.token_ids) == 12
    assert prof.steps == 11 and prof.prefill_steps == 1  # the first token comes out of the prefill step
    assert prof.calls["forward:1"] == 11
    assert not any(k.startswith("draft:") for k in prof.seconds)
    assert 0 < sum(prof.seconds.values()) <= wall


def test_a_verified_request_books_its_drafting_pass_and_its_sources(trained):
    with profiling() as prof:
        trained.generate(
            "def alpha(x):\n    return ", mode="verified", max_new_tokens=24, router_threshold=1.0
        )
    assert prof.calls["draft:nar"] >= 1  # a drafting pass ran (free drafting costs: every step drafts)
    assert prof.calls["draft:contexts"] == prof.steps  # every decode step indexes its tokens
    assert any(k.startswith("forward:") and k != "forward:1" for k in prof.seconds)  # drafts were verified


def test_the_document_reads_each_phase_as_a_fraction_of_an_ar_step():
    ar, ver = ModeTotals(tokens=10, wall_s=0.01, steps=10), ModeTotals(tokens=10, wall_s=0.005, steps=4)
    ar.seconds.update({"forward:1": 0.009, "accept": 0.001, PREFILL + "forward:5": 0.5})  # 1 ms a step
    ar.calls.update({"forward:1": 10, "accept": 10, PREFILL + "forward:5": 1})
    ver.seconds.update({"forward:3": 0.004, "draft:nar": 0.001, "draft:copy": 0.0002, "accept": 0.0008})
    ver.calls.update({"forward:3": 4, "draft:nar": 2, "draft:copy": 4, "accept": 4})
    doc = document({"ar": ar, "verified": ver})
    assert doc["ar_step_ms"] == 1.0  # the prefill step is left out of the unit
    s = doc["summary"]["verified"]
    assert s["drafting_of_ar_step"] == pytest.approx(0.3)  # (1.0 + 0.2) ms over 4 steps
    assert s["step_of_ar_step"] == pytest.approx(1.5)
    assert s["speed_vs_ar"] == pytest.approx(2.0)
    nar = doc["modes"]["verified"]["phases"]["draft:nar"]
    assert nar["of_ar_step"] == pytest.approx(0.25) and nar["share_of_steps"] == 0.5
    assert doc["modes"]["verified"]["forward_by_positions"][3]["of_ar_step"] == pytest.approx(1.0)


@pytest.mark.parametrize(
    "bad, field",
    [({"modes": ("verified",)}, "modes"), ({"limit": 0}, "limit"), ({"top_p": 0.0}, "top_p")],
)
def test_a_bad_profile_config_names_its_field(bad, field):
    with pytest.raises(ValueError, match=field):
        ProfileConfig(**bad)
