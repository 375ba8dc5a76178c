"""`yue bench` invariants: the JSON contract, verified == ar, hf-greedy == our ar, the plot, bad input;
chat prompts fed to every entry as the same ids; prompt sets held-out first; the llama.cpp peer (where
llama-cpp-python is installed) or its one-line skip note; the verify cost curve.

Benchmarks are not timed tests: nothing here asserts a speed.
"""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from typer.testing import CliRunner

import yue
from yue.bench import harness, llamacpp, metrics
from yue.bench.harness import JSON_KEYS, BenchConfig, _skips, entries, run_bench
from yue.bench.prompts import load_prompts, prompt_sets
from yue.bench.runners import HFRunner, OurRunner, Prompt, Sampling, load_peers
from yue.cli import app
from yue.decode.costs import verify_cost_curve
from yue.engine import Engine
from yue.kernels import probe

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
def dev_prompts_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("dev") / "calibration.jsonl"
    path.write_text(
        json.dumps({"prompt": "def omega_2(x):\n", "reference": "    return alpha(x) + 2\n"}) + "\n"
    )
    return path


@pytest.fixture(scope="module")
def bench_run(drafting_model_dir, prompts_file, dev_prompts_file, tmp_path_factory):
    """One CLI run over every mode, a one-point sweep, batch 2, a held-out and a dev set (no memory
    probes: see below)."""
    out = tmp_path_factory.mktemp("bench")
    args = [
        "bench",
        "--model",
        drafting_model_dir,
        "--prompts",
        str(prompts_file),
        "--dev-prompts",
        str(dev_prompts_file),
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
    assert {"model", "prompts", "max_new_tokens", "modes"} <= set(doc)
    assert set(doc) - {"model", "prompts", "max_new_tokens", "modes"} == {
        "temperature",
        "top_p",
        "seed",
        "prompt_sets",
        "skipped",
        "verify_cost_curve",
        "drafting_pass_cost",
        "settings",
    }
    assert doc["prompts"] == len(PROMPTS) and doc["max_new_tokens"] == 12
    assert (doc["temperature"], doc["top_p"], doc["seed"]) == (0.0, 1.0, 0)  # greedy by default
    expected = ["hf-greedy", "hf-prompt-lookup", "ar", "verified", "verified@1", "verified+fused"]
    expected += ["verified+fused@1", "hybrid", "hybrid@0.5", "nar"]
    assert list(doc["modes"]) == expected + ["ar@b2", "verified@b2"]
    for mode, row in doc["modes"].items():
        assert list(row) == list(JSON_KEYS), mode
    assert json.loads((out / "bench.json").read_text()) == doc


def test_held_out_set_comes_first_and_the_dev_set_is_labelled_as_such(bench_run):
    result, _ = bench_run
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    sets = doc["prompt_sets"]
    assert [(s["name"], s["split"], s["prompts"]) for s in sets] == [
        ("prompts", "held-out", len(PROMPTS)),
        ("calibration", "dev", 1),
    ]
    assert doc["modes"] == sets[0]["modes"] and doc["prompts"] == sets[0]["prompts"]
    assert list(sets[1]["modes"]) == list(sets[0]["modes"])
    assert sets[1]["modes"]["verified"]["exact_match_vs_ar"] == 1.0
    held, dev = result.stdout.index("held-out (nothing"), result.stdout.index("dev (calibration")
    assert held < dev


def test_llamacpp_peer_without_a_gguf_source_is_skipped_with_a_one_line_note(bench_run):
    result, _ = bench_run
    doc = json.loads(result.stdout.strip().splitlines()[-1])
    assert "llamacpp-greedy" not in doc["modes"]
    assert "no GGUF source" in doc["skipped"]["llamacpp-greedy"]
    assert "llamacpp-greedy skipped: model" in result.stdout and "Traceback" not in result.output


def test_verify_cost_curve_is_reported_for_rows_1_to_9_and_the_drafting_pass(bench_run):
    doc = json.loads(bench_run[0].stdout.strip().splitlines()[-1])
    curve, draft = doc["verify_cost_curve"], doc["drafting_pass_cost"]
    assert curve["rows"] == list(range(1, 10)) and len(curve["step_ms"]) == 9
    assert curve["ratio_to_1_row"][0] == 1.0 and all(r > 0 for r in curve["ratio_to_1_row"])
    assert draft["slots"] == 8 and draft["ms"] > 0 and draft["ratio_to_ar_step"] > 0
    assert "drafting pass (8 slots)" in bench_run[0].stdout


def test_verified_output_equals_ar_output_and_it_really_drafted(bench_run):
    modes = json.loads(bench_run[0].stdout.strip().splitlines()[-1])["modes"]
    for name in ("verified", "verified@b2", "verified@1", "verified+fused", "verified+fused@1"):
        assert modes[name]["exact_match_vs_ar"] == 1.0, name
    assert modes["verified"]["mean_accepted"] is not None  # drafts were proposed and verified
    assert modes["verified"]["nll_ratio_vs_ar"] == pytest.approx(1.0)
    assert modes["ar"]["exact_match_vs_ar"] == 1.0 and modes["ar"]["nll_ratio_vs_ar"] == 1.0


def test_every_entry_of_ours_reports_who_wrote_its_tokens_as_shares_summing_to_one(bench_run):
    result, _ = bench_run
    modes = json.loads(result.stdout.strip().splitlines()[-1])["modes"]
    for name, row in modes.items():
        shares = row["token_sources"]
        if name.startswith("hf-"):
            assert shares is None, name  # a peer's tokens have no draft sources
            continue
        assert set(shares) == {"nar", "copy", "corpus", "ar"}, name
        assert sum(shares.values()) == pytest.approx(1.0, abs=1e-3), name  # rounded to 4 places
    assert modes["ar"]["token_sources"]["ar"] == 1.0 and modes["ar@b2"]["token_sources"]["ar"] == 1.0
    assert modes["nar"]["token_sources"]["nar"] > 0
    assert "share of output tokens by writer: prompts (held-out)" in result.stdout


def test_hf_greedy_and_prompt_lookup_write_our_ar_tokens(bench_run):
    modes = json.loads(bench_run[0].stdout.strip().splitlines()[-1])["modes"]
    assert modes["hf-greedy"]["exact_match_vs_ar"] == 1.0
    assert modes["hf-greedy"]["speedup_vs_llamacpp_greedy"] is None  # llama.cpp did not run
    assert modes["hf-prompt-lookup"]["exact_match_vs_ar"] == 1.0
    # One forward per token (the forward that writes an EOS counts, the EOS token does not).
    assert modes["hf-greedy"]["forwards_per_token"] == modes["ar"]["forwards_per_token"] >= 1.0


def test_hf_greedy_tokens_equal_our_ar_tokens_on_a_random_model(tiny_model_dir, tmp_path):
    engine = yue.load(tiny_model_dir)
    llama, rec, _ = load_peers(tiny_model_dir, "cpu", str(tmp_path))
    hf = HFRunner(llama, rec, engine.tokenizer, lookup=False, max_new_tokens=20)
    ours = OurRunner(engine, "ar", None, max_new_tokens=20)
    for i, text in enumerate(["def alpha_1(x):\n", "你好", "import os\n"]):
        p = Prompt(text, None, engine.encode(text))
        assert hf([(i, p)]).rows[0][1] == ours([(i, p)]).rows[0][1]


def test_prompt_lookup_counts_every_forward_and_accepted_draft(drafting_model_dir, tmp_path):
    engine = yue.load(drafting_model_dir)
    llama, rec, _ = load_peers(drafting_model_dir, "cpu", str(tmp_path))
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


def test_fused_entries_are_skipped_with_a_reason_for_a_top_layer_nar_set():
    # yue-smol's NAR set is in its top 4 layers: `yue bench --model yue-smol` with the default
    # --fused-drafts once exited 2 ("drafting 'fused' needs a NAR set in every layer").
    todo = entries(BenchConfig(modes=("ar", "verified"), verified_thresholds=(1.0,)))
    engine = SimpleNamespace(name="top", has_nar_set=True, model_config=SimpleNamespace(nar_start=26))
    skipped = _skips(todo, BenchConfig(), engine)
    assert set(skipped) == {"verified+fused", "verified+fused@1"}
    assert all("layer 26" in why for why in skipped.values())
    engine.model_config.nar_start = 0  # a NAR set in every layer drafts fused
    assert _skips(todo, BenchConfig(), engine) == {}


@pytest.mark.slow
@pytest.mark.parametrize("low_memory", [False, True])
def test_peak_memory_is_measured_in_a_process_of_its_own(tiny_model_dir, low_memory):
    from yue.bench.memory import MemorySpec, measure

    engine = yue.load(tiny_model_dir)
    prompt = "def f(x):"
    spec = MemorySpec(
        "verified", tiny_model_dir, None, prompt, engine.encode(prompt), 8, 1, low_memory=low_memory
    )
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


def test_cost_curve_gives_nine_positive_step_times_and_a_drafting_pass(tiny_engine):
    c = verify_cost_curve(tiny_engine.model, context=50, warmup=1, tries=3)
    assert c.rows == tuple(range(1, 10)) and len(c.step_s) == 9 and all(s > 0 for s in c.step_s)
    assert c.ratios[0] == 1.0
    assert c.draft_slots == tiny_engine.model_config.block_size and c.draft_s > 0


# --- chat prompts: parsed, templated once, the same ids for every entry -------------------------------

CHAT = [
    {"messages": [{"role": "user", "content": "def alpha_1(x):"}], "reference": "    return beta(x)\n"},
    {"messages": [{"role": "system", "content": "be brief"}, {"role": "user", "content": "class P:"}]},
    {"prompt": "def gamma_4(x):\n    return"},  # raw prompts stay raw, even for a chat model
]


def _template(self, messages: list[dict[str, str]]) -> str:
    """A stand-in chat template (with generation prompt), in the shape of `Engine.chat_prompt`."""
    return "".join(f"<{m['role']}>{m['content']}\n" for m in messages) + "<assistant>"


@pytest.fixture
def chat_engine(monkeypatch, tiny_model_dir):
    monkeypatch.setattr(Engine, "chat_prompt", _template, raising=False)
    return yue.load(tiny_model_dir)


@pytest.fixture
def chat_file(tmp_path) -> Path:
    path = tmp_path / "chat.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in CHAT))
    return path


def test_chat_lines_go_through_the_template_and_raw_lines_stay_raw(chat_engine, chat_file):
    got = load_prompts(chat_file, chat_engine)
    texts = [
        "<user>def alpha_1(x):\n<assistant>",
        "<system>be brief\n<user>class P:\n<assistant>",
        "def gamma_4(x):\n    return",
    ]
    assert [p.text for p in got] == texts
    assert [p.ids for p in got] == [chat_engine.encode(t) for t in texts]
    assert [p.reference for p in got] == ["    return beta(x)\n", None, None]
    assert len(load_prompts(chat_file, chat_engine, limit=2)) == 2


@pytest.mark.parametrize(
    "line, message",
    [
        ({"messages": []}, "non-empty list"),
        ({"messages": [{"role": "user"}]}, "non-empty list"),
        ({"text": "x"}, 'string "prompt" or a "messages" list'),
        ({"prompt": "x", "reference": 3}, '"reference" must be a string'),
    ],
)
def test_bad_prompt_lines_name_the_file_and_line(chat_engine, tmp_path, line, message):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"prompt": "ok"}) + "\n" + json.dumps(line) + "\n")
    with pytest.raises(ValueError, match=message) as e:
        load_prompts(path, chat_engine)
    assert f"{path}:2" in str(e.value)


