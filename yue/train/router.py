"""Router training (stage 3 of docs/design.md §3): acceptance labels from the frozen towers, BCE, calibration.

Design decisions:
- Labels are the towers' own acceptance on AR-greedy sequences x (AR set frozen, so x is exactly what
  the AR path writes). One training-style forward (committed x plus M blocks of K mask slots, the mask
  of `masks.training_mask`) gives, for a block anchored at t, the same hidden state, AR logits and
  slot logits a decode step anchored at t would see. Slot i is positive iff the argmax of slots 1..i
  equal x[t+1..t+i]: a prefix condition, so labels are monotone non-increasing in i, like a_i.
- The towers run once: features (the router's inputs) and labels are collected into tensors, and
  the small router MLP then trains for many epochs on them in milliseconds per step.
- The router trains on standardised features (hidden states and entropies live on very different
  scales); the affine standardisation is folded into its first layer afterwards, so the saved router
  has exactly the interface `Router` defines and the decode loop pays nothing for it.
- Loss: BCE between a_i = exp(log_acceptance(z)_i) and label_i, computed from log a_i with a stable
  log(1 - a) (float64), so neither a ~ 0 nor a ~ 1 produces inf or NaN.
- Reported on held-out sequences: per-slot AUC (rank-based Mann-Whitney, ties averaged) and expected
  calibration error (15 equal-width bins), for the router and for the raw-confidence baseline (the
  slot's max probability), which docs/design.md §7 found badly calibrated.
- User labels: JSONL {"text", "ar_spans": [[start, end], ...]} marks character spans that must be
  written by the AR path. A must-AR token at t+i zeroes the label of slot i and all later slots of the
  block anchored at t; elsewhere labels are the towers' acceptance of the text itself.
"""

from __future__ import annotations

import copy
import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from yue.kernels import prepare_for_decoding
from yue.kernels.prepare import dtype_name, resolve_drafting_dtype
from yue.model.masks import slot_positions, training_mask
from yue.model.mot import YueForCausalLM
from yue.model.prepared import PreparedModel, as_decoded
from yue.model.router import Router, revealed_slot1
from yue.train.router_eval import RouterExamples, evaluate_router
from yue.train.trainer import StageTimer, adamw

log = logging.getLogger(__name__)


# --------------------------------------------------------------------------------------------------
# Labels and features


def acceptance_labels(slot_tokens: torch.Tensor, targets: torch.Tensor, must_ar: torch.Tensor | None = None):
    """label_i = 1 iff slots 1..i all equal their targets (and none of those targets is must-AR).

    Args:
        slot_tokens: (..., K) argmax token of each slot.
        targets: (..., K) the token each slot should match (x[t+1..t+K]).
        must_ar: (..., K) bool, True where the target token must be written by the AR path.
    Returns:
        (..., K) float labels in {0, 1}, non-increasing along the last dim.
    """
    ok = slot_tokens == targets
    if must_ar is not None:
        ok = ok & ~must_ar
    return ok.long().cumprod(-1).float()


