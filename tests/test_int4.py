"""The int4 precision: the AR layers in 4 bits per group of 32 (a Q4_1 GGUF's own codes), row-exact,
so `ar` == `verified` in it; the head in bfloat16; a clear error where its kernel does not run."""

from __future__ import annotations

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import yue
from tests.test_precision import assert_layers_hold_only, assert_verified_equals_ar
from tests.test_topnar import top_model
from yue.decode.costs import cost_cache_key, decode_layout
from yue.model import kernels
from yue.model.inference import Int4Linear, Lowered, PackedLinear, int4_usable, quantize_int4

needs_int4 = pytest.mark.skipif(
    not kernels.choice().int4_rows,
    reason=f"torch's int4 kernel does not run on this CPU: {kernels.describe()}",
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


@needs_int4
def test_int4_rows_do_not_depend_on_the_row_count():
    """What `ar` == `verified` rests on in this precision: a row's bits are the same in a call of 1..9 rows."""
    g = torch.Generator().manual_seed(0)
    for out_f, in_f in [(64, 96), (960, 576), (576, 1536)]:
        linear = torch.nn.Linear(in_f, out_f, bias=False)
        linear.weight.data = q4_1_weight(out_f, in_f, seed=out_f)[1]
        matmul = Int4Linear(linear)
        x = torch.randn(9, in_f, generator=g)
        alone = torch.cat([matmul(x[j : j + 1]) for j in range(9)])
        for rows in range(1, 10):
            assert torch.equal(matmul(x[:rows]), alone[:rows]), (out_f, in_f, rows)
        want = x.to(torch.bfloat16).float() @ linear.weight.t()
        assert torch.allclose(alone, want, atol=0.02 * want.abs().max().item())


def int4_model(seed: int = 0):
    return top_model(2, seed=seed).prepare_for_decoding(
        torch.qint8 if kernels.int8_engine() else None, int4=True
    )


@needs_int4
def test_int4_model_holds_its_layers_in_four_bits_and_its_head_in_bfloat16():
    model = int4_model()
    assert_layers_hold_only(model, Int4Linear)
    packed_bf16 = kernels.packed_rows(torch.bfloat16)
    assert isinstance(model.ar_head, Lowered) == packed_bf16
    assert not packed_bf16 or isinstance(model.ar_head.inner, PackedLinear)
    assert cost_cache_key(model) != cost_cache_key(top_model(2).prepare_for_decoding(None))
    # Row-exact attention without padding: yue's row kernel where it builds, else one query per SDPA
    # call (`MoTLayer._attend_kernel`, `_attend_per_row`), named in the step costs' key.
    kernel = kernels.choice().ok("rows-f32")
    assert model.model.layers[0].exact_rows
    assert model.model.layers[0].decode_sets[0].attention == ("kernel" if kernel else "per-row")
    assert ("attention row kernel" if kernel else "attention per row") in decode_layout(model)
    with kernels.forced("rows-f32"):
        assert int4_model().model.layers[0].decode_sets[0].attention == "per-row"


def test_shapes_the_int4_kernel_does_not_take_are_named():
    assert int4_usable(torch.nn.Linear(64, 96, bias=False))
    assert not int4_usable(torch.nn.Linear(64, 72, bias=False))  # outputs not a multiple of 16
    assert not int4_usable(torch.nn.Linear(48, 64, bias=False))  # inputs not whole groups of 32
    assert not int4_usable(torch.nn.Linear(64, 64, bias=True))


@needs_int4
@settings(max_examples=10, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 40), threshold=st.sampled_from([0.5, 1.0]))
def test_int4_verified_equals_ar(seed, threshold):
    assert_verified_equals_ar(int4_model(seed=seed % 5), seed, threshold)


@needs_int4
def test_int4_engine_generates_and_verified_equals_ar(trained_model_dir):
    engine = yue.load(trained_model_dir, dtype="int4")
    assert isinstance(engine.model.model.layers[0].decode_sets[0].qkv, Int4Linear)
    for prompt in ("def add(a, b):", "import os\n"):
        ar = engine.generate(prompt, mode="ar", max_new_tokens=20, ignore_eos=True).token_ids
        assert len(ar) == 20
        assert engine.generate(prompt, mode="verified", max_new_tokens=20, ignore_eos=True).token_ids == ar


def test_int4_where_its_kernel_is_off_is_a_clear_error(trained_model_dir):
    with kernels.forced("int4") as choice:
        assert "int4 (forced off)" in choice.describe() and "int4 layers: off" in choice.describe()
        with pytest.raises(ValueError, match="int4 precision needs a CPU where"):
            yue.load(trained_model_dir, dtype="int4")
        with pytest.raises(ValueError, match="int4 precision needs"):  # the API below `load` says so too
            top_model(2).prepare_for_decoding(None, int4=True)
    with pytest.raises(ValueError, match="int4 precision needs (a float32 model|a CPU where)"):
        top_model(2).to(torch.bfloat16).prepare_for_decoding(None, int4=True)
