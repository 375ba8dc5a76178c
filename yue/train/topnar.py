"""A NAR set on the top layers of a large pretrained AR set, by self-distillation (docs/design.md §8).

Why this shape: a NAR set in every layer of SmolLM2-135M is 106M parameters, which two CPU cores cannot
train. Here only the top N layers hold one; a slot of the block anchored at committed position t enters
layer L - N from t's hidden state there (`mot.SlotEntry`), so training needs the AR path below that
layer only once per sequence: its hidden states are computed once and cached ("entry features"), and
each training step runs the top N layers alone.

The recipe (`distill_top_nar`):
1. Prompts -> the AR path's own greedy answers (self-distillation data: drafts are trained to predict
   exactly what verification will accept).
2. The drafting vocabulary (FR-Spec, Zhao et al. 2025): the `draft_vocab_size` most frequent tokens of
   those answers; slot rows' head covers only them (a sixth of SmolLM2's head at 8,192).
3. Entry features for every sequence, cached (float16; bfloat16 where a sequence's pass float16's range).
4. Training: M blocks of K slots per sequence, anchored in the answers; slot 1 revealed (decoding's
   drafting pass knows the AR path's next token), slots 2..K predict x[t+2..t+K]. Loss per slot:
   cross-entropy on the greedy token + `kl_weight` * KL(p_AR || p_slot) over the drafting vocabulary,
   the AR distribution giving more signal per token than the hard label; slots weighted toward the
   early ones (`slot_decay`), which decide how many drafts are accepted at all (PARD-2's
   acceptance-weighted loss, simplified).
5. The router, on acceptance labels of held-out sequences' blocks (`train.router`).

Progress is measured as tau: tokens per verifying step (1 + the accepted drafts of a full block) on
held-out sequences, reported against training tokens.
"""

from __future__ import annotations

import functools
import gzip
import json
import logging
import math
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from tqdm.auto import tqdm

from yue.config import DecodeConfig
from yue.decode.loop import decode
from yue.model.masks import slot_positions, training_mask
from yue.model.mot import YueForCausalLM
from yue.model.router import revealed_slot1
from yue.train.router import RouterExamples, acceptance_labels
from yue.train.trainer import Trainer, step_generator

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TopNARConfig:
    """Knobs of the top-layer NAR recipe. Defaults: the shipped yue-smol run."""

    steps: int = 3000  # optimizer steps
    batch_size: int = 16  # sequences per step
    anchors: int = 32  # M blocks per sequence, anchored in the answer
    lr: float = 1e-3
    warmup_steps: int = 100
    min_lr_ratio: float = 0.05
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    kl_weight: float = 1.0  # KL(p_AR || p_slot) on top of the hard-label cross-entropy
    slot_decay: float = 0.7  # slot i's loss weight ~ slot_decay ** (i - 2): early slots decide acceptance
    eval_every: int = 250
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size", "anchors", "eval_every"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")
        if not 0 < self.slot_decay <= 1:
            raise ValueError(f"slot_decay must be in (0, 1], got {self.slot_decay}")


# --------------------------------------------------------------------------------------------------
# 1-2. Self-distillation data and the drafting vocabulary


@dataclass
class ChatSequences:
    """Prompt + AR-greedy answer token ids, one list per sequence; `prompt_lens[i]` ids are the prompt."""

    ids: list[list[int]]
    prompt_lens: list[int]

    def __len__(self) -> int:
        return len(self.ids)

    def split(self, held_out: int) -> tuple[ChatSequences, ChatSequences]:
        """(train, held-out): the last `held_out` sequences are held out."""
        n = len(self) - held_out
        return (
            ChatSequences(self.ids[:n], self.prompt_lens[:n]),
            ChatSequences(self.ids[n:], self.prompt_lens[n:]),
        )

    def answer_tokens(self) -> int:
        return sum(len(x) - p for x, p in zip(self.ids, self.prompt_lens, strict=True))

    def save(self, path: str | Path) -> None:
        Path(path).write_text(json.dumps({"ids": self.ids, "prompt_lens": self.prompt_lens}))

    @classmethod
    def load(cls, path: str | Path) -> ChatSequences:
        """Read a file `save` wrote (or its gzip: a name ending in .gz)."""
        raw = Path(path).read_bytes()
        data = json.loads(gzip.decompress(raw) if str(path).endswith(".gz") else raw)
        return cls(data["ids"], data["prompt_lens"])

    def pairs(self) -> list[tuple[list[int], int]]:
        """(token ids, prompt length) per sequence: what `CorpusNgrams.build` reads."""
        return list(zip(self.ids, self.prompt_lens, strict=True))


