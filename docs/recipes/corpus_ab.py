"""Corpus drafts on and off in one process: `ar`, `verified` without and with them, interleaved per
mode over the same prompts (a development script, not part of the package; `yue bench` cannot switch
`DecodeConfig.corpus_drafts`).

    python docs/recipes/corpus_ab.py chat_test 8 [float32|bfloat16|int4]

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

torch.set_num_threads(1)
split, n = sys.argv[1], int(sys.argv[2])
engine = yue.load(dtype=sys.argv[3] if len(sys.argv) > 3 and sys.argv[3] != "float32" else None)
lines = (Path(yue.__file__).parent / "assets" / f"{split}.jsonl").read_text().splitlines()
prompts = [engine.chat_prompt(json.loads(line)["messages"]) for line in lines][:n]
engine.generate(prompts[0], mode="verified", max_new_tokens=8)  # warm-up, and the step costs
variants = {
    "ar": dict(mode="ar"),
    "verified, no corpus": dict(mode="verified", corpus_drafts=False),
    "verified": dict(mode="verified"),
}
reference, ar_rate = {}, None
for name, kw in variants.items():
    seconds, tokens, exact = 0.0, 0, 0
    counts, step_ms, steps = collections.Counter(), collections.defaultdict(float), collections.Counter()
    for i, prompt in enumerate(prompts):
        t0 = time.perf_counter()
        r = engine.generate(prompt, max_new_tokens=128, trace=True, **kw)
        seconds += time.perf_counter() - t0
        tokens += len(r.token_ids)
        reference.setdefault(i, r.token_ids)
        exact += r.token_ids == reference[i]
        counts.update(forwards=r.stats.forwards, passes=r.stats.draft_passes)
        counts.update(drafted=r.stats.drafted, accepted=r.stats.accepted)
        for s in r.trace:
            step_ms[s.drafted] += s.time_ms
            steps[s.drafted] += 1
    rate = tokens / seconds
    ar_rate = ar_rate or rate
    by_drafts = {d: round(step_ms[d] / steps[d], 1) for d in sorted(steps)}
    print(
        f"{name:20s} {rate:6.2f} tok/s  {rate / ar_rate:.3f}x ar  {dict(counts)}  exact {exact}/{len(prompts)}"
    )
    print(f"{'':20s} mean step ms by drafts verified: {by_drafts}")
