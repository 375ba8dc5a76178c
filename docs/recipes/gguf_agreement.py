"""Recipe: does a GGUF in its own codes (yue's `file` precision) write what a float reference writes, as
closely as llama.cpp on the same file does?

For each of N held-out chat prompts (default `yue/assets/chat_test.jsonl`, templated, the same prompt ids
for every writer), greedy, `--tokens` new tokens, one thread each, four writers:
- `file`: yue `ar` in the file precision (the file's codes, activations in int8 per block);
- `llama.cpp`: llama-cpp-python on the same file (its codes, its int8 activations);
- `float32`: yue `ar` on the file's weights dequantized to float32;
- `transformers`: transformers' own class of the family on those float32 weights (`bench.runners.load_peers`).
Prints, for every pair, how many outputs are identical and the mean length of their common prefix, then one
JSON line (also written to `--out`). Where the model has a NAR set, also whether yue `verified` writes yue
`ar`'s tokens in the file precision.

Greedy outputs part at the first near-tie, so the recipe also measures each step's distribution,
teacher-forced on `float32`'s own answers, one token a step as decoding runs: for `file` and `llama.cpp`
(a second llama-cpp-python instance with every row's logits), the share of positions whose argmax is
float32's, and KL(float32 || writer) per position (mean, median, 95th percentile).

How to read it: `float32` against `transformers` checks yue's layers (they should agree everywhere);
`file` and `llama.cpp` against `transformers` are two int8-activation kernels' distance from the float
reference. Where both are right they still differ: they sum in different orders and llama.cpp keeps the
attention's K/V in F16, so a near-tie between two tokens can fall either way, and greedy decoding parts
from there on.

Run: python docs/recipes/gguf_agreement.py yue-smol --prompts 20 --tokens 32 --out docs/results/x.json
     python docs/recipes/gguf_agreement.py path/to/model.gguf
"""

from __future__ import annotations

import argparse
import itertools
import json
import platform
import tempfile
from pathlib import Path

import numpy as np
import torch

import yue
from yue.bench import llamacpp
from yue.bench.prompts import load_prompts
from yue.bench.runners import load_peers
from yue.decode.sources import common_prefix
from yue.model.hf import model_files
from yue.model.masks import decode_mask
from yue.registry import resolve