def test_chat_messages_for_an_engine_that_cannot_template_are_a_user_error(chat_file):
    class Bare:  # an engine without chat_prompt
        name = "bare"

        def encode(self, text: str) -> list[int]:
            return [len(text)]

    with pytest.raises(ValueError, match=f"{chat_file}:1: chat messages need a chat template"):
        load_prompts(chat_file, Bare())


def test_default_sets_of_a_completion_model_are_held_out_code_then_the_dev_set(tiny_engine):
    sets = prompt_sets(tiny_engine, None, None, limit=2)
    assert [(s.name, s.split, len(s.prompts)) for s in sets] == [
        ("code_test", "held-out", 2),
        ("devset", "dev", 2),
    ]


def test_default_sets_of_an_instruct_model_are_held_out_chat_then_calibration(
    chat_engine, chat_file, monkeypatch, tmp_path
):
    import yue.bench.prompts as bench_prompts

    test, calib = tmp_path / "chat_test.jsonl", tmp_path / "chat_calibration.jsonl"
    shutil.copy(chat_file, test), shutil.copy(chat_file, calib)
    monkeypatch.setattr(bench_prompts, "CHAT_TEST", test)
    monkeypatch.setattr(bench_prompts, "CHAT_CALIBRATION", calib)
    monkeypatch.setattr(Engine, "instruct", True, raising=False)
    sets = prompt_sets(chat_engine, None, None, limit=None)
    assert [(s.name, s.split) for s in sets] == [("chat_test", "held-out"), ("chat_calibration", "dev")]
    assert sets[0].prompts[0].text == "<user>def alpha_1(x):\n<assistant>"
    # Files given: exactly those, held-out first, whatever the model.
    sets = prompt_sets(chat_engine, None, calib, limit=1)
    assert [(s.name, s.split, len(s.prompts)) for s in sets] == [("chat_calibration", "dev", 1)]
    # The calibration split given as the held-out set still reads as what it is; another file does not.
    sets = prompt_sets(chat_engine, calib, None, limit=1)
    assert [(s.name, s.split) for s in sets] == [("chat_calibration", "dev")]
    assert [s.split for s in prompt_sets(chat_engine, test, None, limit=1)] == ["held-out"]


