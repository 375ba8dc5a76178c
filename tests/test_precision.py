"""The bfloat16 precision: one packed weight copy, float32 attention, and `ar` == `verified` by
construction (a verifying row computes the bits a one-row AR step would); its kernel's fallback."""

from __future__ import annotations

import logging
import platform

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import test_drafting_kernel
from tests.test_rowkernel import fresh_build, needs_row_kernel  # noqa: F401 (a fixture)
from tests.test_topnar import top_model
from yue.config import DecodeConfig, YueConfig
from yue.decode.costs import cost_cache_key
from yue.decode.loop import decode
from yue.kernels import matmuls, prepare_for_decoding, probe, rowkernel
from yue.kernels.decode_set import EXACT_ATTENTION, ExactAttention, decode_layout
from yue.kernels.matmuls import PackedLinear, packed_matmul
from yue.kernels.prepare import resolve_dtype
from yue.model.cache import padded_capacity
from yue.model.decode_paths import exact_rows
from yue.model.layers import EXACT_KEY_PAD, MoTLayer
from yue.model.masks import decode_mask, slot_positions, training_mask

BF16_PACKED = probe.packed_rows(torch.bfloat16)
needs_packed = pytest.mark.skipif(
    not BF16_PACKED, reason=f"oneDNN bfloat16 packing does not work on this CPU: {probe.describe()}"
)


def bf16_model(seed: int = 0, nar_layers: int = 2):
    """A random top-layer NAR model in bfloat16, prepared for decoding (int8 drafting where it works)."""
    model = top_model(nar_layers, seed=seed).to(torch.bfloat16)
    return prepare_for_decoding(model, torch.qint8 if probe.int8_engine() else None)


@needs_packed
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_packed_rows_do_not_depend_on_the_row_count(dtype):
    """The property `ar` == `verified` rests on: a row's result is the same bits in a call of 1..9 rows."""
    g = torch.Generator().manual_seed(0)
    for out_f, in_f in [(96, 64), (64, 1536), (960, 576)]:
        packed = probe.pack_weight((torch.randn(out_f, in_f, generator=g) * 0.05).to(dtype))
        x = torch.randn(9, in_f, generator=g).to(dtype)
        alone = torch.cat([packed_matmul(x[j : j + 1], packed) for j in range(9)])
        for rows in range(1, 10):
            assert torch.equal(packed_matmul(x[:rows], packed), alone[:rows]), (out_f, in_f, rows)


def assert_layers_hold_only(model, kind: type) -> None:
    """Every AR layer's decode matmuls are `kind`, row-exact, and the float copies are released."""
    for layer, sets in zip(model.trained.model.layers, model.paths.layers, strict=True):
        ar = sets[0]
        assert exact_rows(sets) and isinstance(ar.qkv, kind) and isinstance(ar.gate_up, kind)
        assert layer.self_attn.q_proj.weight.numel() == 0 and layer.mlp.down_proj.weight.numel() == 0


@needs_packed
def test_bfloat16_model_holds_one_packed_copy_and_attends_in_float32():
    model = bf16_model()
    assert_layers_hold_only(model, PackedLinear)
    assert isinstance(model.paths.ar_head, PackedLinear)
    cache = model.new_cache(1, 8)
    assert cache.k.dtype == torch.float32 and model.dtype == torch.bfloat16


def gguf_round_trip(w: torch.Tensor, kind: str = "Q4_1") -> torch.Tensor:
    """A float32 (out, in) weight through a GGUF quantization and back (llama.cpp's reference quantizer
    and dequantizer, the `gguf` package's): Q4_1 (per group of 32 inputs code * d + m) or Q8_0 (code *
    d), as a GGUF of that type loads."""
    import gguf.quants
    from gguf import GGMLQuantizationType

    kind = GGMLQuantizationType[kind]
    packed = gguf.quants.quantize(w.detach().contiguous().numpy(), kind)
    return torch.from_numpy(gguf.quants.dequantize(packed, kind).reshape(w.shape))


