"""Preparing a model for fast decoding (`YueForCausalLM.prepare_for_decoding`, done by `yue.load`).

At the default model's size a decode step on a CPU is bound by streaming weights from memory (~7 GB/s
on one core here: a 256x688 fp32 matmul costs ~0.1 ms whether it has 1 row or 8) and by per-call
overhead. Four changes, all measured on the 2-core CPU with one thread, weights not in cache:

- Input-major weights (`input_major`): same values, storage transposed, so `F.linear` hands MKL a
  contiguous (in, out) matrix; a 256x688 matmul over 1 row 95 -> 56 us, the 256x4096 head 563 -> 212 us.
  Embeddings stay row-major (a lookup gathers rows).
- Fused matmuls (`fuse_linears`, `layers.DecodeSet`): Q/K/V as one and gate/up as one per layer and
  parameter set. The separate modules' weights become views of the fused storage (no copy), so
  checkpoints, names and the training path are unchanged.
- Lower-precision drafting (`lower_linear`): the NAR set's matmuls and a copy of the LM head for slot
  rows (`draft_head`) in int8 (CPU: dynamic quantization with per-output-channel weight scales, torch's
  fbgemm/x86 kernels) or bfloat16. int8 is a quarter of the bytes and fbgemm keeps small row counts
  cheap: a 256x688 matmul over 8 rows ~46 us instead of ~170 us, the head over 8 slot rows ~150 us
  instead of ~1 ms; `Int8Linear` calls the kernel without the stock module's per-call Python (~8 us
  a call, 17 calls a drafting pass). Only drafts change: the AR set and the head computing AR logits
  keep their values, so `ar` and `verified` output is the same whatever the drafting precision;
  `hybrid`/`nar` commit drafts, so theirs may shift slightly (the bench measures it).
- Kernels by row count: where yue's row kernel builds (`rowkernel`) and the float32 layers exceed a
  cache (`rows_kernel`), one copy of each weight laid out for it (`StreamedLinear`): 1-9 rows (a
  one-row AR step, a verifying step's k + 1) through it, the weight streamed once for all rows and
  every row's bits the same whatever the row count (SmolLM2: 2-9 rows 1.03-1.72x a one-row step
  against 1.51-1.78x on oneDNN; in one process `verified` 1.30x faster held-out, `ar` 1.04x). Else
  (`RowAdaptiveLinear`) two or more rows through oneDNN on pre-packed weights and one row through MKL's
  GEMV (the 8-row head ~800 -> ~350 us, `verified` 1.37x -> 1.68x `ar` in an interleaved A/B on 12
  prompts). A model whose float32 layers exceed 1 GiB, or one loaded with `low_memory`, keeps one
  copy (`streamed_weights`; which one, `kernels`): there memory counts more than speed.

The bfloat16 precision (`yue.load(dtype="bfloat16")`, a separate, named precision): every AR matmul
and the head hold one oneDNN-packed bfloat16 copy (`PackedLinear`; MKL has no fast bfloat16 GEMV),
half float32's bytes: SmolLM2's 30 layers and head over one row 20 ms against 37 ms in float32, 8 rows
24 ms. Attention and the KV cache stay float32 (torch's CPU SDPA in bfloat16 is ~6x slower), and
`ar` == `verified` holds by construction, not by luck at near-ties (bfloat16's rounding turns any
last-bit difference into different tokens within a few steps, measured): a packed matmul padded to 4
rows gives each row the same bits whatever the row count (`packed_matmul`), and committed rows attend
in one call padded to 4 queries and 64 keys, one-row AR steps and verifying rows alike
(`MoTLayer._attend_exact`).

Which of these kernels exist on the running CPU (oneDNN packing per dtype, the int8 engine) is
decided by `kernels.py`, probed once per process; where one is missing the matmul stays a plain
`F.linear` (or drafting stays float), same values, so `ar`/`verified` token ids do not change.

Together a one-token AR step went 2.4-2.9 -> 1.8-2.3 ms and a K = 8 drafting pass ~2.7 -> ~2.0 ms.
A prepared model is for inference: it cannot be saved (quantized modules do not serialize to
safetensors); save, or train, a model before preparing it.
"""

from __future__ import annotations

import copy
import ctypes
import ctypes.util
import functools
import logging

import torch
import torch.nn.functional as F
from torch import nn

from yue.model import kernels, rowkernel
from yue.model.layers import DecodeSet
from yue.model.screen import ScreenedHead

logger = logging.getLogger(__name__)

INT8 = torch.qint8


class Lowered(nn.Module):
    """A matmul module run in another precision: input cast to `in_dtype`, output cast back."""

    def __init__(self, inner: nn.Module, in_dtype: torch.dtype) -> None:
        super().__init__()
        self.inner, self.in_dtype = inner, in_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.to(self.in_dtype)).to(x.dtype)


