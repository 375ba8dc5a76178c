"""The shipped development set is valid, held out (test files only) and reproducible."""

from __future__ import annotations

import json
import random

from yue.bench.devset import DEFAULT_OUT, build_devset, cut_example, load_devset


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
