"""Fuzzing: schemathesis over the OpenAPI document, hypothesis over raw bodies. Never a 5xx, always the
error shape, and the server still answers afterwards."""

from __future__ import annotations

import json

import pytest
import schemathesis
import torch
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, example, given, settings
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


# Typed values for every numeric and mapping field: in range, at the edges and far outside, so a value
# the checks let through reaches the decode loop (repetition_penalty 1e-38 with temperature > 0 once
# overflowed the scores to inf and failed every running request).
EDGES = [0, 1e-300, 1e-38, 1e-5, 0.01, 0.5, 1, 1.5, 2, 2.0000001, 100, 101, 1e38, 1e300, -1e-38, -2, -3]
numbers = st.sampled_from(EDGES) | st.floats(-1e308, 1e308, allow_nan=False) | st.integers(-(2**70), 2**70)
counts = st.sampled_from([0, 1, 2, 8, 16, 17, 20, 21, 64, 2**31, 2**63, 2**64]) | st.integers(-5, 70)
bias_keys = st.sampled_from(["0", "5", "63", "64", "-1", "1e3", "٣", "9" * 4301, "1" * 5000]) | st.text(
    "0123456789", min_size=1, max_size=40
)
TYPED = {
    "temperature": numbers, "top_p": numbers, "router_threshold": numbers, "repetition_penalty": numbers,
    "presence_penalty": numbers, "frequency_penalty": numbers, "top_k": counts, "max_tokens": counts,
    "seed": counts, "n": counts, "logprobs": counts | st.booleans(), "top_logprobs": counts,
    "logit_bias": st.dictionaries(bias_keys, numbers, max_size=3),
    "mode": st.sampled_from(["ar", "verified", "hybrid", "nar", "fast"]), "stream": st.booleans(),
    "stop": st.none() | st.text(max_size=4) | st.lists(st.text(max_size=3), max_size=6),
    "echo": st.booleans(),
}  # fmt: skip
typed_bodies = st.fixed_dictionaries({}, optional=TYPED)


class Victims:
    """Another client's greedy chat requests, sent in a loop while the fuzzing runs: each answer must
    be complete and equal to the reference."""

    BODY = {"messages": [{"role": "user", "content": "def f(x):"}], "max_tokens": 6, "temperature": 0}

    def __init__(self, url: str) -> None:
        import threading

        import httpx

        self.url, self.answers, self.bad, self.stop = url, 0, [], threading.Event()
        self.reference = httpx.post(url + "/v1/chat/completions", json=self.BODY, timeout=30).json()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import httpx

        with httpx.Client(timeout=30) as client:
            while not self.stop.is_set():
                r = client.post(self.url + "/v1/chat/completions", json=self.BODY)
                ok = r.status_code == 200 and r.json()["choices"] == self.reference["choices"]
                self.answers += 1
                if not ok:
                    self.bad.append(r.text)


@pytest.mark.slow
def test_typed_field_fuzzing_never_5xx_and_never_harms_another_request(fuzz_app):
    """Random values of every field through the three generation endpoints, beside another client's
    requests: no 5xx, errors in the one shape, a stream never breaks, the other client unharmed."""
    import httpx

    from tests.serve_utils import LiveServer, parse_sse

    with LiveServer(_engine["tiny"], ServeConfig(max_queue=64)) as server, httpx.Client(timeout=60) as client:
        victims = Victims(server.url)
        victims.thread.start()
        statuses = []

        @given(path=st.sampled_from(ENDPOINTS), body=typed_bodies, prompt=st.text(max_size=20))
        @example("/v1/chat/completions", {"repetition_penalty": 1e-300, "max_tokens": 8, "temperature": 1.0}, "hi")
        @example("/v1/completions", {"logit_bias": {"9" * 4301: 1.0}}, "hi")
        @example("/generate", {"temperature": 1e300}, "hi")
        @settings(max_examples=FUZZ_EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
        def drive(path, body, prompt):
            key = "messages" if path.endswith("chat/completions") else "prompt"
            payload = body | {key: [{"role": "user", "content": prompt}] if key == "messages" else prompt}
            r = client.post(server.url + path, json=payload)
            statuses.append(r.status_code)
            assert_error_shape(r.status_code, r.content)
            if r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream"):
                events = parse_sse(r.text)
                assert events[-1] == "[DONE]" and not any("error" in e for e in events[:-1] if isinstance(e, dict))

        try:
            drive()
        finally:
            victims.stop.set()
            victims.thread.join(60)
    counts = {str(code): statuses.count(code) for code in sorted(set(statuses))}
    print(json.dumps({"requests": len(statuses), "statuses": counts, "victim_answers": victims.answers}))
    assert victims.answers > 0 and not victims.bad, victims.bad[:2]
    assert 200 in statuses and 400 in statuses  # the run reached the decode loop and the checks


FUZZ_EXAMPLES = int(__import__("os").environ.get("YUE_FUZZ_EXAMPLES", "300"))
