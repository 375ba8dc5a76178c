"""Command options made from a typed config (`yue.cli.options`): types, defaults, help and checks come from
the config, not from copies in the command."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from yue.cli.options import config_options, field_help
from yue.serve.config import ServeConfig


@dataclass(frozen=True)
class Limits:
    """Toy settings.

    Attributes:
        size: how many, at most; None = no bound.
        name: what it is called,
            over two lines.
        secret: a key.
    """

    size: int | None = 8
    name: str = "x"
    secret: str | None = None

    def __post_init__(self) -> None:
        if self.size is not None and self.size < 1:
            raise ValueError(f"size must be >= 1, got {self.size}")


def _app(seen: list) -> typer.Typer:
    app = typer.Typer()

    @app.command()
    @config_options(Limits, zero_is_none=("size",), envvars={"secret": "TOY_SECRET"})
    def run(where: Path = typer.Option(Path("."), help="a folder"), config: Limits | None = None) -> None:
        seen.append((where, config))

    @app.command()
    def other() -> None:  # a second command: Typer then expects the command's name
        pass

    return app


def test_each_field_is_an_option_with_its_type_default_and_docstring_help(monkeypatch):
    seen: list = []
    app = _app(seen)
    monkeypatch.delenv("TOY_SECRET", raising=False)
    assert CliRunner().invoke(app, ["run"]).exit_code == 0
    assert seen[-1] == (Path("."), Limits())
    assert CliRunner().invoke(app, ["run", "--size", "3", "--name", "y", "--where", "/tmp"]).exit_code == 0
    assert seen[-1] == (Path("/tmp"), Limits(size=3, name="y"))
    assert CliRunner().invoke(app, ["run", "--size", "0"]).exit_code == 0  # 0 writes "no bound"
    assert seen[-1][1].size is None
    monkeypatch.setenv("TOY_SECRET", "k")
    assert CliRunner().invoke(app, ["run"]).exit_code == 0 and seen[-1][1].secret == "k"
    text = CliRunner().invoke(app, ["run", "--help"], env={"COLUMNS": "200"}).output
    assert "what it is called, over two lines." in text and "0 = no bound" in text and "a folder" in text


def test_a_bad_value_fails_in_the_configs_own_check():
    result = CliRunner().invoke(_app([]), ["run", "--size", "-2"])
    assert result.exit_code != 0 and "size must be >= 1" in str(result.exception)


def test_every_serve_setting_the_command_offers_has_help():
    helps = field_help(ServeConfig)
    assert {"host", "port", "api_key", "max_batch_size", "prefix_cache_mb", "drain_timeout_s"} <= set(helps)
    assert all(text.strip() for text in helps.values())


def test_the_command_line_loads_no_web_framework_until_the_server_starts():
    """The CLI reads `ServeConfig` for `yue serve`'s options; FastAPI and uvicorn load only when serving."""
    import subprocess
    import sys

    code = "import sys, yue.cli; print(sorted(m for m in ('fastapi', 'uvicorn', 'starlette') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# The commands' own options, from their configs: every field offered, parsed into the config, checked by it.


def _options(command: str) -> set[str]:
    """The parameter names of one `yue` command."""
    from yue.cli import app

    return {p.name for p in typer.main.get_command(app).get_command(None, command).params}


def _fields(config_cls: type) -> set[str]:
    import dataclasses

    return {f.name for f in dataclasses.fields(config_cls)}


def test_every_decode_setting_is_an_option_of_generate_and_chat():
    from yue.config import DecodeConfig

    # Left out: generate prints text, not log-probabilities; chat prints replies, not traces.
    assert _fields(DecodeConfig) - {"logprobs"} <= _options("generate")
    assert _fields(DecodeConfig) - {"logprobs", "trace"} <= _options("chat")


class _Engine:
    """Stands in for a loaded model: records the DecodeConfig each generation gets."""

    instruct, name, default_mode = False, "stub", "ar"

    def __init__(self) -> None:
        self.configs: list = []

    def generate(self, prompt, config):
        from types import SimpleNamespace

        self.configs.append(config)
        return SimpleNamespace(text="done", trace=[], stats=None)


