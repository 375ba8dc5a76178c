"""`yue distill MODEL --hours H` (train/distill_run.py): on tiny models and a budget of seconds it finishes,
writes a folder `yue.load` takes, on which `verified` gives `ar`'s tokens; stopped after a stage, the same
command resumes from the saved state (the data made before the stop is what it trains on); the plan
follows the measured row costs."""

from __future__ import annotations

import json
import time

import pytest
from typer.testing import CliRunner

import yue
from tests.family_utils import SHAPE, save_family
from tests.gguf_utils import tiny_tokenizer
from yue.cli import app
from yue.config import YueConfig
from yue.train.distill_plan import choose_block_size, make_plan, monotone
from yue.train.distill_run import DistillRun, distill

pytestmark = pytest.mark.usefixtures("gguf_cache")
HOURS = "0.005"  # 18 s: every stage runs its minimum (one chunk, one round)


def verified_equals_ar(folder, prompt: str) -> bool:
    engine = yue.load(str(folder))
    ar = engine.generate(prompt, mode="ar", max_new_tokens=24, ignore_eos=True).token_ids
    return engine.generate(prompt, mode="verified", max_new_tokens=24, ignore_eos=True).token_ids == ar


@pytest.mark.slow
def test_a_base_model_distills_in_a_tiny_budget_resumes_after_a_stop_and_loads(tmp_path):
    """A Gemma 3 folder with no chat template (a base model: text continuations), stopped after its data
    stage and run again: the second run trains on the first run's chunks and finishes the layout."""
    base, out = tmp_path / "gemma", tmp_path / "out"
    save_family("gemma3", base)
    tiny_tokenizer().save(str(base / "tokenizer.json"))
    args = ["distill", str(base), "--hours", HOURS, "--out", str(out), "--device", "cpu"]
    first = CliRunner().invoke(app, [*args, "--stop-after", "data"])
    assert first.exit_code == 0, first.output
    state = json.loads((out / "work" / "distill_state.json").read_text())
    assert state["done"] == ["plan", "heldout", "data"] and not (out / "config.json").exists()
    chunks = json.loads((out / "work" / "campaign" / "state.json").read_text())["chunks"]
    assert chunks >= 1

    second = CliRunner().invoke(app, args)
    assert second.exit_code == 0, second.output
    assert "verified" in second.output and "identical to ar" in second.output
    state = json.loads((out / "work" / "distill_state.json").read_text())
    assert state["done"] == ["plan", "heldout", "data", "train", "calibrate", "report"]
    assert json.loads((out / "work" / "campaign" / "state.json").read_text())["chunks"] == chunks
    report = json.loads((out / "distill_report.json").read_text())
    assert report["kind"].startswith("base") and report["data"]["chunks"] == chunks
    assert json.loads((out / "ar_source.json").read_text()) == {"ar_path": str(base.resolve())}
    assert [r["tokens_seen"] for r in report["tau_curve"]][0] == 0 and report["tau_curve"][-1][
        "tokens_seen"
    ] > 0
    bench = report["heldout_bench"]
    assert bench["prompts"] >= 2 and bench["identical_to_ar"] == bench["prompts"]
    assert (out / "distill_report.png").is_file()
    config = json.loads((out / "config.json").read_text())
    assert config["nar_layers"] == report["plan"]["nar_layers"] and config["family"] == "gemma3_text"
    assert verified_equals_ar(out, "def total(values):\n    return")
    # A third run finds every stage done: the same report, nothing redone.
    third = CliRunner().invoke(app, args)
    assert third.exit_code == 0 and json.loads((out / "distill_report.json").read_text()) == report


