"""The kernel seam (`yue.kernels.probe`): each fallback forced, reported, and decoding as the fast path.

This machine may have every kernel; a CPU without AVX512 lacks oneDNN's bf16 packing, one without
AVX2 the int8 engines. Forcing each off (`probe.forced`, `YUE_KERNELS`) runs those paths anywhere.
"""

from __future__ import annotations

import logging

import pytest
import torch

import yue
from yue.kernels import matmuls, probe
from yue.kernels.matmuls import Int8Linear, Lowered, PackedLinear, RowAdaptiveLinear, StreamedLinear
from yue.kernels.screen import ScreenedHead
from yue.model.decode_paths import exact_rows
from yue.model.masks import decode_mask

PROMPTS = ["def alpha_1(x):\n", "def beta", "class "]
AVX2_ERROR = (
    "mkldnn_reorder_linear_weight: bf16 path needs the cpu support avx_ne_convert or avx512bw, "
    "avx512vl and avx512dq"
)


@pytest.fixture(scope="module")
def fast(trained_model_dir):
    """The trained tiny model with every kernel the probe finds (none forced off, whatever YUE_KERNELS)."""
    with probe.forced():
        return yue.load(trained_model_dir)


@pytest.fixture(scope="module")
def fast_bf16(trained_model_dir):
    """`fast` in bfloat16."""
    with probe.forced():
        return yue.load(trained_model_dir, dtype=torch.bfloat16)


def ar_step_logits(engine) -> torch.Tensor:
    """AR logits of a 2-row step after a 4-token prefill (+4 slots): the multi-row kernels' path."""
    model, ids = engine.model, torch.tensor([[5, 6, 7, 8, 9, 10]])
    cache = model.new_cache(1, 32)
    with torch.inference_mode():
        model.step(ids[:, :4], torch.arange(4), 4, decode_mask(0, 4, 0), cache)
        cache.advance(4)
        return model.step(ids[:, 4:], torch.arange(4, 10), 2, decode_mask(4, 2, 4), cache).ar_logits


def assert_matches_kernels(engine, choice: probe.KernelChoice) -> None:
    """The prepared modules are the kernels `choice` names: packed iff its dtype's probe passed,
    int8 drafting iff an engine works (else float drafting: no draft head)."""
    model = engine.model
    if model.dtype == torch.float32:
        kind = {"onednn-packed": RowAdaptiveLinear, "row-stream": StreamedLinear}.get(choice.float32_rows)
    else:
        kind = PackedLinear if choice.ok("onednn-bf16") else None
    qkv = model.paths.layers[0][0].qkv
    assert type(qkv) is kind if kind else isinstance(qkv, torch.nn.Linear)
    # A row-kernel head carries its int8 screen for greedy steps (`screen.py`).
    ar_head = model.paths.ar_head
    head = ar_head.head if isinstance(ar_head, ScreenedHead) else ar_head
    assert isinstance(ar_head, ScreenedHead) == (kind is StreamedLinear)
    assert type(head) is kind if kind else head is None
    # Row-exact layers: bfloat16's packed copy, or float32's row kernel (one kernel for 1-9 rows).
    assert exact_rows(model.paths.layers[0]) == (kind in (PackedLinear, StreamedLinear))
    # Int8 drafting's head: on yue's row kernel where it runs (as the NAR layers), else torch's engine.
    row_int8 = matmuls.RowInt8Linear if choice.ok("rows-f32") else Int8Linear
    int8 = row_int8 if model.dtype == torch.float32 else Lowered
    draft_head = model.paths.draft_head
    assert isinstance(draft_head, int8) if choice.int8_engine else draft_head is None


@pytest.mark.parametrize("off", ["onednn-f32", "rows-f32", "onednn-bf16", "int8-x86", "int8", "portable"])
def test_each_forced_fallback_is_reported_and_decodes_the_fast_paths_tokens(trained_model_dir, fast, off):
    with probe.forced(off) as choice:
        engine = yue.load(trained_model_dir)
    for name in probe.parse_off([off]):
        assert not choice.ok(name) and f"{name} (forced off)" in choice.describe()
    if off == "int8-x86" and choice.ok("int8-fbgemm"):
        assert choice.int8_engine == "fbgemm"  # the next engine takes over
    assert_matches_kernels(engine, choice)
    torch.testing.assert_close(ar_step_logits(engine), ar_step_logits(fast), atol=1e-4, rtol=1e-4)
    drafted, kw = 0, dict(max_new_tokens=30, ignore_eos=True)
    for prompt in PROMPTS:
        ar = engine.generate(prompt, mode="ar", **kw)
        assert ar.token_ids == fast.generate(prompt, mode="ar", **kw).token_ids
        ver = engine.generate(prompt, mode="verified", router_threshold=1.0, **kw)
        assert ver.token_ids == ar.token_ids
        drafted += ver.stats.drafted
    assert drafted > 0  # the fallback's drafts really were checked


