"""The HTTP server: OpenAI compatibility, streaming == non-streaming, errors, lifecycle, metrics.

Most tests talk to the app in-process (TestClient); those that need real sockets (the openai client,
concurrency, SIGTERM) use uvicorn on 127.0.0.1. The model is the tiny random one from conftest.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import httpx
import openai
import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families

import yue
from tests.serve_utils import FailsMidStream, LiveServer, parse_sse
from yue.chat import DEFAULT_CHAT_TEMPLATE, ChatTemplate, find_chat_template
from yue.config import DecodeConfig
from yue.serve import ServeConfig, create_app
from yue.serve.streaming import SourceSplitter

PROMPT = "def add(a, b):"
MODES = ["ar", "verified", "hybrid", "nar"]


@pytest.fixture(scope="module")
def client(tiny_engine):
    with TestClient(create_app(tiny_engine), raise_server_exceptions=False) as c:
        _wait_ready(c)
        yield c


def _wait_ready(c: TestClient) -> None:
    deadline = time.monotonic() + 10
    while c.get("/health").status_code != 200:
        assert time.monotonic() < deadline, "app never became ready"
        time.sleep(0.01)


def metric(text: str, name: str, **labels) -> float:
    """The value of one sample in a Prometheus exposition (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                return sample.value
    return 0.0


def test_openai_client_drives_completions_chat_and_streaming(tiny_engine):
    with LiveServer(tiny_engine, ServeConfig(api_key="sk-test")) as srv:
        client = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-test", max_retries=0, timeout=30)
        [model] = client.models.list().data
        assert model.id == tiny_engine.name
        assert client.models.retrieve(model.id).id == model.id
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("gpt-4")

        done = client.completions.create(model=model.id, prompt=PROMPT, max_tokens=12, temperature=0)
        assert done.object == "text_completion" and done.choices[0].finish_reason in ("length", "stop")
        assert done.usage.prompt_tokens == tiny_engine.count_tokens(PROMPT)
        chunks = list(
            client.completions.create(
                model=model.id, prompt=PROMPT, max_tokens=12, temperature=0, stream=True
            )
        )
        assert len({c.id for c in chunks}) == 1
        assert "".join(c.choices[0].text for c in chunks) == done.choices[0].text
        assert [c.choices[0].finish_reason for c in chunks][-1] == done.choices[0].finish_reason
        assert all(c.choices[0].finish_reason is None for c in chunks[:-1])

        messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Say hi."}]
        chat = client.chat.completions.create(model=model.id, messages=messages, max_tokens=10, temperature=0)
        assert chat.choices[0].message.role == "assistant"
        stream = list(
            client.chat.completions.create(
                model=model.id,
                messages=messages,
                max_tokens=10,
                temperature=0,
                stream=True,
                stream_options={"include_usage": True},
            )
        )
        assert len({c.id for c in stream}) == 1
        assert stream[0].choices[0].delta.role == "assistant"
        assert (
            "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
            == chat.choices[0].message.content
        )
        assert stream[-2].choices[0].finish_reason == chat.choices[0].finish_reason
        assert stream[-1].choices == [] and stream[-1].usage.total_tokens == chat.usage.total_tokens
        assert all(c.usage is None for c in stream[:-1])

        with pytest.raises(openai.NotFoundError) as e:
            client.completions.create(model="gpt-4", prompt=PROMPT)
        assert e.value.param == "model" and e.value.code == "model_not_found"
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model=model.id, prompt=PROMPT, temperature=-1)
        assert e.value.param == "temperature"
        wrong = openai.OpenAI(base_url=srv.url + "/v1", api_key="sk-wrong", max_retries=0)
        with pytest.raises(openai.AuthenticationError):
            wrong.models.list()


@pytest.mark.parametrize("mode", MODES)
def test_streamed_text_equals_non_streamed_text_and_the_library(client, tiny_engine, mode):
    ref = tiny_engine.generate(PROMPT, DecodeConfig(mode=mode, max_new_tokens=24)).text
    common = {"max_tokens": 24, "temperature": 0, "mode": mode}
    for path, body, text_of, delta_of in [
        ("/generate", {"prompt": PROMPT}, lambda r: r["text"], lambda c: c.get("delta", "")),
        (
            "/v1/completions",
            {"prompt": PROMPT},
            lambda r: r["choices"][0]["text"],
            lambda c: c["choices"][0]["text"],
        ),
    ]:
        whole = client.post(path, json=body | common)
        assert whole.status_code == 200, whole.text
        streamed = client.post(path, json=body | common | {"stream": True})
        assert streamed.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(streamed.text)
        assert events[-1] == "[DONE]"
        assert "".join(delta_of(e) for e in events[:-1]) == text_of(whole.json()) == ref


