"""`yue generate -`: a prompt on standard input is the argument's prompt less the final newline that
`echo` adds (`--raw`: byte for byte), and an empty prompt is refused the same way from either source."""

from __future__ import annotations

import importlib
from types import SimpleNamespace

import pytest
from typer.testing import CliRunner

from yue.cli import app


class _Engine:
    """Records the prompts it is asked to continue."""

    instruct, name = False, "stub"

    def __init__(self) -> None:
        self.prompts: list[str] = []

    def generate(self, prompt, config):
        self.prompts.append(prompt)
        return SimpleNamespace(text="done", trace=[], stats=None)


@pytest.fixture
def engine(monkeypatch) -> _Engine:
    stub = _Engine()
    monkeypatch.setattr(importlib.import_module("yue.cli.generate"), "load_engine", lambda load: stub)
    return stub


@pytest.mark.parametrize(
    "piped, prompt",
    [
        (b"Write a haiku about the sea.\n", "Write a haiku about the sea."),
        (b"Write a haiku about the sea.\r\n", "Write a haiku about the sea."),
        (b"Write a haiku about the sea.", "Write a haiku about the sea."),
        (b"two lines\nend\n\n", "two lines\nend\n"),  # only the one final newline goes
        ("caf\u00e9 \U0001f30a\n".encode(), "caf\u00e9 \U0001f30a"),
    ],
)
def test_a_piped_prompt_is_the_argument_prompt_less_its_final_newline(engine, piped, prompt):
    res = CliRunner().invoke(app, ["generate", "-"], input=piped)
    assert res.exit_code == 0, res.output
    assert CliRunner().invoke(app, ["generate", prompt]).exit_code == 0
    assert engine.prompts == [prompt, prompt]


@pytest.mark.parametrize("piped", [b"keep\r\n", b"keep\n\n", b"  spaced \t\n", b"no newline"])
def test_raw_keeps_standard_input_byte_for_byte(engine, piped):
    res = CliRunner().invoke(app, ["generate", "-", "--raw"], input=piped)
    assert res.exit_code == 0, res.output
    assert engine.prompts == [piped.decode()]


@pytest.mark.parametrize("source", [["generate", ""], ["generate", "   "], ["generate", "-"]])
@pytest.mark.parametrize("piped", [b"", b"\n", b" \r\n"])
def test_an_empty_prompt_is_refused_the_same_way_from_either_source(engine, source, piped):
    res = CliRunner().invoke(app, source, input=piped)
    assert res.exit_code == 2
    assert "error: the prompt is empty" in res.output and not engine.prompts


def test_a_piped_prompt_writes_what_the_argument_writes_on_a_model(tiny_model_dir):
    args = ["--model", tiny_model_dir, "--mode", "ar", "-n", "8"]
    given = CliRunner().invoke(app, ["generate", "def add(a, b):", *args])
    piped = CliRunner().invoke(app, ["generate", "-", *args], input="def add(a, b):\n")
    assert given.exit_code == 0 and piped.exit_code == 0, piped.output
    assert piped.stdout == given.stdout and given.stdout.strip()
