"""Decode settings side by side in one process: `ar` and `verified` variants on the same prompts, every
variant run on each prompt before the next prompt (so drift on a shared machine hits all alike), in an
order that rotates per prompt (a development script, not part of the package; `yue bench` cannot switch
these `DecodeConfig` fields).

    python docs/recipes/decode_ab.py VARIANTS SPLIT N [max_new_tokens] [float32|bfloat16|int4]

VARIANTS:
- `corpus`: `verified` without and with corpus drafts (`DecodeConfig.corpus_drafts`).
- `drafting-slots`: `verified` with drafting passes of 2, 3, 4, 5, 6 and 8 slots
  (`DecodeConfig.drafting_slots`; the model's default is `YueConfig.drafting_slots`, chosen with this
  on the calibration split).

Prints tokens/s, the ratio to `ar`, the forwards and drafting passes, drafted and accepted tokens, how
many outputs equal `ar`'s, and the mean step time by drafts verified.
"""

import collections
import json
import sys
import time
from pathlib import Path

import torch

import yue

VARIANTS = {
    "corpus": {
        "verified, no corpus": dict(mode="verified", corpus_drafts=False),
        "verified": dict(mode="verified"),
    },
    "drafting-slots": {
        f"verified, {k} slots": dict(mode="verified", drafting_slots=k) for k in (2, 3, 4, 5, 6, 8)
    },
}

torch.set_num_threads(1)
which, split, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
new_tokens = int(sys.argv[4]) if len(sys.argv) > 4 else 128
dtype = sys.argv[5] if len(sys.argv) > 5 and sys.argv[5] != "float32" else None
engine = yue.load(dtype=dtype)
lines = (Path(yue.__file__).parent / "assets" / f"{split}.jsonl").read_text().splitlines()
prompts = [engine.chat_prompt(json.loads(line)["messages"]) for line in lines][:n]
engine.generate(prompts[0], mode="verified", max_new_tokens=8)  # warm-up, and the step costs
variants = {"ar": dict(mode="ar"), **VARIANTS[which]}
seconds, tokens, outputs = collections.Counter(), collections.Counter(), collections.defaultdict(list)
counts = {name: collections.Counter() for name in variants}
step_ms = {name: collections.defaultdict(float) for name in variants}
steps = {name: collections.Counter() for name in variants}
for i, prompt in enumerate(prompts):
    names = list(variants)
    for name in names[i % len(names) :] + names[: i % len(names)]:
        t0 = time.perf_counter()
        r = engine.generate(prompt, max_new_tokens=new_tokens, trace=True, **variants[name])
        seconds[name] += time.perf_counter() - t0
        tokens[name] += len(r.token_ids)
        outputs[name].append(r.token_ids)
        counts[name].update(forwards=r.stats.forwards, passes=r.stats.draft_passes)
        counts[name].update(drafted=r.stats.drafted, accepted=r.stats.accepted)
        for s in r.trace:
            step_ms[name][s.drafted] += s.time_ms
            steps[name][s.drafted] += 1
ar_rate = tokens["ar"] / seconds["ar"]
for name in variants:
    rate = tokens[name] / seconds[name]
    exact = sum(a == b for a, b in zip(outputs[name], outputs["ar"], strict=True))
    by_drafts = {d: round(step_ms[name][d] / steps[name][d], 1) for d in sorted(steps[name])}
    print(f"{name:20s} {rate:6.2f} tok/s  {rate / ar_rate:.3f}x ar  {dict(counts[name])}  exact {exact}/{n}")
    print(f"{'':20s} mean step ms by drafts verified: {by_drafts}")
