"""The decode path's matmul modules: one class per weight format and kernel, and the functions that
pick one for a weight (`row_adaptive`, `int4_matmul`, `lower_linear`).

Each module maps (..., in) activations to (..., out) as the nn.Linear it replaces, holding its weight in
the layout its kernel streams (input-major for MKL, oneDNN-packed, or yue's row kernel's blocks and
codes). Which kernels run on this CPU is `kernels`' answer; `prepare.prepare_for_decoding` puts these
modules into a model. Tensors are held in tuples, not registered, so a prepared model's state dict is
unchanged. Why each format exists is in its docstring; the measurements behind the choices are in the
measurement log (docs/results-log.md).
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn

from yue.kernels import probe, rowkernel

INT8 = torch.qint8
Q8_0 = 8  # the ggml type id of a GGUF Q8_0 table (`StreamedLinear`)


class Lowered(nn.Module):
    """A matmul module run in another precision: input cast to `in_dtype`, output cast back."""

    def __init__(self, inner: nn.Module, in_dtype: torch.dtype) -> None:
        super().__init__()
        self.inner, self.in_dtype = inner, in_dtype

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x.to(self.in_dtype)).to(x.dtype)


def packed_matmul(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x @ W.t() through oneDNN on `probe.pack_weight(W)`: (..., in) -> (..., out), fewer than
    `MIN_PACKED_ROWS` rows padded with zeros to that many.

    Padded, every row's result is the same bits whatever the call's row count (checked for 1-40 rows
    on SmolLM2's shapes, float32 and bfloat16, one thread; without the padding a 1-row call of the
    1536-wide down projection differs from a 4-row one), so a row verified in a k + 1-row step reads
    what a one-row AR step would.
    """
    rows = x.numel() // x.shape[-1]
    if rows >= MIN_PACKED_ROWS:
        return probe.packed_linear(x, packed)
    flat = x.reshape(rows, x.shape[-1])
    out = probe.packed_linear(
        torch.cat([flat, flat.new_zeros(MIN_PACKED_ROWS - rows, flat.shape[1])]), packed
    )
    return out[:rows].view(*x.shape[:-1], out.shape[-1])


# oneDNN's packed GEMM over 1-3 rows costs more than over 4 on SmolLM2's shapes with AVX512 (measured:
# docs/results-log.md, "Figures that were in code comments"), so fewer rows are padded with zeros to this many; each row's values stay its own. With AVX2
# padding costs instead; float32, where it is only for speed, pads by `probe.pad_float32_rows`.
MIN_PACKED_ROWS = 4