def greedy_answers(
    model: YueForCausalLM,
    prompts: Sequence[list[int]],
    max_new_tokens: int = 256,
    batch_size: int = 32,
    progress: bool = True,
    temperature: float = 0.0,
    top_p: float = 1.0,
    seed: int = 0,
) -> ChatSequences:
    """The AR path's answers to tokenized prompts (stopping at EOS), in lockstep batches: greedy, or
    sampled at `temperature` > 0 with nucleus `top_p` (prompt i of the sorted order seeded `seed + i`:
    the same call, the same answers).

    Prompts are sorted by length so a batch pads little; the result keeps the input order. A finished
    answer ends with EOS; one cut at `max_new_tokens` does not.
    """
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    answers: dict[int, list[int]] = {}
    context = model.config.max_position_embeddings
    bar = tqdm(total=len(prompts), desc="answers", unit="prompt", disable=not progress)
    for s in range(0, len(order), batch_size):
        batch = order[s : s + batch_size]
        room = context - max(len(prompts[i]) for i in batch)
        if room < 2:
            raise ValueError(
                f"a prompt of {context - room} tokens leaves no room in a {context}-token context"
            )
        cfg = DecodeConfig(
            mode="ar",
            max_new_tokens=min(max_new_tokens, room),
            temperature=temperature,
            top_p=top_p,
            seed=seed + s if temperature > 0 else None,
        ).resolved(model.config)
        out: list[list[int]] = [[] for _ in batch]
        for em in decode(model, [list(prompts[i]) for i in batch], cfg):
            for row, toks in zip(out, em.tokens, strict=True):
                row.extend(toks)
        eos = model.config.eos_token_id
        for i, row in zip(batch, out, strict=True):
            answers[i] = row + ([eos] if len(row) < cfg.max_new_tokens and isinstance(eos, int) else [])
        bar.update(len(batch))
    bar.close()
    ids = [list(prompts[i]) + answers[i] for i in range(len(prompts))]
    return ChatSequences(ids, [len(p) for p in prompts])


def drafting_vocabulary(seqs: ChatSequences, size: int, always: Sequence[int] = ()) -> torch.Tensor:
    """The `size` most frequent answer tokens (FR-Spec), ids in decreasing frequency; `always` first."""
    counts: dict[int, int] = {}
    for x, p in zip(seqs.ids, seqs.prompt_lens, strict=True):
        for t in x[p:]:
            counts[t] = counts.get(t, 0) + 1
    ranked = [t for t in always] + sorted((t for t in counts if t not in always), key=lambda t: -counts[t])
    if len(ranked) < size:  # fill with the remaining ids in order (they never occurred: never drafted)
        seen = set(ranked)
        ranked += [t for t in range(size * 2 + max(ranked, default=0)) if t not in seen][: size - len(ranked)]
    return torch.tensor(ranked[:size], dtype=torch.long)


def vocabulary_coverage(seqs: ChatSequences, vocab: torch.Tensor) -> float:
    """Fraction of answer tokens inside the drafting vocabulary."""
    inside = set(vocab.tolist())
    toks = [t for x, p in zip(seqs.ids, seqs.prompt_lens, strict=True) for t in x[p:]]
    return sum(t in inside for t in toks) / max(len(toks), 1)


# --------------------------------------------------------------------------------------------------
# 3. Entry features


