"""Which CPU kernel each decode-path matmul uses, decided once per process by probing this machine.

Design decisions:
- One seam (docs/style.md habit 13). `prepare.py` and `matmuls.py` ask `packed_rows(dtype)` and `int8_engine()`; nothing
  else in yue tests CPU features. Each kernel is chosen by torch's own feature checks
  (`torch.backends.mkldnn`, `torch.ops.mkldnn._is_mkldnn_bf16_supported`,
  `torch.backends.quantized.supported_engines`) and then *tried*: a tiny call with the real dtype,
  its result compared with plain `F.linear`. A RuntimeError or a wrong value turns the kernel off, with
  the reason kept for `describe()`. Torch reports some gaps only when a kernel runs (oneDNN's bf16
  reorder on a CPU without AVX512 or avx_ne_convert: "mkldnn_reorder_linear_weight: bf16 path needs
  the cpu support avx_ne_convert or avx512bw, avx512vl and avx512dq"), hence the try.
- Tried, not timed, with one exception: a timing on the probe's tiny shapes would not predict the
  model's, and would make the choice (and the tests) depend on the machine's load. The exception is
  the copy kept of a float32 weight held once (`float32_one_copy`), where the vector width proved a
  wrong proxy: it is timed on one layer of SmolLM2's shapes (`one_row_packed_ratio`), whose ratio
  matched the whole model's where measured (docs/results-log.md). Tests force either side through `ONE_COPY_TOLERANCE`.
- Every fallback computes the same function: plain `F.linear` in the same dtype for float matmuls
  (results may differ in the last float bits, as any two GEMM kernels do); float drafting when no
  int8 engine works (only drafts change, so `ar`/`verified` token ids do not).
- int8 engines: x86, then fbgemm. qnnpack and onednn are left out on purpose: on this machine kind
  their dynamic int8 matmul over a drafting pass's rows was no faster than float32 `F.linear`, so
  drafting in them would be no faster (measured: docs/results-log.md).
- The row kernels (`rows-f32`, `rowkernel`): yue's own C loops for float32 1-9-row matmuls, the
  norms and the row-exact attention, built with the system's C compiler on first use; the probe is the
  build plus a tried call of each, and no compiler (or a build that fails) turns them off with the
  compiler's reason, as any other kernel.
- `rows-q4` (`rowkernel.q4_block`, `rows_matmul_q4`): the row kernel's matmul on float32 weights that
  4-bit codes give back exactly (a GGUF's Q4_1 weights), rebuilt from the codes: the same bits as
  `rows-f32` on the float weights, at 0.75 bytes a weight. Probed for those bits (1-9 rows and a
  prefill's, a partial column block); off, the weights stay float32 in the row kernel.
- `rows-q8` (`rowkernel.q8_block`, `rows_matmul_q8`): the same for weights that 8-bit codes give back
  exactly (a GGUF's Q8_0 table: SmolLM2's tied head), at 1.125 bytes a weight; probed alike.
- `rows-int4` (`rowkernel.q4dot_block`, `rows_matmul_q4dot`): the int4 precision's AR layers on the
  row kernel, 4-bit codes times activations quantized to int8 per group of 32 (llama.cpp's Q4_1 x Q8_1
  scheme), in integer dot products. Probed for row-exactness (1-9 rows and 13) and against the float
  product within the activations' rounding; preferred (`int4_rows`), since its layers are one call.
- int4 (`pack_int4`, `int4_linear`: torch's CPU int4pack kernels, weight-only, bfloat16 activations):
  the int4 precision's AR layers where the row kernel does not build (another rounding of the
  activations, so int4's outputs differ from the row kernel's there), a user's choice like bfloat16.
  Where neither probe passes `yue.load(dtype="int4")` is an error naming why. With float32 activations
  the same kernel is much slower here (measured: docs/results-log.md), hence bfloat16.
- Forcing a fallback, for tests and for users on odd CPUs: the environment variable
  `YUE_KERNELS` ("auto", "portable" = every fallback, or e.g. "no-onednn-bf16,no-int8"), or the
  context manager `forced(...)`, which wins over it. A model keeps the kernels it was prepared with.
"""

from __future__ import annotations

import copy
import functools
import os
import time
import warnings
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from yue.kernels import rowkernel
from yue.kernels.screen import ScreenedHead

