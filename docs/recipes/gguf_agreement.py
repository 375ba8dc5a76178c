"""Recipe: does a GGUF in its own codes (yue's `file` precision) write llama.cpp's greedy tokens?

For each of N held-out chat prompts (default `yue/assets/chat_test.jsonl`, templated, the same prompt ids
for both), greedy, `--tokens` new tokens, one thread each: yue `ar` in the file precision against
llama-cpp-python on the same file; and, where the model has a NAR set, yue `verified` against yue `ar`.
Prints per prompt the length of the common prefix, then the rates, then one JSON line.

Why they can differ where both are right: both quantize activations to int8 per block, but the kernels
sum in different orders (llama.cpp: per-thread partial sums and its own SIMD reductions) and llama.cpp
quantizes some activations differently (the attention's K/V in F16); a near-tie between two tokens can
then fall either way, and greedy decoding parts from there on.

Run: python docs/recipes/gguf_agreement.py yue-smol --prompts 20 --tokens 32
     python docs/recipes/gguf_agreement.py path/to/model.gguf
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch

import yue
from yue.bench import llamacpp
from yue.bench.prompts import load_prompts
from yue.decode.sources import common_prefix
from yue.model.hf import model_files
from yue.registry import resolve


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a name (yue-smol, gemma-3-270m) or a .gguf file")
    ap.add_argument("--prompts-file", default=str(Path(yue.__file__).parent / "assets" / "chat_test.jsonl"))
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = yue.load(args.model, dtype="file", threads=1)
    files = model_files(resolve(args.model))
    llm = llamacpp.load(files.gguf, n_ctx=2048, threads=1)
    runner = llamacpp.LlamaCppRunner(llm, engine.tokenizer, {engine.tokenizer.eos_id}, args.tokens)
    prompts = load_prompts(Path(args.prompts_file), engine)[: args.prompts]
    rows = []
    for p in prompts:
        ours = engine.generate(p.text, mode="ar", max_new_tokens=args.tokens, temperature=0).token_ids
        theirs, _, _ = runner.generate(p.ids)
        row = {
            "prompt": p.text[:50],
            "ar": len(ours),
            "llamacpp": len(theirs),
            "common": common_prefix(ours, theirs),
        }
        if engine.has_nar_set:
            row["verified_equals_ar"] = (
                engine.generate(p.text, mode="verified", max_new_tokens=args.tokens, temperature=0).token_ids
                == ours
            )
        row["identical"] = ours == theirs
        rows.append(row)
        print(row, flush=True)
    summary = {
        "model": args.model,
        "prompts": len(rows),
        "tokens": args.tokens,
        "identical_to_llamacpp": sum(r["identical"] for r in rows),
        "mean_common_prefix": sum(r["common"] for r in rows) / len(rows),
        "verified_equals_ar": sum(r.get("verified_equals_ar", False) for r in rows)
        if engine.has_nar_set
        else None,
        "layout": engine.model.paths.layout,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
