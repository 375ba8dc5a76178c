"""The shipped code prompt sets are valid, reproducible and held out: the dev set (Lib/test files
only) and the test set (third-party packages, disjoint from the stdlib training corpus by content)."""

from __future__ import annotations

import functools
import importlib.metadata
import json
import random

import pytest

from yue.bench.devset import (
    DEFAULT_OUT,
    HELD_OUT,
    HELD_OUT_PACKAGES,
    build_devset,
    build_held_out,
    cut_example,
    load_devset,
)
from yue.train.data import read_stdlib


def test_shipped_devset_is_valid_jsonl_of_prompt_reference_pairs():
    lines = DEFAULT_OUT.read_text(encoding="utf-8").splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) >= 40 and records == load_devset()
    sources = [r["source"] for r in records]
    assert len(set(sources)) == len(sources)  # one prompt per file
    for r in records:
        assert isinstance(r["prompt"], str) and isinstance(r["reference"], str)
        assert 200 <= len(r["prompt"]) <= 600 and 400 <= len(r["reference"]) <= 700
        assert not r["prompt"].endswith("\n") and r["reference"].startswith("\n")  # cut at a line end
        assert r["source"].endswith(".py")


def test_devset_is_deterministic_and_comes_from_test_files(tmp_path):
    root = tmp_path / "test"
    root.mkdir()
    body = "".join(
        f"def test_{i}(self):\n    value = compute({i})\n    self.assertEqual(value, {i * i})\n\n"
        for i in range(40)
    )
    for i in range(3):
        (root / f"test_mod{i}.py").write_text(body)
    a = build_devset(3, seed=1, root=root)
    assert a == build_devset(3, seed=1, root=root)
    for r in a:
        assert body.find(r["prompt"] + r["reference"]) >= 0  # prompt + reference is a verbatim cut


def test_cut_example_returns_none_when_no_clean_cut_exists():
    assert cut_example("x = 1\n" * 10, random.Random(0)) is None


# --- the held-out code test set (third-party packages) ---

SHINGLE = 8  # lines per shingle: long enough that shared boilerplate (imports, `return self`) rarely matches


def _shingles(text: str) -> set[int]:
    """Hashes of every run of SHINGLE consecutive non-blank lines, each stripped of its indentation."""
    lines = [ln.strip() for ln in text.split("\n") if ln.strip()]
    return {hash("\n".join(lines[i : i + SHINGLE])) for i in range(len(lines) - SHINGLE + 1)}


@functools.cache
def _held_out() -> list[dict[str, str]]:
    return load_devset(HELD_OUT)


@functools.cache
def _stdlib() -> dict[str, str]:
    """The stdlib corpus yue-code-mini trained on (`read_stdlib`), read once per process."""
    return {d.name: d.text for d in read_stdlib()}


@functools.cache
def _training_shingles() -> frozenset[int]:
    return frozenset().union(*(_shingles(text) for text in _stdlib().values()))


def test_held_out_set_loads_with_prompt_reference_and_a_package_source():
    records = _held_out()
    assert len(records) == 40
    sources = [r["source"] for r in records]
    assert len(set(sources)) == len(sources)  # one prompt per file
    assert {s.split("/")[0] for s in sources} == set(HELD_OUT_PACKAGES)
    for r in records:
        assert isinstance(r["prompt"], str) and isinstance(r["reference"], str) and r["version"]
        assert 200 <= len(r["prompt"]) <= 600 and 400 <= len(r["reference"]) <= 700
        assert not r["prompt"].endswith("\n") and r["reference"].startswith("\n")  # cut at a line end
        assert r["source"].endswith(".py") and not r["source"].startswith("/") and ":" not in r["source"]


def test_held_out_set_shares_no_8_line_shingle_with_the_stdlib_training_corpus():
    trained = _training_shingles()
    for r in _held_out():
        own = _shingles(r["prompt"] + r["reference"])
        assert own, f"{r['source']}: too short to check"
        assert not own & trained, f"{r['source']}: text also in the stdlib training corpus"


def test_shingle_check_catches_a_cut_from_the_stdlib():
    """The disjointness check can fail: a prompt cut from a training file shares its shingles."""
    example = cut_example(_stdlib()["json/encoder.py"], random.Random(0))
    assert example is not None
    assert _shingles(example["prompt"] + example["reference"]) & _training_shingles()


def test_held_out_set_is_disjoint_from_the_dev_set():
    dev = load_devset()
    dev_prompts = {r["prompt"] for r in dev}
    dev_shingles = frozenset().union(*(_shingles(r["prompt"] + r["reference"]) for r in dev))
    for r in _held_out():
        assert r["prompt"] not in dev_prompts
        assert not _shingles(r["prompt"] + r["reference"]) & dev_shingles, r["source"]


def test_held_out_set_is_reproducible_from_the_installed_packages():
    """The shipped file is what `python -m yue.bench.devset --held-out` writes with these versions."""
    shipped = _held_out()
    versions = {r["source"].split("/")[0]: r["version"] for r in shipped}
    installed = {name: importlib.metadata.version(name) for name in HELD_OUT_PACKAGES}
    if versions != installed:
        pytest.skip(f"installed versions {installed} differ from the shipped set's {versions}")
    assert build_held_out() == shipped


def test_a_code_model_benches_the_held_out_set_first_then_the_dev_set():
    from yue.bench.prompts import default_files

    class CodeEngine:  # a completion model (no chat template of its own), like yue-code-mini
        instruct = False

    assert default_files(CodeEngine()) == [("held-out", HELD_OUT), ("dev", DEFAULT_OUT)]


def test_an_optional_base_model_of_prose_benches_held_out_text_continuations_raw():
    import json

    from yue.bench.prompts import TEXT_TEST, default_files, load_prompts

    class GemmaEngine:  # gemma-3-270m: a base model, no chat template
        instruct = False
        name = "gemma-3-270m"

        def encode(self, text):
            return [len(text)]

    assert default_files(GemmaEngine()) == [("held-out", TEXT_TEST)]
    rows = [json.loads(line) for line in TEXT_TEST.read_text().splitlines()]
    assert len(rows) >= 20 and all(r["source"].startswith("public domain") for r in rows)
    prompts = load_prompts(TEXT_TEST, GemmaEngine())
    assert [p.text for p in prompts] == [r["prompt"] for r in rows]  # continued as written: no template
