"""The yue-smol campaign (issue 42): `yue.train.rounds` run from a command line, for as long as it is left
running, on a CPU or a lent GPU; round 5 of yue-smol's NAR set ran it (`recipes/yue_smol_round5.sh`).

    python -m recipes.yue_smol_campaign --dir D --base X.gguf --init yue/assets/yue-smol \
        --eval chat_test=yue/assets/chat_test.jsonl --calibration chat_test [...]

The same command resumes a campaign folder. `--export` writes the chunks made in this run (cut into
`--export-parts` files that `--import` reads elsewhere, e.g. a GPU round's answers carried to the CPU
campaign), the NAR folder and the log. Not part of the installed package.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import time
from pathlib import Path

import torch

from yue.train.rounds import Rounds, RoundsConfig, replace_dir, save_gz
from yue.train.topnar import TopNARConfig
from yue.train.topnar_run import save_nar_folder, top_nar_base


def export_chunks(campaign: Rounds, dest: str | Path, parts: int = 1, first: int = 0) -> list[Path]:
    """Chunks `first`.. of a campaign merged and cut into `parts` gzip JSON files (`import_sequences`
    reads each), e.g. to carry a GPU round's answers to the CPU campaign."""
    keys = ("ids", "prompt_lens", "kinds")
    merged: dict = {k: [] for k in keys}
    merged["hashes"], prompts = [], 0
    for n in range(first, campaign.state["chunks"]):
        c = campaign.chunk(n)
        for k in keys:
            merged[k] += c[k]
        merged["hashes"] += c.get("hashes", [])
        prompts += c["prompts"]
    size = -(-len(merged["ids"]) // parts)
    out = []
    for i in range(parts):
        part = {k: merged[k][i * size : (i + 1) * size] for k in keys}
        part["prompts"], part["hashes"] = (prompts, merged["hashes"]) if i == 0 else (0, [])
        path = Path(dest) / f"answers-{i + 1}-of-{parts}.json.gz"
        save_gz(part, path)
        out.append(path)
    return out


def _arguments(argv: list[str] | None) -> argparse.Namespace:
    """`main`'s command line."""
    ap = argparse.ArgumentParser(description=main.__doc__)
    ap.add_argument("--dir", required=True, help="campaign folder (created, or resumed)")
    ap.add_argument("--base", required=True, help="the AR set: a .gguf file or a model whose AR set is one")
    ap.add_argument("--init", required=True, help="the top-layer NAR folder the campaign starts from")
    ap.add_argument("--eval", action="append", default=[], metavar="NAME=JSONL", help="evaluation splits")
    ap.add_argument("--exclude", action="append", default=[], help="more JSONL chat sets never to train on")
    ap.add_argument("--calibration", required=True, help="the evaluation split that chooses best/")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=None, help="stop after this many rounds (default: never)")
    ap.add_argument("--data-for", type=float, default=None, help="seconds from start to make new chunks for")
    ap.add_argument("--stop-after", type=float, default=None, help="seconds from start to start rounds for")
    ap.add_argument("--import", dest="imports", action="append", default=[], help="answers-*.json.gz to add")
    ap.add_argument("--import-per-chunk", type=int, default=512, help="sequences per imported chunk")
    ap.add_argument(
        "--adopt", default=None, help="a NAR folder to continue from (replaces last/), e.g. a GPU round's"
    )
    ap.add_argument("--export", default=None, help="folder for this run's chunks and NAR folder at the end")
    ap.add_argument("--export-parts", type=int, default=2, help="files the exported answers are cut into")
    ap.add_argument("--chunk-prompts", type=int, default=RoundsConfig.chunk_prompts)
    ap.add_argument("--gen-batch", type=int, default=RoundsConfig.gen_batch_size)
    ap.add_argument("--window", type=int, default=RoundsConfig.window)
    ap.add_argument("--eval-prompts", type=int, default=RoundsConfig.eval_prompts)
    ap.add_argument("--steps", type=int, default=60, help="training steps per round")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--anchors", type=int, default=24)
    ap.add_argument("--lr", type=float, default=2e-4)
    ap.add_argument(
        "--slot-decay",
        type=float,
        default=TopNARConfig.slot_decay,
        help="slot i's loss weight ~ decay ** (i - 2): lower puts the rounds' weight on the first drafts",
    )
    ap.add_argument(
        "--kl-weight", type=float, default=TopNARConfig.kl_weight, help="KL(p_AR || p_slot) weight"
    )
    ap.add_argument("--max-new-tokens", type=int, default=RoundsConfig.max_new_tokens)
    ap.add_argument("--long-new-tokens", type=int, default=RoundsConfig.long_new_tokens)
    return ap.parse_args(argv)


def _config(a: argparse.Namespace) -> RoundsConfig:
    """The campaign's settings from its command line: a round trains at a constant learning rate after
    a short warm-up, and evaluates once, at its end."""
    return RoundsConfig(
        chunk_prompts=a.chunk_prompts,
        gen_batch_size=a.gen_batch,
        window=a.window,
        eval_prompts=a.eval_prompts,
        max_new_tokens=a.max_new_tokens,
        long_new_tokens=a.long_new_tokens,
        train=TopNARConfig(
            steps=a.steps,
            batch_size=a.batch_size,
            anchors=a.anchors,
            lr=a.lr,
            slot_decay=a.slot_decay,
            kl_weight=a.kl_weight,
            warmup_steps=max(1, min(20, a.steps // 10)),
            min_lr_ratio=1.0,
            eval_every=a.steps,
        ),
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m recipes.yue_smol_campaign --dir D --base X.gguf --init yue/assets/yue-smol [...]`: start or
    resume a campaign (the same command resumes it)."""
    a = _arguments(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    torch.set_num_threads(a.threads)
    t0 = time.perf_counter()
    evals = dict(e.split("=", 1) for e in a.eval)
    cfg = _config(a)
    base, _ = top_nar_base(a.base)
    if a.adopt:
        Path(a.dir).mkdir(parents=True, exist_ok=True)
        shutil.copytree(a.adopt, Path(a.dir) / "last.tmp")
        replace_dir(Path(a.dir) / "last.tmp", Path(a.dir) / "last")
    camp = Rounds(a.dir, base, a.init, evals, a.calibration, cfg, a.device, exclude=a.exclude)
    first_chunk = camp.state["chunks"]
    for path in a.imports:
        camp.import_sequences(path, a.import_per_chunk)

    def elapsed() -> float:
        return time.perf_counter() - t0

    done = 0
    try:
        while a.rounds is None or done < a.rounds:
            if a.stop_after is not None and elapsed() > a.stop_after:
                break
            camp.run_round(make_data=a.data_for is None or elapsed() < a.data_for)
            done += 1
    finally:  # what was made is exported even if a round fails
        if a.export:
            export(camp, Path(a.export), first_chunk, a.export_parts)


def export(camp: Rounds, dest: Path, first_chunk: int, parts: int) -> None:
    """The chunks made since `first_chunk`, the current NAR folder (15 MiB shards) and the log, in `dest`."""
    dest.mkdir(parents=True, exist_ok=True)
    if camp.state["chunks"] > first_chunk:
        export_chunks(camp, dest, parts=parts, first=first_chunk)
    save_nar_folder(camp.model, dest / "nar", {"base": str(camp.base)}, max_shard_bytes=15 << 20)
    shutil.copy(camp.dir / "log.jsonl", dest / "log.jsonl")


if __name__ == "__main__":
    main()
