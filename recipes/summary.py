"""Summarise a finished training run from its own files, for the model card.

Everything comes from the run folder (`train_config.json`, `log.jsonl`, `model/`): no number is typed
in by hand. Usage:

    python -m recipes.summary RUN_DIR --out RUN_DIR/stage1.json [--note "..."]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
from pathlib import Path

import torch

from yue.train.config import TrainConfig

# TrainConfig fields that `yue train` exposes as options (the rest are left at their defaults there).
CLI_FIELDS = (
    "corpus out tokenizer vocab_size steps seq_len batch_size lr warmup_steps block_size anchors alpha beta "
    "gamma reveal_prob hidden_size layers heads kv_heads intermediate_size eval_every save_every seed threads"
).split()


def equivalent_command(cfg: TrainConfig) -> str:
    """The `yue train ...` command line that reproduces `cfg` (fields the CLI does not expose must be defaults)."""
    default = TrainConfig()
    hidden = [f for f in ("min_lr_ratio", "weight_decay", "grad_clip", "val_fraction", "max_position_embeddings",
                          "eval_batches", "betas") if getattr(cfg, f) != getattr(default, f)]  # fmt: skip
    parts = ["yue train"]
    for name in CLI_FIELDS:
        value = getattr(cfg, name)
        if value is not None:
            parts.append(f"--{name.replace('_', '-')} {value}")
    if cfg.train_set == "nar":
        parts += ["--nar-only", f"--init {cfg.init}"]
    cmd = " ".join(parts)
    return cmd + (f"  # plus non-default {', '.join(hidden)} (see train_config.json)" if hidden else "")


def param_counts(model_dir: Path) -> dict[str, int]:
    """Parameters per set, read from the saved weights (embedding counted once: it is tied)."""
    from safetensors import safe_open

    counts = {"ar": 0, "nar": 0, "embedding": 0, "router": 0}
    with safe_open(str(model_dir / "model.safetensors"), framework="pt") as f:
        for key in f.keys():
            n = 1
            for d in f.get_slice(key).get_shape():
                n *= d
            if key.startswith("router."):
                counts["router"] += n
            elif ".nar_" in key:
                counts["nar"] += n
            elif "embed_tokens" in key or key == "lm_head.weight":
                counts["embedding"] = n
            else:
                counts["ar"] += n
    return counts


def summarize(run_dir: Path, note: str | None = None) -> dict:
    """The run's command, data, wall time, hardware, final evaluation and model size, as one dict."""
    cfg = TrainConfig.from_json(run_dir / "train_config.json")
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    starts = [r for r in records if r["kind"] == "start"]
    evals = [r for r in records if r["kind"] == "eval"]
    trains = [r for r in records if r["kind"] == "train"]
    done = [r for r in records if r["kind"] == "done"]
    if not done:
        raise ValueError(f"{run_dir} has not finished (no 'done' record in log.jsonl)")
    # elapsed_s restarts at 0 in each resumed segment: add up each segment's last value.
    elapsed = [r["elapsed_s"] for r in trains]
    train_s = sum(a for a, b in zip(elapsed, elapsed[1:], strict=False) if b < a) + done[-1]["wall_s"]
    model_dir = run_dir / "model"
    size = sum(p.stat().st_size for p in model_dir.iterdir() if p.is_file())
    return {
        "command": equivalent_command(cfg),
        "launched_as": " ".join(["python", *starts[0]["argv"]]),
        "segments": len(starts),
        "train_config": json.loads(cfg.to_json()),
        "data": starts[-1]["data"],
        "steps": done[-1]["step"],
        "tokens_seen": done[-1]["step"] * cfg.batch_size * cfg.seq_len * starts[-1]["world"],
        "wall_s": round(train_s, 1),
        "wall_clock_from_first_start_s": round(
            starts[-1]["time"] - starts[0]["time"] + done[-1]["wall_s"], 1
        ),
        "tokens_per_s_median": sorted(r["tok_s"] for r in trains)[len(trains) // 2],
        "hardware": {
            "cpus": os.cpu_count(),
            "torch_threads": starts[-1]["threads"],
            "machine": platform.machine(),
            "torch": torch.__version__,
        },
        "final_eval": evals[-1],
        "evals": evals,
        "params": param_counts(model_dir),
        "model_dir": str(model_dir),
        "model_bytes": size,
        "note": note,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("run_dir", type=Path)
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--note", default=None)
    args = parser.parse_args()
    args.out.write_text(json.dumps(summarize(args.run_dir, args.note), indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
