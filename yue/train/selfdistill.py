"""Self-distillation (stage 2 of docs/design.md §3): the NAR set learns to predict what the AR path writes.

Design decisions:
- The corpus is the AR path's own greedy continuations of prompts cut from the training split (random
  offsets, ~64 tokens, 128-256 new tokens): token arrays in one safetensors file, never text, so no
  detokenize/re-tokenize round trip changes what the AR path actually wrote.
- `generate_ar_greedy` runs the project's decode loop (`mode="ar"`, `ignore_eos`) on batches of equal-length prompts.
  Prompts are grouped by length, so a batch needs no padding and every row shares one position vector.
- Fine-tuning reuses `losses.joint_loss` with α = 0 and `set_trainable(model, "nar")`: the AR set,
  embedding, final norm and tied head are frozen, so the AR path's logits cannot change. Anchors lie
  in the continuation (t >= prompt_len - 1), where slot targets are the AR path's greedy tokens.
- The sequences are small (a few hundred x 256 tokens) and a run takes minutes, so this loop keeps no
  checkpoints; it is seeded and deterministic instead (rerun = same weights), on any number of
  processes (`trainer.Trainer`).
"""

from __future__ import annotations

import json
import logging
import os
import random
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from accelerate import Accelerator, PartialState
from safetensors.torch import load_file, save_file
from torch import nn
from tqdm.auto import tqdm

from yue.config import DecodeConfig
from yue.decode.loop import decode
from yue.model.mot import YueForCausalLM
from yue.train.losses import JointLoss, LossWeights, TrainingForward, draw_reveals, joint_loss, set_trainable
from yue.train.trainer import Trainer, lr_at, step_generator

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Greedy AR generation


@torch.no_grad()
def generate_ar_greedy(
    model: YueForCausalLM,
    prompts_token_lists: Sequence[Sequence[int]],
    max_new_tokens: int,
    batch_size: int = 16,
    progress: bool = False,
) -> list[list[int]]:
    """Greedy AR continuations (new tokens only, exactly `max_new_tokens` each, EOS included if written).

    Args:
        model: the model whose AR path writes the continuations.
        prompts_token_lists: N prompts as token-id lists (any lengths >= 1).
        max_new_tokens: tokens to write per prompt.
        batch_size: prompts per forward; prompts are batched only with prompts of the same length.
        progress: show a progress bar over batches.
    Returns:
        N lists of `max_new_tokens` ids, in the order of the prompts.
    """
    if max_new_tokens < 1:
        raise ValueError(f"max_new_tokens must be >= 1, got {max_new_tokens}")
    limit = model.config.max_position_embeddings
    by_len: dict[int, list[int]] = {}
    for i, p in enumerate(prompts_token_lists):
        if not 1 <= len(p) <= limit - max_new_tokens:
            raise ValueError(f"prompt {i} has {len(p)} tokens; need 1..{limit - max_new_tokens}")
        by_len.setdefault(len(p), []).append(i)
    chunks = [
        idx[s : s + batch_size] for _, idx in sorted(by_len.items()) for s in range(0, len(idx), batch_size)
    ]
    cfg = DecodeConfig(mode="ar", max_new_tokens=max_new_tokens, ignore_eos=True).resolved(model.config)
    results: list[list[int]] = [[] for _ in prompts_token_lists]
    for chunk in tqdm(chunks, desc="AR greedy", disable=not progress, unit="batch"):
        # Equal-length prompts: the decode loop runs them in lockstep without padding.
        for em in decode(model, [list(prompts_token_lists[i]) for i in chunk], cfg):
            for row, i in enumerate(chunk):
                results[i].extend(em.tokens[row])
    return results


# --------------------------------------------------------------------------------------------------
# The corpus of AR-greedy sequences


def sample_prompts(
    documents: Sequence[Sequence[int]] | Sequence[np.ndarray], n: int, prompt_len: int, seed: int
) -> list[list[int]]:
    """`n` prompts of exactly `prompt_len` tokens at random offsets of random documents.

    Documents are drawn with probability proportional to how many windows they hold, so long files are
    not under-sampled; documents shorter than `prompt_len` are skipped.
    """
    docs = [np.asarray(d) for d in documents if len(d) >= prompt_len]
    if not docs:
        raise ValueError(f"no document has {prompt_len} tokens: cannot cut prompts")
    weights = [len(d) - prompt_len + 1 for d in docs]
    rng = random.Random(seed)
    picks = rng.choices(range(len(docs)), weights=weights, k=n)
    prompts = []
    for d in picks:
        start = rng.randrange(len(docs[d]) - prompt_len + 1)
        prompts.append(docs[d][start : start + prompt_len].tolist())
    return prompts


