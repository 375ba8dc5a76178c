"""The float32 LM head's greedy choice at a quarter of its bytes: an integer screen bounds every logit,
and only the tokens that may still be the largest get their float32 logit, computed exactly as the full
head computes it, so the choice is bit for bit the full float32 head's argmax (first index on ties).

Why: a greedy decode step needs only the argmax of its AR rows' logits, yet the head is a fifth of a
float32 step's bytes (SmolLM2: 49,152 x 576 floats, 113 MB streamed every step; memory-bound). The
screen streams 28 MB of int8 codes instead, multiplied in integer dot products (as the int4 layers),
so each extra verifying row costs its products, not float FMAs (timings: docs/results-log.md).

The screen (`rowkernel.rows_screen`), for a row x of D floats and token j (u = 2^-24):
- the head's codes: q_j int8, with a float32 scale d per group of 32 inputs (d = the group's largest
  |w| / 127, q = round(w / d)): w_hat_j = d q_j, e_j = max_i |w_hat_ji - w_ji| (measured; 0 for a
  GGUF Q8_0 head such as SmolLM2's tied one, whose own codes and scales these are);
- the row: 16-bit integers xq (scale sx = max |x| / 32767),
  delta = x - sx xq, |delta|_1 and |delta|_2 computed in double (exactly enough: see WIDEN);
- A_j = sx * sum_g fl(S_g) d_g, S_g the exact integer xq . q_j over group g, the sum over the G groups
  one fmaf a group in float32: |A_j - sx xq . w_hat_j| <= g2 max|w_hat_j| |sx xq|_1, g2 = (G + 2) u /
  (1 - (G + 2) u) (a conversion and G fused roundings), and |sx xq|_1 <= |x|_1 + |delta|_1 = n1;
- x . w_j = sx xq . w_hat_j + delta . w_hat_j + x . (w_j - w_hat_j), so with Cauchy-Schwarz on the
  second term and Hölder on the third: |sx xq . w_hat_j - x . w_j| <= |delta|_2 |w_hat_j|_2 + n1 e_j;
- the full head's float32 logit F_j (rowkernel's fmaf chain over D inputs): |F_j - x . w_j| <= g |x|_1
  max|w_j|, g = D u / (1 - D u).
So |A_j - F_j| <= r_j = n1 (e_j + g max|w_j| + g2 max|w_hat_j|) + |delta|_2 |w_hat_j|_2, each per-token
factor widened by WIDEN: `slack` and `wnorm` below. The row's largest F is at least M = max_j (A_j -
r_j), so every token with F_j >= M, the argmax and its ties among them, has A_j + r_j >= M: those
candidates get their exact F_j (the same fmaf chain over the token's row of the weight as the head's
column), the rest -inf, all in one C call (torch's ops over the (rows, V) bounds cost a sizeable share
of a step). With 8-bit activations |delta|_2 would dominate: a hidden state's few outlier channels set
max |x| (docs/results-log.md has the candidate counts); with 16 bits it is about the float32 rounding
terms' size, and e_j is 0 for a Q8_0 head, so a row keeps about the argmax and its near ties.

Used by the decode loop where the AR logits serve only their argmax (`policies.argmax_only`: greedy,
no repetition penalty, no log-probs or trace); `forward` is the full head, for everything else. Where a
request asks the router (`verified` below threshold 1), each screened row also brings its softmax
entropy over its logits as screened (`top1_entropy`): the kept logits exact, every other within r_j
of the full head's (so the entropy is the full head's within what such perturbations move it), without
the full head's bytes.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from yue.kernels import rowkernel
from yue.model.router import softmax_stats

ULP = 2.0**-24  # float32's unit roundoff
WIDEN = 1.001  # the radius's margin over the rounding of its own float64 arithmetic, and more
CHUNK = 4096  # head rows quantized at a time
GROUP = 32  # inputs per scale of the codes (`rows_screen`'s; the GGUF's Q8_0 blocks)


def gamma(n: int) -> float:
    """The relative error bound of n float32 roundings in a row, n u / (1 - n u)."""
    return n * ULP / (1 - n * ULP)


def screen_block(codes: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    """The head screen's int8 codes (out, in) (-127..127, in a multiple of GROUP) and their float32
    scales (out, in / GROUP) in `rows_screen`'s layout: uint8 (ceil(out / DOT_BLK), in / 32, 288),
    per column block of DOT_BLK tokens and group of 32 inputs a record of the scales (DOT_BLK float32),
    then per pair of inputs each token's 2 codes side by side, zero-padded."""
    lib = rowkernel.library()
    blk = lib.rows_dot_block()
    out, inp = codes.shape
    G = inp // GROUP
    assert codes.dtype == torch.int8 and scales.dtype == torch.float32 and scales.shape == (out, G)
    B = -(-out // blk)
    padded = torch.zeros(B * blk, inp, dtype=torch.int8)
    padded[:out] = codes
    pairs = padded.view(B, blk, G, GROUP // 2, 2).permute(0, 2, 3, 1, 4)  # (B, G, pair, token, 2)
    d = torch.zeros(B * blk, G, dtype=torch.float32)
    d[:out] = scales
    d = d.view(B, blk, G).permute(0, 2, 1).contiguous().view(torch.uint8)  # (B, G, blk * 4)
    record = torch.cat([d, pairs.contiguous().view(torch.uint8).reshape(B, G, -1)], -1).contiguous()
    assert record.shape[-1] == lib.rows_screen_bytes()
    return record


def q8_0_chunk(rows: torch.Tensor, G: int) -> tuple[torch.Tensor, ...] | None:
    """A chunk of a GGUF's Q8_0 head rows (uint8 (n, G * 34)) as the screen's codes q (n, G, 32) int8,
    scales d (n, G) float32, each group's largest |w| (n, G) and e_j (n,) float64: what `ScreenedHead`
    computes from the dequantized values, where every block is in llama.cpp's Q8_0 form (d > 0 finite,
    a code of magnitude 127: then max |w| = 127 d exactly, d as screened is the block's d, its codes
    are the block's, and e_j is 0); None where a block is not (the values' path then)."""
    blocks = rows.reshape(rows.shape[0], G, 34)
    d = blocks[..., :2].contiguous().view(torch.float16).squeeze(-1).float()
    q = blocks[..., 2:].contiguous().view(torch.int8)
    if not (bool(((d > 0) & torch.isfinite(d)).all()) and bool((q.to(torch.int16).abs_().amax(-1) == 127).all())):
        return None
    return q, d, 127 * d, torch.zeros(rows.shape[0], dtype=torch.float64)


class ScreenedHead(nn.Module):
    """A float32 row-kernel head (`matmuls.StreamedLinear`) with an integer screen of its weight.

    Args:
        head: the full head, as the decode path runs it (1-9 rows through `rowkernel.matmul`).
        weight: (V, D) float32, the same values, in any strides (the input-major storage a tied head
            shares with its embedding table): held, not copied.
    """

    kind = "integer screen, 16-bit rows"  # in `decode_set.decode_layout`: a step's cost depends on it

    def __init__(self, head: nn.Module, weight: torch.Tensor, q8_0: torch.Tensor | None = None) -> None:
        """q8_0: the same values as a GGUF's Q8_0 rows (uint8 (V, D / 32 * 34)), whose blocks give the
        codes and scales directly where they are the screen's (`q8_0_chunk`); None: from `weight`."""
        super().__init__()
        V, D = weight.shape
        G = -(-D // GROUP)
        codes = torch.empty(V, G * GROUP, dtype=torch.int8)
        scales = torch.empty(V, G, dtype=torch.float32)
        slack, wnorm = torch.empty(V, dtype=torch.float64), torch.empty(V, dtype=torch.float64)
        for lo in range(0, V, CHUNK):  # a chunk at a time: the whole head in float64 would be 226 MB a copy
            found = None if q8_0 is None else q8_0_chunk(q8_0[lo : lo + CHUNK], G)
            if found is not None:
                q, d, top, err = found
                w_hat = q.double() * d.double()[..., None]  # as below: the same values, the same bits
            else:
                w = weight[lo : lo + CHUNK].detach().float()
                groups = F.pad(w, (0, G * GROUP - D)).view(w.shape[0], G, GROUP)
                top = groups.abs().amax(-1)  # (n, G): each group's largest |w|
                # d as screened (an all-zero group: any d)
                d = (top / 127).clamp(min=torch.finfo(torch.float32).tiny)
                q = torch.round(groups / d[..., None]).clamp_(-127, 127)  # any codes do: e_j measures them
                w_hat = q.double() * d.double()[..., None]  # exact in float64 (8 bits by 24)
                err = (w_hat - groups.double()).abs_().flatten(1).amax(1)  # e_j
            codes[lo : lo + CHUNK], scales[lo : lo + CHUNK] = q.view(-1, G * GROUP).to(torch.int8), d
            top = top.amax(1).double()  # max |w_j|; max |w_hat_j| <= max |w_j| + e_j
            slack[lo : lo + CHUNK] = (err + gamma(D) * top + gamma(G + 2) * (top + err)) * WIDEN
            wnorm[lo : lo + CHUNK] = w_hat.flatten(1).norm(dim=1) * WIDEN
        self.head = head
        self.vocab_size = V
        # Tensors in tuples: not in a state dict, no `.to()` (the decode path's copies, as StreamedLinear's).
        self.weight = (weight.detach(),)
        self.codes = (screen_block(codes, scales),)
        self.slack, self.wnorm = (slack,), (wnorm,)

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
        y = rowkernel.screen(flat, self.codes[0], self.slack[0], self.wnorm[0], self.weight[0], ent)
        if y is None:  # a row that is not finite: the full head's logits and their entropy
            full = self.head(x)
            return full, softmax_stats(full)[1] if entropy else None
        return y.view(*x.shape[:-1], self.vocab_size), None if ent is None else ent.view(x.shape[:-1])
