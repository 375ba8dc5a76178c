"""`yue serve --replicas`: the server as Ray Serve replicas answers as the single-process server does,
and a replica killed under load is replaced without losing the other replicas' requests.

One local Ray cluster (two replicas of the tiny model, one CPU and one torch thread each) serves the
whole module. Skipped only when Ray is not installed (`pip install 'yue[ray]'`).
"""

from __future__ import annotations

import socket
import threading
import time

import httpx
import pytest

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'yue[ray]'")
from ray import serve  # noqa: E402

import yue  # noqa: E402
from tests.serve_utils import LiveServer, Paced, parse_sse  # noqa: E402
from yue.serve import ServeConfig  # noqa: E402
from yue.serve import replicas as r  # noqa: E402

pytestmark = pytest.mark.slow
PROMPTS = ["def add(a, b):", "for i in range(", "class Point:", "import os\n", "你好", "x = [", "if x:", "# "]
STEP_DELAY_S = (
    0.03  # each decode step of a replica at least this long: a request runs long enough to be killed
)
WHOLE_TOKENS = 192  # a non-streamed request's length in the kill test: four streams' (48), within 256


class PacedLoad:
    """A picklable loader (Ray runs it in each replica): the model, its decode steps paced."""

    def __init__(self, path: str, delay: float) -> None:
        self.path, self.delay = path, delay

    def __call__(self):
        return Paced(yue.load(self.path), self.delay)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replica_ids() -> list[str]:
    return sorted(
        a["name"] for a in ray.util.list_named_actors(all_namespaces=True) if "REPLICA::" in a["name"]
    )


@pytest.fixture(scope="module")
def replicas_url(tiny_model_dir):
    config = ServeConfig(port=_free_port())
    url = r.start(PacedLoad(tiny_model_dir, STEP_DELAY_S), config, r.ReplicaConfig(replicas=2, threads=1))
    yield url
    r.stop()


def _body(prompt: str, stream: bool, max_tokens: int = 16) -> dict:
    return {
        "prompt": prompt,
        "max_tokens": max_tokens,
        "temperature": 0,
        "mode": "verified",
        "stream": stream,
    }


def _text(response: httpx.Response, stream: bool) -> str:
    assert response.status_code == 200, response.text
    if not stream:
        return response.json()["choices"][0]["text"]
    events = parse_sse(response.text)
    assert events[-1] == "[DONE]"
    return "".join(e["choices"][0]["text"] for e in events[:-1] if e["choices"])


def _joined(events: list) -> str:
    """The text of a stream's events (`parse_sse`), its error and [DONE] events left out."""
    return "".join(e["choices"][0]["text"] for e in events if isinstance(e, dict) and e.get("choices"))


def test_two_replicas_answer_and_name_themselves(replicas_url):
    seen = set()
    with httpx.Client(base_url=replicas_url, timeout=60) as http:
        assert http.get("/health").json()["status"] == "ok"
        assert http.get("/v1/models").json()["data"][0]["id"]
        for _ in range(40):  # Ray routes to the less loaded of two random replicas: both show up soon
            seen.add(http.get("/health").headers["x-yue-replica"])
            if len(seen) == 2:
                break
    assert len(seen) == 2


def test_replicas_answer_as_the_single_process_server(replicas_url, tiny_model_dir):
    """Greedy `verified`, streamed and not, concurrent: every output equals the single-process server's,
    and errors keep their OpenAI shape."""
    engine = yue.load(tiny_model_dir)
    with LiveServer(engine) as local, httpx.Client(timeout=60) as http:
        expected = {
            (p, s): _text(http.post(f"{local.url}/v1/completions", json=_body(p, s)), s)
            for p in PROMPTS
            for s in (False, True)
        }
        bad = http.post(f"{local.url}/v1/completions", json=_body("x", False, max_tokens=-1))
    got, lock = {}, threading.Lock()

    def ask(key) -> None:
        with httpx.Client(timeout=60) as client:
            text = _text(client.post(f"{replicas_url}/v1/completions", json=_body(*key)), key[1])
        with lock:
            got[key] = text

    threads = [threading.Thread(target=ask, args=(key,)) for key in expected]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == expected
    remote_bad = httpx.post(f"{replicas_url}/v1/completions", json=_body("x", False, max_tokens=-1))
    assert (remote_bad.status_code, remote_bad.json()) == (bad.status_code, bad.json())