@torch.no_grad()
def block_examples(
    model: PreparedModel | YueForCausalLM,
    x: torch.Tensor,
    anchors: torch.Tensor,
    must_ar: torch.Tensor | None = None,
    group: torch.Tensor | None = None,
) -> RouterExamples:
    """Router features and acceptance labels for M blocks per sequence, in one training-style forward.

    Each block is shown as a decode step's drafting pass shows it (`decode/loop.py`): slot 1 revealed
    (its input is the true next token x[t+1]) and, for the router, certain of that token.

    Args:
        model: the frozen towers.
        x: (B, T) sequences (AR-greedy continuations, or user text).
        anchors: (B, M) anchor indices t with t + K <= T - 1.
        must_ar: (B, T) bool, True at tokens that must be written by the AR path (user labels).
        group: (B,) id of each sequence (for group-wise splits); default 0..B-1.
    Returns:
        RouterExamples with B*M rows, in (b, m) order.
    """
    K, mask_id = model.config.block_size, model.config.mask_token_id
    B, T = x.shape
    M = anchors.shape[1]
    device = x.device
    # 1. Forward: x through the AR set, M blocks of K slots through the NAR set (slot 1 revealed).
    slots = torch.full((B, M, K), mask_id, dtype=x.dtype, device=device)
    slots[:, :, 0] = x.gather(1, anchors + 1)
    tokens = torch.cat([x, slots.flatten(1)], dim=1)
    positions = torch.cat([torch.arange(T, device=device).expand(B, T), slot_positions(anchors, K)], dim=1)
    model = as_decoded(model)  # a drafter's decode paths (prepared), else the model as trained
    hidden = model.hidden_states(
        tokens, positions, T, training_mask(T, anchors, K).to(device)
    )  # (B, T+MK, D)
    D = hidden.shape[-1]
    # 2. What a decode step anchored at t sees: hidden[t], AR logits at t, and the block's slot logits.
    h_anchor = hidden[:, :T].gather(1, anchors[:, :, None].expand(B, M, D))  # (B, M, D)
    ar_logits = model.lm_head(h_anchor)  # (B, M, V)
    head = model.paths.draft_head or model.lm_head  # slot rows' head, lowered when drafting is
    slot_logits = head(hidden[:, T:]).view(B, M, K, -1)  # (B, M, K, V)
    slot_logits = revealed_slot1(slot_logits, slots[:, :, :1])
    feats = model.router_features(
        h_anchor.flatten(0, 1), ar_logits.flatten(0, 1), slot_logits.flatten(0, 1), slot1_revealed=True
    )
    # 3. Labels: slot i of the block at t must equal x[t+i].
    target_idx = anchors[:, :, None] + torch.arange(1, K + 1, device=device)  # (B, M, K)
    targets = x.gather(1, target_idx.flatten(1)).view(B, M, K)
    forced = must_ar.gather(1, target_idx.flatten(1)).view(B, M, K) if must_ar is not None else None
    labels = acceptance_labels(slot_logits.argmax(-1), targets, forced)
    confidence = F.softmax(slot_logits.float(), dim=-1).amax(-1)  # (B, M, K)
    group = torch.arange(B) if group is None else group.cpu()
    return RouterExamples(
        feats.float().cpu(),
        labels.flatten(0, 1).cpu(),
        confidence.flatten(0, 1).cpu(),
        group.repeat_interleave(M),
    )


def greedy_examples(
    model: YueForCausalLM,
    tokens: torch.Tensor,
    prompt_len: int,
    anchors_per_seq: int = 32,
    batch_size: int = 4,
    seed: int = 0,
) -> RouterExamples:
    """Examples from AR-greedy sequences: `anchors_per_seq` distinct anchors per row in the continuation.

    Args:
        tokens: (N, T) AR-greedy sequences (prompt then greedy continuation).
        prompt_len: anchors start at prompt_len - 1, so every slot target is an AR-greedy token.
    """
    K = model.config.block_size
    N, T = tokens.shape
    valid = torch.arange(max(prompt_len - 1, 0), T - K)  # t + K <= T - 1
    if len(valid) == 0:
        raise ValueError(f"sequences of {T} tokens leave no anchors after a {prompt_len}-token prompt")
    m = min(anchors_per_seq, len(valid))
    g = torch.Generator().manual_seed(seed)
    parts = []
    for s in range(0, N, batch_size):
        x = tokens[s : s + batch_size].to(model.device)
        anchors = torch.stack(
            [valid[torch.randperm(len(valid), generator=g)[:m]].sort().values for _ in range(len(x))]
        )
        parts.append(block_examples(model, x, anchors.to(model.device), group=torch.arange(s, s + len(x))))
    return RouterExamples.cat(parts)


# --------------------------------------------------------------------------------------------------
# User labels: character spans that must be AR


def load_user_labels(path: str | Path) -> list[tuple[str, list[tuple[int, int]]]]:
    """Read JSONL {"text": str, "ar_spans": [[start, end], ...]}; errors name the line."""
    records = []
    with open(path, encoding="utf-8") as f:
        for i, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
                text, spans = obj["text"], obj.get("ar_spans", [])
                spans = [(int(a), int(b)) for a, b in spans]
            except (ValueError, KeyError, TypeError) as e:
                raise ValueError(
                    f'{path}:{i}: expected {{"text": str, "ar_spans": [[start, end], ...]}} ({e})'
                ) from e
            if not isinstance(text, str):
                raise ValueError(f'{path}:{i}: "text" must be a string')
            bad = [(a, b) for a, b in spans if not 0 <= a < b <= len(text)]
            if bad:
                raise ValueError(
                    f"{path}:{i}: spans {bad} are not within the text (0 <= start < end <= {len(text)})"
                )
            records.append((text, spans))
    if not records:
        raise ValueError(f"{path} holds no labelled texts")
    return records


