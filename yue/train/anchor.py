"""The anchor objective (issue 47; `yue train --objective anchor`): train the NAR set to fill the gap
after an anchor span, everything but the span masked, its attention pulled toward the span's keys by
their confidence, and the anchor-count head (`model/anchors.py`), an experiment.

For each sequence:
1. One no-grad AR pass gives each token's surprisal s_j = -log p_AR(x_j | x_<j) and the hidden states.
2. Anchor spans (x_t, x_t+1) are drawn where the AR path is most surprised (Gumbel top-M over
   s_t + s_t+1): the tokens an AR path must write itself. The block anchored at t reveals slot 1 (x_t+1,
   the span's last token, as the decode's fill pass does) and masks slots 2..K, the fill.
3. The slots' attention gets + bias * p_AR(x) on the span's two keys (`anchors.fill_bias`'s rule).
4. The count head reads the hidden state at a random "prompt end" P and is taught n = the number of
   key tokens (s > KEY_SURPRISAL) in the next PLAN_HORIZON tokens over ANCHOR_SPAN, clamped to 2..12.
The NAR / KL terms are the joint loss's (`losses.joint_loss`) on the fill slots.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from yue.model.anchors import ANCHOR_SPAN, MAX_ANCHORS, MIN_ANCHORS, PLAN_HORIZON
from yue.model.mot import YueForCausalLM
from yue.model.prepared import PreparedModel, as_decoded
from yue.train.losses import JointLoss, LossWeights, joint_loss

KEY_SURPRISAL = 2.0  # nats: a token the AR path gives less than e^-2 = 0.135 counts as a key token
COUNT_SAMPLES = 4  # prompt ends per sequence for the count head


@torch.no_grad()
def ar_pass(model: YueForCausalLM | PreparedModel, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Surprisal (B, T) of each token under the AR path (0 at position 0) and hidden states (B, T, D);
    a prepared model's through its decode paths."""
    B, T = tokens.shape
    positions = torch.arange(T, device=tokens.device)
    mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril()[None, None]
    hidden = as_decoded(model).hidden_states(tokens, positions, T, mask)
    logp = model.lm_head(hidden).float().log_softmax(-1)  # (B, T, V)
    s = torch.zeros(B, T, device=tokens.device)
    s[:, 1:] = -logp[:, :-1].gather(-1, tokens[:, 1:, None])[..., 0]
    return s, hidden


def choose_spans(s: torch.Tensor, n_blocks: int, block_size: int, generator: torch.Generator) -> torch.Tensor:
    """Block anchors t (B, M) in [1, T-K-1], drawn without replacement with weights exp(s_t + s_t+1)."""
    B, T = s.shape
    score = (s[:, 1 : T - block_size] + s[:, 2 : T - block_size + 1]).cpu()  # t = 1 .. T-K-1
    u = torch.rand(score.shape, generator=generator).clamp_(1e-9, 1 - 1e-9)
    return (score - torch.log(-torch.log(u))).topk(n_blocks, dim=-1).indices.to(s.device) + 1


def span_bias(s: torch.Tensor, anchors: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    """The slots' attention bias (B, M*K, T + M*K): + scale * p_AR on each block's two span keys (the
    committed x_t and the block's own slot 1)."""
    B, T = s.shape
    M, K = anchors.shape[1], block_size
    conf = (-s).exp()  # (B, T) p_AR of each token
    bias = torch.zeros(B, M * K, T + M * K, device=s.device)
    rows = torch.arange(M * K, device=s.device)
    block = rows // K  # (M*K,)
    t = anchors[:, block]  # (B, M*K)
    b = torch.arange(B, device=s.device)[:, None]
    bias[b, rows[None], t] = scale * conf.gather(1, t)
    bias[b, rows[None], T + block[None] * K] = scale * conf.gather(1, t + 1)
    return bias


def count_loss(model: YueForCausalLM, s: torch.Tensor, hidden: torch.Tensor, generator: torch.Generator):
    """The count head's cross-entropy at COUNT_SAMPLES prompt ends per sequence (see the module docstring)."""
    B, T = s.shape
    P = torch.randint(8, T - PLAN_HORIZON, (B, COUNT_SAMPLES), generator=generator).to(s.device)
    window = P[..., None] + 1 + torch.arange(PLAN_HORIZON, device=s.device)  # (B, n, H)
    keys = (s.gather(1, window.flatten(1)).view_as(window) > KEY_SURPRISAL).sum(-1)  # (B, n)
    label = (keys // ANCHOR_SPAN).clamp(MIN_ANCHORS, MAX_ANCHORS) - MIN_ANCHORS
    h = hidden.gather(1, P[..., None].expand(-1, -1, hidden.shape[-1]))  # (B, n, D)
    return F.cross_entropy(model.anchor_head(h).flatten(0, 1), label.flatten())


def anchor_loss(
    net,
    model: YueForCausalLM,
    tokens: torch.Tensor,
    n_blocks: int,
    block_size: int,
    weights: LossWeights,
    scale: float,
    generator: torch.Generator,
) -> tuple[JointLoss, torch.Tensor]:
    """The anchor objective on one batch: (the joint loss on fill slots, with its total plus the count
    head's loss; the count loss, detached). net: what `joint_loss` takes (`TrainingForward`, maybe wrapped)."""
    s, hidden = ar_pass(model, tokens)
    anchors = choose_spans(s, n_blocks, block_size, generator)
    B, K = tokens.shape[0], block_size
    reveal = torch.zeros(B, n_blocks, K, dtype=torch.bool, device=tokens.device)
    reveal[:, :, 0] = True  # slot 1 is the span's last token; slots 2..K are the fill
    bias = span_bias(s, anchors, K, scale) if scale else None
    out = joint_loss(net, tokens, anchors, K, weights, reveal=reveal.flatten(1), bias=bias)
    count = (
        count_loss(model, s, hidden, generator) if model.anchor_head is not None else out.total.new_zeros(())
    )
    out.total = out.total + count
    return out, count.detach()
