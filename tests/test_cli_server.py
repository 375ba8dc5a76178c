"""`yue generate --server URL` and `yue chat --server URL` (or $YUE_SERVER): the request goes to a
running `yue serve` and prints what the in-process command prints, importing no torch; a server that
is not there is a one-line error with exit code 2."""

from __future__ import annotations

import copy
import json
import socket
import subprocess
import sys

import pytest
from typer.testing import CliRunner

import yue
from tests.serve_utils import LiveServer
from yue.cli import app

PROMPT = "def add(a, b):"


@pytest.fixture(scope="module")
def served(tiny_model_dir):
    """A live server (uvicorn on 127.0.0.1) on the tiny model: (its URL, the model folder)."""
    with LiveServer(yue.load(tiny_model_dir)) as srv:
        yield srv.url, tiny_model_dir


@pytest.fixture(scope="module")
def served_instruct(tiny_gguf, tmp_path_factory):
    """A live server on an instruct model (the tiny GGUF's chat template): (its URL, its file)."""
    mp = pytest.MonkeyPatch()
    mp.setenv("YUE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
    with LiveServer(yue.load(tiny_gguf.path)) as srv:
        yield srv.url, str(tiny_gguf.path)
    mp.undo()


def _both(url: str, model: str, *args: str, input: str | None = None) -> tuple:
    """The command's result in-process (loading `model`) and against the server at `url`."""
    here = CliRunner().invoke(app, [*args, "--model", model], input=input)
    there = CliRunner().invoke(app, [*args, "--server", url], input=input)
    assert here.exit_code == 0, here.output
    assert there.exit_code == 0, there.output
    return here, there


@pytest.mark.parametrize(
    "flags",
    [
        ["--mode", "ar", "-n", "8"],
        ["--mode", "ar", "-n", "8", "--stream"],
        ["-n", "10", "--temp", "0.9", "--seed", "3", "--top-k", "20"],  # the model's default mode, sampled
        ["--mode", "ar", "-n", "12", "--stop", "b"],
    ],
)
def test_generate_through_the_server_prints_what_in_process_prints(served, flags):
    url, model = served
    here, there = _both(url, model, "generate", PROMPT, *flags)
    assert there.stdout == here.stdout and here.stdout.strip()


def test_an_instruct_models_prompt_goes_through_its_chat_template_on_the_server_too(served_instruct):
    url, model = served_instruct
    for extra in ([], ["--system", "Be brief."], ["--raw"]):
        here, there = _both(url, model, "generate", "Hello", "--mode", "ar", "-n", "6", *extra)
        assert there.stdout == here.stdout, extra


def test_a_piped_prompt_and_yue_server_work_as_the_option(served, monkeypatch):
    url, model = served
    monkeypatch.setenv("YUE_SERVER", url)
    there = CliRunner().invoke(app, ["generate", "-", "--mode", "ar", "-n", "8"], input=PROMPT + "\n")
    monkeypatch.delenv("YUE_SERVER")
    here = CliRunner().invoke(app, ["generate", PROMPT, "--model", model, "--mode", "ar", "-n", "8"])
    assert there.exit_code == 0 and there.stdout == here.stdout


def test_chat_through_the_server_replies_as_in_process(served):
    url, model = served
    here, there = _both(url, model, "chat", "--mode", "ar", "-n", "6", input="hello\nhow are you?\n/exit\n")
    assert there.stdout == here.stdout and here.stdout.count("\n") == 2


def test_generate_through_the_server_imports_no_torch(served):
    url, model = served
    code = (
        "import json, sys, yue.cli\n"
        "try:\n    yue.cli.app(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(json.dumps({'code': code, 'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))"
    )
    args = ["generate", PROMPT, "--server", url, "--mode", "ar", "-n", "8"]
    out = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, check=True)
    *text, last = out.stdout.splitlines()
    assert json.loads(last) == {"code": 0, "heavy": []}
    here = CliRunner().invoke(app, ["generate", PROMPT, "--model", model, "--mode", "ar", "-n", "8"])
    assert "\n".join(text) + "\n" == here.stdout


def test_no_server_there_is_a_clear_error_with_exit_code_2():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    for command in (["generate", "x"], ["chat"]):
        res = CliRunner().invoke(app, [*command, "--server", f"http://127.0.0.1:{port}"], input="")
        assert res.exit_code == 2 and "error: no yue server answers at" in res.output, res.output


