"""Model families (Llama 3, Qwen2, Qwen3, Gemma 3, Mistral) load from a Hugging Face folder and from a
GGUF file as an AR set whose float32 logits are transformers' bit for bit; decoding keeps `ar` equal to
transformers' greedy output and `verified` equal to `ar`; what the layer cannot run is refused by name
(model/family.py, config.Features, model/layers.py)."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from tests.family_utils import FAMILY_NAMES, GGUF_ARCHS, WINDOW, save_family, tiny_family, write_family_gguf
from tests.test_precision import assert_one_call_is_parts
from tests.test_rowkernel import needs_row_kernel
from yue.config import DecodeConfig, Features
from yue.decode.loop import decode
from yue.errors import CheckpointError
from yue.kernels import prepare_for_decoding
from yue.model.decode_paths import exact_rows
from yue.model.hf import from_llama, load_model

pytestmark = pytest.mark.usefixtures("gguf_cache")
# Longer than the sliding window, so that windowed layers see fewer keys than the others.
PROMPT = [1, 5, 17, 40, 2, 100, 12, 50, 9, 33, 7, 8, 60, 61]
assert len(PROMPT) > WINDOW
IDS = torch.tensor([PROMPT])
FAMILY = {"llama3": "llama", "gemma3": "gemma3_text"}  # test name -> model_type, where they differ


def greedy(model, mode: str, n: int = 20) -> list[int]:
    cfg = DecodeConfig(mode=mode, max_new_tokens=n, ignore_eos=True).resolved(model.config)
    return [t for em in decode(model, [PROMPT], cfg) for t in em.tokens[0]]


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_a_family_folder_loads_with_transformers_logits_bit_for_bit(tmp_path, name):
    reference = save_family(name, tmp_path)
    model = load_model(tmp_path)
    assert model.config.family == FAMILY.get(name, name) and model.config.nar_layers == 0
    assert model.config.layer_features != Features()  # each test family differs from Llama 2
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, reference(IDS).logits)


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_a_family_decodes_as_transformers_greedy_and_verified_equals_ar(name):
    reference = tiny_family(name)
    expected = reference.generate(IDS, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    # A NAR set over the family's AR set (untrained: a copy of it), decoded as stored and as prepared.
    model = from_llama(reference, block_size=4).eval()
    prepared = prepare_for_decoding(copy.deepcopy(model), torch.qint8)
    ar = greedy(model, "ar")
    assert ar == expected[0, len(PROMPT) :].tolist()
    assert greedy(model, "verified") == ar
    assert greedy(prepared, "ar") == ar and greedy(prepared, "verified") == ar


@pytest.mark.parametrize("name", FAMILY_NAMES)
def test_a_family_on_the_row_kernel_keeps_transformers_tokens_and_int4_verified_equal_to_ar(name):
    """Prepared on yue's row kernel (row-exact matmuls and attention, each layer one call with the
    family's features in it), a family's `ar` is transformers' greedy and `verified` equals it; in the
    int4 precision (another precision: its own tokens) `verified` equals `ar` too."""
    needs_row_kernel()
    reference = tiny_family(name)
    expected = reference.generate(IDS, max_new_tokens=20, do_sample=False, eos_token_id=None, pad_token_id=0)
    model = from_llama(reference, block_size=4, nar_layers=1).eval()
    fast = prepare_for_decoding(copy.deepcopy(model), torch.qint8)
    assert all(exact_rows(sets) for sets in fast.paths.layers)
    # Each layer one row-kernel call, the family's extras in it, and a step's layers one call.
    assert all(sets[0].one_layer is not None for sets in fast.paths.layers) and False in fast.paths.stacks
    assert greedy(fast, "ar") == expected[0, len(PROMPT) :].tolist()
    assert greedy(fast, "verified") == greedy(fast, "ar")
    int4 = prepare_for_decoding(copy.deepcopy(model), torch.qint8, int4=True)
    assert greedy(int4, "verified") == greedy(int4, "ar")


@pytest.mark.parametrize("name", ["gemma3", "qwen3", "qwen2", "mistral"])
@pytest.mark.parametrize("batch", [1, 2])
def test_a_family_layer_is_one_row_kernel_call_computing_what_its_parts_do(name, batch):
    """A family's layer on the row kernel is one call (`rowstack`: Gemma's (1 + w) and sandwich norms,
    GeGLU, Q/K norms, QKV biases, sliding-window layers with their own RoPE base; the MLP 100 wide, so
    that GeGLU's tail past whole vectors runs too), whose logits and cache are the same model's layers
    in parts (torch around the fused matmuls) over prompts and steps that cross the window, in a
    left-padded batch; the stack's bits are its layers' one calls'."""
    needs_row_kernel()
    model = from_llama(tiny_family(name, intermediate_size=100), block_size=4, nar_layers=1).eval()
    fast = prepare_for_decoding(model, torch.qint8)
    assert all(sets[0].one_layer is not None for sets in fast.paths.layers)
    if name in ("gemma3", "mistral"):
        assert any(layer.sliding for layer in fast.trained.model.layers)
    assert_one_call_is_parts(fast, batch)