@pytest.mark.slow
def test_an_instruct_gguf_distills_on_its_own_chat_answers_and_loads(tiny_gguf, tmp_path):
    """A GGUF with a chat template: chat answers; the folder names the GGUF as its AR source."""
    out = tmp_path / "out"
    report = distill(str(tiny_gguf.path), out, hours=float(HOURS), device="cpu", progress=False)
    assert report["kind"].startswith("instruct")
    assert json.loads((out / "ar_source.json").read_text())["gguf_path"] == str(tiny_gguf.path.resolve())
    assert report["heldout_bench"]["identical_to_ar"] == report["heldout_bench"]["prompts"]
    engine = yue.load(str(out))
    prompt = engine.chat_prompt([{"role": "user", "content": "say a"}])
    assert verified_equals_ar(out, prompt)


def test_the_slot_count_follows_the_measured_row_costs():
    """Nearly free rows (a GPU) -> the longest block; rows costing ~0.3 of a step each (a CPU) -> fewer."""
    config = YueConfig(**(SHAPE | {"num_hidden_layers": 30}))
    flat = [1.0 + 0.01 * n for n in range(9)]
    steep = [1.0 + 0.3 * n for n in range(9)]
    assert choose_block_size(config, flat, 2, 320)[0] == 8
    assert choose_block_size(config, steep, 2, 320)[0] < 8


def test_a_noisy_cost_curve_is_made_non_decreasing_from_the_right():
    assert monotone([1.0, 7.2, 4.9, 3.4, 11.0, 2.5]) == [1.0, 2.5, 2.5, 2.5, 2.5, 2.5]


def test_the_plan_refuses_a_budget_of_nothing_and_keeps_its_shares():
    config = YueConfig(**SHAPE)
    with pytest.raises(ValueError, match="hours"):
        make_plan(config, [1.0] * 9, 0, answer_tok_s=100.0)
    plan = make_plan(config, [1.0] * 9, 1.0, answer_tok_s=100.0)
    assert sum(plan.shares.values()) == pytest.approx(1.0)
    assert 1 <= plan.nar_layers < config.num_hidden_layers and plan.draft_vocab_size <= config.vocab_size
    # Held-out splits sized by the answering rate: a slow machine gets the fewest, a fast one the most.
    assert make_plan(config, [1.0] * 9, 0.25, answer_tok_s=1.0).heldout_prompts == 6
    assert make_plan(config, [1.0] * 9, 0.25, answer_tok_s=1000.0).heldout_prompts == 64


@pytest.mark.parametrize(
    ("args", "named"),
    [(["no-such-model", "--hours", "1"], "no-such-model"), (["yue-code-mini", "--hours", "0"], "hours")],
)
def test_bad_input_is_one_line_naming_it_and_writes_nothing(tmp_path, args, named):
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["distill", *args, "--out", str(out)])
    assert result.exit_code == 2 and named in result.output and not out.exists()


def test_an_interrupted_stage_keeps_the_seconds_it_spent(tmp_path, monkeypatch, caplog):
    """Ctrl-C in the middle of a stage: its seconds so far are saved against the stage's share (the
    budget is wall time), and the stage is not marked done, so a rerun resumes it (and says so)."""
    plan = make_plan(YueConfig(**SHAPE), [1.0] * 9, 1.0, answer_tok_s=100.0)
    out = tmp_path / "out"
    (out / "work").mkdir(parents=True)
    state = {"model": "yue-code-mini", "plan": plan.to_dict(), "spent": {"data": 5.0}, "done": ["plan"]}
    (out / "work" / "distill_state.json").write_text(json.dumps(state))

    def interrupted_heldout(self):
        time.sleep(0.2)
        raise KeyboardInterrupt

    monkeypatch.setattr(DistillRun, "stage_heldout", interrupted_heldout)
    with caplog.at_level("INFO", logger="yue.train.distill_run"), pytest.raises(KeyboardInterrupt):
        DistillRun("yue-code-mini", out, hours=1.0).run()
    assert "resuming" in caplog.text and "stages done plan" in caplog.text
    saved = json.loads((out / "work" / "distill_state.json").read_text())
    assert saved["done"] == ["plan"] and 5.2 <= saved["spent"]["data"] < 60.0