def test_every_mode_and_peer_is_fed_the_same_templated_ids(
    chat_engine, chat_file, tiny_model_dir, monkeypatch
):
    """Through run_bench: the ids our decode loop starts from and the ids transformers' generate gets
    are, per prompt, the chat template's text encoded once."""
    import transformers

    import yue.engine.core

    expected = [p.ids for p in load_prompts(chat_file, chat_engine)]
    seen: dict[str, list[list[int]]] = {"ours": [], "hf": []}
    real_decode, real_generate = yue.engine.core.decode, transformers.LlamaForCausalLM.generate

    def decode(model, prompts, cfg, cancel=None, costs=None, corpus=None):
        seen["ours"] += [list(p) for p in prompts]
        return real_decode(model, prompts, cfg, cancel, costs, corpus)

    def generate(self, input_ids, **kw):
        seen["hf"] += input_ids.tolist()
        return real_generate(self, input_ids, **kw)

    monkeypatch.setattr(yue.engine.core, "decode", decode)
    monkeypatch.setattr(transformers.LlamaForCausalLM, "generate", generate)
    cfg = BenchConfig(
        model=tiny_model_dir,
        prompts=str(chat_file),
        max_new_tokens=4,
        modes=("hf-greedy", "hf-prompt-lookup", "ar", "verified"),
        thresholds=(),
        verified_thresholds=(),
        fused_drafts=False,
        memory=False,
        cost_curve=False,
    )
    result = run_bench(cfg)
    for who in ("ours", "hf"):
        assert seen[who] and all(ids in expected for ids in seen[who]), who
        assert all(ids in seen[who] for ids in expected), who
    assert result.summaries["hf-greedy"].values["exact_match_vs_ar"] == 1.0


