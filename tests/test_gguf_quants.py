"""GGUF tensor types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q5_0, Q4_K, Q5_K and Q6_K: each converts to exactly
the values ggml's block format gives (a reference dequantizer of the test's own, `quant_reference`), the
model's float32 logits are transformers' on those values, and Q4_0 and Q4_K weights, like Q4_1's, run
from their 4-bit codes on the row kernel with the float32 bits (model/gguf.py, rowkernel.c
`rows_q4_pack`), Q5_0 weights (Q4_K_M's where rows are not a multiple of 256) from 8-bit codes, like
Q8_0's (`rows_q8_pack`), Q6_K weights from 8-bit codes with a scale per 16 inputs (`rows_q6_pack`); Q5_K
runs as float32."""

from __future__ import annotations

import logging
import re

import gguf
import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from tests import quant_reference
from tests.family_utils import write_family_gguf
from tests.test_precision import gguf_round_trip
from tests.test_rowkernel import fresh_build, needs_row_kernel  # noqa: F401 (a fixture)
from tests.test_topnar import top_model
from yue.config import DecodeConfig
from yue.decode.loop import decode
from yue.kernels import prepare_for_decoding, rowkernel
from yue.model.gguf import convert_gguf
from yue.model.hf import load_model

pytestmark = pytest.mark.usefixtures("gguf_cache")
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q4_K", "Q5_K", "Q6_K"]
# Every matmul's inputs a multiple of 256, as the K-quants' super-blocks need.
SHAPE_256 = dict(
    hidden_size=256, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2, head_dim=64
)
IDS = torch.tensor([[1, 5, 17, 40, 2, 100, 12, 50, 9, 33, 7, 8]])


@pytest.mark.parametrize("quant", TYPES)
def test_each_type_converts_to_the_reference_values_and_transformers_logits(tmp_path, quant, caplog):
    path = tmp_path / f"tiny-{quant}.gguf"
    reference = write_family_gguf(path, "qwen3", quant, **SHAPE_256)
    with caplog.at_level(logging.WARNING, logger="yue"):
        folder = convert_gguf(path)
    logged = re.search(r"its ([\w/]+) tensors dequantized once to float32", caplog.text)
    assert logged and quant in logged.group(1).split("/")  # the file's types, said in the log
    stored = load_file(str(folder / "model.safetensors"))
    expected = reference.state_dict()
    assert stored.keys() <= expected.keys()
    for name, value in stored.items():
        assert value.dtype == torch.float32 and torch.equal(value, expected[name]), name
    with torch.no_grad():
        assert torch.equal(load_model(path)(IDS).logits, reference(IDS).logits)


def quantized(kind: str, out: int, inp: int, seed: int = 0) -> torch.Tensor:
    """An (out, in) float32 weight as a GGUF of type `kind` loads: llama.cpp's quantizer where the `gguf`
    package has it, random valid blocks for the K-quants (inputs a multiple of 256)."""
    qtype = gguf.GGMLQuantizationType[kind]
    if kind in ("Q4_K", "Q5_K", "Q6_K"):
        data = quant_reference.random_blocks((out, inp), qtype, np.random.default_rng(seed))
        return torch.from_numpy(quant_reference.dequantize(data, qtype, (out, inp)))
    return gguf_round_trip(torch.randn(out, inp, generator=torch.Generator().manual_seed(seed)) / 10, kind)


def assert_codes_give_the_float_bits(w: torch.Tensor, pack, kind: str) -> torch.Tensor:
    """`pack(w)` holds w's codes (`rowkernel.layout` `kind`) whose products are the float kernel's bits
    at every row count (1-9 rows a pass, and 13), and refuses w with one value off by an ulp; returns it."""
    out, inp = w.shape
    packed = pack(w)
    assert packed is not None and rowkernel.layout(packed) == kind
    full = rowkernel.block(w)
    g = torch.Generator().manual_seed(1)
    for rows in (*range(1, 10), 13):
        x = torch.randn(rows, inp, generator=g)
        assert torch.equal(rowkernel.matmul(x, packed, out), rowkernel.matmul(x, full, out)), rows
    nudged = w.clone()
    nudged[3, 5] = torch.nextafter(nudged[3, 5], torch.tensor(1.0))  # one value off by one ulp
    assert pack(nudged) is None
    return packed


@pytest.mark.parametrize(
    ("kind", "out", "inp"), [("Q4_0", 40, 64), ("Q4_0", 7, 32), ("Q4_K", 96, 512), ("Q4_K", 7, 256)]
)
def test_q4_0_and_q4_k_weights_are_held_as_codes_with_the_float_kernels_bits(kind, out, inp):
    needs_row_kernel()
    w = quantized(kind, out, inp)
    assert_codes_give_the_float_bits(w, rowkernel.q4_block, "q4")
    # The int4 precision takes the same codes, scales and minimums: its weights are the file's.
    codes, d, m = rowkernel.q4_groups(w, float16_scale=True)
    assert torch.equal((codes * d + m).reshape(out, inp), w) and 0 <= codes.min() <= codes.max() <= 15


