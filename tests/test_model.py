"""Model invariants: the mask property, cached == uncached, HF round trips, Llama parity, bad files."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import yue
from tests.conftest import tiny_config
from tests.test_precision import assert_layers_hold_only
from yue.kernels import prepare_for_decoding, probe
from yue.kernels.matmuls import (
    Int8Linear,
    Lowered,
    PackedLinear,
    RowAdaptiveLinear,
    RowInt8Linear,
    StreamedLinear,
    row_adaptive,
)
from yue.kernels.prepare import input_major
from yue.model import CheckpointError, YueForCausalLM, export_ar, from_llama, load_model
from yue.model.decode_paths import exact_rows
from yue.model.masks import decode_mask, training_mask


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    return load_model(tiny_model_dir)


def test_cached_decoding_equals_uncached_forward(model):
    x = torch.randint(4, model.config.vocab_size, (1, 12))
    with torch.no_grad():
        full = model(x).logits
        cache = model.new_cache(1, 32)
        outs = []
        for chunk in (x[:, :5], x[:, 5:6], x[:, 6:9], x[:, 9:12]):
            n = chunk.shape[1]
            pos = torch.arange(cache.length, cache.length + n)
            outs.append(model.step(chunk, pos, n, decode_mask(cache.length, n, 0), cache).ar_logits)
            cache.advance(n)
    torch.testing.assert_close(torch.cat(outs, 1), full, rtol=1e-5, atol=1e-5)


def test_appending_then_dropping_slots_leaves_committed_cache_bit_identical(model):
    x = torch.randint(4, model.config.vocab_size, (1, 10))
    mask_id = model.config.mask_token_id
    with torch.no_grad():
        plain = model.new_cache(1, 32)
        model.step(x, torch.arange(10), 10, decode_mask(0, 10, 0), plain)
        with_slots = model.new_cache(1, 32)
        tokens = torch.cat([x, torch.full((1, 4), mask_id)], 1)
        out = model.step(tokens, torch.arange(14), 10, decode_mask(0, 10, 4), with_slots)
    assert out.slot_logits.shape[1] == 4
    assert torch.equal(plain.k[:, :, :, :10], with_slots.k[:, :, :, :10])
    assert torch.equal(plain.v[:, :, :, :10], with_slots.v[:, :, :, :10])


def test_committed_logits_do_not_depend_on_slots(model):
    x = torch.randint(4, model.config.vocab_size, (1, 8))
    with torch.no_grad():
        a = model.step(x, torch.arange(8), 8, decode_mask(0, 8, 0), model.new_cache(1, 32)).ar_logits
        drafts = torch.randint(4, model.config.vocab_size, (1, 4))
        b = model.step(
            torch.cat([x, drafts], 1), torch.arange(12), 8, decode_mask(0, 8, 4), model.new_cache(1, 32)
        )
    assert torch.equal(a, b.ar_logits)


def test_decode_mask_with_anchors_gives_each_block_its_own_context():
    # cache holds 2 positions; 3 new committed tokens c2..c4; two blocks of 2 slots at c2 and c4.
    m = decode_mask(2, 3, 4, anchors=(0, 2))[0, 0]  # (7 queries, 9 keys)
    assert m[:3, :5].equal(torch.ones(3, 5, dtype=torch.bool).tril(2))  # committed: causal
    assert not m[:3, 5:].any()
    assert m[3:5, :3].all() and not m[3:5, 3:5].any()  # block 0 sees up to c2 only
    assert m[3:5, 5:7].all() and not m[3:5, 7:].any()  # ... and its own slots
    assert m[5:7, :5].all() and m[5:7, 7:].all() and not m[5:7, 5:7].any()  # block 1: up to c4, own
    assert decode_mask(2, 3, 4).equal(decode_mask(2, 3, 4, anchors=(2,)))


def test_a_block_anchored_mid_step_drafts_as_if_anchored_at_the_end(model):
    """Block m of a multi-block step sees what a one-block step ending at its anchor would see."""
    x = torch.randint(4, model.config.vocab_size, (1, 10))
    K, mask_id = 3, model.config.mask_token_id
    with torch.inference_mode():
        cache = model.new_cache(1, 64)
        model.step(x[:, :6], torch.arange(6), 6, decode_mask(0, 6, 0), cache)
        cache.advance(6)
        fed, anchors = x[:, 6:], (0, 2, 3)  # 4 new tokens at positions 6..9
        tokens = torch.cat([fed, torch.full((1, 3 * K), mask_id)], 1)
        pos = torch.cat([torch.arange(6, 10)] + [torch.arange(7 + a, 7 + a + K) for a in anchors])
        multi = model.step(tokens, pos, 4, decode_mask(6, 4, 3 * K, anchors=anchors), cache).slot_logits
        for b, a in enumerate(anchors):
            solo_cache = model.new_cache(1, 64)
            n = 6 + a + 1
            t = torch.cat([x[:, :n], torch.full((1, K), mask_id)], 1)
            solo = model.step(t, torch.arange(n + K), n, decode_mask(0, n, K), solo_cache).slot_logits
            torch.testing.assert_close(multi[:, b * K : (b + 1) * K], solo, atol=1e-4, rtol=1e-4)


def test_drafting_pass_mask_sees_the_whole_cache_and_its_block():
    assert decode_mask(5, 0, 3) is None  # unpadded: every key, so SDPA needs no mask
    key_valid = torch.tensor([[False, True, True, True, True, True, True, True, True]])
    m = decode_mask(5, 0, 3, key_valid)
    assert m.shape == (1, 1, 3, 8)
    assert torch.equal(m[0, 0], key_valid[:, :8].expand(3, 8))  # all but the padding key


def test_training_mask_matches_the_design_picture():
    m = training_mask(6, torch.tensor([[3]]), 3)[0, 0]  # committed c0..c5, one block anchored at c3
    assert m[:6, :6].equal(torch.ones(6, 6, dtype=torch.bool).tril())  # causal
    assert not m[:6, 6:].any()  # committed -> slot blocked
    assert m[6:, :4].all() and not m[6:, 4:6].any()  # slot -> committed up to the anchor
    assert m[6:, 6:].all()  # slots see their own block
    two = training_mask(6, torch.tensor([[1, 3]]), 2)[0, 0]
    assert not two[6:8, 8:10].any() and not two[8:10, 6:8].any()  # blocks never see each other


def test_save_pretrained_then_auto_from_pretrained_gives_identical_logits(model, tmp_path):
    model.save_pretrained(tmp_path)
    again = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert isinstance(again, YueForCausalLM)
    x = torch.randint(4, model.config.vocab_size, (2, 9))
    with torch.no_grad():
        assert torch.equal(model(x).logits, again(x).logits)
    assert not list(tmp_path.glob("*.bin"))


def test_our_ar_greedy_equals_transformers_llama_generate(tiny_model_dir, tmp_path):
    engine = yue.load(tiny_model_dir)
    export_ar(load_model(tiny_model_dir), tmp_path, tokenizer_file=f"{tiny_model_dir}/tokenizer.json")
    llama = LlamaForCausalLM.from_pretrained(tmp_path).eval()
    for prompt in ["def add(a, b):", "你好", "x"]:
        ours = engine.generate(prompt, mode="ar", max_new_tokens=24)
        ids = torch.tensor([engine.encode(prompt)])
        ref = llama.generate(ids, max_new_tokens=24, do_sample=False, eos_token_id=None, pad_token_id=0)
        assert ours.token_ids == ref[0, ids.shape[1] :].tolist()


def test_llama_import_keeps_ar_logits(tmp_path, tokenizer):
    from yue.model.hf import llama_config_from

    torch.manual_seed(1)
    llama = LlamaForCausalLM(llama_config_from(tiny_config(tokenizer))).eval()
    ours = from_llama(llama, block_size=4)
    x = torch.randint(4, tokenizer.vocab_size, (1, 10))
    with torch.no_grad():
        torch.testing.assert_close(ours(x).logits, llama(x).logits, rtol=1e-5, atol=1e-5)


def test_truncated_safetensors_gives_a_clear_error_naming_the_file(model, tmp_path):
    model.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    with pytest.raises(CheckpointError, match="model.safetensors"):
        load_model(tmp_path)


def test_missing_weights_and_pickles_are_refused(tmp_path, model):
    with pytest.raises(CheckpointError, match="not found"):
        load_model(tmp_path / "nope")
    model.config.save_pretrained(tmp_path)
    (tmp_path / "pytorch_model.bin").write_bytes(b"\x80\x04not really a pickle")
    with pytest.raises(CheckpointError, match="pickle files are never loaded"):
        load_model(tmp_path)


def test_corrupt_config_is_named(model, tmp_path):
    model.save_pretrained(tmp_path)
    (tmp_path / "config.json").write_text("{not json")
    with pytest.raises(CheckpointError, match="config.json"):
        load_model(tmp_path)


@pytest.mark.parametrize("name", ["int8", "bfloat16"])
def test_lowered_drafting_changes_drafts_only_verified_still_equals_ar(trained_model_dir, name, tmp_path):
    if name == "int8" and probe.int8_engine() is None:
        pytest.skip(f"no int8 engine works here: {probe.describe()}")  # test_kernels forces that path
    engine = yue.load(trained_model_dir, nar_dtype=name)
    plain = yue.load(trained_model_dir, nar_dtype="float32")
    layer = engine.model.trained.model.layers[0]
    lowered = Lowered if name == "bfloat16" else Int8Linear
    # int8 NAR layers and draft head run on yue's row kernel where it builds (`RowInt8Linear`).
    in_layers = RowInt8Linear if name == "int8" and probe.choice().ok("rows-f32") else lowered
    assert isinstance(layer.nar_mlp.up_proj, in_layers) and isinstance(
        engine.model.paths.draft_head, in_layers
    )
    if in_layers is Int8Linear:  # the lean forward computes what torch's dynamic int8 module computes
        x = torch.randn(2, 5, engine.model.config.hidden_size)
        head = engine.model.paths.draft_head
        assert isinstance(head.quantized, torch.ao.nn.quantized.dynamic.Linear)
        assert torch.equal(head(x), head.quantized(x))
    assert isinstance(layer.mlp.up_proj, torch.nn.Linear) and layer.mlp.up_proj.weight.dtype == torch.float32
    assert plain.model.paths.draft_head is None
    drafted = 0
    for prompt in ["def alpha_1(x):\n", "def beta", "class "]:
        ar = engine.generate(prompt, mode="ar", max_new_tokens=40)
        assert ar.token_ids == plain.generate(prompt, mode="ar", max_new_tokens=40).token_ids
        ver = engine.generate(prompt, mode="verified", max_new_tokens=40, router_threshold=1.0)
        assert ver.token_ids == ar.token_ids
        drafted += ver.stats.drafted
    assert drafted > 0  # the lowered weights really drafted
    h = torch.randn(1, 3, engine.model.config.hidden_size)
    with torch.inference_mode():  # ... and really are of lower precision: close, not equal
        lowered, full = engine.model.paths.draft_head(h), plain.model.lm_head(h)
    assert not torch.equal(lowered, full) and torch.allclose(lowered, full, atol=0.1, rtol=0.05)
    with pytest.raises(ValueError, match="cannot be saved"):
        engine.model.save_pretrained(tmp_path)


@pytest.mark.parametrize("off", [(), ("onednn-bf16",)])  # as here, and as a CPU without AVX512
def test_bfloat16_model_with_int8_drafting_verified_equals_ar(trained_model_dir, off):
    with probe.forced(*off) as choice:
        engine = yue.load(trained_model_dir, dtype=torch.bfloat16)  # drafting: int8 behind casts
    assert engine.model.dtype == torch.bfloat16
    assert isinstance(engine.model.paths.ar_head, PackedLinear) == choice.ok("onednn-bf16")
    assert isinstance(engine.model.paths.draft_head, Lowered) or choice.int8_engine is None
    drafted = 0
    for prompt in ["def alpha_1(x):\n", "class "]:
        kw = dict(max_new_tokens=30, ignore_eos=True)
        ar = engine.generate(prompt, mode="ar", **kw)
        ver = engine.generate(prompt, mode="verified", **kw)
        assert ver.token_ids == ar.token_ids and len(ar.token_ids) == 30
        drafted += ver.stats.drafted
        assert len(engine.generate(prompt, mode="hybrid", **kw).token_ids) == 30
    assert drafted > 0


def test_input_major_layout_keeps_values_and_embedding_rows(trained_model_dir):
    model = load_model(trained_model_dir)
    ref = {k: v.clone() for k, v in model.state_dict().items()}
    input_major(model)
    for k, v in model.state_dict().items():
        assert torch.equal(v, ref[k]), k
    head, emb = model.lm_head.weight, model.model.embed_tokens.weight
    assert head.t().is_contiguous() and model.model.layers[0].mlp.down_proj.weight.t().is_contiguous()
    assert emb.is_contiguous() and emb.data_ptr() != head.data_ptr()  # lookups gather contiguous rows
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.allclose(model(ids).logits, load_model(trained_model_dir)(ids).logits, atol=1e-5)


def test_a_large_tied_table_is_shared_by_the_embedding_and_the_input_major_head(
    trained_model_dir, monkeypatch
):
    """Above `SHARED_TABLE` floats the embedding becomes a view of the head's input-major copy (one
    table, not two); lookups through the strided view give the same rows and the same logits."""
    monkeypatch.setattr("yue.kernels.prepare.SHARED_TABLE", 0)
    model = load_model(trained_model_dir)
    assert model.config.tie_word_embeddings
    input_major(model)
    head, emb = model.lm_head.weight, model.model.embed_tokens.weight
    assert emb.data_ptr() == head.data_ptr() and head.t().is_contiguous()
    ids = torch.tensor([[5, 6, 7, 8]])
    assert torch.allclose(model(ids).logits, load_model(trained_model_dir)(ids).logits, atol=1e-5)


def test_loaded_weights_are_copies_not_views_of_the_file(trained_model_dir, tmp_path):
    """`_read_weights` reads the file into memory of its own instead of mapping it, so preparing a model
    does not leave the file's pages resident beside its copies: overwriting the file leaves the loaded
    tensors readable and equal."""
    import shutil

    from yue.model.hf import _read_weights

    folder = tmp_path / "copy"
    shutil.copytree(trained_model_dir, folder)
    state = _read_weights(folder, torch.float32)
    ref = {k: v.clone() for k, v in state.items()}
    for f in folder.glob("*.safetensors"):
        with f.open("r+b") as fh:  # overwritten in place (no truncation): a mapped tensor would read zeros
            fh.write(b"\0" * f.stat().st_size)
    assert all(torch.equal(state[k], ref[k]) for k in ref)


def test_unmapped_reader_reads_every_dtype_and_rejects_a_lying_header(tmp_path):
    """`_read_unmapped` gives safetensors' own values for float, bfloat16, integer and bool tensors; a
    header whose byte range disagrees with its shape, or a dtype yue does not load, is a CheckpointError."""
    import json

    from safetensors.torch import load_file, save_file

    from yue.model.hf import _read_unmapped

    ref = {
        "f": torch.randn(3, 5),
        "b": torch.randn(4).to(torch.bfloat16),
        "i": torch.arange(7),
        "m": torch.tensor([True, False]),
        "s": torch.tensor(2.5),
    }
    save_file(ref, str(tmp_path / "ok.safetensors"))
    read = dict(_read_unmapped(tmp_path / "ok.safetensors"))
    stock = load_file(str(tmp_path / "ok.safetensors"))
    assert read.keys() == ref.keys()
    assert all(read[k].dtype == stock[k].dtype and torch.equal(read[k], stock[k]) for k in ref)

    def raw(header: dict, data: bytes) -> Path:
        h = json.dumps(header).encode()
        path = tmp_path / "raw.safetensors"
        path.write_bytes(len(h).to_bytes(8, "little") + h + data)
        return path

    lying = raw({"a": {"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(CheckpointError, match="tensor a"):
        dict(_read_unmapped(lying))
    odd = raw({"a": {"dtype": "F8_E4M3", "shape": [8], "data_offsets": [0, 8]}}, b"\0" * 8)
    with pytest.raises(CheckpointError, match="F8_E4M3"):
        dict(_read_unmapped(odd))


@pytest.fixture
def onednn_float32():
    """Float32 rows on oneDNN's path (the row kernel forced off), as on a CPU where it does not build:
    the kernels these tests check are that fallback's."""
    with probe.forced("rows-f32"):
        yield


