"""The training loop: joint loss, AdamW with warm-up + cosine, evaluation, atomic checkpoints, resume.

Design decisions:
- Deterministic by construction: the global batch of step s is a pure function of (seed, s)
  (`PackedSequences`), and its anchors/reveals come from a generator seeded by (seed, s). So the data
  position is the step counter, and a run resumed from a checkpoint replays exactly the steps an
  uninterrupted run would have taken (tested bit-identical on CPU), on any number of processes.
- Optimizer, learning-rate schedule (`lr_at`), checkpoints and the `accelerate.Accelerator` that wraps
  the training forward (`TrainingForward`) come from `trainer.Trainer`, so `accelerate launch` (DDP)
  runs this same entry point; `batch_size` is the global batch, of which each process takes its rows.
- Files in the run folder: `train_config.json`, `tokenizer.json`, `data/*.npy` (token cache),
  `log.jsonl` (train and eval records), `checkpoints/step-*`, and `model/` (the final model folder:
  safetensors + config + tokenizer.json), written atomically at the end.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from yue.model.anchors import AnchorHead
from yue.model.experts import EXPERT_NAMES, N_EXPERTS
from yue.model.hf import load_model
from yue.model.mot import YueForCausalLM
from yue.tokenizer import YueTokenizer
from yue.train.anchor import anchor_loss
from yue.train.checkpoint import latest_checkpoint
from yue.train.config import TrainConfig
from yue.train.data import PackedSequences, cached_tokens, read_corpus, split_documents
from yue.train.losses import (
    JointLoss,
    TrainingForward,
    draw_reveals,
    joint_loss,
    sample_anchors,
    set_trainable,
)
from yue.train.trainer import (
    Trainer,
    append_jsonl,
    check_resume_settings,
    lr_at,
    make_accelerator,
    step_generator,
)

log = logging.getLogger(__name__)

# Fields that may differ between a run and its resumption without changing the weights it reaches.
RESUME_FREE_FIELDS = frozenset(
    {"threads", "eval_every", "eval_batches", "save_every", "log_every", "keep_checkpoints"}
)


@dataclass
class EvalResult:
    """Validation metrics. nar_acc_per_slot[i] is slot i+1's argmax accuracy (mask inputs only)."""

    ar_loss: float
    nar_loss: float
    nar_acc_per_slot: list[float]


def prepare_tokenizer(cfg: TrainConfig, train_texts: list[str], run_dir: Path) -> YueTokenizer:
    """The run's tokenizer: `cfg.tokenizer`, else the init model's, else the run's own (trained once)."""
    own = run_dir / "tokenizer.json"
    if cfg.tokenizer is not None:
        tok = YueTokenizer.load(cfg.tokenizer)
    elif cfg.init is not None:
        tok = YueTokenizer.load(cfg.init)
    elif own.is_file():
        return YueTokenizer.load(own)
    else:
        tok = YueTokenizer.train(train_texts, vocab_size=cfg.vocab_size)
    tok.save(own)
    return tok


def build_model(cfg: TrainConfig, tokenizer: YueTokenizer) -> YueForCausalLM:
    """Random init (seeded) with the config's shapes, or the `init` model folder."""
    if cfg.init is not None:
        model = load_model(cfg.init).train()
        if model.config.block_size != cfg.block_size:
            raise ValueError(
                f"block_size {cfg.block_size} differs from the init model's {model.config.block_size}"
            )
        if model.config.vocab_size < tokenizer.vocab_size:
            raise ValueError(
                f"tokenizer has {tokenizer.vocab_size} tokens, the init model only {model.config.vocab_size}"
            )
        if cfg.objective == "anchor" and model.anchor_head is None:  # the anchor objective adds its head
            model.config.anchor_head, model.config.anchor_bias = True, cfg.anchor_bias
            model.anchor_head = AnchorHead(model.config).to(model.device)
        return model
    torch.manual_seed(cfg.seed)
    return YueForCausalLM(cfg.model_config(tokenizer.vocab_size)).train()