def test_bfloat16_bench_runs_ours_and_the_peers_in_it_with_a_float32_reference(tiny_model_dir, tmp_path):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text(
        "".join(json.dumps({"prompt": p}) + "\n" for p in ["def a(x):", "class B:", "import "])
    )
    cfg = BenchConfig(
        model=tiny_model_dir,
        prompts=str(prompts),
        max_new_tokens=6,
        modes=("hf-greedy", "ar", "verified"),
        thresholds=(),
        verified_thresholds=(),
        fused_drafts=False,
        limit=3,
        memory=False,
        cost_curve=False,
        dtype="bfloat16",
    )
    doc = run_bench(cfg).document()
    assert doc["settings"]["dtype"].startswith("bfloat16")
    assert doc["settings"]["kernels"] == probe.describe()  # which kernels ours ran
    assert doc["modes"]["verified"]["exact_match_vs_ar"] == 1.0
    for s in doc["prompt_sets"]:
        ref = s["float32_reference"]
        assert ref["precision"] == "bfloat16" and ref["prompts"] == 3
        assert 0 <= ref["identical_to_float32_ar"] <= 3
        assert ref["nll_ratio"] > 0 and ref["ar_speedup_vs_float32"] > 0
    with pytest.raises(ValueError, match="float32, bfloat16"):
        BenchConfig(dtype="float16")


