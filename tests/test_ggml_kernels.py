"""The GGUF-block matmuls (`yue.kernels.ggml`): each type's product against the float64 product of
`gguf.quants.dequantize`'s weights (within the int8 activations' rounding) and against a model of its
integer arithmetic (tightly), `get_rows` equal to the dequantizer, each row's bits whatever the row
count or threads, and the same on every forced build (AVX512 without VNNI, AVX2, AVX2 with AVX-VNNI,
plain C): the quantized types' bits equal in every build.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import gguf
import numpy as np
import pytest
import torch

from yue.kernels import ggml, probe, rowkernel

T = gguf.GGMLQuantizationType
FLOATS = {T.F32, T.F16, T.BF16}
K_QUANTS = {T.Q4_K, T.Q5_K, T.Q6_K}
# Forced builds beside the native one (None): the flags, and the CPU feature each needs.
BUILDS = {
    "native": (None, None),
    "avx512-no-vnni": (["-march=native", "-mno-avx512vnni", "-mno-avxvnni"], "avx512bw"),
    "avx2": (["-mavx2", "-mfma", "-mf16c"], "avx2"),
    "avx2-vnni": (["-mavx2", "-mfma", "-mf16c", "-mavxvnni"], "avx_vnni"),
    "plain": ([], None),
}
# (out, in): odd output counts; in = one super-block, and 11 (2816, as an MLP's width); a 32-block type
# also gets 96 (not a multiple of 256), a float type 37 (not a whole vector).
SHAPES = [(37, 256), (13, 2816)]


def shapes(t: T) -> list[tuple[int, int]]:
    return SHAPES + ([(9, 37)] if t in FLOATS else [] if t in K_QUANTS else [(11, 96)])


def cpu_has(flag: str) -> bool:
    info = Path("/proc/cpuinfo")
    return info.exists() and flag in info.read_text().split()


def random_matrix(t: T, out: int, inp: int, rng: np.random.Generator) -> np.ndarray:
    """(out, row bytes) uint8: a random matrix quantized by gguf where it quantizes the type, else random
    blocks (the K-quants) with finite float16 scales, d (and dmin) small and positive."""
    if t not in K_QUANTS:
        return gguf.quants.quantize(rng.standard_normal((out, inp)).astype(np.float32), t).view(np.uint8)
    fmt = ggml.FORMATS[t]
    n = out * inp // fmt.block_elems
    raw = rng.integers(0, 256, (n, fmt.block_bytes), dtype=np.uint8)
    scales = (rng.random((n, 2)) * 1e-2 + 1e-3).astype(np.float16).view(np.uint8)
    if t == T.Q6_K:
        raw[:, 208:210] = scales[:, :2]  # d, the block's last two bytes
    else:
        raw[:, 0:4] = scales  # d, dmin
    return raw.reshape(out, -1)


def activations(x: np.ndarray, group: int) -> tuple[np.ndarray, np.ndarray]:
    """The kernels' int8 activations: per group, codes round(x * (127 / amax)) (float32, ties to even) and
    the scale amax / 127, as (rows, in) codes and per-element scales."""
    g = x.reshape(x.shape[0], -1, group)
    amax = np.abs(g).max(-1, keepdims=True)
    inv = np.where(amax > 0, np.float32(127) / np.where(amax > 0, amax, 1), 0).astype(np.float32)
    codes = np.clip(np.rint(g * inv), -127, 127)
    scale = np.broadcast_to(amax / np.float32(127), g.shape)
    return codes.reshape(x.shape), scale.reshape(x.shape)


def call(
    lib: ctypes.CDLL, t: T, x: torch.Tensor, w: torch.Tensor, out: int, threads: int = 1
) -> torch.Tensor:
    """lib's ggml_matmul, as `ggml.matmul` calls it, on a chosen build and thread count."""
    y = torch.empty(x.shape[0], out)
    lib.ggml_matmul(int(t), x.data_ptr(), x.shape[0], x.shape[1], w.data_ptr(), y.data_ptr(), out, threads)
    return y


@pytest.fixture(scope="module")
def libraries(tmp_path_factory):
    """Each build's library (or why not), built once into a module cache; every probe forgotten after."""
    libs, native = {}, rowkernel.FLAG_SETS
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("YUE_CACHE_DIR", str(tmp_path_factory.mktemp("cache")))
        for name, (flags, needs) in BUILDS.items():
            if needs and not cpu_has(needs):
                libs[name] = f"this CPU has no {needs}"
                continue
            mp.setattr(rowkernel, "FLAG_SETS", native if flags is None else (flags,))
            probe.reset()
            try:
                libs[name] = rowkernel.library()
            except rowkernel.KernelUnavailable as e:
                libs[name] = f"does not build: {e}"
    probe.reset()
    return libs


def library(libraries, build: str) -> ctypes.CDLL:
    lib = libraries[build]
    if isinstance(lib, str):
        pytest.skip(f"{build}: {lib}")
    return lib


