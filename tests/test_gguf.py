"""GGUF files load as an AR set with the GGUF's own values, through a cache that is reused and never
trusted when corrupt (model/gguf.py, model/hf.py)."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from transformers import AutoModelForCausalLM, LlamaForCausalLM

import yue
from yue.errors import CheckpointError
from yue.model import gguf as gguf_mod
from yue.model.gguf import MANIFEST, convert_gguf, file_sha256
from yue.model.hf import load_model

pytestmark = pytest.mark.usefixtures("gguf_cache")
IDS = torch.tensor([[1, 5, 17, 40, 2, 100, 200, 250, 9, 33]])


def test_gguf_loads_as_an_ar_set_whose_logits_equal_transformers_llama(tiny_gguf):
    model = load_model(tiny_gguf.path)
    assert model.config.nar_layers == 0
    hf_gguf = AutoModelForCausalLM.from_pretrained(
        str(tiny_gguf.path.parent), gguf_file=tiny_gguf.path.name, dtype=torch.float32
    ).eval()
    with torch.no_grad():
        ours = model(IDS).logits
        assert torch.equal(ours, tiny_gguf.reference_model()(IDS).logits)  # the values written
        assert torch.equal(ours, hf_gguf(IDS).logits)  # transformers' own GGUF loader


def test_converted_folder_is_a_plain_llama_checkpoint_with_the_gguf_values(tiny_gguf):
    folder = convert_gguf(tiny_gguf.path)
    llama = LlamaForCausalLM.from_pretrained(str(folder), dtype=torch.float32)
    state = llama.state_dict()
    for name, value in tiny_gguf.state_dict.items():
        assert torch.equal(state[name], value), name
    manifest = json.loads((folder / MANIFEST).read_text())
    assert manifest["source"]["sha256"] == file_sha256(tiny_gguf.path)
    assert folder.name == manifest["source"]["sha256"][:16]
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"} <= set(
        manifest["files"]
    )
    assert "chat_template" in json.loads((folder / "tokenizer_config.json").read_text())


def test_ar_decoding_equals_transformers_greedy_generate(tiny_gguf):
    engine = yue.load(tiny_gguf.path, dtype="float32")
    prompt = "Hello, world! How are"
    ids = engine.encode(prompt)
    ours = engine.generate(prompt, mode="ar", max_new_tokens=12, ignore_eos=True).token_ids
    ref = tiny_gguf.reference_model().generate(
        torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=2
    )
    assert ours == ref[0, len(ids) :].tolist()


def test_a_second_load_reuses_the_conversion(tiny_gguf, monkeypatch):
    calls = []
    convert = gguf_mod._convert
    monkeypatch.setattr(gguf_mod, "_convert", lambda *a: calls.append(a) or convert(*a))
    first = convert_gguf(tiny_gguf.path)
    mtime = (first / "model.safetensors").stat().st_mtime_ns
    assert convert_gguf(tiny_gguf.path) == first
    load_model(tiny_gguf.path)
    assert len(calls) == 1 and (first / "model.safetensors").stat().st_mtime_ns == mtime


@pytest.mark.parametrize("damage", ["flip_a_byte", "truncate", "no_manifest", "stray_folder"])
def test_a_corrupt_or_incomplete_cache_is_rebuilt_with_a_warning(tiny_gguf, damage, caplog):
    folder = convert_gguf(tiny_gguf.path)
    weights = folder / "model.safetensors"
    good = weights.read_bytes()
    if damage == "flip_a_byte":
        data = bytearray(good)
        data[-5] ^= 0xFF  # a value deep in the last tensor: same size, still parses
        weights.write_bytes(bytes(data))
    elif damage == "truncate":
        weights.write_bytes(good[: len(good) // 2])
    elif damage == "no_manifest":  # as an interrupted copy would leave it
        (folder / MANIFEST).unlink()
    else:  # a folder under the right name that holds something else entirely
        for p in folder.iterdir():
            p.unlink()
        (folder / "config.json").write_text("{}")
    with caplog.at_level(logging.WARNING, logger="yue"):
        assert convert_gguf(tiny_gguf.path) == folder
    assert any("unusable" in r.message for r in caplog.records)
    assert weights.read_bytes() == good
    with torch.no_grad():
        assert torch.equal(load_model(tiny_gguf.path)(IDS).logits, tiny_gguf.reference_model()(IDS).logits)


def test_unsupported_or_missing_gguf_files_are_named(tmp_path, tiny_gguf):
    with pytest.raises(CheckpointError, match="not found"):
        convert_gguf(tmp_path / "nope.gguf")
    bogus = tmp_path / "bogus.gguf"
    bogus.write_bytes(b"NOTAGGUF" * 8)
    with pytest.raises(CheckpointError, match="bogus.gguf"):
        load_model(bogus)
    from tests.gguf_utils import write_tiny_llama_gguf

    untied = write_tiny_llama_gguf(tmp_path / "untied.gguf", tie_word_embeddings=False, quant="Q8_0")
    with torch.no_grad():  # an untied head (output.weight) and another block type load too
        assert torch.equal(load_model(untied.path)(IDS).logits, untied.reference_model()(IDS).logits)


def test_an_ar_only_model_refuses_drafting_modes_naming_itself(tiny_gguf):
    engine = yue.load(tiny_gguf.path)
    assert engine.default_mode == "ar" and not engine.has_nar_set
    for mode in ("hybrid", "nar"):  # `verified` runs on copies from the context (tests/test_topnar.py)
        with pytest.raises(ValueError, match="tiny.*mode 'ar'"):
            engine.generate("Hello", mode=mode, max_new_tokens=2)
    verified = engine.generate("Hello", mode="verified", max_new_tokens=8, ignore_eos=True).token_ids
    assert verified == engine.generate("Hello", mode="ar", max_new_tokens=8, ignore_eos=True).token_ids
    # A call naming no mode gets the model's default (`ar`), in the library as in the CLI.
    assert engine.generate("Hello", max_new_tokens=2, ignore_eos=True).token_ids
    assert len(list(engine.stream("Hello", max_new_tokens=2))) >= 1
