"""The joint AR + NAR objective of docs/design.md §3, in one forward pass.

    L = α · CE_AR + β · CE_NAR + γ · KL( sg(p_AR) ‖ p_NAR )

One forward runs the committed sequence x (B, T) through the AR set and M blocks of K mask slots
through the NAR set (mask from `yue.model.masks.training_mask`). The block anchored at t has slots
s_1..s_K at RoPE positions t+1..t+K; slot i sees x[0..t] and its own block, and predicts x[t+i].

- CE_AR: next-token cross-entropy over committed positions 0..T-2.
- CE_NAR: cross-entropy of slot i against x[t+i], over slots whose input is `<|mask|>`.
- KL: for slot i the target is the AR path's distribution at position t+i-1, i.e. the AR prediction of
  the same token x[t+i], detached (sg). Slot 1's target is thus the AR prediction at the anchor.
- Mask-predict reveals: with probability `reveal_prob` a slot's input is its true token instead of
  `<|mask|>`, so refinement passes (slots conditioned on drafts) are in distribution; revealed slots
  carry no NAR/KL loss (their answer is their input).

For NAR-only fine-tuning (stage 2, `yue distill`), set `LossWeights(ar=0.0, ...)` and freeze
everything but the NAR set with `set_trainable(model, "nar")`: the AR logits are then computed without
a graph and the AR path's outputs cannot change.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from yue.model.masks import slot_positions, training_mask
from yue.model.mot import YueForCausalLM

TrainableSet = Literal["all", "nar"]


@dataclass(frozen=True)
class LossWeights:
    """α, β, γ of the joint loss. Defaults from docs/design.md §3."""

    ar: float = 1.0
    nar: float = 0.8
    kl: float = 0.2

    def __post_init__(self) -> None:
        for name in ("ar", "nar", "kl"):
            v = getattr(self, name)
            if not v >= 0.0:
                raise ValueError(f"loss weight {name} must be >= 0, got {v!r}")

    def as_dict(self) -> dict[str, float]:
        return {"ar": self.ar, "nar": self.nar, "kl": self.kl}


@dataclass
class JointLoss:
    """Result of `joint_loss`. `total` carries the graph; the rest are detached scalars / (K,) tensors."""

    total: torch.Tensor
    ar: torch.Tensor
    nar: torch.Tensor
    kl: torch.Tensor
    nar_acc_per_slot: torch.Tensor  # (K,) argmax accuracy of slot i over masked (not revealed) slots
    nar_count_per_slot: torch.Tensor  # (K,) how many masked slots each accuracy averages over
    # The total's two parts with the graph, for a batch split over processes: α·CE_AR is a mean over
    # equal rows (processes' shares average exactly); β·ΣCE_NAR + γ·ΣKL over the masked slots is divided
    # by the masked slots of the whole global batch (`Trainer.global_mean`).
    ar_term: torch.Tensor
    slot_sum: torch.Tensor


class TrainingForward(nn.Module):
    """The training forward as a module, so `accelerate`/DDP can wrap it and sync gradients.

    forward(tokens (B, S), positions (B, S), n_committed, mask (B, 1, S, S)) -> logits (B, S, V).
    """

    def __init__(self, model: YueForCausalLM) -> None:
        super().__init__()
        self.model = model

    def forward(
        self, tokens: torch.Tensor, positions: torch.Tensor, n_committed: int, mask: torch.Tensor
    ) -> torch.Tensor:
        hidden = self.model.model(tokens, positions, n_committed, mask)  # (B, S, D)
        return self.model.lm_head(hidden)  # (B, S, V)


def set_trainable(model: YueForCausalLM, which: TrainableSet) -> list[nn.Parameter]:
    """Freeze what is not trained and return the trainable parameters.

    `all`: AR set, NAR set, embedding, final norm (stage 1). `nar`: the NAR set only; embedding, final
    norm and tied LM head are shared with the AR path, so they stay frozen too. The router is always
    frozen here (it is trained separately, on the final towers).
    """
    trainable = []
    for name, p in model.named_parameters():
        nar_side = ".nar_" in name or name.startswith("anchor_head.")  # the count head plans for the fill
        on = not name.startswith("router.") and (which == "all" or nar_side)
        p.requires_grad_(on)
        if on:
            trainable.append(p)
    return trainable


def sample_anchors(
    batch: int, seq_len: int, n_blocks: int, block_size: int, generator: torch.Generator
) -> torch.Tensor:
    """M anchors per sequence, uniform in [0, T-K-1] so every slot's target x[t+i] exists. (B, M) long."""
    high = seq_len - block_size  # exclusive upper bound: t + K <= T - 1
    if high < 1:
        raise ValueError(f"seq_len {seq_len} must exceed block_size {block_size}")
    return torch.randint(0, high, (batch, n_blocks), generator=generator)