@pytest.mark.parametrize("off", ["onednn-bf16", "int8", "portable"])
def test_bfloat16_model_under_each_fallback_decodes_the_fast_paths_tokens(trained_model_dir, fast_bf16, off):
    with probe.forced(off) as choice:
        engine = yue.load(trained_model_dir, dtype=torch.bfloat16)
    assert engine.model.dtype == torch.bfloat16
    assert_matches_kernels(engine, choice)
    fast_logits = ar_step_logits(fast_bf16).float()
    torch.testing.assert_close(ar_step_logits(engine).float(), fast_logits, atol=0.05, rtol=0.02)
    kw = dict(max_new_tokens=30, ignore_eos=True)
    for prompt in PROMPTS[:2]:
        ar = engine.generate(prompt, mode="ar", **kw)
        assert ar.token_ids == fast_bf16.generate(prompt, mode="ar", **kw).token_ids
        assert engine.generate(prompt, mode="verified", **kw).token_ids == ar.token_ids


@pytest.fixture
def cpu_without_bf16_packing(monkeypatch):
    """oneDNN's bf16 reorder raising as it does on a CPU without AVX512 or avx_ne_convert."""
    real = probe.pack_weight

    def pack_weight(w: torch.Tensor) -> torch.Tensor:
        if w.dtype == torch.bfloat16:
            raise RuntimeError(AVX2_ERROR)
        return real(w)

    monkeypatch.setattr(probe, "pack_weight", pack_weight)
    probe.reset()
    yield
    probe.reset()  # the next probe runs with the real kernel again


def test_a_kernel_raising_at_the_probe_falls_back_and_bfloat16_loading_works(
    trained_model_dir, cpu_without_bf16_packing
):
    with probe.forced() as choice:
        assert choice.bfloat16_rows == "F.linear" and "avx_ne_convert" in choice.describe()
        engine = yue.load(trained_model_dir, dtype=torch.bfloat16)  # raised this error before the seam
    assert not isinstance(engine.model.paths.ar_head, (RowAdaptiveLinear, PackedLinear))
    kw = dict(max_new_tokens=20, ignore_eos=True)
    ar = engine.generate(PROMPTS[0], mode="ar", **kw)
    assert engine.generate(PROMPTS[0], mode="verified", **kw).token_ids == ar.token_ids


def test_yue_kernels_environment_variable_forces_fallbacks_and_forced_wins(monkeypatch):
    monkeypatch.setenv("YUE_KERNELS", "no-onednn-f32,no-rows-f32,no-int8")
    choice = probe.choice()
    assert choice is probe.choice()  # probed once, cached
    assert choice.float32_rows == "F.linear" and choice.int8_engine is None
    assert choice.describe().startswith(f"cpu {torch.backends.cpu.get_cpu_capability()} (bfloat16 ")
    with probe.forced() as inner:  # the function wins over the environment
        assert inner.ok("onednn-f32") == probe._probe(frozenset()).ok("onednn-f32")
    monkeypatch.setenv("YUE_KERNELS", "portable")
    assert not any(p.ok for p in probe.choice().probes)


@pytest.mark.parametrize("value", ["fast", "no-avx512", "portable,no-int8"])
def test_a_bad_yue_kernels_value_is_a_clear_error_before_loading(monkeypatch, trained_model_dir, value):
    monkeypatch.setenv("YUE_KERNELS", value)
    with pytest.raises(ValueError, match="YUE_KERNELS"):
        yue.load(trained_model_dir)


def test_int8_drafting_without_an_engine_auto_drafts_in_float_and_explicit_int8_is_refused(trained_model_dir):
    with probe.forced("int8"):
        assert yue.load(trained_model_dir).model.paths.draft_head is None  # "auto"
        with pytest.raises(ValueError, match="int8 drafting needs"):
            yue.load(trained_model_dir, nar_dtype="int8")


def test_the_choice_is_logged_at_load(trained_model_dir, caplog):
    with caplog.at_level(logging.INFO, logger="yue"):
        yue.load(trained_model_dir)
    assert f"kernels: {probe.describe()}" in caplog.text


