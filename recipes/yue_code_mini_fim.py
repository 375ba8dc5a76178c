"""yue-code-mini fine-tuned for fill-in-the-middle (issue 63): FIM tokens added, then the joint loss on
a mix of FIM and left-to-right rows of the standard library, resumable, one thread.

    python -m recipes.yue_code_mini_fim --out runs/yue-code-mini-fim --steps 700 [--resume]

What it makes: `<out>/init` (yue-code-mini with StarCoder's three FIM tokens added as special tokens,
ids 4096-4098, and three new embedding rows set to the mean row), `<out>/checkpoints/step-*`,
`<out>/log.jsonl`, and `<out>/model` (the fine-tuned folder, which `yue.load` and `yue serve` read and
whose tokenizer `yue.infill` finds the FIM tokens in).

Design decisions:
- Data: the training split of the same corpus yue-code-mini trained on (the running interpreter's
  standard library minus test folders, `yue.train.data`), never the bench's held-out packages
  (`yue.bench.devset.HELD_OUT_PACKAGES`) that the infill eval cuts.
- Rows: `yue.train.fim_data.FimBatches` (half FIM rows, of which a fifth SPM; half left-to-right), so
  the left-to-right task keeps training.
- Loss: the library's joint loss (`yue.train.losses.joint_loss`) over both sets, NAR blocks at random
  anchors of every row, so the NAR set learns to draft inside FIM prompts too. Its weights lean to the
  KL term (β 0.4, γ 0.6 against the library's 0.8 / 0.2): this NAR set was self-distilled on the AR
  path's own outputs, and KL to the AR path's distribution is the part of the joint loss that keeps it
  drafting what verification accepts; slot 1 is revealed in 90% of blocks, as decoding's drafting pass
  shows a block (the self-distillation rounds' setting).
- The router is not retrained (it is not consulted by `verified` unless a threshold is given).
- Each step's rows, anchors and reveals are pure functions of (seed, step), so `--resume` from the
  newest checkpoint replays the run an uninterrupted one would have made.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ASSET = Path(__file__).resolve().parent.parent / "yue" / "assets" / "yue-code-mini"


@dataclass(frozen=True)
class FimRun:
    """The run's settings (also the `Trainer`'s `Optimization`)."""

    steps: int = 700
    batch_size: int = 16
    seq_len: int = 256
    lr: float = 1e-3
    warmup_steps: int = 30
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    anchors: int = 8
    reveal_prob: float = 0.1
    reveal_first: float = 0.9
    ar_weight: float = 1.0
    nar_weight: float = 0.4
    kl_weight: float = 0.6
    fim_rate: float = 0.5
    spm_rate: float = 0.2
    seed: int = 63
    base: str = str(ASSET)


def make_init(base: Path, out: Path) -> Path:
    """`out`: the base model with FIM tokens added and its embedding grown to the new vocabulary."""
    from yue.model.hf import load_model
    from yue.tokenizer import YueTokenizer
    from yue.train.fim_data import add_fim_tokens, grow_vocab
    from yue.train.loop import save_final_model

    if (out / "model.safetensors").is_file():
        return out
    model, tokenizer = load_model(base), YueTokenizer.load(base)
    add_fim_tokens(tokenizer)
    grow_vocab(model, tokenizer.vocab_size)
    return save_final_model(model, tokenizer, out)


def train(
    out: Path, run: FimRun, resume: bool, threads: int, save_every: int, reschedule: bool = False
) -> Path:
    """Train (or resume) the run in `out`; returns `<out>/model`."""
    import torch

    from yue.model.hf import load_model
    from yue.tokenizer import YueTokenizer
    from yue.train.data import PackedSequences, cached_tokens, read_stdlib, split_documents
    from yue.train.fim_data import FimBatches, FimSettings, find_fim_tokens
    from yue.train.loop import save_final_model
    from yue.train.losses import (
        LossWeights,
        TrainingForward,
        draw_reveals,
        joint_loss,
        sample_anchors,
        set_trainable,
    )
    from yue.train.trainer import Trainer, append_jsonl, check_resume_settings, step_generator

    torch.set_num_threads(threads)
    out.mkdir(parents=True, exist_ok=True)
    settings = json.loads(json.dumps(asdict(run)))
    if resume:  # `reschedule`: a new total of steps, the cosine from the checkpoint on over it (logged)
        check_resume_settings(out / "run.json", settings, {"steps"} if reschedule else ())
    (out / "run.json").write_text(json.dumps(settings, indent=2))
    init = make_init(Path(run.base), out / "init")
    tokenizer = YueTokenizer.load(init)
    train_docs, _ = split_documents(read_stdlib(), 0.02)  # yue-code-mini's own split
    tokens = cached_tokens(train_docs, tokenizer, run.seed, out / "data" / "train.npy")
    stream = PackedSequences(tokens, run.seq_len, run.seed)
    fim = find_fim_tokens(tokenizer)
    mix = FimSettings(fim_rate=run.fim_rate, spm_rate=run.spm_rate)
    batches = FimBatches([d.text for d in train_docs], stream, tokenizer, fim, run.seed, mix)
    model = load_model(init).train()
    K = model.config.block_size
    weights = LossWeights(run.ar_weight, run.nar_weight, run.kl_weight)
    trainer = Trainer(
        TrainingForward(model), set_trainable(model, "all"), run, run.batch_size, saved=model, run_dir=out
    )
    start = trainer.resume()["step"] if resume else 0
    log, t0 = out / "log.jsonl", time.time()
    append_jsonl(
        log,
        {
            "kind": "start",
            "step": start,
            "argv": sys.argv,
            "threads": threads,
            "steps": run.steps,
            "train_files": len(train_docs),
            "train_tokens": int(len(tokens)),
            "time": t0,
        },
    )
    for step in range(start, run.steps):
        g = step_generator(run.seed, step)
        x, n_fim = batches.batch(step, run.batch_size)  # (B, T)
        anchors = sample_anchors(run.batch_size, run.seq_len, run.anchors, K, g)  # (B, M)
        reveal = draw_reveals(run.batch_size, run.anchors, K, run.reveal_prob, g, run.reveal_first)
        loss = joint_loss(trainer.net, x, anchors, K, weights, reveal=reveal)
        slots, _ = trainer.global_mean(loss.slot_sum, loss.nar_count_per_slot.sum())
        norm = trainer.update(loss.ar_term + slots, step)
        done = step + 1
        if done % 10 == 0 or done == run.steps:
            append_jsonl(
                log,
                {
                    "kind": "train",
                    "step": done,
                    "ar": round(float(loss.ar), 4),
                    "nar": round(float(loss.nar), 4),
                    "kl": round(float(loss.kl), 4),
                    "fim_rows": n_fim,
                    "grad_norm": round(norm, 3),
                    "elapsed_s": round(time.time() - t0, 1),
                },
            )
        if done % save_every == 0 or done == run.steps:
            trainer.save(done, {"seed": run.seed})
    model.config.loss_weights = weights.as_dict()
    final = save_final_model(model, tokenizer, out / "model")
    append_jsonl(log, {"kind": "done", "step": run.steps, "wall_s": round(time.time() - t0, 1)})
    return final


def export(out: Path, step: int, dest: Path) -> Path:
    """A model folder `dest` from the run's checkpoint after `step` steps (to measure a run midway)."""
    from safetensors.torch import load_model as load_tensors

    from yue.model.hf import load_model
    from yue.tokenizer import YueTokenizer
    from yue.train.loop import save_final_model

    model = load_model(out / "init")
    load_tensors(model, str(out / "checkpoints" / f"step-{step:06d}" / "model.safetensors"))
    run = json.loads((out / "run.json").read_text())
    model.config.loss_weights = {"ar": run["ar_weight"], "nar": run["nar_weight"], "kl": run["kl_weight"]}
    return save_final_model(model, YueTokenizer.load(out / "init"), dest)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--steps", type=int, default=FimRun.steps)
    ap.add_argument("--lr", type=float, default=FimRun.lr)
    ap.add_argument("--seed", type=int, default=FimRun.seed)
    ap.add_argument("--base", default=FimRun.base, help="the model folder to fine-tune")
    ap.add_argument("--resume", action="store_true", help="continue from the newest checkpoint in --out")
    ap.add_argument(
        "--reschedule", action="store_true", help="with --resume: a new --steps (the lr's cosine over it)"
    )
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--save-every", type=int, default=50)
    ap.add_argument("--export", type=int, metavar="STEP", help="only write --export-to from this checkpoint")
    ap.add_argument("--export-to", type=Path)
    a = ap.parse_args(argv)
    if a.export is not None:
        print(export(a.out, a.export, a.export_to or a.out / f"model-step-{a.export}"))
        return
    run = FimRun(steps=a.steps, lr=a.lr, seed=a.seed, base=a.base)
    print(train(a.out, run, a.resume, a.threads, a.save_every, a.reschedule))


if __name__ == "__main__":
    main()
