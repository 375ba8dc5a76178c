"""yue's row kernel against oneDNN's packed copy in one process: `ar` and `verified` on float32 yue-smol
with its layers on `StreamedLinear` (the default where the kernel builds) and on `RowAdaptiveLinear`
(MKL's GEMV for one row, oneDNN for more; what a model too small for the kernel, or a machine without a
compiler, runs), interleaved per prompt so that both see the same machine load (a development script,
not part of the package).

    python docs/recipes/row_kernel_ab.py chat_test 8 [max_new_tokens]

Prints seconds per variant and mode, the ratios, and how many outputs equal oneDNN `ar`'s. Each engine
measures its own cost curve on first use (cached per layout).
"""

import json
import sys
import time
from pathlib import Path

import torch

import yue
from yue.model import inference

torch.set_num_threads(1)
split, n = sys.argv[1], int(sys.argv[2])
new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
engines = {}
for name, bound in (("row kernel", inference.ROW_STREAM_BYTES), ("oneDNN", 2**62)):
    inference.ROW_STREAM_BYTES = bound  # `rows_kernel`: above the bound the row kernel, else oneDNN
    engines[name] = yue.load("yue-smol")
    print(name, type(engines[name].model.ar_head).__name__, flush=True)
assets = Path(yue.__file__).parent / "assets"
prompts = [json.loads(line)["messages"] for line in (assets / f"{split}.jsonl").read_text().splitlines()][:n]
seconds, outputs = {}, {}
for i, messages in enumerate(prompts):
    for name in list(engines) if i % 2 == 0 else list(reversed(engines)):
        engine = engines[name]
        prompt = engine.chat_prompt(messages)
        for mode in ("ar", "verified"):
            start = time.perf_counter()
            result = engine.generate(prompt, mode=mode, max_new_tokens=new_tokens)
            seconds[name, mode] = seconds.get((name, mode), 0.0) + time.perf_counter() - start
            outputs.setdefault((name, mode), []).append(result.token_ids)
for (name, mode), s in seconds.items():
    print(f"{name:10s} {mode:8s} {s:7.2f} s")
for mode in ("ar", "verified"):
    print(f"{mode}: row kernel {seconds['oneDNN', mode] / seconds['row kernel', mode]:.3f}x oneDNN's speed")
for name in engines:
    print(f"{name}: verified {seconds[name, 'ar'] / seconds[name, 'verified']:.3f}x ar")
reference = outputs["oneDNN", "ar"]
for key, out in outputs.items():
    print(
        key, "outputs equal to oneDNN ar's:", sum(a == b for a, b in zip(out, reference, strict=True)), "/", n
    )
