"""Issue 47: the four-expert router against the single (type) router, trained alike: draft quality at
equal fidelity, on held-out code (yue/assets/code_test.jsonl, prompts as `yue bench` feeds them).

Both models decode `verified` (exact: output = each model's own `ar`) and `hybrid` (tolerance 0.1)
with drafting free (flat step costs: every block drafted whole, so the draft length does not depend on
each machine's measured costs or on whether the model runs the fused decode paths, which the
four-expert model does not) and float32 drafts. Per model: verifying forwards per token (drafting
passes not counted), mean accepted drafts per verifying step, and all forwards per token. Prints JSON.

    PYTHONPATH=. python docs/recipes/issue47_router_compare.py MODEL [MODEL ...] [--tokens 64] [--limit N]
"""

from __future__ import annotations

import argparse
import json

import yue
from yue.bench.prompts import load_prompts
from yue.decode.costs import StepCosts

TEST = "yue/assets/code_test.jsonl"
FREE = StepCosts((1.0,) * 16, (0.0,))  # every verifying step costs one forward, drafting nothing


def measure(engine, prompts, mode: str, tokens: int) -> dict:
    new = forwards = passes = steps = accepted = 0
    for p in prompts:
        s = engine.generate(
            p.text, mode=mode, max_new_tokens=tokens, router_threshold=0.1 if mode == "hybrid" else 1.0
        ).stats
        new, forwards, passes = new + s.new_tokens, forwards + s.forwards, passes + s.draft_passes
        steps, accepted = steps + len(s.accept_lengths), accepted + sum(s.accept_lengths)
    return {
        "mode": mode,
        "verifying_forwards_per_token": (forwards - passes) / new,
        "forwards_per_token": forwards / new,
        "mean_accepted": accepted / max(1, steps),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("models", nargs="+")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=None)
    args = ap.parse_args()
    out = []
    for path in args.models:
        engine = yue.load(path, nar_dtype="float32")
        engine.costs = FREE
        prompts = load_prompts(TEST, engine, args.limit)
        out.append(
            {
                "model": path,
                "rows": [measure(engine, prompts, m, args.tokens) for m in ("verified", "hybrid")],
            }
        )
        print(json.dumps(out[-1]), flush=True)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
