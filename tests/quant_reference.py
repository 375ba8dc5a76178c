"""GGUF block formats, written out for the tests from ggml's block layouts (`ggml-common.h`, its
reference `dequantize_row_*`), independently of the `gguf` package that yue's converter uses: a reference
dequantizer per type, and random valid blocks for the K-quants, which `gguf.quants` cannot quantize.

Every product below is exact in float32 (a float16 scale times a 6- or 8-bit sub-scale times a code of
at most 6 bits), so each value has one rounding at most (the minimum's subtraction): the reference is
unambiguous, and llama.cpp's C, numpy and a fused multiply-add all give its bits.
"""

from __future__ import annotations

import gguf
import numpy as np

QK_K = 256  # weights a K-quant super-block holds
T = gguf.GGMLQuantizationType
# bytes a block, weights a block
BLOCKS = {
    T.Q8_0: (34, 32),
    T.Q4_0: (18, 32),
    T.Q4_1: (20, 32),
    T.Q5_0: (22, 32),
    T.Q4_K: (144, QK_K),
    T.Q5_K: (176, QK_K),
    T.Q6_K: (210, QK_K),
}


def _f16(b: np.ndarray) -> np.ndarray:
    """(n, 2) bytes -> (n, 1) float32 of the little-endian float16 they hold."""
    return np.ascontiguousarray(b).view(np.float16).astype(np.float32)


def _nibbles(qs: np.ndarray) -> np.ndarray:
    """(n, 16) bytes -> (n, 32) codes: byte j's low nibble is weight j, its high one weight j + 16."""
    return np.concatenate([qs & 15, qs >> 4], axis=1).astype(np.float32)


def _k_scales(scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(n, 12) packed bytes -> the 8 sub-blocks' 6-bit scales and minimums (n, 8) (`get_scale_min_k4`)."""
    q = scales.astype(np.int32)
    sc, mn = np.empty((len(q), 8), np.int32), np.empty((len(q), 8), np.int32)
    for j in range(8):
        if j < 4:
            sc[:, j], mn[:, j] = q[:, j] & 63, q[:, j + 4] & 63
        else:
            sc[:, j] = (q[:, j + 4] & 15) | ((q[:, j - 4] >> 6) << 4)
            mn[:, j] = (q[:, j + 4] >> 4) | ((q[:, j] >> 6) << 4)
    return sc.astype(np.float32), mn.astype(np.float32)


def dequantize(data: np.ndarray, qtype: gguf.GGMLQuantizationType, shape: tuple[int, ...]) -> np.ndarray:
    """A GGUF tensor's bytes (or floats, for F32/F16/BF16) -> float32 values of `shape`."""
    if qtype == T.F32:
        return np.asarray(data, np.float32).reshape(shape)
    if qtype == T.F16:
        return np.asarray(data).view(np.float16).astype(np.float32).reshape(shape)
    if qtype == T.BF16:  # the top 16 bits of a float32
        return (np.asarray(data).view(np.uint16).astype(np.uint32) << 16).view(np.float32).reshape(shape)
    size, n = BLOCKS[qtype]
    b = np.asarray(data, np.uint8).reshape(-1, size)
    if qtype == T.Q8_0:
        out = _f16(b[:, :2]) * b[:, 2:].view(np.int8).astype(np.float32)
    elif qtype == T.Q4_0:
        out = (_nibbles(b[:, 2:]) - 8) * _f16(b[:, :2])
    elif qtype == T.Q4_1:
        out = _nibbles(b[:, 4:]) * _f16(b[:, :2]) + _f16(b[:, 2:4])
    elif qtype == T.Q5_0:  # d, 32 fifth bits (bit j: weight j), 16 bytes of nibbles; (code - 16) * d
        fifth = (b[:, 2:6].copy().view(np.uint32) >> np.arange(32, dtype=np.uint32)) & 1  # (n, 32)
        out = (_nibbles(b[:, 6:]) + 16 * fifth.astype(np.float32) - 16) * _f16(b[:, :2])
    elif qtype in (T.Q4_K, T.Q5_K):
        d, dmin = _f16(b[:, :2]), _f16(b[:, 2:4])
        sc, mn = _k_scales(b[:, 4:16])
        scale, minimum = d * sc, dmin * mn  # (n, 8): sub-block s covers weights 32 s .. 32 s + 31
        qh = b[:, 16:48] if qtype == T.Q5_K else None
        qs = b[:, 48:] if qtype == T.Q5_K else b[:, 16:]
        codes = np.empty((len(b), 8, 32), np.float32)
        for chunk in range(4):  # 64 weights: 32 bytes' low nibbles, then their high ones
            q = qs[:, 32 * chunk : 32 * chunk + 32]
            low, high = (q & 15).astype(np.float32), (q >> 4).astype(np.float32)
            if (
                qh is not None
            ):  # the fifth bit: bit 2 chunk of qh for the low half, bit 2 chunk + 1 for the high
                low += ((qh >> (2 * chunk)) & 1) * 16
                high += ((qh >> (2 * chunk + 1)) & 1) * 16
            codes[:, 2 * chunk], codes[:, 2 * chunk + 1] = low, high
        out = (scale[..., None] * codes - minimum[..., None]).reshape(len(b), QK_K)
    elif qtype == T.Q6_K:
        ql, qh, sc, d = b[:, :128], b[:, 128:192], b[:, 192:208].view(np.int8), _f16(b[:, 208:210])
        out = np.empty((len(b), QK_K), np.float32)
        for half in range(2):  # 128 weights: 64 bytes of low nibbles and 32 of 2-bit high parts
            lo, hi, s = (
                ql[:, 64 * half : 64 * half + 64],
                qh[:, 32 * half : 32 * half + 32],
                sc[:, 8 * half :],
            )
            parts = [
                (lo[:, :32] & 15) | ((hi & 3) << 4),
                (lo[:, 32:] & 15) | (((hi >> 2) & 3) << 4),
                (lo[:, :32] >> 4) | (((hi >> 4) & 3) << 4),
                (lo[:, 32:] >> 4) | (((hi >> 6) & 3) << 4),
            ]
            for p, q in enumerate(parts):  # weights 32 p .. 32 p + 31, sub-scales 2 p and 2 p + 1 (16 each)
                q = q.astype(np.float32) - 32
                scale = d * s[:, 2 * p : 2 * p + 2].astype(np.float32)  # (n, 2)
                out[:, 128 * half + 32 * p : 128 * half + 32 * p + 32] = np.repeat(scale, 16, axis=1) * q
    else:
        raise ValueError(f"no reference for {qtype.name}")
    return out.astype(np.float32).reshape(shape)


def random_blocks(
    shape: tuple[int, int], qtype: gguf.GGMLQuantizationType, rng: np.random.Generator
) -> np.ndarray:
    """Random valid blocks of a K-quant for an (out, in) tensor, in a multiple of 256: uniform bytes, the
    float16 scale (and minimum's scale) between 1e-4 and 4e-4 so that the weights are of a trained
    model's size. (rows, in / 256 * bytes a block) uint8, as a GGUF stores them."""
    size, n = BLOCKS[qtype]
    rows, cols = shape
    assert cols % n == 0, (cols, n)
    b = rng.integers(0, 256, (rows * cols // n, size), dtype=np.uint8)
    scales = rng.uniform(1e-4, 4e-4, (len(b), 2)).astype(np.float16).view(np.uint8)  # (blocks, 4)
    if qtype == T.Q6_K:
        b[:, 208:210] = scales[:, :2]
    else:
        b[:, :4] = scales
    return b.reshape(rows, -1)
