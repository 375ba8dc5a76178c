"""The shipped default model, yue-code-mini: present, small, safe to load, exact in verified mode."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

import yue
from yue.cli import app
from yue.registry import DEFAULT_MODEL, resolve

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def engine():
    return yue.load()


def test_shipped_model_is_small_safetensors_with_a_model_card():
    files = {p.name: p.stat().st_size for p in resolve(DEFAULT_MODEL).iterdir()}
    assert "model.safetensors" in files and "tokenizer.json" in files and "README.md" in files
    assert not [n for n in files if n.endswith((".bin", ".pt", ".pkl"))]
    assert sum(files.values()) <= 40 * 2**20


def test_default_model_verified_equals_ar_on_the_development_set(engine):
    rows = [
        json.loads(line) for line in (resolve(DEFAULT_MODEL).parent / "devset.jsonl").read_text().splitlines()
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


def test_quick_start_command_generates_text():
    res = CliRunner().invoke(app, ["generate", "def fibonacci(n):", "--max-new-tokens", "16"])
    assert res.exit_code == 0, res.output
    assert res.output.strip()
