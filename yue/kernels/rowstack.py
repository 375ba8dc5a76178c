"""A float32 decode layer in one row-kernel call, and a step's run of such layers in one call
(`rowkernel.c`'s `rows_layer` and `rows_stack`): what a layer's arrays are (`LayerWeights`), consecutive
layers' (`StackWeights`), and the call (`stack`). `decode_set.DecodeSet` builds a layer's, and
`prepare.kernel_stacks` a parameter set's.

Design decisions:
- A family is a few optional arrays of a layer, not another kernel (docs/design.md §9): Q/K/V biases
  (Qwen2), per-head Q/K norms (Qwen3, Gemma 3), Gemma's norms around attention's output and the MLP,
  GeGLU's tanh-GELU (`ACTIVATIONS`), its attention scale, and sliding-window layers with their own RoPE
  base (a step hands the call two RoPE rows and masks, `View`s: the global layers' and the local ones').
- Gemma's norms apply as (1 + w): the sum is folded into a float32 copy once (`applied_norm`), what
  Gemma's RMSNorm computes before it scales.
- Each matmul has its own weight kind (`rowkernel.LAYER_KINDS`): a GGUF's Q4_K_M file mixes Q4_K, Q5_0
  and Q8_0 tensors within a layer, held as 4-bit and 8-bit codes or float32.
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass

import torch

from yue.kernels.rowkernel import LAYER_KINDS, _mask, _pointers, attention_fits, inputs, layout, library

# The gated MLP's activation (`config.Features.activation`) -> `rows_layer`'s act.
ACTIVATIONS = {"silu": 0, "gelu_tanh": 1}


class View(ctypes.Structure):
    """A step's RoPE rows and mask as `rows_stack` takes them (`struct rows_view`): cos, sin (1|B, T, Dh)
    with their batch and row strides, and the `visible` bytes (or None) with theirs."""

    _fields_ = [
        ("cos", ctypes.c_void_p),
        ("sin", ctypes.c_void_p),
        ("cb", ctypes.c_long),
        ("ct", ctypes.c_long),
        ("visible", ctypes.c_void_p),
        ("mb", ctypes.c_long),
        ("mt", ctypes.c_long),
    ]

    @classmethod
    def of(cls, cos: torch.Tensor, sin: torch.Tensor, visible: torch.Tensor | None, T: int, Dh: int) -> tuple:
        """(the View, the tensors it points into, to be kept alive for the call)."""
        cos, sin = (
            cos.reshape(cos.shape[0], T, Dh).contiguous(),
            sin.reshape(sin.shape[0], T, Dh).contiguous(),
        )
        mask, mb, mt = _mask(visible)
        view = cls(cos.data_ptr(), sin.data_ptr(), cos.stride(0) if cos.shape[0] > 1 else 0, cos.stride(1))
        view.visible, view.mb, view.mt = None if mask is None else mask.data_ptr(), mb, mt
        return view, (cos, sin, mask)


def applied_norm(norm) -> torch.Tensor:
    """A norm module's weight as the kernel applies it, float32 contiguous: Gemma's (offset + w) summed
    once, in float32 as Gemma's RMSNorm sums it; else the weight itself."""
    if norm.offset:
        return (norm.offset + norm.weight.detach().float()).contiguous()
    return norm.weight.detach()


@dataclass(frozen=True)
class LayerWeights:
    """What `rows_stack` takes of one layer unchanged from step to step, checked and converted to ctypes
    values once (a `decode_set.DecodeSet` holds one): `pointers`, the layer's own arrays in `rows_layer`'s
    order (`LAYER_PTRS`: the input and post-attention norms, the blocked weights of Q/K/V, O, gate/up
    and down, each of any `LAYER_KINDS`, the int8 codes' scales (their outputs' float32 scales in that
    order: `matmuls.RowInt8Linear`'s; else None), the layer's ints (the four kinds, 1 for a
    sliding-window layer, then K's and V's kinds where they are matmuls of their own), the family's
    extras or None: Q and K head norms, the Q/K/V biases, Gemma's MLP input and output norms; then K's
    and V's weights where Q/K/V are three matmuls, and up's where gate and up are two, else None); `shape`, what a stack's layers share: the norms' eps, the MLP's
    width and activation, the heads (H, Hkv, Dh), the softmax scale. Built once, since building a call's
    ~30 arguments in Python every step was per-call overhead worth removing. `tensors` keeps alive what
    `pointers` point into."""

    tensors: tuple
    pointers: tuple
    shape: tuple

    @classmethod
    def of(cls, norms, eps: float, blocked, heads, scales=None, extras=(None,) * 5, act="silu", scale=None,
           sliding=False, kv=(None, None), up=None) -> LayerWeights:  # fmt: skip
        """norms: (input, post-attention) weights as applied; blocked: the four matmuls' kernel layouts
        (the first Q's alone where `kv` holds K's and V's: three matmuls; the third gate's alone where
        `up` holds up's: two); extras: (q_norm, k_norm,
        qkv_bias, pre-MLP norm, post-MLP norm), each None where absent; scale: the softmax scale (None:
        Dh ** -0.5)."""
        kinds = [layout(b) for b in (*blocked, *(w for w in (*kv, up) if w is not None))]
        assert set(kinds) <= LAYER_KINDS.keys() and (scales is not None) == (set(kinds) == {"i8dot"})
        assert attention_fits(heads[2]) and all(
            n.dtype == torch.float32 and n.is_contiguous()
            for n in (*norms, *(e for e in extras if e is not None))
        )
        split = [LAYER_KINDS[layout(w)] if w is not None else 0 for w in (*kv, up)]
        ints = torch.tensor([LAYER_KINDS[k] for k in kinds[:4]] + [int(sliding), *split], dtype=torch.int32)
        arrays = (*norms, *blocked, scales, ints, *extras, *kv, up)
        softmax_scale = heads[2] ** -0.5 if scale is None else scale
        shape = (eps, inputs(blocked[3]), ACTIVATIONS[act], tuple(heads), softmax_scale)
        return cls(arrays, tuple(_pointers(*arrays)), shape)


