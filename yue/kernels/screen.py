"""The float32 LM head's greedy choice at a quarter of its bytes: an int8 screen bounds every logit, and
only the tokens that may still be the largest get their float32 logit, computed exactly as the full head
computes it, so the choice is bit for bit the full float32 head's argmax (first index on ties).

Why: a greedy decode step needs only the argmax of its AR rows' logits, yet the head is a fifth of a
float32 step (SmolLM2: 49,152 x 576 floats, 113 MB streamed every step; memory-bound). The screen
streams 28 MB of int8 codes instead (timings: docs/results-log.md).

The bound (per token j, for an input row x of D floats; u = 2^-24, g = D u / (1 - D u)):
- the screen's logit A_j = s_j * c_j, c_j the float32 fmaf chain of x . q_j over the int8 codes q_j,
  s_j the row's scale (float64 product here): |c_j - x . q_j| <= g |x|_1 max|q_j| (max|q_j| <= 127);
- the codes' own error: |s_j (x . q_j) - x . w_j| <= e_j |x|_1, e_j = max_i |s_j q_ji - w_ji| (measured);
- the full head's float32 logit F_j (rowkernel's fmaf chain): |F_j - x . w_j| <= g |x|_1 max|w_j|.
So |A_j - F_j| <= r_j = |x|_1 (e_j + g max|w_j| + 127 g s_j), widened by 0.1%. The row's largest F
is at least M = max_j (A_j - r_j), so every token with F_j >= M, the argmax and its ties among them,
has A_j + r_j >= M: those candidates get their exact F_j (`rowkernel.screen`: the same fmaf chain over
the token's row of the weight as the head's column), the rest -inf, all in one C call (torch's ops
over the (rows, V) bounds cost a sizeable share of a step). A row of a SmolLM2 step keeps a few
candidates (counts: docs/results-log.md).

Used by the decode loop where the AR logits serve only their argmax (`policies.argmax_only`: greedy,
no repetition penalty, no log-probs or trace); `forward` is the full head, for everything else. Where a
request asks the router (`verified` below threshold 1), each screened row also brings its softmax
entropy over its logits as screened (`top1_entropy`): the router's AR feature, within the bound's
error of the full head's, without the full head's bytes.
"""

from __future__ import annotations

import torch
from torch import nn

from yue.kernels import rowkernel
from yue.model.router import softmax_stats

ULP = 2.0**-24  # float32's unit roundoff
WIDEN = 1.001  # the radius's margin over the rounding of its own float64 arithmetic, and more
CHUNK = 4096  # head rows quantized at a time


class ScreenedHead(nn.Module):
    """A float32 row-kernel head (`matmuls.StreamedLinear`) with an int8 screen of its weight.

    Args:
        head: the full head, as the decode path runs it (1-9 rows through `rowkernel.matmul`).
        weight: (V, D) float32, the same values, in any strides (the input-major storage a tied head
            shares with its embedding table): held, not copied.
    """

    def __init__(self, head: nn.Module, weight: torch.Tensor) -> None:
        super().__init__()
        V, D = weight.shape
        g = D * ULP / (1 - D * ULP)
        codes = torch.empty(V, D, dtype=torch.int8)
        scale, slack = torch.empty(V, dtype=torch.float64), torch.empty(V, dtype=torch.float64)
        for lo in range(0, V, CHUNK):  # in float64 a chunk at a time: the whole head would be 226 MB a copy
            w = weight[lo : lo + CHUNK].detach().double()
            top = w.abs().amax(1)  # max |w_j|
            s = (top / 127).float().clamp(min=torch.finfo(torch.float32).tiny).double()  # s_j as screened
            q = torch.round(w / s[:, None]).clamp(-127, 127)
            err = (q * s[:, None] - w).abs().amax(1)  # e_j
            codes[lo : lo + CHUNK], scale[lo : lo + CHUNK] = q.to(torch.int8), s
            slack[lo : lo + CHUNK] = (err + g * top + 127 * g * s) * WIDEN  # r_j / |x|_1
        self.head = head
        self.vocab_size = V
        # Tensors in tuples: not in a state dict, no `.to()` (the decode path's copies, as StreamedLinear's).
        self.weight = (weight.detach(),)
        self.codes = (rowkernel.block(codes),)
        self.scale, self.slack = (scale,), (slack,)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """The full head's logits."""
        return self.head(x)

    def top1(self, x: torch.Tensor) -> torch.Tensor:
        """(..., V) float32 for x (..., D): each row's float32 logits where they may be its largest (the
        row kernel's bits: the full head's for up to 9 rows), -inf elsewhere; its argmax is the full
        head's. Where a row is not finite, the full head's logits."""
        return self.top1_entropy(x, entropy=False)[0]

    def top1_entropy(self, x: torch.Tensor, entropy: bool = True) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`top1`'s logits and, with `entropy`, each row's softmax entropy (...) over its logits as
        screened: the kept ones exact, the rest their screened values (within the bound above of the
        full head's). The router reads it of a drafting step's anchor row; the whole head would stream
        the float32 weight again for that row."""
        flat = x.reshape(-1, x.shape[-1]).float()
        ent = torch.empty(flat.shape[0], dtype=torch.float32) if entropy else None
        y = rowkernel.screen(flat, self.codes[0], self.scale[0], self.slack[0], self.weight[0], ent)
        if y is None:  # a row that is not finite: the full head's logits and their entropy
            full = self.head(x)
            return full, softmax_stats(full)[1] if entropy else None
        return y.view(*x.shape[:-1], self.vocab_size), None if ent is None else ent.view(x.shape[:-1])
