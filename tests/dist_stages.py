"""Two training stages on tiny models, on however many processes this is launched with: top-layer NAR
distillation (`run`, checkpointed every step), the drafts refresh's NAR self-distillation
(`run_refresh`) and `yue train`'s joint loop (`run_joint`).

Called in the test process (one process), or launched as
`accelerate launch --multi_gpu --num_processes N -m tests.dist_stages RUN_DIR STEPS [STOP_AT]`
(torchrun underneath; without a GPU the processes talk over gloo), or with `--use_fsdp --fsdp_version 2`
instead of `--multi_gpu`, when the main process writes RUN_DIR/history.json and RUN_DIR/refresh.json,
the joint loop its model in RUN_DIR/joint/run/model, and RUN_DIR/joint_refused.json the error that
refused the joint loop (under FSDP) or null (`test_distributed.py` compares them, and the runs'
checkpoints, with one process's).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
from accelerate import PartialState

from tests.test_topnar import top_model
from yue.train import topnar as tn
from yue.train.loop import train
from yue.train.selfdistill import GreedySequences, NARFinetuneConfig, finetune_nar

BATCH = 4  # the global batch: 2 rows per process on 2


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
    model = top_model()  # 4 layers, a NAR set on the top 2, a 48-token drafting vocabulary; seeded
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


def run_refresh(steps: int) -> list[dict]:
    """The drafts refresh's NAR self-distillation (`finetune_nar`, a NAR set in every layer) on fixed
    sequences; returns its per-step log."""
    torch.set_num_threads(1)
    model = top_model(nar_layers=None, draft_vocab=None)  # a NAR set in every layer
    tokens = torch.tensor([(s * 8)[:24] for s in sequences(12, seed=4).ids])  # (12, 24)
    cfg = NARFinetuneConfig(steps=steps, batch_size=BATCH, anchors=4, lr=1e-3, warmup_steps=2, seed=5)
    return finetune_nar(model, GreedySequences(tokens, prompt_len=6), cfg, progress=False)


def run_joint(folder: Path) -> Path:
    """`yue train`'s joint loop (8 steps, global batch 4) with its run in `folder/run`; returns the final
    model folder. The main process writes the corpus first."""
    from tests.test_train import tiny_train_config

    with PartialState().main_process_first():
        cfg = tiny_train_config(folder, steps=8, save_every=4, eval_every=8)
    return train(cfg)


if __name__ == "__main__":
    out = Path(sys.argv[1])
    out.mkdir(parents=True, exist_ok=True)
    history = run(out, int(sys.argv[2]), int(sys.argv[3]) if len(sys.argv) > 3 else None)
    refresh = run_refresh(int(sys.argv[2]))
    refused = None
    try:
        run_joint(out / "joint")
    except ValueError as e:  # under FSDP: `yue train`'s joint loop runs under DDP only
        refused = str(e)
    if os.environ.get("RANK", "0") == "0":
        (out / "history.json").write_text(json.dumps(history))
        (out / "refresh.json").write_text(json.dumps(refresh))
        (out / "joint_refused.json").write_text(json.dumps(refused))
