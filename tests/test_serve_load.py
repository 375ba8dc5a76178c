"""The server under real sockets on 127.0.0.1: disconnects, overload, and a bounded load run."""

from __future__ import annotations

import asyncio
import json
import statistics
import threading
import time

import httpx
import psutil
import pytest

from tests.serve_utils import LiveServer, Paced
from tests.test_serve import metric
from yue.serve import ServeConfig

PROMPT = "def add(a, b):"
LONG = {"prompt": PROMPT, "max_tokens": 200, "temperature": 0, "mode": "ar"}


def wait_idle(state, limit: float) -> float:
    """Seconds until no request is running or waiting; fails past `limit`."""
    t0 = time.monotonic()
    while state.scheduler.running or state.scheduler.waiting:
        assert time.monotonic() - t0 < limit, "generation still running after the client left"
        time.sleep(0.01)
    return time.monotonic() - t0


@pytest.mark.slow
def test_client_disconnect_cancels_generation_and_frees_the_slot_within_2s(tiny_engine):
    # 200 paced steps take >= 2 s, so only cancellation can free the slot in time.
    with LiveServer(Paced(tiny_engine, delay=0.01), ServeConfig(max_batch_size=2)) as srv:

        def abandon(stream: bool) -> float:
            with httpx.Client(base_url=srv.url) as http:
                if stream:
                    with http.stream("POST", "/generate", json=LONG | {"stream": True}, timeout=10) as r:
                        lines = r.iter_lines()
                        while not next(lines).startswith("data: "):
                            pass
                else:
                    with pytest.raises(httpx.ReadTimeout):
                        http.post("/v1/completions", json=LONG, timeout=httpx.Timeout(10, read=0.3))
            return wait_idle(srv.state, limit=2.0)

        for stream in (True, False):  # warm-up: first-use allocations are not growth
            abandon(stream)
        process = psutil.Process()
        threads, rss = threading.active_count(), process.memory_info().rss
        waits = [abandon(stream=i % 2 == 0) for i in range(12)]
        assert max(waits) < 2.0
        assert threading.active_count() <= threads
        assert process.memory_info().rss - rss < 30 * 2**20
        text = httpx.get(srv.url + "/metrics").text
        assert metric(text, "yue_request_failure_total", reason="cancelled") == 14
        assert metric(text, "yue_num_requests_running") == 0


@pytest.mark.slow
def test_overload_gets_a_fast_503_with_retry_after_while_health_and_metrics_answer(tiny_engine):
    config = ServeConfig(max_batch_size=1, max_queue=1, retry_after_s=2)
    with LiveServer(Paced(tiny_engine, delay=0.02), config) as srv:
        release = threading.Event()

        def hold() -> None:  # occupies a slot until released
            with httpx.stream("POST", srv.url + "/generate", json=LONG | {"stream": True}, timeout=30) as r:
                lines = r.iter_lines()  # kept referenced: a discarded iterator closes the connection
                next(lines)
                release.wait(20)

        holders = [threading.Thread(target=hold) for _ in range(2)]
        for t in holders:
            t.start()
        deadline = time.monotonic() + 10
        while not (srv.state.scheduler.running == 1 and srv.state.scheduler.waiting == 1):
            assert time.monotonic() < deadline
            time.sleep(0.01)
        try:
            with httpx.Client(base_url=srv.url, timeout=5) as http:
                for path, body in [
                    ("/v1/completions", {"prompt": PROMPT}),
                    ("/generate", {"prompt": PROMPT}),
                ] * 5:
                    t0 = time.perf_counter()
                    r = http.post(path, json=body)
                    assert time.perf_counter() - t0 < 2.0  # no queueing: the answer is immediate
                    assert r.status_code == 503 and r.headers["retry-after"] == "2"
                    assert r.json()["error"]["code"] == "overloaded"
                t0 = time.perf_counter()
                assert http.get("/health").json() == {"status": "ok", "running": 1, "waiting": 1}
                text = http.get("/metrics").text
                assert time.perf_counter() - t0 < 0.5
            assert (
                metric(text, "yue_num_requests_running") == 1
                and metric(text, "yue_num_requests_waiting") == 1
            )
            assert metric(text, "yue_request_failure_total", reason="overloaded") == 10
        finally:
            release.set()
            for t in holders:
                t.join(10)
        wait_idle(srv.state, limit=2.0)


