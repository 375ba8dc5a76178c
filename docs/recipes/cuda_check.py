"""A device check on a CUDA GPU, where one is lent (the code is device-agnostic; CI has no GPU).

yue-code-mini on the GPU, greedy, held-out code prompts (`yue/assets/code_test.jsonl`): `verified`'s
output must equal `ar`'s token for token, in float32 and bfloat16 (each precision exact against itself),
and each mode's tokens/s is reported against `ar` in the same run. Then a few training steps of a tiny
model's AR loss on the GPU, which must fall. Prints one JSON document. `--device cpu` dry-runs it.

    python docs/recipes/cuda_check.py [--prompts 8] [--new-tokens 64] [--out results.json]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

import yue

ROOT = Path(__file__).resolve().parents[2]


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def prompts(n: int) -> list[str]:
    lines = (ROOT / "yue" / "assets" / "code_test.jsonl").read_text().splitlines()
    return [json.loads(line)["prompt"] for line in lines[:n]]


def decode_check(device: str, dtype: str, texts: list[str], new_tokens: int) -> dict:
    """Each mode's outputs and time over the prompts, one request at a time."""
    engine = yue.load("yue-code-mini", device=device, dtype=dtype)
    for mode in ("ar", "verified", "hybrid"):  # CUDA context, kernels, the step costs' measuring: not timed
        engine.generate(texts[0], mode=mode, max_new_tokens=8)
    out = {}
    for mode in ("ar", "verified", "hybrid"):
        sync(device)
        t0, ids, n = time.perf_counter(), [], 0
        for text in texts:
            r = engine.generate(text, mode=mode, max_new_tokens=new_tokens)
            ids.append(r.token_ids)
            n += len(r.token_ids)
        sync(device)
        out[mode] = {"tokens": n, "seconds": time.perf_counter() - t0, "ids": ids}
    ar = out["ar"]
    return {
        "dtype": dtype,
        "verified_equals_ar": out["verified"]["ids"] == ar["ids"],
        "hybrid_tokens_equal_share": sum(a == b for a, b in zip(out["hybrid"]["ids"], ar["ids"], strict=True))
        / len(texts),
        **{
            f"{m}_speed_vs_ar": (out[m]["tokens"] / out[m]["seconds"]) / (ar["tokens"] / ar["seconds"])
            for m in ("verified", "hybrid")
        },
        "ar_tokens_per_s": ar["tokens"] / ar["seconds"],
    }


def train_check(device: str) -> dict:
    """A tiny model's AR loss over a few steps: it must fall."""
    from yue.config import YueConfig
    from yue.model import YueForCausalLM

    torch.manual_seed(0)
    config = YueConfig(vocab_size=64, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                       num_attention_heads=4, block_size=4)  # fmt: skip
    model = YueForCausalLM(config).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.arange(64, device=device).repeat(8, 2)[:, :48] % 64  # a learnable pattern
    losses = []
    for _ in range(30):
        loss = model(input_ids=data, labels=data).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return {"first_loss": losses[0], "last_loss": losses[-1], "falls": losses[-1] < losses[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--out", type=Path, default=None)
    parser.add_argument("--device", default="cuda")
    args = parser.parse_args()
    if args.device == "cuda" and not torch.cuda.is_available():
        raise SystemExit("no CUDA device here")
    texts = prompts(args.prompts)
    doc = {
        "device": torch.cuda.get_device_name() if args.device == "cuda" else args.device,
        "torch": torch.__version__,
        "prompts": len(texts),
        "new_tokens": args.new_tokens,
        "decode": [decode_check(args.device, d, texts, args.new_tokens) for d in ("float32", "bfloat16")],
        "train": train_check(args.device),
    }
    text = json.dumps(doc, indent=1)
    print(text)
    if args.out:
        args.out.write_text(text + "\n")


if __name__ == "__main__":
    main()