@pytest.mark.parametrize("flags, lanes", [([], 8), (["-DYUE_LANES=16"], 16)])
def test_q4_0_and_q4_k_codes_on_the_portable_builds(flags, lanes, fresh_build, monkeypatch):  # noqa: F811
    """The Q4_0, Q4_K and Q6_K forms with the fast flag sets forced off (no -march: the portable loops), with
    AVX2's 8-float layout and AVX512's 16, whatever this CPU has: the same bits as the float kernel."""
    monkeypatch.setattr(rowkernel, "FLAG_SETS", (flags,))
    needs_row_kernel()
    assert rowkernel.library().rows_lanes() == lanes
    for kind, out, inp in (("Q4_0", 40, 64), ("Q4_K", 7, 256)):
        test_q4_0_and_q4_k_weights_are_held_as_codes_with_the_float_kernels_bits(kind, out, inp)
    test_q6_k_weights_are_held_as_8_bit_codes_per_16_inputs_with_the_float_kernels_bits(7, 256)


@pytest.mark.parametrize(("kind", "out", "inp"), [("Q5_0", 40, 64), ("Q5_0", 7, 640), ("Q8_0", 9, 96)])
def test_q5_0_and_q8_0_weights_are_held_as_8_bit_codes_with_the_float_kernels_bits(kind, out, inp):
    needs_row_kernel()
    w = quantized(kind, out, inp)
    assert rowkernel.q4_block(w) is None  # 5-bit codes have no 4-bit form
    assert_codes_give_the_float_bits(w, rowkernel.q8_block, "q8")


def test_q5_k_weights_stay_float32():
    """5-bit codes with a scale and a minimum per 32 inputs have no 4-bit or 8-bit form here: these
    weights run as the float32 values they load as."""
    needs_row_kernel()
    w = quantized("Q5_K", 32, 256)
    assert rowkernel.q4_block(w) is None and rowkernel.q8_block(w) is None and rowkernel.q6_block(w) is None


@pytest.mark.parametrize(("out", "inp"), [(96, 512), (7, 256)])
def test_q6_k_weights_are_held_as_8_bit_codes_per_16_inputs_with_the_float_kernels_bits(out, inp):
    """A Q6_K weight ((d * sc) * q, a scale per 16 inputs: no 4-bit form, nor 8-bit codes with one scale
    per 32) is held as 8-bit codes with a scale per 16 (`rowkernel.q6_block`, 1.25 bytes a weight),
    whose products are the float kernel's bits at every row count; one value off by an ulp is refused."""
    needs_row_kernel()
    w = quantized("Q6_K", out, inp)
    assert rowkernel.q4_block(w) is None and rowkernel.q8_block(w) is None
    packed = assert_codes_give_the_float_bits(w, rowkernel.q6_block, "q6")
    assert rowkernel.inputs(packed) == inp
    assert packed.numel() == -(-out // rowkernel.library().rows_block()) * 32 * inp * 1.25
    assert rowkernel.q6_block(torch.randn(out, inp)) is None  # a trained weight is no such thing


def test_a_q4_0_model_decodes_from_codes_with_verified_equal_to_ar():
    """A model whose AR layers hold Q4_0 values: prepared, every layer's weights are 4-bit codes, and its
    tokens are those of the model as stored, `ar` and `verified` alike."""
    needs_row_kernel()
    model = top_model(2, seed=3)
    with torch.no_grad():
        for layer in model.model.layers:
            for proj in (layer.self_attn, layer.mlp):
                for linear in proj.children():
                    linear.weight.copy_(gguf_round_trip(linear.weight, "Q4_0"))
    prompt = torch.randint(4, 96, (7,), generator=torch.Generator().manual_seed(3)).tolist()

    def run(m, mode: str) -> list[int]:
        cfg = DecodeConfig(mode=mode, max_new_tokens=24, ignore_eos=True).resolved(m.config)
        return [t for em in decode(m, [prompt], cfg) for t in em.tokens[0]]

    stored = run(model, "ar")
    model = prepare_for_decoding(model, None)
    assert [rowkernel.layout(sets[0].blocked[0]) for sets in model.paths.layers] == ["q4"] * 4
    assert run(model, "ar") == stored and run(model, "verified") == stored


@pytest.mark.parametrize("quant", ["Q4_0", "Q4_K"])
def test_a_4_bit_llama_gguf_runs_from_its_codes_with_transformers_tokens(tmp_path, quant):
    """A Llama 3 GGUF whose every matrix is Q4_0 (or Q4_K): on the row kernel each layer's weights are
    held as 4-bit codes, and `ar` is transformers' greedy on the dequantized values."""
    import yue

    needs_row_kernel()
    reference = write_family_gguf(tmp_path / "m.gguf", "llama3", quant, **SHAPE_256)
    engine = yue.load(tmp_path / "m.gguf", dtype="float32")
    layers = engine.model.paths.layers
    assert [rowkernel.layout(sets[0].blocked[0]) for sets in layers] == ["q4"] * len(layers)
    ids = engine.encode("Hello, world! How are")
    ours = engine.generate("Hello, world! How are", mode="ar", max_new_tokens=12, ignore_eos=True).token_ids
    expected = reference.generate(
        torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert ours == expected[0, len(ids) :].tolist()