@torch.no_grad()
def evaluate(net, model: YueForCausalLM, val: PackedSequences, cfg: TrainConfig, device) -> EvalResult:
    """AR loss, NAR loss and per-slot NAR accuracy on the first `eval_batches` validation batches.

    Fixed sequences and anchors (seeded by `cfg.seed`), no reveals: the numbers are comparable over a run.
    """
    model.eval()
    g = torch.Generator().manual_seed(cfg.seed + 12345)
    n = min(len(val), cfg.eval_batches * cfg.batch_size)
    ar_sum = nar_sum = 0.0
    hits = torch.zeros(cfg.block_size)
    counts = torch.zeros(cfg.block_size)
    batches = 0
    for start in range(0, n, cfg.batch_size):
        x = val.data[start : start + cfg.batch_size].to(device)
        anchors = sample_anchors(x.shape[0], cfg.seq_len, cfg.anchors, cfg.block_size, g).to(device)
        out = joint_loss(net, x, anchors, cfg.block_size, cfg.loss_weights, reveal_prob=0.0, generator=g)
        ar_sum += float(out.ar)
        nar_sum += float(out.nar)
        hits += (out.nar_acc_per_slot * out.nar_count_per_slot).cpu()
        counts += out.nar_count_per_slot.cpu()
        batches += 1
    model.train()
    acc = (hits / counts.clamp(min=1)).tolist()
    return EvalResult(ar_sum / max(1, batches), nar_sum / max(1, batches), [round(a, 4) for a in acc])


def expert_usage(model: YueForCausalLM) -> dict[str, float]:
    """Four-expert routing: each expert's share of first choices in the last forward, committed
    positions and slots apart (`ExpertRoute`); {} for type routing."""
    route = model.model.last_route
    if route is None:
        return {}
    usage = {}
    for nar, kind in ((False, "c"), (True, "s")):
        picks = torch.cat([c.flatten() for n, c in route.choices if n == nar])
        share = torch.bincount(picks, minlength=N_EXPERTS).float() / max(1, picks.numel())
        usage |= {f"{kind}_{name}": round(float(v), 3) for name, v in zip(EXPERT_NAMES, share, strict=True)}
    return usage


def check_resume_config(run_dir: Path, cfg: TrainConfig, resume_step: int) -> None:
    """A resumed run must train with the same settings, or it would not reach the same weights.

    One exception: `steps` may change while the checkpoint is still inside the warm-up, because the
    learning rates used so far (`lr_at` for step < warmup_steps) do not depend on `steps`.
    """
    free = RESUME_FREE_FIELDS | ({"steps"} if resume_step <= cfg.warmup_steps else set())
    check_resume_settings(run_dir / "train_config.json", json.loads(cfg.to_json()), free)


def start_run_dir(run_dir: Path, cfg: TrainConfig, resume: bool) -> None:
    """Create the run folder, check a resumed run's settings against its own, and write them."""
    run_dir.mkdir(parents=True, exist_ok=True)
    if resume and (ckpt := latest_checkpoint(run_dir)) is not None:
        check_resume_config(run_dir, cfg, json.loads((ckpt / "state.json").read_text())["step"])
    (run_dir / "train_config.json").write_text(cfg.to_json())


def save_final_model(model: YueForCausalLM, tokenizer: YueTokenizer, out_dir: Path) -> Path:
    """`save_pretrained` (safetensors) + tokenizer.json into `out_dir`, atomically (temp folder + rename)."""
    tmp = out_dir.with_name(f".tmp-{out_dir.name}-{os.getpid()}")
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save(tmp)
    if out_dir.exists():
        shutil.rmtree(out_dir)
    os.replace(tmp, out_dir)
    return out_dir