# --- the llama.cpp peer ----------------------------------------------------------------------------


def test_llamacpp_reports_why_it_cannot_run_for_a_model_without_a_gguf(tiny_model_dir):
    why = llamacpp.unavailable(tiny_model_dir)
    assert why is not None and "\n" not in why and "GGUF" in why


@pytest.fixture(scope="module")
def f32_gguf(tmp_path_factory) -> Path:
    """A tiny random Llama GGUF with float32 matmul weights (embedding/head Q8_0, as SmolLM2's) and a
    ChatML tokenizer and template: an instruct model yue loads as an AR set (no NAR set)."""
    from tests.gguf_utils import write_tiny_llama_gguf

    return write_tiny_llama_gguf(tmp_path_factory.mktemp("f32_gguf") / "tiny.gguf", quant="F32").path


needs_llama_cpp = pytest.mark.skipif(
    importlib.util.find_spec("llama_cpp") is None,
    reason="llama-cpp-python is not installed (pip install '.[llamacpp]')",
)


@needs_llama_cpp
def test_llamacpp_peer_is_fed_our_ids_and_writes_our_ar_tokens_on_a_float32_tiny_gguf(
    f32_gguf, gguf_cache, chat_file, monkeypatch
):
    """Through run_bench with the GGUF as the model: chat lines through its ChatML template, the same
    ids to llama.cpp, transformers and our loop, and greedy llama.cpp == our `ar` token for token
    (float32 matmuls; its Q8_0 head costs llama.cpp 8-bit activations there, too little to flip a
    greedy choice on these prompts). `verified` runs on drafts copied from the context and writes
    `ar`'s tokens; modes that need a NAR set are skipped with a note."""
    import transformers

    import yue.engine.core

    seen: dict[str, list[list[int]]] = {"ours": [], "hf": [], "llamacpp": []}
    real_decode, real_hf = yue.engine.core.decode, transformers.LlamaForCausalLM.generate
    real_lc = llamacpp.LlamaCppRunner.generate

    def decode(model, prompts, cfg, cancel=None, costs=None, corpus=None):
        seen["ours"] += [list(p) for p in prompts]
        return real_decode(model, prompts, cfg, cancel, costs, corpus)

    def hf_generate(self, input_ids, **kw):
        seen["hf"] += input_ids.tolist()
        return real_hf(self, input_ids, **kw)

    def lc_generate(self, ids, seed=0):
        seen["llamacpp"].append(list(ids))
        return real_lc(self, ids, seed)

    monkeypatch.setattr(yue.engine.core, "decode", decode)
    monkeypatch.setattr(transformers.LlamaForCausalLM, "generate", hf_generate)
    monkeypatch.setattr(llamacpp.LlamaCppRunner, "generate", lc_generate)
    cfg = BenchConfig(
        model=str(f32_gguf),
        prompts=str(chat_file),
        max_new_tokens=24,
        modes=("hf-greedy", "llamacpp-greedy", "ar", "verified", "hybrid"),
        verified_thresholds=(),
        memory=False,
    )
    result = run_bench(cfg)
    engine = yue.load(str(f32_gguf))
    expected = [p.ids for p in load_prompts(chat_file, engine)]
    assert expected[0][:3] == engine.encode("<|im_start|>system\n")[:3]  # ChatML, templated
    for who, ids in seen.items():
        assert ids and all(x in expected for x in ids) and all(x in ids for x in expected), who
    assert "no NAR set" in result.skipped["hybrid"] and "llamacpp-greedy" not in result.skipped
    assert "verified" not in result.skipped
    assert result.summaries["verified"].values["exact_match_vs_ar"] == 1.0
    lc = result.summaries["llamacpp-greedy"].values
    assert lc["exact_match_vs_ar"] == 1.0 and lc["nll_ratio_vs_ar"] == pytest.approx(1.0)
    assert lc["forwards_per_token"] >= 1.0 and lc["ttft_ms"] > 0
    assert result.summaries["hf-greedy"].values["exact_match_vs_ar"] == 1.0
    assert result.summaries["ar"].values["speedup_vs_llamacpp_greedy"] > 0
    assert "tiny.gguf (ALL_F32 weights, llama.cpp kernels" in result.settings["llamacpp"]
    assert result.costs is not None and result.costs.draft_s is None  # no NAR set: no drafting pass


