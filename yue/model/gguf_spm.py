"""A GGUF's SentencePiece vocabulary (`tokenizer.ggml.model` "llama": Llama 2, Mistral, Gemma 1-3) as a
`tokenizers` tokenizer, built from the header fields `gguf.GGUFReader` has already parsed
(`gguf_tokenizer.write`), with no second parse and no transformers import.

Design decisions:
- Step for step what transformers' GGUF conversion builds (`integrations/gguf/gguf_tokenizer_mapping.py`:
  `sentencepiece_tokenizer`, `gemma_tokenizer`, `add_gguf_special_tokens`; the classes it hands the
  vocabulary to, `LlamaTokenizer` and `GemmaTokenizer`, and `TokenizersBackend`'s special tokens and
  post-processor), so the tokenizer.json written is the same document; `tests/test_gguf_spm.py` compares
  the two, and their ids and text, on synthetic files and on Gemma 3 270M's where it is installed.
- BPE with byte fallback over the file's pieces. A SentencePiece file lists no merges: they are
  recovered from the vocabulary (`merges`, transformers' `generate_merges`), best first by the piece's
  score (Llama), or by its position in the file for Gemma, whose scores do not follow its merge order.
- Llama: a Metaspace pre-tokenizer (a "▁" before the first word, spaces as "▁"), and a decoder that
  strips that first space back. Gemma: spaces become "▁" in a Replace normalizer, the text is split
  after each one, and a piece of two or more spaces stored as spaces is respelled in "▁".
- Other SentencePiece builders (Phi-3's, T5's unigram, Gemma 4's) are not built here: `build` returns
  None and transformers' conversion still serves them (`gguf_file.save_tokenizer`).
"""

from __future__ import annotations

from tokenizers import AddedToken, Tokenizer, decoders, models, normalizers, pre_tokenizers

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)
GEMMA = ("gemma", "gemma2", "gemma3")  # architectures whose SentencePiece vocabulary is Gemma's
# The special tokens each class sets by default, in the order TokenizersBackend adds them (its special
# tokens map: bos, eos, unk, then pad and mask), before the file's own are known.
DEFAULTS = {
    "llama": ("<s>", "</s>", "<unk>"),
    "gemma": ("<bos>", "<eos>", "<unk>", "<pad>", "<mask>"),
}


def kind(fields: dict) -> str | None:
    """ "llama" or "gemma" for a SentencePiece vocabulary this module builds, else None."""
    if fields.get("tokenizer.ggml.model") != "llama" or "tokenizer.ggml.tokens" not in fields:
        return None
    arch = fields.get("general.architecture")
    if arch in GEMMA:
        return "gemma"
    return "llama" if arch not in ("phi3",) else None


def merges(tokens: list[str], scores: dict[str, float]) -> list[tuple[str, str]]:
    """The merges a vocabulary implies (transformers' `generate_merges` with scores): every split of a
    piece into two pieces of the vocabulary, ordered by the piece's score (highest first), then by the
    halves' lengths; within a piece by the halves' ids."""
    vocab = {token: index for index, token in enumerate(tokens)}
    found = []
    for merge, score in scores.items():
        local = []
        for index in range(1, len(merge)):
            left, right = merge[:index], merge[index:]
            if left in vocab and right in vocab:
                local.append((left, right, score))
        local.sort(key=lambda x: (vocab[x[0]], vocab[x[1]]))
        found.extend(local)
    found.sort(key=lambda val: (val[2], len(val[0]), len(val[1])), reverse=True)
    return [(left, right) for left, right, _ in found]


def spm_model(fields: dict, gemma: bool) -> tuple[Tokenizer, list[str]]:
    """The BPE model with byte fallback, its normalizer, pre-tokenizer and decoder; and the pieces as the
    vocabulary spells them (Gemma's runs of spaces respelled in "▁")."""
    tokens: list[str] = list(fields["tokenizer.ggml.tokens"])
    if gemma:
        tokens = ["▁" * len(t) if " " in t and not t.strip() else t for t in tokens]
        scores = {token: -index for index, token in enumerate(tokens)}  # the file's order
    else:
        scores = dict(zip(tokens, fields.get("tokenizer.ggml.scores") or [], strict=False))
    listed = fields.get("tokenizer.ggml.merges")
    pairs = [tuple(m.split(" ")) for m in listed] if listed else merges(tokens, scores)
    vocab = {token: index for index, token in enumerate(tokens)}
    unk = {"unk_token": "<unk>"} if gemma else {}
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=pairs, fuse_unk=True, byte_fallback=True, dropout=None, **unk)
    )
    replace = [decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse()]
    if gemma:
        tok.normalizer = normalizers.Replace(" ", "▁")
        tok.pre_tokenizer = pre_tokenizers.Split(pattern=" ", behavior="merged_with_previous", invert=False)
        tok.decoder = decoders.Sequence(replace)
    else:
        tok.normalizer = None
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tok.decoder = decoders.Sequence([*replace, decoders.Strip(content=" ", left=1)])
    return tok, tokens


def build(fields: dict, named: list[str]) -> Tokenizer | None:
    """The tokenizer of a SentencePiece vocabulary `kind` names (None for any other), its added tokens in
    transformers' order: the class's default specials, the file's control tokens, its user-defined ones
    in the vocabulary, then `named` (the file's bos/eos/unk/pad) where not added yet. The post-processor
    is the caller's (`gguf_tokenizer.post_processor`)."""
    which = kind(fields)
    if which is None:
        return None
    tok, _ = spm_model(fields, which == "gemma")
    tokens: list[str] = fields["tokenizer.ggml.tokens"]  # as the file spells them (transformers' lists)
    types: list[int] = fields.get("tokenizer.ggml.token_type") or []
    tok.add_tokens([AddedToken(t, special=True) for t in DEFAULTS[which]])
    control = [t for t, k in zip(tokens, types, strict=False) if k == CONTROL]
    tok.add_special_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    in_vocab = tok.get_vocab()
    user = [t for t, k in zip(tokens, types, strict=False) if k == USER_DEFINED and t in in_vocab]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    tok.add_tokens([AddedToken(t, special=True) for t in dict.fromkeys(named) if t not in added])
    return tok
