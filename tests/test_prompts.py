"""Self-distillation chat prompts: deterministic, split by package, and disjoint from the shipped eval sets.

The stdlib is parsed once per process (a few seconds); every test after the first reuses it.
"""

from __future__ import annotations

import pytest

from yue.bench.devset import CHAT_SETS, load_chat_set
from yue.train.prompts import chat_prompt_records, count_chat_prompts, stdlib_chat_prompts
from yue.train.stdlib_docs import (
    PASSAGE_CHARS,
    cap_passage,
    content_hash,
    shingles,
    split_items,
    split_of,
    stdlib_items,
)

RECIPE_N = 6000  # the number of training prompts the self-distillation recipe draws by default


@pytest.fixture(scope="module")
def train_records():
    return chat_prompt_records(RECIPE_N, seed=0, split="train")


def test_same_seed_gives_same_prompts_and_n_distinct_user_messages(train_records):
    a = stdlib_chat_prompts(300, seed=3)
    assert a == stdlib_chat_prompts(300, seed=3)
    assert a != stdlib_chat_prompts(300, seed=4)
    assert len(a) == 300 and len({m[0]["content"] for m in a}) == 300
    assert all(len(m) == 1 and m[0]["role"] == "user" and m[0]["content"].strip() for m in a)
    assert len(stdlib_chat_prompts(40, split="calibration")) == 40
    assert [r.content for r in train_records] == [m[0]["content"] for m in stdlib_chat_prompts(RECIPE_N)]


def test_recipe_draw_is_distinct_varied_and_short(train_records):
    assert count_chat_prompts("train") >= 2 * RECIPE_N  # no repeats at the recipe's size
    assert len({r.content for r in train_records}) == RECIPE_N
    assert len({r.task for r in train_records}) >= 10
    # Passages are capped at PASSAGE_CHARS, so a prompt stays near 400 tokens (~4 characters each).
    assert max(len(r.content) for r in train_records) <= PASSAGE_CHARS + 500
    assert sorted(len(r.content) for r in train_records)[RECIPE_N // 2] < 400  # mostly short requests


def test_past_the_pool_prompts_repeat_rather_than_fail():
    n = count_chat_prompts("calibration")
    records = chat_prompt_records(n + 5, split="calibration")
    assert len({r.content for r in records[:n]}) == n and len(records) == n + 5


def test_train_and_calibration_come_from_disjoint_packages_and_share_no_text():
    train, cal = split_items("train"), split_items("calibration")
    assert train and cal
    assert not {it.key for it in train} & {it.key for it in cal}
    assert all(split_of(it.key) == "calibration" for it in cal)
    cal_shingles = set().union(*(shingles(it.doc) for it in cal))
    assert not any(shingles(it.doc) & cal_shingles for it in train)
    assert all(r.key in {it.key for it in cal} for r in chat_prompt_records(200, split="calibration"))


def test_shipped_sets_parse_and_hold_one_user_message_each():
    for name in CHAT_SETS:
        records = load_chat_set(name)
        assert len(records) == 40
        assert len({content_hash(r["messages"][0]["content"]) for r in records}) == 40
        for r in records:
            assert [m["role"] for m in r["messages"]] == ["user"] and r["messages"][0]["content"].strip()
            assert isinstance(r["source"], str) and r["source"]
    assert all(r["source"].startswith("handwritten:") for r in load_chat_set("test"))
    assert all(r["source"].startswith("stdlib-calibration:") for r in load_chat_set("calibration"))
    everyday = load_chat_set("calibration-everyday")
    assert all(r["source"].startswith("handwritten-calibration:") for r in everyday)
    held_out = {content_hash(r["messages"][0]["content"]) for r in load_chat_set("test")}
    assert not held_out & {content_hash(r["messages"][0]["content"]) for r in everyday}
    with pytest.raises(ValueError, match="unknown chat set"):
        load_chat_set("dev")


def test_calibration_set_comes_from_calibration_packages_only():
    for r in load_chat_set("calibration"):
        _, _task, kind, names = r["source"].split(":", 3)
        for name in names.split("|"):
            key = "pydoc:" + name if kind == "topic" else name.split(".")[0]
            assert split_of(key) == "calibration", r["source"]


def test_no_shipped_eval_prompt_is_a_training_prompt_by_content_hash(train_records):
    train_hashes = {content_hash(r.content) for r in train_records}
    for name in CHAT_SETS:
        for r in load_chat_set(name):
            assert content_hash(r["messages"][0]["content"]) not in train_hashes, (name, r["source"])


def test_held_out_test_set_shares_no_12_word_run_with_training_text():
    test_shingles = set().union(*(shingles(r["messages"][0]["content"]) for r in load_chat_set("test")))
    assert test_shingles  # the check would be vacuous on prompts under 12 words
    for it in split_items("train"):
        assert not shingles(it.doc) & test_shingles, it.name


def test_items_are_read_with_ast_without_importing(tmp_path):
    (tmp_path / "boom.py").write_text(
        '"""A module that must never be imported by the prompt builder."""\n'
        "raise SystemExit('imported!')\n\n"
        "def fuse(length, colour='red'):\n    '''Light a fuse of the given length and colour.'''\n\n"
        "def _private():\n    '''A private helper that prompts never name.'''\n"
    )
    (tmp_path / "tests").mkdir()
    (tmp_path / "tests" / "probe.py").write_text(
        '"""Test folders are skipped, as in the training corpus."""\n'
    )
    items = [it for it in stdlib_items(tmp_path) if it.kind != "topic"]
    assert [(it.kind, it.name, it.key) for it in items] == [
        ("module", "boom", "boom"),
        ("function", "boom.fuse", "boom"),
    ]
    assert items[1].signature == "(length, colour='red')"


def test_cap_passage_cuts_at_a_boundary_within_the_limit():
    text = "First sentence here. " * 100
    capped = cap_passage(text, 200)
    assert len(capped) <= 200 and text.startswith(capped) and capped.endswith(".")
    assert cap_passage("short", 200) == "short"
