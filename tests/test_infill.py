"""Fill in the middle: FIM tokens found in the vocabulary, the PSM prompt, `/infill` (llama.cpp's shape),
`suffix` on `/v1/completions` and `yue generate --suffix`, all the same greedy text as `Engine.generate`
on the same ids; a model without FIM tokens gets a 400 that says so.

The model is a tiny random one whose tokenizer is given StarCoder's FIM tokens (its embedding sized to
the grown vocabulary); the text is noise, what is tested is which ids go in and how the answer comes out.
"""

from __future__ import annotations

import json

import pytest
import torch
from fastapi.testclient import TestClient
from typer.testing import CliRunner

import yue
from tests.conftest import tiny_config
from yue.cli import app as cli_app
from yue.infill import FIM_STYLES, find_fim_tokens, infill_ids
from yue.model import YueForCausalLM
from yue.serve import create_app
from yue.tokenizer import YueTokenizer

PREFIX, SUFFIX = "def add(a, b):\n    ", "\n\nprint(add(1, 2))\n"
GREEDY = {"temperature": 0, "mode": "ar"}


def _with_fim(tokenizer: YueTokenizer, tmp_path, style: str = "starcoder") -> YueTokenizer:
    """A copy of `tokenizer` whose vocabulary has `style`'s FIM tokens (and file separator)."""
    tok = YueTokenizer.load(tokenizer.save(tmp_path / "tok"))
    tok.tokenizer.add_special_tokens(list(FIM_STYLES[style]))
    return tok


@pytest.fixture(scope="module")
def fim_engine(tokenizer, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("fim")
    tok = _with_fim(tokenizer, tmp)
    torch.manual_seed(0)
    YueForCausalLM(tiny_config(tok)).save_pretrained(tmp / "model")
    tok.save(tmp / "model")
    return yue.load(str(tmp / "model"))


@pytest.fixture(scope="module")
def fim_client(fim_engine):
    with TestClient(create_app(fim_engine), raise_server_exceptions=False) as c:
        _ready(c)
        yield c


def _ready(c: TestClient) -> None:
    import time

    deadline = time.monotonic() + 10
    while c.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "app never became ready"
        time.sleep(0.01)


@pytest.mark.parametrize("style", sorted(FIM_STYLES))
def test_fim_tokens_are_found_by_name_in_each_style_and_none_without(tokenizer, tmp_path, style):
    assert find_fim_tokens(tokenizer) is None
    tok = _with_fim(tokenizer, tmp_path, style)
    fim = find_fim_tokens(tok)
    names = FIM_STYLES[style]
    assert fim.style == style
    assert [fim.prefix, fim.suffix, fim.middle, fim.file_sep] == [tok.tokenizer.token_to_id(n) for n in names]


def test_the_prompt_is_psm_with_the_files_first_and_typed_fim_text_stays_text(fim_engine):
    tok = fim_engine.tokenizer
    fim = find_fim_tokens(tok)
    prefix = "x = '<fim_suffix>'\n"  # control-token text in code is code
    ids = infill_ids(tok, prefix, SUFFIX, extra=[("util.py", "A = 1\n")], start="ret")
    expected = [
        *tok.prompt_prefix,
        fim.file_sep,
        *tok.encode("util.py\nA = 1\n"),
        fim.prefix,
        *tok.encode(prefix),
        fim.suffix,
        *tok.encode(SUFFIX),
        fim.middle,
        *tok.encode("ret"),
    ]
    assert ids == expected
    assert ids.count(fim.suffix) == 1


def test_infill_answers_in_llama_cpp_shape_with_the_libraries_greedy_text(fim_client, fim_engine):
    r = fim_client.post(
        "/infill",
        json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12, "cache_prompt": True} | GREEDY,
    )
    assert r.status_code == 200, r.text
    body = r.json()
    ids = fim_engine.infill(PREFIX, SUFFIX)
    ref = fim_engine.generate(ids, max_new_tokens=12, **GREEDY)
    assert body["content"] == ref.text
    assert body["stop"] is True and body["tokens_predicted"] == len(ref.token_ids) <= 12
    assert body["tokens_evaluated"] == len(ids)
    assert body["stop_type"] in ("eos", "limit", "word") and body["model"] == fim_engine.name


def test_streamed_infill_equals_non_streamed_and_ends_with_stop_not_done(fim_client):
    request = {"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 12} | GREEDY
    whole = fim_client.post("/infill", json=request).json()
    r = fim_client.post("/infill", json=request | {"stream": True})
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    events = [json.loads(b[len("data: ") :]) for b in r.text.split("\n\n") if b]
    assert "[DONE]" not in r.text
    assert all(e["stop"] is False for e in events[:-1]) and events[-1]["stop"] is True
    assert "".join(e["content"] for e in events) == whole["content"]
    assert events[-1]["tokens_predicted"] == whole["tokens_predicted"]


def test_completions_suffix_is_the_same_infill(fim_client):
    infill = fim_client.post(
        "/infill", json={"input_prefix": PREFIX, "input_suffix": SUFFIX, "n_predict": 10} | GREEDY
    ).json()
    r = fim_client.post(
        "/v1/completions", json={"prompt": PREFIX, "suffix": SUFFIX, "max_tokens": 10} | GREEDY
    )
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["text"] == infill["content"]
    assert r.json()["usage"]["prompt_tokens"] == infill["tokens_evaluated"]


def test_a_model_without_fim_tokens_gets_a_400_that_says_so(tiny_engine):
    with TestClient(create_app(tiny_engine), raise_server_exceptions=False) as c:
        _ready(c)
        for path, body, param in [
            ("/infill", {"input_prefix": PREFIX, "input_suffix": SUFFIX}, "input_suffix"),
            ("/v1/completions", {"prompt": PREFIX, "suffix": SUFFIX}, "suffix"),
        ]:
            r = c.post(path, json=body)
            assert r.status_code == 400, r.text
            error = r.json()["error"]
            assert error["code"] == "no_fim_tokens" and error["param"] == param
            assert "no FIM tokens" in error["message"] and "<fim_prefix>" in error["message"]


def test_cli_generate_suffix_prints_the_infill(fim_engine, monkeypatch):
    import yue.cli.generate as generate

    monkeypatch.setattr(generate, "load_engine", lambda load: fim_engine)
    args = ["generate", PREFIX, "--suffix", SUFFIX, "--max-new-tokens", "8", "--temperature", "0"]
    result = CliRunner().invoke(cli_app, [*args, "--mode", "ar", "--no-stream"])
    assert result.exit_code == 0, result.output
    ref = fim_engine.generate(fim_engine.infill(PREFIX, SUFFIX), max_new_tokens=8, **GREEDY)
    assert result.output == ref.text + "\n"


def test_infill_needs_the_api_key_when_the_server_has_one(tiny_engine):
    """/infill runs the model like /v1/: behind the same key (401 without it, not a 400 from the model)."""
    from yue.serve import ServeConfig

    with TestClient(create_app(tiny_engine, ServeConfig(api_key="sk-test")), raise_server_exceptions=False) as c:
        _ready(c)
        body = {"input_prefix": PREFIX, "input_suffix": SUFFIX}
        assert c.post("/infill", json=body).status_code == 401
        keyed = c.post("/infill", json=body, headers={"Authorization": "Bearer sk-test"})
        assert keyed.status_code == 400 and keyed.json()["error"]["code"] == "no_fim_tokens"
