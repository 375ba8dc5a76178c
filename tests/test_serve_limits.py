"""Every bound the server enforces: one table row per violation, with its exact status, param and code."""

from __future__ import annotations

import json

import httpx
import pytest
from fastapi.testclient import TestClient

from tests.serve_utils import LiveServer
from tests.test_serve import _wait_ready, metric
from yue.serve import ServeConfig, create_app

KEY = {"Authorization": "Bearer sk-limits"}
CONFIG = ServeConfig(api_key="sk-limits", max_prompt_tokens=32, max_body_bytes=2048)
OK = {"prompt": "def f(x):", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}
LONG = "alpha beta gamma delta " * 20  # well over 32 tokens

# (id, path, body (dict -> JSON, str -> raw), headers, status, param, code)
CASES = [
    ("missing-prompt", "/v1/completions", {"max_tokens": 4}, KEY, 400, "prompt", "invalid_value"),
    ("prompt-not-string", "/v1/completions", {"prompt": 5}, KEY, 400, "prompt", "invalid_value"),
    ("max-tokens-zero", "/v1/completions", OK | {"max_tokens": 0}, KEY, 400, "max_tokens", "invalid_value"),
    ("max-tokens-negative", "/generate", OK | {"max_tokens": -3}, KEY, 400, "max_tokens", "invalid_value"),
    (
        "max-tokens-string",
        "/v1/completions",
        OK | {"max_tokens": "8"},
        KEY,
        400,
        "max_tokens",
        "invalid_value",
    ),
    (
        "max-tokens-bool",
        "/v1/completions",
        OK | {"max_tokens": True},
        KEY,
        400,
        "max_tokens",
        "invalid_value",
    ),
    ("max-tokens-float", "/generate", OK | {"max_tokens": 4.5}, KEY, 400, "max_tokens", "invalid_value"),
    (
        "context-exceeded",
        "/v1/completions",
        OK | {"max_tokens": 250},
        KEY,
        400,
        "max_tokens",
        "context_length_exceeded",
    ),
    ("prompt-too-long", "/v1/completions", {"prompt": LONG}, KEY, 400, "prompt", "prompt_too_long"),
    (
        "chat-prompt-too-long",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": LONG}]},
        KEY,
        400,
        "messages",
        "prompt_too_long",
    ),
    (
        "temperature-negative",
        "/generate",
        OK | {"temperature": -0.1},
        KEY,
        400,
        "temperature",
        "invalid_value",
    ),
    (
        "temperature-string",
        "/generate",
        OK | {"temperature": "hot"},
        KEY,
        400,
        "temperature",
        "invalid_value",
    ),
    (
        "temperature-infinite",
        "/generate",
        '{"prompt": "x", "temperature": Infinity}',
        KEY,
        400,
        "temperature",
        "invalid_value",
    ),  # noqa: E501
    ("top-p-zero", "/v1/completions", OK | {"top_p": 0}, KEY, 400, "top_p", "invalid_value"),
    ("top-p-above-one", "/v1/completions", OK | {"top_p": 1.01}, KEY, 400, "top_p", "invalid_value"),
    ("top-p-nan", "/v1/completions", '{"prompt": "x", "top_p": NaN}', KEY, 400, "top_p", "invalid_value"),
    ("top-k-negative", "/generate", OK | {"top_k": -1}, KEY, 400, "top_k", "invalid_value"),
    (
        "repetition-penalty-zero",
        "/generate",
        OK | {"repetition_penalty": 0},
        KEY,
        400,
        "repetition_penalty",
        "invalid_value",
    ),  # noqa: E501
    (
        "presence-above-2",
        "/v1/completions",
        OK | {"presence_penalty": 2.5},
        KEY,
        400,
        "presence_penalty",
        "invalid_value",
    ),
    (
        "frequency-below-2",
        "/generate",
        OK | {"frequency_penalty": -2.1},
        KEY,
        400,
        "frequency_penalty",
        "invalid_value",
    ),
    (
        "logit-bias-not-id",
        "/v1/completions",
        OK | {"logit_bias": {"x1": 1}},
        KEY,
        400,
        "logit_bias",
        "invalid_value",
    ),
    (
        "logit-bias-past-vocab",
        "/v1/chat/completions",
        CHAT | {"logit_bias": {"99999": 1}},
        KEY,
        400,
        "logit_bias",
        "invalid_value",
    ),
    (
        "logit-bias-too-big",
        "/v1/completions",
        OK | {"logit_bias": {"5": 101}},
        KEY,
        400,
        "logit_bias",
        "invalid_value",
    ),
    (
        "suffix-without-fim-tokens",
        "/v1/completions",
        OK | {"suffix": "end"},
        KEY,
        400,
        "suffix",
        "no_fim_tokens",
    ),
    ("best-of", "/v1/completions", OK | {"best_of": 2}, KEY, 400, "best_of", "unsupported"),
    (
        "tools",
        "/v1/chat/completions",
        CHAT | {"tools": [{"type": "function"}]},
        KEY,
        400,
        "tools",
        "unsupported",
    ),
    (
        "json-mode",
        "/v1/chat/completions",
        CHAT | {"response_format": {"type": "json_object"}},
        KEY,
        400,
        "response_format",
        "unsupported",
    ),
    (
        "max-tokens-0-without-echo",
        "/v1/completions",
        OK | {"max_tokens": 0},
        KEY,
        400,
        "max_tokens",
        "invalid_value",
    ),
    (
        "role-tool",
        "/v1/chat/completions",
        {"messages": [{"role": "tool", "content": "x"}]},
        KEY,
        400,
        "messages[0].role",
        "invalid_value",
    ),
    ("seed-negative", "/generate", OK | {"seed": -1}, KEY, 400, "seed", "invalid_value"),
    ("seed-too-big", "/generate", OK | {"seed": 2**64}, KEY, 400, "seed", "invalid_value"),
    ("mode-unknown", "/v1/completions", OK | {"mode": "fast"}, KEY, 400, "mode", "invalid_value"),
    (
        "threshold-above-one",
        "/generate",
        OK | {"router_threshold": 1.5},
        KEY,
        400,
        "router_threshold",
        "invalid_value",
    ),  # noqa: E501
    (
        "threshold-negative",
        "/v1/chat/completions",
        CHAT | {"router_threshold": -0.1},
        KEY,
        400,
        "router_threshold",
        "invalid_value",
    ),  # noqa: E501
    (
        "five-stops",
        "/v1/completions",
        OK | {"stop": ["a", "b", "c", "d", "e"]},
        KEY,
        400,
        "stop",
        "invalid_value",
    ),
    ("stop-not-string", "/v1/completions", OK | {"stop": 7}, KEY, 400, "stop", "invalid_value"),
    ("n-zero", "/v1/completions", OK | {"n": 0}, KEY, 400, "n", "invalid_value"),
    ("n-too-many", "/v1/completions", OK | {"prompt": ["a", "b"], "n": 9}, KEY, 400, "n", "invalid_value"),
    ("prompt-empty-list", "/v1/completions", OK | {"prompt": []}, KEY, 400, "prompt", "invalid_value"),
    ("prompt-bad-token", "/v1/completions", OK | {"prompt": [1, -2]}, KEY, 400, "prompt", "invalid_value"),
    ("logprobs-too-many", "/v1/completions", OK | {"logprobs": 21}, KEY, 400, "logprobs", "invalid_value"),
    (
        "top-logprobs-without-logprobs",
        "/v1/chat/completions",
        CHAT | {"top_logprobs": 2},
        KEY,
        400,
        "top_logprobs",
        "invalid_value",
    ),
    ("stream-not-bool", "/v1/completions", OK | {"stream": "yes"}, KEY, 400, "stream", "invalid_value"),
    (
        "stream-options",
        "/v1/chat/completions",
        CHAT | {"stream_options": {"include_usage": "yes"}},
        KEY,
        400,
        "stream_options.include_usage",
        "invalid_value",
    ),
    ("unknown-model", "/v1/completions", OK | {"model": "gpt-4"}, KEY, 404, "model", "model_not_found"),
    (
        "unknown-model-chat",
        "/v1/chat/completions",
        CHAT | {"model": "x"},
        KEY,
        404,
        "model",
        "model_not_found",
    ),
    ("no-messages", "/v1/chat/completions", {"messages": []}, KEY, 400, "messages", "invalid_value"),
    (
        "bad-role",
        "/v1/chat/completions",
        {"messages": [{"role": "robot", "content": "hi"}]},
        KEY,
        400,
        "messages[0].role",
        "invalid_value",
    ),
    (
        "content-not-text",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": 5}]},
        KEY,
        400,
        "messages[0].content",
        "invalid_value",
    ),
    ("malformed-json", "/v1/completions", '{"prompt": ', KEY, 400, None, "invalid_json"),
    ("not-utf8", "/generate", b'{"prompt": "\xff\xfe"}', KEY, 400, None, "invalid_json"),
    # A lone UTF-16 surrogate ("\ud800" in JSON) is not text: 400, not the tokenizer's TypeError as a 500.
    ("prompt-surrogate", "/v1/completions", OK | {"prompt": "a \ud800"}, KEY, 400, "prompt", "invalid_value"),
    (
        "prompts-surrogate",
        "/v1/completions",
        OK | {"prompt": ["ok", "\udfff"]},
        KEY,
        400,
        "prompt",
        "invalid_value",
    ),
    (
        "chat-surrogate",
        "/v1/chat/completions",
        {"messages": [{"role": "user", "content": "hi \ud83d"}]},
        KEY,
        400,
        "messages",
        "invalid_value",
    ),
    ("generate-surrogate", "/generate", {"prompt": "\udfff"}, KEY, 400, "prompt", "invalid_value"),
    ("json-array", "/generate", "[1, 2]", KEY, 400, None, "invalid_request"),
    ("empty-body", "/generate", "", KEY, 400, None, "invalid_request"),
    ("body-too-large", "/generate", {"prompt": "x" * 4096}, KEY, 413, None, "request_too_large"),
    ("no-api-key", "/v1/completions", OK, {}, 401, None, "invalid_api_key"),
    ("wrong-api-key", "/generate", OK, {"Authorization": "Bearer sk-wrong"}, 401, None, "invalid_api_key"),
    (
        "basic-auth",
        "/v1/chat/completions",
        CHAT,
        {"Authorization": "Basic sk-limits"},
        401,
        None,
        "invalid_api_key",
    ),
    ("models-no-key", "/v1/models", None, {}, 401, None, "invalid_api_key"),
    ("unknown-path", "/v1/nothing", None, KEY, 404, None, "not_found"),
    ("wrong-method", "/generate", None, KEY, 405, None, "method_not_allowed"),
]


