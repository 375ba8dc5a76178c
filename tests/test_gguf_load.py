"""A GGUF loads straight into the model (model/gguf_file.py, model/gguf_load.py, kernels/file_codes.py):
the file's own codes by default, float32 on request; an index cached on size, mtime and header, never a
hash of the whole file; every malformed file refused with its name, the tensor and the offset."""

from __future__ import annotations

import os
import struct

import gguf
import numpy as np
import pytest
import torch

import yue
from yue.errors import CheckpointError
from yue.kernels.file_codes import GGMLEmbedding, GGMLLinear, GGMLParts, install_file_codes
from yue.model import gguf_file
from yue.model.gguf_file import GGUFFile
from yue.model.gguf_load import InsufficientMemoryError
from yue.model.hf import load_model

pytestmark = pytest.mark.usefixtures("gguf_cache")
PROMPT = "Hello, world! How are"


def test_a_gguf_loads_in_its_own_codes_by_default_with_no_float_copy(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    trained = engine.model.trained
    assert isinstance(trained.model.embed_tokens, GGMLEmbedding)
    assert isinstance(trained.lm_head, GGMLLinear)
    _, proj, _, mlp = trained.model.layers[0]._sets(False)
    for m in (proj.q_proj, proj.k_proj, proj.v_proj, proj.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        assert isinstance(m, GGMLLinear) and m.ggml_type == gguf.GGMLQuantizationType.Q4_1
    # No float matrix of the AR set: its float parameters are norms (the router, unused, is zeros).
    assert all(p.dim() == 1 for n, p in trained.named_parameters() if not n.startswith("router."))
    assert engine.model.paths.layout.startswith("file codes")


def test_the_file_precision_tracks_float32_and_its_verifying_rows_are_exact(tiny_gguf):
    codes = yue.load(tiny_gguf.path)
    floats = yue.load(tiny_gguf.path, dtype="float32")
    ids = torch.tensor([codes.encode(PROMPT)])
    with torch.no_grad():
        a = load_model(tiny_gguf.path, file_codes=install_file_codes)(ids).logits
        b = load_model(tiny_gguf.path)(ids).logits
    # int8 activations against float32 ones, the same weights: close, not equal.
    assert (a - b).abs().max() < 0.05 * b.abs().max()
    out = codes.generate(PROMPT, mode="ar", max_new_tokens=16, ignore_eos=True).token_ids
    ref = floats.generate(PROMPT, mode="ar", max_new_tokens=16, ignore_eos=True).token_ids
    assert sum(x == y for x, y in zip(out, ref, strict=True)) >= 8


def test_q_and_k_rows_are_put_back_in_huggingface_order(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    _, proj, _, _ = engine.model.trained.model.layers[0]._sets(False)
    got = gguf.quants.dequantize(proj.q_proj.codes.numpy(), gguf.GGMLQuantizationType.Q4_1).reshape(
        proj.q_proj.out_features, -1
    )
    assert np.array_equal(got, tiny_gguf.state_dict["model.layers.0.self_attn.q_proj.weight"].numpy())


def test_matrices_stay_in_the_mapping_but_permuted_q_and_k_which_are_read_side_by_side(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    layer = engine.model.paths.layers[0][0]
    _, proj, _, mlp = engine.model.trained.model.layers[0]._sets(False)
    # Q and K read into one buffer (their rows put back in order), V in place: two matmuls.
    assert (
        isinstance(layer.qkv, GGMLParts)
        and layer.qkv.parts[0].codes.data_ptr() == proj.q_proj.codes.data_ptr()
    )
    mapping = GGUFFile.open(tiny_gguf.path)
    start = proj.v_proj.codes.data_ptr() - mapping.tensors["blk.0.attn_v.weight"].offset
    # Neighbours in the file, in one format, are one matmul over the mapping itself: gate and up.
    assert isinstance(layer.gate_up, GGMLLinear)
    assert layer.gate_up.codes.data_ptr() - start == mapping.tensors["blk.0.ffn_gate.weight"].offset
    assert mlp.down_proj.codes.data_ptr() - start == mapping.tensors["blk.0.ffn_down.weight"].offset
    assert layer.one_layer is not None


def test_parts_of_different_formats_run_side_by_side():
    f, q8 = gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.Q8_0
    rng = np.random.default_rng(0)
    w1, w2 = rng.standard_normal((8, 32)).astype(np.float32), rng.standard_normal((4, 32)).astype(np.float32)
    a = GGMLLinear(torch.from_numpy(w1.view(np.uint8).reshape(8, -1).copy()), int(f), 32)
    b = GGMLLinear(torch.from_numpy(gguf.quants.quantize(w2, q8).reshape(4, -1)), int(q8), 32)
    from yue.kernels.file_codes import fused

    both = fused([a, b])
    assert isinstance(both, GGMLParts)
    x = torch.randn(3, 32)
    assert torch.equal(both(x), torch.cat([a(x), b(x)], -1))


def test_a_warm_open_reads_the_index_not_the_file(tiny_gguf, monkeypatch):
    GGUFFile.open(tiny_gguf.path)

    def refuse(*args, **kwargs):
        raise AssertionError("a warm open parsed the file again")

    monkeypatch.setattr(gguf, "GGUFReader", refuse)
    g = GGUFFile.open(tiny_gguf.path)
    assert "blk.0.attn_q.weight" in g.tensors


def test_a_changed_file_gets_a_new_index(tiny_gguf, tmp_path):
    copy = tmp_path / "copy.gguf"
    copy.write_bytes(tiny_gguf.path.read_bytes())
    first = GGUFFile.open(copy).index_dir
    os.utime(copy, ns=(1, 1))
    assert GGUFFile.open(copy).index_dir != first


def test_an_index_left_half_written_is_rebuilt_and_stale_temporaries_removed(tiny_gguf, gguf_cache):
    g = GGUFFile.open(tiny_gguf.path)
    (g.index_dir / gguf_file.INDEX).unlink()  # a write killed before its index
    stale = g.index_dir.parent / ".tmp-killed"
    stale.mkdir()
    os.utime(stale, (0, 0))
    again = GGUFFile.open(tiny_gguf.path)
    assert (again.index_dir / gguf_file.INDEX).is_file()
    assert not stale.exists()


def _cut(src, dst, size: int):
    dst.write_bytes(src.read_bytes()[:size])
    return dst


def test_a_truncated_gguf_names_the_tensor_and_its_offset(tiny_gguf, tmp_path):
    size = tiny_gguf.path.stat().st_size
    with pytest.raises(
        CheckpointError, match=r"cut\.gguf: tensor .* \(offset \d+, \d+ bytes\) runs past the end"
    ):
        GGUFFile.open(_cut(tiny_gguf.path, tmp_path / "cut.gguf", size // 2))
    with pytest.raises(CheckpointError, match=r"the header is cut short at offset \d+"):
        GGUFFile.open(_cut(tiny_gguf.path, tmp_path / "head.gguf", 200))


def test_a_file_that_is_not_a_gguf_says_so(tmp_path):
    bad = tmp_path / "model.gguf"
    bad.write_bytes(b"PK\x03\x04 not a gguf" * 10)
    with pytest.raises(CheckpointError, match="not a GGUF file"):
        GGUFFile.open(bad)


def _tensor_entry(blob: bytes, name: str) -> int:
    """The offset of tensor `name`'s ggml type field in a GGUF's tensor table."""
    at = blob.index(name.encode()) + len(name)
    n_dims = struct.unpack_from("<I", blob, at)[0]
    return at + 4 + 8 * n_dims


def test_an_unknown_ggml_type_is_named(tiny_gguf, tmp_path):
    blob = bytearray(tiny_gguf.path.read_bytes())
    struct.pack_into("<I", blob, _tensor_entry(blob, "blk.0.attn_q.weight"), 250)
    bad = tmp_path / "type.gguf"
    bad.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="blk.0.attn_q.weight .* unknown ggml type 250"):
        GGUFFile.open(bad)


def test_an_offset_past_the_end_is_named(tiny_gguf, tmp_path):
    blob = bytearray(tiny_gguf.path.read_bytes())
    struct.pack_into("<Q", blob, _tensor_entry(blob, "blk.1.ffn_up.weight") + 4, 1 << 40)
    bad = tmp_path / "offset.gguf"
    bad.write_bytes(bytes(blob))
    with pytest.raises(CheckpointError, match="blk.1.ffn_up.weight .* runs past the end of the file"):
        GGUFFile.open(bad)


def _patched(src, dst, find: bytes, replace: bytes):
    """A copy of a GGUF with bytes `find` (once, in its header) replaced by as many bytes `replace`."""
    blob = src.read_bytes()
    assert len(find) == len(replace) and blob.count(find) >= 1
    dst.write_bytes(blob.replace(find, replace, 1))
    return dst


def test_shapes_that_disagree_with_the_metadata_are_named(tiny_gguf, tmp_path):
    key = b"llama.feed_forward_length"
    # The key, its value type (4: u32) and value: 128 in the file, 96 in the copy.
    bad = _patched(
        tiny_gguf.path,
        tmp_path / "shape.gguf",
        key + struct.pack("<II", 4, 128),
        key + struct.pack("<II", 4, 96),
    )
    with pytest.raises(
        CheckpointError,
        match=r"blk.0.ffn_gate.weight has shape \[128, 64\], but the metadata implies \[96, 64\]",
    ):
        yue.load(bad)


def test_an_unknown_architecture_is_named(tiny_gguf, tmp_path):
    bad = _patched(
        tiny_gguf.path,
        tmp_path / "arch.gguf",
        b"\x05\x00\x00\x00\x00\x00\x00\x00llama",
        b"\x05\x00\x00\x00\x00\x00\x00\x00mamba",
    )
    with pytest.raises(CheckpointError, match="architecture 'mamba' is not supported"):
        yue.load(bad)


def test_a_model_that_will_not_fit_stops_before_loading_with_what_to_change(tiny_gguf, monkeypatch):
    monkeypatch.setenv("YUE_MEMORY_AVAILABLE", str(1 << 20))
    with pytest.raises(InsufficientMemoryError, match=r"needs ~.* GiB .* is available; try"):
        yue.load(tiny_gguf.path)


def test_ctx_size_caps_the_context_and_rejects_nonsense(tiny_gguf):
    assert yue.load(tiny_gguf.path, ctx_size=64).context_length == 64
    assert yue.load(tiny_gguf.path, ctx_size=1 << 20).context_length == 256  # the file's own
    with pytest.raises(ValueError, match="ctx_size must be a positive integer"):
        yue.load(tiny_gguf.path, ctx_size=0)


def test_the_file_precision_needs_a_gguf(tiny_model_dir):
    with pytest.raises(ValueError, match="the file precision needs a model whose AR set is a GGUF"):
        yue.load(tiny_model_dir, dtype="file")


@pytest.fixture(scope="module")
def q4_k_m_gguf(tmp_path_factory):
    """A tiny Llama as llama.cpp's Q4_K_M mixes formats: Q4_K Q/K/O/gate/up, Q6_K V and down."""
    from tests.gguf_utils import write_tiny_llama_gguf

    path = tmp_path_factory.mktemp("q4km") / "q4km.gguf"
    return write_tiny_llama_gguf(path, quant="Q4_K_M", hidden=256, heads=4, kv_heads=2, intermediate=512)


def test_a_q4_k_m_layer_is_one_call_with_q_k_v_as_three_matmuls(q4_k_m_gguf):
    engine = yue.load(q4_k_m_gguf.path)
    s = engine.model.paths.layers[0][0]
    assert isinstance(s.qkv, GGMLParts)  # Q and K (Q4_K) side by side, then V (Q6_K)
    assert [p.ggml_type for p in s.qkv.parts] == [12, 14]
    assert s.one_layer is not None and False in engine.model.paths.stacks
    assert "one call a layer" in engine.model.paths.layout


def test_file_precision_rows_are_exact_whatever_the_steps_rows(q4_k_m_gguf):
    """A verifying step's rows get the bits of the one-row steps they stand for (`verified` == `ar`)."""
    engine = yue.load(q4_k_m_gguf.path)
    model = engine.model
    ids = torch.tensor([engine.encode(PROMPT)])
    T = ids.shape[1]
    cache = model.new_cache(1, 64)
    model.step(ids[:, : T - 4], torch.arange(T - 4), T - 4, None, cache, n_logits=1)
    cache.advance(T - 4)
    rows = torch.arange(T - 4, T)
    from yue.model.masks import decode_mask

    together = model.step(ids[:, T - 4 :], rows, 4, decode_mask(cache.length, 4, 0), cache).ar_logits[0]
    alone = []
    for t in range(4):
        out = model.step(ids[:, T - 4 + t : T - 3 + t], rows[t : t + 1], 1, None, cache).ar_logits[0, 0]
        alone.append(out)
        cache.advance(1)
    assert torch.equal(together, torch.stack(alone))


def _step_logits(engine, ids: torch.Tensor, rows: int) -> torch.Tensor:
    """AR logits of the prompt's last `rows` positions, taken in one step after the rest."""
    from yue.model.masks import decode_mask

    model, T = engine.model, ids.shape[1]
    cache = model.new_cache(1, 64)
    model.step(ids[:, : T - rows], torch.arange(T - rows), T - rows, None, cache, n_logits=1)
    cache.advance(T - rows)
    mask = decode_mask(cache.length, rows, 0) if rows > 1 else None
    return model.step(ids[:, T - rows :], torch.arange(T - rows, T), rows, mask, cache).ar_logits[0]


def test_gate_and_up_apart_in_the_file_run_as_two_matmuls_with_the_fused_bits(q4_k_m_gguf, tmp_path):
    """The whole-layer C call with gate and up as two matmuls (`rows_layer`'s split up: a file whose
    ffn_norm lies between them, so they cannot be one view) gives the bits the fused gate/up gives on the
    same values, for 1 and for 4 rows (each output row's bits depend on its weight row and input alone)."""
    from tests.gguf_utils import write_tiny_llama_gguf

    apart = write_tiny_llama_gguf(
        tmp_path / "apart.gguf", quant="Q4_K_M", hidden=256, heads=4, kv_heads=2, intermediate=512,
        sort_tensors=True,
    )  # fmt: skip
    split, fused = yue.load(apart.path), yue.load(q4_k_m_gguf.path)
    for engine, is_split in ((split, True), (fused, False)):
        for s in (layer[0] for layer in engine.model.paths.layers):
            assert isinstance(s.gate_up, GGMLParts) == is_split
            assert s.one_layer is not None  # one C call a layer, either way
            assert (s.one_layer.layers[0].tensors[-1] is not None) == is_split  # up's own weight
    ids = torch.tensor([split.encode(PROMPT)])
    for rows in (1, 4):
        a, b = _step_logits(split, ids, rows), _step_logits(fused, ids, rows)
        assert torch.isfinite(a).all() and a.abs().max() > 0
        assert torch.equal(a, b)


def test_file_precision_of_a_q4_k_m_file_tracks_float32(q4_k_m_gguf):
    a = load_model(q4_k_m_gguf.path, file_codes=install_file_codes)
    b = load_model(q4_k_m_gguf.path)
    ids = torch.tensor([[3, 17, 40, 99, 5, 120, 7]])
    with torch.no_grad():
        la, lb = a(ids).logits[0], b(ids).logits[0]
    # Random K-quant weights amplify the activations' int8 rounding layer by layer: compare directions.
    assert torch.nn.functional.cosine_similarity(la, lb, dim=-1).min() > 0.95
    assert (la.argmax(-1) == lb.argmax(-1)).float().mean() >= 0.8