def test_the_registry_is_ggufs_block_sizes_and_every_format_is_supported():
    for t, fmt in ggml.FORMATS.items():
        assert fmt.name == T(t).name and (fmt.block_elems, fmt.block_bytes) == gguf.GGML_QUANT_SIZES[T(t)]
        assert (Path(ggml.__file__).parent / "ggml" / fmt.source).exists()
        assert ggml.supported(t)
    assert not ggml.supported(int(T.Q2_K)) and not ggml.supported(int(T.IQ4_XS))
    assert ggml.layer_kind(int(T.Q4_K)) == rowkernel.library().rows_layer_ggml_base() + 12


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("t", list(ggml.FORMATS), ids=lambda t: T(t).name)
def test_each_types_product_is_the_dequantized_weights_within_the_activations_rounding(libraries, build, t):
    """y against x @ W.T in float64: floats within float32 rounding; quantized types within the int8
    activations' rounding (each x at most half a step, amax / 254 of its group, off), and within float32
    rounding of the same integer arithmetic (x as its codes times their scale)."""
    lib = library(libraries, build)
    t = T(t)
    rng = np.random.default_rng(int(t))
    fmt = ggml.FORMATS[t]
    for out, inp in shapes(t):
        raw = random_matrix(t, out, inp, rng)
        w = gguf.quants.dequantize(raw, t).reshape(out, inp).astype(np.float64)
        x = rng.standard_normal((12, inp)).astype(np.float32)
        y = call(lib, t, torch.from_numpy(x), torch.from_numpy(raw.reshape(-1).copy()), out).double().numpy()
        size = np.abs(x.astype(np.float64)) @ np.abs(w).T  # the products' magnitude
        if t in FLOATS:
            np.testing.assert_array_less(np.abs(y - x @ w.T), 1e-5 * size + 1e-30)
            continue
        codes, scale = activations(x, 256 if fmt.activations == "q8_k" else 32)
        half_step = scale.astype(np.float64) / 2 * (x != 0)  # a zero group quantizes exactly
        np.testing.assert_array_less(np.abs(y - x @ w.T), half_step @ np.abs(w).T * (1 + 1e-4) + 1e-5 * size)
        model = (codes * scale.astype(np.float64)) @ w.T
        np.testing.assert_array_less(np.abs(y - model), 1e-5 * size)
        # the tolerance is the activations' rounding: ~1-2% of the products' magnitude, never more
        assert np.abs(y - x @ w.T).max() < 0.02 * size.max()


@pytest.mark.parametrize("build", BUILDS)
@pytest.mark.parametrize("t", list(ggml.FORMATS), ids=lambda t: T(t).name)
def test_each_rows_bits_are_the_same_alone_in_any_batch_and_with_two_threads(libraries, build, t):
    """Row i's outputs alone equal its outputs in every batch of 2..12 rows (passes of 9: a second pass
    from 10) and with two threads; for the quantized types they equal the plain build's bits too."""
    lib = library(libraries, build)
    t = T(t)
    rng = np.random.default_rng(100 + int(t))
    for out, inp in shapes(t):
        w = torch.from_numpy(random_matrix(t, out, inp, rng).reshape(-1).copy())
        x = torch.from_numpy(rng.standard_normal((12, inp)).astype(np.float32))
        alone = torch.stack([call(lib, t, x[i : i + 1], w, out)[0] for i in range(12)])
        for n in range(2, 13):
            assert torch.equal(call(lib, t, x[:n], w, out), alone[:n]), (n, out, inp)
        assert torch.equal(call(lib, t, x, w, out, threads=2), alone), (out, inp)
        if t not in FLOATS and build != "plain" and not isinstance(libraries["plain"], str):
            assert torch.equal(call(libraries["plain"], t, x, w, out), alone), (out, inp)


@pytest.mark.parametrize("build", ["native", "plain"])
@pytest.mark.parametrize("t", list(ggml.FORMATS), ids=lambda t: T(t).name)
def test_get_rows_is_ggufs_dequantizer_exactly(libraries, build, t):
    lib = library(libraries, build)
    t = T(t)
    rng = np.random.default_rng(200 + int(t))
    out, inp = shapes(t)[-1]
    raw = random_matrix(t, out, inp, rng)
    ids = torch.tensor([out - 1, 0, 3, 3])
    got = torch.empty(len(ids), inp)
    w = torch.from_numpy(raw.reshape(-1).copy())
    lib.ggml_get_rows(int(t), w.data_ptr(), inp, ids.data_ptr(), len(ids), got.data_ptr())
    want = gguf.quants.dequantize(raw, t).reshape(out, inp)[ids.numpy()]
    assert np.array_equal(got.numpy(), want)


def test_the_python_wrappers_keep_leading_dims_and_refuse_bad_arguments():
    rng = np.random.default_rng(0)
    raw = torch.from_numpy(random_matrix(T.Q4_K, 5, 256, rng).reshape(-1).copy())
    x = torch.randn(2, 3, 256)
    y = ggml.matmul(x, raw, int(T.Q4_K), 5)
    assert y.shape == (2, 3, 5) and torch.equal(
        y.reshape(6, 5), ggml.matmul(x.reshape(6, 256), raw, int(T.Q4_K), 5)
    )
    assert torch.equal(
        ggml.get_rows(raw, int(T.Q4_K), 256, torch.tensor([4]))[0],
        ggml.get_rows(raw, 12, 256, torch.arange(5))[4],
    )
    with pytest.raises(ValueError, match="multiple"):
        ggml.matmul(torch.randn(1, 200), raw, int(T.Q4_K), 5)
    with pytest.raises(ValueError, match="bytes"):
        ggml.matmul(x, raw, int(T.Q4_K), 4)
    with pytest.raises(ValueError, match="no kernel"):
        ggml.matmul(x, raw, int(T.Q2_K), 5)
    with pytest.raises(ValueError, match="ids"):
        ggml.get_rows(raw, int(T.Q4_K), 256, torch.tensor([5]))