def yue_logits(engine, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """(len(answer), V) float32 logits of each answer position: the prompt prefilled, then one token a step."""
    model = engine.model
    cache = model.new_cache(1, len(prompt) + len(answer) + 1)
    n = len(prompt)
    mask = decode_mask(0, n, 0, cache.key_valid, model.device)
    rows = [model.step(torch.tensor([prompt]), torch.arange(n), n, mask, cache, 1).ar_logits[0, -1]]
    cache.advance(n)
    for token in answer[:-1]:
        mask = decode_mask(cache.length, 1, 0, cache.key_valid, model.device)
        out = model.step(torch.tensor([[token]]), cache.positions(torch.arange(1)), 1, mask, cache, 1)
        cache.advance(1)
        rows.append(out.ar_logits[0, -1])
    return torch.stack(rows).float()


def llamacpp_logits(llm, prompt: list[int], answer: list[int]) -> torch.Tensor:
    """The same from a `Llama` built with `logits_all=True`: the prompt evaluated, then one token a call."""
    llm.reset()
    llm.eval(prompt)
    rows = [np.array(llm.scores[len(prompt) - 1])]
    for token in answer[:-1]:
        llm.eval([token])
        rows.append(np.array(llm.scores[llm.n_tokens - 1]))
    return torch.tensor(np.stack(rows)).float()


def fidelity(reference: torch.Tensor, logits: torch.Tensor) -> tuple[list[float], int]:
    """Per position KL(reference || logits) in nats, and how many positions share the reference's argmax."""
    ref, lp = torch.log_softmax(reference, -1), torch.log_softmax(logits, -1)
    kl = (ref.exp() * (ref - lp)).sum(-1)
    return kl.tolist(), int((lp.argmax(-1) == ref.argmax(-1)).sum())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("model", help="a name (yue-smol, gemma-3-270m) or a .gguf file")
    ap.add_argument("--prompts-file", default=str(Path(yue.__file__).parent / "assets" / "chat_test.jsonl"))
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--out", type=Path, help="also write the JSON line here")
    args = ap.parse_args()
    torch.set_num_threads(1)
    engine = yue.load(args.model, dtype="file", threads=1)
    reference = yue.load(args.model, dtype="float32", threads=1)
    gguf = model_files(resolve(args.model)).gguf
    llm = llamacpp.load(gguf, n_ctx=2048, threads=1)
    runner = llamacpp.LlamaCppRunner(llm, engine.tokenizer, {engine.tokenizer.eos_id}, args.tokens)
    scorer = llamacpp.load(gguf, n_ctx=2048, threads=1, logits_all=True)  # the teacher-forced peer
    kl: dict[str, list[float]] = {"file": [], "llama.cpp": []}
    top1 = dict.fromkeys(kl, 0)
    prompts = load_prompts(Path(args.prompts_file), engine)[: args.prompts]
    eos = engine.tokenizer.eos_id
    outputs: dict[str, list[list[int]]] = {"file": [], "llama.cpp": [], "float32": [], "transformers": []}
    verified_equals_ar = 0
    with tempfile.TemporaryDirectory() as tmp:
        peer = load_peers(args.model, "cpu", tmp)[0]
        for p in prompts:
            greedy = {"mode": "ar", "max_new_tokens": args.tokens, "temperature": 0}
            outputs["file"].append(engine.generate(p.text, **greedy).token_ids)
            outputs["llama.cpp"].append(runner.generate(p.ids)[0])
            outputs["float32"].append(reference.generate(p.text, **greedy).token_ids)
            ids = torch.tensor([p.ids])
            out = peer.generate(
                ids, max_new_tokens=args.tokens, do_sample=False, eos_token_id=eos, pad_token_id=eos
            )
            outputs["transformers"].append(out[0, len(p.ids) :].tolist())
            answer = outputs["float32"][-1]
            ref = yue_logits(reference, p.ids, answer)
            for name, logits in (
                ("file", yue_logits(engine, p.ids, answer)),
                ("llama.cpp", llamacpp_logits(scorer, p.ids, answer)),
            ):
                per_position, same = fidelity(ref, logits)
                kl[name] += per_position
                top1[name] += same
            if engine.has_nar_set:
                verified = engine.generate(p.text, **(greedy | {"mode": "verified"})).token_ids
                verified_equals_ar += verified == outputs["file"][-1]
    pairs = {}
    for a, b in itertools.combinations(outputs, 2):
        prefixes = [common_prefix(x, y) for x, y in zip(outputs[a], outputs[b], strict=True)]
        identical = sum(x == y for x, y in zip(outputs[a], outputs[b], strict=True))
        mean = sum(prefixes) / len(prompts)
        pairs[f"{a} vs {b}"] = {"identical": identical, "mean_common_prefix": mean, "prefixes": prefixes}
        print(f"{a:>12} vs {b:<12} identical {identical}/{len(prompts)}, mean common prefix {mean:.1f}")
    summary = {
        "model": args.model,
        "prompts": len(prompts),
        "tokens": args.tokens,
        "pairs": pairs,
        "teacher_forced_on_float32": {
            name: {
                "positions": len(kl[name]),
                "top1_agreement": top1[name] / len(kl[name]),
                "mean_kl": float(np.mean(kl[name])),
                "median_kl": float(np.median(kl[name])),
                "p95_kl": float(np.percentile(kl[name], 95)),
            }
            for name in kl
        },
        "verified_equals_ar": verified_equals_ar if engine.has_nar_set else None,
        "layout": engine.model.paths.layout,
        "machine": platform.processor() or platform.machine(),
    }
    for name, f in summary["teacher_forced_on_float32"].items():
        print(
            f"{name:>12}: argmax = float32's at {f['top1_agreement']:.1%} of {f['positions']} positions, "
            f"KL mean {f['mean_kl']:.5f}, median {f['median_kl']:.5f}, p95 {f['p95_kl']:.5f} nats"
        )
    line = json.dumps(summary)
    print(line)
    if args.out:
        args.out.write_text(line + "\n")


if __name__ == "__main__":
    main()
