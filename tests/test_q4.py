"""The row kernel's float32 weights held as 4-bit codes (`rowkernel.q4_block`, `rows_matmul_q4`) and
8-bit ones (`rowkernel.q8_block`, `rows_matmul_q8`): a Q4_1 / Q8_0 weight gives the float kernel's bits
back for every row count and stride, anything else is refused, the portable builds agree, and a model's
tokens do not change."""

from __future__ import annotations

import pytest
import torch

from tests.test_precision import gguf_round_trip, q4_weights, row_stream_model
from tests.test_rowkernel import fresh_build, needs_row_kernel  # noqa: F401 (a fixture)
from tests.test_topnar import top_model
from yue.config import DecodeConfig
from yue.decode.loop import decode
from yue.kernels import prepare_for_decoding, probe, rowkernel
from yue.kernels.decode_set import decode_layout

# Each kind of codes: its GGUF quantization, packer and bytes a weight (outputs padded to 32).
CODES = {"q4": ("Q4_1", rowkernel.q4_block, 0.75), "q8": ("Q8_0", rowkernel.q8_block, 1.125)}


def gguf_like(kind: str, out: int, inp: int, seed: int = 0) -> torch.Tensor:
    """An (out, in) weight as a GGUF of that kind loads (`gguf_round_trip` of a random one)."""
    w = torch.randn(out, inp, generator=torch.Generator().manual_seed(seed)) / 10
    return gguf_round_trip(w, CODES[kind][0])


