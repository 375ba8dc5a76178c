"""`yue bench-serve`: throughput and time to first token of `yue serve` under concurrent clients.

Design decisions:
- The real server (`create_app` under uvicorn, in this process, on 127.0.0.1) is measured through
  HTTP, streamed `/v1/completions` as an OpenAI client sends them, so batching, admission, streaming
  and detokenizing are all in the figures. One server per `--max-batch-size`, the same engine.
- The clients run in a process of their own (`client_process`), each a thread sending its requests one
  after another: in the server's process their Python (every streamed chunk parsed, 16 threads at
  once) took the GIL from the server's scheduler, more so the more streams ran at once, which is not
  what a server whose clients are elsewhere meets (docs/results-log.md, "Session 7"). A level's tokens/s is every
  completion token over the level's wall time; TTFT is the time from sending a request to its first
  text chunk. Medians and p95 are over the level's requests.
- Levels interleaved in rounds (`interleaved`): every level once a round, the order reversed every
  other round (A B, B A, A B), so a drift in a shared machine's load falls on every level alike. A
  ratio is taken within each round (the two levels ran side by side) and reported as the median over
  rounds with its range; a level's figures are medians over its rounds.
- Prefill and decode apart: each level's increase of the server's phase counters (`yue_prefill_*`,
  `yue_decode_*`: tokens and scheduler-thread seconds of each phase, `loop.PhaseTimes`) gives each
  phase's tokens/s under that load, so a batching gain is seen where it is (decode) and where it is not
  (distinct prompts, each prefilled in a forward of its own length). The level servers run without the
  prefix cache: the levels send the same prompts again, which would measure the cache.
- `--chat-turns N`: time to first token of N-turn chats per turn, with the prefix cache and without
  (`bench/chat.py`).
- Honest: a warm-up request per server first (not reported); every output is compared with the
  single-request output of the same prompt (`Engine.generate`), and the count of identical ones is
  reported beside the speed. Use an exact mode (`verified`, `ar`) for that check to mean anything:
  `hybrid`'s unverified commits depend on the batch.
- A table on stderr, then one JSON document as the last line (docs/design.md §6).
"""

from __future__ import annotations

import contextlib
import json
import multiprocessing
import os
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import asdict, dataclass, field
from statistics import median
from typing import TypeVar

import httpx
import torch

from yue.bench.metrics import percentile
from yue.bench.prompts import CODE_TEST
from yue.config import MODES
from yue.jsonl import iter_jsonl

T = TypeVar("T")


def interleaved(levels: Sequence[T], rounds: int) -> list[tuple[int, T]]:
    """The order a bench measures its levels in: (round, level) for `rounds` rounds, each level once a
    round, in order in even rounds and reversed in odd ones (A B, B A, A B, ...)."""
    return [(r, lv) for r in range(rounds) for lv in (levels if r % 2 == 0 else levels[::-1])]


def ratio_summary(ratios: Sequence[float]) -> dict:
    """A ratio measured once a round: its median, each round's value, and their range."""
    return {
        "median": round(median(ratios), 3),
        "rounds": [round(x, 3) for x in ratios],
        "range": [round(min(ratios), 3), round(max(ratios), 3)],
    }


@dataclass
class Level:
    """One (max_batch_size, clients) measurement in one round."""

    max_batch_size: int
    clients: int
    round: int
    requests: int
    tokens: int
    wall_s: float
    tokens_per_s: float
    ttft_p50_ms: float
    ttft_p95_ms: float
    identical: int
    # The server's prefill and decode phases apart (its `yue_prefill_*` / `yue_decode_*` counters over the
    # level): tokens per second of scheduler time spent in each.
    prefill_tokens_per_s: float = 0.0
    decode_tokens_per_s: float = 0.0


@dataclass
class ChatTurn:
    """One turn of the chat bench (`--chat-turns`) on one server (prefix cache on or off) in one round:
    time to first token over its conversations, and the prefix cache's hits (prompt tokens) during it."""

    turn: int
    cache: bool
    round: int
    requests: int
    prompt_tokens: int
    ttft_p50_ms: float
    ttft_max_ms: float
    hit_tokens: int
    identical: int  # answers equal to the other server's, same conversation and turn


