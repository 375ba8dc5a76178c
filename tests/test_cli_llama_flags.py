"""llama.cpp's everyday flags (`-t/--threads`, `-c/--ctx-size`, `-n`, `--temp`, `--seed`) on every command
that loads a model: each another name of one config field, so it means the same everywhere."""

from __future__ import annotations

import importlib

import pytest
from typer.testing import CliRunner

from tests.test_cli_options import _Engine
from yue.cli import app
from yue.settings import DecodeConfig, LoadConfig

SHORT = ["-t", "2", "-c", "512", "-n", "5", "--temp", "0.7", "--seed", "3"]
LONG = ["--threads", "2", "--ctx-size", "512", "--max-new-tokens", "5", "--temperature", "0.7", "--seed", "3"]


def _stub_loads(monkeypatch) -> tuple[list, _Engine]:
    loads, engine = [], _Engine()
    for module in ("yue.cli.generate", "yue.cli.chat"):
        monkeypatch.setattr(
            importlib.import_module(module), "load_engine", lambda load: loads.append(load) or engine
        )
    return loads, engine


@pytest.mark.parametrize("flags", [SHORT, LONG], ids=["short", "long"])
def test_generate_reads_the_llama_cpp_flags_into_its_load_and_decode_configs(monkeypatch, flags):
    loads, engine = _stub_loads(monkeypatch)
    result = CliRunner().invoke(app, ["generate", "x", *flags])
    assert result.exit_code == 0, result.output
    assert loads == [LoadConfig(threads=2, ctx_size=512)]
    assert engine.configs == [DecodeConfig(max_new_tokens=5, temperature=0.7, seed=3)]


def test_chat_reads_the_same_flags(monkeypatch):
    loads, _ = _stub_loads(monkeypatch)
    seen = []
    monkeypatch.setattr("yue.cli.chat._converse", lambda engine, config, messages: seen.append(config))
    assert CliRunner().invoke(app, ["chat", *SHORT], input="").exit_code == 0
    assert loads == [LoadConfig(threads=2, ctx_size=512)]
    assert (seen[0].max_new_tokens, seen[0].temperature, seen[0].seed) == (5, 0.7, 3)


def test_serve_passes_threads_and_ctx_size_to_the_models_load(monkeypatch):
    import yue.serve

    loaders = []
    monkeypatch.setattr(yue.serve, "serve", lambda loader, config, log_level: loaders.append(loader) or 0)
    result = CliRunner().invoke(app, ["serve", "-t", "2", "-c", "512"])
    assert result.exit_code == 0, result.output
    assert loaders[0].args == (LoadConfig(threads=2, ctx_size=512),)


def test_bench_reads_threads_tokens_temperature_and_seed(monkeypatch):
    from yue.bench import harness, report
    from yue.bench.harness import BenchConfig

    seen = []
    monkeypatch.setattr(harness, "run_bench", lambda config, log: seen.append(config))
    monkeypatch.setattr(report, "print_report", lambda result: "{}")
    result = CliRunner().invoke(app, ["bench", "-t", "2", "-n", "5", "--temp", "0.7", "--seed", "3"])
    assert result.exit_code == 0, result.output
    assert seen == [BenchConfig(threads=2, max_new_tokens=5, temperature=0.7, seed=3)]


def test_bench_serve_reads_threads_ctx_size_and_tokens(monkeypatch):
    import yue.engine
    from yue.bench import serving

    loads, configs = [], []
    monkeypatch.setattr(yue.engine, "load_from", lambda load: loads.append(load) or object())
    monkeypatch.setattr(serving, "bench_serve", lambda engine, config, **kw: configs.append(config))
    monkeypatch.setattr(serving, "report", lambda *a: "{}")
    result = CliRunner().invoke(app, ["bench-serve", "-t", "2", "-c", "512", "-n", "5"])
    assert result.exit_code == 0, result.output
    assert loads == [LoadConfig(model="yue-code-mini", threads=2, ctx_size=512)]
    assert configs[0].max_tokens == 5


def test_eval_sets_its_threads(monkeypatch):
    from yue.cli import common
    from yue.train import evaluate

    threads = []
    monkeypatch.setattr(common, "set_threads", threads.append)
    monkeypatch.setattr(evaluate, "evaluate_model", lambda model, config: {})
    result = CliRunner().invoke(app, ["eval", "--model", "yue-code-mini", "-t", "2"])
    assert result.exit_code == 0, result.output
    assert threads == [2]


@pytest.mark.parametrize("command", ["generate", "chat", "serve", "bench-serve"])
@pytest.mark.parametrize("flag", ["-t", "-c"])
def test_a_count_below_one_is_refused_naming_the_field(monkeypatch, command, flag):
    loads, _ = _stub_loads(monkeypatch)
    args = [command, "x"] if command == "generate" else [command]
    result = CliRunner().invoke(app, [*args, flag, "0"], input="")
    field = {"-t": "threads", "-c": "ctx_size"}[flag]
    assert result.exit_code == 2 and f"error: {field} must be a positive integer, got 0" in result.output
    assert not loads


@pytest.mark.parametrize("field", ["threads", "ctx_size"])
@pytest.mark.parametrize("value", [0, -3, 2.5, True])
def test_load_config_takes_only_positive_integers(field, value):
    with pytest.raises(ValueError, match=f"{field} must be a positive integer"):
        LoadConfig(**{field: value})


def test_load_from_hands_threads_and_ctx_size_to_a_load_that_takes_them(monkeypatch):
    import yue.engine

    calls = []

    def load(path, *, device, dtype, nar_dtype, adapter, low_memory, threads=None, ctx_size=None):
        calls.append((threads, ctx_size))

    monkeypatch.setattr(yue.engine.loading, "load", load)  # the one load_from calls
    yue.engine.load_from(LoadConfig(threads=2, ctx_size=512))
    assert calls == [(2, 512)]
