"""The per-layer four-expert router (issue 47; `YueConfig.layer_routing` = "four-expert"), an experiment.

Today a position's parameter set follows its type: committed positions run the AR set, slots the NAR
set. The design articles propose instead a router in every layer that picks, per position, two of four
experts for the MLP sub-block:

    0  AR expert        the layer's AR MLP (`mlp`)
    1  NAR expert       the layer's NAR MLP (`nar_mlp`)
    2  fused expert     the mean of both: (mlp(x) + nar_mlp(x)) / 2
    3  fallback expert  a narrow SwiGLU MLP of its own (a quarter of the layer's width)

Design decisions:
- Only the MLP is routed. Attention (norms, Q/K/V/O) stays per type, so committed K/V never depend on
  slots and the KV cache and masks of `masks.py` hold unchanged.
- Gate logits = W x + b[type] (x: the post-attention norm's output, b: a learned bias per position type,
  initialised to favour the type's own set, so training starts near today's routing).
- Top-2 gating. In training the gate's softmax is Gumbel-perturbed (temperature `GUMBEL_TAU`), and the
  mix is (1 - EVERY_EXPERT) * (top-2, renormalised) + EVERY_EXPERT * (all four): every expert gets a
  gradient on every position, so a rarely chosen one still learns, while the forward stays close to
  top-2. At inference: the plain softmax's top 2, renormalised.
- Sticky term (`YueConfig.expert_stick` = s): a position's gate logits at layer l get + s on the expert
  it was routed to first at layer l - 1 (`ExpertRoute` carries that choice up the stack), so it keeps
  an expert once routed there.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from yue.config import YueConfig

N_EXPERTS = 4
EXPERT_NAMES = ("ar", "nar", "fused", "fallback")
# Gumbel-softmax temperature in training, and the share of the mix that every expert gets there.
GUMBEL_TAU = 1.0
EVERY_EXPERT = 0.1
# The type bias's starting value on the type's own expert (AR for committed, NAR for slots).
OWN_SET_BIAS = 2.0


@dataclass
class ExpertRoute:
    """What one forward's layers pass up the stack: each set's (committed: False, slots: True) first
    choice at the layer below, for the sticky term, and each layer's choices, for inspection.

    Attributes:
        previous: per set, (B, T) long: the expert each position was routed to first at the last layer.
        choices: per layer and set, in order, (B, T) long first choices (detached).
        probs: per layer and set, (B, T, 4) gate probabilities (with their graph, for auxiliary terms).
    """

    previous: dict[bool, torch.Tensor] = field(default_factory=dict)
    choices: list[tuple[bool, torch.Tensor]] = field(default_factory=list)
    probs: list[tuple[bool, torch.Tensor]] = field(default_factory=list)


class ExpertRouter(nn.Module):
    """A layer's gate over the four MLP experts and its fallback expert (see the module docstring)."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        d = config.hidden_size
        self.gate = nn.Linear(d, N_EXPERTS, bias=False)
        nn.init.zeros_(self.gate.weight)  # untrained: the type bias alone routes
        bias = torch.zeros(2, N_EXPERTS)  # (type: committed, slot; expert)
        bias[0, 0] = bias[1, 1] = OWN_SET_BIAS
        self.type_bias = nn.Parameter(bias)
        width = max(1, config.intermediate_size // 4)
        self.fallback_gate_up = nn.Linear(d, 2 * width, bias=False)
        self.fallback_down = nn.Linear(width, d, bias=False)
        self.stick = config.expert_stick

    def fallback(self, x: torch.Tensor) -> torch.Tensor:
        """The fallback expert: a narrow SwiGLU MLP. (B, T, D) -> (B, T, D)."""
        gate, up = self.fallback_gate_up(x).chunk(2, dim=-1)
        return self.fallback_down(F.silu(gate) * up)

    def weights(self, x: torch.Tensor, nar: bool, route: ExpertRoute | None) -> torch.Tensor:
        """Each position's mixing weights over the experts, (B, T, D) -> (B, T, 4): two non-zero at
        inference; in training the Gumbel top-2 plus EVERY_EXPERT of the whole softmax."""
        logits = self.gate(x) + self.type_bias[int(nar)]  # (B, T, 4)
        previous = None if route is None else route.previous.get(nar)
        if self.stick and previous is not None and previous.shape == logits.shape[:2]:
            logits = logits + self.stick * F.one_hot(previous, N_EXPERTS).to(logits.dtype)
        if self.training:
            u = torch.rand_like(logits).clamp_(1e-9, 1 - 1e-9)
            logits = (logits - torch.log(-torch.log(u))) / GUMBEL_TAU  # Gumbel-softmax sample
        probs = logits.float().softmax(-1)  # (B, T, 4)
        top, index = probs.topk(2, dim=-1)  # (B, T, 2)
        w = torch.zeros_like(probs).scatter(-1, index, top / top.sum(-1, keepdim=True))
        if self.training:
            w = (1.0 - EVERY_EXPERT) * w + EVERY_EXPERT * probs
        if route is not None:
            route.previous[nar] = index[..., 0]
            route.choices.append((nar, index[..., 0].detach()))
            route.probs.append((nar, probs))
        return w.to(x.dtype)

    def forward(
        self, x: torch.Tensor, ar_mlp: nn.Module, nar_mlp: nn.Module, nar: bool, route: ExpertRoute | None
    ) -> torch.Tensor:
        """The routed MLP output for positions of one type. x: (B, T, D), post-attention normed.

        Every expert is computed for every position (dense: simple, and what training needs; at
        inference a sparse gather would save up to half the MLP work, not done in this experiment)."""
        w = self.weights(x, nar, route)  # (B, T, 4)
        # sum_e w_e E_e(x), the fused expert's half of each set folded into theirs: (B, T, D)
        w_ar, w_nar = w[..., 0:1] + 0.5 * w[..., 2:3], w[..., 1:2] + 0.5 * w[..., 2:3]
        return w_ar * ar_mlp(x) + w_nar * nar_mlp(x) + w[..., 3:4] * self.fallback(x)
