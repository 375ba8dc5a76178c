"""The byte-level BPE tokenizer round-trips any Unicode text exactly (docs/design.md §1)."""

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


@pytest.mark.parametrize(("text", "at"), [("\ud800", 0), ("ok \udfff", 3), ("hi \ud83d there", 3)])
def test_a_lone_surrogate_is_a_clear_value_error(tokenizer, text, at):
    # Not text (JSON's "\ud800" decodes to one); tokenizers itself raises a bare TypeError.
    with pytest.raises(ValueError, match=f"lone surrogate .* at character {at}$"):
        tokenizer.encode(text)


def test_special_tokens_have_the_ids_the_model_config_expects(tokenizer):
    assert [tokenizer.tokenizer.token_to_id(t) for t in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tokenizer.pad_id, tokenizer.bos_id, tokenizer.eos_id, tokenizer.mask_id) == (0, 1, 2, 3)


def test_vocab_size_below_the_byte_alphabet_is_refused():
    with pytest.raises(ValueError, match="vocab_size"):
        YueTokenizer.train(["abc"], vocab_size=100)


@given(
    text=st.text(alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\ufffd")),
    cuts=st.lists(st.integers(1, 5), min_size=1, max_size=40),
)
@settings(max_examples=100, deadline=None)
def test_incremental_detokenizing_over_any_chunking_gives_the_text(tokenizer, text, cuts):
    """Deltas over any chunking join to the text and never split a character."""
    from yue.tokenizer import IncrementalDetokenizer

    detok = IncrementalDetokenizer(tokenizer)
    ids = tokenizer.encode(text + "def f(x):\n    return x  # 中文 🎉")
    deltas, i = [], 0
    for n in cuts * (len(ids) // len(cuts) + 1):
        if i >= len(ids):
            break
        deltas.append(detok.push(ids[i : i + n]))
        i += n
    deltas.append(detok.flush())
    assert "".join(deltas) == tokenizer.decode(ids) == detok.text
    assert all("\ufffd" not in d for d in deltas)


def test_incremental_detokenizing_decodes_short_windows_however_long_the_text(tokenizer):
    """Each push decodes the last delta's tokens and the new ones, not every id so far (which made a
    long stream quadratic)."""
    from yue.tokenizer import IncrementalDetokenizer

    class Counting:
        longest = 0

        def decode(self, ids):
            self.longest = max(self.longest, len(ids))
            return tokenizer.decode(ids)

    counting = Counting()
    detok = IncrementalDetokenizer(counting)
    ids = tokenizer.encode("def f(x):\n    return x + 1  # 中文文本 🎉\n" * 100)
    assert len(ids) > 1000
    deltas = [detok.push([i]) for i in ids] + [detok.flush()]
    assert "".join(deltas) == tokenizer.decode(ids)
    assert counting.longest <= 8  # a 4-byte character's byte tokens, twice