def draw_reveals(
    batch: int,
    n_blocks: int,
    block_size: int,
    reveal_prob: float,
    generator: torch.Generator | None,
    reveal_first: float | None = None,
) -> torch.Tensor:
    """(B, M, K) bool: which slots get their true token as input (see `joint_loss`)."""
    chance = torch.full((block_size,), float(reveal_prob))
    if reveal_first is not None:
        chance[0] = reveal_first
    return torch.rand(batch, n_blocks, block_size, generator=generator) < chance


def joint_loss(
    model: YueForCausalLM | nn.Module,
    tokens: torch.Tensor,
    anchors: torch.Tensor,
    block_size: int,
    weights: LossWeights = LossWeights(),
    reveal_prob: float = 0.1,
    generator: torch.Generator | None = None,
    reveal_first: float | None = None,
    reveal: torch.Tensor | None = None,
    bias: torch.Tensor | None = None,
) -> JointLoss:
    """The joint loss on one batch, in one forward.

    Args:
        model: a `YueForCausalLM`, or a (possibly DDP-wrapped) `TrainingForward` around one.
        tokens: (B, T) long, committed sequences x.
        anchors: (B, M) long, block anchors in [0, T-K-1] (see `sample_anchors`).
        block_size: K, slots per block.
        weights: α, β, γ. A zero weight skips that term's work where it can.
        reveal_prob: chance a slot's input is its true token (mask-predict); 0 in evaluation.
        generator: CPU generator for the reveals (pass one for determinism).
        reveal_first: chance slot 1 is revealed (None: `reveal_prob`, like the other slots). The decode
            loop's drafting pass always reveals slot 1 (the AR path's token, known by then), so
            self-distillation can train mostly on that case.
        reveal: (B, M, K) or (B, M*K) bool, the reveals drawn already (`draw_reveals`, e.g. for a global
            batch of which this is one process's share; the anchor objective's, `train/anchor.py`: a
            block's anchor slot only); None draws them here from `generator`.
        bias: (B, M*K, T + M*K) float, added to the slots' attention logits where the mask lets them
            attend (the anchor objective's pull toward anchor keys); None = none.
    Returns:
        JointLoss with the weighted total and each term.
    """
    net = TrainingForward(model) if isinstance(model, YueForCausalLM) else model
    inner: YueForCausalLM = net.module.model if hasattr(net, "module") else net.model
    B, T = tokens.shape
    M, K = anchors.shape[1], block_size
    device = tokens.device

    # 1. Slot targets: slot i of the block at t predicts x[t+i]. (B, M*K)
    offsets = torch.arange(1, K + 1, device=device)
    target_idx = (anchors[:, :, None] + offsets).flatten(1)  # (B, M*K), = RoPE position
    targets = tokens.gather(1, target_idx)  # (B, M*K)

    # 2. Slot inputs: <|mask|>, or the true token where revealed.
    if reveal is None:
        reveal = draw_reveals(B, M, K, reveal_prob, generator, reveal_first)
    reveal = reveal.flatten(1).to(device)  # (B, M*K)
    slot_in = torch.where(reveal, targets, torch.full_like(targets, inner.config.mask_token_id))

    # 3. One forward: committed tokens then the slots, with the training mask.
    logits = _slots_forward(net, tokens, slot_in, anchors, K, bias)  # (B, T + M*K, V)
    ar_logits, slot_logits = logits[:, :T], logits[:, T:]  # (B, T, V), (B, M*K, V)

    # 4-6. The terms: AR, NAR on masked slots, KL to the AR path's distribution.
    keep = ~reveal  # (B, M*K)
    ar, nar, kl, slot_sum = _loss_terms(ar_logits, slot_logits, tokens, target_idx, targets, keep, weights)
    total = weights.ar * ar + weights.nar * nar + weights.kl * kl

    # 7. Per-slot accuracy of the argmax, over masked slots. slot index = position within block.
    with torch.no_grad():
        hit = (slot_logits.argmax(-1) == targets) & keep  # (B, M*K)
        hits = hit.view(B, M, K).sum((0, 1)).float()  # (K,)
        count = keep.view(B, M, K).sum((0, 1)).float()  # (K,)
        acc = hits / count.clamp(min=1)
    return JointLoss(total, ar.detach(), nar.detach(), kl.detach(), acc, count, weights.ar * ar, slot_sum)