@needs_llama_cpp
def test_llamacpp_runner_stops_at_eos_or_the_budget_and_reuses_nothing_across_calls(f32_gguf, gguf_cache):
    engine = yue.load(str(f32_gguf))
    llm = llamacpp.load(f32_gguf, 128, threads=1)
    p = Prompt("The sea", None, engine.encode("The sea"))
    eos = {engine.tokenizer.eos_id}
    for budget in (1, 16):
        s = llamacpp.LlamaCppRunner(llm, engine.tokenizer, eos, budget)([(0, p)])
        tokens = s.rows[0][1]
        assert not eos & set(tokens) and len(tokens) <= budget
        assert s.forwards == len(tokens) + (len(tokens) < budget)  # the EOS's forward counts
        assert s.ttft_s is not None and 0 < s.ttft_s <= s.wall_s
    # A second call starts from an empty context: the same tokens (no prefix-cache reuse changes them).
    again = llamacpp.LlamaCppRunner(llm, engine.tokenizer, eos, 16)([(0, p)])
    assert again.rows[0][1] == tokens


@pytest.mark.parametrize(
    "child, works", [("pass", True), ("import ctypes; ctypes.string_at(0)", False), ("hang", False)]
)
def test_llamacpp_extra_buffers_are_judged_by_a_child_surviving_a_batch(tmp_path, monkeypatch, child, works):
    """Where llama.cpp's extra CPU buffer types crash (a segfault: AMX with a Q4_1 file, llama-cpp-python
    0.3.36), the probe's child dies, not the bench, and the peer is loaded without them."""
    monkeypatch.delenv(llamacpp.EXTRA_BUFFERS_ENV, raising=False)
    monkeypatch.setattr(llamacpp, "PROBE", child)
    if child == "hang":  # the child outlives its time limit

        def hung(cmd, **kwargs):
            raise subprocess.TimeoutExpired(cmd, kwargs["timeout"])

        monkeypatch.setattr(llamacpp.subprocess, "run", hung)
    assert llamacpp.extra_buffers_work(tmp_path / "m.gguf") is works


@needs_llama_cpp
def test_llamacpp_peer_without_extra_buffers_writes_the_same_tokens_and_says_so(
    f32_gguf, gguf_cache, monkeypatch
):
    import llama_cpp.llama_cpp as lib

    engine = yue.load(str(f32_gguf))
    p = Prompt("The sea", None, engine.encode("The sea"))
    tokens = {}
    for forced in ("1", "0"):  # the fallback forced, as on a machine where the probe's child dies
        monkeypatch.setenv(llamacpp.EXTRA_BUFFERS_ENV, forced)
        llm = llamacpp.load(f32_gguf, 128, threads=1)
        assert llm.yue_extra_buffers is (forced == "1")
        assert ("extra CPU buffer types off" in llamacpp.precision(llm, f32_gguf)) is (forced == "0")
        tokens[forced] = llamacpp.LlamaCppRunner(llm, engine.tokenizer, set(), 12)([(0, p)]).rows[0][1]
    assert len(tokens["1"]) == 12 and tokens["0"] == tokens["1"]
    assert lib.llama_model_default_params().use_extra_bufts  # llama.cpp's defaults are restored


@needs_llama_cpp
@pytest.mark.slow
def test_llamacpp_peak_memory_is_measured_in_a_process_of_its_own(f32_gguf):
    from yue.bench.memory import MemorySpec, measure

    ids = [1, 40, 41, 42]
    mem = measure(MemorySpec("llamacpp-greedy", None, None, "", ids, 8, 1, gguf=str(f32_gguf)))
    assert 0 < mem["base_rss_mb"] <= mem["peak_rss_mb"]


def test_llamacpp_missing_package_gives_the_install_command(tmp_path, monkeypatch):
    gguf_file = tmp_path / "m.gguf"
    gguf_file.write_bytes(b"GGUF")
    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name, *a: None if name == "llama_cpp" else real(name, *a)
    )
    why = llamacpp.unavailable(str(gguf_file))
    assert why is not None and "\n" not in why and "pip install 'llama-cpp-python>=0.3.30'" in why


