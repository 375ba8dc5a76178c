"""The int4 precision: the AR layers in 4 bits per group of 32 (a Q4_1 GGUF's own codes), row-exact,
so `ar` == `verified` in it: on yue's row kernel with int8 activations (`RowInt4Linear`, the head
float32), else on torch's int4pack with bfloat16 ones (`Int4Linear`, the head bfloat16); a clear error
where neither runs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yue
from tests.test_precision import X86, assert_layers_hold_only, assert_verified_equals_ar
from tests.test_rowkernel import fresh_build, needs_row_kernel  # noqa: F401 (a fixture)
from tests.test_topnar import top_model
from yue.decode.costs import cost_cache_key
from yue.kernels import prepare_for_decoding, probe, rowkernel
from yue.kernels.decode_set import decode_layout
from yue.kernels.matmuls import (
    Int4Linear,
    Lowered,
    PackedLinear,
    RowInt4Linear,
    StreamedLinear,
    int4_usable,
    quantize_int4,
)
from yue.kernels.screen import ScreenedHead
from yue.model.decode_paths import exact_rows

needs_int4 = pytest.mark.skipif(
    not probe.choice().int4_rows,
    reason=f"no int4 kernel runs on this CPU: {probe.describe()}",
)
needs_int4pack = pytest.mark.skipif(
    not probe.choice().ok("int4"), reason=f"torch's int4 kernel does not run here: {probe.describe()}"
)
needs_row_int4 = pytest.mark.skipif(
    not probe.choice().ok("rows-int4"),
    reason=f"the row kernel's int4 does not run here: {probe.describe()}",
)


def q4_1_weight(out_f: int, in_f: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A weight as a Q4_1 GGUF holds it: per block of 32 inputs, codes 0..15 (both extremes used), an
    fp16 scale d and minimum m; returns (codes, dequantized float32 weight)."""
    g = torch.Generator().manual_seed(seed)
    blocks = in_f // 32
    codes = torch.randint(0, 16, (out_f, blocks, 32), generator=g, dtype=torch.int32)
    codes[..., 0], codes[..., 1] = 0, 15  # Q4_1 maps each block's minimum to 0 and maximum to 15
    d = (torch.rand(out_f, blocks, 1, generator=g) * 0.01 + 1e-3).half().float()
    m = ((torch.rand(out_f, blocks, 1, generator=g) - 0.5) * 0.1).half().float()
    return codes.reshape(out_f, in_f), (codes * d + m).reshape(out_f, in_f)


def test_quantizing_a_q4_1_weight_gives_back_its_codes_and_values():
    codes, w = q4_1_weight(48, 96, seed=0)
    got, scales_zeros = quantize_int4(w)
    assert torch.equal(got, codes)
    scale, zero = (scales_zeros[..., i].float().repeat_interleave(32, 0).t() for i in (0, 1))
    # Only the bfloat16 rounding of scale and zero (8 significant bits) stands between them.
    bound = (zero.abs() + 8 * scale) * 2**-8
    assert ((((got - 8) * scale + zero) - w).abs() <= bound).all()


@pytest.mark.parametrize(
    "kind",
    [pytest.param(Int4Linear, marks=needs_int4pack), pytest.param(RowInt4Linear, marks=needs_row_int4)],
)
def test_int4_rows_do_not_depend_on_the_row_count(kind):
    """What `ar` == `verified` rests on in this precision: a row's bits are the same in a call of 1..9 rows
    (and 13: two passes of the row kernel), either kernel, within its activations' rounding of the float
    product."""
    g = torch.Generator().manual_seed(0)
    for out_f, in_f in [(64, 96), (960, 576), (576, 1536)]:
        linear = torch.nn.Linear(in_f, out_f, bias=False)
        linear.weight.data = q4_1_weight(out_f, in_f, seed=out_f)[1]
        matmul = kind(linear)
        x = torch.randn(13, in_f, generator=g)
        alone = torch.cat([matmul(x[j : j + 1]) for j in range(13)])
        for rows in (*range(1, 10), 13):
            assert torch.equal(matmul(x[:rows]), alone[:rows]), (out_f, in_f, rows)
        want = x @ linear.weight.t()
        assert torch.allclose(alone, want, atol=0.02 * want.abs().max().item())


