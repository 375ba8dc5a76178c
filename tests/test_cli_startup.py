"""`yue --version`, `--help`, `yue models` and argument errors answer without importing torch or
transformers (issue 61): `import yue` is lazy (PEP 562) and each command's module loads only when it runs."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import typer

# Runs `yue ARGS` in a fresh interpreter and prints its exit code and the heavy modules it imported.
_PROBE = """
import json, sys
import yue.cli
try:
    yue.cli.app(sys.argv[1:])
except SystemExit as e:
    code = e.code
print(json.dumps({"code": code, "heavy": [m for m in ("torch", "transformers") if m in sys.modules]}))
"""


def _run(*args: str) -> dict:
    out = subprocess.run([sys.executable, "-c", _PROBE, *args], capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(
    "args, code",
    [
        (["--version"], 0),
        (["--help"], 0),
        (["models"], 0),
        (["generate", "--help"], 0),
        (["generate", "x", "--temperature", "hot"], 2),  # a value of the wrong type
        (["generate", "x", "--temperature", "5"], 2),  # out of range: the config's own check
        (["generate", "x", "--threads", "0"], 2),
        (["generate"], 2),  # no prompt
        (["no-such-command"], 2),
    ],
)
def test_quick_answers_import_neither_torch_nor_transformers(args, code):
    assert _run(*args) == {"code": code, "heavy": []}


def test_import_yue_is_lazy_and_its_names_still_load():
    code = (
        "import sys, yue; light = not any(m in sys.modules for m in ('torch', 'transformers')); "
        "print(light, sorted(yue.__all__), yue.load.__module__, yue.Engine.__name__, 'torch' in sys.modules)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    all_names = ["DecodeConfig", "Engine", "YueConfig", "YueForCausalLM", "load"]
    assert out.split(" ", 1) == ["True", f"{all_names} yue.engine.loading Engine True\n"]


def test_the_command_list_names_every_registered_command_with_its_docstring_summary():
    """`yue --help` lists the commands from `common.COMMANDS` and the source; loaded, they match."""
    import inspect

    from yue.cli import app, common

    group = typer.main.get_command(app)
    for name in common.COMMANDS:
        command = group.get_command(None, name)
        assert command is not None, name
        first = inspect.cleandoc(command.callback.__doc__ or "").split("\n\n")[0]
        assert common.summaries()[name] == " ".join(first.split()), name
    assert set(typer.main.get_command(app).commands) == set(common.COMMANDS)  # every one has an entry


def test_verbose_prints_each_phase_time_to_stderr_and_leaves_stdout_as_it_was(tiny_model_dir):
    from typer.testing import CliRunner

    from yue.cli import app

    args = ["generate", "def add(a, b):", "--model", tiny_model_dir, "--mode", "ar", "-n", "4"]
    plain, verbose = CliRunner().invoke(app, args), CliRunner().invoke(app, [*args, "--verbose"])
    assert plain.exit_code == verbose.exit_code == 0, verbose.output
    assert verbose.stdout == plain.stdout
    phases = [line.split()[1] for line in verbose.stderr.splitlines() if line.startswith("[time]")]
    assert phases == ["imports", "load", "first", "rest", "total"]


def test_a_mistyped_command_is_answered_with_the_close_ones():
    from typer.testing import CliRunner

    from yue.cli import app

    res = CliRunner().invoke(app, ["generat", "x"])
    assert res.exit_code == 2 and "Did you mean 'generate'?" in res.output


# `yue ARGS` through the entry point (`yue.cli.main`), with an atexit handler that writes a file, and an
# object whose finalizer writes another when the interpreter's teardown clears `__main__`.
_ENTRY = (
    "import atexit, pathlib, sys; atexit.register(pathlib.Path(sys.argv[1]).write_text, 'ran')\n"
    "import os\nclass Teardown:\n"
    "    def __del__(self, mk=os.open, close=os.close, path=sys.argv[1] + '.teardown', how=os.O_CREAT | os.O_WRONLY):\n"
    "        close(mk(path, how))\n"
    "kept = Teardown(); sys.argv = ['yue', *sys.argv[2:]]; from yue.cli import main; main()"
)


def test_a_quick_command_exits_with_its_whole_output_its_code_and_its_atexit_handlers(
    tiny_model_dir, tmp_path
):
    """`main` skips the interpreter's teardown after generate (`exit_now`): the text is the in-process
    command's, the exit code a failure's, and atexit handlers still run."""
    from typer.testing import CliRunner

    from yue.cli import app

    args = ["generate", "def f(", "--model", tiny_model_dir, "-n", "6", "--no-stream"]
    marker = tmp_path / "atexit"

    def entry(*a: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-c", _ENTRY, str(marker), *a], capture_output=True, text=True)

    done = entry(*args)
    assert done.returncode == 0, done.stderr
    assert marker.read_text() == "ran"
    assert not (tmp_path / "atexit.teardown").exists()  # no teardown (a light command's leaves it)
    assert done.stdout == CliRunner().invoke(app, args).stdout and done.stdout.strip()
    marker.unlink()
    too_long = entry(*args[:-3], "-n", "100000")  # past the context, found once the model is loaded
    assert too_long.returncode == 2 and "context" in too_long.stderr
    assert marker.read_text() == "ran"
