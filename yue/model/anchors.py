"""Anchor planning's model parts (issue 47; `decode/anchor.py` decodes with them, `train/anchor.py`
trains them), an experiment.

The design articles: the AR path first writes a few key anchors, their number predicted from the
prompt (2-12), each with a confidence; the NAR set then fills what lies between them in one pass, its
attention pulled toward the anchors in proportion to their confidence. With a causal AR path, the
anchors come in order: an anchor span of `ANCHOR_SPAN` tokens written by the AR path, then a gap
filled by one NAR pass whose slot 1 is the span's last token, then the next span.

- `AnchorHead`: the count head, a linear map from the prompt's last hidden state to 2..12.
- The plan: n anchors over a horizon of `PLAN_HORIZON` tokens, so a gap of ceil(H / n) - span tokens,
  at most K - 1 (one block's slots after its anchor slot).
- `fill_bias`: the fill's attention bias, + bias * confidence on each anchor's key.
"""

from __future__ import annotations

import math

import torch
from torch import nn

from yue.config import YueConfig

MIN_ANCHORS, MAX_ANCHORS = 2, 12
ANCHOR_SPAN = 2  # tokens per anchor: the committed one before the fill block, and its revealed slot 1
PLAN_HORIZON = 64  # tokens the count head plans anchors over (its training labels' window)


class AnchorHead(nn.Module):
    """Anchor count from the prompt's last hidden state: (B, D) -> (B, 11) logits over n = 2..12."""

    def __init__(self, config: YueConfig) -> None:
        super().__init__()
        self.proj = nn.Linear(config.hidden_size, MAX_ANCHORS - MIN_ANCHORS + 1)

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        return self.proj(hidden)

    def count(self, hidden: torch.Tensor) -> list[int]:
        """The predicted anchor count per row (the argmax), in [MIN_ANCHORS, MAX_ANCHORS]."""
        return (self(hidden).argmax(-1) + MIN_ANCHORS).tolist()


def gap_for(count: int, block_size: int) -> int:
    """Fill tokens between anchor spans for `count` anchors over PLAN_HORIZON: in [1, K - 1]."""
    return max(1, min(block_size - 1, math.ceil(PLAN_HORIZON / count) - ANCHOR_SPAN))


def fill_bias(
    base: torch.Tensor | None, keys: int, rows: int, anchor_keys: list[int], conf: torch.Tensor, scale: float
) -> torch.Tensor:
    """An additive attention mask for a fill pass: -inf where `base` (bool, (1|B, 1, rows, keys), None =
    every key) blocks, else 0, plus scale * conf[b, j] on key anchor_keys[j] for every row.

    conf: (B, len(anchor_keys)) the anchors' confidences (the AR path's probability of each). -> (B, 1, rows, keys).
    """
    B = conf.shape[0]
    mask = torch.zeros(B, 1, rows, keys, device=conf.device)
    if base is not None:
        mask = mask.masked_fill(~base[..., :rows, :keys], float("-inf"))
    index = torch.tensor(anchor_keys, device=conf.device)
    mask[:, 0, :, index] += scale * conf[:, None, :]
    return mask