def load_data(cfg: TrainConfig, run_dir: Path) -> tuple[YueTokenizer, PackedSequences, PackedSequences, dict]:
    """Corpus -> split by file -> tokenizer -> cached token arrays -> packed train / validation sets."""
    docs = read_corpus(cfg.corpus)
    train_docs, val_docs = split_documents(docs, cfg.val_fraction)
    tokenizer = prepare_tokenizer(cfg, [d.text for d in train_docs], run_dir)
    train_tokens = cached_tokens(train_docs, tokenizer, cfg.seed, run_dir / "data" / "train.npy")
    val_tokens = cached_tokens(val_docs or train_docs[:1], tokenizer, cfg.seed, run_dir / "data" / "val.npy")
    stats = {
        "train_files": len(train_docs),
        "val_files": len(val_docs),
        "train_tokens": int(len(train_tokens)),
        "val_tokens": int(len(val_tokens)),
    }
    train = PackedSequences(train_tokens, cfg.seq_len, cfg.seed)
    if len(val_tokens) < cfg.seq_len:
        log.warning("validation split is shorter than one sequence; evaluating on training sequences")
        val_tokens = train_tokens
    val = PackedSequences(val_tokens, cfg.seq_len, cfg.seed)
    return tokenizer, train, val, stats


def train_step(
    trainer: Trainer, model: YueForCausalLM, data: PackedSequences, cfg: TrainConfig, step: int
) -> tuple[JointLoss, torch.Tensor | None, float]:
    """One update: (this process's loss terms, the anchor objective's count loss or None, grad norm)."""
    # 1. The global batch, anchors and reveals: pure functions of (seed, step); this process's rows.
    g = step_generator(cfg.seed, step)
    x = data.batch(step, cfg.batch_size)
    anchors = sample_anchors(cfg.batch_size, cfg.seq_len, cfg.anchors, cfg.block_size, g)
    reveal = draw_reveals(cfg.batch_size, cfg.anchors, cfg.block_size, cfg.reveal_prob, g)
    mine, device = trainer.rows(), trainer.accelerator.device
    # 2. Loss (AR mean + slot terms over the global batch's masked slots), one update at this step's lr.
    count = None
    if cfg.objective == "anchor":  # its own blocks and reveals (`train/anchor.py`), drawn from g
        out, count = anchor_loss(
            trainer.net,
            model,
            x[mine].to(device),
            cfg.anchors,
            cfg.block_size,
            cfg.loss_weights,
            cfg.anchor_bias,
            g,
        )
    else:
        out = joint_loss(
            trainer.net,
            x[mine].to(device),
            anchors[mine].to(device),
            cfg.block_size,
            cfg.loss_weights,
            reveal=reveal[mine],
        )
    slots, _ = trainer.global_mean(out.slot_sum, out.nar_count_per_slot.sum())
    return out, count, trainer.update(out.ar_term + slots, step)


