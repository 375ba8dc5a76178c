"""Issue 47: `anchor` (lossy) by gap, against `ar`, on held-out code (yue/assets/code_test.jsonl).

The gap between anchor spans is at most the block's K - 1; `block_size` = 2, 3, 4, 8 caps it at 1, 2, 3, 7, so the
sweep shows what a shorter fill buys in fidelity and costs in speed. Per entry: tokens/s (sum of
tokens over sum of wall time, all prompts, one process), forwards per token, mean AR NLL per token of
the output (its ratio to `ar`'s), corpus chrF against the true continuation (its ratio to `ar`'s).

    PYTHONPATH=. python docs/recipes/issue47_anchor_sweep.py MODEL [--tokens 64] [--limit 40]
"""

from __future__ import annotations

import argparse
import json
import time

import yue
from yue.bench.metrics import ar_nll, chrf
from yue.bench.prompts import load_prompts

TEST = "yue/assets/code_test.jsonl"


def run(engine, prompts, mode: str, tokens: int, block_size: int | None) -> dict:
    wall, n_tok, forwards, nll, texts = 0.0, 0, 0, 0.0, []
    for p in prompts:
        t0 = time.perf_counter()
        r = engine.generate(p.text, mode=mode, max_new_tokens=tokens, block_size=block_size)
        wall += time.perf_counter() - t0
        n_tok += len(r.token_ids)
        forwards += r.stats.forwards
        nll += ar_nll(engine.model, p.ids, r.token_ids)[0]
        texts.append(r.text)
    return {
        "mode": mode,
        "block_size": block_size,
        "tokens_per_s": n_tok / wall,
        "forwards_per_token": forwards / n_tok,
        "nll": nll / n_tok,
        "chrf": chrf(texts, [p.reference for p in prompts]),
    }


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--limit", type=int, default=40)
    args = ap.parse_args()
    engine = yue.load(args.model)
    prompts = load_prompts(TEST, engine, args.limit)
    run(engine, prompts[:2], "anchor", 8, None)  # warm-up
    rows = [
        run(engine, prompts, "ar", args.tokens, None),
        run(engine, prompts, "verified", args.tokens, None),
    ]
    rows += [run(engine, prompts, "anchor", args.tokens, b) for b in (2, 3, 4, 8)]
    ar = rows[0]
    for r in rows:
        r["speed_vs_ar"] = r["tokens_per_s"] / ar["tokens_per_s"]
        r["nll_ratio_vs_ar"] = r["nll"] / ar["nll"]
        r["chrf_ratio_vs_ar"] = r["chrf"] / ar["chrf"]
        print(json.dumps({k: round(v, 3) if isinstance(v, float) else v for k, v in r.items()}))
    print(
        json.dumps(
            {"model": args.model, "prompts": len(prompts), "max_new_tokens": args.tokens, "rows": rows}
        )
    )


if __name__ == "__main__":
    main()