async def _one(http: httpx.AsyncClient, kind: int, mode: str) -> dict:
    """One request of the load mix; returns its latency, TTFT (streams) and token counts."""
    sampling = {"temperature": 0} if kind % 2 else {"temperature": 0.8, "seed": kind}
    common = {"max_tokens": 16, "mode": mode} | sampling
    t0 = time.perf_counter()
    ttft = None
    if kind == 1:  # chat, not streamed
        r = await http.post(
            "/v1/chat/completions", json=common | {"messages": [{"role": "user", "content": "hi"}]}
        )
        assert r.status_code == 200, r.text
        usage = r.json()["usage"]
        return {"latency": time.perf_counter() - t0, "ttft": None, **usage}
    path, body = ("/v1/completions", {"prompt": PROMPT, "stream_options": {"include_usage": True}})
    if kind == 2:
        path, body = "/generate", {"prompt": PROMPT}
    out = {}
    async with http.stream("POST", path, json=common | body | {"stream": True}) as r:
        assert r.status_code == 200
        async for line in r.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            assert "error" not in chunk
            if ttft is None and (
                chunk.get("token_ids") or (chunk.get("choices") and chunk["choices"][0]["text"])
            ):
                ttft = time.perf_counter() - t0
            if chunk.get("usage"):
                out = chunk["usage"]
            if chunk.get("done"):
                out = {"prompt_tokens": chunk["prompt_tokens"], "completion_tokens": chunk["tokens"]}
    return {"latency": time.perf_counter() - t0, "ttft": ttft, **out}


async def _load(url: str, clients: int, per_client: int) -> list[dict]:
    modes = ["ar", "verified", "hybrid", "nar"]
    limits = httpx.Limits(max_connections=clients)
    async with httpx.AsyncClient(base_url=url, timeout=60, limits=limits) as http:

        async def client(i: int) -> list[dict]:
            return [await _one(http, (i + j) % 3, modes[(i + j) % 4]) for j in range(per_client)]

        results = await asyncio.gather(*(client(i) for i in range(clients)))
    return [r for rs in results for r in rs]


def _pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100, method="inclusive")[q - 1] * 1000


@pytest.mark.slow
def test_load_32_concurrent_clients_no_failures_bounded_memory_and_exact_metrics(tiny_engine, capsys):
    with LiveServer(tiny_engine, ServeConfig(max_batch_size=4, max_queue=64)) as srv:
        warm = asyncio.run(_load(srv.url, clients=32, per_client=1))
        process = psutil.Process()
        rss = process.memory_info().rss
        t0 = time.perf_counter()
        results = asyncio.run(_load(srv.url, clients=32, per_client=8))
        wall = time.perf_counter() - t0
        growth = (process.memory_info().rss - rss) / 2**20
        text = httpx.get(srv.url + "/metrics").text
        assert srv.state.scheduler.running == 0 and srv.state.scheduler.waiting == 0

    everything = warm + results
    assert len(results) == 256 and all(r.get("completion_tokens") for r in everything)
    assert growth < 50, f"RSS grew {growth:.1f} MiB"
    successes = sum(
        metric(text, "yue_request_success_total", finished_reason=f) for f in ("stop", "length", "eos")
    )
    assert successes == len(everything)
    assert (
        sum(metric(text, "yue_request_failure_total", reason=r) for r in ("cancelled", "engine_error")) == 0
    )
    assert metric(text, "yue_prompt_tokens_total") == sum(r["prompt_tokens"] for r in everything)
    assert metric(text, "yue_generation_tokens_total") == sum(r["completion_tokens"] for r in everything)
    assert metric(text, "yue_e2e_request_latency_seconds_count") == len(everything)
    drafted = metric(text, "yue_spec_decode_num_draft_tokens_total")
    accepted = metric(text, "yue_spec_decode_num_accepted_tokens_total")
    assert 0 < accepted <= drafted
    per_pos = [
        metric(text, "yue_spec_decode_num_accepted_tokens_per_pos_total", position=str(i)) for i in (1, 2)
    ]
    assert per_pos[0] >= per_pos[1]

    ttfts = [r["ttft"] for r in results if r["ttft"] is not None]
    latencies = [r["latency"] for r in results]
    report = {
        "requests": len(results),
        "clients": 32,
        "wall_s": round(wall, 2),
        "req_per_s": round(len(results) / wall, 1),
        "ttft_ms": {"p50": round(_pct(ttfts, 50), 1), "p95": round(_pct(ttfts, 95), 1)},
        "latency_ms": {"p50": round(_pct(latencies, 50), 1), "p95": round(_pct(latencies, 95), 1)},
        "rss_growth_mib": round(growth, 1),
        "accepted/drafted": f"{int(accepted)}/{int(drafted)}",
    }
    with capsys.disabled():
        print("\nserve load:", json.dumps(report))