def corpus_documents(
    corpus: str, tokenizer, split: str = "train", val_fraction: float = 0.02
) -> list[list[int]]:
    """Token ids of each document of one side of a corpus's train/validation split (`data.py`'s split)."""
    from yue.train.data import read_corpus, split_documents

    train, val = split_documents(read_corpus(corpus), val_fraction)
    docs = train if split == "train" else val
    encodings = tokenizer.encode_batch([d.text for d in docs], add_special_tokens=False)
    return [e.ids for e in encodings]


HELD_OUT = 0.05  # fraction of a sequence file held out to measure NAR accuracy


@dataclass(frozen=True)
class GreedySequences:
    """AR-greedy sequences: tokens (N, prompt_len + new) long; each row is a prompt then its continuation."""

    tokens: torch.Tensor
    prompt_len: int
    seed: int = 0  # the seed its prompts were drawn with; also the seed of its train/held-out split

    def save(self, path: str | Path, **metadata: str) -> Path:
        """Write as safetensors (atomically: temp file, then rename)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        meta = {"prompt_len": str(self.prompt_len), **{k: str(v) for k, v in metadata.items()}}
        save_file({"tokens": self.tokens.to(torch.int32).contiguous()}, str(tmp), metadata=meta)
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, path: str | Path) -> GreedySequences:
        from safetensors import safe_open

        with safe_open(str(path), framework="pt") as f:
            meta = f.metadata() or {}
        if "prompt_len" not in meta:
            raise ValueError(f"{path} is not an AR-greedy sequence file (no prompt_len metadata)")
        return cls(load_file(str(path))["tokens"].long(), int(meta["prompt_len"]), int(meta.get("seed", 0)))

    def split(self, held_out: float = HELD_OUT) -> tuple[GreedySequences, GreedySequences]:
        """(train, held-out) by row, deterministic given the file's own seed: every round that reads
        these sequences (the one that made them, later ones via `extra_sequences`) agrees on the split."""
        n = len(self.tokens)
        perm = torch.randperm(n, generator=torch.Generator().manual_seed(self.seed))
        n_out = max(1, round(n * held_out)) if held_out > 0 and n > 1 else 0
        return (
            GreedySequences(self.tokens[perm[n_out:]], self.prompt_len, self.seed),
            GreedySequences(self.tokens[perm[:n_out]], self.prompt_len, self.seed),
        )


def build_greedy_sequences(
    model: YueForCausalLM,
    documents: Sequence[Sequence[int]],
    n: int,
    prompt_len: int = 64,
    new_tokens: int = 192,
    batch_size: int = 16,
    seed: int = 0,
    progress: bool = True,
) -> GreedySequences:
    """Cut `n` prompts from `documents` and continue each greedily with the AR path."""
    prompts = sample_prompts(documents, n, prompt_len, seed)
    cont = generate_ar_greedy(model, prompts, new_tokens, batch_size, progress=progress)
    rows = [p + c for p, c in zip(prompts, cont, strict=True)]
    return GreedySequences(torch.tensor(rows, dtype=torch.long), prompt_len, seed)


# --------------------------------------------------------------------------------------------------
# NAR-only fine-tuning on the greedy sequences


@dataclass(frozen=True)
class NARFinetuneConfig:
    """Stage-2 knobs (`yue self-distill`'s options). Defaults: a few minutes on 2 CPU cores for the default model.

    Attributes:
        steps: NAR fine-tuning steps.
        batch_size: sequences per step.
        anchors: M: NAR blocks per sequence, anchored in the continuation.
        lr: peak learning rate; the NAR set is already trained in stage 1, so lower than stage 1's.
        warmup_steps: linear warm-up steps.
        min_lr_ratio: the cosine decays to lr * min_lr_ratio.
        weight_decay: AdamW's weight decay (0: a short fine-tune pulls no trained weight toward 0).
        grad_clip: gradients clipped to this global norm.
        beta: weight of the NAR cross-entropy (the AR loss's is 0: the AR set is frozen).
        gamma: weight of KL(sg(p_AR) || p_NAR).
        reveal_prob: chance a slot shows its true token (mask-predict).
        reveal_first: chance slot 1 shows its true token, as the drafting pass shows it (default:
            reveal_prob, as any slot).
        seed: seed for prompts, anchors and reveals.
    """

    steps: int = 300
    batch_size: int = 8
    anchors: int = 16
    lr: float = 1e-3
    warmup_steps: int = 20
    min_lr_ratio: float = 0.1
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    beta: float = 0.8
    gamma: float = 0.2
    reveal_prob: float = 0.1
    reveal_first: float | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "anchors"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if self.beta < 0 or self.gamma < 0 or self.beta == self.gamma == 0:
            raise ValueError(f"beta, gamma must be >= 0 and not both 0, got {self.beta}, {self.gamma}")
        for name in ("reveal_prob", "reveal_first"):
            v = getattr(self, name)
            if v is not None and not 0.0 <= v <= 1.0:
                raise ValueError(f"{name} must be in [0, 1], got {v}")


def continuation_anchors(
    batch: int, seq_len: int, prompt_len: int, n_blocks: int, block_size: int, generator: torch.Generator
) -> torch.Tensor:
    """Anchors in [prompt_len - 1, T - K - 1]: every slot target is an AR-greedy token. (B, M) long."""
    low, high = max(prompt_len - 1, 0), seq_len - block_size  # high exclusive
    if high <= low:
        raise ValueError(f"sequences of {seq_len} tokens leave no anchors after a {prompt_len}-token prompt")
    return torch.randint(low, high, (batch, n_blocks), generator=generator)


@torch.no_grad()
def nar_accuracy(
    model: YueForCausalLM,
    seqs: GreedySequences,
    anchors: int = 16,
    batch_size: int = 8,
    seed: int = 1,
    reveal_first: bool = False,
):
    """Per-slot argmax accuracy of the NAR set on the AR-greedy tokens, as a list of K floats.

    No reveals, or with `reveal_first` slot 1 always revealed (as the decode loop's drafting pass shows a
    block; slot 1's entry is then NaN: it is never predicted).
    """
    K = model.config.block_size
    g = torch.Generator().manual_seed(seed)
    hits = torch.zeros(K)
    count = torch.zeros(K)
    was_training = model.training
    model.eval()
    for s in range(0, len(seqs.tokens), batch_size):
        x = seqs.tokens[s : s + batch_size].to(model.device)
        a = continuation_anchors(len(x), x.shape[1], seqs.prompt_len, anchors, K, g).to(model.device)
        weights = LossWeights(ar=0.0, nar=1.0, kl=0.0)
        out = joint_loss(model, x, a, K, weights, 0.0, g, reveal_first=1.0 if reveal_first else None)
        hits += out.nar_acc_per_slot.cpu() * out.nar_count_per_slot.cpu()
        count += out.nar_count_per_slot.cpu()
    model.train(was_training)
    return (hits / count).tolist()


class NARObjective(nn.Module):
    """The NAR-only joint loss as one module (what accelerate wraps): (tokens, anchors, reveals) -> JointLoss."""

    def __init__(self, model: YueForCausalLM, weights: LossWeights) -> None:
        super().__init__()
        self.model, self.weights = model, weights

    def forward(self, x: torch.Tensor, anchors: torch.Tensor, reveal: torch.Tensor) -> JointLoss:
        K = self.model.config.block_size
        return joint_loss(TrainingForward(self.model), x, anchors, K, self.weights, reveal=reveal)


def finetune_nar(
    model: YueForCausalLM,
    seqs: GreedySequences,
    cfg: NARFinetuneConfig = NARFinetuneConfig(),
    on_log: Callable[[dict], None] | None = None,
    progress: bool = True,
    accelerator: Accelerator | None = None,
) -> list[dict]:
    """Train the NAR set only on AR-greedy sequences with β·CE_NAR + γ·KL. Returns the per-step log.

    The AR set, embedding, final norm and tied head are frozen (`set_trainable(model, "nar")`), so the
    AR path's logits are bit-identical before and after. Runs on one process or under `accelerate
    launch` (`cfg.batch_size` is the global batch; step s's rows, anchors and reveals come from (seed, s)).
    """
    K = model.config.block_size
    weights = LossWeights(ar=0.0, nar=cfg.beta, kl=cfg.gamma)
    trainer = Trainer(
        NARObjective(model, weights),
        set_trainable(model, "nar"),
        cfg,
        cfg.batch_size,
        accelerator=accelerator,
        shardable=True,
    )
    n = len(seqs.tokens)
    order = torch.randperm(n, generator=torch.Generator().manual_seed(cfg.seed))
    history = []
    model.train()
    bar = tqdm(range(cfg.steps), desc="NAR self-distill", disable=not (progress and trainer.is_main))
    t0 = time.perf_counter()
    for step in bar:
        # 1. The global batch's rows, anchors and reveals; this process's share of them.
        g = step_generator(cfg.seed, step)
        idx = order[(step * cfg.batch_size + torch.arange(cfg.batch_size)) % n]
        x = seqs.tokens[idx]  # (B, T)
        anchors = continuation_anchors(len(x), x.shape[1], seqs.prompt_len, cfg.anchors, K, g)
        reveal = draw_reveals(len(x), cfg.anchors, K, cfg.reveal_prob, g, cfg.reveal_first)
        mine = trainer.rows()
        dev = model.device
        out = trainer.net(x[mine].to(dev), anchors[mine].to(dev), reveal[mine])
        # 2. The slot loss over the global batch's masked slots.
        loss, value = trainer.global_mean(out.slot_sum, out.nar_count_per_slot.sum())
        trainer.update(loss, step)
        rec = {
            "step": step + 1,
            "loss": value,
            "nar": out.nar.item(),
            "kl": out.kl.item(),
            "lr": lr_at(step, cfg),
            "acc": [round(a, 4) for a in out.nar_acc_per_slot.tolist()],
            "elapsed_s": round(time.perf_counter() - t0, 2),
        }
        history.append(rec)
        bar.set_postfix(loss=f"{rec['loss']:.3f}", nar=f"{rec['nar']:.3f}", kl=f"{rec['kl']:.3f}")
        if on_log is not None:
            on_log(rec)
    trainer.close()
    for p in model.parameters():  # back to the default (everything trainable), in eval mode
        p.requires_grad_(True)
    model.eval()
    return history


def _round(a: float) -> float | None:
    """4 decimals; NaN (a slot never predicted) as None, which JSON can hold."""
    return None if a != a else round(a, 4)


def save_model_folder(
    model: YueForCausalLM, tokenizer, out_dir: str | Path, src_dir: str | Path | None = None
) -> Path:
    """Write a model folder (safetensors, configs, tokenizer.json), each file replaced atomically.

    Files are written to a temporary sibling folder, then moved into `out_dir` one `os.replace` at a time,
    so overwriting the model in place never leaves a half-written weights file. Other files already in
    `out_dir` (reports, the model card) are kept; a model card in `src_dir` is copied if `out_dir` has none.

    Args:
        tokenizer: a `tokenizers.Tokenizer` (saved as tokenizer.json).
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".tmp-{out_dir.name}-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    model.save_pretrained(str(tmp), safe_serialization=True)
    tokenizer.save(str(tmp / "tokenizer.json"))
    card = Path(src_dir) / "README.md" if src_dir is not None else None
    if card is not None and card.is_file() and not (out_dir / "README.md").exists():
        shutil.copy(card, tmp / "README.md")
    for f in sorted(tmp.iterdir()):
        os.replace(f, out_dir / f.name)
    tmp.rmdir()
    return out_dir


# --------------------------------------------------------------------------------------------------
# Stage 2 end to end (`yue self-distill`)


def self_distill(
    model_dir: str | Path,
    out_dir: str | Path,
    corpus: str = "stdlib",
    n_sequences: int = 576,
    prompt_len: int = 64,
    new_tokens: int = 192,
    gen_batch_size: int = 16,
    sequences_file: str | Path | None = None,
    cfg: NARFinetuneConfig = NARFinetuneConfig(),
    val_fraction: float = 0.02,
    extra_sequences: Sequence[str | Path] = (),
    command: str | None = None,
) -> dict:
    """Stage 2: AR-greedy corpus from `model_dir`, NAR-only fine-tune, save the model to `out_dir`.

    If `sequences_file` exists it is reused (generation is the slow half); otherwise the sequences are
    generated and saved there (default: `out_dir/data/selfdistill_sequences.safetensors`). 5% of the
    sequences (split by the file's seed) are held out to report NAR accuracy per slot before and after.

    A further round (`model_dir` already self-distilled) adds the earlier rounds' sequence files as
    `extra_sequences`: their training rows (each file's own split, by its seed) join this round's, and
    the held-out rows stay this round's new ones, which no round has trained on. The report keeps the
    earlier rounds' reports under "previous".
    Returns the report (also written to `out_dir/selfdistill_report.json`).
    """
    from yue.model.hf import load_model
    from yue.tokenizer import YueTokenizer

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = load_model(model_dir)
    tokenizer = YueTokenizer.load(model_dir)
    seq_file = (
        Path(sequences_file) if sequences_file else out_dir / "data" / "selfdistill_sequences.safetensors"
    )
    t0 = time.perf_counter()
    # Under `accelerate launch` the main process writes the sequences; the others then read them.
    state = PartialState()
    with state.main_process_first():
        reused = seq_file.is_file()
        if reused:
            seqs = GreedySequences.load(seq_file)
            log.info("reusing %d AR-greedy sequences from %s", len(seqs.tokens), seq_file)
        else:
            docs = corpus_documents(corpus, tokenizer.tokenizer, "train", val_fraction)
            seqs = build_greedy_sequences(
                model, docs, n_sequences, prompt_len, new_tokens, gen_batch_size, cfg.seed
            )
            seqs.save(seq_file, corpus=corpus, model=str(model_dir), seed=str(cfg.seed))
    times = {"generation_s": None if reused else round(time.perf_counter() - t0, 1)}
    train, held = seqs.split()
    train = with_extra_sequences(train, extra_sequences)
    before = held_out_accuracy(model, held)
    t1 = time.perf_counter()
    history = finetune_nar(model, train, cfg)
    times["train_s"] = round(time.perf_counter() - t1, 1)
    after = held_out_accuracy(model, held)
    final_loss = history[-1]["loss"] if history else None
    if not state.is_main_process:  # every process holds the same weights; the main one writes them
        return {"final_loss": final_loss}
    save_model_folder(model, tokenizer.tokenizer, out_dir, src_dir=model_dir)
    report = self_distill_report(model_dir, command, cfg, seqs, train, extra_sequences, times, before, after)
    report |= {"final_loss": final_loss, "previous": previous_reports(model_dir)}
    (out_dir / "selfdistill_report.json").write_text(json.dumps(report, indent=2))
    with (out_dir / "selfdistill_log.jsonl").open("w") as f:
        for rec in history:
            f.write(json.dumps(rec) + "\n")
    return report


def with_extra_sequences(train: GreedySequences, files: Sequence[str | Path]) -> GreedySequences:
    """`train` with the training rows of earlier rounds' sequence files (each file's own split, by its
    seed) before it; they must have the same prompt and sequence length."""
    if not files:
        return train
    extra = [GreedySequences.load(p) for p in files]
    if any(e.prompt_len != train.prompt_len or e.tokens.shape[1] != train.tokens.shape[1] for e in extra):
        raise ValueError("extra_sequences: every file needs the same prompt and sequence length")
    parts = [e.split()[0].tokens for e in extra] + [train.tokens]
    return GreedySequences(torch.cat(parts), train.prompt_len, train.seed)


def held_out_accuracy(model: YueForCausalLM, held: GreedySequences) -> tuple[list[float], list[float]]:
    """NAR accuracy per slot on held-out rows: with no reveals, and with slot 1 revealed as the drafting
    pass shows a block (slot 1 itself is then not predicted: NaN)."""
    return nar_accuracy(model, held), nar_accuracy(model, held, reveal_first=True)


def previous_reports(model_dir: str | Path) -> list[dict]:
    """The reports of the rounds that made `model_dir`, oldest first ([] for a first round)."""
    file = Path(model_dir) / "selfdistill_report.json"
    previous = json.loads(file.read_text()) if file.is_file() else None
    return [*previous.pop("previous", []), previous] if previous else []


def self_distill_report(
    model_dir: str | Path,
    command: str | None,
    cfg: NARFinetuneConfig,
    seqs: GreedySequences,
    train: GreedySequences,
    extra_sequences: Sequence[str | Path],
    times: dict[str, float | None],
    before: tuple[list[float], list[float]],
    after: tuple[list[float], list[float]],
) -> dict:
    """What a round did: its data, times, settings and held-out accuracy (`held_out_accuracy`) before
    and after."""
    return {
        "stage": "self-distillation (NAR set only, AR frozen)",
        "model": str(model_dir),
        "command": command,
        "sequences": len(seqs.tokens),
        "extra_sequences": [str(p) for p in extra_sequences],
        "train_sequences": len(train.tokens),
        "prompt_len": seqs.prompt_len,
        "seq_len": seqs.tokens.shape[1],
        **times,  # generation_s (None: generated by an earlier run), train_s
        "config": asdict(cfg),
        "held_out_nar_acc_before": [round(a, 4) for a in before[0]],
        "held_out_nar_acc_after": [round(a, 4) for a in after[0]],
        # Slot 1 revealed, as the drafting pass shows a block (slot 1 itself is not predicted: null).
        "held_out_nar_acc_slot1_revealed_before": [_round(a) for a in before[1]],
        "held_out_nar_acc_slot1_revealed_after": [_round(a) for a in after[1]],
    }