def test_generate_reports_who_wrote_each_token(client, tiny_engine):
    body = {"prompt": "你好，世界！", "max_tokens": 40, "temperature": 0, "mode": "nar", "stream": True}
    events = parse_sse(client.post("/generate", json=body).text)
    *chunks, final, done = events
    assert done == "[DONE]" and final["done"] is True
    for c in chunks:
        assert "".join(t for t, _ in c["pieces"]) == c["delta"]
        assert {s for _, s in c["pieces"]} <= set(c["sources"])
    sources = [s for c in chunks for s in c["sources"]]
    assert sources.count("ar") == final["ar_tokens"] and sources.count("nar") == final["nar_tokens"] > 0
    assert final["tokens"] == len(sources) and final["accepted"] <= final["drafted"]
    assert final["ttft_ms"] <= final["latency_ms"]


def test_source_pieces_concatenate_to_each_delta_even_when_stop_strings_hold_text_back(tiny_engine):
    splitter = SourceSplitter(tiny_engine.tokenizer)
    cfg = DecodeConfig(mode="nar", max_new_tokens=60, stop=("zzzz",), temperature=1.0, seed=3)
    n = 0
    for event in tiny_engine.stream("🎉 中文", cfg):
        pieces = splitter.split(event)
        assert "".join(t for t, _ in pieces) == event.delta
        n += len(pieces)
    assert n > 0


def test_greedy_output_is_identical_when_8_clients_ask_at_once(tiny_engine):
    body = {"prompt": PROMPT, "max_tokens": 32, "temperature": 0, "mode": "verified"}
    ref = tiny_engine.generate(PROMPT, DecodeConfig(mode="verified", max_new_tokens=32)).text
    with LiveServer(tiny_engine, ServeConfig(max_batch_size=4, max_queue=8)) as srv:
        barrier = threading.Barrier(8)

        def ask(i: int) -> str:
            with httpx.Client(base_url=srv.url, timeout=30) as http:
                barrier.wait()
                if i % 2:
                    events = parse_sse(http.post("/v1/completions", json=body | {"stream": True}).text)
                    return "".join(e["choices"][0]["text"] for e in events[:-1])
                return http.post("/v1/completions", json=body).json()["choices"][0]["text"]

        with ThreadPoolExecutor(8) as pool:
            texts = list(pool.map(ask, range(8)))
    assert texts == [ref] * 8


def test_a_failure_mid_stream_sends_an_error_chunk_then_done(tiny_engine):
    app = create_app(FailsMidStream(tiny_engine, after=2))
    with TestClient(app, raise_server_exceptions=False) as c:
        _wait_ready(c)
        body = {"prompt": PROMPT, "max_tokens": 20, "temperature": 0, "stream": True}
        events = parse_sse(
            c.post("/v1/chat/completions", json={"messages": [{"role": "user", "content": "x"}]} | body).text
        )
        assert events[-1] == "[DONE]"
        assert set(events[-2]["error"]) == {"message", "type", "param", "code"}
        assert "secret" not in str(events)
        whole = c.post("/v1/completions", json=body | {"stream": False, "prompt": PROMPT})
        assert whole.status_code == 500
        assert whole.json()["error"]["type"] == "server_error" and "secret" not in whole.text
        assert "Traceback" not in whole.text
        assert metric(c.get("/metrics").text, "yue_request_failure_total", reason="engine_error") == 2


def test_health_is_503_while_the_model_loads_then_200(tiny_engine):
    gate = threading.Event()

    def loader():
        gate.wait(10)
        return tiny_engine

    with TestClient(create_app(loader), raise_server_exceptions=False) as c:
        assert c.get("/health").status_code == 503 and c.get("/health").json()["status"] == "loading"
        r = c.post("/generate", json={"prompt": PROMPT})
        assert r.status_code == 503 and r.headers["retry-after"] and r.json()["error"]["code"] == "loading"
        gate.set()
        _wait_ready(c)
        assert c.post("/generate", json={"prompt": PROMPT, "max_tokens": 2}).status_code == 200


def test_a_model_that_fails_to_load_keeps_health_at_503():
    def loader():
        raise FileNotFoundError("no such model")

    with TestClient(create_app(loader), raise_server_exceptions=False) as c:
        deadline = time.monotonic() + 5
        while c.get("/health").json()["status"] != "failed":
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert c.get("/health").status_code == 503