@dataclass
class ServeBench:
    model: str
    mode: str
    max_tokens: int
    prompts: int
    torch_threads: int
    cpus: int
    precision: str = "float32"  # the model's (`yue.load`'s dtype)
    load_average: dict[str, list[float]] = field(default_factory=dict)  # 1/5/15-min, at start and end
    levels: list[Level] = field(default_factory=list)
    chat_turns: list[ChatTurn] = field(default_factory=list)
    think_s: float = 0.0

    def ratios(self, base: int, other: int) -> dict[str, dict[str, dict]]:
        """Per client count: other's tokens/s and p95 TTFT over base's, taken within each round
        (`ratio_summary`: median over rounds, each round's, range)."""
        by = {(lv.max_batch_size, lv.clients, lv.round): lv for lv in self.levels}
        pairs: dict[int, list[tuple[Level, Level]]] = {}
        for lv in self.levels:
            if lv.max_batch_size == base and (other, lv.clients, lv.round) in by:
                pairs.setdefault(lv.clients, []).append((lv, by[(other, lv.clients, lv.round)]))

        def over(name: str, runs: list[tuple[Level, Level]]) -> dict:
            return ratio_summary([getattr(o, name) / max(getattr(b, name), 1e-9) for b, o in runs])

        return {
            str(n): {
                "tokens_per_s": over("tokens_per_s", runs),
                "ttft_p95": over("ttft_p95_ms", runs),
                "prefill_tokens_per_s": over("prefill_tokens_per_s", runs),
                "decode_tokens_per_s": over("decode_tokens_per_s", runs),
            }
            for n, runs in pairs.items()
        }

    def chat_medians(self) -> list[dict]:
        """Per turn: TTFT medians over rounds with the cache and without, their ratio (off / on: the
        cache's speed-up, taken within each round, median and range), hits, identical answers."""
        by = {(t.turn, t.cache, t.round): t for t in self.chat_turns}
        out = []
        for turn in sorted({t.turn for t in self.chat_turns}):
            on = [t for t in self.chat_turns if t.turn == turn and t.cache]
            pairs = [(by[(turn, False, t.round)], t) for t in on if (turn, False, t.round) in by]
            out.append(
                {
                    "turn": turn,
                    "rounds": len(pairs),
                    "requests": sum(t.requests for t in on),
                    "prompt_tokens": sum(t.prompt_tokens for t in on),
                    "ttft_p50_ms_off": round(median(off.ttft_p50_ms for off, _ in pairs), 1),
                    "ttft_p50_ms_on": round(median(t.ttft_p50_ms for _, t in pairs), 1),
                    "speedup": ratio_summary(
                        [off.ttft_p50_ms / max(t.ttft_p50_ms, 1e-9) for off, t in pairs]
                    ),
                    "hit_tokens": sum(t.hit_tokens for t in on),
                    "identical": sum(t.identical for t in on),
                }
            )
        return out

    def medians(self) -> list[dict]:
        """Per (max_batch_size, clients): tokens/s and TTFT medians over the rounds, outputs summed."""
        groups: dict[tuple[int, int], list[Level]] = {}
        for lv in self.levels:
            groups.setdefault((lv.max_batch_size, lv.clients), []).append(lv)
        return [
            {
                "max_batch_size": size,
                "clients": n,
                "rounds": len(runs),
                "requests": sum(lv.requests for lv in runs),
                "tokens_per_s": round(median(lv.tokens_per_s for lv in runs), 1),
                "ttft_p50_ms": round(median(lv.ttft_p50_ms for lv in runs), 1),
                "ttft_p95_ms": round(median(lv.ttft_p95_ms for lv in runs), 1),
                "identical": sum(lv.identical for lv in runs),
                "prefill_tokens_per_s": round(median(lv.prefill_tokens_per_s for lv in runs), 1),
                "decode_tokens_per_s": round(median(lv.decode_tokens_per_s for lv in runs), 1),
            }
            for (size, n), runs in sorted(groups.items())
        ]


