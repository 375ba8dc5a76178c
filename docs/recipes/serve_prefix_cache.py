"""Issue 45's prefix-cache target: the second turn of a chat on `yue serve`, time to first token with the
prefix cache against without it (`--prefix-cache-mb 0`), and the same answers.

Loads a model once (default yue-smol) and, per run, starts the real server (uvicorn on 127.0.0.1,
in-process) twice on it: without the cache, then with it (a fresh, empty cache each run). On each it
holds the same two-turn chat through `/v1/chat/completions`, streamed, greedy, in the model's default
mode: turn 1 a few hundred tokens of text to summarise, then, after THINK seconds (a reader's pause,
in which the cached server prefills turn 1's answer into its cache while idle), turn 2 with turn 1's
answer and a new question. Time to first token is measured by the client, from sending the request
to the first content chunk. Prints each run, then one JSON line: the median turn-2 TTFT ratio (cache
on / off), whether every answer matched, and the cache's counters.

    python docs/recipes/serve_prefix_cache.py [--model yue-smol] [--runs 3] [--threads 1] [--think 5]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import httpx
import torch
from prometheus_client.parser import text_string_to_metric_families

import yue
from yue.serve import ServeConfig
from yue.serve.server import LocalServer

PASSAGE = (
    "The lighthouse at Point Aster was built in 1871 on a ledge of black basalt that the tide covers twice "
    "a day. Its first keeper, Marta Lind, kept a log of every ship that passed, every storm and every "
    "repair, and the log survives in the town museum: forty-one volumes in a careful, slanting hand. The "
    "tower is thirty-two metres tall and its lamp burned whale oil until 1889, then kerosene, and from "
    "1931 electricity brought by a cable laid across the sea floor. The light turns once every twelve "
    "seconds and can be seen from twenty-two nautical miles on a clear night. In the great storm of "
    "1903 waves broke over the gallery, forty metres above the low-water mark, and smashed two panes of "
    "the lantern; the keeper and his son held canvas over the gap until dawn so that the light never "
    "went out. The station was automated in 1987 and the last keeper, Tomas Berg, moved to the village, "
    "where he repaired clocks and told visitors about the winters on the rock. Today the keeper's house "
    "is a small hotel with four rooms, the old fog signal is sounded once a year on the first of May, "
    "and a colony of puffins nests on the northern cliffs from April to August. Boats leave the harbour "
    "twice a day in summer, weather permitting, and the crossing takes forty minutes. Visitors may climb "
    "the one hundred and twelve steps to the gallery, but children under eight must be carried, and "
    "nobody may go up when the wind is above force six."
)
QUESTION_1 = "Summarise this text in three sentences.\n\n" + PASSAGE
QUESTION_2 = "What happened in the storm of 1903, and who kept the light burning?"


def metric(text: str, name: str, **labels) -> float:
    """One sample of a Prometheus exposition (0 when absent)."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                return s.value
    return 0.0


def ask(url: str, messages: list[dict], max_tokens: int) -> tuple[str, float, dict]:
    """A streamed, greedy chat request: (answer, seconds to the first content chunk, usage)."""
    body = {
        "messages": messages,
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    parts, first, usage = [], None, {}
    t0 = time.perf_counter()
    with httpx.stream("POST", url + "/v1/chat/completions", json=body, timeout=600) as r:
        for line in r.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[len("data: ") :])
            usage = chunk.get("usage") or usage
            for choice in chunk.get("choices", []):
                text = choice["delta"].get("content")
                if text:
                    first = first or time.perf_counter() - t0
                    parts.append(text)
    return "".join(parts), first, usage


def conversation(engine, mb: int, think: float, max_tokens: int) -> dict:
    """The two turns on a fresh server whose prefix cache has `mb` MiB (0: off)."""
    with LocalServer(engine, ServeConfig(prefix_cache_mb=mb)) as server:
        turn1 = [{"role": "user", "content": QUESTION_1}]
        answer1, ttft1, usage1 = ask(server.url, turn1, max_tokens)
        time.sleep(think)
        filled = metric(httpx.get(server.url + "/metrics").text, "yue_prefix_cache_filled_tokens_total")
        turn2 = turn1 + [{"role": "assistant", "content": answer1}, {"role": "user", "content": QUESTION_2}]
        answer2, ttft2, usage2 = ask(server.url, turn2, max_tokens)
        text = httpx.get(server.url + "/metrics").text
    return {
        "prefix_cache_mb": mb,
        "answers": [answer1, answer2],
        "prompt_tokens": [usage1.get("prompt_tokens"), usage2.get("prompt_tokens")],
        "answer_tokens": [usage1.get("completion_tokens"), usage2.get("completion_tokens")],
        "ttft_s": [round(ttft1, 3), round(ttft2, 3)],
        "filled_before_turn2": filled,
        "hit_tokens": metric(text, "yue_prefix_cache_hits_total"),
        "queried_tokens": metric(text, "yue_prefix_cache_queries_total"),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="yue-smol")
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--think", type=float, default=5.0, help="seconds between turn 1's answer and turn 2")
    ap.add_argument("--max-tokens", type=int, default=96)
    ap.add_argument("--cache-mb", type=int, default=ServeConfig.prefix_cache_mb)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    engine = yue.load(args.model)
    engine.generate("Hello", max_new_tokens=4)  # warm-up (step costs measured, kernels touched), not timed
    runs = []
    for i in range(args.runs):
        off = conversation(engine, 0, args.think, args.max_tokens)
        on = conversation(engine, args.cache_mb, args.think, args.max_tokens)
        ratio = on["ttft_s"][1] / off["ttft_s"][1]
        same = on["answers"] == off["answers"]
        print(
            f"run {i}: turn-2 TTFT {off['ttft_s'][1]:.3f} s without the cache, {on['ttft_s'][1]:.3f} s with it "
            f"(x{ratio:.2f}); prompts {on['prompt_tokens']} tokens, {on['hit_tokens']:.0f} from the cache "
            f"({on['filled_before_turn2']:.0f} filled while idle); same answers: {same}"
        )
        runs.append({"off": off, "on": on, "turn2_ttft_ratio": round(ratio, 3), "same_answers": same})
    report = {
        "recipe": "docs/recipes/serve_prefix_cache.py",
        "model": args.model,
        "mode": engine.default_mode,
        "threads": args.threads,
        "think_s": args.think,
        "max_tokens": args.max_tokens,
        "turn2_ttft_ratio_median": statistics.median(r["turn2_ttft_ratio"] for r in runs),
        "same_answers": all(r["same_answers"] for r in runs),
        "runs": runs,
    }
    print(json.dumps(report))


if __name__ == "__main__":
    main()
