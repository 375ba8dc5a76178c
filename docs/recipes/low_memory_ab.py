"""One weight copy against two in one process: `ar` and `verified` with float32 AR matmuls held twice
(the default) and once (`yue.load(low_memory=True)`), interleaved per prompt so that both see the
same machine load (a development script, not part of the package).

    python docs/recipes/low_memory_ab.py chat_calibration 8 [max_new_tokens]

Prints tokens/s per variant, its ratio to two-copy `ar`, accepted drafts per forward (drafting passes
and the prefill counted), how many outputs equal two-copy `ar`'s, and the chosen kernels. Each engine
measures its own cost curve first. Where oneDNN packing works, a third engine holds its one copy in
the kernel that `probe.float32_one_copy`'s timing did not choose, to check that choice.
"""

import collections
import json
import sys
import time
from pathlib import Path

import torch

import yue
from yue.kernels import probe

torch.set_num_threads(1)
split, n = sys.argv[1], int(sys.argv[2])
new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 128
engines = {"two copies": yue.load(low_memory=False), "one copy": yue.load(low_memory=True)}
print(probe.choice().describe(), f"(packed one row / GEMV: {probe.one_row_packed_ratio():.2f})")
if probe.choice().ok("onednn-f32"):  # the one-copy kernel the timing did not choose, for comparison
    chosen = probe.choice().float32_one_copy
    probe.ONE_COPY_TOLERANCE = float("inf") if chosen == "F.linear" else 0.0
    engines[f"one copy, {probe.choice().float32_one_copy} (not chosen)"] = yue.load(low_memory=True)
lines = (Path(yue.__file__).parent / "assets" / f"{split}.jsonl").read_text().splitlines()
prompts = [engines["one copy"].chat_prompt(json.loads(line)["messages"]) for line in lines][:n]
for engine in engines.values():
    engine.generate(prompts[0], mode="verified", max_new_tokens=8)  # warm-up, and the step costs
variants = [(f"{mode}, {copies}", copies, mode) for mode in ("ar", "verified") for copies in engines]
seconds, tokens = collections.Counter(), collections.Counter()
exact, accepted, forwards = collections.Counter(), collections.Counter(), collections.Counter()
for prompt in prompts:
    reference = None
    for name, copies, mode in variants:
        t0 = time.perf_counter()
        r = engines[copies].generate(prompt, mode=mode, max_new_tokens=new_tokens)
        seconds[name] += time.perf_counter() - t0
        tokens[name] += len(r.token_ids)
        reference = reference or r.token_ids
        exact[name] += r.token_ids == reference
        accepted[name] += r.stats.accepted
        forwards[name] += r.stats.forwards
base = tokens[variants[0][0]] / seconds[variants[0][0]]
for name, _, _ in variants:
    rate = tokens[name] / seconds[name]
    print(
        f"{name:48s} {rate:6.2f} tok/s  {rate / base:.3f}x two-copy ar  "
        f"accepted/forward {accepted[name] / max(forwards[name], 1):.2f}  exact {exact[name]}/{len(prompts)}"
    )
