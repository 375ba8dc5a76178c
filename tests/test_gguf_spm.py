"""A GGUF's SentencePiece tokenizer built from its parsed header (`gguf_spm`, through `gguf_tokenizer.write`)
equals transformers' GGUF conversion: the same tokenizer.json, ids and text, on synthetic Llama and Gemma
vocabularies and on Gemma 3 270M's real file where it is installed; and no transformers import on the way."""

from __future__ import annotations

import json
from pathlib import Path

import gguf
import pytest
from tokenizers import SentencePieceBPETokenizer

from tests.test_gguf_tokenizer import TEXTS, assert_same_tokenizer
from yue.model import gguf_file, gguf_spm, gguf_tokenizer
from yue.model.gguf_file import GGUFFile

CORPUS = [
    "Hello, world! How are you today? The quick brown fox jumps over the lazy dog.",
    "def add(a, b):\n    return a + b\n\nclass X:\n    pass\n",
    "The sea is calm tonight. The tide is full, the moon lies fair upon the straits.",
    "数字 12345 and 3.14159; émigré naïve café",
] * 4
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, BYTE = 1, 2, 3, 4, 6
GEMMA_270M = Path.home() / ".cache/yue/packages/gemma-3-270m-q4_k_m.gguf"


def spm_pieces(size: int = 400) -> list[str]:
    """SentencePiece-style pieces ("▁" for a space) learned on CORPUS, in merge order."""
    trainer = SentencePieceBPETokenizer()
    trainer.train_from_iterator(CORPUS, vocab_size=size, min_frequency=1, show_progress=False)
    return [t for t, _ in sorted(trainer.get_vocab().items(), key=lambda kv: kv[1])]


def write_spm_gguf(path: Path, arch: str) -> Path:
    """A GGUF with a SentencePiece vocabulary ("llama" model) and the metadata transformers' conversion
    reads, no tensors: Llama's <unk>/<s>/</s> or Gemma's <pad>/<eos>/<bos>/<unk>/<mask> first, control
    and user-defined tokens, 256 byte pieces, then the learned pieces (Gemma's with a run of spaces
    stored as spaces); scores falling with the merge order."""
    gemma = arch == "gemma3"
    head = (
        [("<pad>", CONTROL), ("<eos>", CONTROL), ("<bos>", CONTROL), ("<unk>", UNKNOWN), ("<mask>", CONTROL)]
        if gemma
        else [("<unk>", UNKNOWN), ("<s>", CONTROL), ("</s>", CONTROL)]
    )
    head += [("[multimodal]", USER_DEFINED), ("<start_of_turn>", CONTROL), ("<think>", USER_DEFINED)]
    head += [(f"<0x{b:02X}>", BYTE) for b in range(256)]
    pieces = [p for p in spm_pieces() if p not in dict(head)]
    pieces += ["  ", "   ", "▁▁"] if gemma else ["▁▁"]
    tokens, types = [t for t, _ in head] + pieces, [k for _, k in head] + [NORMAL] * len(pieces)
    scores = [0.0] * len(head) + [-float(i) for i in range(len(pieces))]
    w = gguf.GGUFWriter(str(path), arch)
    w.add_name(f"tiny-{arch}")
    w.add_block_count(1)
    w.add_context_length(256)
    w.add_embedding_length(64)
    w.add_feed_forward_length(128)
    w.add_head_count(4)
    w.add_head_count_kv(2)
    w.add_layer_norm_rms_eps(1e-6)
    w.add_tokenizer_model("llama")
    w.add_tokenizer_pre("default")
    w.add_token_list(tokens)
    w.add_token_scores(scores)
    w.add_token_types(types)
    ids = (
        {"bos": "<bos>", "eos": "<eos>", "unk": "<unk>", "pad": "<pad>"}
        if gemma
        else {"bos": "<s>", "eos": "</s>", "unk": "<unk>"}
    )
    w.add_bos_token_id(tokens.index(ids["bos"]))
    w.add_eos_token_id(tokens.index(ids["eos"]))
    w.add_unk_token_id(tokens.index(ids["unk"]))
    if gemma:
        w.add_pad_token_id(tokens.index(ids["pad"]))
        w.add_add_bos_token(True)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def fields(path: Path) -> dict:
    return gguf_tokenizer.fields_of(gguf.GGUFReader(path))