@pytest.mark.parametrize(
    "option, message",
    [
        (["--threads", "2"], "--threads with --server: it is the server's own"),
        (["--dtype", "bfloat16"], "--dtype with --server: it is the server's own"),
        (["--block-size", "2"], "--block-size with --server: it is not in the HTTP API"),
        (["--model", "yue-code-mini"], "the server at"),
    ],
)
def test_settings_a_request_cannot_carry_are_refused_naming_the_option(served, option, message):
    url, _ = served
    res = CliRunner().invoke(app, ["generate", "x", "--server", url, *option])
    assert res.exit_code == 2 and f"error: {option[0] if 'server at' in message else ''}" in res.output
    assert message in res.output, res.output


def _corpus(folder) -> str:
    """A small folder of sources (relative to the working folder, as a user would name it)."""
    folder.mkdir()
    for i in range(6):
        (folder / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    return str(folder)


def test_eval_through_the_server_prints_what_in_process_prints_and_imports_no_torch(
    served, tmp_path, monkeypatch
):
    url, model = served
    monkeypatch.chdir(tmp_path)
    corpus = _corpus(tmp_path / "src")
    flags = ["--corpus", "src", "--batches", "1", "--seq-len", "32", "--seed", "3"]
    here, there = _both(url, model, "eval", *flags)
    assert there.stdout == here.stdout and json.loads(here.stdout)["sequences"] > 0
    code = (
        "import json, sys, yue.cli\n"
        "try:\n    yue.cli.app(sys.argv[1:])\nexcept SystemExit as e:\n    code = e.code\n"
        "print(json.dumps({'code': code, 'heavy': [m for m in ('torch', 'transformers') if m in sys.modules]}))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code, "eval", "--server", url, *flags],
        capture_output=True,
        text=True,
        check=True,
    )
    *text, last = out.stdout.splitlines()
    assert json.loads(last) == {"code": 0, "heavy": []} and text == [here.stdout.strip()]
    assert corpus


def test_eval_through_the_server_names_a_bad_field_a_missing_corpus_and_a_missing_server(served, tmp_path):
    url, _ = served
    res = CliRunner().invoke(app, ["eval", "--server", url, "--corpus", str(tmp_path / "nope.txt")])
    assert res.exit_code == 2 and "error: the server at" in res.output and "nope.txt" in res.output, (
        res.output
    )
    res = CliRunner().invoke(app, ["eval", "--server", url, "--threads", "2"])
    assert res.exit_code == 2 and "--threads with --server" in res.output, res.output
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = CliRunner().invoke(app, ["eval", "--server", f"http://127.0.0.1:{port}"])
    assert res.exit_code == 2 and "error: no yue server answers at" in res.output, res.output


def test_the_eval_route_refuses_bad_fields_and_a_model_without_files(tiny_engine):
    """/eval's 400s: a field out of range or unknown, and an Engine built in memory (no `source`)."""
    from fastapi.testclient import TestClient

    from yue.serve import create_app

    with TestClient(create_app(tiny_engine)) as client:
        bad = client.post("/eval", json={"batches": 0})
        assert bad.status_code == 400 and bad.json()["error"]["param"] == "batches"
        assert client.post("/eval", json={"corpora": "x"}).status_code in (400, 422)
    built = copy.copy(tiny_engine)  # the same model, as if built in memory
    built.source = None
    with TestClient(create_app(built)) as client:
        res = client.post("/eval", json={})
        assert res.status_code == 400 and res.json()["error"]["code"] == "not_reloadable"


def test_eval_longer_than_the_models_context_is_a_400_naming_seq_len(tiny_engine):
    """A sequence past the model's positions is refused by name (it was an IndexError, a 500)."""
    from fastapi.testclient import TestClient

    from yue.serve import create_app

    context = tiny_engine.model.config.max_position_embeddings
    with TestClient(create_app(tiny_engine), raise_server_exceptions=False) as client:
        res = client.post("/eval", json={"seq_len": context + 1})
        assert res.status_code == 400, res.text
        assert res.json()["error"]["param"] == "seq_len" and "context" in res.json()["error"]["message"]