def stream_timed(client: httpx.Client, url: str, route: str, body: dict, text: str, usage: str):
    """One streamed OpenAI request to `route` (greedy, usage included): (its text, seconds to the first
    text chunk, the usage's `usage` count). `text`: where a chunk's choice holds its text (`text` for
    completions, `content` of `delta` for chat)."""
    body = body | {"temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
    t0 = time.perf_counter()
    ttft, parts, count = None, [], 0
    with client.stream("POST", f"{url}{route}", json=body, timeout=600) as r:
        r.raise_for_status()
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("usage"):
                count = chunk["usage"][usage]
            for choice in chunk.get("choices", []):
                piece = choice.get("delta", {}).get("content") if text == "content" else choice.get("text")
                if piece:
                    ttft = ttft if ttft is not None else time.perf_counter() - t0
                    parts.append(piece)
    return "".join(parts), ttft if ttft is not None else time.perf_counter() - t0, count


def _complete(
    client: httpx.Client, url: str, prompt: str, mode: str, max_tokens: int
) -> tuple[str, float, int]:
    """One streamed completion: (text, seconds to the first text chunk, completion tokens)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "mode": mode}
    return stream_timed(client, url, "/v1/completions", body, "text", "completion_tokens")


def _level(
    url: str, prompts: list[str], refs: list[str], clients: int, n_requests: int, mode: str, max_tokens: int
):
    """n_requests spread over `clients` threads; returns (wall_s, [(ttft, tokens, identical)])."""
    results: list[tuple[float, int, bool]] = []
    lock = threading.Lock()

    def client(c: int) -> None:
        with httpx.Client() as http:
            for i in range(c, n_requests, clients):
                j = i % len(prompts)
                text, ttft, tokens = _complete(http, url, prompts[j], mode, max_tokens)
                with lock:
                    results.append((ttft, tokens, text == refs[j]))

    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    t0 = time.perf_counter()
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return time.perf_counter() - t0, results


def _counters(url: str, names: Sequence[str]) -> dict[str, float]:
    """The server's counters `names` (their `_total` samples, summed over labels) from `/metrics`."""
    from prometheus_client.parser import text_string_to_metric_families

    text = httpx.get(f"{url}/metrics", timeout=60).text
    out = dict.fromkeys(names, 0.0)
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            name = sample.name.removesuffix("_total")
            if name in out and sample.name.endswith("_total"):
                out[name] += sample.value
    return out


PHASES = ("yue_prefill_tokens", "yue_prefill_seconds", "yue_decode_tokens", "yue_decode_seconds")


def _phase_rates(before: dict[str, float], after: dict[str, float]) -> tuple[float, float]:
    """(prefill, decode) tokens per second of the server's time in each, between two `_counters` reads."""
    d = {k: after[k] - before[k] for k in PHASES}
    prefill = d["yue_prefill_tokens"] / d["yue_prefill_seconds"] if d["yue_prefill_seconds"] else 0.0
    decode = d["yue_decode_tokens"] / d["yue_decode_seconds"] if d["yue_decode_seconds"] else 0.0
    return round(prefill, 1), round(decode, 1)


def client_process() -> ProcessPoolExecutor:
    """One process that runs a bench's clients (`_level`), apart from the server under test in this one.
    Spawned, not forked: this process holds threads (the servers') and torch's thread pools."""
    return ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))


