"""Decode-time layer paths on yue's kernels (`prepare.prepare_for_decoding` builds them into a
`DecodePaths`; `MoTLayer._decode` is handed them): a parameter set's fused matmuls (`DecodeSet`), the
row-exact attention forms whose rows' bits do not depend on a step's row count, a step's run of layers as
one row-kernel call (`LayerStack`), and the layout's name (`decode_layout`).

The trained modules (`yue.model.layers`) know these only by the small interface they call
(`decode_paths.SetPath`): `one_call`, `qkv_rope`, `exact` with `attend`, `finish`; a stack is called like
a function.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import nn

from yue.kernels import probe, rowkernel, rowstack
from yue.model.decode_paths import exact_rows
from yue.model.layers import (
    ACTIVATIONS,
    EXACT_KEY_PAD,
    EXACT_QUERY_PAD,
    MoTLayer,
    RMSNorm,
    apply_rope,
    rms_norm,
    round_up,
)
from yue.model.prepared import PreparedModel


class DecodeSet(nn.Module):
    """One parameter set's decode-time matmuls: Q/K/V as one, gate/up as one (`MoTLayer._decode`).

    Built by `prepare.prepare_for_decoding`. A decode step on a CPU is bound by per-call overhead and
    by streaming weights, so this path makes as few calls as it can: three matmuls become one (and
    two one), the norms are plain `rms_norm` calls (no module call), and Q and K rotate in one RoPE
    pass. The layer's own modules stay (their weights are views of the fused storage, or lowered
    copies), so checkpoints, names and the uncached (training) path are unchanged.
    """

    def __init__(
        self,
        layer: MoTLayer,
        nar: bool,
        qkv: nn.Module,
        o_proj: nn.Module,
        gate_up: nn.Module,
        down: nn.Module,
        exact: bool = False,
        attention: str = "padded",
        row_norm: bool = False,
        qkv_bias: torch.Tensor | None = None,
    ) -> None:
        super().__init__()
        self.qkv, self.gate_up = qkv, gate_up
        # Row-exact matmuls (`matmuls.PackedLinear`): a row's bits do not depend on the step's rows.
        self.exact = exact
        # With `exact`, how committed rows attend (`EXACT_ATTENTION`): one padded SDPA call, one query
        # per SDPA call, or yue's row kernel.
        # The norms on yue's row kernel (`rowkernel.rms_norm`, float32 rows): per-call overhead dominates
        # torch's, 60 calls a step.
        self.rms_norm = rowkernel.rms_norm if row_norm else rms_norm
        # How the exact rows attend (`ExactAttention`), called as `attend(q, kv, mask, start)`.
        self.attend = ExactAttention(attention, layer.attn_scale, layer.n_kv != layer.n_heads)
        # The whole layer in one row-kernel call (`whole_layer`; a step's run of such layers, one call for
        # them all: `prepare.kernel_stacks`) where every part is on the row kernel (the matmuls holding
        # `blocked` weights of the kernel's kinds: `matmuls.StreamedLinear`s, float32 or 4-bit and 8-bit
        # codes, for an AR set whose rows are exact; a NAR set's int8 codes with scales,
        # `matmuls.RowInt8Linear`, all four): a decode step's rows of the set, up to `rowkernel.MAX_ROWS`.
        # The family's differences ride along (`rowstack`).
        matmuls = (qkv, o_proj, gate_up, down)
        blocked = [getattr(m, "blocked", (None,))[0] for m in matmuls]
        # Q, K and V as three matmuls of their own where one is impossible (`file_codes.GGMLParts`:
        # a GGUF's formats differ among them): Q's weight first, K's and V's beside it.
        kv = (None, None)
        if getattr(qkv, "split_blocked", None) is not None:
            widths = (layer.n_heads * layer.head_dim, *[layer.n_kv * layer.head_dim] * 2)  # Q, K, V
            blocked[0], *kv = qkv.split_blocked(*widths) or (None, None, None)
        up = None  # likewise gate and up as two matmuls
        if getattr(gate_up, "split_blocked", None) is not None:
            half = gate_up.out_features // 2
            blocked[2], up = gate_up.split_blocked(half, half) or (None, None)
        parts = [*blocked, *(w for w in (*kv, up) if w is not None)]
        kinds = {rowkernel.layout(b) for b in parts} if all(b is not None for b in parts) else set()
        # Any mix of the AR kinds; int8 codes all four (their scales are concatenated).
        fits = bool(kinds) and kinds <= rowkernel.LAYER_KINDS.keys()
        fits = fits and ("i8dot" not in kinds or kinds == {"i8dot"})
        whole = (exact or nar) and row_norm and attention == "kernel" and fits
        self.blocked = tuple(blocked) if whole else None
        norm, proj, post_norm, mlp = layer._sets(nar)
        # The family's differences from Llama's layer (`config.Features`), in torch around the fused
        # matmuls where the layer is not one call: Q/K/V biases (`qkv_bias`, (H + 2 Hkv) Dh, added after
        # the bias-free fused matmul), per-head Q/K norms, Gemma's norms and GeGLU. Tuples: the layer's
        # own modules and tensors, not registered twice.
        self.qkv_bias = None if qkv_bias is None else (qkv_bias,)
        self.qk_norms = (proj.q_norm, proj.k_norm) if hasattr(proj, "q_norm") else None
        prefix = "nar_" if nar else ""
        self.ffn_norms = (
            (
                getattr(layer, prefix + "pre_feedforward_layernorm"),
                getattr(layer, prefix + "post_feedforward_layernorm"),
            )
            if layer.sandwich
            else None
        )
        self.act = mlp.act
        self.heads = (layer.n_heads, layer.n_kv, layer.head_dim)
        # This layer as a stack of one (`whole_layer`); a step's run of layers stacks their `LayerWeights`.
        self.one_layer = None
        if whole:
            weights = self._layer_weights(layer, blocked, matmuls, kinds, norm, post_norm, tuple(kv), up)
            self.one_layer = rowstack.StackWeights.of([weights], first=0)
        # The layer's norms and the output/down matmuls (the layer's own modules, or wrappers around
        # them), held in a tuple so that they are not registered twice.
        self.shared = (norm, o_proj, post_norm, down)

    def _layer_weights(
        self, layer, blocked, matmuls, kinds, norm, post_norm, kv, up
    ) -> rowstack.LayerWeights:
        """The one call's unchanging arguments (`rowstack.LayerWeights`): norms as applied (Gemma's 1 + w
        folded), the family's extras, int8 codes' scales per output (the four matmuls' concatenated)."""
        scales = torch.cat([m.scale[0] for m in matmuls]) if kinds == {"i8dot"} else None
        extras = (
            *(self.qk_norms or (None, None)),
            None if self.qkv_bias is None else self.qkv_bias[0].float().contiguous(),
            *(self.ffn_norms or (None, None)),
        )
        extras = tuple(rowstack.applied_norm(e) if isinstance(e, RMSNorm) else e for e in extras)
        norms = (rowstack.applied_norm(norm), rowstack.applied_norm(post_norm))
        act = next(name for name, fn in ACTIVATIONS.items() if fn is self.act)
        return rowstack.LayerWeights.of(
            norms, norm.eps, blocked, self.heads, scales, extras, act, layer.attn_scale, layer.sliding, kv, up
        )

    def _norm(self, x: torch.Tensor, norm: RMSNorm) -> torch.Tensor:
        """A layer norm over 2-d rows: `rms_norm` (the row kernel's, where set), or Gemma's (1 + w)
        module."""
        return norm(x) if norm.offset else self.rms_norm(x, norm.weight, norm.eps)

    def qkv_rope(self, h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor):
        """As `MoTLayer._qkv`, with one matmul and one rotation: (q, k, v) from h (B, T, D)."""
        norm = self.shared[0]
        H, Hkv, Dh = self.heads
        B, T, D = h.shape
        # The matmuls take 2-d rows (B * T, D): one `mm` for a one-row step (`RowAdaptiveLinear`).
        x = self._norm(h.reshape(B * T, D), norm)
        qkv = self.qkv(x)
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias[0]
        qkv = qkv.view(B, T, H + 2 * Hkv, Dh).transpose(1, 2)
        if self.qk_norms is not None:  # per-head norms before RoPE (Qwen3, Gemma 3)
            q, k = self.qk_norms[0](qkv[:, :H]), self.qk_norms[1](qkv[:, H : H + Hkv])
            return apply_rope(q, cos, sin), apply_rope(k, cos, sin), qkv[:, H + Hkv :]
        qk = apply_rope(qkv[:, : H + Hkv], cos, sin)  # Q and K heads rotate alike: one pass
        return qk[:, :H], qk[:, H:], qkv[:, H + Hkv :]

    def one_call(self, h, cos, sin, mask, kv, start, row0) -> torch.Tensor | None:
        """The layer over a decode step's rows of this set h (B, T, D) in one row-kernel call where the
        set is wholly on yue's row kernel (float32 activations; an AR set's exact rows, or a NAR set's
        int8 drafting layers) and the step allows (`one_call_rows`: not a prefill, up to
        `rowkernel.MAX_ROWS` rows); None elsewhere (`MoTLayer._decode` then runs it in parts)."""
        if self.blocked is None or not one_call_rows(h, start) or not plain_mask(mask):
            return None
        return self.whole_layer(h, cos, sin, kv, kernel_mask(mask, start, h.shape[1], row0), start)

    def whole_layer(self, h, cos, sin, kv, visible, start) -> torch.Tensor:
        """The layer over a decode step's rows of this set h (B, T, D) in one row-kernel call
        (`rowstack.stack` of this one layer; `blocked` set): what `qkv_rope`, the attention and `finish`
        compute, with the layer's own RoPE rows and mask (a sliding-window layer's: `MoTModel._local`).
        kv: the layer's cache buffers (B, Hkv, capacity, Dh)."""
        k, v = kv
        return rowstack.stack(h, self.one_layer, 0, 1, (cos, sin, visible), (k[None], v[None]), start)

    def finish(self, h: torch.Tensor, o: torch.Tensor) -> torch.Tensor:
        """As `MoTLayer._finish`, with gate/up as one matmul, over 2-d rows (B * T, D)."""
        _, o_proj, post_norm, down_proj = self.shared
        B, H, T, Dh = o.shape
        rows = h.reshape(B * T, -1)
        out = o_proj(o.transpose(1, 2).reshape(B * T, H * Dh))
        if self.ffn_norms is None:
            rows = rows + out
            gate, up = self.gate_up(self._norm(rows, post_norm)).chunk(2, dim=-1)
            return (rows + down_proj(self.act(gate) * up)).view(h.shape)
        # Gemma: the attention output normed before its residual add, the MLP between two norms.
        pre, post = self.ffn_norms
        rows = rows + post_norm(out)
        gate, up = self.gate_up(pre(rows)).chunk(2, dim=-1)
        return (rows + post(down_proj(self.act(gate) * up))).view(h.shape)


def _padded_additive(visible: torch.Tensor, keys: int, rows: int, dtype: torch.dtype) -> torch.Tensor:
    """`_attend_padded`'s mask from a bool one (1|B, 1, T, S), True = may attend: keys past S masked,
    padding rows repeating the last row (their outputs are dropped), as SDPA's additive mask (0, or -inf
    where masked): what SDPA turns a bool mask into on every call, done once (same result, tested). (1|B, 1, rows, keys)."""
    T, S = visible.shape[-2:]
    m = F.pad(visible, (0, keys - S), value=False)
    m = torch.cat([m, m[..., -1:, :].expand(*m.shape[:2], rows - T, keys)], dim=2)
    return torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill_(~m, float("-inf"))


@functools.lru_cache(maxsize=4)
def _causal_padded_mask(
    start: int, T: int, keys: int, rows: int, dtype: torch.dtype, device: torch.device
) -> torch.Tensor:
    """A lone committed row's step: query t (t < T) at cache index start + t sees keys up to its own.
    Cached: a step's 30 layers ask for the same one (built once)."""
    S = start + T
    visible = torch.arange(S, device=device)[None, :] <= torch.arange(start, S, device=device)[:, None]
    return _padded_additive(visible[None, None], keys, rows, dtype)


@functools.lru_cache(maxsize=4)
def _padded_step_mask(
    mask: torch.Tensor, start: int, T: int, keys: int, rows: int, dtype: torch.dtype, row0: int = 0
) -> torch.Tensor:
    """From a step's mask (1|B, 1, >= row0 + T, >= start + T): its rows [row0, row0 + T) over keys
    [0, start + T). Cached by the mask object (a tensor hashes by identity, and the cache's reference
    keeps that identity from being reused), so a step's layers pad it once, not once each."""
    return _padded_additive(mask[..., row0 : row0 + T, : start + T], keys, rows, dtype)


@functools.lru_cache(maxsize=4)
def _visible_bytes(mask: torch.Tensor, start: int, T: int, row0: int = 0) -> torch.Tensor:
    """`kernel_mask` from a step's mask (1|B, 1, >= row0 + T, >= start + T): its rows [row0, row0 +
    T) (a set's rows in the step: a step's slots follow its committed rows) over keys [0, start + T) as
    contiguous bytes (1|B, T, start + T), 1 = may attend. Cached by the mask object, as
    `_padded_step_mask` is, so a step's layers convert it once."""
    return mask[:, 0, row0 : row0 + T, : start + T].to(torch.uint8).contiguous()


@functools.lru_cache(maxsize=4)
def _every_key(start: int, T: int) -> torch.Tensor:
    """`kernel_mask` where the step has none: T queries each seeing all start + T keys, as bytes."""
    return torch.ones(1, T, start + T, dtype=torch.uint8)


def kernel_mask(mask: torch.Tensor | None, start: int, T: int, row0: int = 0) -> torch.Tensor | None:
    """The row kernel's `visible` for a set's T rows of a step at cache index `start`: the step's mask
    rows [row0, row0 + T) as bytes (`_visible_bytes`). A step without a mask (`decode_mask`: every query
    sees every key) gives None for a lone row (the kernel's None, each query up to its own key, is the
    same there) and every key's bytes for more (a drafting pass's slots see each other)."""
    if mask is not None:
        return _visible_bytes(mask, start, T, row0)
    return None if T == 1 else _every_key(start, T)


def plain_mask(mask: torch.Tensor | None) -> bool:
    """Whether a step's mask is the row kernel's kind: none, or bool (True = may attend). A float one adds a
    bias to some keys' scores (`anchor`'s bias toward its anchors, `decode/anchor.py`): torch's SDPA then."""
    return mask is None or mask.dtype == torch.bool


def one_call_rows(h: torch.Tensor, start: int) -> bool:
    """Whether a decode step's rows h (B, T, D) of one parameter set may run a layer (or a stack of them)
    on the row kernel (`rowkernel.stack`: one call, or one per group of whole batch rows), where the
    set's layers are such: not a prefill (start 0, torch's path in every mode), at most
    `rowkernel.MAX_ROWS` rows a batch row."""
    return bool(start) and h.shape[1] <= rowkernel.MAX_ROWS


# Row-exact attention forms (`ExactAttention.form`): one padded SDPA call, one query per SDPA call, or yue's
# row kernel (`DecodeSet.attend`).
EXACT_ATTENTION = ("padded", "per-row", "kernel")


class ExactAttention:
    """Attention of a step's committed rows in a form whose rows' bits do not depend on the step's row
    count (`EXACT_ATTENTION`: one padded SDPA call, one query per SDPA call, or yue's row kernel), so a
    verifying step's rows equal the one-row AR steps they stand for (`DecodeSet.exact`)."""

    def __init__(self, form: str, attn_scale: float | None, gqa: bool) -> None:
        assert form in EXACT_ATTENTION, form
        self.form, self.attn_scale, self.gqa = form, attn_scale, gqa

    def __call__(self, q, kv, mask, start) -> torch.Tensor:
        """Committed queries q (B, H, T, Dh) at cache indices [start, start + T) in this form: each row's
        bits those of its one-row step, whatever T."""
        if self.form == "kernel":
            return self._attend_kernel(q, kv, mask, start)
        if self.form == "per-row":
            return self._attend_per_row(q, kv, mask, start)
        return self._attend_padded(q, kv, mask, start)

    def _attend_padded(self, q, kv, mask, start, row0: int = 0) -> torch.Tensor:
        """Attention of T committed queries q (B, H, T, Dh) at cache indices [start, start + T) whose
        rows' bits do not depend on T, so a verifying step's rows equal the one-row AR steps they stand
        for (`DecodeSet.exact`).

        SDPA over T queries at once differs in the last bits from T one-query calls (CPU, float32 and
        bfloat16, measured: 232 of 455 rows); with the queries padded to a multiple of
        `EXACT_QUERY_PAD` and the keys to a multiple of `EXACT_KEY_PAD` (masked) every row matched its
        padded one-row call (SmolLM2's heads, 1,170 rows at positions 1-530, 1-16 rows per call; with a
        one-row call padded to 1 instead of 4, none did). One call for the step is much cheaper than one
        call a query for a verifying step's rows, while a one-row step pays for the padding (measured:
        docs/results-log.md).

        Each query's call pads the keys as its one-row call does: a step whose rows cross a multiple of
        `EXACT_KEY_PAD` attends in two calls, split there. (In one call padded past the boundary, the
        rows before it saw 64 more masked keys than alone, and on SmolLM2 in bfloat16 their bits
        differed: `verified` parted from `ar` on 1 of 8 calibration prompts in two bench runs.)

        `mask` is the step's (rows row0.. are these queries'), or None for a lone row.
        """
        B, H, T, Dh = q.shape
        split = round_up(start + 1, EXACT_KEY_PAD) - start  # queries whose one-row calls pad alike
        if split < T:
            return torch.cat(
                [
                    self._attend_padded(q[:, :, :split], kv, mask, start, row0),
                    self._attend_padded(q[:, :, split:], kv, mask, start + split, row0 + split),
                ],
                dim=2,
            )
        k_buf, v_buf = kv
        S = start + T
        keys = round_up(S, EXACT_KEY_PAD)  # <= the cache's capacity (`cache.padded_capacity`)
        rows = round_up(T, EXACT_QUERY_PAD)
        if mask is None:  # a lone row's step: every key up to its own, the same mask in every layer
            mask = _causal_padded_mask(start, T, keys, rows, q.dtype, q.device)
        else:
            mask = _padded_step_mask(mask, start, T, keys, rows, q.dtype, row0)
        q = torch.cat([q, q.new_zeros(B, H, rows - T, Dh)], dim=2)
        o = F.scaled_dot_product_attention(
            q,
            k_buf[:, :, :keys],
            v_buf[:, :, :keys],
            mask,
            scale=self.attn_scale,
            enable_gqa=self.gqa,
        )
        return o[:, :, :T]

    def _attend_per_row(self, q, kv, mask, start) -> torch.Tensor:
        """`_attend_padded`'s other form: each of the T committed queries in a call of its own over the
        keys up to its own, unpadded, as a one-row AR step attends (so its bits are that step's). A
        one-row step costs what plain SDPA does (unpadded, cheaper than `_attend_padded`'s), a verifying
        step T calls: the form for a precision whose one-row step is cheap and whose verifying rows are
        dear, so that its steps verify few rows (int4, `prepare.prepare_for_decoding`).

        `mask` is the step's (its first T rows are these queries'), or None for a lone row.
        """
        k_buf, v_buf = kv
        gqa = self.gqa
        rows = []
        for t in range(q.shape[2]):
            S = start + t + 1
            m = None if mask is None else mask[..., t : t + 1, :S]
            rows.append(
                F.scaled_dot_product_attention(
                    q[:, :, t : t + 1],
                    k_buf[:, :, :S],
                    v_buf[:, :, :S],
                    m,
                    scale=self.attn_scale,
                    enable_gqa=gqa,
                )
            )
        return torch.cat(rows, dim=2)

    def _attend_kernel(self, q, kv, mask, start) -> torch.Tensor:
        """`_attend_padded`'s third form, on yue's row kernel (`rowkernel.attention`, float32): each query
        on its own over the keys it may see, in a fixed order, so its bits are the one-row step's by
        construction, unpadded. Cheaper than the padded SDPA call for one query, dearer for 9; in the
        whole model `ar` ran faster than on the padded call and `verified` level (one-process A/B:
        docs/results-log.md).

        `mask` is the step's (its first T rows are these queries'), or None for a lone row.
        """
        return rowkernel.attention(q, *kv, kernel_mask(mask, start, q.shape[2]), start, self.attn_scale)


class LayerStack:
    """A parameter set's layers [first, L) as one row-kernel call (`rowstack.stack`; a batch of more rows,
    one per group of whole batch rows) where every layer holding the set is one call
    (`DecodeSet.one_layer`): the same calls in C, the same bits, without Python's per-call overhead a
    layer. Called by `MoTModel._layers` for a decode step's rows; returns None where it does not apply."""

    def __init__(self, weights: rowstack.StackWeights, nar: bool) -> None:
        self.weights, self.nar = weights, nar

    def __call__(self, h_c, h_s, cos, sin, mask, cache, start, first, last, local=None):
        """Layers [first, last) over committed rows h_c (B, Tc, D) and slots h_s (B, Ts, D) where the step's
        rows are all of this set (committed rows, or a drafting pass's slots): (h_c, h_s), else None.
        local: the sliding-window layers' (cos, sin, mask) (`MoTModel._local`), or None."""
        h = h_s if self.nar else h_c
        if first >= last or first < self.weights.first or not h.shape[1]:
            return None
        if (h_c.shape[1] and h_s.shape[1]) or not one_call_rows(h, start) or not plain_mask(mask):
            return None
        # One set's rows: row0 0, its K/V from `start`. The step's RoPE rows may run on past these rows
        # (slots that join above the layers run here).
        Tc = h_c.shape[1]
        rows = slice(Tc, None) if self.nar else slice(0, Tc)

        def view(c, s, m):
            return c[..., rows, :], s[..., rows, :], kernel_mask(m, start, h.shape[1])

        views = view(cos, sin, mask), None if local is None else view(*local)
        out = rowstack.stack(h, self.weights, first, last, views[0], (cache.k, cache.v), start, views[1])
        return (h_c, out) if self.nar else (out, h_s)


def kernels_named(model: PreparedModel) -> str:
    """What a prepared model's step costs are measured for (`decode.costs.cost_cache_key`): the CPU
    kernels probed (`probe.describe`, without its load-timed verdict, which the rows' own kinds show where
    it applies), and the kernels its rows run (`decode_layout`)."""
    probed = probe.describe(timed=False) + "; " if model.device.type == "cpu" else ""
    return probed + decode_layout(model)


def decode_layout(model: PreparedModel) -> str:
    """The kernels a prepared model's AR rows run (matmul module types of a layer and the head, and the
    attention form of row-exact layers: padded, one query per call or yue's row kernel, and whether a
    layer is one row-kernel call; row-kernel weights held as 4-bit codes, the head as 8-bit ones; the NAR
    layers' matmuls and whether each is one call): the int4 precision and a large
    float32 model's one-copy layers cost otherwise than two-copy float32, and a cost measured with one
    attention form is not the other's."""
    paths = model.paths
    sets = paths.layers[0]
    children = list(sets[0].children()) if sets is not None else []
    kinds = [type(m).__name__ for m in children]
    # Row-kernel weights held as 4-bit codes (`rowkernel.q4_block`), a head as 8-bit codes
    # (`rowkernel.q8_block`): same bits, other costs.
    head = getattr(paths.ar_head, "head", paths.ar_head)  # a screened head's full one
    weights = [getattr(m, "blocked", (None,))[0] for m in children]
    layouts = {rowkernel.layout(w) for w in weights if w is not None}
    kinds += ["4-bit codes"] if "q4" in layouts else []
    kinds += ["8-bit codes"] if layouts & {"q8", "q6"} else []
    head_codes = getattr(head, "blocked", (None,))[0]
    kinds += ["head 8-bit codes"] if head_codes is not None and rowkernel.layout(head_codes) == "q8" else []
    attention = []
    if exact_rows(sets):
        padded = f"attention padded {EXACT_QUERY_PAD}x{EXACT_KEY_PAD}"
        names = {"padded": padded, "per-row": "attention per row", "kernel": "attention row kernel"}
        attention = [names[sets[0].attend.form]] + (
            ["one call a layer"] if sets[0].blocked is not None else []
        )
    # The drafting pass's NAR layers: their matmuls' kind, and whether each is one row-kernel call.
    nar = next((s[1] for s in paths.layers if s and len(s) > 1), None)
    drafting = [] if nar is None else ["drafting " + "+".join(type(m).__name__ for m in nar.children())]
    drafting += ["drafting one call a layer"] if nar is not None and nar.blocked is not None else []
    screen = [paths.ar_head.kind] if hasattr(paths.ar_head, "kind") else []  # the head's screen, if any
    return ",".join([*kinds, type(paths.ar_head).__name__, *screen, *attention, *drafting])