class RowAdaptiveLinear(nn.Module):
    """A float32 matmul that picks its CPU kernel by row count: one row through MKL on the input-major
    weight (`prepare.input_major`), two or more through oneDNN on a copy of the weight pre-packed for its
    blocked GEMM (`packed_matmul`; `torch.ops.mkldnn`, the kernels torch.compile's CPU backend uses).
    Where yue's row kernel builds, a model runs `StreamedLinear` instead
    (`probe.KernelChoice.float32_rows`).

    MKL's small-M GEMM re-packs the weight on every call, which a verifying step (k + 1 rows), a
    prefill or a batch pays per matmul, so several rows run faster on the pre-packed copy; for one row
    MKL's GEMV stays faster, hence both copies (figures: docs/results-log.md). Same values, other kernels:
    a one-row step may differ from a verifying row in the last float bits (as any two GEMM kernels do).

    The tensors are held in a tuple, not registered, so the module adds nothing to a state dict and
    moves with no `.to()`: it belongs to a model prepared for decoding on its device.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        w = linear.weight.detach()
        # (out, in) as nn.Linear's, the packed copy, and the first's (in, out) view (contiguous where the
        # weight is input-major, `input_major`: the operand MKL's GEMV streams).
        self.weights = (w, probe.pack_weight(w), w.t())
        self.pad = probe.choice().pad_float32_rows  # 2-3 rows padded to 4 where that is faster

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
        return packed_matmul(x, packed) if self.pad else probe.packed_linear(x, packed)


class StreamedLinear(nn.Module):
    """A float32 matmul on one copy of its weight, laid out for yue's row kernel (`rowkernel`): 1-9 rows
    (a one-row AR step, a verifying step's k + 1) through the kernel, which streams the weight once for
    all rows and gives each row the same bits whatever the row count (`row_exact`: with
    `decode_paths.exact_rows`, float32 `ar` == `verified` by construction); more rows (a batch, a prefill)
    through torch's batched GEMM over its column blocks (`rowkernel.blocked_gemm`).

    Why: the weight is memory-bound, so streaming it once for all rows makes a verifying step's extra
    rows cheap, where MKL's GEMM re-packs the weight every call; one row is about level with MKL's
    GEMV, and past 9 rows the batched GEMM is level with oneDNN's (SmolLM2's figures:
    docs/results-log.md, "Figures that were in code comments"). One copy,
    where `RowAdaptiveLinear` holds two: the layers' input-major weights are released
    (`release_unpacked`).

    A weight that 4-bit codes give back exactly (a GGUF's Q4_1 weights, dequantized: `rowkernel.q4_block`)
    is held as those codes, 0.75 bytes a weight against 4, and computed from them with the same bits
    (`rows_matmul_q4`), for every row count, a prefill's too (passes of 6-9 rows). A fraction of the
    bytes makes a step faster than on the float32 copy; it no longer waits on memory, so each extra
    row (compute-bound, the FMA units' pace) is a larger share of it (measured: docs/results-log.md). A weight that 8-bit codes give back
    exactly (a GGUF's Q8_0 table: SmolLM2's tied head, 113 MB as float32) is held as those
    (`rowkernel.q8_block`, 1.125 bytes a weight), the same way; and one they give back with a scale per
    16 inputs (a GGUF's Q6_K weights, `rowkernel.q6_block`, 1.25 bytes a weight).

    The tensor is held in a tuple, not registered: nothing in a state dict, no `.to()`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        weight = linear.weight.detach()
        codes = rowkernel.q4_block(weight) if probe.choice().ok("rows-q4") else None
        # A head whose values a GGUF's Q8_0 table gives (`float_codes.install_float_codes`): its records
        # from the file's blocks, the same bytes as from the values.
        source = getattr(linear, "ggml_source", None)
        if codes is None and probe.choice().ok("rows-q8") and source is not None and source[1] == Q8_0:
            codes = rowkernel.block_records(source[0], Q8_0, linear.in_features)
        elif codes is None and probe.choice().ok("rows-q8"):
            codes = rowkernel.q8_block(weight)
            # A GGUF's Q6_K weights: 8-bit codes with a scale per 16 inputs (the same kernels' rebuild).
            codes = rowkernel.q6_block(weight) if codes is None else codes
        self.blocked = (rowkernel.block(weight) if codes is None else codes,)
        self.out_features = linear.out_features

    @classmethod
    def of_records(cls, blocked: torch.Tensor, out_features: int) -> StreamedLinear:
        """One holding `blocked`, a layout's records already built (`float_codes`, from a GGUF's blocks)."""
        self = cls.__new__(cls)
        nn.Module.__init__(self)
        self.blocked, self.out_features = (blocked,), out_features
        return self

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
    SmolLM2's 4 NAR layers ran ~25 torch calls a layer, and at 2-8 slots per-call overhead (their Python
    and small ops) cost more than the matmuls. Integer dot products are faster than the codes widened
    to floats (the first form), reaching memory speed at a few rows (`rowkernel.c`); the rows' rounding
    (like torch's dynamic int8) touches drafts only. Figures: docs/results-log.md.

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

    MKL has no fast bfloat16 GEMV: one row through `F.linear` is slower than packed and padded to 4 rows
    (`packed_matmul`; measured on SmolLM2, docs/results-log.md), so one copy serves every
    step, and a one-row step and a verifying row run the same kernel on the same padded shape (with
    `decode_paths.exact_rows`, attention too): `ar` and `verified` read the same bits.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.packed = (probe.pack_weight(linear.weight.detach()),)  # a tuple: not in the state dict

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return packed_matmul(x, self.packed[0])


class Int4Linear(nn.Module):
    """The int4 precision's matmul: a float32 (out, in) weight held as 4-bit codes with a bfloat16 scale
    and zero point per group of 32 inputs (`quantize_int4`), run by torch's CPU int4pack kernel on
    bfloat16 activations (float32 in and out, as the rest of the model).

    A quarter of bfloat16's bytes, so a memory-bound step is faster than packed bfloat16 (measured on
    SmolLM2: docs/results-log.md). Each row's
    result is the same bits whatever the call's row count (checked for 1-9 rows in the tests), so with
    `decode_paths.exact_rows` a verifying row reads what a one-row AR step would: `ar` == `verified`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        codes, scales_zeros = quantize_int4(linear.weight.detach())
        self.packed = (probe.pack_int4(codes), scales_zeros)  # a tuple: nothing in a state dict
        self.out_features = linear.out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1]).to(torch.bfloat16)
        out = probe.int4_linear(flat, *self.packed)
        return out.to(x.dtype).view(*x.shape[:-1], self.out_features)


class RowInt4Linear(nn.Module):
    """The int4 precision's matmul on yue's row kernel: the weight as 4-bit codes with a float32 d and m
    per group of 32 inputs (`rowkernel.q4dot_block`: a Q4_1 GGUF's own codes and scales, exactly), each
    activation row quantized to int8 per group of 32 and multiplied in integer arithmetic
    (`rows_matmul_q4dot`: llama.cpp's Q4_1 x Q8_1 scheme). Row-exact: a row's bits do not depend on the
    call's rows, so `ar` == `verified` in this precision. Preferred over `Int4Linear` where the row
    kernel builds: its layers are one row-kernel call each and a step's layers one call
    (`rowkernel.stack`), and a row costs less than the float32 one's from the same codes (figures:
    docs/results-log.md).

    The tensor is held in a tuple, not registered: nothing in a state dict, no `.to()`.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.blocked = (rowkernel.q4dot_block(linear.weight.detach()),)
        self.out_features = linear.out_features

    of_records = classmethod(StreamedLinear.of_records.__func__)

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
    if probe.choice().ok("rows-int4") and RowInt4Linear.fits(linear):
        return RowInt4Linear(linear)
    return Int4Linear(linear) if int4_usable(linear) else bf16_packed(linear)


def quantize_int4(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(out, in) float weight -> codes (out, in) int32 in 0..15 and scales_zeros (in / 32, out, 2)
    bfloat16, the weight being (code - 8) * scale + zero per group of 32 inputs.

    Asymmetric round-to-nearest: scale = (max - min) / 15 of the group, code = round((w - min) / scale).
    A weight dequantized from the GGUF's Q4_1 (SmolLM2's layers: scale d, minimum m, codes 0..15 whose
    extremes every block uses) gives back the file's codes, and its d and m up to bfloat16's rounding
    of the scale and zero: on SmolLM2's layers the error is of the order of bfloat16's own rounding
    (measured: docs/results-log.md).
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
        and linear.in_features % probe.INT4_GROUP == 0
        and linear.out_features % 16 == 0
    )


def int4_unavailable(device: torch.device | str) -> str:
    """Why the int4 precision cannot run on `device` ("" = it can): for `load`, before any weights
    are read, and for `prepare_for_decoding`."""
    if torch.device(device).type != "cpu":
        return "the CPU (its kernels are yue's row kernel and torch's CPU int4pack)"
    if not probe.choice().int4_rows:
        return f"a CPU where yue's row kernel or torch's int4 kernel runs ({probe.describe()})"
    return ""


def row_exact(matmul: nn.Module) -> bool:
    """Whether a decode matmul gives each row the same bits whatever the call's row count."""
    inner = matmul.inner if isinstance(matmul, Lowered) else matmul
    return isinstance(inner, (PackedLinear, Int4Linear, RowInt4Linear, StreamedLinear))


def bf16_packed(linear: nn.Module) -> nn.Module:
    """A bfloat16 `PackedLinear` copy of a float32 `linear` taking and returning float32 (row-exact, half
    the bytes): the int4 precision's head, and its matmuls the int4 kernel does not take; `linear`'s
    own `row_adaptive` kernel where oneDNN's bfloat16 packing does not work here."""
    if not (cpu_matmul(linear) and probe.packed_rows(torch.bfloat16)):
        return row_adaptive(linear)
    return Lowered(PackedLinear(copy.deepcopy(linear).to(torch.bfloat16)), torch.bfloat16)


class Int8Linear(nn.Module):
    """torch's dynamic int8 Linear (`quantize_dynamic`) with its Python forward cut to the kernel call.

    The stock module's forward reads its packed params through two attribute lookups, checks their
    dtype and casts the output to the input's dtype (float32 already) on every call: per-call overhead
    that is a large share of a small kernel's time, 17 times in a drafting pass (docs/results-log.md). Same kernel, same arguments (reduce_range as the stock
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
    `PackedLinear` for bfloat16; for float32 by `rows` (default `probe.choice().float32_rows`;
    `probe.KernelChoice.float32_rows`) `StreamedLinear` (the row kernel, one copy) or `RowAdaptiveLinear`
    (MKL's GEMV for one row, oneDNN's packed copy for more), or with `one_copy` (`streamed_weights`,
    `low_memory`) the kernel `kernels` chose for a weight held once: `PackedLinear`, or `linear`
    itself on its input-major weight."""
    if not cpu_matmul(linear):
        return linear
    if linear.weight.dtype == torch.bfloat16:
        return PackedLinear(linear) if probe.packed_rows(torch.bfloat16) else linear
    if linear.weight.dtype != torch.float32:
        return linear
    if one_copy:
        return PackedLinear(linear) if probe.choice().float32_one_copy == "onednn-packed" else linear
    rows = rows or probe.choice().float32_rows
    kind = {"row-stream": StreamedLinear, "onednn-packed": RowAdaptiveLinear}.get(rows)
    return linear if kind is None else kind(linear)


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
    engine = probe.int8_engine()
    if linear.weight.device.type != "cpu" or engine is None:
        raise ValueError(int8_unavailable())
    q = Int8Linear(probe.quantize_int8(linear, engine))
    return q if linear.weight.dtype == torch.float32 else Lowered(q, torch.float32)


def int8_unavailable() -> str:
    """The error for int8 drafting where it cannot run, with the probe's findings."""
    return f"int8 drafting needs a CPU where one of torch's int8 engines works ({probe.describe()}); use bfloat16"


def decode_storage(w: torch.Tensor) -> torch.Tensor:
    """An (out, in) weight's decode-time copy: input-major storage for float32 (MKL's GEMV, above),
    row-major for other dtypes. Input-major storage does not pay below float32: where oneDNN's packed
    bfloat16 kernel is missing (a CPU without AVX512, `kernels`), F.linear over an input-major
    bfloat16 weight takes a slow path, several times slower than row-major (measured on AVX2:
    docs/results-log.md); where it is present the packed copy serves the matmul."""
    return w.t().contiguous().t() if w.dtype == torch.float32 else w.contiguous()