@pytest.mark.skipif(not probe.packed_rows(torch.float32), reason="oneDNN float32 packing does not work here")
@pytest.mark.parametrize("copy", ["packed", "input-major"])
@pytest.mark.parametrize("why", ["low_memory", "size"])
def test_one_copy_of_each_float32_layer_weight_packed_or_input_major_as_timed(
    trained_model_dir, monkeypatch, tmp_path, caplog, copy, why, onednn_float32
):
    """Loaded with `low_memory`, or with layers above `ONE_COPY_BYTES`, a float32 model holds each AR
    layer weight once, the copy `kernels` times as faster for one row (forced to each side through
    `ONE_COPY_TOLERANCE`). Packed: row-exact rows, the unpacked weights released, the head keeping
    its input-major copy (the embedding table) beside its packed one. Input-major: plain F.linear,
    the head too. Logits and `ar` == `verified` hold."""
    monkeypatch.setattr(probe, "ONE_COPY_TOLERANCE", float("inf") if copy == "packed" else 0.0)
    low_memory = why == "low_memory"
    if not low_memory:
        monkeypatch.setattr("yue.kernels.prepare.ONE_COPY_BYTES", 0)
    caplog.set_level(logging.INFO, logger="yue.kernels.prepare")
    prepared = prepare_for_decoding(load_model(trained_model_dir), low_memory=low_memory)
    kernel = "onednn-packed" if copy == "packed" else "F.linear"
    assert f"one copy of each float32 weight: {kernel} (oneDNN's packed one row timed at" in caplog.text
    if copy == "packed":
        assert_layers_hold_only(prepared, PackedLinear)
        assert isinstance(prepared.paths.ar_head, RowAdaptiveLinear)
        with pytest.raises(ValueError, match="load_unprepared"):  # its AR layers are gone but for the packing
            export_ar(prepared, tmp_path)
    else:
        for sets in prepared.paths.layers:
            ar = sets[0]
            assert not exact_rows(sets)
            assert all(type(m) is torch.nn.Linear for m in (ar.qkv, ar.gate_up, ar.shared[1], ar.shared[3]))
            assert ar.qkv.weight.t().is_contiguous()  # input-major: MKL's GEMV for one row
        assert prepared.paths.ar_head is None  # AR rows take lm_head itself
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    assert torch.allclose(prepared(ids).logits, load_model(trained_model_dir)(ids).logits, atol=1e-4)
    engine = yue.load(trained_model_dir, low_memory=low_memory)
    assert exact_rows(engine.model.paths.layers[0]) == (copy == "packed")
    for prompt in ("def add(a, b):", "import os\n", "class Stack:"):
        ar = engine.generate(prompt, mode="ar", max_new_tokens=24, ignore_eos=True).token_ids
        assert engine.generate(prompt, mode="verified", max_new_tokens=24, ignore_eos=True).token_ids == ar