def test_the_window_and_the_local_rope_change_what_gemma_computes(tmp_path):
    """The features are not inert: without its sliding window (or its local RoPE base) the same weights
    give other logits, so the equality above tests them."""
    save_family("gemma3", tmp_path)
    model = load_model(tmp_path)
    features = model.config.layer_features
    with torch.no_grad():
        logits = model(IDS).logits
        for change in (dict(sliding_window=None), dict(local_rope_theta=None)):
            config = copy.deepcopy(model.config)
            config.features = Features(**(vars(features) | change)).to_dict()
            other = type(model)(config).eval()
            other.load_state_dict(model.state_dict())
            assert not torch.allclose(other(IDS).logits, logits, atol=1e-3), change


@pytest.mark.parametrize("name", GGUF_ARCHS)
@pytest.mark.parametrize("quant", ["F32", "Q8_0"])
def test_a_family_gguf_loads_with_transformers_logits_bit_for_bit(tmp_path, name, quant):
    reference = write_family_gguf(tmp_path / f"{name}.gguf", name, quant)
    model = load_model(tmp_path / f"{name}.gguf")
    assert model.config.family == FAMILY.get(name, name)
    with torch.no_grad():
        assert torch.equal(model(IDS).logits, reference(IDS).logits)


def test_a_qwen2_gguf_matches_transformers_own_gguf_loader(tmp_path):
    """transformers' GGUF loader reads the same values (its Qwen3 and Gemma 3 readers ignore the file's
    head_dim and query scale, so only Qwen2's shapes can be compared this way)."""
    write_family_gguf(tmp_path / "q.gguf", "qwen2", "Q8_0")
    theirs = AutoModelForCausalLM.from_pretrained(
        str(tmp_path), gguf_file="q.gguf", dtype=torch.float32
    ).eval()
    with torch.no_grad():
        assert torch.equal(load_model(tmp_path / "q.gguf")(IDS).logits, theirs(IDS).logits)


@pytest.mark.parametrize(
    ("name", "change", "named"),
    [
        ("gemma3", dict(final_logit_softcapping=30.0), "final_logit_softcapping"),
        ("gemma3", dict(attn_logit_softcapping=50.0), "attn_logit_softcapping"),
        ("qwen2", dict(use_sliding_window=True), "use_sliding_window"),
        ("qwen3", dict(attention_bias=True), "attention_bias"),
        ("llama3", dict(mlp_bias=True), "mlp_bias"),
        ("llama3", dict(rope_parameters={"rope_type": "linear", "rope_theta": 1e4, "factor": 4.0}), "linear"),
        ("mistral", dict(hidden_act="gelu"), "hidden_act"),
    ],
)
def test_an_unsupported_feature_is_refused_by_name(tmp_path, name, change, named):
    model = tiny_family(name)
    for key, value in change.items():
        setattr(model.config, key, value)
    model.save_pretrained(str(tmp_path))
    with pytest.raises(CheckpointError, match=named):
        load_model(tmp_path)


def test_an_unsupported_family_is_refused_naming_the_supported_ones(tmp_path):
    from transformers import GPT2Config, GPT2LMHeadModel

    GPT2LMHeadModel(GPT2Config(n_embd=32, n_layer=1, n_head=2, vocab_size=64)).save_pretrained(str(tmp_path))
    with pytest.raises(CheckpointError, match="'gpt2' is not supported.*qwen3"):
        load_model(tmp_path)


def test_llama3_rope_parameters_come_back_from_llama_cpp_factors_or_the_file_is_refused(tmp_path):
    """A GGUF keeps Llama 3's RoPE scaling as llama.cpp's per-frequency factors (`rope_freqs`): Llama
    3.1's parameters are read back from them exactly; factors no parameters give are refused by name."""
    from yue.model.gguf_names import llama3_factors, llama3_rope_parameters

    llama31 = dict(
        rope_type="llama3",
        rope_theta=500000.0,
        factor=8.0,
        low_freq_factor=1.0,
        high_freq_factor=4.0,
        original_max_position_embeddings=8192,
    )
    factors = llama3_factors(500000.0, 128, llama31)
    assert 1.0 < factors[31] < 8.0  # some frequencies lie between the bands
    assert llama3_rope_parameters(factors, 500000.0, 128, {}, tmp_path) == llama31
    factors[31] *= 1.001
    with pytest.raises(CheckpointError, match="rope_freqs"):
        llama3_rope_parameters(factors, 500000.0, 128, {}, tmp_path)