def _slots_forward(
    net: nn.Module,
    tokens: torch.Tensor,
    slot_in: torch.Tensor,
    anchors: torch.Tensor,
    K: int,
    bias: torch.Tensor | None,
) -> torch.Tensor:
    """Logits (B, T + M*K, V), float32, of the committed tokens (B, T) then the slots' inputs
    (B, M*K), with the training mask (plus `bias` on the slots' rows, see `joint_loss`)."""
    B, T = tokens.shape
    device = tokens.device
    inputs = torch.cat([tokens, slot_in], dim=1)  # (B, T + M*K)
    positions = torch.cat([torch.arange(T, device=device).expand(B, T), slot_positions(anchors, K)], dim=1)
    mask = training_mask(T, anchors, K).to(device)  # (B, 1, S, S)
    if bias is not None:  # additive: -inf where blocked, the slots' rows plus their bias
        additive = torch.zeros(mask.shape, device=device).masked_fill_(~mask, float("-inf"))
        additive[:, 0, T:] += bias
        mask = additive
    return net(inputs, positions, T, mask).float()


def _loss_terms(
    ar_logits: torch.Tensor,
    slot_logits: torch.Tensor,
    tokens: torch.Tensor,
    target_idx: torch.Tensor,
    targets: torch.Tensor,
    keep: torch.Tensor,
    weights: LossWeights,
) -> tuple[torch.Tensor, ...]:
    """(CE_AR, CE_NAR, KL, β·ΣCE_NAR + γ·ΣKL): the NAR and KL terms are means (and the last one a sum)
    over the masked slots `keep` (B, M*K); a term whose weight is 0 is skipped where it can be (0).

    Args:
        ar_logits: (B, T, V); slot_logits: (B, M*K, V); tokens: (B, T);
        target_idx, targets: (B, M*K) each slot's target position and token.
    """
    zero = ar_logits.new_zeros(())
    # 4. AR: next-token cross-entropy.
    ar = F.cross_entropy(ar_logits[:, :-1].flatten(0, 1), tokens[:, 1:].flatten()) if weights.ar else zero
    # 5. NAR: cross-entropy on masked slots only.
    n_keep = keep.sum().clamp(min=1)
    slot_logp = F.log_softmax(slot_logits, dim=-1)  # (B, M*K, V)
    nll = -slot_logp.gather(-1, targets[..., None]).squeeze(-1)  # (B, M*K)
    nll_sum = (nll * keep).sum()
    nar = nll_sum / n_keep
    # 6. KL(sg(p_AR) || p_NAR): AR distribution at t+i-1 predicts the same token x[t+i] as slot i.
    kl = kl_sum = zero
    if weights.kl:
        ar_at = ar_logits.detach().gather(1, (target_idx - 1)[..., None].expand(-1, -1, ar_logits.shape[-1]))
        ar_logp = F.log_softmax(ar_at, dim=-1)  # (B, M*K, V)
        kl_per = (ar_logp.exp() * (ar_logp - slot_logp)).sum(-1)  # (B, M*K)
        kl_sum = (kl_per * keep).sum()
        kl = kl_sum / n_keep
    return ar, nar, kl, weights.nar * nll_sum + weights.kl * kl_sum
