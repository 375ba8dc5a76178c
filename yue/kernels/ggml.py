"""Matmuls that read a GGUF's (ggml's) tensors in place: a quantized matrix keeps the file's own bytes and
the kernels (`ggml/*.c`, built into `rowkernel`'s library) read its blocks directly.

Design decisions:
- One C source per block format under `ggml/`, sharing `ggml/common.h` (activation quantization,
  the integer dots, the loops). `FORMATS` says what each format is; model code asks it, never a
  format by name.
- Numerics as llama.cpp's: integer dot products on int8 activations (K-quants against a scale per
  256 with code sums per 16, the 32-blocks against a scale per 32, Q4_1 with the code sum); F32 / F16 /
  BF16 on float FMAs. The weights' codes and scales are the file's.
- Row-exact: a row's outputs are the same bits whatever the call's row count or threads (passes of up
  to `rowkernel.MAX_ROWS` rows decode each weight block once for all of them), and for the quantized
  formats the same bits in every build (AVX512, AVX2, plain C). Which build runs is `rowkernel`'s
  choice (its flag sets, this CPU's features), as for every other row kernel.
- `get_rows` dequantizes as `gguf.quants.dequantize` does (the same float32 operations, unfused),
  so an embedding lookup is the dequantized table's row exactly.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Literal

import torch

from yue.kernels import rowkernel


@dataclass(frozen=True)
class Format:
    """A ggml block format as the kernels read it."""

    name: str  # gguf.GGMLQuantizationType's name
    block_elems: int  # weights per block (1 for the float types)
    block_bytes: int  # bytes per block
    source: str  # its C file under yue/kernels/ggml/
    # How the activations are taken: int8 per 256 with sums per 16 (Q8_K, for the min terms), int8 per
    # 32 with the block's code sum (Q8_1, for Q4_1's min), int8 per 32 (Q8_0), or float32.
    activations: Literal["q8_k", "q8_1", "q8_0", "float32"]

    def row_bytes(self, in_features: int) -> int:
        """Bytes of one matrix row of `in_features` weights (a multiple of `block_elems`)."""
        if in_features % self.block_elems:
            raise ValueError(
                f"in_features {in_features} is not a multiple of {self.name}'s {self.block_elems}"
            )
        return in_features // self.block_elems * self.block_bytes


# By ggml type id (gguf.GGMLQuantizationType).
FORMATS: dict[int, Format] = {
    0: Format("F32", 1, 4, "float.c", "float32"),
    1: Format("F16", 1, 2, "float.c", "float32"),
    30: Format("BF16", 1, 2, "float.c", "float32"),
    2: Format("Q4_0", 32, 18, "q4_0.c", "q8_0"),
    3: Format("Q4_1", 32, 20, "q4_1.c", "q8_1"),
    6: Format("Q5_0", 32, 22, "q5_0.c", "q8_0"),
    8: Format("Q8_0", 32, 34, "q8_0.c", "q8_0"),
    12: Format("Q4_K", 256, 144, "q4_k.c", "q8_k"),
    13: Format("Q5_K", 256, 176, "q5_k.c", "q8_k"),
    14: Format("Q6_K", 256, 210, "q6_k.c", "q8_k"),
}


def supported(ggml_type: int) -> bool:
    """Whether `matmul` and `get_rows` take this ggml type here (False where the kernel cannot be built)."""
    try:
        return ggml_type in FORMATS and bool(rowkernel.library().ggml_supported(ggml_type))
    except rowkernel.KernelUnavailable:
        return False


@functools.cache
def layer_kind(ggml_type: int) -> int:
    """`rows_layer`'s weight kind for a GGUF matrix of this type (beside `rowkernel.LAYER_KINDS`)."""
    return rowkernel.library().rows_layer_ggml_base() + ggml_type


def _format(w: torch.Tensor, ggml_type: int, in_features: int, rows: int | None) -> Format:
    """The type's format, after checking that w holds `rows` matrix rows of it (any number where None)."""
    if ggml_type not in FORMATS:
        raise ValueError(f"ggml_type {ggml_type} has no kernel (supported: {sorted(FORMATS)})")
    fmt = FORMATS[ggml_type]
    row = fmt.row_bytes(in_features)
    if w.dtype != torch.uint8 or w.device.type != "cpu" or not w.is_contiguous():
        raise ValueError(f"w must be contiguous uint8 on the CPU, not {w.dtype} on {w.device}")
    if w.numel() % row or (rows is not None and w.numel() != rows * row):
        raise ValueError(f"w has {w.numel()} bytes, not {rows or 'whole'} rows of {row} ({fmt.name})")
    return fmt


def matmul(x: torch.Tensor, w: torch.Tensor, ggml_type: int, out: int) -> torch.Tensor:
    """x @ W.T for float32 x (..., in) on the CPU, W (out, in) as the GGUF stores it.

    Args:
        x: (..., in) float32.
        w: uint8, the matrix's raw bytes: `out` rows of in / block_elems blocks.
        ggml_type: its gguf.GGMLQuantizationType.
        out: the matrix's rows (the outputs).

    Returns:
        (..., out) float32.
    """
    inp = x.shape[-1]
    _format(w, ggml_type, inp, out)
    if x.dtype != torch.float32 or x.device.type != "cpu":
        raise ValueError(f"x must be float32 on the CPU, not {x.dtype} on {x.device}")
    flat = x.reshape(-1, inp).contiguous()
    y = torch.empty(flat.shape[0], out, dtype=torch.float32)
    args = (flat.data_ptr(), flat.shape[0], inp, w.data_ptr(), y.data_ptr(), out, torch.get_num_threads())
    rowkernel.library().ggml_matmul(ggml_type, *args)
    return y.view(*x.shape[:-1], out)


def get_rows(w: torch.Tensor, ggml_type: int, in_features: int, ids: torch.Tensor) -> torch.Tensor:
    """Rows `ids` of W dequantized to float32 (an embedding lookup): gguf.quants.dequantize's values.

    Args:
        w: uint8, the matrix's raw bytes (rows of `in_features` weights).
        ggml_type: its gguf.GGMLQuantizationType.
        in_features: the width of a row.
        ids: (n,) int64 row indices.

    Returns:
        (n, in_features) float32.
    """
    fmt = _format(w, ggml_type, in_features, None)
    n_rows = w.numel() // fmt.row_bytes(in_features)
    ids = ids.reshape(-1).to(torch.int64).contiguous()
    if ids.numel() and not (0 <= int(ids.min()) and int(ids.max()) < n_rows):
        raise ValueError(f"ids must be in [0, {n_rows})")
    out = torch.empty(ids.numel(), in_features, dtype=torch.float32)
    rowkernel.library().ggml_get_rows(
        ggml_type, w.data_ptr(), in_features, ids.data_ptr(), ids.numel(), out.data_ptr()
    )
    return out