def test_each_app_has_its_own_metrics_registry_with_the_documented_names(tiny_engine):
    a, b = create_app(tiny_engine), create_app(tiny_engine)
    with TestClient(a) as ca, TestClient(b) as cb:
        _wait_ready(ca), _wait_ready(cb)
        r = ca.post("/generate", json={"prompt": PROMPT, "max_tokens": 8, "mode": "nar"}).json()
        text_a, text_b = ca.get("/metrics").text, cb.get("/metrics").text
    assert metric(text_a, "yue_request_success_total", finished_reason=r["finish_reason"]) == 1
    assert metric(text_b, "yue_request_success_total", finished_reason=r["finish_reason"]) == 0
    assert metric(text_a, "yue_generation_tokens_total") == r["tokens"]
    assert metric(text_a, "yue_spec_decode_num_draft_tokens_total") == r["drafted"]
    assert metric(text_a, "yue_router_decisions_total", mode="nar") > 0
    for name in [
        "yue_time_to_first_token_seconds_count",
        "yue_inter_token_latency_seconds_count",
        "yue_e2e_request_latency_seconds_count",
        "yue_request_queue_time_seconds_count",
        "yue_prompt_tokens_total",
        "yue_num_requests_running",
        "yue_num_requests_waiting",
        "yue_spec_decode_num_drafts_total",
        "yue_spec_decode_num_accepted_tokens_total",
    ]:
        assert f"\n{name}" in text_a, name
    assert metric(text_a, "yue_spec_decode_num_accepted_tokens_per_pos_total", position="1") >= 0
    assert 'position="1"' in text_a
    # vLLM's names (`yue:` for `vllm:`), from the same samples as ours
    assert metric(text_a, "yue:generation_tokens_total") == r["tokens"]
    assert metric(text_a, "yue:spec_decode_num_draft_tokens_total") == r["drafted"]
    assert metric(text_a, "yue:time_per_output_token_seconds_count") == metric(
        text_a, "yue_inter_token_latency_seconds_count"
    )
    for name in ["yue:num_requests_running", "yue:iteration_tokens_total_count", "yue:kv_cache_usage_perc"]:
        assert f"\n{name}" in text_a, name
    assert (
        sum(
            metric(text_a, "yue:generation_tokens_by_source_total", source=w)
            for w in ("nar", "copy", "corpus", "ar")
        )
        == r["tokens"]
    )
    # vLLM's labels: every sample names the served model
    samples = [s for f in text_string_to_metric_families(text_a) for s in f.samples]
    assert samples and all(s.labels.get("model_name") == tiny_engine.name for s in samples)


def test_chat_template_comes_from_the_model_folder(tmp_path, tiny_engine):
    assert find_chat_template(tmp_path) == DEFAULT_CHAT_TEMPLATE
    (tmp_path / "tokenizer_config.json").write_text('{"chat_template": "cfg:{{ messages[0].content }}"}')
    assert find_chat_template(tmp_path) == "cfg:{{ messages[0].content }}"
    (tmp_path / "chat_template.jinja").write_text(
        "{% for m in messages %}[{{ m.role }}]{{ m.content }}{% endfor %}>"
    )
    template = ChatTemplate(find_chat_template(tmp_path))
    assert template.render([{"role": "user", "content": "hi"}]) == "[user]hi>"
    with pytest.raises(Exception, match="unsafe|access"):  # the sandbox holds
        ChatTemplate("{{ messages.__class__.__mro__ }}").render([])
    app = create_app(tiny_engine, chat_template="x{{ 1 }}")
    with TestClient(app) as c:
        _wait_ready(c)
        body = {"messages": [{"role": "user", "content": "ignored"}], "max_tokens": 1}
        assert c.post("/v1/chat/completions", json=body).json()["usage"][
            "prompt_tokens"
        ] == tiny_engine.count_tokens("x1")


