"""The size forecast's pricing (`docs/recipes/size_forecast.py`, issue 59 item 8): a trace re-priced by
a cost curve gives the ratio worked out by hand, and a curve where extra rows are free and every draft
holds gives tokens per step exactly. Pure arithmetic: no model is loaded."""

import importlib.util
import sys
from pathlib import Path

import pytest

RECIPE = Path(__file__).resolve().parents[1] / "docs" / "recipes" / "size_forecast.py"
spec = importlib.util.spec_from_file_location("size_forecast", RECIPE)
sf = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sf  # dataclasses look their module up
spec.loader.exec_module(sf)


def step(source: str, drafted: int, accepted: int, draft_pass: bool = False, prefill: bool = False) -> dict:
    tokens = 1 if prefill else accepted + 1
    return dict(
        source=source,
        drafted=drafted,
        accepted=accepted,
        tokens=tokens,
        draft_pass=draft_pass,
        prefill=prefill,
    )


def test_price_of_a_hand_made_trace_is_the_hand_computed_ratio():
    rows = (1.0, 1.2, 1.5, 2.0, 2.4)
    steps = [
        step("", 0, 0, draft_pass=True, prefill=True),  # prefill not priced, its drafting pass is: 0.5
        step("nar", 3, 2),  # 4 rows: 2.0, writes 3
        step("", 0, 0),  # 1 row: 1.0, writes 1
        step("copy", 1, 1, draft_pass=True),  # 2 rows: 1.2, + a pass 0.5, writes 2
    ]
    got = sf.price(steps, rows, draft=0.5)
    assert got["tokens"] == 6
    assert got["cost"] == pytest.approx(0.5 + 2.0 + 1.0 + 1.2 + 0.5)
    assert got["verified_over_ar"] == round(6 / 5.2, 3)


def test_free_rows_and_drafts_that_all_hold_give_tokens_per_step_exactly():
    free = (1.0,) * 9
    steps = [step("corpus", k, k) for k in (1, 4, 8, 0, 2)]
    tokens_per_step = sum(s["tokens"] for s in steps) / len(steps)
    assert sf.price(steps, free, draft=0.0)["verified_over_ar"] == pytest.approx(tokens_per_step, abs=5e-4)


def test_a_step_past_the_curve_costs_its_last_slope_more():
    assert sf.row_cost((1.0, 1.5, 2.5), 5) == pytest.approx(4.5)


def test_interpolation_keeps_the_measured_points_and_fills_between_them_linearly():
    rows = sf.interpolate({2: 1.15, 3: 1.47, 4: 1.84, 8: 3.24})
    assert rows[:4] == (1.0, 1.15, 1.47, 1.84) and rows[7] == 3.24
    assert rows[5] == pytest.approx(1.84 + 2 * (3.24 - 1.84) / 4)  # 6 rows: halfway from 4 to 8
    assert rows[8] == pytest.approx(3.24 + (3.24 - 1.84) / 4)  # 9 rows: past the end, the last slope


def test_command_line_curves_are_ratios_to_one_row():
    c = sf.parse_curve("llama-3.2-1b/x=2,3,4:0.5")
    assert c.rows == (1.0, 1.5, 2.0) and c.draft == 0.5 and c.shape == "llama-3.2-1b"
    with pytest.raises(ValueError, match="--curve"):
        sf.parse_curve("nonsense")


def test_the_example_curves_hold_issue_59s_figures():
    curves = {c.name: c for c in sf.example_curves()}
    assert curves["llama-3.2-1b/yue"].rows[1:4] == (1.15, 1.47, 1.84)
    assert curves["llama-3.2-1b/llamacpp"].rows[7] == 6.81
    assert "interpolated" in curves["llama-3.2-1b/yue"].note


def test_taking_the_nar_set_out_writes_its_tokens_at_ar_rate_without_passes():
    steps = [step("nar", 4, 3, draft_pass=True), step("copy", 2, 2)]
    out = sf.without_nar(steps)
    assert [s["drafted"] for s in out] == [0, 0, 0, 0, 2] and not any(s["draft_pass"] for s in out)
    assert sum(s["tokens"] for s in out) == sum(s["tokens"] for s in steps)