def both(path: Path, tmp_path: Path) -> tuple[Path, Path]:
    """(ours: built from the parsed fields, reference: transformers' conversion)."""
    ours, ref = tmp_path / "ours", tmp_path / "ref"
    ours.mkdir()
    ref.mkdir()
    assert gguf_tokenizer.write(fields(path), ours)
    gguf_file.save_tokenizer(path, ref)
    return ours, ref


@pytest.mark.parametrize("arch", ["llama", "gemma3"])
def test_a_synthetic_sentencepiece_gguf_tokenizer_equals_transformers_conversion(tmp_path, arch):
    path = write_spm_gguf(tmp_path / f"{arch}.gguf", arch)
    ours, ref = both(path, tmp_path)
    assert_same_tokenizer(ours, ref)
    doc = json.loads((ours / "tokenizer.json").read_text(encoding="utf-8"))
    assert doc["model"]["byte_fallback"] and len(doc["model"]["merges"]) > 100
    # Byte fallback: a character outside the pieces is spelled in byte tokens and decodes back.
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(ours / "tokenizer.json"))
    ids = tok.encode("🙂 sea", add_special_tokens=False).ids
    assert tok.token_to_id("<0xF0>") in ids and tok.decode(ids) == "🙂 sea"


def test_merges_follow_scores_for_llama_and_file_order_for_gemma():
    tokens = ["<unk>", "▁", "a", "b", "ab", "▁a", "▁ab"]
    llama = gguf_spm.merges(
        tokens, {t: s for t, s in zip(tokens, [0, 0, 0, 0, -2.0, -1.0, -3.0], strict=True)}
    )
    assert llama == [("▁", "a"), ("a", "b"), ("▁a", "b"), ("▁", "ab")]  # a piece's splits: longer left first
    gemma = gguf_spm.merges(tokens, {t: -i for i, t in enumerate(tokens)})
    assert gemma == [("a", "b"), ("▁", "a"), ("▁a", "b"), ("▁", "ab")]
    from transformers.tokenization_utils_base import generate_merges

    pieces = ["<unk>", *spm_pieces(300)]
    vocab = {t: i for i, t in enumerate(pieces)}
    for scores in ({t: -float(i) for i, t in enumerate(pieces)}, {t: float(len(t) % 5) for t in pieces}):
        assert gguf_spm.merges(pieces, scores) == generate_merges(vocab, scores)


def test_other_sentencepiece_builders_keep_the_transformers_conversion(tmp_path):
    base = {"tokenizer.ggml.model": "llama", "tokenizer.ggml.tokens": ["<unk>", "<s>", "</s>", "▁a"]}
    assert gguf_tokenizer.write(base | {"general.architecture": "phi3"}, tmp_path) is False
    assert gguf_tokenizer.write(base | {"tokenizer.ggml.model": "t5"}, tmp_path) is False
    assert not (tmp_path / "tokenizer.json").exists()


def test_the_index_writes_a_sentencepiece_tokenizer_without_transformers(tmp_path, monkeypatch):
    """One parse: the index's tokenizer, never transformers' conversion (made to fail here); and neither
    module on the path imports transformers."""
    import ast

    def refuse(*args):
        raise AssertionError("transformers' conversion was called")

    monkeypatch.setattr(gguf_file, "save_tokenizer", refuse)
    path = write_spm_gguf(tmp_path / "g.gguf", "gemma3")
    opened = GGUFFile.open(path, cache_dir=tmp_path / "cache")
    assert (opened.tokenizer_dir() / "tokenizer.json").is_file()
    for module in (gguf_spm, gguf_tokenizer):
        tree = ast.parse(Path(module.__file__).read_text())
        imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)]
        imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
        assert not [m for m in imported if m.startswith("transformers")], module.__name__


@pytest.mark.slow
@pytest.mark.skipif(not GEMMA_270M.is_file(), reason="Gemma 3 270M's GGUF is not installed")
def test_gemma_270m_tokenizer_equals_transformers_conversion(tmp_path):
    opened = GGUFFile.open(GEMMA_270M, cache_dir=tmp_path / "cache")
    assert (opened.index_dir / "tokenizer.json").is_file(), "written with the index, from the one parse"
    ref = tmp_path / "ref"
    ref.mkdir()
    gguf_file.save_tokenizer(GEMMA_270M, ref)
    assert_same_tokenizer(opened.index_dir, ref)
    assert TEXTS