def test_a_killed_replica_is_replaced_and_only_its_requests_fail(replicas_url, tiny_model_dir):
    """Streamed requests record their replica (`x-yue-replica`, sent before the first token); one replica
    is killed mid-load: its in-flight streams end with OpenAI's error event then [DONE], its non-streamed
    requests with a 503 OpenAI error body; every other request completes with the single-process output,
    new requests succeed, and Ray starts a replacement."""
    engine = yue.load(tiny_model_dir)
    expected = {
        p: engine.generate(p, mode="verified", max_new_tokens=48, temperature=0.0).text for p in PROMPTS
    }
    # Non-streamed requests send nothing before they end, so the kill cannot wait for them: they are
    # sent first and run several times as long as a stream, so they are still running when it comes.
    expected_whole = {
        p: engine.generate(p, mode="verified", max_new_tokens=WHOLE_TOKENS, temperature=0.0).text
        for p in PROMPTS
    }
    results, lock, started, replica_of = [], threading.Lock(), threading.Semaphore(0), {}

    def ask(prompt: str) -> None:
        body, events = _body(prompt, True, 48), []
        try:
            with httpx.stream("POST", f"{replicas_url}/v1/completions", json=body, timeout=60) as resp:
                replica_of[prompt] = resp.headers["x-yue-replica"]
                started.release()
                for line in resp.iter_lines():
                    if line.startswith("data: "):
                        events += parse_sse(line + "\n\n")
        except httpx.HTTPError as error:  # a stream cut off mid-body (what the proxy did before)
            events.append(f"cut off: {error!r}")
        with lock:
            results.append((prompt, replica_of[prompt], events))

    whole = []  # non-streamed: (prompt, status, body)

    def ask_whole(prompt: str) -> None:
        body = _body(prompt, False, WHOLE_TOKENS)
        resp = httpx.post(f"{replicas_url}/v1/completions", json=body, timeout=120)
        with lock:
            whole.append((prompt, resp.status_code, resp.json()))

    for _ in range(3):  # a burst Ray's router put wholly on one replica cannot show the kill: sent again
        results.clear(), whole.clear(), replica_of.clear()
        threads = [threading.Thread(target=ask_whole, args=(p,)) for p in PROMPTS]
        threads += [threading.Thread(target=ask, args=(p,)) for p in PROMPTS]
        for t in threads:
            t.start()
        for _ in PROMPTS:  # every streamed request is running on a replica (its headers came)
            assert started.acquire(timeout=60)
        if len(set(replica_of.values())) == 2:
            break
        for t in threads:
            t.join(120)
    victim_id = replica_of[PROMPTS[0]]
    assert len(set(replica_of.values())) == 2, "Ray put every request on one replica, three bursts in a row"
    victim = next(name for name in _replica_ids() if name.endswith(f"#{victim_id}"))
    ray.kill(ray.get_actor(victim, namespace="serve"), no_restart=True)
    for t in threads:
        t.join(120)
    lost = [
        res
        for res in results
        if res[1] != victim_id and not (res[2][-1] == "[DONE]" and _joined(res[2]) == expected[res[0]])
    ]
    cut = [res for res in results if res[1] == victim_id]
    assert not lost, lost
    assert cut, "no stream ran on the killed replica"
    for _, _, events in cut:  # an OpenAI error event, then [DONE]
        assert events[-1] == "[DONE]" and events[-2]["error"]["code"] == "replica_lost", events
    assert len(whole) == len(PROMPTS)
    for prompt, status, body in whole:  # answered in full, or failed with the OpenAI error
        if status == 200:
            assert body["choices"][0]["text"] == expected_whole[prompt]
        else:
            assert status == 503 and body["error"]["code"] == "replica_lost", (status, body)
    assert any(status == 503 for _, status, _ in whole), "no non-streamed request ran on the killed replica"
    with httpx.Client(base_url=replicas_url, timeout=60) as http:  # new requests go to the live replica
        for p in PROMPTS[:4]:
            assert _text(http.post("/v1/completions", json=_body(p, False, 48)), False) == expected[p]
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        status = serve.status().applications[r.APP_NAME].deployments["Replica"]
        now = _replica_ids()
        if len(now) == 2 and victim not in now and status.status == "HEALTHY":
            break
        time.sleep(0.5)
    assert len(now) == 2 and victim not in now, now


def test_replica_settings_are_checked_and_divide_the_cores(monkeypatch):
    monkeypatch.setattr("os.cpu_count", lambda: 8)
    assert r.ReplicaConfig(replicas=2).threads_per_replica == 4
    assert r.ReplicaConfig(autoscale=(1, 8)).threads_per_replica == 1
    assert r.ReplicaConfig(replicas=16).threads_per_replica == 1
    assert r.ReplicaConfig(replicas=2, threads=3).threads_per_replica == 3
    for bad in ({"replicas": 0}, {"threads": 0}, {"autoscale": (3, 1)}, {"autoscale": (0, 0)}):
        with pytest.raises(ValueError, match=next(iter(bad))):
            r.ReplicaConfig(**bad)
    with pytest.raises(ValueError, match="MIN:MAX"):
        r.parse_autoscale("2-4")
    options = r.deployment_options(
        ServeConfig(max_batch_size=4, max_queue=8), r.ReplicaConfig(autoscale=(1, 3))
    )
    # A replica is sent what it can batch; the proxy queues the rest, up to max_queue, then 503s.
    assert options["max_ongoing_requests"] == 4 and options["max_queued_requests"] == 8
    assert options["backpressure_config"].status_code == 503 and options["backpressure_config"].retry_after_s == 1
    assert options["autoscaling_config"] == {
        "min_replicas": 1,
        "max_replicas": 3,
        "target_ongoing_requests": 4,
    }
    assert "num_replicas" not in options


def test_cli_serve_rejects_bad_threads_and_replicas_with_exit_2(tiny_model_dir):
    from typer.testing import CliRunner

    from yue.cli import app

    for flags, field in (
        (["--threads", "0"], "threads"),  # the single-process server
        (["--replicas", "0"], "replicas"),
        (["--autoscale", "3:1"], "autoscale"),
        (["--autoscale", "two"], "MIN:MAX"),
    ):
        result = CliRunner().invoke(app, ["serve", "--model", tiny_model_dir, *flags])
        assert result.exit_code == 2 and field in result.output, (flags, result.output)