def must_ar_tokens(offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> torch.Tensor:
    """(T,) bool: token j is must-AR when its character span [s, e) overlaps any span [a, b)."""
    out = torch.zeros(len(offsets), dtype=torch.bool)
    for j, (s, e) in enumerate(offsets):
        out[j] = any(s < b and a < max(e, s + 1) for a, b in spans)
    return out


def user_label_examples(
    model: YueForCausalLM, tokenizer, records, max_anchors_per_forward: int = 64
) -> RouterExamples:
    """Examples from user-labelled texts: every anchor t with t + K < T, labels zeroed at must-AR tokens.

    Args:
        tokenizer: a `tokenizers.Tokenizer` (its `Encoding.offsets` map tokens to characters).
        records: from `load_user_labels`.
    """
    K = model.config.block_size
    parts = []
    for gid, (text, spans) in enumerate(records):
        enc = tokenizer.encode(text, add_special_tokens=False)
        T = len(enc.ids)
        if T < K + 1:
            log.warning("user-label text %d has %d tokens (< K+1 = %d): skipped", gid, T, K + 1)
            continue
        x = torch.tensor([enc.ids], device=model.device)
        forced = must_ar_tokens(enc.offsets, spans)[None].to(model.device)
        all_anchors = torch.arange(0, T - K, device=model.device)
        for s in range(0, len(all_anchors), max_anchors_per_forward):
            a = all_anchors[s : s + max_anchors_per_forward][None]
            parts.append(block_examples(model, x, a, forced, group=torch.tensor([gid])))
    if not parts:
        raise ValueError(f"no user-labelled text is longer than K+1 = {K + 1} tokens")
    return RouterExamples.cat(parts)


# --------------------------------------------------------------------------------------------------
# Training


def log1mexp(x: torch.Tensor) -> torch.Tensor:
    """log(1 - exp(x)) for x <= 0, stable at both ends (Mächler 2012). x is clamped just below 0."""
    x = x.clamp(max=-1e-12)
    return torch.where(x > -0.6931, torch.log(-torch.expm1(x)), torch.log1p(-torch.exp(x)))


def router_bce(z: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean BCE between a_i = prod_{j<=i} sigmoid(z_j) and labels (N, K), from log a_i (float64)."""
    log_a = Router.log_acceptance(z.double())
    y = labels.double()
    return -(y * log_a + (1 - y) * log1mexp(log_a)).mean()


@torch.no_grad()
def standardise_inputs(router: Router, mean: torch.Tensor, std: torch.Tensor) -> None:
    """Rewrite fc1 in place so the router takes u = (f - mean) / std instead of f (same outputs)."""
    w = router.fc1.weight
    router.fc1.bias += w @ mean.to(w)
    w *= std.to(w)[None, :]


@torch.no_grad()
def unstandardise_inputs(router: Router, mean: torch.Tensor, std: torch.Tensor) -> None:
    """Inverse of `standardise_inputs`: fold the standardisation back into fc1."""
    w = router.fc1.weight
    w /= std.to(w)[None, :]
    router.fc1.bias -= w @ mean.to(w)


@dataclass(frozen=True)
class RouterTrainConfig:
    """Router optimisation (`yue train-router`'s options). Defaults: seconds on a CPU for ~10^4-10^5 blocks.

    Attributes:
        epochs: router training epochs.
        batch_size: labelled blocks per optimizer step.
        lr: router learning rate.
        weight_decay: AdamW's weight decay.
        reinit: a fresh router (stage 3); False fine-tunes the current one (on user labels).
        seed: seed for init and batch order (`yue train-router`: also prompts, anchors and the held-out split).
    """

    epochs: int = 30
    batch_size: int = 512
    lr: float = 3e-3
    weight_decay: float = 1e-4
    reinit: bool = True
    seed: int = 0

    def __post_init__(self) -> None:
        if self.epochs < 1 or self.batch_size < 1:
            raise ValueError(f"epochs and batch_size must be >= 1, got {self.epochs}, {self.batch_size}")
        if not 0 < self.lr < 1:
            raise ValueError(f"lr must be in (0, 1), got {self.lr}")


def train_router(
    router: Router, train: RouterExamples, cfg: RouterTrainConfig = RouterTrainConfig()
) -> list[float]:
    """Fit the router to the examples with BCE; only the router's parameters change.

    Returns:
        the mean training loss of each epoch.
    """
    torch.manual_seed(cfg.seed)
    if cfg.reinit:
        router.fc1.reset_parameters()
        router.fc2.reset_parameters()
    feats = train.features.to(router.fc1.weight)
    mean = feats.mean(0)
    std = feats.std(0)
    std = torch.where(std > 1e-6, std, torch.ones_like(std))  # constant features (e.g. "present" flags)
    u = (feats - mean) / std
    labels = train.labels.to(u.device)
    standardise_inputs(router, mean, std)
    router.train()
    for p in router.parameters():
        p.requires_grad_(True)
    opt = adamw(list(router.parameters()), cfg.lr, cfg.weight_decay, betas=(0.9, 0.999))
    g = torch.Generator().manual_seed(cfg.seed)
    history = []
    try:
        for _ in range(cfg.epochs):
            perm = torch.randperm(len(u), generator=g)
            total = 0.0
            for s in range(0, len(u), cfg.batch_size):
                rows = perm[s : s + cfg.batch_size]
                loss = router_bce(router(u[rows]), labels[rows])
                opt.zero_grad(set_to_none=True)
                loss.backward()
                opt.step()
                total += loss.item() * len(rows)
            history.append(total / len(u))
    finally:
        unstandardise_inputs(router, mean, std)
        router.eval()
    return history


# --------------------------------------------------------------------------------------------------
# Stage 3 end to end (`yue train-router`)


def run_train_router(
    model_dir: str | Path,
    out_dir: str | Path | None = None,
    data: str | Path | None = None,
    corpus: str = "stdlib",
    n_sequences: int = 256,
    prompt_len: int = 64,
    new_tokens: int = 192,
    anchors_per_seq: int = 48,
    user_labels: str | Path | None = None,
    held_out: float = 0.2,
    cfg: RouterTrainConfig | None = None,
    val_fraction: float = 0.02,
    seed: int = 0,
    drafting_dtype: str = "auto",
) -> dict:
    """Train (or, with `user_labels`, fine-tune) the router of the model in `model_dir`; save it to `out_dir`.

    Args:
        model_dir: a yue model folder; its towers stay frozen.
        out_dir: where to save the model with its new router (default: `model_dir` itself).
        data, corpus, n_sequences, prompt_len, new_tokens, anchors_per_seq, user_labels, val_fraction:
            where the examples come from (`collect_router_examples`).
        held_out: share of source sequences held out for the AUC/ECE report.
        drafting_dtype: collect the features from drafts in this precision, as `yue.load` will draft
            ("auto": int8 on a CPU with torch's int8 engine; "int8", "bfloat16", "float32").
    Returns:
        the report (also written to `out_dir/router_report.json`).
    """
    from yue.model.hf import load_model
    from yue.tokenizer import YueTokenizer
    from yue.train.selfdistill import save_model_folder

    timer = StageTimer()
    out_dir = Path(out_dir) if out_dir is not None else Path(model_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    model = load_model(model_dir)
    for p in model.parameters():
        p.requires_grad_(False)
    # Features come from the model as decoding will run it (prepared, drafts maybe lowered); the
    # router trained is the plain model's, which is saved.
    lowered = resolve_drafting_dtype(drafting_dtype, model.device)
    drafter = prepare_for_decoding(copy.deepcopy(model), lowered)
    tokenizer = YueTokenizer.load(model_dir)
    cfg = cfg or RouterTrainConfig(reinit=user_labels is None, seed=seed)
    examples = collect_router_examples(
        model, drafter, tokenizer.tokenizer, model_dir, out_dir, data=data, user_labels=user_labels,
        corpus=corpus, n_sequences=n_sequences, prompt_len=prompt_len, new_tokens=new_tokens,
        anchors_per_seq=anchors_per_seq, val_fraction=val_fraction, seed=seed,
    )  # fmt: skip
    timer.mark("collect_s")
    fit = fit_and_evaluate(model.router, examples, held_out, cfg, seed, timer)
    for p in model.parameters():
        p.requires_grad_(True)
    save_model_folder(model, tokenizer.tokenizer, out_dir, src_dir=model_dir)
    report = {
        "mode": "user-label fine-tune" if user_labels is not None else "acceptance labels (AR-greedy)",
        "features": f"separate drafting pass (slot 1 revealed), drafts in {dtype_name(lowered)}",
        "model": str(model_dir),
        **fit,
    }
    (out_dir / "router_report.json").write_text(json.dumps(report, indent=2))
    return report


def collect_router_examples(
    model: YueForCausalLM,
    drafter: YueForCausalLM,
    tokenizer,
    model_dir: str | Path,
    out_dir: Path,
    *,
    data: str | Path | None,
    user_labels: str | Path | None,
    corpus: str,
    n_sequences: int,
    prompt_len: int,
    new_tokens: int,
    anchors_per_seq: int,
    val_fraction: float,
    seed: int,
) -> RouterExamples:
    """The router's examples: acceptance labels on AR-greedy sequences, and/or on user-labelled texts.

    Args:
        model: the frozen towers, which write the greedy sequences; drafter: the same model prepared
            for decoding, whose drafting pass gives the features and labels.
        tokenizer: a `tokenizers.Tokenizer`.
        data: an AR-greedy sequence file (`selfdistill.GreedySequences`); if None, `n_sequences` are
            generated from the *validation* split of `corpus` (text the towers never trained on, like the
            text the router meets at decode time) and saved to `out_dir/data/router_sequences.safetensors`.
        user_labels: JSONL of must-AR spans; then the current router is fine-tuned on those texts instead
            of trained afresh, mixed with AR-greedy examples (from `data`, else from the sequences an
            earlier `train-router` saved in `model_dir/data/`, if any) so it keeps what it knew.
    """
    from yue.train.selfdistill import GreedySequences, build_greedy_sequences, corpus_documents

    replay = Path(model_dir) / "data" / "router_sequences.safetensors"
    if user_labels is not None and data is None and replay.is_file():
        data = replay
    parts: list[RouterExamples] = []
    if user_labels is None or data is not None:
        if data is not None:
            seqs = GreedySequences.load(data)
        else:
            docs = corpus_documents(corpus, tokenizer, "validation", val_fraction)
            seqs = build_greedy_sequences(model, docs, n_sequences, prompt_len, new_tokens, seed=seed)
            seqs.save(
                out_dir / "data" / "router_sequences.safetensors",
                corpus=corpus,
                split="validation",
                seed=str(seed),
            )
        parts.append(greedy_examples(drafter, seqs.tokens, seqs.prompt_len, anchors_per_seq, seed=seed))
    if user_labels is not None:
        user = user_label_examples(drafter, tokenizer, load_user_labels(user_labels))
        user.group += 1_000_000  # keep group ids distinct from the greedy sequences'
        parts.append(user)
    return RouterExamples.cat(parts)


def fit_and_evaluate(
    router: Router,
    examples: RouterExamples,
    held_out: float,
    cfg: RouterTrainConfig,
    seed: int,
    timer: StageTimer,
) -> dict:
    """Train the router on the examples of all but a `held_out` share of their source sequences (split
    by group); report the blocks, the stage's times (`timer`, plus "train_s"), the epoch losses and
    AUC/ECE on the held-out share before and after (all examples when none is held out)."""
    train, held = examples.split_by_group(held_out, seed=seed)
    if len(held) == 0:
        held = train
    before = evaluate_router(router, held)
    timer.restart()
    history = train_router(router, train, cfg)
    timer.mark("train_s")
    return {
        "train_blocks": len(train),
        "held_out_blocks": len(held),
        **timer.marks,
        "epoch_losses": [round(v, 5) for v in history],
        "before": before,
        "held_out": evaluate_router(router, held),
    }