@torch.no_grad()
def entry_features(
    model: YueForCausalLM, seqs: ChatSequences, batch_tokens: int = 8192, progress: bool = True
) -> list[torch.Tensor]:
    """Each sequence's hidden states entering layer `nar_start`, (T_i, D) on the CPU (`compact`).

    Batches right-pad sequences of similar length (causal attention: padding never reaches a real row).
    """
    order = sorted(range(len(seqs)), key=lambda i: len(seqs.ids[i]))
    feats: list[torch.Tensor | None] = [None] * len(seqs)
    bar = tqdm(total=len(seqs), desc="entry features", unit="seq", disable=not progress)
    s = 0
    while s < len(order):
        T = len(seqs.ids[order[min(len(order) - 1, s)]])
        n = max(1, batch_tokens // max(T, 1))
        batch = order[s : s + n]
        T = max(len(seqs.ids[i]) for i in batch)
        x = torch.tensor([seqs.ids[i] + [0] * (T - len(seqs.ids[i])) for i in batch], device=model.device)
        h = model.model.run_to_entry(x)  # (b, T, D)
        for row, i in enumerate(batch):
            feats[i] = compact(h[row, : len(seqs.ids[i])])
        bar.update(len(batch))
        s += n
    bar.close()
    return feats  # type: ignore[return-value]


def compact(h: torch.Tensor) -> torch.Tensor:
    """Entry features as cached, on the CPU: float16 (10 mantissa bits), or bfloat16 (float32's range,
    7 bits) where a value would pass float16's largest, as Gemma 3's residual stream does; float16
    would make it inf, and training on it NaN."""
    fits = bool(h.abs().max() <= torch.finfo(torch.float16).max)
    return h.to("cpu", torch.float16 if fits else torch.bfloat16)


# --------------------------------------------------------------------------------------------------
# 4. Training


@dataclass
class Batch:
    """A training batch of top-layer blocks. Shapes in comments; M blocks of K slots per sequence."""

    entry: torch.Tensor  # (B, T, D) entry features, right-padded
    x: torch.Tensor  # (B, T) tokens, right-padded
    anchors: torch.Tensor  # (B, M) anchor index t of each block
    targets: torch.Tensor  # (B, M, K) x[t+1..t+K], -1 past a sequence's end


def draw_anchors(seqs: ChatSequences, rows: Sequence[int], M: int, g: torch.Generator | None) -> torch.Tensor:
    """(B, M) sorted anchors t in [prompt_len - 1, len - 2] (slot 1's token x[t+1] exists), M per
    sequence (with replacement when an answer is short), drawn row by row from `g`."""
    anchors = torch.zeros(len(rows), M, dtype=torch.long)
    for b, i in enumerate(rows):
        n, p = len(seqs.ids[i]), seqs.prompt_lens[i]
        lo, hi = max(p - 1, 0), max(n - 2, max(p - 1, 0))  # anchors t with x[t+1] in the answer
        anchors[b] = torch.randint(lo, hi + 1, (M,), generator=g).sort().values
    return anchors


def make_batch(
    seqs: ChatSequences,
    feats: list[torch.Tensor],
    rows: Sequence[int],
    anchors: torch.Tensor,
    K: int,
    device,
) -> Batch:
    """The Batch of sequences `rows` with blocks at `anchors` (B, M) (from `draw_anchors`)."""
    T = max(len(seqs.ids[i]) for i in rows)
    D = feats[rows[0]].shape[-1]
    # float16 features batch as float16 (as before); with a bfloat16 one (`compact`), as float32.
    dtype = functools.reduce(torch.promote_types, {feats[i].dtype for i in rows})
    entry = torch.zeros(len(rows), T, D, dtype=dtype)
    x = torch.zeros(len(rows), T + K + 1, dtype=torch.long)
    x_valid = torch.zeros_like(x, dtype=torch.bool)
    for b, i in enumerate(rows):
        n = len(seqs.ids[i])
        entry[b, :n] = feats[i]
        x[b, :n] = torch.tensor(seqs.ids[i])
        x_valid[b, :n] = True
    idx = anchors[:, :, None] + torch.arange(1, K + 1)  # (B, M, K)
    targets = torch.where(x_valid.gather(1, idx.flatten(1)), x.gather(1, idx.flatten(1)), -1).view(idx.shape)
    return Batch(entry.to(device), x[:, :T].to(device), anchors.to(device), targets.to(device))


def training_batch(
    seqs: ChatSequences, feats: list[torch.Tensor], step: int, cfg: TopNARConfig, K: int, rows: slice, device
) -> tuple[Batch, list[int]]:
    """Step `step`'s global batch (sequences and anchors drawn from (seed, step), the same on every
    process) -> (this process's `rows` of it as a Batch, the global batch's sequence indices)."""
    g = step_generator(cfg.seed, step)
    chosen = torch.randint(len(seqs), (cfg.batch_size,), generator=g).tolist()
    anchors = draw_anchors(seqs, chosen, cfg.anchors, g)
    return make_batch(seqs, feats, chosen[rows], anchors[rows], K, device), chosen


def block_forward(model: YueForCausalLM, batch: Batch) -> tuple[torch.Tensor, torch.Tensor]:
    """One training-style forward of the top layers: committed rows, then M blocks of K slots.

    Returns:
        committed: (B, T, D) final hidden states of the committed rows (the AR path's, for the teacher).
        slots: (B, M, K, D) final hidden states of the slots (slot 1 revealed as x[t+1]).
    """
    K, mask_id = model.config.block_size, model.config.mask_token_id
    entry = batch.entry.to(model.dtype)
    B, T, D = entry.shape
    M = batch.anchors.shape[1]
    slot_tokens = torch.full((B, M, K), mask_id, dtype=torch.long, device=entry.device)
    slot_tokens[:, :, 0] = batch.targets[:, :, 0].clamp(min=0)  # slot 1 revealed
    slot_anchor = entry.gather(1, batch.anchors[:, :, None].expand(B, M, D)).repeat_interleave(K, dim=1)
    positions = torch.cat(
        [torch.arange(T, device=entry.device).expand(B, T), slot_positions(batch.anchors, K)], 1
    )
    mask = training_mask(T, batch.anchors, K)
    hidden = model.model.run_from_entry(entry, slot_tokens.flatten(1), slot_anchor, positions, mask)
    return hidden[:, :T], hidden[:, T:].view(B, M, K, D)


def draft_logits(model: YueForCausalLM, hidden: torch.Tensor) -> torch.Tensor:
    """Logits over the drafting vocabulary, (..., D) -> (..., Vd) (the LM head's rows `draft_vocab`)."""
    return F.linear(hidden, model.lm_head.weight[model.draft_vocab])


def slot_weights(K: int, decay: float, device) -> torch.Tensor:
    """(K,) loss weight per slot: 0 for the revealed slot 1, decay ** (i - 2) for slots i >= 2, sum 1."""
    w = torch.tensor([0.0] + [decay**i for i in range(K - 1)], device=device)
    return w / w.sum()


def block_loss(
    model: YueForCausalLM, batch: Batch, cfg: TopNARConfig
) -> tuple[torch.Tensor, torch.Tensor, dict]:
    """Weighted CE + KL over the drafting vocabulary for slots 2..K, as (weighted sum, total weight):
    the loss is their ratio over the global batch (`Trainer.global_mean`); metrics: per-slot accuracy."""
    K, vocab = model.config.block_size, model.draft_vocab
    committed, slots = block_forward(model, batch)
    B, M = batch.anchors.shape
    with torch.no_grad():
        # Teacher of slot i at anchor t: the AR path at committed row t + i - 1 (it predicts x[t+i]).
        rows = (batch.anchors[:, :, None] + torch.arange(K, device=committed.device)).clamp(
            max=committed.shape[1] - 1
        )
        teacher_h = committed.gather(1, rows.flatten(1)[:, :, None].expand(-1, -1, committed.shape[-1]))
        teacher = F.log_softmax(draft_logits(model, teacher_h).float(), -1).view(B, M, K, -1)
        # Hard targets as drafting-vocabulary indices; -1 where absent or past the end.
        lookup = torch.full((model.config.vocab_size,), -1, dtype=torch.long, device=vocab.device)
        lookup[vocab] = torch.arange(len(vocab), device=vocab.device)
        tgt = torch.where(batch.targets >= 0, lookup[batch.targets.clamp(min=0)], -1)  # (B, M, K)
    logp = F.log_softmax(draft_logits(model, slots).float(), -1)  # (B, M, K, Vd)
    valid = batch.targets >= 0
    ce = -logp.gather(-1, tgt.clamp(min=0)[..., None])[..., 0] * (tgt >= 0)
    kl = (teacher.exp() * (teacher - logp)).sum(-1)
    w = slot_weights(K, cfg.slot_decay, logp.device)  # (K,)
    per = (ce + cfg.kl_weight * kl) * valid
    total, weight = (per * w).sum(), (valid * w).sum()
    with torch.no_grad():
        pred = vocab[logp.argmax(-1)]  # (B, M, K) drafted tokens
        hit = (pred == batch.targets) & valid
        acc = (hit.float().sum((0, 1)) / valid.float().sum((0, 1)).clamp(min=1)).tolist()
    return total, weight, {"slot_accuracy": acc}


def held_out_blocks(
    model: YueForCausalLM,
    seqs: ChatSequences,
    feats: list[torch.Tensor],
    M: int,
    seed: int,
    per_batch: int = 8,
) -> Iterator[tuple[list[int], Batch, torch.Tensor, torch.Tensor]]:
    """Evaluation forwards over every sequence, `per_batch` at a time, M seeded blocks each: yields
    (sequence indices, the Batch, committed hidden (B, T, D), slot hidden (B, M, K, D))."""
    g = torch.Generator().manual_seed(seed)
    for s in range(0, len(seqs), per_batch):
        rows = list(range(s, min(s + per_batch, len(seqs))))
        anchors = draw_anchors(seqs, rows, M, g)
        batch = make_batch(seqs, feats, rows, anchors, model.config.block_size, model.device)
        yield (rows, batch, *block_forward(model, batch))


@torch.no_grad()
def held_out_tau(
    model: YueForCausalLM, seqs: ChatSequences, feats: list[torch.Tensor], M: int = 32, seed: int = 1
) -> dict:
    """tau = 1 + mean accepted drafts of a full block (slots 2..K, greedy), and per-slot accuracy given
    the earlier slots matched, on held-out sequences: what `verified` would see drafting every slot."""
    K = model.config.block_size
    accepted, blocks, hits, tries = 0.0, 0, torch.zeros(K), torch.zeros(K)
    for _, batch, _, slots in held_out_blocks(model, seqs, feats, M, seed):
        pred = model.draft_vocab[draft_logits(model, slots).argmax(-1)]  # (B, M, K)
        ok = (pred == batch.targets) & (batch.targets >= 0)
        ok[:, :, 0] = batch.targets[:, :, 0] >= 0  # slot 1 is revealed: the AR token itself
        run = ok.long().cumprod(-1)  # slots 1..i all matched
        accepted += float((run[:, :, 1:].sum(-1)).sum())
        blocks += run.shape[0] * run.shape[1]
        prev = torch.cat([torch.ones_like(run[..., :1]), run[..., :-1]], -1).bool().cpu()  # slots < i matched
        hits += (ok.cpu() & prev).float().sum((0, 1))
        tries += prev.float().sum((0, 1))
    return {
        "tau": 1 + accepted / max(blocks, 1),
        "conditional_accuracy": [round(float(h / max(t, 1)), 4) for h, t in zip(hits, tries, strict=True)][
            1:
        ],
    }


def trainable_parameters(model: YueForCausalLM) -> list[torch.nn.Parameter]:
    """The NAR set of the top layers and the slot entry; everything else frozen."""
    params = []
    for name, p in model.named_parameters():
        train = ".nar_" in name or name.startswith("model.slot_entry.")
        p.requires_grad_(train)
        if train:
            params.append(p)
    return params


class NARParts(nn.Module):
    """The trainable part of a top-layer NAR model (slot entry + the top layers' NAR sets), as one
    module whose state dict is what a checkpoint needs: a few percent of the model's bytes."""

    def __init__(self, model: YueForCausalLM) -> None:
        super().__init__()
        self.slot_entry = model.model.slot_entry
        self.layers = nn.ModuleDict(
            {str(i): _NARSet(layer) for i, layer in enumerate(model.model.layers) if layer.has_nar}
        )


class _NARSet(nn.Module):
    def __init__(self, layer) -> None:
        super().__init__()
        self.input_layernorm = layer.nar_input_layernorm
        self.self_attn = layer.nar_self_attn
        self.post_attention_layernorm = layer.nar_post_attention_layernorm
        self.mlp = layer.nar_mlp


class TopNARObjective(nn.Module):
    """The training forward as one module (what accelerate wraps): Batch -> block_loss's terms."""

    def __init__(self, model: YueForCausalLM, cfg: TopNARConfig) -> None:
        super().__init__()
        self.model, self.cfg = model, cfg

    def forward(self, batch: Batch) -> tuple[torch.Tensor, torch.Tensor, dict]:
        use_amp = self.model.device.type == "cuda"
        with torch.autocast(self.model.device.type, dtype=torch.bfloat16, enabled=use_amp):
            return block_loss(self.model, batch, self.cfg)


def train_top_nar(
    model: YueForCausalLM,
    train: ChatSequences,
    train_feats: list[torch.Tensor],
    held: ChatSequences,
    held_feats: list[torch.Tensor],
    cfg: TopNARConfig = TopNARConfig(),
    run_dir: str | Path | None = None,
    on_eval: Callable[[dict], None] = lambda record: None,
    progress: bool = True,
    accelerator: Accelerator | None = None,
    stop_at: int | None = None,
) -> list[dict]:
    """Train the top-layer NAR set (and slot entry) in place; returns the evaluation history
    (step, training answer tokens seen, loss, held-out tau and conditional accuracies).
    `stop_at` stops after that many steps without finishing (an interruption, for tests).

    Runs on one process or under `accelerate launch` (`cfg.batch_size` is the global batch). With
    `run_dir`, an atomic checkpoint (NAR parts, optimizer, data position, history) is written at every
    evaluation, and a run finding one there resumes from it: same batches, same result, whatever the
    number of processes.
    """
    trainer = Trainer(
        TopNARObjective(model, cfg),
        trainable_parameters(model),
        cfg,
        cfg.batch_size,
        saved=NARParts(model),
        run_dir=run_dir,
        betas=(0.9, 0.98),
        accelerator=accelerator,
        shardable=True,
    )
    state = trainer.resume()
    first, history, tokens_seen = state["step"], state.get("history", []), state.get("tokens_seen", 0)
    t0, losses, K = time.perf_counter(), [], model.config.block_size
    end = cfg.steps if stop_at is None else min(cfg.steps, stop_at)
    bar = tqdm(
        range(first, end), desc="top-layer NAR", unit="step", disable=not (progress and trainer.is_main)
    )
    for step in bar:
        batch, chosen = training_batch(train, train_feats, step, cfg, K, trainer.rows(), model.device)
        model.train()
        total, weight, metrics = trainer.net(batch)
        loss, value = trainer.global_mean(total, weight)
        if not math.isfinite(value):  # stop before the update: one NaN step poisons every later one
            raise ValueError(
                f"top-layer NAR training: the loss is {value} at step {step + 1} (non-finite entry "
                "features or weights); the NAR set is left as it was before this step"
            )
        trainer.update(loss, step)
        losses.append(value)
        tokens_seen += sum(len(train.ids[i]) - train.prompt_lens[i] for i in chosen)
        bar.set_postfix(loss=f"{value:.3f}", s2=f"{metrics['slot_accuracy'][1]:.2f}")
        if (step + 1) % cfg.eval_every == 0 or step + 1 == cfg.steps:
            model.eval()
            with trainer.whole():  # under FSDP the model is whole only in here
                tau = held_out_tau(model, held, held_feats)
            record = {
                "step": step + 1,
                "answer_tokens_seen": tokens_seen,
                "loss": sum(losses) / len(losses),
                "minutes": (time.perf_counter() - t0) / 60,
                **tau,
            }
            losses = []
            history.append(record)
            log.info("top-layer NAR: %s", json.dumps(record))
            trainer.save(step + 1, {"history": history, "tokens_seen": tokens_seen})
            on_eval(record)
    trainer.close()
    model.eval()
    for p in model.parameters():
        p.requires_grad_(False)
    return history


# --------------------------------------------------------------------------------------------------
# 5. Router examples from top-layer blocks


@torch.no_grad()
def router_examples(
    model: YueForCausalLM, seqs: ChatSequences, feats: list[torch.Tensor], M: int = 32, seed: int = 2
) -> RouterExamples:
    """Router features and acceptance labels of blocks as decoding's drafting pass shows them (slot 1
    revealed, the drafting head, the anchor's final hidden state and AR logits), in training-style
    forwards over held-out sequences; one group per sequence."""
    K = model.config.block_size
    parts = []
    for rows, batch, committed, slots in held_out_blocks(model, seqs, feats, M, seed):
        B, M_, _, D = slots.shape
        h_anchor = committed.gather(1, batch.anchors[:, :, None].expand(B, M_, D))  # (B, M, D)
        ar_logits = model.lm_head(h_anchor)  # (B, M, V)
        slot_logits = model.slot_logits(slots.flatten(1, 2)).view(B, M_, K, -1)
        slot_logits = revealed_slot1(slot_logits, batch.targets[:, :, :1].clamp(min=0))
        feats_ = model.router.features(
            h_anchor.flatten(0, 1), ar_logits.flatten(0, 1), slot_logits.flatten(0, 1), slot1_revealed=True
        )
        valid = (batch.targets >= 0).all(-1).flatten()  # whole blocks inside the sequence
        labels = acceptance_labels(slot_logits.argmax(-1), batch.targets).flatten(0, 1)
        confidence = F.softmax(slot_logits.float(), -1).amax(-1).flatten(0, 1)
        group = torch.tensor(rows).repeat_interleave(M_)
        parts.append(
            RouterExamples(
                feats_.float().cpu()[valid.cpu()],
                labels.cpu()[valid.cpu()],
                confidence.cpu()[valid.cpu()],
                group[valid.cpu()],
            )
        )
    return RouterExamples.cat(parts)
