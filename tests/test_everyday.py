"""Template everyday requests (`yue.train.everyday`): deterministic, distinct, every category drawn,
shipped evaluation texts kept out."""

from __future__ import annotations

import pytest

from yue.bench.devset import CHAT_SETS
from yue.train import everyday
from yue.train.everyday import CATEGORIES, everyday_prompts
from yue.train.selfinstruct import content_hash, shipped_set_hashes


def test_everyday_prompts_are_deterministic_distinct_one_user_message_each():
    a = everyday_prompts(500, seed=3)
    assert a == everyday_prompts(500, seed=3)
    assert a != everyday_prompts(500, seed=4)
    assert all(len(m) == 1 and m[0]["role"] == "user" and m[0]["content"] for m in a)
    texts = [m[0]["content"] for m in a]
    assert len({content_hash(t) for t in texts}) == 500
    assert not any("{" in t or "}" in t for t in texts)  # every slot filled


def test_everyday_prompts_draw_every_category():
    texts = [m[0]["content"] for m in everyday_prompts(2000, seed=0)]
    assert any("Python" in t for t in texts)
    assert any(t.startswith("Write a haiku") for t in texts)
    assert any("dollars" in t for t in texts)  # the word problems
    assert set(CATEGORIES) == {
        "writing",
        "science",
        "cooking",
        "travel",
        "history",
        "life",
        "maths",
        "python",
    }


def test_everyday_prompts_drop_excluded_texts():
    first = everyday_prompts(50, seed=1)
    banned = {content_hash(first[0][0]["content"]), content_hash(first[7][0]["content"])}
    again = [m[0]["content"] for m in everyday_prompts(50, seed=1, exclude=banned)]
    assert first[0][0]["content"] not in again and first[7][0]["content"] not in again
    assert len(again) == 50
    shipped = shipped_set_hashes([str(p) for p in CHAT_SETS.values()])
    made = everyday_prompts(3000, seed=0, exclude=shipped)
    assert not shipped & {content_hash(m[0]["content"]) for m in made}


def test_everyday_prompts_raise_when_the_templates_run_out(monkeypatch):
    # Python's templates alone make 4 x 20 + 2 x 12 = 104 distinct requests.
    monkeypatch.setattr(everyday, "CATEGORIES", {"python": (everyday.PYTHON, 1.0)})
    assert len(everyday_prompts(104, seed=0)) == 104
    with pytest.raises(ValueError, match="made only 104 distinct requests of the 105"):
        everyday_prompts(105, seed=0)