@pytest.mark.skipif(not probe.packed_rows(torch.float32), reason="oneDNN float32 packing does not work here")
@pytest.mark.parametrize("low_memory", [False, True])
def test_the_step_costs_key_names_the_timed_one_copy_verdict_only_where_the_model_holds_a_weight_once(
    trained_model_dir, monkeypatch, low_memory, onednn_float32
):
    """The layout the step costs are cached by (`paths.layout`) follows the load-timed one-copy verdict
    only through the model's own matmul kinds: two copies (the default) keep one key whichever way the
    timing fell (a timing under load used to give the same model a second cost curve); one copy gets
    one key per verdict, since its rows then run other kernels."""
    layouts = set()
    for tolerance in (float("inf"), 0.0):
        monkeypatch.setattr(probe, "ONE_COPY_TOLERANCE", tolerance)
        layouts.add(prepare_for_decoding(load_model(trained_model_dir), low_memory=low_memory).paths.layout)
    assert len(layouts) == (2 if low_memory else 1)


def test_prepared_model_fuses_without_copies_and_computes_the_same(trained_model_dir, onednn_float32):
    """prepare_for_decoding (float drafting): fused Q/K/V and gate/up share the separate weights'
    storage, and decode steps give the logits of the model as trained."""
    plain, prepared = load_model(trained_model_dir), prepare_for_decoding(load_model(trained_model_dir))
    layer, sets = prepared.trained.model.layers[0], prepared.paths.layers[0]
    # On a CPU the decode path's float matmuls and the AR head pick their kernel by row count; the
    # two-row step below goes through the packed (oneDNN) kernels, the prefill's last row through MKL
    # (where `kernels` found oneDNN's packing working; test_kernels forces the other case).
    packed = probe.packed_rows(torch.float32)
    assert isinstance(prepared.paths.ar_head, RowAdaptiveLinear) == packed
    assert isinstance(sets[0].qkv, RowAdaptiveLinear) == packed
    for nar in (False, True):
        _, proj, _, mlp = layer._sets(nar)
        fused = sets[nar]
        assert proj.q_proj.weight.data_ptr() == fused.qkv.weight.data_ptr()
        assert (
            mlp.up_proj.weight.untyped_storage().data_ptr()
            == fused.gate_up.weight.untyped_storage().data_ptr()
        )
    ids = torch.tensor([[5, 6, 7, 8, 9, 10]])
    outs = []
    for m in (plain, prepared):
        cache = m.new_cache(1, 32)
        with torch.inference_mode():
            m.step(ids[:, :4], torch.arange(4), 4, decode_mask(0, 4, 0), cache)
            cache.advance(4)
            outs.append(m.step(ids[:, 4:], torch.arange(4, 10), 2, decode_mask(4, 2, 4), cache))
    assert torch.allclose(outs[0].ar_logits, outs[1].ar_logits, atol=1e-4)
    assert torch.allclose(outs[0].slot_logits, outs[1].slot_logits, atol=1e-4)
    assert torch.allclose(plain(ids).logits, prepared(ids).logits, atol=1e-4)  # the uncached path too


