"""Fuzzing: schemathesis over the OpenAPI document, hypothesis over raw bodies. Never a 5xx, always the
error shape, and the server still answers afterwards."""

from __future__ import annotations

import json

import pytest
import schemathesis
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error

import yue
from tests.conftest import tiny_config
from tests.test_serve import _wait_ready
from yue.model import YueForCausalLM
from yue.serve import ServeConfig, create_app

ENDPOINTS = ["/v1/completions", "/v1/chat/completions", "/generate"]
FIELDS = ["prompt", "messages", "model", "max_tokens", "temperature", "top_p", "top_k", "repetition_penalty",
          "seed", "stop", "mode", "router_threshold", "stream", "stream_options", "n"]  # fmt: skip


# The schema is read from the app at import (schemathesis' lazy `from_fixture` does not work with
# pytest 9); the app loads its engine, the session's tiny model, when the fixture below starts it.
_engine: dict = {}
APP = create_app(lambda: _engine["tiny"], ServeConfig(max_body_bytes=64 * 1024, max_queue=64))
schema = schemathesis.openapi.from_dict(APP.openapi())
schema.app = APP  # what `from_asgi` sets, without starting the app's lifespan at import
schema.config.generation.update(
    modes=[GenerationMode.POSITIVE, GenerationMode.NEGATIVE], max_examples=40, database="none"
)


@pytest.fixture(scope="module")
def fuzz_app(tmp_path_factory, tokenizer):
    # A 64-position context keeps every fuzzed generation short (the defaults fill the context).
    path = tmp_path_factory.mktemp("fuzz-model")
    torch.manual_seed(0)
    YueForCausalLM(tiny_config(tokenizer, max_position_embeddings=64)).save_pretrained(path)
    tokenizer.save(path)
    _engine["tiny"] = yue.load(path)
    with TestClient(APP, raise_server_exceptions=False) as client:
        _wait_ready(client)
        yield APP, client


def assert_error_shape(status: int, body: bytes) -> None:
    assert status < 500, body
    if status >= 400:
        error = json.loads(body)["error"]
        assert set(error) == {"message", "type", "param", "code"}
        assert isinstance(error["message"], str) and error["message"]
        assert "Traceback" not in error["message"]


@pytest.mark.slow
@schema.parametrize()
@settings(suppress_health_check=list(HealthCheck), deadline=None)
def test_schema_fuzzing_never_gets_a_5xx_and_errors_have_one_shape(case, fuzz_app):
    response = case.call()
    case.validate_response(response, checks=[not_a_server_error])
    assert_error_shape(response.status_code, response.content)
    if response.status_code == 200 and response.headers.get("content-type", [""])[0].startswith(
        "text/event-stream"
    ):
        assert '"error"' not in response.text  # (schemathesis may cut a stream short: no [DONE] check)


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4),
    max_leaves=12,
)
messages = st.lists(
    st.fixed_dictionaries(
        {"role": st.sampled_from(["user", "system", "assistant", "bot"]), "content": json_values}
    ),
    max_size=3,
)
bodies = st.dictionaries(st.sampled_from(FIELDS), json_values, max_size=8).flatmap(
    lambda d: st.just(d) | messages.map(lambda m: d | {"messages": m}) | st.text(max_size=80).map(lambda p: d | {"prompt": p})
)  # fmt: skip
raw = (
    st.binary(max_size=200)
    | bodies.map(lambda d: json.dumps(d, allow_nan=True).encode())
    | bodies.map(lambda d: json.dumps(d)[:-3].encode())  # truncated JSON
)


@pytest.mark.slow
@given(path=st.sampled_from(ENDPOINTS), body=raw)
@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
def test_raw_body_fuzzing_never_gets_a_5xx_and_errors_have_one_shape(fuzz_app, path, body):
    client = fuzz_app[1]
    r = client.post(path, content=body, headers={"Content-Type": "application/json"})
    assert_error_shape(r.status_code, r.content)


def test_server_is_alive_after_fuzzing(fuzz_app):
    client = fuzz_app[1]
    assert client.get("/health").json() == {"status": "ok", "running": 0, "waiting": 0}
    r = client.post("/generate", json={"prompt": "def f(x):", "max_tokens": 4})
    assert r.status_code == 200 and r.json()["tokens"] >= 1