def test_demo_page_and_openapi_are_served(client):
    page = client.get("/")
    assert page.status_code == 200 and "text/html" in page.headers["content-type"]
    assert 'id="generate"' in page.text and "/v1/chat/completions" in page.text
    spec = client.get("/openapi.json").json()
    assert "422" not in str(
        {p: {m: o["responses"] for m, o in ops.items()} for p, ops in spec["paths"].items()}
    )
    assert {
        "/v1/completions",
        "/v1/chat/completions",
        "/v1/models",
        "/generate",
        "/health",
        "/metrics",
    } <= set(spec["paths"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


SERVE_SCRIPT = """
import sys, torch
torch.set_num_threads(1)
import yue
from tests.serve_utils import Paced
from yue.serve import ServeConfig, serve
delay, drain = float(sys.argv[3]), float(sys.argv[4])
engine = Paced(yue.load(sys.argv[1]), delay=delay)
config = ServeConfig(port=int(sys.argv[2]), max_batch_size=1, drain_timeout_s=drain)
sys.exit(serve(engine, config, log_level="warning"))
"""


def _start_server(model_dir: str, delay: float = 0.01, drain: float = 30.0):
    """`yue serve`'s `serve()` in a subprocess on a free port; returns (process, base url) once healthy."""
    port = _free_port()
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root)}
    proc = subprocess.Popen(
        [sys.executable, "-c", SERVE_SCRIPT, model_dir, str(port), str(delay), str(drain)], cwd=root, env=env
    )
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(url + "/health").status_code == 200:
                return proc, url
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline or proc.poll() is not None:
            proc.kill()
            raise AssertionError("server did not start")
        time.sleep(0.1)


def _wait_in_server(url: str, count: int) -> None:
    """Until `count` requests are running or waiting in the server (a fixed sleep loses the race on a
    loaded machine)."""
    deadline = time.monotonic() + 30
    while True:
        text = httpx.get(url + "/metrics").text
        if metric(text, "yue_num_requests_running") + metric(text, "yue_num_requests_waiting") == count:
            return
        assert time.monotonic() < deadline, f"the {count} requests never were in the server together"
        time.sleep(0.01)


@pytest.mark.slow
def test_sigterm_drains_in_flight_requests_then_exits(tiny_model_dir):
    proc, url = _start_server(tiny_model_dir)
    try:
        body = {"prompt": PROMPT, "max_tokens": 60, "mode": "ar", "stream": True}
        results: list[list] = []

        def stream() -> None:
            with httpx.stream("POST", url + "/generate", json=body, timeout=30) as r:
                results.append(parse_sse(r.read().decode()))

        threads = [threading.Thread(target=stream) for _ in range(2)]  # one runs, one waits
        for t in threads:
            t.start()
        _wait_in_server(url, 2)  # SIGTERM once both are in (else the second is refused as draining)
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.1)
        health = httpx.get(url + "/health")
        assert health.status_code == 503 and health.json()["status"] == "draining"
        refused = httpx.post(url + "/generate", json={"prompt": PROMPT})
        assert refused.status_code == 503 and refused.json()["error"]["code"] == "draining"
        for t in threads:
            t.join(30)
        assert proc.wait(30) == 0
        assert len(results) == 2
        for events in results:
            assert (
                events[-1] == "[DONE]"
                and events[-2]["finish_reason"] == "length"
                and events[-2]["tokens"] == 60
            )
    finally:
        if proc.poll() is None:
            proc.kill()


@pytest.mark.slow
def test_requests_that_outlast_the_drain_end_in_the_error_shape_and_the_process_exits_0(tiny_model_dir):
    """SIGTERM with a 1 s drain and requests that need ~40 s: the non-streamed one gets the JSON 503
    (`draining`), the streamed one an error chunk and [DONE]; then the process exits 0."""
    proc, url = _start_server(tiny_model_dir, delay=0.2, drain=1.0)
    try:
        eos = yue.load(tiny_model_dir).tokenizer.eos_id
        body = {"prompt": PROMPT, "max_tokens": 200, "mode": "ar", "logit_bias": {str(eos): -100}}
        got: dict = {}

        def plain() -> None:
            got["plain"] = httpx.post(url + "/generate", json=body | {"stream": False}, timeout=60)

        def streamed() -> None:
            with httpx.stream("POST", url + "/generate", json=body | {"stream": True}, timeout=60) as r:
                got["stream"] = parse_sse(r.read().decode())

        threads = [threading.Thread(target=f) for f in (plain, streamed)]
        for t in threads:
            t.start()
        _wait_in_server(url, 2)
        proc.send_signal(signal.SIGTERM)
        for t in threads:
            t.join(30)
        assert proc.wait(30) == 0
        plain_r, events = got["plain"], got["stream"]
        assert plain_r.status_code == 503 and plain_r.headers["content-type"] == "application/json"
        assert plain_r.json()["error"]["code"] == "draining" and set(plain_r.json()["error"]) == {
            "message", "type", "param", "code"
        }  # fmt: skip
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "draining"
    finally:
        if proc.poll() is None:
            proc.kill()