def _stub_engine(monkeypatch) -> _Engine:
    import importlib

    engine = _Engine()
    for module in ("yue.cli.generate", "yue.cli.chat"):
        monkeypatch.setattr(importlib.import_module(module), "load_engine", lambda *a: engine)
    return engine


def test_generate_builds_its_decode_config_from_its_options(monkeypatch):
    from yue.cli import app
    from yue.config import DecodeConfig

    engine = _stub_engine(monkeypatch)
    assert CliRunner().invoke(app, ["generate", "x"]).exit_code == 0
    given = ["--mode", "verified", "--top-k", "3", "--presence-penalty", "0.5", "--block-size", "4"]
    given += ["--logit-bias", "5:-100", "--logit-bias", "7:2.5", "--stop", "a", "--stop", "END"]
    result = CliRunner().invoke(app, ["generate", "x", *given, "--no-prompt-lookup", "--ignore-eos"])
    assert result.exit_code == 0, result.output
    assert engine.configs == [
        DecodeConfig(),
        DecodeConfig(
            mode="verified",
            top_k=3,
            presence_penalty=0.5,
            block_size=4,
            logit_bias=((5, -100.0), (7, 2.5)),
            stop=("a", "END"),
            prompt_lookup=False,
            ignore_eos=True,
        ),
    ]


@pytest.mark.parametrize(
    "option, value, message",
    [
        ("--temperature", "3", "temperature must be in [0, 2]"),
        ("--mode", "fast", "mode must be one of"),
        ("--drafting", "both", "drafting must be one of"),
        ("--top-p", "0", "top_p must be in (0, 1]"),
        ("--logit-bias", "5", "logit_bias: expected int:float, got '5'"),
        ("--logit-bias", "x:1", "logit_bias: expected int:float, got 'x:1'"),
    ],
)
def test_a_bad_decode_setting_is_refused_naming_the_field_before_a_model_loads(
    monkeypatch, option, value, message
):
    from yue.cli import app

    engine = _stub_engine(monkeypatch)
    result = CliRunner().invoke(app, ["generate", "x", option, value])
    assert result.exit_code == 2 and f"error: {message}" in result.output, result.output
    assert not engine.configs


def test_every_load_setting_is_an_option_of_generate_chat_and_serve_parsed_into_its_config(monkeypatch):
    """`--model/--adapter/--device/--dtype/--draft-dtype/--low-memory` are LoadConfig's fields, the one
    value `load_engine` gets; a bad precision is refused naming the field before anything loads."""
    import importlib

    from yue.cli import app
    from yue.config import LoadConfig

    for command in ("generate", "chat", "serve"):
        assert _fields(LoadConfig) <= _options(command), command
    loads = []
    monkeypatch.setattr(
        importlib.import_module("yue.cli.generate"),
        "load_engine",
        lambda load: loads.append(load) or _Engine(),
    )
    given = [
        "--model",
        "m.gguf",
        "--dtype",
        "int4",
        "--draft-dtype",
        "float32",
        "--low-memory",
        "--device",
        "auto",
    ]
    assert CliRunner().invoke(app, ["generate", "x", *given]).exit_code == 0
    assert loads == [
        LoadConfig(model="m.gguf", device="auto", dtype="int4", draft_dtype="float32", low_memory=True)
    ]
    for option, value in (("--dtype", "int3"), ("--draft-dtype", "int2")):
        result = CliRunner().invoke(app, ["generate", "x", option, value])
        field = option[2:].replace("-", "_")
        assert result.exit_code == 2 and f"error: {field} must be one of" in result.output, result.output
    assert len(loads) == 1


def test_chat_keeps_its_own_reply_length_default(monkeypatch):
    from yue.cli import app

    seen = []
    _stub_engine(monkeypatch)
    monkeypatch.setattr("yue.cli.chat._converse", lambda engine, config, messages: seen.append(config))
    assert CliRunner().invoke(app, ["chat", "--top-k", "2"], input="").exit_code == 0
    assert (seen[0].max_new_tokens, seen[0].top_k, seen[0].mode) == (512, 2, "ar")