def packed_matmul(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x @ W.t() through oneDNN on `kernels.pack_weight(W)`: (..., in) -> (..., out), fewer than
    `MIN_PACKED_ROWS` rows padded with zeros to that many.

    Padded, every row's result is the same bits whatever the call's row count (checked for 1-40 rows
    on SmolLM2's shapes, float32 and bfloat16, one thread; without the padding a 1-row call of the
    1536-wide down projection differs from a 4-row one), so a row verified in a k + 1-row step reads
    what a one-row AR step would.
    """
    rows = x.numel() // x.shape[-1]
    if rows >= MIN_PACKED_ROWS:
        return kernels.packed_linear(x, packed)
    flat = x.reshape(rows, x.shape[-1])
    out = kernels.packed_linear(
        torch.cat([flat, flat.new_zeros(MIN_PACKED_ROWS - rows, flat.shape[1])]), packed
    )
    return out[:rows].view(*x.shape[:-1], out.shape[-1])


# oneDNN's packed GEMM over 1-3 rows costs more than over 4 on SmolLM2's shapes (one thread, weights
# streamed, AVX512: the MLP's gate/up 882 us for 2 rows, 639 for 3, 584 for 5; the head 11.0, 9.1,
# 8.6 ms), so fewer rows are padded with zeros to this many; each row's values stay its own. With AVX2
# padding costs instead; float32, where it is only for speed, pads by `kernels.pad_float32_rows`.
MIN_PACKED_ROWS = 4


class RowAdaptiveLinear(nn.Module):
    """A float32 matmul that picks its CPU kernel by row count: one row through MKL on the input-major
    weight (`input_major`), two or more through oneDNN on a copy of the weight pre-packed for its
    blocked GEMM (`packed_matmul`; `torch.ops.mkldnn`, the kernels torch.compile's CPU backend uses).
    Where yue's row kernel builds, a model too large for a cache runs `StreamedLinear` instead
    (`rows_kernel`).

    MKL's small-M GEMM re-packs the weight on every call, which a verifying step (k + 1 rows), a
    prefill or a batch pays per matmul: one thread, 8 rows, weights not in cache, a 256x1376 matmul
    ~175 -> ~85 us and the 256x4096 head ~800 -> ~350 us; for one row MKL's GEMV stays faster (SmolLM2's
    30 layers and head: 36.8 against 40.3 ms packed), hence both copies. Same values, other kernels:
    a one-row step may differ from a verifying row in the last float bits (as any two GEMM kernels do).

    The tensors are held in a tuple, not registered, so the module adds nothing to a state dict and
    moves with no `.to()`: it belongs to a model prepared for decoding on its device.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        # (out, in) as nn.Linear's, the packed copy, and the first's (in, out) view (contiguous where the
        # weight is input-major, `input_major`: the operand MKL's GEMV streams).
        self.weights = (w, kernels.pack_weight(w), w.t())
        self.pad = kernels.choice().pad_float32_rows  # 2-3 rows padded to 4 where that is faster

    @property
    def weight(self) -> torch.Tensor:
        """The (out, in) weight, as nn.Linear's."""
        return self.weights[0]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        weight, packed, by_input = self.weights
        if x.numel() <= x.shape[-1]:  # one row (or none: a drafting pass has no AR rows)
            if x.dim() == 2:  # the decode path's rows (`DecodeSet`): one `mm`, where F.linear dispatches
                return torch.mm(x, by_input)  # `t`, `mm` and, for 3-d input, views around them
            return F.linear(x, weight)
        return packed_matmul(x, packed) if self.pad else kernels.packed_linear(x, packed)


class StreamedLinear(nn.Module):
    """A float32 matmul on one copy of its weight, laid out for yue's row kernel (`rowkernel`): 1-9 rows
    (a one-row AR step, a verifying step's k + 1) through the kernel, which streams the weight once for
    all rows and gives each row the same bits whatever the row count (`row_exact`: with
    `MoTLayer.exact_rows`, float32 `ar` == `verified` by construction); more rows (a batch, a prefill)
    through torch's batched GEMM over its column blocks (`rowkernel.blocked_gemm`).

    Why (SmolLM2's 30 layers and head, one thread, Xeon; ms, ranges over runs): one row 51-58 against
    MKL's GEMV 54-66; 2 / 9 rows 50-56 / 83-92 against oneDNN's packed copy 90 / 106-113 and MKL's GEMM
    137-148 (it re-packs the weight every call). 10 / 16 / 32 rows through the batched GEMM 106 / 128 /
    173 against oneDNN's 105 / 121 / 171; 64 / 200 rows 304 / 855 against MKL's GEMM 250 / 1004. One copy,
    where `RowAdaptiveLinear` holds two: the layers' input-major weights are released
    (`release_unpacked`).

    A weight that 4-bit codes give back exactly (a GGUF's Q4_1 weights, dequantized: `rowkernel.q4_block`)
    is held as those codes, 0.75 bytes a weight against 4, and computed from them with the same bits
    (`rows_matmul_q4`), for every row count, a prefill's too (passes of 6-9 rows). SmolLM2's 30 layers,
    one thread, AMD EPYC with AVX2, ms (min of 10 calls): 1 / 2 / 4 / 9 rows 8.3 / 11.6 / 16.1 / 33.4
    against 28-31 / 29-30 / 34-39 / 64-71 on the float32 copy: a step no longer waits on memory, so each
    extra row (~3 ms, the FMA units' pace) is a larger share of it. A weight that 8-bit codes give back
    exactly (a GGUF's Q8_0 table: SmolLM2's tied head, 113 MB as float32) is held as those
    (`rowkernel.q8_block`, 1.125 bytes a weight), the same way.

    The tensor is held in a tuple, not registered: nothing in a state dict, no `.to()`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        codes = rowkernel.q4_block(weight) if kernels.choice().ok("rows-q4") else None
        if codes is None and kernels.choice().ok("rows-q8"):
            codes = rowkernel.q8_block(weight)
        self.blocked = (rowkernel.block(weight) if codes is None else codes,)
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = x.numel() // x.shape[-1]
        if rows <= rowkernel.MAX_ROWS or rowkernel.layout(self.blocked[0]) != "float32":
            return rowkernel.matmul(x, self.blocked[0], self.out_features)
        return rowkernel.blocked_gemm(x, self.blocked[0], self.out_features)


class RowInt8Linear(nn.Module):
    """A drafting matmul in int8 on yue's row kernel: the weight's codes per output row (symmetric,
    scale = max |w| / 127) in `rowkernel.dot_block`'s layout, each activation row quantized to int8 the
    same way and multiplied in integer arithmetic (`rows_matmul_i8dot`), then both scales. Its point is
    the whole NAR layer in one row-kernel call (`DecodeSet.whole_layer`): a drafting pass through
    SmolLM2's 4 NAR layers ran ~25 torch calls a layer, and at 2-8 slots their Python and small ops cost
    more than the matmuls (AMD EPYC, AVX2, one thread: pass 8.2 / 10.1 ms for 2 / 8 slots, of which the
    int8 matmuls 2.7 / 4.9). On integer dot products rather than the codes widened to floats (the first
    form) the 4 layers' matmuls cost 1.18 / 1.39 / 2.29 ms at 2 / 4 / 8 rows instead of 1.38 / 2.09 /
    3.79, 4 rows at memory speed (`rowkernel.c`); the rows' rounding (~0.8% relative on Gaussian rows,
    like torch's dynamic int8) touches drafts only.

    The tensors are held in tuples, not registered: nothing in a state dict, no `.to()`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach().float()
        scale = (w.abs().amax(1) / 127).clamp(min=torch.finfo(torch.float32).tiny)
        codes = torch.round(w / scale[:, None]).clamp(-127, 127).to(torch.int8)
        self.blocked, self.scale = (rowkernel.dot_block(codes),), (scale,)
        self.out_features = linear.out_features

    @staticmethod
    def fits(linear: nn.Linear) -> bool:
        """Whether a float32 `linear` can be one (`dot_block` takes inputs in quads)."""
        return linear.weight.dtype == torch.float32 and linear.in_features % 4 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rowkernel.matmul(x, self.blocked[0], self.out_features) * self.scale[0]


class PackedLinear(nn.Module):
    """A bfloat16 matmul through oneDNN on a pre-packed copy of the weight, for every row count.

    MKL has no fast bfloat16 GEMV: SmolLM2's 30 layers and head over one row cost 41 ms through
    `F.linear` against 20 ms packed and padded to 4 rows (`packed_matmul`), so one copy serves every
    step, and a one-row step and a verifying row run the same kernel on the same padded shape (with
    `MoTLayer.exact_rows`, attention too): `ar` and `verified` read the same bits.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.packed = (kernels.pack_weight(linear.weight.detach()),)  # a tuple: not in the state dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_matmul(x, self.packed[0])


class Int4Linear(nn.Module):
    """The int4 precision's matmul: a float32 (out, in) weight held as 4-bit codes with a bfloat16 scale
    and zero point per group of 32 inputs (`quantize_int4`), run by torch's CPU int4pack kernel on
    bfloat16 activations (float32 in and out, as the rest of the model).

    A quarter of bfloat16's bytes: SmolLM2's 30 layers over one row 6.8 ms against 17.0 packed in
    bfloat16 (2 / 4 / 8 rows: 8.2 / 11.5 / 21.5 ms; one thread, this project's AVX512 CPU). Each row's
    result is the same bits whatever the call's row count (checked for 1-9 rows in the tests), so with
    `MoTLayer.exact_rows` a verifying row reads what a one-row AR step would: `ar` == `verified`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        codes, scales_zeros = quantize_int4(linear.weight.detach())
        self.packed = (kernels.pack_int4(codes), scales_zeros)  # a tuple: nothing in a state dict
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = kernels.int4_linear(flat, *self.packed)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


class RowInt4Linear(nn.Module):
    """The int4 precision's matmul on yue's row kernel: the weight as 4-bit codes with a float32 d and m
    per group of 32 inputs (`rowkernel.q4dot_block`: a Q4_1 GGUF's own codes and scales, exactly), each
    activation row quantized to int8 per group of 32 and multiplied in integer arithmetic
    (`rows_matmul_q4dot`: llama.cpp's Q4_1 x Q8_1 scheme). Row-exact: a row's bits do not depend on the
    call's rows, so `ar` == `verified` in this precision. Preferred over `Int4Linear` where the row
    kernel builds: its layers are one row-kernel call each and a step's layers one call
    (`rowkernel.stack`), and a row costs about half the float32 one's from the same codes (figures in
    `rowkernel`'s docstring).

    The tensor is held in a tuple, not registered: nothing in a state dict, no `.to()`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.blocked = (rowkernel.q4dot_block(linear.weight.detach()),)
        self.out_features = linear.out_features

    @staticmethod
    def fits(linear: nn.Module) -> bool:
        """Whether the row kernel's int4 matmul takes `linear`: bias-free float32 on the CPU, inputs in
        whole groups of 32."""
        return cpu_matmul(linear) and linear.weight.dtype == torch.float32 and linear.in_features % 32 == 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return rowkernel.matmul(x, self.blocked[0], self.out_features)


def int4_matmul(linear: nn.Module) -> nn.Module:
    """The int4 precision's form of an AR matmul: on the row kernel where it runs its int4 matmul
    (`RowInt4Linear`), else torch's int4pack (`Int4Linear`); a matmul neither takes in bfloat16
    (`bf16_packed`), row-exact as they are."""
    if kernels.choice().ok("rows-int4") and RowInt4Linear.fits(linear):
        return RowInt4Linear(linear)
    return Int4Linear(linear) if int4_usable(linear) else bf16_packed(linear)


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weight -> codes (out, in) int32 in 0..15 and scales_zeros (in / 32, out, 2)
    bfloat16, the weight being (code - 8) * scale + zero per group of 32 inputs.

    Asymmetric round-to-nearest: scale = (max - min) / 15 of the group, code = round((w - min) / scale).
    A weight dequantized from the GGUF's Q4_1 (SmolLM2's layers: scale d, minimum m, codes 0..15 whose
    extremes every block uses) gives back the file's codes, and its d and m up to bfloat16's rounding
    of the scale and zero. Measured on SmolLM2's layers: the values within 0.5% of a quantization step
    on average (4.6% at most), 0.2% of the weight's norm: the order of bfloat16's own rounding.
    """
    codes, scale, lo = (t.squeeze(-1) for t in rowkernel.q4_groups(w))  # groups of INT4_GROUP = 32
    scales_zeros = torch.stack([scale.t(), (lo + 8 * scale).t()], -1).to(torch.bfloat16).contiguous()
    return codes.to(torch.int32).reshape(w.shape), scales_zeros


def cpu_matmul(linear: nn.Module) -> bool:
    """Whether a module is a bias-free nn.Linear on the CPU: what every decode kernel here takes."""
    return isinstance(linear, nn.Linear) and linear.bias is None and linear.weight.device.type == "cpu"


def int4_usable(linear: nn.Module) -> bool:
    """Whether the int4 kernel takes this matmul: a bias-free float32 nn.Linear on the CPU whose inputs
    are whole groups of 32 and whose outputs a multiple of 16 (the kernel's packing)."""
    return (
        cpu_matmul(linear)
        and linear.weight.dtype == torch.float32
        and linear.in_features % kernels.INT4_GROUP == 0
        and linear.out_features % 16 == 0
    )


def int4_unavailable(device: torch.device | str) -> str:
    """Why the int4 precision cannot run on `device` ("" = it can): for `load`, before any weights
    are read, and for `prepare_for_decoding`."""
    if torch.device(device).type != "cpu":
        return "the CPU (its kernels are yue's row kernel and torch's CPU int4pack)"
    if not kernels.choice().int4_rows:
        return f"a CPU where yue's row kernel or torch's int4 kernel runs ({kernels.describe()})"
    return ""


def row_exact(matmul: nn.Module) -> bool:
    """Whether a decode matmul gives each row the same bits whatever the call's row count."""
    inner = matmul.inner if isinstance(matmul, Lowered) else matmul
    return isinstance(inner, (PackedLinear, Int4Linear, RowInt4Linear, StreamedLinear))


def bf16_packed(linear: nn.Module) -> nn.Module:
    """A bfloat16 `PackedLinear` copy of a float32 `linear` taking and returning float32 (row-exact, half
    the bytes): the int4 precision's head, and its matmuls the int4 kernel does not take; `linear`'s
    own `row_adaptive` kernel where oneDNN's bfloat16 packing does not work here."""
    if not (cpu_matmul(linear) and kernels.packed_rows(torch.bfloat16)):
        return row_adaptive(linear)
    return Lowered(PackedLinear(copy.deepcopy(linear).to(torch.bfloat16)), torch.bfloat16)


class Int8Linear(nn.Module):
    """torch's dynamic int8 Linear (`quantize_dynamic`) with its Python forward cut to the kernel call.

    The stock module's forward reads its packed params through two attribute lookups, checks their
    dtype and casts the output to the input's dtype (float32 already) on every call: ~8 us around a
    ~30 us kernel, 17 times in a drafting pass. Same kernel, same arguments (reduce_range as the stock
    module's version 4), same outputs.
    """

    def __init__(self, quantized: nn.Module) -> None:
        super().__init__()
        self.quantized = quantized  # owns the packed weight; registered, so it prints and moves as before
        self.packed = (quantized._packed_params._packed_params,)  # held in a tuple: no second registration

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.quantized.linear_dynamic(x, self.packed[0], reduce_range=True)


def row_adaptive(linear: nn.Module, one_copy: bool = False, rows: str | None = None) -> nn.Module:
    """The decode-path kernel for a float matmul, where one applies (a bias-free nn.Linear on the CPU
    whose dtype has a faster kernel here, `kernels`), else `linear` itself (plain F.linear):
    `PackedLinear` for bfloat16; for float32 by `rows` (default `kernels.choice().float32_rows`;
    `rows_kernel` chooses per model) `StreamedLinear` (the row kernel, one copy) or `RowAdaptiveLinear`
    (MKL's GEMV for one row, oneDNN's packed copy for more), or with `one_copy` (`streamed_weights`,
    `low_memory`) the kernel `kernels` chose for a weight held once: `PackedLinear`, or `linear`
    itself on its input-major weight."""
    if not cpu_matmul(linear):
        return linear
    if linear.weight.dtype == torch.bfloat16:
        return PackedLinear(linear) if kernels.packed_rows(torch.bfloat16) else linear
    if linear.weight.dtype != torch.float32:
        return linear
    if one_copy:
        return PackedLinear(linear) if kernels.choice().float32_one_copy == "onednn-packed" else linear
    rows = rows or kernels.choice().float32_rows
    kind = {"row-stream": StreamedLinear, "onednn-packed": RowAdaptiveLinear}.get(rows)
    return linear if kind is None else kind(linear)


# Float32 AR layer weights above this many bytes are held once (`streamed_weights`).
ONE_COPY_BYTES = 2**30
# Float32 AR layer weights above this many bytes stream from memory in every step, where the
# row kernel beats oneDNN's; smaller ones can stay in a last-level cache (105 MiB on this project's
# Xeon), where oneDNN's GEMM computes faster (`kernels.KernelChoice.float32_rows`).
ROW_STREAM_BYTES = 2**27


def ar_layer_bytes(model) -> int:
    """Bytes of the AR set's layer matmul weights (the head not counted)."""
    return sum(
        m.weight.numel() * m.weight.element_size()
        for layer in model.model.layers
        for module in layer._sets(False)[1:4:2]
        for m in module.children()
        if isinstance(m, nn.Linear)
    )


@functools.cache
def warn_fallbacks(choice: kernels.KernelChoice) -> None:
    """One WARNING per process (per kernel choice: a forcing is another) naming each fallback taken,
    `KernelChoice.losses`: a fallback can make decoding several times slower, and the CLI shows
    warnings on stderr (Python's last-resort handler) where INFO stays hidden."""
    if lost := choice.losses():
        logger.warning("kernel fallback, decoding runs slower: %s", "; ".join(lost))


def rows_kernel(model) -> str:
    """The kernel of a float32 model's decode matmuls (`row_adaptive`): `kernels`' choice, except that
    a model whose layers fit in `ROW_STREAM_BYTES` keeps oneDNN where it works (two copies). SmolLM2
    (425 MB of layers; one thread, Xeon): a verifying step's 2-9 rows 1.03-1.72x a one-row step with the
    row kernel against 1.51-1.78x with oneDNN; in one process (8 prompts x 64 tokens,
    `docs/recipes/row_kernel_ab.py`) `verified` 1.30x faster held-out and 1.67x on the calibration
    split, `ar` 1.04x and 0.96x."""
    choice = kernels.choice()
    if (
        choice.float32_rows == "row-stream"
        and choice.ok("onednn-f32")
        and ar_layer_bytes(model) <= ROW_STREAM_BYTES
    ):
        return "onednn-packed"
    return choice.float32_rows


def streamed_weights(model) -> bool:
    """Whether a float32 model's AR layers keep one copy of each weight, not two (MKL's input-major one
    and oneDNN's packed one, `RowAdaptiveLinear`): where they exceed `ONE_COPY_BYTES` (1 GiB, ~270M
    parameters), for a model whose second copy would cost more memory than its speed is worth. Which
    copy is `kernels.choice().float32_one_copy`, timed on this CPU: the packed one where its one row
    is about level with MKL's GEMV (`PackedLinear`, as in bfloat16), else the input-major one. A
    smaller model holds one copy when loaded with `low_memory` (`prepare_for_decoding`).

    The second copy buys one-row speed: the packed kernel over one row (padded to 4) is slower than
    MKL's GEMV in the model, though level out of it (SmolLM2's bare matmuls 37.4 vs 38.0 ms). Measured
    on SmolLM2 (425 MB of layers, below the bound) with AVX512, one `yue bench` run each, held-out,
    against transformers: one packed copy 1.30x its peak memory (1.2 GB), `ar` 1.38x and `verified`
    1.62x its tokens/s; two copies 1.75x (1.6 GB), 1.48x and 1.76x. Its bfloat16 and int4 precisions hold one
    copy already (0.72x, 1.19x memory). A small model keeps both copies for the same reason, more so:
    its step is per-call overhead (yue-code-mini's 4 layers and head over one row, 0.55 ms through MKL
    against 1.35 ms packed). Where the one copy is the packed one the head keeps both: its input-major
    copy is the embedding table too (`input_major`), so only the packed copy is extra.
    """
    return ar_layer_bytes(model) > ONE_COPY_BYTES


def lower_linear(linear: nn.Linear, dtype: torch.dtype, row_kernel: bool = False) -> nn.Module:
    """A lowered copy of `linear` (the original is left as it is), taking and returning the activations'
    dtype (= `linear`'s): wrapped in `Lowered` where a cast is needed, bare where none is (int8 on a
    float32 model: one Python call less per matmul on the decode path).

    Args:
        linear: a float nn.Linear, on the CPU for int8.
        dtype: torch.qint8 (dynamic int8, per-channel weight scales) or a float dtype such as bfloat16.
        row_kernel: int8 of a float32 `linear` on yue's row kernel (`RowInt8Linear`; the caller checked
            that it runs here) rather than torch's engine.
    Raises:
        ValueError: int8 requested for a module on a GPU, or where no int8 engine works (`kernels`).
    """
    if dtype == INT8 and row_kernel and RowInt8Linear.fits(linear):
        return RowInt8Linear(linear)
    if dtype != INT8:
        lowered = copy.deepcopy(linear).to(dtype)
        lowered.weight = nn.Parameter(decode_storage(lowered.weight.detach()), requires_grad=False)
        return Lowered(lowered, dtype)
    engine = kernels.int8_engine()
    if linear.weight.device.type != "cpu" or engine is None:
        raise ValueError(int8_unavailable())
    q = Int8Linear(kernels.quantize_int8(linear, engine))
    return q if linear.weight.dtype == torch.float32 else Lowered(q, torch.float32)


def int8_unavailable() -> str:
    """The error for int8 drafting where it cannot run, with the probe's findings."""
    return f"int8 drafting needs a CPU where one of torch's int8 engines works ({kernels.describe()}); use bfloat16"


DRAFTING_DTYPES = {"int8": INT8, "bfloat16": torch.bfloat16, "float32": None}


def dtype_name(dtype: torch.dtype | None) -> str:
    """A drafting dtype's name, as `resolve_drafting_dtype` reads it (None: "float32", as loaded)."""
    return next(k for k, v in DRAFTING_DTYPES.items() if v == dtype)


def resolve_drafting_dtype(name: str | torch.dtype | None, device: torch.device | str) -> torch.dtype | None:
    """A drafting precision -> dtype for `prepare_for_decoding` (None = as loaded).

    name: "auto" (int8 on a CPU where an int8 engine works, `kernels.int8_engine`, else as loaded),
    "int8", "bfloat16", "float32", or a dtype (torch.qint8, torch.bfloat16) / None as is.
    Raises:
        ValueError: an unknown name, or "int8" on a CPU where no int8 engine works.
    """
    if not isinstance(name, str):
        return name
    on_cpu = torch.device(device).type == "cpu"
    if name == "auto":
        return INT8 if on_cpu and kernels.int8_engine() is not None else None
    if name not in DRAFTING_DTYPES:
        raise ValueError(f"drafting dtype must be one of auto, int8, bfloat16, float32; got {name!r}")
    if name == "int8" and on_cpu and kernels.int8_engine() is None:
        raise ValueError(int8_unavailable())
    return DRAFTING_DTYPES[name]


# A model's precision by name -> the dtype `load` converts it to (None: as saved). "int4" loads as
# saved and holds its AR layers in 4 bits (`int4_matmul`, `prepare_for_decoding(int4=True)`).
PRECISIONS = {"float32": None, "bfloat16": torch.bfloat16, "int4": None}


def resolve_dtype(name: str | torch.dtype | None) -> torch.dtype | None:
    """A model precision -> the dtype `load` converts to: "float32" / "int4" / None (as saved) or
    "bfloat16"; a torch dtype passes as it is.

    Raises:
        ValueError: an unknown name.
    """
    if not isinstance(name, str):
        return name
    if name not in PRECISIONS:
        raise ValueError(f"dtype must be one of {', '.join(PRECISIONS)}; got {name!r}")
    return PRECISIONS[name]


def input_major(model: nn.Module) -> nn.Module:
    """Store every float32 nn.Linear weight input-major, in place: same (out, in) shape and values, but
    the storage is the transpose, (in, out) row-major (other dtypes stay row-major: `decode_storage`).

    `F.linear(x, W)` multiplies by W.t(); with this layout W.t() is contiguous and MKL's small-row GEMM
    streams it (one thread, weights not in cache: a 256x688 matmul over 1 row 95 -> 56 us, the 256x4096
    head 563 -> 212 us). Embeddings stay row-major: a lookup gathers rows, which input-major storage
    scatters over the whole table. Where a head is tied to a large embedding (over `SHARED_TABLE`
    floats), the embedding becomes a view of the head's input-major copy instead of keeping a second
    table: SmolLM2's 49,152 x 576 table is 113 MB, and its strided lookup costs ~30 us for a 9-token
    step (~0.7 ms for a 200-token prompt) against a ~40 ms step. A small model keeps both (its
    lookup's share of a ~2 ms step would be felt, the copy's bytes would not).
    """
    seen: dict[int, nn.Parameter] = {}
    for module in model.modules():
        if isinstance(module, nn.Linear):
            w = module.weight
            if id(w) not in seen:
                seen[id(w)] = nn.Parameter(decode_storage(w.detach()), requires_grad=False)
            module.weight = seen[id(w)]
            release_freed_memory()  # the replaced weight's pages, before the next copy adds to the peak
    for module in model.modules():
        if isinstance(module, nn.Embedding) and id(module.weight) in seen:  # tied to a head
            if module.weight.numel() > SHARED_TABLE:
                module.weight = seen[id(module.weight)]
    return model


# Tied tables larger than this many floats are shared by the embedding and the input-major head.
SHARED_TABLE = 8 * 2**20


def decode_storage(w: torch.Tensor) -> torch.Tensor:
    """An (out, in) weight's decode-time copy: input-major storage for float32 (MKL's GEMV, above),
    row-major for other dtypes. Input-major storage does not pay below float32: where oneDNN's packed
    bfloat16 kernel is missing (a CPU without AVX512, `kernels`), F.linear over an input-major
    bfloat16 weight takes a slow path (576x3072, one row, AVX2, one thread: 4.4 ms against 0.64 ms
    row-major and 0.34 ms float32 input-major); where it is present the packed copy serves the matmul."""
    return w.t().contiguous().t() if w.dtype == torch.float32 else w.contiguous()


def fuse_linears(parts: list[nn.Linear]) -> nn.Linear:
    """One nn.Linear in `decode_storage` computing `parts` side by side (outputs concatenated, in order);
    each part's weight becomes a view of the fused storage, so no weight is held twice."""
    out = sum(p.out_features for p in parts)
    fused = nn.Linear(parts[0].in_features, out, bias=False, device="meta")  # no random init: replaced
    w = torch.cat([p.weight.detach() for p in parts], dim=0).to(parts[0].weight.dtype)  # (out, in)
    fused.weight = nn.Parameter(decode_storage(w), requires_grad=False)
    start = 0
    for p in parts:
        p.weight = nn.Parameter(fused.weight[start : start + p.out_features], requires_grad=False)
        start += p.out_features
    return fused


def prepare_for_decoding(
    model, drafting_dtype: torch.dtype | None, int4: bool = False, low_memory: bool = False
) -> None:
    """Ready a YueForCausalLM for fast decoding, in place (inference only; see the module docstring).

    - Every matmul weight input-major (`input_major`).
    - Per layer and parameter set, Q/K/V and gate/up fused into one matmul each (`DecodeSet`).
    - Float matmuls of the decode path (the AR set's, the LM head's for AR rows as `model.ar_head`)
      on the kernel `kernels` found working for their dtype (`row_adaptive`): float32 one copy for the
      row kernel (`StreamedLinear`) or two, MKL's and oneDNN's (`RowAdaptiveLinear`), as `rows_kernel`
      chooses; the packed copy alone for bfloat16 and for a large float32 model's layers (`PackedLinear`,
      `streamed_weights`). Layers whose matmuls are all row-exact (bfloat16's packed copy, the row
      kernel, int4) attend in the exact form too (`MoTLayer.exact_rows`) and release their float
      weights (`release_unpacked`).
    - A float32 row-kernel head (`StreamedLinear`) gets an int8 screen (`screen.ScreenedHead`): greedy
      steps choose the full float32 head's token at a quarter of its bytes (28 MB more for SmolLM2).
    - With `drafting_dtype`, the NAR set's matmuls and a copy of the LM head for slot rows
      (`model.draft_head`) lowered to it; the AR set and its head are untouched, so `ar` and
      `verified` output is the same whatever the drafting precision.
    - With `int4` (the int4 precision, a float32 model on the CPU): the AR layers' matmuls in 4 bits
      (`int4_matmul`): on the row kernel with int8 activations (`RowInt4Linear`; the head for AR rows
      float32 there, `StreamedLinear`, screened), else torch's int4pack on bfloat16 activations
      (`Int4Linear`; the head in bfloat16, `bf16_packed`), all row-exact.
    - With `low_memory`, a float32 model's AR matmuls hold one copy whatever their size, as a large
      model's do (`streamed_weights`): the row kernel's layers already do, and their head keeps only
      its input-major copy (the embedding table); else `kernels.choice().float32_one_copy`, the
      packed copy (where its one row is timed level with MKL's GEMV; the head then keeps its
      input-major copy too) or the input-major weight alone (elsewhere; verifying rows then cost more,
      and the step costs steer drafting by them).

    Raises:
        ValueError: `int4` where the model is not float32 on the CPU, or the kernel does not run here.
    """
    if model.prepared_for_decoding:
        raise ValueError("the model is already prepared for decoding")
    if int4:
        why = int4_unavailable(model.device) or ("a float32 model" if model.dtype != torch.float32 else "")
        if why:
            raise ValueError(f"the int4 precision needs {why}")
    if model.device.type == "cpu":
        logger.info("kernels: %s", kernels.describe())
        warn_fallbacks(kernels.choice())
        if model.dtype == torch.bfloat16 and not kernels.packed_rows(torch.bfloat16):
            logger.warning(
                "bfloat16 on this CPU runs through plain F.linear (%s): slower than float32 here "
                "(SmolLM2 on an AVX2 CPU, one thread: a step 77 ms against 58, verifying rows 1.6-5.9x a "
                "step), and its rows' bits depend on a step's row count, so `verified` may part from `ar` "
                "where two tokens are near-tied; float32 or int4 run faster, and exactly",
                next(p.why for p in kernels.choice().probes if p.name == "onednn-bf16"),
            )
    one_copy = low_memory or streamed_weights(model)
    on_cpu_float32 = model.dtype == torch.float32 and model.device.type == "cpu"
    rows = rows_kernel(model) if on_cpu_float32 else None  # no CPU kernel probed for a GPU's model
    # The row kernel's layers hold one copy anyway (`StreamedLinear`); one_copy then leaves the head
    # its input-major copy alone, the embedding table.
    streamed = rows == "row-stream"
    # The rest of a float32 step's row-wise work on yue's row kernel too, where it builds: the norms
    # (`DecodeSet.rms_norm`) and the row-exact layers' attention (`MoTLayer._attend_kernel`, float32 and
    # int4, whose caches hold float32). In one process (8 held-out prompts x 64 tokens, float32, one
    # thread, Xeon) the norms made `ar` and `verified` 1.04x as fast, the attention `ar` 1.11x more.
    row_ops = on_cpu_float32 and kernels.choice().ok("rows-f32")
    if one_copy and on_cpu_float32 and (streamed or kernels.packed_rows(torch.float32)):
        logger.info(
            "one copy of each float32 weight: %s",
            "the row kernel's; the head the input-major embedding table"
            if streamed
            else f"{kernels.choice().float32_one_copy} (oneDNN's packed one row timed at "
            f"{kernels.one_row_packed_ratio():.2f}x MKL's GEMV here)",
        )
    input_major(model)
    release_freed_memory()
    for layer in model.model.layers:
        sets = []
        for nar in (False, True)[: 1 + layer.has_nar]:
            _, proj, _, mlp = layer._sets(nar)
            qkv = fuse_linears([proj.q_proj, proj.k_proj, proj.v_proj])
            gate_up = fuse_linears([mlp.gate_proj, mlp.up_proj])
            if nar and drafting_dtype is not None:
                # int8 on the row kernel where its norms and attention run too: the layer is one call.
                lower = functools.partial(lower_linear, dtype=drafting_dtype, row_kernel=row_ops)
                qkv, gate_up = lower(qkv), lower(gate_up)
                # The separate NAR modules are lowered too: no float copy of the NAR set stays alive.
                for module in (proj, mlp):
                    for name, child in list(module.named_children()):
                        setattr(module, name, lower(child))
            matmuls = [
                int4_matmul(m) if int4 and not nar else row_adaptive(m, one_copy and not streamed, rows)
                for m in (qkv, proj.o_proj, gate_up, mlp.down_proj)
            ]
            exact = not nar and all(row_exact(m) for m in matmuls)
            attention = "kernel" if row_ops and rowkernel.attention_fits(layer.head_dim) else "padded"
            if int4 and attention != "kernel":
                # int4 attends one query per call: its one-row step is the cheapest, and a padded call's
                # extra ~60 us a layer costs it 7% (`ar` 0.933x, `verified` 0.99x the per-row form; one
                # process, 8 calibration prompts x 96 tokens, Xeon); bfloat16's nearly free verifying
                # rows (AMX) verify many, where one padded call pays (`verified` 1.085x, `ar` 0.973x).
                attention = "per-row"
            sets.append(DecodeSet(layer, nar, *matmuls, exact=exact, attention=attention, row_norm=row_ops))
        layer.decode_sets = nn.ModuleList(sets)
        if layer.exact_rows:
            release_unpacked(layer)
        release_freed_memory()  # per layer, so the freed copies do not pile up into the peak
    model.model.kernel_stacks = kernel_stacks(model.model.layers)
    entry = model.model.slot_entry
    if entry is not None and drafting_dtype is not None:
        entry.lower(functools.partial(lower_linear, dtype=drafting_dtype, row_kernel=row_ops), row_ops)
    if row_ops:
        norm = model.model.norm
        model.model.slot_norm = functools.partial(rowkernel.rms_norm, weight=norm.weight, eps=norm.eps)
        model.router.softmax_stats = rowkernel.softmax_stats
    # One copy of the head only where it is the input-major one, which the embedding table shares
    # (`input_major`); a packed copy would be a second (`streamed_weights`).
    head_once = one_copy and (streamed or kernels.choice().float32_one_copy == "F.linear")
    if int4 and kernels.choice().ok("rows-int4"):
        head = StreamedLinear(model.lm_head)  # the float32 logits of the int4 rows, screened below
    elif int4:
        head = bf16_packed(model.lm_head)
    elif head_once and streamed:  # not `row_adaptive`'s one copy, which may be a packed one (timed)
        head = model.lm_head
    else:
        head = row_adaptive(model.lm_head, head_once, rows)
    if isinstance(head, StreamedLinear) and row_ops:
        # Greedy steps choose at a quarter of the head's bytes, the same token (`screen.py`).
        head = ScreenedHead(head, model.lm_head.weight)
    model.ar_head = head if head is not model.lm_head else None
    if model.model.layers[0].exact_rows:
        # bfloat16 on a CPU attends in float32: torch's CPU SDPA in bfloat16 costs ~185 us a call
        # against ~28 in float32 (one query, 200 keys, SmolLM2's heads), 30 calls a step.
        model.cache_dtype = torch.float32
    model.draft_head = draft_head(model, drafting_dtype, row_ops)
    release_freed_memory()


def kernel_stacks(layers) -> dict:
    """Per parameter set (False: AR, True: NAR), its layers' one-call weights as one stack
    (`rowkernel.StackWeights`, `MoTModel._stacked`) where every layer holding the set is one row-kernel
    call (`DecodeSet.one_layer`) and they share their sizes and kind; no entry elsewhere.

    Why: with each layer one call, a step's remaining Python was ~70 us a layer (module calls, views,
    ctypes): ~2 ms of SmolLM2's ~17 ms one-row step (AMD EPYC, AVX2, one thread)."""
    stacks = {}
    for nar in (False, True):
        held = [layer for layer in layers if not nar or layer.has_nar]
        ones = [layer.decode_sets[nar].one_layer for layer in held]
        if held and all(one is not None for one in ones):
            stack = rowkernel.StackWeights.of([one.layers[0] for one in ones], first=len(layers) - len(held))
            if stack is not None:
                stacks[nar] = stack
    return stacks


def release_unpacked(layer) -> None:
    """Drop the AR set's (out, in) weights of a layer whose decode path holds them packed
    (`PackedLinear`): one copy in memory instead of two. The layer's uncached AR forward (scoring)
    then runs through its decode path; training it needs a model as loaded (a prepared one cannot be
    saved or trained anyway)."""
    _, proj, _, mlp = layer._sets(False)
    for module in (proj, mlp):
        for child in module.children():
            if isinstance(child, nn.Linear):
                child.weight = nn.Parameter(child.weight.new_empty(0), requires_grad=False)


def release_freed_memory() -> None:
    """Hand the heap's free pages back to the system (glibc's malloc_trim; elsewhere nothing).

    Preparing frees as much as it allocates (every float weight is replaced by its input-major copy),
    mostly in blocks below glibc's mmap threshold, which stay in the heap, counted as resident, until
    trimmed: 176 MB on SmolLM2 (measured).
    """
    trim = _malloc_trim()
    if trim is not None:
        trim(0)


@functools.cache
def _malloc_trim():
    """glibc's malloc_trim, looked up once (`find_library` runs `ldconfig`: ~2 ms, and preparing trims
    once per layer); None without glibc, whose allocator returns memory its own way."""
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim
    except (OSError, AttributeError):
        return None


# Logit of tokens outside a reduced drafting vocabulary: finite (entropies stay defined), never drafted.
DRAFT_FILL = -1e9


def expand_draft_logits(sub: torch.Tensor, ids: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Logits over a drafting vocabulary (..., Vd) -> over the whole vocabulary (..., V), DRAFT_FILL elsewhere."""
    full = sub.new_full((*sub.shape[:-1], vocab_size), DRAFT_FILL)
    # scatter_, not index_copy_ along the last dimension: 8 rows of 8,192 into 49,152 ~0.1 ms against ~0.3-0.7.
    return full.scatter_(-1, ids.expand(*sub.shape[:-1], -1), sub)


class DraftVocabHead(nn.Module):
    """Slot rows' head over a reduced drafting vocabulary (FR-Spec), returning whole-vocabulary logits.

    `inner` maps (B, n, D) -> (B, n, Vd) over the rows `ids` of the LM head; the result is spread into
    (B, n, V) with `DRAFT_FILL` elsewhere (`expand_draft_logits`; on yue's row kernel where `row_kernel`,
    float32 on the CPU: one pass, `rowkernel.spread`), so the policies and the router see the shapes they
    always do. On SmolLM2 the head over the 8,192 most frequent output tokens is a sixth of the full one
    (docs/design.md §8).
    """

    def __init__(
        self, inner: nn.Module, ids: torch.Tensor, vocab_size: int, row_kernel: bool = False
    ) -> None:
        super().__init__()
        self.inner, self.ids, self.vocab_size, self.row_kernel = inner, (ids,), vocab_size, row_kernel

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        sub = self.inner(x)
        if self.row_kernel and sub.dtype == torch.float32:
            return rowkernel.spread(sub, self.ids[0], self.vocab_size, DRAFT_FILL)
        return expand_draft_logits(sub, self.ids[0], self.vocab_size)


def draft_head(model, drafting_dtype: torch.dtype | None, row_kernel: bool = False) -> nn.Module | None:
    """The head for slot rows: the LM head's rows over `model.draft_vocab` (if any), lowered to
    `drafting_dtype` (if any; int8 on yue's row kernel where `row_kernel`, as the NAR layers: SmolLM2's
    8,192-token head, one thread, AVX2, 2 / 4 rows 0.35 / 0.43 ms against torch's dynamic int8's 0.51 /
    0.50); None where the LM head itself serves."""
    vocab = None if model.draft_vocab is None else model.draft_vocab.long()
    lower = functools.partial(lower_linear, dtype=drafting_dtype, row_kernel=row_kernel)
    if vocab is None:
        return None if drafting_dtype is None else lower(model.lm_head)
    sub = nn.Linear(model.config.hidden_size, len(vocab), bias=False, device=vocab.device)
    sub.weight = nn.Parameter(model.lm_head.weight.detach()[vocab].clone(), requires_grad=False)
    inner = row_adaptive(sub) if drafting_dtype is None else lower(sub)
    return DraftVocabHead(inner, vocab, model.config.vocab_size, row_kernel)
