"""yue's row kernels against another path in one process: `ar` and `verified` on yue-smol, two engines
interleaved per prompt so that both see the same machine load (a development script, not part of the
package).

    python docs/recipes/row_kernel_ab.py chat_test 8 [max_new_tokens] [against] [dtype] [temperature]

`against` (default `oneDNN`):
- `oneDNN`: float32 layers on `StreamedLinear` (the row kernel, the default where it builds) against
  `RowAdaptiveLinear` (MKL's GEMV for one row, oneDNN for more; what a model too small for the kernel,
  or a machine without a compiler, runs).
- `torch-layer`: each layer one row-kernel call (`DecodeSet.whole_layer`) with the kernel's norms and
  attention, against the same model's layers through torch's calls (its RMSNorm, the padded SDPA, or
  one query per SDPA call for int4), as before the one-call layer. `dtype` float32 (default) or int4.
- `per-layer`: a step's layers of a set as one row-kernel call (`rowkernel.stack`, the default where
  every layer is one call) against one call a layer (`DecodeSet.whole_layer`, as before the stack).
- `full-head`: greedy steps choosing through the head's int8 screen (`screen.ScreenedHead`, the
  default), against the same model with its AR head set back to the full float32 row-kernel head.
- `float-weights`: the layers' Q4_1 weights held as their 4-bit codes (`rowkernel.q4_block`, the
  default where the `rows-q4` probe passes), against the same model with them held as float32
  (`probe.forced("rows-q4")`).
- `float-head`: the tied head's Q8_0 values held as 8-bit codes (`rowkernel.q8_block`, the default
  where the `rows-q8` probe passes), against the same model with the head float32
  (`probe.forced("rows-q8")`); with a `temperature` (sampled requests, seed 0 each, read every
  logit) as well as greedy ones (the screen's).
- `torch-drafting`: the NAR layers' int8 matmuls on the row kernel, each layer one call
  (`prepare.RowInt8Linear`, the default where the row kernel runs), against torch's dynamic int8
  engine, op by op (as before; `lower_linear` without `row_kernel`).

Prints seconds per engine and mode, the ratios, and how many outputs equal the other side's `ar`. Each
engine measures its own cost curve on first use (cached per layout).
"""

import json
import sys
import time
from pathlib import Path

import torch

import yue
from yue.kernels import prepare, probe
from yue.model import layers

torch.set_num_threads(1)
split, n = sys.argv[1], int(sys.argv[2])
new_tokens = int(sys.argv[3]) if len(sys.argv) > 3 else 64
against = sys.argv[4] if len(sys.argv) > 4 else "oneDNN"
dtype = sys.argv[5] if len(sys.argv) > 5 else "float32"
sampling = dict(temperature=float(sys.argv[6]), seed=0) if len(sys.argv) > 6 else {}
engines = {}
if against == "oneDNN":
    for name, bound in (("row kernel", prepare.ROW_STREAM_BYTES), ("oneDNN", 2**62)):
        prepare.ROW_STREAM_BYTES = bound  # `rows_kernel`: above the bound the row kernel, else oneDNN
        engines[name] = yue.load("yue-smol", dtype=dtype)
elif against == "float-weights":
    engines["row kernel"] = yue.load("yue-smol", dtype=dtype)
    with probe.forced("rows-q4"):
        engines[against] = yue.load("yue-smol", dtype=dtype)
elif against == "float-head":
    engines["row kernel"] = yue.load("yue-smol", dtype=dtype)
    with probe.forced("rows-q8"):
        engines[against] = yue.load("yue-smol", dtype=dtype)
elif against == "torch-drafting":
    engines["row kernel"] = yue.load("yue-smol", dtype=dtype)
    lower = prepare.lower_linear
    prepare.lower_linear = lambda linear, dtype, row_kernel=False: lower(linear, dtype)
    try:
        engines[against] = yue.load("yue-smol", dtype=dtype)
    finally:
        prepare.lower_linear = lower
else:
    engines = {"row kernel": yue.load("yue-smol", dtype=dtype), against: yue.load("yue-smol", dtype=dtype)}
paths = engines[against].model.paths  # the decode paths of the engine's PreparedModel
if against == "full-head":
    paths.ar_head = paths.ar_head.head
elif against == "per-layer":
    paths.stacks = {}
elif against == "torch-layer":
    paths.stacks = {}
    for sets in paths.layers:
        for decode_set in sets:
            decode_set.rms_norm, decode_set.blocked = layers.rms_norm, None
            if decode_set.attend.form == "kernel":
                decode_set.attend.form = "per-row" if dtype == "int4" else "padded"
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
            result = engine.generate(prompt, mode=mode, max_new_tokens=new_tokens, **sampling)
            seconds[name, mode] = seconds.get((name, mode), 0.0) + time.perf_counter() - start
            outputs.setdefault((name, mode), []).append(result.token_ids)
for (name, mode), s in seconds.items():
    print(f"{name:12s} {mode:8s} {s:7.2f} s")
for mode in ("ar", "verified"):
    print(f"{mode}: row kernel {seconds[against, mode] / seconds['row kernel', mode]:.3f}x {against}'s speed")
for name in engines:
    print(f"{name}: verified {seconds[name, 'ar'] / seconds[name, 'verified']:.3f}x ar")
for side in engines:
    reference = outputs[side, "ar"]
    for key, out in outputs.items():
        same = sum(a == b for a, b in zip(out, reference, strict=True))
        print(key, f"outputs equal to {side} ar's:", same, "/", n)