def test_every_bench_setting_is_an_option_of_bench_parsed_into_its_config(monkeypatch):
    from yue.bench import harness, report
    from yue.bench.harness import BenchConfig
    from yue.cli import app

    assert _fields(BenchConfig) <= _options("bench")
    seen = []
    monkeypatch.setattr(harness, "run_bench", lambda config, log: seen.append(config))
    monkeypatch.setattr(report, "print_report", lambda result: "{}")
    args = ["bench", "--modes", "ar,verified", "--thresholds", "0.3", "--verified-thresholds", ""]
    result = CliRunner().invoke(app, [*args, "--batch-sizes", "1, 4", "--no-memory", "--limit", "2"])
    assert result.exit_code == 0, result.output
    assert seen == [
        BenchConfig(
            modes=("ar", "verified"),
            thresholds=(0.3,),
            verified_thresholds=(),
            batch_sizes=(1, 4),
            memory=False,
            limit=2,
        )
    ]
    bad = CliRunner().invoke(app, ["bench", "--batch-sizes", "1,two"])
    assert (
        bad.exit_code == 2 and "error: batch_sizes: expected comma-separated ints, got '1,two'" in bad.output
    )


def test_every_training_setting_is_an_option_of_train_parsed_into_its_config(monkeypatch, tmp_path):
    from yue.cli import app
    from yue.train import loop
    from yue.train.config import TrainConfig

    assert _fields(TrainConfig) - {"train_set"} <= _options("train")  # --nar-only writes train_set
    seen = []
    monkeypatch.setattr(loop, "train", lambda config, resume: seen.append((config, resume)) or "m")
    out, init = str(tmp_path / "run"), str(tmp_path / "model")
    args = ["train", "--out", out, "--steps", "3", "--betas", "0.8,0.9", "--threads", "1"]
    assert CliRunner().invoke(app, args).exit_code == 0
    stage2 = ["train", "--out", out, "--nar-only", "--init", init, "--data", "a.jsonl", "--resume"]
    result = CliRunner().invoke(app, stage2)
    assert result.exit_code == 0 and result.output == "model: m\n", result.output
    assert seen == [
        (TrainConfig(out=out, steps=3, betas=(0.8, 0.9), threads=1), False),
        (TrainConfig(out=out, train_set="nar", init=init, corpus="a.jsonl"), True),
    ]
    bad = CliRunner().invoke(app, ["train", "--out", out, "--betas", "0.9"])
    assert bad.exit_code == 2 and "error: betas must be two numbers" in bad.output


def test_every_recipe_setting_is_an_option_of_distill_recipe_checked_before_any_work(monkeypatch, tmp_path):
    from yue.cli import app
    from yue.train import recipe
    from yue.train.recipe import RecipeConfig

    assert _fields(RecipeConfig) <= _options("distill-recipe")
    seen = []
    monkeypatch.setattr(recipe, "distill_recipe", lambda base, out, config: seen.append(config) or {"x": 1})
    base = ["distill-recipe", "--base", "b", "--out", str(tmp_path)]
    result = CliRunner().invoke(app, [*base, "--steps", "5", "--extra-sequences", "a.json"])
    assert result.exit_code == 0 and result.output == '{"x": 1}\n', result.output
    assert seen == [RecipeConfig(steps=5, extra_sequences=("a.json",))]
    assert seen[0].every_layer().nar.steps == 5
    for bad, message in (
        (["--nar-layers", "2", "--held-out", "1"], "held_out must be >= 2"),
        (["--new-tokens", "8"], "new_tokens must exceed block_size"),
        (["--lr", "2"], "lr must be in (0, 1)"),
    ):
        result = CliRunner().invoke(app, [*base, *bad])
        assert result.exit_code == 2 and f"error: {message}" in result.output, result.output
    assert len(seen) == 1  # refused before the recipe ran