@dataclass(frozen=True)
class StackWeights:
    """Consecutive layers' `LayerWeights`, model layers [first, first + len(layers)), as `rows_stack`
    takes them: their pointers in one C array, what they share once. A prepared model holds one per
    parameter set whose every layer is one call (`prepare.kernel_stacks`), and each such layer's
    `DecodeSet` one of its own (a step that mixes committed rows and slots runs its layers one by one)."""

    layers: tuple[LayerWeights, ...]
    first: int
    array: ctypes.Array

    @classmethod
    def of(cls, layers: list[LayerWeights], first: int) -> StackWeights | None:
        """The stack, or None where the layers differ in what `rows_stack` takes once (`LayerWeights.shape`)."""
        if len({w.shape for w in layers}) != 1:
            return None
        assert all(len(w.pointers) == library().rows_layer_ptrs() for w in layers)
        pointers = [p for w in layers for p in w.pointers]
        return cls(tuple(layers), first, (ctypes.c_void_p * len(pointers))(*pointers))

    def address(self, layer: int) -> int:
        """Where model layer `layer`'s pointers start in `array`."""
        return ctypes.addressof(self.array) + (layer - self.first) * ctypes.sizeof(self.array) // len(
            self.layers
        )


def stack(
    h: torch.Tensor,
    weights: StackWeights,
    first: int,
    last: int,
    rows: tuple,
    kv: tuple[torch.Tensor, torch.Tensor],
    start: int,
    local: tuple | None = None,
) -> torch.Tensor:
    """Float32 decode layers [first, last) (model layers) of `weights` over rows h (B, T, D), T <=
    `rowkernel.MAX_ROWS`, in one call (`rows_stack`, each layer `rows_layer`), each row computing its
    solo bits whatever B x T (the matmuls take more rows than a pass in further passes, and 4-bit codes
    rebuild each weight once for all of them: `rows_matmul_q4`): the layers' norms and matmuls, RoPE,
    K/V written to the cache buffers kv at [start, start + T), attention.

    rows: the global layers' (cos, sin, visible): RoPE rows (1|B, 1, T, Dh) and `visible` as
    `rowkernel.attention`'s; local: the sliding-window layers' own (their RoPE base and window), or None
    where the stack has none. kv: the cache's (L, B, Hkv, capacity, Dh) key and value buffers, indexed
    by model layer. Returns the last layer's output (B, T, D)."""
    B, T, D = h.shape
    k, v = kv
    eps, F, act, (H, Hkv, Dh), scale = weights.layers[0].shape
    assert weights.first <= first < last <= weights.first + len(weights.layers)
    assert h.dtype == torch.float32 and k.stride() == v.stride() and k.stride(-2) == Dh
    out = h.contiguous().clone()  # updated in place; the input may be held elsewhere (`MoTModel.run`'s entry)
    (glob, kept), (loc, kept_local) = (View.of(*r, T, Dh) for r in (rows, local or rows))
    views = (View * 2)(glob, loc)
    cache = (
        k[first],
        v[first],
        k.stride(0),
        *k.stride()[1:3],
    )  # layer `first`'s K/V; layer, batch, head strides
    library().rows_stack(
        *_pointers(
            out, B, T, D, last - first, weights.address(first), eps, F, act, views, *cache, H, Hkv, Dh
        ),
        start,
        scale,
        torch.get_num_threads(),
    )
    del kept, kept_local  # alive through the call
    return out