def q4_weights(model):
    """The AR set's layer weights replaced by their Q4_1 round trip (`gguf_round_trip`)."""
    for layer in model.model.layers:
        _, proj, _, mlp = layer._sets(False)
        for module in (proj, mlp):
            for linear in module.children():
                linear.weight.data.copy_(gguf_round_trip(linear.weight))
    return model


def row_stream_model(seed: int, q4: bool = False, q8_head: bool = False, off: tuple = ()):
    """A random top-layer NAR model in float32 whose rows run the row kernel; skipped where the kernel
    cannot build. With `q4`, its AR layers' weights are Q4_1 values, which the row kernel holds as 4-bit codes; with
    `q8_head`, its tied head's are Q8_0 values, held as 8-bit codes. `off`: kernels forced off."""
    needs_row_kernel()
    model = top_model(2, seed=seed)
    if q4:
        q4_weights(model)
    if q8_head:
        model.lm_head.weight.data.copy_(gguf_round_trip(model.lm_head.weight, "Q8_0"))
    with probe.forced(*off):
        model = prepare_for_decoding(model, torch.qint8 if probe.int8_engine() else None)
    assert isinstance(model.paths.ar_head.head, matmuls.StreamedLinear)  # under its screen (`screen.py`)
    layouts = [rowkernel.layout(sets[0].blocked[0]) for sets in model.paths.layers]
    assert layouts == ["q4" if q4 and "rows-q4" not in off else "float32"] * len(layouts)
    head = rowkernel.layout(model.paths.ar_head.head.blocked[0])
    assert head == ("q8" if q8_head and "rows-q8" not in off else "float32")
    return model


