"""`yue.serve.proxy`: in Ray Serve's proxy, a response its replica left unfinished (the replica died),
or the proxy's own 503 past its queue, ends in OpenAI's shape. The proxy is played by small ASGI apps that stop where Ray's does: after the
messages the replica sent, with nothing more (`tests/test_serve_replicas.py` kills a real replica)."""

from __future__ import annotations

import asyncio
import json

from tests.serve_utils import parse_sse
from yue.serve.proxy import PROXY_CALLBACK, ReplicaLost, middlewares

SSE = [(b"content-type", b"text/event-stream; charset=utf-8")]


def _run(app_messages: list[dict], disconnect: bool = False) -> list[dict]:
    """What a client is sent through `ReplicaLost` by a proxy that relays `app_messages`, then stops."""
    sent: list[dict] = []

    async def proxy(scope, receive, send) -> None:
        if disconnect:
            await receive()
        for message in app_messages:
            await send(message)

    async def receive() -> dict:
        return {"type": "http.disconnect"}

    async def send(message) -> None:
        sent.append(message)

    scope = {"type": "http", "path": "/v1/completions", "method": "POST"}
    asyncio.run(ReplicaLost(proxy)(scope, receive, send))
    return sent


def test_a_stream_cut_off_ends_with_an_error_event_then_done():
    chunk = b'data: {"choices":[{"text":"def"}]}\n\n'
    sent = _run(
        [
            {"type": "http.response.start", "status": 200, "headers": SSE},
            {"type": "http.response.body", "body": chunk, "more_body": True},
        ]
    )
    assert sent[0]["status"] == 200 and sent[1]["body"] == chunk
    assert len(sent) == 3 and not sent[2].get("more_body", False)
    events = parse_sse((sent[1]["body"] + sent[2]["body"]).decode())
    assert events[0] == {"choices": [{"text": "def"}]} and events[-1] == "[DONE]"
    error = events[1]["error"]
    assert error["type"] == "server_error" and error["code"] == "replica_lost" and error["message"]


def test_a_response_never_started_is_a_503_with_the_openai_error_body():
    sent = _run([])
    assert sent[0]["status"] == 503
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json" and headers[b"retry-after"] == b"1"
    body = json.loads(sent[1]["body"])
    assert set(body["error"]) == {"message", "type", "param", "code"}
    assert body["error"]["code"] == "replica_lost" and not sent[1].get("more_body", False)


def test_finished_responses_and_clients_that_left_pass_untouched():
    whole = [
        {"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"application/json")]},
        {"type": "http.response.body", "body": b"{}"},
    ]
    assert _run(whole) == whole
    assert _run([], disconnect=True) == []  # the client went away: nothing to answer
    cut = [{"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]}]
    assert _run(cut) == cut + [{"type": "http.response.body", "body": b""}]  # not a stream: closed


def test_the_proxys_own_503_past_its_queue_is_the_servers_overloaded_error():
    """Ray's proxy answers past `max_queued_requests` with a plain-text 503 and the configured
    Retry-After; the client gets the single-process server's "overloaded" JSON with that Retry-After. A
    plain 503 without one (no replica up) passes as it is."""
    plain = [(b"content-type", b"text/plain; charset=utf-8")]
    queue_full = [
        {"type": "http.response.start", "status": 503, "headers": [*plain, (b"retry-after", b"2")]},
        {"type": "http.response.body", "body": b"Request dropped due to backpressure"},
    ]
    sent = _run(queue_full)
    assert len(sent) == 2 and sent[0]["status"] == 503
    headers = dict(sent[0]["headers"])
    assert headers[b"content-type"] == b"application/json" and headers[b"retry-after"] == b"2"
    error = json.loads(sent[1]["body"])["error"]
    assert error["code"] == "overloaded" and error["type"] == "service_unavailable_error"
    unavailable = [
        {"type": "http.response.start", "status": 503, "headers": plain},
        {"type": "http.response.body", "body": b"no replica"},
    ]
    assert _run(unavailable) == unavailable


def test_the_proxy_callback_names_the_middleware():
    module, name = PROXY_CALLBACK.split(":")
    assert module == "yue.serve.proxy" and name == middlewares.__name__
    assert [m.cls for m in middlewares()] == [ReplicaLost]
