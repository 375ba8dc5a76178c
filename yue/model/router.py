"""The router: from one step's features to per-slot acceptance probabilities (docs/design.md §1).

Design decisions:
- Inputs are what a decode step already has in hand: the last committed position's hidden state, the
  AR path's next-token entropy, and, per slot, the draft's max probability and entropy (plus a 0/1
  "slot present" flag, so a block shorter than K reads as such). No extra forward pass.
- Output a_i is the probability that slots 1..i ALL match what the AR path would write. It is built
  as a running product of per-slot conditional probabilities, a_i = prod_{j<=i} sigmoid(z_j), so it
  is monotone non-increasing in i by construction (an accepted prefix can only shrink).
- p_ar(i) = 1 - a_i; one rule everywhere: slot i is drafted only when p_ar(i) <= the draft gate
  (`DecodeConfig.draft_gate`: `verified`'s router_threshold; `hybrid` drafts as `verified` does by default).
- A two-layer MLP of width 64: about 0.3% of the default model's parameters.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from yue.config import YueConfig


def entropy_of_logprobs(logp: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of log-probabilities over the last dim. (..., V) -> (...)."""
    return -(logp.exp() * logp).sum(-1)


def entropy(logits: torch.Tensor) -> torch.Tensor:
    """Shannon entropy (nats) of logits over the last dim. (..., V) -> (...)."""
    return entropy_of_logprobs(F.log_softmax(logits.float(), dim=-1))


def softmax_stats(logits: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's largest softmax probability and its entropy (nats), in float32: (..., V) -> (...), (...)."""
    logp = F.log_softmax(logits.float(), dim=-1)
    return logp.amax(-1).exp(), entropy_of_logprobs(logp)


def revealed_slot1(slot_logits: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """Slot logits as the router sees a block whose slot 1 was revealed (its input was its true token):
    slot 1 certain of `token`. A revealed slot's own output is untrained (it carries no loss).

    slot_logits: (..., K, V); token: (..., 1) long. Returns a new tensor, same shape.
    """
    out = slot_logits.clone()
    out[..., 0, :] = torch.full_like(out[..., 0, :], -30.0).scatter_(-1, token, 30.0)
    return out


class Router(nn.Module):
    """features (B, D + 1 + 3K) -> conditional acceptance logits z (B, K)."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        self.block_size = config.block_size
        n_in = config.hidden_size + 1 + 3 * config.block_size
        self.fc1 = nn.Linear(n_in, config.router_hidden_size)
        self.fc2 = nn.Linear(config.router_hidden_size, config.block_size)

    def features(
        self,
        hidden_last: torch.Tensor,
        ar_logits_last: torch.Tensor,
        slot_logits: torch.Tensor,
        slot1_revealed: bool = False,
        ar_entropy: torch.Tensor | None = None,
        stats: Callable | None = None,
    ) -> torch.Tensor:
        """Assemble router inputs.

        Args:
            hidden_last: (B, D) final-norm hidden state of the block's anchor (last committed position).
            ar_logits_last: (B, V) AR logits at that position (unread where `ar_entropy` is given).
            slot_logits: (B, n, V) NAR logits of the block's n <= K slots.
            slot1_revealed: slot 1's input was its true token (a drafting pass; `revealed_slot1`). Its
                own output is untrained, so it reads as certain (max probability 1, entropy 0, what
                `revealed_slot1`'s logits give to float precision) and its logits are not computed on.
            ar_entropy: (B,) the AR logits' entropy where the step had it already (a screened greedy
                step's, `StepOutput.ar_entropy`), else None.
            stats: `softmax_stats`'s stand-in (a prepared model's `DecodePaths.softmax_stats`, yue's row
                kernel's), else None (`softmax_stats`).
        Returns:
            (B, D + 1 + 3K) float32 features; slots past n are zero with their "present" flag off.
        """
        B, n, _ = slot_logits.shape
        K, r = self.block_size, int(slot1_revealed)
        stats = stats or softmax_stats
        if ar_entropy is None:
            ar_entropy = stats(ar_logits_last)[1]  # (B,)
        top, ent = stats(slot_logits[:, r:])  # (B, n - r): the slots computed on
        per_slot = torch.zeros(B, 3, K, device=slot_logits.device)
        per_slot[:, 0, :r] = 1.0
        per_slot[:, 0, r:n] = top  # max probability
        per_slot[:, 1, r:n] = ent
        per_slot[:, 2, :n] = 1.0  # present
        return torch.cat([hidden_last.float(), ar_entropy[:, None].float(), per_slot.flatten(1)], dim=-1)

    def forward(self, features: torch.Tensor) -> torch.Tensor:
        """Conditional logits z: sigmoid(z_i) = P(slot i matches | slots 1..i-1 matched). (B, K)."""
        return self.fc2(F.silu(self.fc1(features.to(self.fc1.weight.dtype)))).float()

    @staticmethod
    def log_acceptance(z: torch.Tensor) -> torch.Tensor:
        """log a_i = sum_{j<=i} log sigmoid(z_j): the log-probability that slots 1..i all match. (B, K)."""
        return F.logsigmoid(z).cumsum(-1)

    def acceptance(self, features: torch.Tensor) -> torch.Tensor:
        """a_i in [0, 1], non-increasing in i. (B, K)."""
        return self.log_acceptance(self(features)).exp()