@pytest.fixture(scope="module")
def client(tiny_engine):
    with TestClient(create_app(tiny_engine, CONFIG), raise_server_exceptions=False) as c:
        _wait_ready(c)
        yield c


@pytest.mark.parametrize(("path", "body", "headers", "status", "param", "code"), [c[1:] for c in CASES],
                         ids=[c[0] for c in CASES])  # fmt: skip
def test_each_bound_violation_gets_its_status_param_and_code(
    client, path, body, headers, status, param, code
):
    if body is None:
        r = client.get(path, headers=headers)
    else:
        raw = body if isinstance(body, str | bytes) else json.dumps(body)
        r = client.post(path, content=raw, headers=headers | {"Content-Type": "application/json"})
    assert r.status_code == status, r.text
    error = r.json()["error"]
    assert set(error) == {"message", "type", "param", "code"} and error["message"]
    assert (error["param"], error["code"]) == (param, code)
    if status == 401:
        assert r.headers["www-authenticate"] == "Bearer"


def test_requests_within_bounds_succeed_and_health_metrics_need_no_key(client):
    assert client.post("/v1/completions", json=OK, headers=KEY).status_code == 200
    assert client.post("/v1/chat/completions", json=CHAT, headers=KEY).status_code == 200
    assert (
        client.post(
            "/generate", json=OK | {"stop": "\n", "seed": 2**63 - 1, "temperature": 0.7}, headers=KEY
        ).status_code
        == 200
    )  # noqa: E501
    assert client.get("/health").status_code == 200 and client.get("/metrics").status_code == 200
    # Rejections are counted by reason (this module's table ran first in file order).
    text = client.get("/metrics").text
    assert metric(text, "yue_request_failure_total", reason="context_length_exceeded") >= 1
    assert metric(text, "yue_request_failure_total", reason="invalid_api_key") >= 1


