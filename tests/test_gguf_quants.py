"""GGUF tensor types F32, F16, BF16, Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K: each converts to exactly the
values ggml's block format gives (a reference dequantizer of the test's own, `quant_reference`), the
model's float32 logits are transformers' on those values, and Q4_0 weights, like Q4_1's, run from their
4-bit codes on the row kernel with the float32 bits (model/gguf.py, rowkernel.c `rows_q4_pack`)."""

from __future__ import annotations

import logging
import re

import pytest
import torch
from safetensors.torch import load_file

from tests.family_utils import write_family_gguf
from tests.test_precision import gguf_round_trip
from tests.test_rowkernel import needs_row_kernel
from tests.test_topnar import top_model
from yue.config import DecodeConfig
from yue.decode.loop import decode
from yue.model import inference, rowkernel
from yue.model.gguf import convert_gguf
from yue.model.hf import load_model

pytestmark = pytest.mark.usefixtures("gguf_cache")
TYPES = ["F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q4_K", "Q5_K", "Q6_K"]
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


@pytest.mark.parametrize("out, inp", [(40, 64), (96, 128), (7, 32)])
def test_q4_0_weights_are_held_as_codes_with_the_float_kernels_bits(out, inp):
    needs_row_kernel()
    w = gguf_round_trip(torch.randn(out, inp, generator=torch.Generator().manual_seed(out)) / 10, "Q4_0")
    packed = rowkernel.q4_block(w)
    assert packed is not None and rowkernel.layout(packed) == "q4"
    full = rowkernel.block(w)
    g = torch.Generator().manual_seed(1)
    for rows in (*range(1, 10), 13):
        x = torch.randn(rows, inp, generator=g)
        assert torch.equal(rowkernel.matmul(x, packed, out), rowkernel.matmul(x, full, out)), rows
    nudged = w.clone()
    nudged[3, 5] = torch.nextafter(nudged[3, 5], torch.tensor(1.0))  # one value off by one ulp
    assert rowkernel.q4_block(nudged) is None


def test_a_q4_0_model_decodes_from_codes_with_verified_equal_to_ar(monkeypatch):
    """A model whose AR layers hold Q4_0 values: prepared, every layer's weights are 4-bit codes, and its
    tokens are those of the model as stored, `ar` and `verified` alike."""
    needs_row_kernel()
    monkeypatch.setattr(inference, "ROW_STREAM_BYTES", 0)  # the row kernel even for a tiny model
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
    model.prepare_for_decoding(None)
    assert [rowkernel.layout(layer.decode_sets[0].blocked[0]) for layer in model.model.layers] == ["q4"] * 4
    assert run(model, "ar") == stored and run(model, "verified") == stored
