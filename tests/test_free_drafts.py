"""`yue.train.free_drafts`: how copied and corpus drafts fare on a model's answers, by source and match
length (the priors of `YueConfig.free_draft_rates`)."""

from __future__ import annotations

import pytest

from yue.config import YueConfig
from yue.decode.corpus import CorpusNgrams, load_ngrams
from yue.decode.lookup import MAX_NGRAM, MIN_NGRAM
from yue.registry import ASSETS
from yue.train.free_drafts import free_draft_rates
from yue.train.topnar import ChatSequences


def test_rates_count_each_draft_where_it_was_judged():
    # Prompt [9], answer 1 2 3 1 2 3 1 2 4. Copies: after "1 2" (2-token match) 3 1 2, all held; after
    # "1 2 3" (3) 1 2 3, the third missed (4 came); after "1 2 3 1" (4) 2 3 1, the second missed;
    # after "2 3 1 2" (4) 3 1 2, the first missed. A draft past a miss is not judged.
    answers = ChatSequences([[9, 1, 2, 3, 1, 2, 3, 1, 2, 4]], [1])
    rates = free_draft_rates(answers, None, n=3, min_judged=1)
    assert rates == {"copy:2": [1.0, 1.0, 1.0], "copy:3": [1.0, 1.0, 0.0], "copy:4": [0.5, 0.0]}


def _bigrams() -> CorpusNgrams:
    """A table of 2-token contexts from one answer: (0, 5) -> 6, (5, 6) -> 7, (6, 7) -> 8."""
    return CorpusNgrams.build(
        [([0, 5, 6, 7, 8], 1)], 10, min_order=2, max_order=2, min_count=1, min_share=0.0
    )


def test_rates_by_hand_for_a_corpus_source():
    corpus = _bigrams()
    # Answer after prompt [5, 6]: 7 8 (both as the corpus says), then 1 where it says nothing.
    answers = ChatSequences([[5, 6, 7, 8, 1]], [2])
    rates = free_draft_rates(answers, corpus, n=2, min_judged=1)
    # At position 2 (context 5 6): drafts 7, 8: both held. At 3 (6 7): 8 held, then 1 != nothing
    # proposed. At 4 (7 8): nothing in the table. So c_1 = 2/2, c_2 = 1/1.
    assert rates["corpus:2"] == [1.0, 1.0]


def test_rates_judged_too_rarely_are_left_out():
    corpus = _bigrams()
    answers = ChatSequences([[5, 6, 7, 8, 1]], [2])
    assert "corpus:2" not in free_draft_rates(answers, corpus, n=2, min_judged=3)


def test_config_refuses_rates_outside_zero_one():
    YueConfig(free_draft_rates={"copy:2": [0.5, 1.0]})
    with pytest.raises(ValueError, match="free_draft_rates"):
        YueConfig(free_draft_rates={"copy:2": [1.5]})


def test_config_refuses_sampled_rates_outside_zero_one_or_at_no_temperature():
    YueConfig(sampled_draft_rates={"0.7": {"copy:2": [0.5, 1.0]}})
    with pytest.raises(ValueError, match=r"sampled_draft_rates\['0.7'\]"):
        YueConfig(sampled_draft_rates={"0.7": {"copy:2": [1.5]}})
    for bad in ("0", "hot", "2.5"):
        with pytest.raises(ValueError, match="sampled_draft_rates: keys are temperatures"):
            YueConfig(sampled_draft_rates={bad: {"copy:2": [0.5]}})


def test_shipped_yue_smol_rates_name_the_free_sources_and_their_match_lengths():
    config = YueConfig.from_pretrained(ASSETS / "yue-smol")
    table = load_ngrams(ASSETS / "yue-smol", config.vocab_size)
    kinds = {f"copy:{n}" for n in range(MIN_NGRAM, MAX_NGRAM + 1)}
    kinds |= {f"corpus:{n}" for n in range(table.min_order, table.max_order + 1)}
    for table in (config.free_draft_rates, *(config.sampled_draft_rates or {}).values()):
        assert table and set(table) <= kinds
        assert all(len(c) <= config.block_size - 1 for c in table.values())