def q4dot_reference(x: torch.Tensor, codes: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """What `rows_matmul_q4dot` computes, in torch (float64 for the exact parts): each row of x quantized
    per group of 32 to int8 (scale max |x| / 127, half to even), the groups' exact integer sums with the
    codes, then per group y += sum (d sx) + m (sx sum xq) in float32 with one rounding each (float64
    then float32: a double rounding that the tolerance of the caller covers)."""
    rows, inp = x.shape
    G = inp // 32
    xg = x.view(rows, G, 32)
    amax = xg.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    xq = torch.round(xg * inv[..., None]).clamp(-127, 127)
    sx = amax / 127
    xs = sx * xq.sum(-1)
    wg = w.view(w.shape[0], G, 32)
    m, d = wg.amin(-1), (wg.amax(-1) - wg.amin(-1)) / 15  # the Q4_1 weight's own (float16-exact) d
    sums = torch.einsum("rgi,ogi->rog", xq.double(), codes.view(w.shape[0], G, 32).double())
    y = torch.zeros(rows, w.shape[0], dtype=torch.float32)
    for g in range(G):
        step = (d[None, :, g] * sx[:, None, g]).double()  # float32 product, as the kernel's
        y = (sums[:, :, g] * step + y.double()).float()
        y = (m[None, :, g].double() * xs[:, None, g].double() + y.double()).float()
    return y


@needs_row_int4
@pytest.mark.parametrize("out_f, in_f", [(45, 64), (8, 32), (960, 576)])
def test_the_row_kernels_int4_is_the_q4_1_codes_times_rows_quantized_per_group(out_f, in_f):
    """`q4dot_block` keeps a Q4_1 weight's codes, d and m exactly, and `rows_matmul_q4dot` computes, for
    1-20 rows (beyond one pass), a partial column block, a zero row and rows of very different scales,
    the integer products of the codes with each row's int8 groups, scaled: the torch reference within
    float32's last bits (every build runs these integers and these fmaf steps)."""
    codes, w = q4_1_weight(out_f, in_f, seed=in_f)
    blocked = rowkernel.q4dot_block(w)
    assert rowkernel.layout(blocked) == "q4dot16" and rowkernel.inputs(blocked) == in_f
    # The record's codes, d and m (float16 scales: a Q4_1 file's are) are the file's: unpack them back.
    B, G, _ = blocked.shape
    dm = blocked[..., :32].contiguous().view(torch.float16).float().view(B, G, 2, 8)
    nib = blocked[..., 32:].view(B, G, 4, 8, 4)
    both = torch.stack([nib & 15, nib >> 4], 3)  # (B, G, chunk, low/high, output, k)
    unpacked = both.permute(0, 4, 1, 2, 3, 5).reshape(B * 8, in_f)[:out_f]
    assert torch.equal(unpacked.to(torch.int32), codes)
    d = dm[:, :, 0].permute(0, 2, 1).reshape(B * 8, G)[:out_f]
    m = dm[:, :, 1].permute(0, 2, 1).reshape(B * 8, G)[:out_f]
    assert torch.equal((unpacked.view(out_f, G, 32) * d[..., None] + m[..., None]).view(out_f, in_f), w)
    g = torch.Generator().manual_seed(out_f)
    for rows in (1, 2, 4, 9, 10, 20):
        x = torch.randn(rows, in_f, generator=g) * torch.logspace(-3, 3, rows)[:, None]
        x[rows // 2] = 0.0
        got, want = rowkernel.matmul(x, blocked, out_f), q4dot_reference(x, codes, w)
        assert torch.allclose(got, want, rtol=1e-5, atol=1e-6 * want.abs().amax().item()), rows
        assert torch.equal(got[rows // 2], torch.zeros(out_f))


@needs_row_int4
def test_a_weight_not_of_the_gguf_form_is_quantized_round_to_nearest():
    """Any float weight takes the int4 precision: codes round((w - m) / d) per group, d = (max - m) / 15,
    so each value within half a step of its code's."""
    w = torch.randn(16, 64, generator=torch.Generator().manual_seed(1))
    blocked = rowkernel.q4dot_block(w)
    assert rowkernel.layout(blocked) == "q4dot"  # its minima are no float16 values: float32 scales
    eye = torch.eye(64)  # one-hot rows: each row reads one input's column, up to the rows' int8 rounding
    got = rowkernel.matmul(eye, blocked, 16).t()
    step = (w.view(16, 2, 32).amax(-1) - w.view(16, 2, 32).amin(-1)) / 15
    assert ((got - w).abs().view(16, 2, 32) <= step[..., None] / 2 + 1e-6).all()


def as_float32_scales(blocked: torch.Tensor) -> torch.Tensor:
    """A "q4dot16" record with its float16 scales widened to float32: the "q4dot" record of the same values."""
    B, G, _ = blocked.shape
    scales = blocked[..., :32].contiguous().view(torch.float16).float().view(torch.uint8).view(B, G, 64)
    return torch.cat([scales, blocked[..., 32:]], -1).contiguous()


@needs_row_int4
def test_float16_scales_give_the_float32_scales_bits():
    """Where every d and m of a weight is a float16 value (a Q4_1 file's), its records hold them as
    float16 (160 bytes, what a one-row step streams) and every row's bits are those of the same values
    held as float32, for 1-13 rows."""
    _, w = q4_1_weight(200, 576, seed=3)
    half = rowkernel.q4dot_block(w)
    wide = as_float32_scales(half)
    assert (rowkernel.layout(half), rowkernel.layout(wide)) == ("q4dot16", "q4dot")
    assert half.shape[-1] == 160 and wide.shape[-1] == 192
    x = torch.randn(13, 576, generator=torch.Generator().manual_seed(4))
    for rows in (*range(1, 10), 13):
        assert torch.equal(rowkernel.matmul(x[:rows], half, 200), rowkernel.matmul(x[:rows], wide, 200)), rows


def int4_model(seed: int = 0):
    return prepare_for_decoding(
        top_model(2, seed=seed), torch.qint8 if probe.int8_engine() else None, int4=True
    )


@needs_row_int4
def test_int4_model_on_the_row_kernel_holds_its_layers_in_four_bits_as_one_call_and_its_head_float32():
    model = int4_model()
    assert_layers_hold_only(model, RowInt4Linear)
    assert isinstance(model.paths.ar_head, ScreenedHead) and isinstance(
        model.paths.ar_head.head, StreamedLinear
    )
    assert model.paths.stacks[False] is not None  # the AR layers: one row-kernel call a step
    assert "RowInt4Linear" in decode_layout(model)
    assert cost_cache_key(model) != cost_cache_key(prepare_for_decoding(top_model(2), None))


@needs_int4pack
def test_int4_model_on_torchs_kernel_holds_its_layers_in_four_bits_and_its_head_in_bfloat16():
    with probe.forced("rows-int4"):
        model = int4_model()
    assert_layers_hold_only(model, Int4Linear)
    packed_bf16 = probe.packed_rows(torch.bfloat16)
    assert isinstance(model.paths.ar_head, Lowered) == packed_bf16
    assert not packed_bf16 or isinstance(model.paths.ar_head.inner, PackedLinear)
    assert cost_cache_key(model) != cost_cache_key(prepare_for_decoding(top_model(2), None))
    # Row-exact attention without padding: yue's row kernel where it builds, else one query per SDPA
    # call (`ExactAttention`: the row kernel's, or per row), named in the step costs' key.
    kernel = probe.choice().ok("rows-f32")
    assert exact_rows(model.paths.layers[0])
    assert model.paths.layers[0][0].attend.form == ("kernel" if kernel else "per-row")
    assert ("attention row kernel" if kernel else "attention per row") in decode_layout(model)
    with probe.forced("rows-f32"):  # the row kernel off: its int4 off too
        assert int4_model().paths.layers[0][0].attend.form == "per-row"


def test_shapes_the_int4_kernel_does_not_take_are_named():
    assert int4_usable(torch.nn.Linear(64, 96, bias=False))
    assert not int4_usable(torch.nn.Linear(64, 72, bias=False))  # outputs not a multiple of 16
    assert not int4_usable(torch.nn.Linear(48, 64, bias=False))  # inputs not whole groups of 32
    assert not int4_usable(torch.nn.Linear(64, 64, bias=True))


@needs_int4
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 40), threshold=st.sampled_from([0.5, 1.0]), torchs=st.booleans())
def test_int4_verified_equals_ar(seed, threshold, torchs):
    """Either int4 kernel (torch's forced where the row kernel's runs, when `torchs`)."""
    with probe.forced(*(["rows-int4"] if torchs and probe.choice().ok("int4") else [])):
        model = int4_model(seed=seed % 5)
    assert_verified_equals_ar(model, seed, threshold)


@needs_int4
def test_int4_engine_generates_and_verified_equals_ar(trained_model_dir):
    engine = yue.load(trained_model_dir, dtype="int4")
    kind = RowInt4Linear if probe.choice().ok("rows-int4") else Int4Linear
    assert isinstance(engine.model.paths.layers[0][0].qkv, kind)
    for prompt in ("def add(a, b):", "import os\n"):
        ar = engine.generate(prompt, mode="ar", max_new_tokens=20, ignore_eos=True).token_ids
        assert len(ar) == 20
        assert engine.generate(prompt, mode="verified", max_new_tokens=20, ignore_eos=True).token_ids == ar


def test_int4_where_its_kernel_is_off_is_a_clear_error(trained_model_dir):
    with probe.forced("int4", "rows-int4") as choice:
        assert "int4 (forced off)" in choice.describe() and "int4 layers: off" in choice.describe()
        with pytest.raises(ValueError, match="int4 precision needs a CPU where"):
            yue.load(trained_model_dir, dtype="int4")
        with pytest.raises(ValueError, match="int4 precision needs"):  # the API below `load` says so too
            prepare_for_decoding(top_model(2), None, int4=True)
    with pytest.raises(ValueError, match="int4 precision needs (a float32 model|a CPU where)"):
        prepare_for_decoding(top_model(2).to(torch.bfloat16), None, int4=True)


def integer_dot_rows(seed: int) -> list[tuple[str, torch.Tensor, torch.Tensor, int]]:
    """The integer-dot matmuls' cases for `test_every_builds_integer_dot_rows_are_the_plain_loops_bits`:
    (function, rows, weight in its layout, outputs) over 11 rows of very different scales, a zero row, a
    subnormal one, a partial zero row, and rows holding an inf and a NaN (the plain loop's fallbacks)."""
    g = torch.Generator().manual_seed(seed)
    cases = []
    for out_f, in_f in ((40, 64), (200, 576)):
        x = torch.randn(11, in_f, generator=g) * torch.logspace(-30, 30, 11)[:, None]
        x[2], x[3, :40] = 0.0, -0.0
        x[4] = torch.randn(in_f, generator=g) * 1e-40  # subnormal: 127 / max overflows
        x[5, 5], x[6, 7] = float("inf"), float("nan")
        codes = torch.randint(-127, 128, (out_f, in_f), generator=g, dtype=torch.int8)
        q4 = rowkernel.q4dot_block(q4_1_weight(out_f, in_f, seed=in_f)[1])  # float16 scales
        cases += [
            ("rows_matmul_q4dot16", x, q4, out_f),
            ("rows_matmul_q4dot", x, as_float32_scales(q4), out_f),
            ("rows_matmul_i8dot", x, rowkernel.dot_block(codes), out_f),
        ]
    return cases


def call_rows(lib, name: str, x: torch.Tensor, w: torch.Tensor, out_f: int) -> torch.Tensor:
    """y (rows, out) of one of the row kernel's matmuls called directly (NaN kept as the kernel wrote it)."""
    y = torch.empty(x.shape[0], out_f)
    getattr(lib, name)(*rowkernel._pointers(x, x.shape[0], x.shape[1], w, y, out_f, 1))
    return y


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return bool(((a == b) | (a.isnan() & b.isnan())).all())


BUILDS = {
    "native": None,  # the first flag set: AVX512 with VNNI on this CPU, when it has them
    "avx512-no-vnni": ["-march=native", "-mno-avx512vnni", "-mno-avxvnni"],  # maddubs and madd at 512 bits
    "avx2": ["-mavx2", "-mfma"],  # 256-bit vectors, no VNNI: the AVX2 path
    # AVX-VNNI's VEX form (dpbusd without AVX512): run where the CPU has it
    "avx2-vnni": ["-mavx2", "-mfma", "-mavxvnni"],
}


def cpu_has(flag: str) -> bool:
    return flag in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False


@needs_row_int4
@pytest.mark.parametrize("build", BUILDS)
def test_every_builds_integer_dot_rows_are_the_plain_loops_bits(build, fresh_build, monkeypatch):  # noqa: F811
    """The integer-dot matmuls (int4's layers, a drafting set's int8) on each vector path, forced by its
    flags, give the plain build's bits (no -march: the portable loops), row by row, and each row's bits
    alone equal its bits among 10 others (two passes of MAX_R = 9): the weights decoded once per group
    for all rows, and the vectorized quantization of the rows, change no bit of any row."""
    if build != "native" and not X86:
        pytest.skip("x86 vector paths")
    needs = {"avx512-no-vnni": "avx512bw", "avx2-vnni": "avx_vnni"}.get(build)
    if needs and not cpu_has(needs):
        pytest.skip(f"this CPU has no {needs}")
    cases = integer_dot_rows(seed=0)  # built with the native library (the layouts do not depend on it)
    monkeypatch.setattr(rowkernel, "FLAG_SETS", ([],))
    probe.reset()
    plain = [call_rows(rowkernel.library(), *case) for case in cases]
    if BUILDS[build] is not None:
        monkeypatch.setattr(rowkernel, "FLAG_SETS", (BUILDS[build],))
    else:
        monkeypatch.undo()
    probe.reset()
    needs_row_kernel()
    lib = rowkernel.library()
    for (name, x, w, out_f), want in zip(cases, plain, strict=True):
        got = call_rows(lib, name, x, w, out_f)
        assert same_bits(got, want), (build, name, out_f)
        for r in (0, 4, 5, 8, 10):
            assert same_bits(call_rows(lib, name, x[r : r + 1], w, out_f)[0], got[r]), (build, name, r)
