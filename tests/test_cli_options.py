"""Command options made from a typed config (`yue.cli.options`): types, defaults, help and checks come from
the config, not from copies in the command."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

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