def test_a_500_keeps_the_keep_alive_connection_usable(tiny_engine):
    """Two requests on one socket: the first fails inside the engine (500, the error shape), the
    second, on the same connection, is answered."""
    with LiveServer(FailsMidStream(tiny_engine, after=0)) as server:
        port = int(server.url.rsplit(":", 1)[1])
        body = b'{"prompt": "def f(x):", "max_tokens": 8}'
        post = (
            b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            b"Content-Length: %d\r\n\r\n%s" % (len(body), body)
        )
        with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
            reader = sock.makefile("rb")
            for expected in (500, 200):
                request = post if expected == 500 else b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n"
                sock.sendall(request)
                status = int(reader.readline().split()[1])
                headers = {}
                while (line := reader.readline()) not in (b"\r\n", b""):
                    name, _, value = line.decode().partition(":")
                    headers[name.strip().lower()] = value.strip()
                payload = reader.read(int(headers["content-length"]))
                assert status == expected, payload
                assert headers.get("connection", "keep-alive").lower() != "close"
            assert b'"status":"ok"' in payload


@pytest.mark.parametrize("fields", [{"temperature": 1e-300}, {"temperature": 1.0, "top_p": 1e-300}])
def test_extreme_but_valid_sampling_values_never_500(client, fields):
    r = client.post("/generate", json={"prompt": PROMPT, "max_tokens": 4} | fields)
    assert r.status_code == 200, r.text


def test_chat_accepts_max_completion_tokens(client):
    body = {"messages": [{"role": "user", "content": "hi"}], "max_completion_tokens": 3, "temperature": 0}
    assert client.post("/v1/chat/completions", json=body).json()["usage"]["completion_tokens"] <= 3


def test_cli_serve_rejects_a_missing_model_and_bad_limits_with_exit_2(tmp_path):
    from typer.testing import CliRunner

    from yue.cli import app

    missing = CliRunner().invoke(app, ["serve", "--model", str(tmp_path)])
    assert missing.exit_code == 2 and "no model" in missing.output
    bad = CliRunner().invoke(app, ["serve", "--model", str(tmp_path), "--max-batch-size", "0"])
    assert bad.exit_code == 2 and "max_batch_size" in bad.output


def test_chat_pieces_split_each_delta_by_the_path_that_wrote_it(client):
    """yue's `pieces` extension on the chat stream: each delta's pieces concatenate to its content."""
    body = {"messages": [{"role": "user", "content": "x"}], "max_tokens": 24, "temperature": 0,
            "mode": "hybrid", "router_threshold": 1.0, "stream": True, "pieces": True}  # fmt: skip
    events = parse_sse(client.post("/v1/chat/completions", json=body).text)
    deltas = [e["choices"][0]["delta"] for e in events[:-1] if e["choices"]]
    with_pieces = [d for d in deltas if "pieces" in d]
    assert with_pieces and all(
        "".join(t for t, _ in d["pieces"]) == d.get("content", "") for d in with_pieces
    )
    assert {s for d in with_pieces for _, s in d["pieces"]} <= {"ar", "nar"}
    plain = parse_sse(client.post("/v1/chat/completions", json=body | {"pieces": False}).text)
    assert not any("pieces" in e["choices"][0]["delta"] for e in plain[:-1] if e["choices"])


def test_a_model_without_a_nar_set_serves_verified_as_ar_and_refuses_hybrid_naming_mode(tiny_gguf):
    """A GGUF loaded as an AR set: `verified` (drafts copied from the context) answers with `ar`'s text;
    a mode that needs a NAR set is a 400 naming `mode`."""
    engine = yue.load(tiny_gguf.path)
    assert not engine.has_nar_set
    with TestClient(create_app(engine), raise_server_exceptions=False) as c:
        _wait_ready(c)
        texts = {}
        for mode in ("ar", "verified"):
            r = c.post("/v1/completions", json={"prompt": "x = 1\nx = 1\nx = 1\n", "max_tokens": 24,
                                                 "temperature": 0, "mode": mode})  # fmt: skip
            assert r.status_code == 200, r.text
            texts[mode] = r.json()["choices"][0]["text"]
        assert texts["verified"] == texts["ar"]
        r = c.post("/v1/completions", json={"prompt": "x", "max_tokens": 4, "mode": "hybrid"})
        assert r.status_code == 400 and r.json()["error"]["param"] == "mode"
        assert "needs a NAR set" in r.json()["error"]["message"]
