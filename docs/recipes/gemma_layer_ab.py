"""Gemma 3 270M's one-row `ar` step: a layer as one row-kernel call (`rowstack`) against the same model's
layers in parts (torch around the fused matmuls, as before the one-call Gemma layer), and llama.cpp on the
same GGUF, one thread, interleaved in one process (a development script, not part of the package).

    python docs/recipes/gemma_layer_ab.py [rounds] [tokens] [prompts] [json]

Each round runs every side on the same prompts (`yue/assets/text_test.jsonl`) and greedy tokens, timing
process CPU time (the machine is shared: other processes do not count) and wall time per generated
token, prefill included; for yue also the share in `MoTModel.run` (the layers; the rest is the head's
screen, sampling and the loop). Prints medians over rounds, and whether the two yue sides wrote the
same tokens (they must). With a fourth argument, also writes the medians there as JSON.
"""

import json
import statistics
import sys
import time
from pathlib import Path

import torch

import yue
from yue.bench import llamacpp
from yue.registry import packaged_gguf

ROUNDS, TOKENS, PROMPTS = (int(a) for a in (sys.argv[1:4] + ["5", "64", "3"][len(sys.argv[1:4]) :]))
torch.set_num_threads(1)
engine = yue.load("gemma-3-270m")
model = engine.model
llm = llamacpp.load(packaged_gguf("gemma-3-270m"), n_ctx=512, threads=1)
lines = Path("yue/assets/text_test.jsonl").read_text().splitlines()[:PROMPTS]
texts = [json.loads(line)["prompt"] for line in lines]
prompts = [engine.encode(text) for text in texts]
blocked = [sets[0].blocked for sets in model.paths.layers]
stacks = dict(model.paths.stacks)
inner = model.trained.model
run, in_run = inner.run, [0.0]


def timed_run(*args, **kwargs):
    t = time.process_time()
    try:
        return run(*args, **kwargs)
    finally:
        in_run[0] += time.process_time() - t


inner.run = timed_run


def yue_side(one_call: bool):
    for sets, b in zip(model.paths.layers, blocked, strict=True):
        sets[0].blocked = b if one_call else None
    model.paths.stacks = stacks if one_call else {}
    out = []
    for text in texts:
        out.append(engine.generate(text, mode="ar", max_new_tokens=TOKENS, ignore_eos=True).token_ids)
    return out


def llama_side():
    runner = llamacpp.LlamaCppRunner(llm, engine.tokenizer, set(), TOKENS)
    return [runner.generate(ids)[0] for ids in prompts]


sides = {"one call": lambda: yue_side(True), "parts": lambda: yue_side(False), "llama.cpp": llama_side}
times = {name: [] for name in sides}
tokens = {}
for _ in range(ROUNDS):
    for name, fn in sides.items():
        in_run[0] = 0.0
        c, w = time.process_time(), time.perf_counter()
        tokens[name] = fn()
        n = sum(len(t) for t in tokens[name])
        times[name].append(((time.process_time() - c) / n, (time.perf_counter() - w) / n, in_run[0] / n))
print(
    f"{ROUNDS} rounds x {PROMPTS} prompts x {TOKENS} tokens; ms per token (median): cpu, wall, in MoTModel.run"
)
for name, rows in times.items():
    cpu, wall, layers = (statistics.median(r[k] for r in rows) * 1e3 for k in range(3))
    print(
        f"{name:10s} cpu {cpu:6.2f}  wall {wall:6.2f}"
        + (f"  layers {layers:6.2f}" if name != "llama.cpp" else "")
    )
base = statistics.median(r[0] for r in times["llama.cpp"])
for name in ("one call", "parts"):
    print(f"{name}: {base / statistics.median(r[0] for r in times[name]):.2f}x llama.cpp (cpu time)")
print("one call == parts tokens:", tokens["one call"] == tokens["parts"])
print(
    "one call == llama.cpp tokens:",
    sum(a == b for a, b in zip(tokens["one call"], tokens["llama.cpp"], strict=True)),
    "/",
    PROMPTS,
)
if len(sys.argv) > 4:
    medians = {
        name: {
            k: statistics.median(r[i] for r in rows) * 1e3
            for i, k in enumerate(("cpu_ms", "wall_ms", "run_ms"))
        }
        for name, rows in times.items()
    }
    result = {
        "rounds": ROUNDS,
        "prompts": PROMPTS,
        "tokens": TOKENS,
        "per_token_median": medians,
        "one_call_vs_llamacpp_cpu": base / statistics.median(r[0] for r in times["one call"]),
        "parts_vs_llamacpp_cpu": base / statistics.median(r[0] for r in times["parts"]),
        "one_call_tokens_equal_parts": tokens["one call"] == tokens["parts"],
    }
    Path(sys.argv[4]).write_text(json.dumps(result, indent=1) + "\n")
