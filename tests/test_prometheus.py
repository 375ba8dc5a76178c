"""A real Prometheus scrapes a real `yue serve`, and every panel of the Grafana dashboard returns data.

The server is the CLI (`python -m yue.cli serve`) on the tiny random model; Prometheus is Debian's
`prometheus` binary with a scrape config written here (1 s interval, storage in a temp folder, both on
127.0.0.1 ports picked free). Requests are sent only once Prometheus has scraped the server, so the
counters move inside the rate windows the dashboard's queries read. Skipped, with the reason, where the
binary is missing (.ci/run installs it).
"""

from __future__ import annotations

import json
import math
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

ROOT = Path(__file__).resolve().parents[1]
DASHBOARD = ROOT / "deploy" / "grafana" / "yue.json"
PROMETHEUS = shutil.which("prometheus")

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(PROMETHEUS is None, reason="no `prometheus` binary (apt-get install prometheus)"),
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait(what: str, ready, timeout_s: float, procs: list[subprocess.Popen]):
    """Poll `ready()` until it returns something truthy, at most `timeout_s` (a process that exits fails)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        for p in procs:
            assert p.poll() is None, f"{p.args[0]} exited with {p.returncode} while waiting for {what}"
        try:
            if value := ready():
                return value
        except httpx.TransportError:
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)


def dashboard_queries() -> list[tuple[str, str]]:
    """(panel title, PromQL) for every target of every panel, Grafana's variables filled in as a user's
    default view does (all models; a 1-minute rate window)."""
    dash = json.loads(DASHBOARD.read_text())
    out = []
    for panel in dash["panels"]:
        for target in panel["targets"]:
            expr = target["expr"].replace("$__rate_interval", "1m").replace("$model_name", ".*")
            out.append((panel["title"], expr))
    return out


def test_dashboard_needs_only_yue_metrics_and_covers_what_the_issue_lists():
    titles = " ".join(t for t, _ in dashboard_queries()).lower()
    for word in [
        "throughput",
        "time to first token",
        "latency",
        "source",
        "waiting",
        "batch",
        "prefix cache",
    ]:
        assert word in titles, word
    assert all("yue:" in e for _, e in dashboard_queries())


@pytest.fixture(scope="module")
def scraped(tiny_model_dir, tmp_path_factory):
    """(Prometheus URL, server URL) once Prometheus has scraped traffic sent to the server."""
    tmp = tmp_path_factory.mktemp("prometheus")
    serve_port, prom_port = _free_port(), _free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    server = subprocess.Popen(
        [sys.executable, "-m", "yue.cli", "serve", "--model", tiny_model_dir, "--host", "127.0.0.1"]
        + ["--port", str(serve_port), "--log-level", "warning", "--threads", "1"],
        cwd=ROOT,
        env=env,
    )
    procs = [server]
    try:
        url = f"http://127.0.0.1:{serve_port}"
        _wait("yue serve", lambda: httpx.get(url + "/health").status_code == 200, 120, procs)
        config = tmp / "prometheus.yml"
        config.write_text(
            "global:\n  scrape_interval: 1s\n  evaluation_interval: 1s\n"
            "scrape_configs:\n  - job_name: yue\n    static_configs:\n"
            f"      - targets: ['127.0.0.1:{serve_port}']\n"
        )
        prom = subprocess.Popen(
            [PROMETHEUS, f"--config.file={config}", f"--storage.tsdb.path={tmp / 'data'}"]
            + [f"--web.listen-address=127.0.0.1:{prom_port}", "--log.level=warn"],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(prom)
        prom_url = f"http://127.0.0.1:{prom_port}"
        _wait("a first scrape", lambda: _values(prom_url, 'up{job="yue"} == 1'), 60, procs)
        # Traffic after the first scrape, in three modes (ar writes every token, the others draft); the
        # repeated prompt's second request can find its prefix in the cache.
        prompt = "def add(a, b):\n    return a + b\n\n" * 6
        for mode in ["ar", "verified", "nar", "verified"]:
            r = httpx.post(
                url + "/v1/completions",
                json={"prompt": prompt, "max_tokens": 24, "mode": mode, "temperature": 0},
                timeout=60,
            )
            assert r.status_code == 200, r.text
        expected = _metric(url, "yue:generation_tokens_total")
        _wait(
            "the traffic to be scraped",
            lambda: (v := _values(prom_url, "sum(yue:generation_tokens_total)")) and v[0] >= expected,
            60,
            procs,
        )
        time.sleep(2)  # two more scrapes: every rate() window now holds a change
        yield prom_url, url
    finally:
        for p in reversed(procs):
            _stop(p)


def _metric(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(url + "/metrics").text
    return sum(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def _values(prom_url: str, expr: str) -> list[float]:
    """The values of an instant query's result vector (empty when it has no series)."""
    r = httpx.get(prom_url + "/api/v1/query", params={"query": expr}, timeout=10)
    body = r.json()
    assert r.status_code == 200 and body["status"] == "success", (expr, body)
    assert body["data"]["resultType"] == "vector", (expr, body)
    return [float(item["value"][1]) for item in body["data"]["result"]]


def test_prometheus_scrapes_the_vllm_names_with_model_name_labels(scraped, tiny_model_dir):
    prom_url, url = scraped
    for name in [
        "yue:num_requests_running",
        "yue:num_requests_waiting",
        "yue:prompt_tokens_total",
        "yue:generation_tokens_total",
        "yue:time_to_first_token_seconds_bucket",
        "yue:e2e_request_latency_seconds_bucket",
        "yue:time_per_output_token_seconds_bucket",
        "yue:request_time_per_output_token_seconds_bucket",
        "yue:kv_cache_usage_perc",
        "yue:gpu_cache_usage_perc",
        "yue:spec_decode_num_accepted_tokens_total",
        "yue:spec_decode_num_draft_tokens_total",
        "yue_generation_tokens_total",  # ours stay
    ]:
        r = httpx.get(prom_url + "/api/v1/query", params={"query": name}).json()
        series = r["data"]["result"]
        assert series, name
        assert all(s["metric"]["model_name"] == Path(tiny_model_dir).name for s in series), name
    # Prometheus holds what the server counted.
    assert _values(prom_url, "sum(yue:generation_tokens_total)")[0] == _metric(
        url, "yue:generation_tokens_total"
    )


@pytest.mark.parametrize("title, expr", dashboard_queries(), ids=[t for t, _ in dashboard_queries()])
def test_every_dashboard_query_returns_data_from_prometheus(scraped, title, expr):
    values = _values(scraped[0], expr)
    assert values, f"{title}: no series for {expr}"
    assert any(math.isfinite(v) for v in values), f"{title}: only NaN for {expr}: {values}"
