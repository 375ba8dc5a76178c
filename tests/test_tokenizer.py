"""The byte-level BPE tokenizer round-trips any Unicode text exactly (DESIGN §1)."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from yue.tokenizer import SPECIAL_TOKENS, YueTokenizer

# Any code point except lone surrogates (not encodable as UTF-8, so not text a user can hand us).
unicode_text = st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)


@given(text=unicode_text)
@settings(max_examples=300, deadline=None)
def test_tokenizer_round_trips_arbitrary_unicode(tokenizer, text):
    assert tokenizer.decode(tokenizer.encode(text)) == text


@given(text=unicode_text)
@settings(max_examples=50, deadline=None)
def test_saved_and_loaded_tokenizer_encodes_identically(tokenizer, tmp_path_factory, text):
    path = tokenizer.save(tmp_path_factory.mktemp("tok"))
    assert YueTokenizer.load(path).encode(text) == tokenizer.encode(text)


def test_special_tokens_have_the_ids_the_model_config_expects(tokenizer):
    assert [tokenizer.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.mask_id) == (0, 1, 2, 3)


def test_vocab_size_below_the_byte_alphabet_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        YueTokenizer.train(["abc"], vocab_size=100)