@dataclass(frozen=True)
class ServeBenchConfig:
    """What `bench_serve` measures (`yue bench-serve`'s options). Bad values raise ValueError naming the field.

    Attributes:
        batch_sizes: `--max-batch-size` values to compare, one server each (the first is the base).
        clients: concurrent client counts.
        max_tokens: tokens per completion.
        mode: decode mode of every request (exact modes allow the output check).
        n_prompts: the first N held-out code prompts, cycled through.
        requests_per_client: requests each client sends (at least 8 per level and round).
        max_queue: each server's queue bound (`ServeConfig.max_queue`).
        rounds: times each level is measured, interleaved with the others (`interleaved`).
        chat_turns: N > 0: instead of the levels, time to first token of N-turn chats (`bench_chat`),
            on a server with the prefix cache and one without; 0 = the levels.
        think_s: seconds between a chat's turns (a reader's pause; the cache fills answers while idle).
    """

    batch_sizes: tuple[int, ...] = (1, 16)
    clients: tuple[int, ...] = (1, 4, 16, 32)
    max_tokens: int = 64
    mode: str = "verified"
    n_prompts: int = 16
    requests_per_client: int = 2
    max_queue: int = 256
    rounds: int = 3
    chat_turns: int = 0
    think_s: float = 2.0

    def __post_init__(self) -> None:
        for name in ("batch_sizes", "clients"):
            if not getattr(self, name) or any(n < 1 for n in getattr(self, name)):
                raise ValueError(f"{name} must be integers >= 1, got {list(getattr(self, name))}")
        for name in ("max_tokens", "n_prompts", "requests_per_client", "max_queue", "rounds"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {', '.join(MODES)}; got {self.mode!r}")
        if self.chat_turns < 0 or self.think_s < 0:
            raise ValueError(f"chat_turns and think_s must be >= 0, got {self.chat_turns}, {self.think_s}")


def bench_serve(
    engine,
    cfg: ServeBenchConfig = ServeBenchConfig(),
    *,
    prompts: list[str] | None = None,
    log: Callable[[str], None] = lambda s: None,
    precision: str = "float32",
) -> ServeBench:
    """Measure the server at each max_batch_size and client count (see the module docstring); one server
    per size, all started first, idle while another is measured. (`cfg.chat_turns` is `bench.chat`'s.)

    Each level sends max(8, clients * requests_per_client) requests a round over the first `cfg.n_prompts`
    held-out code prompts (cycled), or over `prompts` when given. `precision`: the engine's, as loaded
    (`yue.load`'s dtype), for the report.
    """
    from yue.serve import ServeConfig
    from yue.serve.server import LocalServer

    mode, max_tokens = cfg.mode, cfg.max_tokens
    if prompts is None:
        prompts = [row["prompt"] for _, row in iter_jsonl(CODE_TEST)][: cfg.n_prompts]
    log(f"single-request references for {len(prompts)} prompts ({mode}, {max_tokens} tokens)")
    refs = [engine.generate(p, mode=mode, max_new_tokens=max_tokens, temperature=0.0).text for p in prompts]
    result = ServeBench(
        engine.name, mode, max_tokens, len(prompts), torch.get_num_threads(), os.cpu_count() or 0, precision
    )
    result.load_average["start"] = [round(x, 2) for x in os.getloadavg()]
    with contextlib.ExitStack() as stack:  # every server started is stopped, even if a later one fails
        servers = [
            # No prefix cache: the levels send the same prompts again, which would measure the cache.
            LocalServer(engine, ServeConfig(max_batch_size=size, max_queue=cfg.max_queue, prefix_cache_mb=0))
            for size in cfg.batch_sizes
        ]
        urls = [stack.enter_context(server).url for server in servers]
        clients = stack.enter_context(client_process())
        for url in urls:  # warm-up (the client process's imports too), not reported
            clients.submit(_level, url, prompts[:1], refs[:1], 1, 1, mode, max_tokens).result()
        # Every (clients, size) level once a round, sizes side by side at each client count, the order
        # reversed every other round: drift in a shared machine's load hits the sizes alike.
        levels = [(n, i) for n in cfg.clients for i in range(len(urls))]
        for r, (n, i) in interleaved(levels, cfg.rounds):
            n_requests = max(8, n * cfg.requests_per_client)
            before = _counters(urls[i], PHASES)
            wall, rows = clients.submit(
                _level, urls[i], prompts, refs, n, n_requests, mode, max_tokens
            ).result()
            prefill, decode = _phase_rates(before, _counters(urls[i], PHASES))
            ttfts = [row[0] * 1e3 for row in rows]
            tokens = sum(row[1] for row in rows)
            level = Level(
                cfg.batch_sizes[i],
                n,
                r,
                len(rows),
                tokens,
                round(wall, 3),
                round(tokens / wall, 1),
                round(percentile(ttfts, 50), 1),
                round(percentile(ttfts, 95), 1),
                sum(row[2] for row in rows),
                prefill,
                decode,
            )
            log(json.dumps(asdict(level)))
            result.levels.append(level)
    result.load_average["end"] = [round(x, 2) for x in os.getloadavg()]
    return result


def report(result: ServeBench, base: int, other: int) -> str:
    """The table (markdown: medians over rounds) and, last, one JSON line (every round's levels too)."""
    lines = [
        f"`yue serve`, {result.model} ({result.precision}), {result.mode}, greedy, {result.max_tokens} tokens, "
        f"{result.torch_threads} torch threads, {result.cpus} CPUs, load average (1/5/15 min) "
        f"{result.load_average['start']} at start, {result.load_average['end']} at end",
        "",
        "| max batch size | clients | rounds | requests | tokens/s (median) | prefill tokens/s "
        "| decode tokens/s | TTFT p50 (ms) | TTFT p95 (ms) | identical to alone |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for m in result.medians():
        lines.append(
            f"| {m['max_batch_size']} | {m['clients']} | {m['rounds']} | {m['requests']} | {m['tokens_per_s']} "
            f"| {m['prefill_tokens_per_s']} | {m['decode_tokens_per_s']} "
            f"| {m['ttft_p50_ms']} | {m['ttft_p95_ms']} | {m['identical']}/{m['requests']} |"
        )
    ratios = result.ratios(base, other)
    lines.append("")
    for n, r in ratios.items():
        t = r["tokens_per_s"]
        pre, dec = r["prefill_tokens_per_s"], r["decode_tokens_per_s"]
        lines.append(
            f"b{other}/b{base} tokens/s at {n} clients: {t['median']}x median, "
            f"{t['range'][0]}-{t['range'][1]}x over {len(t['rounds'])} rounds; prefill {pre['median']}x, "
            f"decode {dec['median']}x"
        )
    doc = asdict(result) | {"medians": result.medians(), "ratios": {f"b{other}/b{base}": ratios}}
    return "\n".join(lines) + "\n" + json.dumps(doc)
