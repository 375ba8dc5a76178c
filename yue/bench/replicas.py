"""`python -m yue.bench.replicas`: tokens/s of `yue serve --replicas N` under concurrent clients, for
each N, against the single-request outputs.

Design decisions:
- The real thing: the server as Ray Serve replicas (`yue.serve.replicas`, a local Ray cluster), each
  with `--threads` torch threads, measured through HTTP with the streamed clients of `yue bench-serve`
  (`yue.bench.serving`), one level per replica count, a warm-up request first (not reported).
- Levels interleaved in rounds as `yue bench-serve`'s (`serving.interleaved`: 1 2, 2 1, 1 2 replicas),
  each replica count started afresh each round; a ratio is taken within each round and reported as
  the median over rounds with its range.
- Every output is compared with `Engine.generate` of the same prompt (greedy, exact modes), which is
  what the single-process server answers (tests/test_serve_batching.py); the count is reported.
- Needs Ray (`pip install 'yue[ray]'`); a table on stderr, one JSON document as the last line.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time

import httpx
import torch

import yue
from yue.bench.prompts import CODE_TEST
from yue.bench.serving import _complete, _level, interleaved, ratio_summary
from yue.jsonl import iter_jsonl
from yue.serve import ServeConfig
from yue.serve import replicas as ray_replicas


def bench_replicas(
    model: str,
    counts: list[int],
    clients: int,
    max_tokens: int,
    mode: str,
    threads: int,
    port: int,
    rounds: int = 3,
) -> dict:
    """One level per replica count in `counts` and round (see the module docstring)."""
    torch.set_num_threads(threads)
    engine = yue.load(model)
    prompts = [row["prompt"] for _, row in iter_jsonl(CODE_TEST)][:16]
    refs = [engine.generate(p, mode=mode, max_new_tokens=max_tokens, temperature=0.0).text for p in prompts]
    del engine
    doc = {
        "model": model,
        "mode": mode,
        "max_tokens": max_tokens,
        "clients": clients,
        "threads_per_replica": threads,
        "cpus": os.cpu_count(),
        "load_average": {"start": [round(x, 2) for x in os.getloadavg()]},
        "levels": [],
    }
    config = ServeConfig(port=port, max_batch_size=16, max_queue=256)
    for r, n in interleaved(counts, rounds):
        t0 = time.perf_counter()
        plan = ray_replicas.ReplicaConfig(replicas=n, threads=threads)
        url = ray_replicas.start(functools.partial(yue.load, model), config, plan)
        started = time.perf_counter() - t0
        try:
            with httpx.Client() as http:
                _complete(http, url, prompts[0], mode, max_tokens)  # warm-up
            wall, rows = _level(url, prompts, refs, clients, clients, mode, max_tokens)
        finally:
            ray_replicas.stop()
        tokens = sum(row[1] for row in rows)
        level = {
            "replicas": n,
            "round": r,
            "requests": len(rows),
            "tokens": tokens,
            "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 1),
            "identical": sum(row[2] for row in rows),
            "start_s": round(started, 1),
        }
        print(json.dumps(level), file=sys.stderr)
        doc["levels"].append(level)
    doc["load_average"]["end"] = [round(x, 2) for x in os.getloadavg()]
    tok_s = {(lv["replicas"], lv["round"]): lv["tokens_per_s"] for lv in doc["levels"]}
    doc["ratios"] = {
        f"r{n}/r{counts[0]}": ratio_summary([tok_s[n, r] / tok_s[counts[0], r] for r in range(rounds)])
        for n in counts[1:]
    }
    return doc


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="yue-smol")
    parser.add_argument("--replicas", default="1,2", help="replica counts to compare (the first is the base)")
    parser.add_argument("--clients", type=int, default=32)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--mode", default="verified")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per replica")
    parser.add_argument("--port", type=int, default=8470)
    parser.add_argument("--rounds", type=int, default=3, help="times each level runs, interleaved")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds must be >= 1, got {args.rounds}")
    counts = [int(x) for x in args.replicas.split(",")]
    doc = bench_replicas(
        args.model, counts, args.clients, args.max_tokens, args.mode, args.threads, args.port, args.rounds
    )
    print(json.dumps(doc))


if __name__ == "__main__":
    main()