PACK_ROWS = 8  # oneDNN packs float weights for this many rows (a verifying step's k + 1); any count works
INT8_ENGINES = ("x86", "fbgemm")  # tried in this order; the first that works drafts
KERNELS = (
    "rows-f32",
    "rows-q4",
    "rows-q8",
    "rows-int4",
    "onednn-f32",
    "onednn-bf16",
    *(f"int8-{e}" for e in INT8_ENGINES),
    "int4",
)
ENV = "YUE_KERNELS"
PACKED_KERNEL = {torch.float32: "onednn-f32", torch.bfloat16: "onednn-bf16"}  # dtype -> its packing probe
# A weight held once is kept packed where the packed kernel's one row costs at most this many times
# MKL's GEMV (`KernelChoice.float32_one_copy`). Chosen by measurement to fall between the CPUs where the
# packed copy is about level (it pays) and those where it is clearly slower (docs/results-log.md).
ONE_COPY_TOLERANCE = 1.15


@dataclass(frozen=True)
class Probe:
    """One kernel's verdict: `ok`, and why not (or "" when ok)."""

    name: str
    ok: bool
    why: str = ""


@dataclass(frozen=True)
class KernelChoice:
    """The kernels this process uses (see the module docstring).

    Attributes:
        cpu: torch's CPU capability ("AVX512", "AVX2", "DEFAULT", ...), for the log.
        probes: one `Probe` per name in `KERNELS`, in order.
        native_bf16: the CPU has bfloat16 dot products (AVX512-BF16 or AMX); without them oneDNN
            emulates bfloat16, and `--dtype bfloat16` may be slower than float32 (measured on an AVX2 CPU:
            docs/design.md §8). Reported, not acted on: the precision is the user's choice.
    """

    cpu: str
    probes: tuple[Probe, ...]
    native_bf16: bool = False

    def ok(self, name: str) -> bool:
        return next(p.ok for p in self.probes if p.name == name)

    @property
    def float32_rows(self) -> str:
        """Kernel for float32 matmuls over several rows: the row-streaming kernel (`rowkernel`, 1-9 rows,
        one row too) where it builds, else oneDNN's packed GEMM (2+ rows; one row takes MKL's GEMV),
        else F.linear. Tried, not timed: it wins where the weights stream from memory, which a timing
        on the probe's cache-sized shapes would not see (its first form, timed on one SmolLM2 layer
        that fits a cache, was slower than oneDNN, over the whole model's weights faster:
        docs/results-log.md). A model small enough to stay in a cache takes it too: its layers are one
        call each (`prepare.kernel_stacks`), and a small model's step is per-call overhead, where oneDNN's
        per-matmul calls lost to it (yue-code-mini: docs/results-log.md, "Session 7")."""
        if self.ok("rows-f32"):
            return "row-stream"
        return "onednn-packed" if self.ok("onednn-f32") else "F.linear"

    @property
    def pad_float32_rows(self) -> bool:
        """Whether float32 packed matmuls over 2-3 rows are padded with zeros to 4
        (`matmuls.packed_matmul`). Speed only (a float32 one-row step runs MKL, so no bits are kept
        equal by it), and it depends on the vector width: with AVX512 oneDNN's 4-row kernel beats its
        2- and 3-row ones, with AVX2 it does not (padding then costs; both measured on SmolLM2:
        docs/results-log.md). bfloat16 and int4 pad on every CPU: there padding keeps rows exact."""
        return self.cpu.startswith("AVX512")

    @property
    def float32_one_copy(self) -> str:
        """Kernel for a float32 matmul whose weight is held once, not twice (`matmuls.row_adaptive`:
        `yue.load(low_memory=True)`, or a large model, `prepare.streamed_weights`): oneDNN's packed
        copy where its one row (padded to 4) costs at most `ONE_COPY_TOLERANCE` x MKL's GEMV, timed
        here on one thread (`one_row_packed_ratio`), since its verifying rows are far cheaper; else the input-major
        weight through F.linear (MKL's GEMV), whose one row every `ar` step pays. Timed, because the
        ratio differs by CPU in a way the vector width, used before, got wrong (measured on three
        CPUs: docs/results-log.md)."""
        if not self.ok("onednn-f32"):
            return "F.linear"
        return "onednn-packed" if one_row_packed_ratio() <= ONE_COPY_TOLERANCE else "F.linear"

    @property
    def bfloat16_rows(self) -> str:
        """Kernel for bfloat16 matmuls, every row count (`matmuls.PackedLinear`)."""
        return "onednn-packed" if self.ok("onednn-bf16") else "F.linear"

    @property
    def int4_rows(self) -> str:
        """Kernel for the int4 precision's AR layers (`matmuls.int4_matmul`): yue's row kernel on int8
        activations, else torch's int4pack on bfloat16 ones; "" where neither runs."""
        if self.ok("rows-int4"):
            return "row kernel (int8 activations)"
        return "int4pack (bfloat16 activations)" if self.ok("int4") else ""

    @property
    def int8_engine(self) -> str | None:
        """The quantized engine int8 drafting packs its weights for; None: drafting stays float."""
        return next((e for e in INT8_ENGINES if self.ok(f"int8-{e}")), None)

    def losses(self) -> list[str]:
        """What this process runs slower than yue's best kernels, and why: one line per fallback that is
        taken (a kernel off with no alternative kernel doing its job; `int8-fbgemm` off under a working
        `int8-x86` loses nothing). Empty where nothing falls back. `prepare.prepare_for_decoding`
        warns with these, once per process, since the CLI shows warnings but not INFO logs."""
        why = {p.name: p.why for p in self.probes if not p.ok}
        lost = []
        if "rows-f32" in why:
            lost.append(
                f"float32 steps run on {'oneDNN' if self.ok('onednn-f32') else 'plain F.linear'}, not "
                f"yue's row kernel (rows-f32: {why['rows-f32']})"
            )
        elif "rows-q4" in why or "rows-q8" in why:
            off = [n for n in ("rows-q4", "rows-q8") if n in why]
            lost.append(
                "a GGUF's 4/8-bit weights are held as float32, more memory read a step "
                f"({'; '.join(f'{n}: {why[n]}' for n in off)})"
            )
        if self.int8_engine is None:
            engines = "; ".join(f"{e}: {why[f'int8-{e}']}" for e in INT8_ENGINES)
            lost.append(f"drafting stays float, not int8 ({engines})")
        return lost

    def describe(self, timed: bool = True) -> str:
        """One line for logs and bench headers: the choices, then each kernel left out and why. Without
        `timed`, the one timed verdict (`float32_one_copy`) is left out: the step costs' cache key reads
        this line, and a timing under load must not give the same model a second key (a model that holds a
        weight once shows the verdict in its own matmuls' kinds: `decode_set.decode_layout`)."""
        line = (
            f"cpu {self.cpu} (bfloat16 {'native' if self.native_bf16 else 'emulated'}); "
            f"float32 rows>1: {self.float32_rows} (oneDNN {'2-3 padded to 4' if self.pad_float32_rows else 'unpadded'}), "
            f"{'Q4_1 weights: 4-bit codes, ' if self.ok('rows-q4') else ''}"
            f"{'Q8_0 weights: 8-bit codes, ' if self.ok('rows-q8') else ''}"
            f"{f'one copy: {self.float32_one_copy}; ' if timed else ''}"
            f"bfloat16 rows: {self.bfloat16_rows}; "
            f"int8 drafting: {self.int8_engine or 'off (drafting stays float)'}"
            f"{', NAR layers on the row kernel' if self.int8_engine and self.ok('rows-f32') else ''}; "
            f"int4 layers: {self.int4_rows or 'off (no int4 precision)'}"
        )
        off = [f"{p.name} ({p.why})" for p in self.probes if not p.ok]
        return line + (f"; not used: {', '.join(off)}" if off else "")