class Progress:
    """The loop's progress bar and its `log.jsonl` records (start, train, eval, done), which only the
    main process writes; tokens/s is measured between two train records."""

    def __init__(self, run_dir: Path, cfg: TrainConfig, start: int, main: bool, t0: float) -> None:
        self.run_dir, self.cfg, self.main, self.t0 = run_dir, cfg, main, t0
        self.bar = tqdm(
            total=cfg.steps,
            initial=start,
            disable=not main,
            mininterval=5.0,
            dynamic_ncols=True,
            desc="train",
        )
        self.t_last, self.step_last = time.time(), start

    def write(self, record: dict) -> None:
        if self.main:
            append_jsonl(self.run_dir / "log.jsonl", record)

    def log_start(self, step: int, stats: dict, model: YueForCausalLM, world: int) -> None:
        self.write(
            {
                "kind": "start",
                "step": step,
                "argv": sys.argv,
                "data": stats,
                "params": sum(p.numel() for p in model.parameters()),
                "world": world,
                "threads": torch.get_num_threads(),
                "time": time.time(),
            }
        )

    def log_train(
        self, done: int, out: JointLoss, count: torch.Tensor | None, model: YueForCausalLM, grad_norm: float
    ) -> None:
        now = time.time()
        tokens = self.cfg.batch_size * self.cfg.seq_len * (done - self.step_last)
        tok_s = tokens / max(now - self.t_last, 1e-9)
        self.t_last, self.step_last = now, done
        terms = {
            "loss": float(out.total.detach()),
            "ar": float(out.ar),
            "nar": float(out.nar),
            "kl": float(out.kl),
        }
        if count is not None:
            terms["count"] = float(count)
        terms |= expert_usage(model)
        self.bar.set_postfix(
            {k: f"{v:.3f}" for k, v in terms.items()} | {"tok/s": f"{tok_s:.0f}"}, refresh=False
        )
        self.write(
            {
                "kind": "train",
                "step": done,
                **terms,
                "lr": lr_at(done - 1, self.cfg),
                "grad_norm": float(grad_norm),
                "tok_s": round(tok_s, 1),
                "elapsed_s": round(now - self.t0, 1),
            }
        )

    def log_eval(self, done: int, result: EvalResult) -> None:
        self.write(
            {"kind": "eval", "step": done, **asdict(result), "elapsed_s": round(time.time() - self.t0, 1)}
        )
        if self.main:
            self.bar.write(
                f"[eval] step {done}: ar_loss={result.ar_loss:.4f} nar_loss={result.nar_loss:.4f} "
                f"nar_acc={result.nar_acc_per_slot}"
            )

    def log_done(self, step: int, final: Path) -> None:
        self.write(
            {"kind": "done", "step": step, "wall_s": round(time.time() - self.t0, 1), "model": str(final)}
        )


def train(cfg: TrainConfig, resume: bool = False, stop_at: int | None = None) -> Path:
    """Run (or resume) training; returns the final model folder (`<out>/model`).

    Args:
        cfg: the run's settings.
        resume: continue from the newest complete checkpoint in `<out>/checkpoints` (if any).
        stop_at: stop after this many steps without finishing (simulates an interruption; tests).
    """
    if cfg.threads is not None:
        torch.set_num_threads(cfg.threads)
    accelerator = make_accelerator()
    main, run_dir = accelerator.is_main_process, Path(cfg.out)
    if main:
        start_run_dir(run_dir, cfg, resume)
    accelerator.wait_for_everyone()
    t0 = time.time()
    with accelerator.main_process_first():  # the main process writes the tokenizer and token cache
        tokenizer, train_set, val_set, stats = load_data(cfg, run_dir)
    model = build_model(cfg, tokenizer)
    trainer = Trainer(
        TrainingForward(model),
        set_trainable(model, cfg.train_set),
        cfg,
        cfg.batch_size,
        saved=model,
        run_dir=run_dir,
        betas=cfg.betas,
        keep=cfg.keep_checkpoints,
        accelerator=accelerator,
    )
    start = trainer.resume()["step"] if resume else 0
    end = cfg.steps if stop_at is None else min(cfg.steps, stop_at)
    progress = Progress(run_dir, cfg, start, main, t0)
    progress.log_start(start, stats, model, accelerator.num_processes)
    for step in range(start, end):
        out, count, grad_norm = train_step(trainer, model, train_set, cfg, step)
        done = step + 1
        if done % cfg.log_every == 0 or done == end:
            progress.log_train(done, out, count, model, grad_norm)
        progress.bar.update(1)
        if done % cfg.eval_every == 0 or done == cfg.steps:
            progress.log_eval(done, evaluate(trainer.net, model, val_set, cfg, accelerator.device))
        if done % cfg.save_every == 0 or done == end:
            trainer.save(done, {"seed": cfg.seed})
    progress.bar.close()
    final = run_dir / "model"
    if end == cfg.steps and main:
        model.config.loss_weights = cfg.loss_weights.as_dict()
        save_final_model(model, tokenizer, final)
        progress.log_done(end, final)
    accelerator.wait_for_everyone()
    return final