def test_every_finetune_and_self_distill_setting_is_an_option(monkeypatch, tmp_path):
    from yue.cli import app
    from yue.train import finetune
    from yue.train.config import FinetuneConfig
    from yue.train.selfdistill import NARFinetuneConfig

    assert _fields(FinetuneConfig) <= _options("finetune")
    assert _fields(NARFinetuneConfig) <= _options("self-distill")
    seen = []
    monkeypatch.setattr(
        finetune, "finetune", lambda model, data, out, config, **kw: seen.append(config) or {}
    )
    args = ["finetune", "--data", str(tmp_path), "--out", str(tmp_path / "a"), "--warmup-steps", "3"]
    result = CliRunner().invoke(app, [*args, "--target-modules", "q_proj", "--target-modules", "v_proj"])
    assert result.exit_code == 0, result.output
    assert CliRunner().invoke(app, args).exit_code == 0
    assert seen == [
        FinetuneConfig(warmup_steps=3, target_modules=("q_proj", "v_proj")),
        FinetuneConfig(warmup_steps=3),
    ]
    bad = CliRunner().invoke(app, [*args, "--target-modules", "lm_head"])
    assert bad.exit_code == 2 and "lm_head" in bad.output and len(seen) == 2


def test_every_serve_bench_setting_is_an_option_of_bench_serve_checked_before_a_model_loads(monkeypatch):
    import yue
    from yue.bench.serving import ServeBenchConfig
    from yue.cli import app

    assert _fields(ServeBenchConfig) <= _options("bench-serve")
    loads = []
    monkeypatch.setattr(yue, "load", lambda *a, **kw: loads.append(a))
    for bad, message in (
        (["--clients", "1,0"], "clients must be integers >= 1, got [1, 0]"),
        (["--batch-sizes", "1,x"], "batch_sizes: expected comma-separated ints, got '1,x'"),
        (["--mode", "fast"], "mode must be one of"),
    ):
        result = CliRunner().invoke(app, ["bench-serve", *bad])
        assert result.exit_code == 2 and f"error: {message}" in result.output, result.output
    assert not loads


def test_every_router_setting_but_reinit_is_an_option_of_train_router(monkeypatch):
    from yue.cli import app
    from yue.train import router
    from yue.train.router import RouterTrainConfig

    assert _fields(RouterTrainConfig) - {"reinit"} <= _options("train-router")  # --user-labels decides it
    seen = []

    def stub(model, out, *, cfg, seed, **kw):  # records what the command built, then stops it
        seen.append((cfg, seed))
        raise ValueError("stopped after the config")

    monkeypatch.setattr(router, "run_train_router", stub)
    args = ["train-router", "--model", "m", "--epochs", "3", "--seed", "4"]
    for extra in ([], ["--user-labels", "labels.jsonl"]):
        result = CliRunner().invoke(app, [*args, *extra])
        assert result.exit_code == 2 and "stopped after the config" in result.output, result.output
    assert seen == [
        (RouterTrainConfig(epochs=3, seed=4), 4),
        (RouterTrainConfig(epochs=3, seed=4, reinit=False), 4),  # fine-tunes the current router
    ]


def test_every_eval_setting_is_an_option_of_eval_checked_before_a_model_loads(monkeypatch):
    from yue.cli import app
    from yue.train import evaluate
    from yue.train.evaluate import EvalConfig

    assert _fields(EvalConfig) <= _options("eval")
    seen = []
    monkeypatch.setattr(evaluate, "evaluate_model", lambda model, config: seen.append(config) or {})
    args = ["eval", "--model", "yue-code-mini", "--corpus", "c.txt", "--seq-len", "32"]
    assert CliRunner().invoke(app, args).exit_code == 0
    bad = CliRunner().invoke(app, [*args, "--batches", "0"])
    assert bad.exit_code == 2 and "error: batches must be >= 1, got 0" in bad.output
    assert seen == [EvalConfig(corpus="c.txt", seq_len=32)]