def pack_weight(w: torch.Tensor) -> torch.Tensor:
    """oneDNN's pre-packed copy of an (out, in) weight, for `packed_linear`."""
    return torch.ops.mkldnn._reorder_linear_weight(w, PACK_ROWS)


def packed_linear(x: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """x @ W.t() through oneDNN on `pack_weight(W)`: (..., in) -> (..., out)."""
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


@contextmanager
def _quantized_engine(name: str) -> Iterator[None]:
    """torch's quantized engine set to `name` while weights are packed (the packed weight keeps its
    engine's kernel afterwards), then restored: the process-wide setting is not ours to keep."""
    old = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = old


def quantize_int8(linear: nn.Linear, engine: str) -> nn.Module:
    """torch's dynamic int8 Linear (per-output-channel weight scales) for a float copy of `linear`,
    packed for `engine`; `linear` itself is left as it is."""
    with warnings.catch_warnings(), _quantized_engine(engine):
        # torch marks its quantized tensors deprecated (moving to torchao), but this CPU kernel is the
        # fast one for small row counts today; the warning is not actionable for our users.
        warnings.filterwarnings("ignore", message=r"(?s).*deprecated", category=UserWarning)
        warnings.filterwarnings("ignore", message=r"(?s).*deprecated", category=DeprecationWarning)
        return torch.ao.quantization.quantize_dynamic(
            nn.Sequential(copy.deepcopy(linear).float()),
            {nn.Linear: torch.ao.quantization.per_channel_dynamic_qconfig},
            dtype=torch.qint8,
        )[0]


def int8_linear(x: torch.Tensor, packed: object) -> torch.Tensor:
    """The dynamic int8 kernel on a float32 input (reduce_range as torch's module version 4)."""
    return torch.ops.quantized.linear_dynamic(x, packed, reduce_range=True)


def _tried(fn, ref: torch.Tensor, atol: float) -> str:
    """Run `fn()`; "" if it returns values within `atol` (relative to ref's scale) of `ref`, else why not."""
    try:
        out = fn()
    except RuntimeError as e:
        return f"RuntimeError: {str(e).strip().splitlines()[0][:160]}"
    if out.shape != ref.shape or not torch.allclose(out.float(), ref, atol=atol * ref.abs().max().item()):
        return "tried: wrong values"
    return ""


# One SmolLM2 layer's float32 matmuls, (out, in): Q/K/V fused, O, gate/up fused, down (14 MB).
TIMED_SHAPES = ((960, 576), (576, 576), (3072, 576), (576, 1536))


@functools.cache
def one_row_packed_ratio(rounds: int = 7) -> float:
    """Time of one row through oneDNN's packed kernel (padded to 4 rows, as `matmuls.packed_matmul`
    calls it) over MKL's GEMV on the input-major weight, on `TIMED_SHAPES`: the median over `rounds`
    rounds of each kernel's pass timed back to back, on one thread. One thread, because with more an
    OpenMP call waits for every core, and one busy core skewed the ratio (with two threads and the other
    core busy it swung widely, on one thread it held; measured: docs/results-log.md); the median,
    because one slow pass then moves one round, not the verdict. Cached per process (a short timing,
    28 MB while it runs); call only where oneDNN float32 packing works."""
    g = torch.Generator().manual_seed(0)
    weights = [torch.randn(out, inp, generator=g) for out, inp in TIMED_SHAPES]
    input_major = [w.t().contiguous().t() for w in weights]
    packed = [pack_weight(w) for w in weights]
    rows = [torch.randn(1, w.shape[1], generator=g) for w in weights]
    padded = [torch.cat([x, x.new_zeros(3, x.shape[1])]) for x in rows]

    def seconds(run) -> float:
        start = time.perf_counter()
        run()
        return time.perf_counter() - start

    def gemv() -> None:
        for x, w in zip(rows, input_major, strict=True):
            F.linear(x, w)

    def packed_one_row() -> None:
        for x, p in zip(padded, packed, strict=True):
            packed_linear(x, p)

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gemv()  # first calls: kernel dispatch and caches
        packed_one_row()
        ratios = sorted(seconds(packed_one_row) / seconds(gemv) for _ in range(rounds))
    finally:
        torch.set_num_threads(threads)
    return ratios[len(ratios) // 2]


def _probe_rows() -> str:
    """Why yue's row kernels cannot run here ("" = they can): built (or found in the cache) and each
    tried against torch: the matmul against F.linear (a partial column block, rows beyond one pass), the
    head's screen against the matmul (its argmax and bits; a partial group of inputs),
    the norm against F.rms_norm, the attention against SDPA (GQA, a batch mask with holes, a key count
    that is not a whole number of vectors)."""
    try:
        rowkernel.library()
    except rowkernel.KernelUnavailable as e:
        return str(e)
    g = torch.Generator().manual_seed(0)
    w = torch.randn(40, 24, generator=g)
    x = torch.randn(11, 24, generator=g)
    why = _tried(lambda: rowkernel.matmul(x, rowkernel.block(w), 40), F.linear(x, w), 1e-4)
    full = rowkernel.matmul(x, rowkernel.block(w), 40)

    def screened() -> torch.Tensor:  # the head's greedy choice (`screen.py`): 0 where argmax and bits hold
        y = ScreenedHead(nn.Identity(), w.t().contiguous().t()).top1(x)
        kept = y.isfinite()
        same = torch.equal(y.argmax(-1), full.argmax(-1)) and torch.equal(y[kept], full[kept])
        return torch.zeros(1) if same else torch.ones(1)

    why = why or _tried(screened, torch.zeros(1), 0.0)
    why = why or _tried(lambda: rowkernel.rms_norm(x, w[0], 1e-5), F.rms_norm(x, (24,), w[0], 1e-5), 1e-5)
    if why or not rowkernel.attention_fits(32):
        return why or "the attention kernel takes no 32-wide heads"
    start, T = 21, 3  # 24 keys: one vector and a partial one of either width
    q = torch.randn(2, 4, T, 32, generator=g)
    k, v = (torch.randn(2, 2, 64, 32, generator=g) for _ in range(2))
    visible = torch.ones(2, T, start + T, dtype=torch.bool).tril(start)
    visible[1, :, :5] = False
    ref = F.scaled_dot_product_attention(q, k[:, :, :24], v[:, :, :24], visible[:, None], enable_gqa=True)
    return _tried(lambda: rowkernel.attention(q, k, v, visible.to(torch.uint8), start), ref, 1e-5)


def _q4_1_weight(outputs: int, g: torch.Generator) -> torch.Tensor:
    """A float32 (outputs, 64) weight of a GGUF's Q4_1 form: per group of 32 inputs, codes 0..15 with the
    group's extremes 0 and 15, times a float16 scale d, plus a float16 minimum m."""
    d = torch.rand(outputs, 2, 1, generator=g).half().float()
    codes = torch.randint(0, 16, (outputs, 2, 32), generator=g).float()
    codes[..., 0], codes[..., 1] = 0, 15  # as Q4_1's: the minimum is code 0, the maximum code 15
    m = -8 * d + torch.randn(outputs, 2, 1, generator=g).half().float() / 100
    return torch.addcmul(m, codes, d).view(outputs, 64)


def _probe_codes(name: str) -> str:
    """Why the row kernel's 4-bit (`rows-q4`) or 8-bit (`rows-q8`) weights cannot stand in for float32
    ones here ("" = they can): a weight of the GGUF's form (Q4_1: codes 0..15 with each group's extremes
    0 and 15, a float16 scale and minimum per group of 32; Q8_0: codes -127..127 reaching +-127, a
    float16 scale) taken by `q4_block` / `q8_block` and multiplied with the float kernel's bits over 1-9
    rows and 13 (two passes), a partial column block included; a weight that is not such refused."""
    g = torch.Generator().manual_seed(0)
    if name == "rows-q4":
        w, pack = _q4_1_weight(40, g), rowkernel.q4_block
    else:
        d = torch.rand(40, 2, 1, generator=g).half().float()
        codes = torch.randint(-127, 128, (40, 2, 32), generator=g).float()
        codes[..., 0] = 127  # as Q8_0's: the largest |code| is 127
        w, pack = (codes * d).view(40, 64), rowkernel.q8_block
    packed = pack(w)
    if packed is None or pack(w + 1e-3) is not None:
        return "tried: the GGUF's weights not recognised"
    full = rowkernel.block(w)
    for rows in (*range(1, rowkernel.MAX_ROWS + 1), 13):
        x = torch.randn(rows, 64, generator=g)
        if not torch.equal(rowkernel.matmul(x, packed, 40), rowkernel.matmul(x, full, 40)):
            return f"tried: {rows} rows not the float kernel's bits"
    return ""


def _probe_int4_rows() -> str:
    """Why the row kernel's int4 matmul cannot serve the int4 precision here ("" = it can): a weight of
    the GGUF's Q4_1 form (a partial column block) over 1-9 rows and 13 (two passes), each row the bits
    of the row alone, all within the activations' int8 rounding of the float product."""
    g = torch.Generator().manual_seed(0)
    w = _q4_1_weight(12, g)
    packed = rowkernel.q4dot_block(w)
    x = torch.randn(13, 64, generator=g)
    alone = torch.cat([rowkernel.matmul(x[r : r + 1], packed, 12) for r in range(13)])
    for rows in (*range(1, rowkernel.MAX_ROWS + 1), 13):
        if not torch.equal(rowkernel.matmul(x[:rows], packed, 12), alone[:rows]):
            return f"tried: {rows} rows not each row's bits alone"
    return _tried(lambda: alone, x @ w.t(), 0.05)


def _probe_packed(dtype: torch.dtype) -> str:
    """Why oneDNN's pre-packed matmul cannot serve `dtype` here ("" = it can)."""
    if not torch.backends.mkldnn.is_available():
        return "torch built without oneDNN"
    if not torch.backends.mkldnn.enabled:
        return "torch.backends.mkldnn.enabled is False"
    if not all(hasattr(torch.ops.mkldnn, op) for op in ("_reorder_linear_weight", "_linear_pointwise")):
        return "this torch has no mkldnn._reorder_linear_weight/_linear_pointwise"
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    if dtype == torch.bfloat16 and check is not None and not check():
        return "oneDNN reports no bf16 support (needs avx512bw/vl/dq or avx_ne_convert)"
    g = torch.Generator().manual_seed(0)
    w = torch.randn(24, 16, generator=g, dtype=torch.float32).to(dtype)
    x = torch.randn(1, 3, 16, generator=g, dtype=torch.float32).to(dtype)
    return _tried(lambda: packed_linear(x, pack_weight(w)), F.linear(x.float(), w.float()), 0.05)


def _probe_int8(engine: str) -> str:
    """Why dynamic int8 drafting cannot use `engine` here ("" = it can)."""
    if not hasattr(torch.ao.quantization, "quantize_dynamic"):
        return "this torch has no eager dynamic quantization"
    if engine not in torch.backends.quantized.supported_engines:
        return "not in torch.backends.quantized.supported_engines"
    g = torch.Generator().manual_seed(0)
    linear = nn.Linear(16, 24, bias=False, dtype=torch.float32)
    with torch.no_grad():
        linear.weight.copy_(torch.randn(24, 16, generator=g, dtype=torch.float32))
    x = torch.randn(1, 3, 16, generator=g, dtype=torch.float32)

    def run() -> torch.Tensor:
        return int8_linear(x, quantize_int8(linear, engine)._packed_params._packed_params)

    return _tried(run, F.linear(x, linear.weight.detach()), 0.1)


INT4_GROUP = 32  # weights per scale and zero point: the GGUF's Q4_0 / Q4_1 block


def pack_int4(codes: torch.Tensor) -> torch.Tensor:
    """torch's CPU int4 packing of (out, in) codes 0..15 (int32), for `int4_linear`."""
    return torch.ops.aten._convert_weight_to_int4pack_for_cpu(codes, 2)


def int4_linear(x: torch.Tensor, packed: torch.Tensor, scales_zeros: torch.Tensor) -> torch.Tensor:
    """(rows, in) bfloat16 @ the int4 weight -> (rows, out) bfloat16: weight (code - 8) * scale + zero per
    group of `INT4_GROUP` inputs (`scales_zeros`: (in / group, out, 2) bfloat16)."""
    return torch.ops.aten._weight_int4pack_mm_for_cpu(x, packed, INT4_GROUP, scales_zeros)


def _probe_int4() -> str:
    """Why the int4 precision's kernel cannot run here ("" = it can)."""
    ops = ("_convert_weight_to_int4pack_for_cpu", "_weight_int4pack_mm_for_cpu")
    if not all(hasattr(torch.ops.aten, op) for op in ops):
        return "this torch has no CPU int4pack kernels"
    g = torch.Generator().manual_seed(0)
    codes = torch.randint(0, 16, (16, 64), generator=g, dtype=torch.int32)
    scales_zeros = torch.rand(64 // INT4_GROUP, 16, 2, generator=g).to(torch.bfloat16)
    x = torch.randn(3, 64, generator=g).to(torch.bfloat16)
    s, z = (scales_zeros[..., i].float().repeat_interleave(INT4_GROUP, 0).t() for i in (0, 1))  # (out, in)
    w = (codes - 8) * s + z
    return _tried(lambda: int4_linear(x, pack_int4(codes), scales_zeros), x.float() @ w.t(), 0.05)


@functools.cache
def _probe(off: frozenset[str]) -> KernelChoice:
    """Probe every kernel not in `off` (cached: one probe per process and forcing)."""
    whys = {}
    for name in KERNELS:
        if name in off:
            whys[name] = "forced off"
        elif name.startswith("int8-"):
            whys[name] = _probe_int8(name.removeprefix("int8-"))
        elif name == "int4":
            whys[name] = _probe_int4()
        elif name == "rows-f32":
            whys[name] = _probe_rows()
        elif name in ("rows-q4", "rows-q8"):
            whys[name] = "needs rows-f32" if whys["rows-f32"] else _probe_codes(name)
        elif name == "rows-int4":
            whys[name] = "needs rows-f32" if whys["rows-f32"] else _probe_int4_rows()
        else:
            whys[name] = _probe_packed(next(d for d, k in PACKED_KERNEL.items() if k == name))
    probes = tuple(Probe(n, not w, w) for n, w in whys.items())
    return KernelChoice(torch.backends.cpu.get_cpu_capability(), probes, _native_bf16())


def _native_bf16() -> bool:
    """Whether the CPU has bfloat16 dot products (torch's own checks; False where torch lacks them)."""
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(getattr(torch.cpu, c, lambda: False)() for c in checks)


def parse_off(spec: str | Iterable[str]) -> frozenset[str]:
    """Kernels to turn off, from `YUE_KERNELS`'s syntax: "auto" / "" (none), "portable" (all), or a
    comma list of "no-<kernel>" with <kernel> in `KERNELS` or "int8" (every int8 engine). An iterable
    of kernel names (no "no-" prefix, "int8" and "portable" allowed) is taken as it is.

    Raises:
        ValueError: an unknown entry, naming YUE_KERNELS and the accepted names.
    """
    if isinstance(spec, str):
        items = [s.strip() for s in spec.split(",") if s.strip() and s.strip() != "auto"]
        if items == ["portable"]:
            return frozenset(KERNELS)
        if any(not s.startswith("no-") for s in items):
            raise ValueError(f"{ENV} must be auto, portable or no-<kernel>[,no-<kernel>...]; got {spec!r}")
        names = [s.removeprefix("no-") for s in items]
    else:
        names = list(spec)
    off = set()
    for n in names:
        expand = {"portable": KERNELS, "int8": tuple(k for k in KERNELS if k.startswith("int8-"))}
        if n not in KERNELS and n not in expand:
            raise ValueError(f"{ENV}: unknown kernel {n!r}; known: {', '.join(KERNELS)}, int8, portable")
        off.update(expand.get(n, (n,)))
    return frozenset(off)


_forced: frozenset[str] | None = None  # set by `forced`; wins over the environment


def choice() -> KernelChoice:
    """The kernels this process uses now: probed on first use, cached per forcing."""
    off = _forced if _forced is not None else parse_off(os.environ.get(ENV, "auto"))
    return _probe(off)


@contextmanager
def forced(*off: str) -> Iterator[KernelChoice]:
    """Within the block, `choice()` reports the kernels `off` (names from `KERNELS`, "int8",
    "portable") as unavailable, whatever YUE_KERNELS says; models prepared in it keep those fallbacks.

    Example: `with probe.forced("onednn-bf16"): engine = yue.load(path, dtype=torch.bfloat16)`.
    """
    global _forced
    old, _forced = _forced, parse_off(off)
    try:
        yield choice()
    finally:
        _forced = old


def reset() -> None:
    """Forget every cached probe (after patching a kernel in a test)."""
    _probe.cache_clear()
    one_row_packed_ratio.cache_clear()
    rowkernel.library.cache_clear()


def packed_rows(dtype: torch.dtype) -> bool:
    """Whether float matmuls of `dtype` over two or more rows run on oneDNN-packed weights."""
    name = PACKED_KERNEL.get(dtype)
    return name is not None and choice().ok(name)


def int8_engine() -> str | None:
    """The int8 engine drafting uses (None: no working engine, drafting stays float)."""
    return choice().int8_engine


def describe(timed: bool = True) -> str:
    """`choice().describe()`: one line for logs and bench headers (`timed`: see `KernelChoice.describe`)."""
    return choice().describe(timed)
