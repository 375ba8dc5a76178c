"""Issue 47: held-out teacher-forced figures of models trained alike (the router comparison).

For each model folder: on the first LIMIT examples of yue/assets/code_test.jsonl (held-out code: prompt + true reference), the AR
path's mean NLL per reference token (teacher-forced), and the NAR set's per-slot argmax accuracy of
blocks anchored at every STRIDE-th reference position (slots masked, none revealed). Prints one JSON line.

    PYTHONPATH=. python docs/recipes/issue47_heldout.py MODEL_DIR [MODEL_DIR ...]
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from yue.model.hf import load_model
from yue.tokenizer import YueTokenizer
from yue.train.losses import joint_loss

TEST = Path(__file__).resolve().parents[2] / "yue" / "assets" / "code_test.jsonl"
MAX_TOKENS = 256  # prompt tail + reference kept per example
STRIDE = 8  # reference positions between NAR blocks (every one: 8x the work, on a busy 2-core machine)
LIMIT = 20  # examples (the first of the file)


@torch.no_grad()
def heldout(folder: str) -> dict:
    model = load_model(folder).eval()
    tok = YueTokenizer.load(folder)
    K = model.config.block_size
    nll, n_ref = 0.0, 0
    hits, counts = torch.zeros(K), torch.zeros(K)
    for line in TEST.read_text().splitlines()[:LIMIT]:
        row = json.loads(line)
        p, r = tok.encode(row["prompt"]), tok.encode(row["reference"])
        r = r[: MAX_TOKENS // 2]
        p = p[-(MAX_TOKENS - len(r)) :]
        x = torch.tensor([p + r])
        logp = model(x).logits.float().log_softmax(-1)[0]  # (T, V)
        targets = x[0, len(p) :]
        nll -= float(logp[len(p) - 1 : -1].gather(-1, targets[:, None]).sum())
        n_ref += len(r)
        anchors = torch.arange(len(p) - 1, x.shape[1] - K - 1, STRIDE)[
            None
        ]  # blocks predicting reference tokens
        if anchors.shape[1]:
            out = joint_loss(model, x, anchors, K, reveal_prob=0.0)
            hits += out.nar_acc_per_slot * out.nar_count_per_slot
            counts += out.nar_count_per_slot
    acc = (hits / counts.clamp(min=1)).tolist()
    return {"model": folder, "ar_nll_per_token": round(nll / n_ref, 4), "reference_tokens": n_ref,
            "nar_acc_per_slot": [round(a, 4) for a in acc]}  # fmt: skip


if __name__ == "__main__":
    print(json.dumps([heldout(f) for f in sys.argv[1:]]))
