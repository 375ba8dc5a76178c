"""One top-layer NAR training run on a tiny model, on however many processes it is launched with.

Run in the test process itself (one process) or as
`accelerate launch --multi_gpu --num_processes N -m tests.dist_topnar RUN_DIR STEPS [STOP_AT]` (torchrun
underneath; on a machine without a GPU the processes talk over gloo); the main
process writes RUN_DIR/history.json; the trained tensors are in the run's last checkpoint
(`test_distributed.py` compares both).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch

from yue.config import YueConfig
from yue.model.mot import YueForCausalLM
from yue.train import topnar as tn

BATCH = 4  # the global batch: 2 rows per process on 2


def tiny_model() -> YueForCausalLM:
    """4 layers, a NAR set on the top 2, a 48-token drafting vocabulary; seeded, so equal everywhere."""
    torch.manual_seed(0)
    cfg = YueConfig(
        vocab_size=96,
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        block_size=4,
        nar_layers=2,
        draft_vocab_size=48,
        max_position_embeddings=128,
        eos_token_id=2,
        mask_token_id=3,
    )
    model = YueForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.3)
        model.draft_vocab.copy_(torch.arange(48) * 2)
    return model


def sequences(n: int, seed: int) -> tn.ChatSequences:
    """n prompt + answer sequences (20-40 tokens, prompts of 6) with some repetition to learn."""
    g = torch.Generator().manual_seed(seed)
    ids = []
    for _ in range(n):
        length = int(torch.randint(20, 41, (1,), generator=g))
        base = torch.randint(4, 96, (6,), generator=g).tolist()
        ids.append((base * 8)[:length])
    return tn.ChatSequences(ids, [6] * n)


def run(run_dir: str | Path, steps: int, stop_at: int | None = None, batch: int = BATCH) -> list[dict]:
    """Train (or resume) in `run_dir`, a checkpoint every step; returns the history (a loss per step)."""
    torch.set_num_threads(1)
    model = tiny_model()
    train, held = sequences(12, seed=1), sequences(2, seed=2)
    f_train, f_held = (
        tn.entry_features(model, train, progress=False),
        tn.entry_features(model, held, progress=False),
    )
    cfg = tn.TopNARConfig(
        steps=steps, batch_size=batch, anchors=4, lr=3e-3, warmup_steps=2, eval_every=1, seed=3
    )
    return tn.train_top_nar(
        model, train, f_train, held, f_held, cfg, run_dir, progress=False, stop_at=stop_at
    )


if __name__ == "__main__":
    out = Path(sys.argv[1])
    history = run(out, int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
    if os.environ.get("RANK", "0") == "0":
        (out / "history.json").write_text(json.dumps(history))
