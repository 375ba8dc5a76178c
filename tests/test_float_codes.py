"""A GGUF's float32 and int4 precisions built from the file's blocks (kernels/float_codes.py,
`rowkernel.block_records`): the same records, byte for byte, as dequantizing to float32 and packing, and
the same outputs, on random blocks (degenerate groups too), tiny GGUFs and yue-smol."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import yue
from tests.test_rowkernel import needs_row_kernel
from yue.engine import loading
from yue.errors import ModelNotInstalledError
from yue.kernels import float_codes, rowkernel
from yue.kernels.file_codes import GGMLLinear
from yue.kernels.matmuls import StreamedLinear

pytestmark = pytest.mark.usefixtures("gguf_cache")
PROMPTS = ("Hello, world! How are", "The sea is")


def random_blocks(ggml_type: int, rows: int, inp: int, seed: int) -> torch.Tensor:
    """`rows` rows of random Q4_1 (3) or Q8_0 (8) blocks, a few groups made degenerate on purpose: d 0,
    negative or NaN, m -0 or far larger than d, codes all equal or short of either end, Q8_0 codes -128
    or short of 127. uint8 (rows, row bytes)."""
    rng = np.random.default_rng(seed)
    n = rows * inp // 32
    d = (rng.standard_normal(n) * 0.01).astype(np.float16)
    if ggml_type == 3:
        m = (-np.abs(rng.standard_normal(n)) * 0.1).astype(np.float16)
        q = rng.integers(0, 16, (n, 32))
        q[:, 0], q[:, 1] = 0, 15
        d[1::3] = np.abs(d[1::3])  # most blocks as llama.cpp writes them (d > 0, codes 0..15 used)
        odd = rng.choice(n, size=min(n, 12), replace=False)
        d[odd[0]], d[odd[1]], d[odd[2]] = 0, -abs(d[odd[2]]), np.nan
        m[odd[3]], m[odd[4]] = -0.0, 300.0
        q[odd[5]] = 7
        q[odd[6], :2] = (3, 12)
        q[odd[7]] = q[odd[7]] % 2
        d = np.where(np.isnan(d) | (d <= 0), d, np.abs(d)).astype(np.float16)
        nibbles = (q[:, :16] | q[:, 16:] << 4).astype(np.uint8)
        blocks = np.concatenate([d.view(np.uint8).reshape(n, 2), m.view(np.uint8).reshape(n, 2), nibbles], 1)
    else:
        q = rng.integers(-127, 128, (n, 32))
        q[:, 0] = 127
        odd = rng.choice(n, size=min(n, 8), replace=False)
        q[odd[0], 0], q[odd[1]] = -128, q[odd[1]] // 2
        d[odd[2]], d[odd[3]] = 0, -d[odd[3]]
        blocks = np.concatenate([d.view(np.uint8).reshape(n, 2), q.astype(np.int8).view(np.uint8)], 1)
    return torch.from_numpy(np.ascontiguousarray(blocks).reshape(rows, -1))


def dequantized(rows: torch.Tensor, ggml_type: int) -> torch.Tensor:
    from gguf import GGMLQuantizationType, quants

    values = quants.dequantize(rows.numpy(), GGMLQuantizationType(ggml_type))
    return torch.from_numpy(np.ascontiguousarray(values, np.float32))


@pytest.mark.parametrize(
    ("ggml_type", "rows", "inp"), [(3, 40, 64), (3, 7, 96), (3, 96, 576), (8, 9, 96), (8, 64, 64)]
)
def test_records_from_the_blocks_are_the_packers_bytes_for_the_values(ggml_type, rows, inp):
    needs_row_kernel()
    pack = rowkernel.q4_block if ggml_type == 3 else rowkernel.q8_block
    accepted = refused = 0
    for seed in range(3):
        blocks = random_blocks(ggml_type, rows, inp, seed)
        values = dequantized(blocks, ggml_type)
        # Each row alone (a degenerate group refuses its row, or takes another form), then the matrix
        # of the rows the packer takes: the same bytes, or both refused.
        for r in range(rows):
            want, got = pack(values[r : r + 1]), rowkernel.block_records(blocks[r : r + 1], ggml_type, inp)
            assert (want is None) == (got is None) and (want is None or torch.equal(got, want)), (seed, r)
            accepted, refused = accepted + (want is not None), refused + (want is None)
        keep = torch.tensor([pack(values[r : r + 1]) is not None for r in range(rows)])
        want, got = pack(values[keep]), rowkernel.block_records(blocks[keep], ggml_type, inp)
        assert want is not None and got is not None and torch.equal(got, want), seed
    assert accepted > refused  # most rows are in the file's form


def test_a_matrix_no_form_gives_back_is_refused_as_by_the_packer():
    needs_row_kernel()
    blocks = random_blocks(3, 32, 64, 0)
    blocks[5, :2] = torch.tensor([0x00, 0x7C], dtype=torch.uint8)  # one block's d is inf
    assert (
        rowkernel.block_records(blocks, 3, 64) is None and rowkernel.q4_block(dequantized(blocks, 3)) is None
    )


def prepared_tensors(engine) -> dict[str, torch.Tensor]:
    """Every tensor the decode paths hold, by where it is (the layers' records, the heads, the screen)."""
    out, seen = {}, set()

    def walk(obj, where):
        if id(obj) in seen:
            return
        seen.add(id(obj))
        if isinstance(obj, torch.Tensor):
            out[where] = obj
        elif isinstance(obj, (list, tuple)):
            for i, v in enumerate(obj):
                walk(v, f"{where}[{i}]")
        elif isinstance(obj, dict):
            for k, v in obj.items():
                walk(v, f"{where}[{k}]")
        elif isinstance(obj, torch.nn.Module) or type(obj).__module__.startswith("yue"):
            fields = dict(vars(obj))
            if isinstance(obj, torch.nn.Module):
                fields |= obj._modules | obj._parameters | obj._buffers
            for k, v in fields.items():
                if not k.startswith("_"):
                    walk(v, f"{where}.{k}")

    walk(engine.model.paths, "paths")
    return out


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    flat = lambda t: t.contiguous().reshape(-1).view(torch.uint8)  # noqa: E731
    return a.shape == b.shape and a.dtype == b.dtype and torch.equal(flat(a), flat(b))


def assert_loads_alike(source, dtype: str, monkeypatch, tokens: int = 12) -> None:
    """`source` at `dtype` from the file's blocks and by dequantizing (`loading.from_codes` off): the same
    decode-path tensors, byte for byte, and the same `ar` and `verified` text."""
    new = yue.load(source, dtype=dtype)
    with monkeypatch.context() as m:
        m.setattr(loading, "from_codes", lambda *a: False)
        old = yue.load(source, dtype=dtype)
    layers = new.model.trained.model.layers
    a, b = prepared_tensors(new), prepared_tensors(old)
    assert a.keys() == b.keys() and len(a) > 4 * len(layers)
    assert not (differ := [k for k in a if not same_bits(a[k], b[k])]), differ[:5]
    assert new.model.paths.layout == old.model.paths.layout
    for prompt in PROMPTS:
        for mode in ("ar", "verified") if new.model.config.nar_layers else ("ar",):
            ours, theirs = (e.generate(prompt, max_new_tokens=tokens, mode=mode) for e in (new, old))
            assert ours.token_ids == theirs.token_ids and ours.text == theirs.text


@pytest.mark.parametrize("dtype", ["float32", "int4"])
def test_a_tiny_q4_1_gguf_prepares_the_same_bytes_from_its_blocks(tiny_gguf, dtype, monkeypatch):
    needs_row_kernel()
    assert_loads_alike(tiny_gguf.path, dtype, monkeypatch)
    engine = yue.load(tiny_gguf.path, dtype=dtype)
    qkv = engine.model.paths.layers[0][0].qkv
    assert dtype == "int4" or isinstance(qkv, StreamedLinear) and rowkernel.layout(qkv.blocked[0]) == "q4"
    # No float32 copy of a layer's matrices: its modules hold the file's codes, released once prepared.
    _, proj, _, mlp = engine.model.trained.model.layers[0]._sets(False)
    for p in (proj.q_proj, proj.k_proj, proj.v_proj, proj.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj):
        assert isinstance(p, GGMLLinear) and p.codes.numel() == 0


def test_formats_without_a_block_packer_are_dequantized_and_prepared_as_before(tmp_path, monkeypatch):
    from tests.gguf_utils import write_tiny_llama_gguf

    needs_row_kernel()
    tiny = write_tiny_llama_gguf(
        tmp_path / "q4km.gguf", quant="Q4_K_M", hidden=256, intermediate=512, heads=4
    )
    assert_loads_alike(tiny.path, "float32", monkeypatch, tokens=6)


def test_where_the_kernels_are_not_the_row_kernels_every_matrix_is_dequantized(tiny_gguf, monkeypatch):
    needs_row_kernel()
    monkeypatch.setattr(float_codes, "direct", lambda int4, rows: False)
    engine = yue.load(tiny_gguf.path, dtype="float32")
    layer = engine.model.trained.model.layers[0]
    assert not any(isinstance(m, GGMLLinear) for m in layer.modules())
    assert_loads_alike(tiny_gguf.path, "float32", monkeypatch)


@pytest.mark.slow
@pytest.mark.parametrize("dtype", [None, "int4"])
def test_yue_smol_prepares_the_same_bytes_from_its_blocks(dtype, monkeypatch):
    needs_row_kernel()
    try:
        assert_loads_alike("yue-smol", dtype, monkeypatch, tokens=16)
    except ModelNotInstalledError as e:
        pytest.skip(str(e))


def test_the_head_screen_from_q8_0_blocks_is_the_screen_of_the_values():
    """`screen.ScreenedHead` from a Q8_0 table's blocks (llama.cpp's form: a code of 127 a block) and from its
    values: the same codes, scales and bounds; a chunk with a block out of that form takes the values'
    path, with the same result."""
    from yue.kernels import screen

    needs_row_kernel()
    V, D = screen.CHUNK + 40, 64
    blocks = random_blocks(8, V, D, 1).reshape(V, D // 32, 34)
    q = blocks[..., 2:].view(torch.int8)
    q[..., 0] = 127
    d = blocks[..., :2].contiguous().view(torch.float16)
    blocks[..., :2] = d.abs().clamp(min=1e-4).view(torch.uint8)
    q[3, 1] = q[3, 1].clamp(-100, 100)  # a block of the first chunk out of form
    rows = blocks.reshape(V, -1)
    values = dequantized(rows, 8)
    assert screen.q8_0_chunk(rows[: screen.CHUNK], D // 32) is None
    assert screen.q8_0_chunk(rows[screen.CHUNK :], D // 32) is not None
    a, b = screen.ScreenedHead(None, values), screen.ScreenedHead(None, values, rows)
    for x, y in ((a.codes[0], b.codes[0]), (a.slack[0], b.slack[0]), (a.wnorm[0], b.wnorm[0])):
        assert torch.equal(x, y)