@pytest.mark.parametrize("shape", [(1, 1, 16), (1, 2, 16), (3, 1, 16), (1, 9, 16), (40, 16)])
@pytest.mark.parametrize("rows, kernel", [("onednn-packed", "onednn-f32"), ("row-stream", "rows-f32")])
def test_row_adaptive_linear_computes_the_linear_at_any_row_count(shape, rows, kernel):
    torch.manual_seed(0)
    linear = torch.nn.Linear(16, 24, bias=False)
    with probe.forced() as choice:  # the kernel wherever it works, whatever YUE_KERNELS says
        if not choice.ok(kernel):
            pytest.skip(f"{kernel} does not work here: {probe.describe()}")
        fast = row_adaptive(linear, rows=rows)
    kind = RowAdaptiveLinear if rows == "onednn-packed" else StreamedLinear
    assert isinstance(fast, kind) and not fast.state_dict()
    x = torch.randn(shape)
    assert torch.allclose(fast(x), linear(x), atol=1e-5)
    with_bias = torch.nn.Linear(16, 24)
    assert row_adaptive(with_bias) is with_bias  # left as it is


def test_unknown_drafting_dtype_is_a_clear_error(trained_model_dir):
    with pytest.raises(ValueError, match="drafting dtype must be one of"):
        yue.load(trained_model_dir, nar_dtype="int4")


def test_releasing_freed_memory_is_a_no_op_without_glibc(monkeypatch):
    """`release_freed_memory` trims glibc's heap; where there is no glibc (musl, macOS) it does nothing."""
    import ctypes

    from yue.kernels import prepare

    def no_libc(*args, **kwargs):
        raise OSError("no libc here")

    monkeypatch.setattr(ctypes, "CDLL", no_libc)
    prepare._malloc_trim.cache_clear()  # libc is looked up once per process
    prepare.release_freed_memory()  # must not raise
    calls = []
    monkeypatch.setattr(
        ctypes, "CDLL", lambda name: type("Libc", (), {"malloc_trim": lambda self, n: calls.append(n)})()
    )
    prepare._malloc_trim.cache_clear()
    prepare.release_freed_memory()
    assert calls == [0]
    prepare._malloc_trim.cache_clear()  # the real one again for later tests