@pytest.mark.parametrize("name", ["qwen3", "gemma3"])
def test_a_family_gguf_runs_in_the_engine_with_its_chat_template(tmp_path, name):
    """`yue.load` on a family's GGUF: the file's tokenizer and chat template, and `ar` is transformers'
    greedy on the same weights."""
    import json

    import yue
    from yue.model.gguf import convert_gguf

    reference = write_family_gguf(tmp_path / f"{name}.gguf", name, "Q8_0")
    engine = yue.load(tmp_path / f"{name}.gguf", dtype="float32")
    prompt = "Hello, world! How are"
    ids = engine.encode(prompt)
    ours = engine.generate(prompt, mode="ar", max_new_tokens=12, ignore_eos=True).token_ids
    expected = reference.generate(
        torch.tensor([ids]), max_new_tokens=12, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    assert ours == expected[0, len(ids) :].tolist()
    folder = convert_gguf(tmp_path / f"{name}.gguf")
    assert "<|im_start|>" in json.loads((folder / "tokenizer_config.json").read_text())["chat_template"]


def test_a_llama3_ar_set_exports_as_transformers_llama_and_other_families_are_refused(tmp_path):
    from yue.model.hf import export_ar

    for name in ("llama3", "qwen3"):
        save_family(name, tmp_path / name)
    model = load_model(tmp_path / "llama3")
    folder = export_ar(model, tmp_path / "exported")
    exported = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert exported.config.rope_parameters["rope_type"] == "llama3"
    with torch.no_grad():
        assert torch.equal(exported(IDS).logits, model(IDS).logits)
    with pytest.raises(ValueError, match="qwen3, not a Llama"):
        export_ar(load_model(tmp_path / "qwen3"), tmp_path / "nope")


def test_a_gguf_with_a_logit_softcap_is_refused_by_name(tmp_path):
    from yue.model.gguf_names import config_from_gguf

    metadata = {
        "general.architecture": "gemma3",
        "gemma3.final_logit_softcapping": 30.0,
        "tokenizer.ggml.tokens": 320,
    }
    with pytest.raises(CheckpointError, match="final_logit_softcapping"):
        config_from_gguf(metadata, {"token_embd.weight"}, tmp_path / "g.gguf")


@pytest.mark.parametrize("name", ["mistral", "gemma3"])
def test_sliding_windows_in_a_batch_decode_each_row_as_alone(name):
    """Rows of other lengths in one batch, `verified` leaving holes in the cache where rows keep fewer
    drafts: each row's window is over its own positions (`KVCache.key_positions`), so every row's
    tokens are those it gets decoded alone."""
    prompts = [PROMPT, [3, 9, 27, 81, 43, 129, 87, 261, 13, 39, 117, 31, 93, 279], PROMPT[:10]]
    model = prepare_for_decoding(from_llama(tiny_family(name), block_size=4).eval(), torch.qint8)

    def rows(batch: list[list[int]], mode: str) -> list[list[int]]:
        cfg = DecodeConfig(mode=mode, max_new_tokens=20, ignore_eos=True).resolved(model.config)
        out = [[] for _ in batch]
        for em in decode(model, batch, cfg):
            for b, tokens in enumerate(em.tokens):
                out[b] += tokens
        return out

    alone = [rows([p], "ar")[0] for p in prompts]
    assert rows(prompts, "ar") == alone and rows(prompts, "verified") == alone


def test_the_hf_peer_of_a_family_gguf_is_its_own_transformers_class_with_our_ar_tokens(tmp_path):
    """`yue bench`'s transformers peers on a Gemma 3 GGUF: the converted folder as Gemma3ForCausalLM (a
    Llama export cannot hold it), whose greedy tokens are our `ar`'s."""
    import yue
    from yue.bench.prompts import Prompt
    from yue.bench.runners import HFRunner, load_peers

    write_family_gguf(tmp_path / "g.gguf", "gemma3", "Q8_0")
    engine = yue.load(tmp_path / "g.gguf", dtype="float32")
    peer, rec, folder = load_peers(tmp_path / "g.gguf", "cpu", str(tmp_path / "unused"))
    assert type(peer).__name__ == "Gemma3ForCausalLM" and (folder / "model.safetensors").is_file()
    text = "Hello, world! How are"
    sample = HFRunner(peer, rec, engine.tokenizer, False, 12)([(0, Prompt(text, None, engine.encode(text)))])
    assert sample.rows[0][1] == engine.generate(text, mode="ar", max_new_tokens=12).token_ids
