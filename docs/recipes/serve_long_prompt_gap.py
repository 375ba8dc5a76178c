"""Issue 48's fairness check: a 7,900-token prompt joins 4 running streams on `yue serve`; how long do
the running streams wait between tokens?

Runs the real server (uvicorn on 127.0.0.1, in-process) on a model (default yue-smol), starts 4
streamed chat requests, and once each has its first token sends one long completion (the chat
template's words repeated up to TOKENS prompt tokens). Prints each stream's worst gap between chunks
before, during and after the long prompt's prefill, and one JSON line.

    python docs/recipes/serve_long_prompt_gap.py [--model yue-smol] [--tokens 7900] [--threads 1]
        [--max-batch-tokens 512]
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import httpx
import torch

import yue
from yue.serve import ServeConfig
from yue.serve.server import LocalServer


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="yue-smol")
    ap.add_argument("--tokens", type=int, default=7900)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--max-batch-tokens", type=int, default=128)
    ap.add_argument("--answer-tokens", type=int, default=400)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = yue.load(args.model)
    words = "The quick brown fox jumps over the lazy dog while the river runs to the sea. "
    text = words * (2 * args.tokens // len(engine.encode(words)) + 1)
    ids = engine.encode(text)[: args.tokens]
    config = ServeConfig(max_batch_tokens=args.max_batch_tokens, max_prompt_tokens=8192)
    stamps: list[list[float]] = [[] for _ in range(args.streams)]
    long_window: dict[str, float] = {}
    with LocalServer(engine, config) as server:

        def stream(i: int) -> None:
            body = {
                "messages": [{"role": "user", "content": f"Tell me a long story about lighthouse {i}."}],
                "max_tokens": args.answer_tokens,
                "temperature": 0,
                "stream": True,
            }
            with httpx.stream("POST", server.url + "/v1/chat/completions", json=body, timeout=600) as r:
                for line in r.iter_lines():
                    if line.startswith("data: ") and '"content":"' in line:
                        stamps[i].append(time.perf_counter())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(args.streams)]
        for t in threads:
            t.start()
        while not all(len(s) >= 3 for s in stamps):
            time.sleep(0.05)
        long_window["sent"] = time.perf_counter()
        body = {"prompt": ids, "max_tokens": 1, "temperature": 0}
        r = httpx.post(server.url + "/v1/completions", json=body, timeout=900)
        long_window["answered"] = time.perf_counter()
        assert r.status_code == 200, r.text
        for t in threads:
            t.join()
    t0, t1 = long_window["sent"], long_window["answered"]
    worst = []
    for s in stamps:
        gaps = [(b - a, a) for a, b in zip(s, s[1:], strict=False)]
        during = [g for g, a in gaps if t0 - 1 <= a <= t1]
        worst.append(max(during) if during else None)
    report = {
        "model": args.model,
        "prompt_tokens": len(ids),
        "streams": args.streams,
        "threads": args.threads,
        "max_batch_tokens": args.max_batch_tokens,
        "prefill_s": round(t1 - t0, 2),
        "worst_gap_s_per_stream": [None if w is None else round(w, 3) for w in worst],
        "worst_gap_s": round(max(w for w in worst if w is not None), 3),
        # where the worst gaps fell: (gap, seconds after the long prompt was sent), stream 0
        "stream0_top_gaps": sorted(
            ((round(b - a, 3), round(a - t0, 2)) for a, b in zip(stamps[0], stamps[0][1:], strict=False)),
            reverse=True,
        )[:6],
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
