"""The head's int8 screen against the full float32 head in one process: `ar` and `verified` on yue-smol,
two engines interleaved per prompt so that both see the same machine load (a development script, not
part of the package).

    python docs/recipes/screen_ab.py chat_test 8 [max_new_tokens]

One engine as `yue.load` prepares it (greedy steps choose through `screen.ScreenedHead`), the other with
its AR head set back to the full row-kernel head. Prints seconds per engine and mode, the ratios, and
how many outputs equal the full head's `ar` (the screen's argmax is the full head's, so all of them).
Each engine measures its own cost curve on first use (cached per layout).
"""

import json
import sys
import time
from pathlib import Path

import torch

import yue

torch.set_num_threads(1)
split, n = sys.argv[1], int(sys.argv[2])
new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
engines = {"screen": yue.load("yue-smol"), "full": yue.load("yue-smol")}
engines["full"].model.ar_head = engines["full"].model.ar_head.head
assets = Path(yue.__file__).parent / "assets"
prompts = [json.loads(line)["messages"] for line in (assets / f"{split}.jsonl").read_text().splitlines()][:n]
for engine in engines.values():  # warm-up: first calls, and each engine's cost curve
    for mode in ("ar", "verified"):
        engine.generate(engine.chat_prompt(prompts[0]), mode=mode, max_new_tokens=16)
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
    print(f"{name:7s} {mode:8s} {s:7.2f} s")
for mode in ("ar", "verified"):
    print(f"{mode}: screen {seconds['full', mode] / seconds['screen', mode]:.3f}x the full head's speed")
for name in engines:
    print(f"{name}: verified {seconds[name, 'ar'] / seconds[name, 'verified']:.3f}x ar")
reference = outputs["full", "ar"]
for key, out in outputs.items():
    print(
        key,
        "outputs equal to the full head's ar:",
        sum(a == b for a, b in zip(out, reference, strict=True)),
        "/",
        n,
    )