def test_a_cpu_without_native_bfloat16_is_reported_as_emulating_it(monkeypatch):
    for check in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"):
        monkeypatch.setattr(torch.cpu, check, lambda: False, raising=False)
    probe.reset()
    try:
        choice = probe.choice()
        assert not choice.native_bf16 and "(bfloat16 emulated)" in choice.describe()
    finally:
        monkeypatch.undo()
        probe.reset()
    assert probe.choice().native_bf16 == any(
        getattr(torch.cpu, c, lambda: False)()
        for c in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )


@pytest.mark.parametrize("cpu, pad", [("AVX512", True), ("AVX2", False), ("DEFAULT", False)])
def test_float32_rows_are_padded_to_four_only_where_the_vector_width_makes_it_pay(cpu_capability, cpu, pad):
    """Padding 2-3 rows to 4 is for speed only (faster with AVX512, slower with AVX2): the values are
    the unpadded call's either way, and the choice is reported."""
    cpu_capability(cpu)
    with probe.forced() as choice:
        assert choice.pad_float32_rows == pad
        # In the line, and so in the step costs' cache key (`costs.cost_cache_key`).
        assert ("(oneDNN 2-3 padded to 4)" if pad else "(oneDNN unpadded)") in choice.describe()
        if not choice.ok("onednn-f32"):
            pytest.skip("no oneDNN float32 packing here")
        linear = torch.nn.Linear(64, 48, bias=False)
        module = RowAdaptiveLinear(linear)
    assert module.pad == pad
    x = torch.randn(1, 3, 64)
    torch.testing.assert_close(module(x), linear(x).detach(), atol=1e-5, rtol=1e-5)


@pytest.mark.skipif(not probe.packed_rows(torch.float32), reason="oneDNN float32 packing does not work here")
def test_a_one_row_float32_matmul_on_2d_rows_is_f_linear_bit_for_bit():
    """The decode path hands `RowAdaptiveLinear` 2-d rows, whose one row is a bare `mm` on the weight's
    (in, out) storage: the same kernel and bits as F.linear on the input-major weight, 2-d or 3-d."""
    linear = torch.nn.Linear(96, 80, bias=False)
    linear.weight = torch.nn.Parameter(linear.weight.detach().t().contiguous().t())  # input-major
    module = RowAdaptiveLinear(linear)
    x = torch.randn(1, 96)
    expected = torch.nn.functional.linear(x, linear.weight.detach())
    assert torch.equal(module(x), expected)
    assert torch.equal(module(x[None]), expected[None])


@pytest.mark.parametrize("tolerance, packed", [(float("inf"), True), (0.0, False)])
def test_a_float32_weight_held_once_is_the_packed_copy_where_its_timed_one_row_is_level(
    monkeypatch, tolerance, packed
):
    """The copy a weight held once keeps follows the timed ratio of the packed kernel's one row to MKL's
    GEMV against `ONE_COPY_TOLERANCE` (forced to either side here), is reported in the log line but not
    in the line the step costs' cache key reads (`timed=False`: a timing under load must not give a model
    a second key), and without the packed kernel is F.linear whatever the timing."""
    monkeypatch.setattr(probe, "ONE_COPY_TOLERANCE", tolerance)
    with probe.forced() as choice:
        expected = "onednn-packed" if packed and choice.ok("onednn-f32") else "F.linear"
        assert choice.float32_one_copy == expected
        assert f"one copy: {expected}" in choice.describe()
        assert "one copy" not in choice.describe(timed=False)
    with probe.forced("onednn-f32") as choice:
        assert choice.float32_one_copy == "F.linear"


@pytest.mark.skipif(not probe.packed_rows(torch.float32), reason="oneDNN float32 packing does not work here")
def test_the_one_copy_timing_is_a_ratio_of_real_calls_and_decides_the_choice():
    """The timing runs both kernels (a positive, finite ratio, cached per process until `reset`) on one
    thread, leaving the process's thread count as it was, and the choice on this machine is what that
    ratio and the tolerance say."""
    probe.reset()
    threads = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ratio = probe.one_row_packed_ratio(rounds=2)
        assert torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(threads)
    assert 0 < ratio < float("inf")
    assert probe.one_row_packed_ratio(rounds=2) == ratio  # cached: no second timing
    probe.reset()
    expected = "onednn-packed" if probe.one_row_packed_ratio() <= probe.ONE_COPY_TOLERANCE else "F.linear"
    assert probe.choice().float32_one_copy == expected