def test_a_verified_entry_that_parts_from_ar_is_reported_as_a_bug():
    """`verified` is exact by construction: a lone verified entry below 1.0 exact match gets a warning
    line naming it and the count; ar's own, a batch entry's and an exact entry's get none."""
    from yue.bench.harness import Entry, SetResult, _warn_if_verified_parts
    from yue.bench.summary import Summary

    todo = [Entry("ar", "ar"), Entry("verified", "verified"), Entry("verified@b4", "verified", batch=4)]
    exact = {"ar": 1.0, "verified": 0.875, "verified@b4": 0.5}
    result = SetResult(
        "chat_calibration", "dev", "chat_calibration.jsonl", 8,
        {name: Summary({"exact_match_vs_ar": x}) for name, x in exact.items()},
    )  # fmt: skip
    lines: list[str] = []
    _warn_if_verified_parts(todo, result, lines.append)
    assert len(lines) == 1 and "verified differs from ar on 1 of 8 prompts of chat_calibration" in lines[0]
    result.summaries["verified"].values["exact_match_vs_ar"] = 1.0
    lines.clear()
    _warn_if_verified_parts(todo, result, lines.append)
    assert lines == []


def sampled_outputs(monkeypatch, **kw) -> tuple[dict, dict[str, list[list[int]]]]:
    """A run_bench's JSON document and each entry's output tokens per prompt (in prompt order)."""
    seen: dict[str, list] = {}
    real = harness._timed_runs

    def timed_runs(todo, runners, prompts, cfg, log):
        samples = real(todo, runners, prompts, cfg, log)
        seen.update({name: [row[1] for s in ss for row in s.rows] for name, ss in samples.items()})
        return samples

    with monkeypatch.context() as patch:  # undone after the run: the next run wraps the real one
        patch.setattr(harness, "_timed_runs", timed_runs)
        result = run_bench(
            BenchConfig(thresholds=(), verified_thresholds=(), memory=False, cost_curve=False, **kw)
        )
    return result.document(), seen


@pytest.mark.parametrize("peer", ["hf", pytest.param("llamacpp", marks=needs_llama_cpp)])
def test_sampled_bench_repeats_its_outputs_under_a_seed_for_ours_and_the_peers(
    peer, request, prompts_file, monkeypatch
):
    """`yue bench --temperature --top-p --seed`: every entry and peer samples (ours with speculative
    sampling in `verified`), two runs with the same seed write the same tokens for every entry and
    prompt, another seed (or greedy) other tokens, and the JSON document reports the three settings."""
    if peer == "hf":  # a random tiny model (a trained one writes its corpus at any temperature)
        model, modes = request.getfixturevalue("tiny_model_dir"), ("hf-greedy", "ar", "verified")
    else:  # a GGUF (no NAR set): the llama.cpp peer runs it
        model, modes = str(request.getfixturevalue("f32_gguf")), ("hf-greedy", "llamacpp-greedy", "ar")
    run = dict(model=model, prompts=str(prompts_file), max_new_tokens=16, modes=modes, fused_drafts=False)
    doc, first = sampled_outputs(monkeypatch, temperature=2.0, top_p=0.99, seed=7, **run)
    _, again = sampled_outputs(monkeypatch, temperature=2.0, top_p=0.99, seed=7, **run)
    _, other = sampled_outputs(monkeypatch, temperature=2.0, top_p=0.99, seed=8, **run)
    _, greedy = sampled_outputs(monkeypatch, **run)
    assert set(first) == set(modes) and all(first[m] and all(first[m]) for m in modes)
    assert first == again
    # The random tiny yue model is flat enough that a draw shows; the tiny GGUF is too peaked for that
    # (every side writes its greedy tokens at temperature 2).
    for m in modes if peer == "hf" else ():
        assert other[m] != first[m] and greedy[m] != first[m], m
    assert (doc["temperature"], doc["top_p"], doc["seed"]) == (2.0, 0.99, 7)
    assert "temperature 2, top_p 0.99" in doc["settings"]["sampling"]


@pytest.mark.parametrize(
    "kw, field",
    [
        ({"temperature": -0.1}, "temperature"),
        ({"temperature": 2.5}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
    ],
)
def test_bad_sampling_settings_are_refused_naming_the_field(kw, field):
    with pytest.raises(ValueError, match=field):
        BenchConfig(**kw)
    with pytest.raises(ValueError, match=field):
        Sampling(**kw)
