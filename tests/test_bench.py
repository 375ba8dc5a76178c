"""`yue bench` invariants: the JSON contract, verified == ar, hf-greedy == our ar, the plot, bad input.

Benchmarks are not timed tests: nothing here asserts a speed.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from typer.testing import CliRunner

import yue
from yue.bench import metrics
from yue.bench.harness import JSON_KEYS, BenchConfig, entries
from yue.bench.runners import HFRunner, OurRunner, Prompt, load_peers
from yue.cli import app

PROMPTS = [
    {"prompt": "def alpha_1(x):\n", "reference": "    return beta(x) + 1\n\n"},
    {"prompt": "def gamma_4(x):\n    return", "reference": " delta(x) + 4\n\n"},
    {"prompt": "class Point:\n"},  # no reference: chrF skips it
]


@pytest.fixture(scope="module")
def drafting_model_dir(trained_model_dir, tmp_path_factory) -> str:
    """The trained tiny model with router_threshold 1.0, so `verified` and `hybrid` really draft."""
    path = tmp_path_factory.mktemp("drafting")
    shutil.copytree(trained_model_dir, path, dirs_exist_ok=True)
    cfg = json.loads((path / "config.json").read_text())
    cfg["router_threshold"] = 1.0
    (path / "config.json").write_text(json.dumps(cfg))
    return str(path)


@pytest.fixture(scope="module")
def prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("prompts") / "prompts.jsonl"
    path.write_text("".join(json.dumps(p) + "\n" for p in PROMPTS))
    return path


@pytest.fixture(scope="module")
def bench_run(drafting_model_dir, prompts_file, tmp_path_factory):
    """One CLI run over every mode, a one-point sweep and batch 2 (no memory probes: see below)."""
    out = tmp_path_factory.mktemp("bench")
    args = [
        "bench",
        "--model",
        drafting_model_dir,
        "--prompts",
        str(prompts_file),
        "--max-new-tokens",
        "12",
        "--thresholds",
        "0.5",
        "--batch-sizes",
        "1,2",
        "--no-memory",
        "--json",
        str(out / "bench.json"),
        "--plot",
        str(out / "bench.png"),
    ]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    return result, out


def test_last_stdout_line_is_one_json_document_with_exactly_the_issue_keys(bench_run):
    result, out = bench_run
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert set(doc) == {"model", "prompts", "max_new_tokens", "modes"}
    assert doc["prompts"] == len(PROMPTS) and doc["max_new_tokens"] == 12
    expected = ["hf-greedy", "hf-prompt-lookup", "ar", "verified", "verified@1", "verified+fused"]
    expected += ["verified+fused@1", "hybrid", "hybrid@0.5", "nar"]
    assert list(doc["modes"]) == expected + ["ar@b2", "verified@b2"]
    for mode, row in doc["modes"].items():
        assert list(row) == list(JSON_KEYS), mode
    assert json.loads((out / "bench.json").read_text()) == doc


def test_verified_output_equals_ar_output_and_it_really_drafted(bench_run):
    modes = json.loads(bench_run[0].stdout.strip().splitlines()[-1])["modes"]
    for name in ("verified", "verified@b2", "verified@1", "verified+fused", "verified+fused@1"):
        assert modes[name]["exact_match_vs_ar"] == 1.0, name
    assert modes["verified"]["mean_accepted"] is not None  # drafts were proposed and verified
    assert modes["verified"]["nll_ratio_vs_ar"] == pytest.approx(1.0)
    assert modes["ar"]["exact_match_vs_ar"] == 1.0 and modes["ar"]["nll_ratio_vs_ar"] == 1.0


def test_hf_greedy_and_prompt_lookup_write_our_ar_tokens(bench_run):
    modes = json.loads(bench_run[0].stdout.strip().splitlines()[-1])["modes"]
    assert modes["hf-greedy"]["exact_match_vs_ar"] == 1.0
    assert modes["hf-prompt-lookup"]["exact_match_vs_ar"] == 1.0
    # One forward per token (the forward that writes an EOS counts, the EOS token does not).
    assert modes["hf-greedy"]["forwards_per_token"] == modes["ar"]["forwards_per_token"] >= 1.0


def test_hf_greedy_tokens_equal_our_ar_tokens_on_a_random_model(tiny_model_dir, tmp_path):
    engine = yue.load(tiny_model_dir)
    llama, rec = load_peers(engine, "cpu", str(tmp_path))
    hf = HFRunner(llama, rec, engine.tokenizer, lookup=False, max_new_tokens=20)
    ours = OurRunner(engine, "ar", None, max_new_tokens=20)
    for i, text in enumerate(["def alpha_1(x):\n", "你好", "import os\n"]):
        p = Prompt(text, None, engine.encode(text))
        assert hf([(i, p)]).rows[0][1] == ours([(i, p)]).rows[0][1]


def test_prompt_lookup_counts_every_forward_and_accepted_draft(drafting_model_dir, tmp_path):
    engine = yue.load(drafting_model_dir)
    llama, rec = load_peers(engine, "cpu", str(tmp_path))
    hf = HFRunner(llama, rec, engine.tokenizer, lookup=True, max_new_tokens=30)
    text = "def alpha_1(x):\n    return beta(x) + 1\n\ndef alpha_1(x):\n"
    s = hf([(0, Prompt(text, None, engine.encode(text)))])
    # Each forward writes its accepted drafts plus one token of its own (EOS included when it stops).
    eos = int(len(s.rows[0][1]) < 30)
    assert len(s.rows[0][1]) + eos == s.forwards + sum(s.accept_lengths)
    assert s.ttft_s is not None and 0 < s.ttft_s <= s.wall_s


def test_plot_file_is_written(bench_run):
    png = bench_run[1] / "bench.png"
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


@pytest.mark.parametrize(
    "option",
    [
        ["--modes", "ar,bogus"],
        ["--modes", "ar,ar"],
        ["--thresholds", "0.3,high"],
        ["--thresholds", "1.5"],
        ["--batch-sizes", "0"],
        ["--repeats", "0"],
    ],
)
def test_bad_option_exits_with_code_2_before_any_model_work(option, tmp_path):
    result = CliRunner().invoke(app, ["bench", "--model", str(tmp_path / "missing"), *option])
    assert result.exit_code == 2, result.output
    assert "error:" in result.output


def test_missing_prompts_file_exits_with_code_2(tiny_model_dir, tmp_path):
    result = CliRunner().invoke(app, ["bench", "--model", tiny_model_dir, "--prompts", str(tmp_path / "x")])
    assert result.exit_code == 2


def test_sweep_and_batch_entries_follow_the_modes():
    cfg = BenchConfig(modes=("ar", "hybrid"), thresholds=(0.3, 0.8), batch_sizes=(1, 4))
    assert [e.name for e in entries(cfg)] == ["ar", "hybrid", "hybrid@0.3", "hybrid@0.8", "ar@b4"]
    cfg = BenchConfig(modes=("verified",), verified_thresholds=(0.9,), fused_drafts=False)
    assert [e.name for e in entries(cfg)] == ["verified", "verified@0.9"]
    cfg = BenchConfig(modes=("verified",), verified_thresholds=(1.0,))
    names = ["verified", "verified@1", "verified+fused", "verified+fused@1"]
    assert [e.name for e in entries(cfg)] == names
    assert [e.drafting for e in entries(cfg)] == ["separate", "separate", "fused", "fused"]


@pytest.mark.slow
def test_peak_memory_is_measured_in_a_process_of_its_own(tiny_model_dir):
    from yue.bench.memory import MemorySpec, measure

    engine = yue.load(tiny_model_dir)
    spec = MemorySpec("verified", tiny_model_dir, None, "def f(x):", engine.encode("def f(x):"), 8, 1)
    mem = measure(spec)
    assert 0 < mem["base_rss_mb"] <= mem["peak_rss_mb"]


def test_repetition_rate_counts_4grams_seen_earlier_in_the_same_output():
    assert metrics.repetition_rate([[1, 2, 3, 4, 1, 2, 3, 4]]) == pytest.approx(1 / 5)
    assert metrics.repetition_rate([[1, 2, 3, 4, 5], [1, 2, 3, 4]]) == 0.0  # across outputs: not repeats
    assert metrics.repetition_rate([[1, 2]]) is None


def test_percentile_interpolates_and_handles_empty():
    assert metrics.percentile([1.0, 2.0, 3.0, 4.0, 5.0], 50) == 3.0
    assert metrics.percentile([0.0, 10.0], 10) == pytest.approx(1.0)
    assert metrics.percentile([], 50) is None


def test_ar_nll_scores_only_the_output_tokens(tiny_engine):
    import torch

    ids, out = tiny_engine.encode("def f(x):"), [5, 6, 7]
    total, n = metrics.ar_nll(tiny_engine.model, ids, out)
    with torch.no_grad():
        logits = tiny_engine.model(input_ids=torch.tensor([ids + out])).logits[0]
    logp = torch.log_softmax(logits, -1)
    manual = -sum(float(logp[len(ids) - 1 + j, t]) for j, t in enumerate(out))
    assert n == 3 and total == pytest.approx(manual, rel=1e-5)


def test_markdown_table_has_a_row_per_entry_and_inverts_forwards_per_token(bench_run):
    from yue.bench.report import markdown_table

    doc = json.loads(bench_run[0].stdout.strip().splitlines()[-1])
    lines = markdown_table(doc).splitlines()
    assert len(lines) == 2 + len(doc["modes"])
    row = next(r for r in lines if r.startswith("| verified |")).split(" | ")
    assert float(row[4]) == pytest.approx(1.0 / doc["modes"]["verified"]["forwards_per_token"], abs=0.006)
