"""Teacher-forced drafting quality of yue-smol through the decode path, one drafting precision against
another (a development script, not part of the package).

    python docs/recipes/drafting_tau.py [split] [prompts] [dtypes] [models]

For each of the first `prompts` (default 16) chat prompts of `yue/assets/<split>.jsonl` (default
`chat_test`, the held-out split), yue's own greedy `ar` answer (128 tokens); then, at every answer
position, one drafting pass of each engine exactly as `verified` runs it (K slots after the anchor,
slot 1 revealed as the answer's next token) on a cache holding the prompt and the answer. Prints
tau = 1 + the mean number of leading slots 2..K that match the answer, and P(slots 2..i all match).
`dtypes`: comma-separated `nar_dtype`s (default `int8,float32`: the shipped int8 drafting against
float32 drafting). `models`: comma-separated model names or folders (default `yue-smol`), each drafting
in every dtype, e.g. the shipped NAR set against a candidate folder. The same answers (the first
model's `ar`; the AR set is the same GGUF) feed every engine, so the figures compare the drafts alone.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

import yue
from yue.model.masks import decode_mask


def main(
    split: str = "chat_test", n_prompts: int = 16, dtypes: str = "int8,float32", models: str = "yue-smol"
) -> None:
    torch.set_num_threads(1)
    path = Path(yue.__file__).parent / "assets" / f"{split}.jsonl"
    prompts = [json.loads(line) for line in path.read_text().splitlines() if line.strip()][:n_prompts]
    engines = {
        f"{model} {name}": yue.load(model, nar_dtype=name)
        for model in models.split(",")
        for name in dtypes.split(",")
    }
    first = next(iter(engines.values()))
    K = first.model.config.block_size
    totals = {name: [0, 0, torch.zeros(K - 1)] for name in engines}  # accepted, blocks, P(2..i)
    for p in prompts:
        text = first.chat_prompt(p["messages"])
        ids = list(first.encode(text))
        answer = first.generate(text, mode="ar", max_new_tokens=128).token_ids
        seq = torch.tensor([ids + list(answer)])
        P, T = len(ids), seq.shape[1]
        for name, engine in engines.items():
            accepted, blocks, runs = drafts_along(engine.model, seq, P, T, K)
            totals[name][0] += accepted
            totals[name][1] += blocks
            totals[name][2] += runs
    for name, (accepted, blocks, runs) in totals.items():
        print(
            f"{name}: tau {1 + accepted / blocks:.3f} over {blocks} blocks; "
            f"P(slots 2..i all match) {[round(float(r / blocks), 3) for r in runs]}"
        )


@torch.inference_mode()
def drafts_along(model, seq: torch.Tensor, P: int, T: int, K: int) -> tuple[int, int, torch.Tensor]:
    """One drafting pass at each answer position c (anchor c - 1, slot 1 = seq[c]) of a cache holding
    all of seq; the slots' K/V rows are put back after each pass. Returns (accepted drafts, blocks,
    per-slot counts of leading matches)."""
    cache = model.new_cache(1, T + K + 2)
    pos = torch.arange(cache.capacity)
    prefill = model.step(seq, pos[:T], T, decode_mask(0, T, 0, cache.key_valid), cache, 1)
    cache.advance(T)
    top = model.trained.model.nar_start  # a drafting pass writes K/V in the NAR layers only
    accepted, blocks, runs = 0, 0, torch.zeros(K - 1)
    for c in range(P, T - 1):
        saved = cache.k[top:, :, :, c : c + K].clone(), cache.v[top:, :, :, c : c + K].clone()
        cache.length = c
        slots = torch.full((1, K), model.config.mask_token_id, dtype=torch.long)
        slots[0, 0] = seq[0, c]
        mask = decode_mask(c, 0, K, cache.key_valid)
        out = model.step(slots, pos[c : c + K], 0, mask, cache, 0, prefill.entry[:, c - 1 : c])
        cache.k[top:, :, :, c : c + K], cache.v[top:, :, :, c : c + K] = saved
        target = seq[0, c + 1 : c + K]
        lead = (out.slot_logits[0, 1 : 1 + len(target)].argmax(-1) == target).long().cumprod(0)
        accepted, blocks = accepted + int(lead.sum()), blocks + 1
        runs[: len(lead)] += lead.float()
    return accepted, blocks, runs


if __name__ == "__main__":
    args = sys.argv[1:]
    main(args[0] if args else "chat_test", int(args[1]) if len(args) > 1 else 16, *args[2:4])