def test_a_form_body_is_told_to_send_json(client):
    r = client.post(
        "/generate",
        content=json.dumps(OK),
        headers=KEY | {"Content-Type": "application/x-www-form-urlencoded"},
    )
    assert r.status_code == 400 and "Content-Type: application/json" in r.json()["error"]["message"]


def test_one_token_id_prompt_is_one_generation_however_long(client):
    r = client.post("/v1/completions", json={"prompt": list(range(4, 24)), "max_tokens": 2}, headers=KEY)
    assert r.status_code == 200, r.text
    assert len(r.json()["choices"]) == 1


def test_the_generation_count_is_checked_before_any_prompt_is_tokenized(tiny_engine, monkeypatch):
    # 17 prompts: one over MAX_CHOICES; a list of 200,000 once held the event loop ~5 s tokenizing them.
    encoded = []
    monkeypatch.setattr(tiny_engine, "encode", lambda text: encoded.append(text) or [5])
    with TestClient(create_app(tiny_engine, ServeConfig()), raise_server_exceptions=False) as c:
        _wait_ready(c)
        r = c.post("/v1/completions", json={"prompt": ["a"] * 17, "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n" and encoded == []
        r = c.post("/v1/chat/completions", json=CHAT | {"n": 17})
        assert r.status_code == 400 and r.json()["error"]["param"] == "n" and encoded == []


def test_more_generations_than_the_server_can_ever_admit_is_a_400_not_a_503(tiny_engine):
    # running + waiting slots are 1 + 2: a request for 4 would get "retry shortly" forever.
    with TestClient(create_app(tiny_engine, ServeConfig(max_batch_size=1, max_queue=2))) as c:
        _wait_ready(c)
        r = c.post("/v1/completions", json=OK | {"n": 4})
        assert r.status_code == 400, r.text
        error = r.json()["error"]
        assert (error["param"], error["code"]) == ("n", "invalid_value") and "at most 3" in error["message"]
        assert c.post("/v1/completions", json=OK | {"n": 3}).status_code == 200


def test_body_limit_holds_for_chunked_bodies(tiny_engine):
    with LiveServer(tiny_engine, ServeConfig(max_body_bytes=2048)) as srv:

        def chunks(total: int):
            yield b'{"prompt": "'
            for _ in range(total // 64):
                yield b"x" * 64
            yield b'", "max_tokens": 2}'

        with httpx.Client(base_url=srv.url, timeout=10) as http:
            big = http.post("/generate", content=chunks(4096), headers={"Content-Type": "application/json"})
            assert big.status_code == 413 and big.json()["error"]["code"] == "request_too_large"
            small = http.post("/generate", content=chunks(128), headers={"Content-Type": "application/json"})
            assert small.status_code == 200, small.text
            assert http.get("/health").status_code == 200


@pytest.mark.parametrize(
    ("field", "value"),
    [("max_batch_size", 0), ("max_queue", -1), ("max_prompt_tokens", 0), ("max_body_bytes", 10),
     ("port", 70000), ("api_key", ""), ("retry_after_s", 0), ("drain_timeout_s", -1)],
)  # fmt: skip
def test_serve_config_rejects_bad_values_naming_the_field(field, value):
    with pytest.raises(ValueError, match=field):
        ServeConfig(**{field: value})