@pytest.mark.parametrize("kind", CODES)
@pytest.mark.parametrize("out, inp", [(40, 64), (96, 128), (7, 32), (200, 96)])
def test_codes_give_the_float_kernels_bits_for_every_row_count(kind, out, inp):
    needs_row_kernel()
    _, pack, size = CODES[kind]
    w = gguf_like(kind, out, inp)
    packed = pack(w)
    assert packed is not None and rowkernel.layout(packed) == kind
    assert torch.equal(pack(w.t().contiguous().t()), packed)  # input-major storage too
    assert packed.numel() == -(-out // 32) * 32 * inp * size
    full = rowkernel.block(w)
    g = torch.Generator().manual_seed(1)
    for rows in (*range(1, 10), 10, 13, 20, 64):  # past 9 rows: a float tile, several passes (a prefill)
        x = torch.randn(rows, inp, generator=g)
        assert torch.equal(rowkernel.matmul(x, packed, out), rowkernel.matmul(x, full, out)), rows
        torch.testing.assert_close(rowkernel.matmul(x, packed, out), x @ w.t(), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("kind", CODES)
def test_the_packers_write_the_same_bytes_and_refuse_alike_on_any_thread_count(kind):
    """The packers split column blocks over torch's threads (`rows_q4_pack`, `codes_pack`): the bytes
    are the one-thread ones, and a group without codes, in the last block, is refused at any count."""
    needs_row_kernel()
    _, pack, _ = CODES[kind]
    w = gguf_like(kind, 1000, 96)
    nudged = w.clone()
    nudged[-1, 50] = torch.nextafter(nudged[-1, 50], torch.tensor(1.0))
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = pack(w)
        for n in (2, 3, 8):
            torch.set_num_threads(n)
            assert torch.equal(pack(w), alone), n
            assert torch.equal(pack(w.t().contiguous().t()), alone), n
            assert pack(nudged) is None, n
    finally:
        torch.set_num_threads(threads)


@pytest.mark.parametrize("kind", CODES)
def test_a_weight_that_codes_cannot_give_back_is_refused(kind):
    needs_row_kernel()
    _, pack, _ = CODES[kind]
    w = gguf_like(kind, 40, 64)
    nudged = w.clone()
    nudged[17, 40] = torch.nextafter(nudged[17, 40], torch.tensor(1.0))  # one value off by one ulp
    with_nan = w.clone()
    with_nan[3, 3] = float("nan")
    for refused in (torch.randn(40, 64), nudged, with_nan, w[:, :48], w.to(torch.bfloat16)):
        assert pack(refused) is None
    other = "q8" if kind == "q4" else "q4"
    assert CODES[other][1](w) is None  # each kind refuses the other's weights


@pytest.mark.parametrize("flags, lanes", [([], 8), (["-DYUE_LANES=16"], 16)])
def test_the_codes_kernels_portable_builds(flags, lanes, fresh_build, monkeypatch):  # noqa: F811
    """The plain flag set (no -march: the portable nibble and widening loops and fmaf) gives the same bits
    as its own float kernel, with 8-float vectors (AVX2's layout) and 16 (AVX512's: one pair of vectors
    a block, 9 rows a pass), so both layouts run here whatever this CPU has."""
    monkeypatch.setattr(rowkernel, "FLAG_SETS", (flags,))
    needs_row_kernel()
    assert rowkernel.library().rows_lanes() == lanes
    for kind in CODES:
        for out, inp in ((40, 64), (7, 32)):
            test_codes_give_the_float_kernels_bits_for_every_row_count(kind, out, inp)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_q4_model_writes_the_tokens_its_float32_weights_write(seed):
    """A random model whose AR layers hold Q4_1 values: prepared, its layers hold the codes alone and
    its greedy `ar` and `verified` write what the same model with float32 weights in the row kernel
    does (`rows-q4` forced off); its step costs are keyed apart."""
    coded = row_stream_model(seed, q4=True)
    assert "4-bit codes" in decode_layout(coded)
    with probe.forced("rows-q4"):
        floats = prepare_for_decoding(
            q4_weights(top_model(2, seed=seed)), torch.qint8 if probe.int8_engine() else None
        )
    assert "4-bit codes" not in decode_layout(floats)
    prompt = torch.randint(4, 96, (9,), generator=torch.Generator().manual_seed(seed)).tolist()

    def run(model, mode: str) -> list[int]:
        cfg = DecodeConfig(mode=mode, max_new_tokens=24, ignore_eos=True, router_threshold=1.0)
        return [t for em in decode(model, [prompt], cfg.resolved(model.config)) for t in em.tokens[0]]

    expected = run(floats, "ar")
    assert run(coded, "ar") == expected
    assert run(coded, "verified") == expected


@pytest.mark.parametrize("seed", [0, 1])
def test_a_q8_head_gives_the_float32_heads_logits_and_tokens(seed):
    """A random model whose tied head holds Q8_0 values: prepared, its head (under the screen) holds the
    8-bit codes alone, its full logits are the float32 head's bits (`rows-q8` forced off), and greedy
    and sampled `ar` and `verified` write the same tokens as on the float32 head (sampled `verified`
    keeps `ar`'s distribution, not its tokens, so each mode is compared with itself); its step costs
    are keyed apart."""
    coded = row_stream_model(seed, q8_head=True)
    floats = row_stream_model(seed, q8_head=True, off=("rows-q8",))
    assert "head 8-bit codes" in decode_layout(coded) and "head 8-bit codes" not in decode_layout(floats)
    x = torch.randn(5, coded.config.hidden_size, generator=torch.Generator().manual_seed(seed))
    assert torch.equal(coded.paths.ar_head(x), floats.paths.ar_head(x))
    prompt = torch.randint(4, 96, (9,), generator=torch.Generator().manual_seed(seed)).tolist()

    def run(model, mode: str, temperature: float) -> list[int]:
        cfg = DecodeConfig(mode=mode, max_new_tokens=24, ignore_eos=True, temperature=temperature, seed=seed)
        return [t for em in decode(model, [prompt], cfg.resolved(model.config)) for t in em.tokens[0]]

    for temperature in (0.0, 0.8):
        for mode in ("ar", "verified"):
            assert run(coded, mode, temperature) == run(floats, mode, temperature), (mode, temperature)