@pytest.mark.parametrize("precision", ["bfloat16", "float32 row-stream", "float32 4-bit codes"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_verifying_rows_equal_one_row_steps_bit_for_bit(seed, precision):
    """Eight committed tokens in one step give the logits (and cache) of eight one-token steps. (On the
    2-core AMD EPYC this project develops on, seed 0 differs without `exact_rows`: SDPA over several
    queries is not row-exact there.)"""
    if precision == "bfloat16" and not BF16_PACKED:
        pytest.skip(f"oneDNN bfloat16 packing does not work on this CPU: {probe.describe()}")
    if precision == "bfloat16":
        model = bf16_model(seed=seed)
    else:
        model = row_stream_model(seed, q4=precision.endswith("codes"))
    assert all(exact_rows(sets) for sets in model.paths.layers)
    if precision != "bfloat16":  # the AR layers in one row-kernel call each (`DecodeSet.whole_layer`)
        assert all(sets[0].blocked is not None for sets in model.paths.layers)
    n, k = 11, 8
    prompt = torch.randint(4, 96, (1, n), generator=torch.Generator().manual_seed(1))
    new = torch.randint(4, 96, (1, k), generator=torch.Generator().manual_seed(2))

    def prefilled():
        cache = model.new_cache(1, n + 2 * k)
        model.step(prompt, torch.arange(n), n, decode_mask(0, n, 0), cache, n_logits=1)
        cache.advance(n)
        return cache

    many = prefilled()
    together = model.step(new, torch.arange(n, n + k), k, decode_mask(n, k, 0), many).ar_logits[0]
    one = prefilled()
    alone = []
    for t in range(k):
        out = model.step(new[:, t : t + 1], torch.tensor([n + t]), 1, decode_mask(n + t, 1, 0), one)
        alone.append(out.ar_logits[0, 0])
        one.advance(1)
    assert torch.equal(together, torch.stack(alone))
    assert together.dtype == torch.float32  # the AR logits leave the head in float32 (fast argmax)
    for i in range(model.config.num_hidden_layers):
        assert all(
            torch.equal(a[:, :, : n + k], b[:, :, : n + k])
            for a, b in zip(many.layer(i), one.layer(i), strict=True)
        )


@pytest.mark.parametrize("batch", [1, 2])
def test_the_one_call_layer_computes_what_its_torch_path_does(batch):
    """`DecodeSet.whole_layer` (the AR layers of a float32 row-kernel model in one call each) against the same
    model's layer-by-layer torch path (`DecodeSet` with the call turned off)."""
    assert_one_call_is_parts(row_stream_model(0), batch)


def assert_one_call_is_parts(model, batch: int) -> None:
    """A prepared model's AR layers as one row-kernel call each (and as one stack) against its layers in
    parts (`DecodeSet` with the call turned off): a prefill, then a 1-row and a 5-row step over a
    left-padded batch, logits and cache within float32 rounding; the stack's bits those of the layers'
    one calls in turn."""
    prompts = torch.randint(4, 96, (batch, 9), generator=torch.Generator().manual_seed(3))
    steps = [torch.randint(4, 96, (batch, t), generator=torch.Generator().manual_seed(t)) for t in (1, 5)]
    blocked = [sets[0].blocked for sets in model.paths.layers]
    assert all(b is not None for b in blocked)
    stacks = model.paths.stacks
    assert stacks[False].weights.first == 0 and len(stacks[False].weights.layers) == model.config.num_hidden_layers

    def run(one_call: bool, stacked: bool = True):
        for sets, b in zip(model.paths.layers, blocked, strict=True):
            sets[0].blocked = b if one_call else None
        model.paths.stacks = stacks if one_call and stacked else {}
        cache = model.new_cache(batch, 32)
        cache.set_padding([0, 3][:batch])
        n = prompts.shape[1]
        model.step(
            prompts,
            cache.positions(torch.arange(n), padded=True),
            n,
            decode_mask(0, n, 0, cache.key_valid),
            cache,
        )
        cache.advance(n)
        logits = []
        for new in steps:
            T = new.shape[1]
            mask = decode_mask(cache.length, T, 0, cache.key_valid)
            logits.append(model.step(new, cache.positions(torch.arange(T)), T, mask, cache).ar_logits)
            cache.advance(T)
        return logits, cache

    (fast, fast_cache), (slow, slow_cache) = run(True), run(False)
    for a, b in zip(fast, slow, strict=True):
        torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast_cache.k, slow_cache.k, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(fast_cache.v, slow_cache.v, atol=1e-4, rtol=1e-4)
    # The stack in one call (`rowstack.stack`) is the layers' one calls in turn: the same bits.
    per_layer, per_layer_cache = run(True, stacked=False)
    assert all(torch.equal(a, b) for a, b in zip(fast, per_layer, strict=True))
    assert torch.equal(fast_cache.k, per_layer_cache.k) and torch.equal(fast_cache.v, per_layer_cache.v)


@pytest.mark.parametrize("form", EXACT_ATTENTION)
@pytest.mark.parametrize("start", [1, 57, 127, 187, 250, 509])
def test_padded_attention_rows_equal_one_query_calls_bit_for_bit(start, form):
    """The row-exact attention forms (`ExactAttention`: padded; per row; the row kernel's, where it
    builds) over 9
    committed queries give, bit for bit, nine one-query calls of the same form at their positions
    (SmolLM2's heads: 9 query, 3 key/value, 64 dims; ranges crossing 64-column boundaries), in a batch
    whose second row has holes and for a lone row with no mask. (Starts 187 and 250 failed when the
    padded form attended a step crossing a boundary in one call: its earlier rows saw more keys.)"""
    config = YueConfig(vocab_size=64, hidden_size=576, intermediate_size=64, num_hidden_layers=1,
                       num_attention_heads=9, num_key_value_heads=3)  # fmt: skip
    if form == "kernel":
        needs_row_kernel()
    layer = MoTLayer(config, has_nar=False)
    attend = ExactAttention(form, layer.attn_scale, layer.n_kv != layer.n_heads)
    g = torch.Generator().manual_seed(start)
    T, capacity = 9, padded_capacity(start + 9)
    assert capacity % EXACT_KEY_PAD == 0 and capacity >= start + T
    kv = tuple(torch.randn(2, 3, capacity, 64, generator=g) for _ in range(2))
    q = torch.randn(2, 9, T, 64, generator=g)
    valid = torch.ones(2, capacity, dtype=torch.bool)
    valid[1, : start // 2] = False  # row 1: left padding / holes
    together = attend(q, kv, decode_mask(start, T, 0, valid), start)
    for t in range(T):
        alone = attend(q[:, :, t : t + 1], kv, decode_mask(start + t, 1, 0, valid), start + t)
        assert torch.equal(together[:, :, t : t + 1], alone), t
        lone = attend(q[:1, :, t : t + 1], tuple(b[:1] for b in kv), None, start + t)
        lone_batch = attend(q[:1], tuple(b[:1] for b in kv), decode_mask(start, T, 0), start)
        assert torch.equal(lone_batch[:, :, t : t + 1], lone), t


X86 = platform.machine() in ("x86_64", "AMD64")


@pytest.mark.parametrize(
    "flags",
    [
        [],
        ["-DYUE_NO_SHUFFLE"],
        pytest.param(["-mavx2", "-mfma"], marks=pytest.mark.skipif(not X86, reason="x86")),
    ],
)
def test_the_row_kernels_plain_build_is_row_exact_too(flags, fresh_build, monkeypatch):  # noqa: F811
    """The last flag set (plain -O3: no -march, so 8-float vectors, as on an AVX2 or ARM CPU, and no
    OpenMP), forced here, that build as a compiler without vector shuffles makes it (GCC < 12), and an
    AVX2 build (the intrinsics paths without AVX512 or VNNI, on any x86 CPU that runs this): the
    attention stays row-exact, the whole float32 model too, the one-call layer right (Llama's, and Gemma
    3's and Qwen2's with their extras), and the drafting
    kernels (integer dot products, softmax statistics) and the int4 precision's matmul compute what the
    native build does."""
    from yue.kernels import rowkernel

    monkeypatch.setattr(rowkernel, "FLAG_SETS", (flags,))
    needs_row_kernel()
    assert rowkernel.library().rows_lanes() == 8
    for start in (1, 57):
        test_padded_attention_rows_equal_one_query_calls_bit_for_bit(start, "kernel")
    test_verifying_rows_equal_one_row_steps_bit_for_bit(0, "float32 row-stream")
    test_the_one_call_layer_computes_what_its_torch_path_does(2)
    from tests import test_families  # here: it imports this module's helpers

    for name in ("gemma3", "qwen2"):  # the families' extras and GeGLU's tail past whole vectors
        test_families.test_a_family_layer_is_one_row_kernel_call_computing_what_its_parts_do(name, 2)
    # The drafting sets' integer dot products: the plain loop's integers are AVX2's; the router's
    # softmax statistics on the plain build's vectors.
    test_drafting_kernel.test_the_integer_dot_matmul_is_exact_integer_arithmetic_on_rows_quantized(45, 72)
    test_drafting_kernel.test_the_row_kernels_softmax_stats_are_the_routers()
    from tests import test_int4  # here: test_int4 imports this module's helpers

    for shape in ((45, 64), (960, 576)):
        test_int4.test_the_row_kernels_int4_is_the_q4_1_codes_times_rows_quantized_per_group(*shape)
    test_int4.test_int4_rows_do_not_depend_on_the_row_count(matmuls.RowInt4Linear)


@needs_packed
@settings(max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 40), threshold=st.sampled_from([0.5, 1.0]))
def test_bfloat16_verified_equals_ar(seed, threshold):
    assert_verified_equals_ar(bf16_model(seed=seed % 7), seed, threshold)


def assert_verified_equals_ar(model, seed: int, threshold: float) -> None:
    """24 greedy tokens after a random 9-token prompt: `verified` writes what `ar` writes."""
    prompt = torch.randint(4, 96, (9,), generator=torch.Generator().manual_seed(seed)).tolist()

    def run(mode: str) -> list[int]:
        cfg = DecodeConfig(mode=mode, max_new_tokens=24, ignore_eos=True, router_threshold=threshold)
        return [t for em in decode(model, [prompt], cfg.resolved(model.config)) for t in em.tokens[0]]

    assert run("verified") == run("ar")


def test_forced_fallback_runs_bfloat16_through_plain_linear(caplog):
    with probe.forced("onednn-bf16"), caplog.at_level(logging.WARNING, logger="yue"):
        model = bf16_model()
    assert "bfloat16 on this CPU runs through plain F.linear (forced off)" in caplog.text
    layer, sets = model.trained.model.layers[0], model.paths.layers[0]
    assert not exact_rows(sets) and not isinstance(sets[0].qkv, PackedLinear)
    assert layer.self_attn.q_proj.weight.numel() > 0  # nothing released: plain F.linear reads it
    # Row-major storage, not float32's input-major: F.linear over input-major bfloat16 is ~7x slower.
    assert sets[0].qkv.weight.is_contiguous() and model.lm_head.weight.is_contiguous()
    assert model.new_cache(1, 8).k.dtype == torch.bfloat16
    cfg = DecodeConfig(mode="ar", max_new_tokens=6, ignore_eos=True).resolved(model.config)
    out = [t for em in decode(model, [[5, 6, 7]], cfg) for t in em.tokens[0]]
    assert len(out) == 6 and all(0 <= t < 96 for t in out)


@needs_packed
def test_scoring_forward_of_a_prepared_bfloat16_model_matches_the_unprepared_one():
    """The uncached AR forward (bench NLL) runs through the packed decode path once the float copies
    are released; it computes the same function as the model as loaded, up to kernel rounding."""
    ids = torch.randint(4, 96, (1, 14), generator=torch.Generator().manual_seed(0))
    plain = top_model(2, seed=1).to(torch.bfloat16)
    want = plain(input_ids=ids).logits.float()
    got = prepare_for_decoding(plain, None)(input_ids=ids).logits.float()
    assert torch.allclose(got, want, atol=0.05 * want.abs().max().item())


def test_precision_names_and_cost_keys():
    assert resolve_dtype("bfloat16") == torch.bfloat16 and resolve_dtype("float32") is None
    assert resolve_dtype(torch.bfloat16) == torch.bfloat16
    with pytest.raises(ValueError, match="float32, bfloat16"):
        resolve_dtype("float16")
    with probe.forced("rows-f32"):  # float32 on oneDNN: rows not exact, no attention form
        f32 = prepare_for_decoding(top_model(2), None)
    bf16 = bf16_model()
    assert cost_cache_key(f32) != cost_cache_key(bf16)
    # Row-exact layers' attention form is in the key: costs measured with another form are not reused.
    # (bfloat16's layers are row-exact on oneDNN's packed copy; without it, plain F.linear, no form.)
    packed = probe.packed_rows(torch.bfloat16)
    assert ("attention padded 4x64" in decode_layout(bf16)) == packed and "attention" not in decode_layout(
        f32
    )


@needs_packed
def test_training_forward_with_slots_runs_on_a_prepared_bfloat16_model():
    """Slots in an uncached forward (draft training's features) still find the AR set's weights once
    the float copies are released: the committed rows go through the packed decode path."""
    model = bf16_model()
    T, K, D = 10, model.config.block_size, model.config.hidden_size
    x = torch.randint(4, 96, (1, T), generator=torch.Generator().manual_seed(0))
    entry = model.trained.model.run_to_entry(x, model.paths)
    anchors = torch.tensor([[2, 4]])
    slot_anchor = entry.gather(1, anchors.repeat_interleave(K, 1)[:, :, None].expand(1, 2 * K, D))
    positions = torch.cat([torch.arange(T)[None], slot_positions(anchors, K)], 1)
    slots = torch.full((1, 2 * K), model.config.mask_token_id)
    h = model.trained.model.run_from_entry(entry, slots, slot_anchor, positions, training_mask(T, anchors, K), model.paths)
    assert h.shape[-1] == D and torch.isfinite(h.float()).all()
