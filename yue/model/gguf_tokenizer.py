"""A GGUF file's tokenizer, built from the header fields `gguf.GGUFReader` has already parsed.

Design decisions:
- One parse per file. `gguf_file._read_index` opens the file with `GGUFReader` for its index; the
  tokenizer is built from that reader's fields in the same pass. transformers' GGUF tokenizer conversion
  (`AutoTokenizer.from_pretrained(..., gguf_file=...)`) would parse the whole header again, twice over
  (its config reader, then its tokenizer reader): seconds per pass for a 128k-token vocabulary.
- Byte-level BPE vocabularies (`tokenizer.ggml.model` "gpt2": GPT-2, Llama 3, Qwen2, SmolLM2) are built
  here with the `tokenizers` library, step for step as transformers' conversion builds them
  (`integrations/gguf/gguf_tokenizer_mapping.py`: `byte_level_tokenizer`, `add_gguf_special_tokens`,
  `set_split_regex`; then `TokenizersBackend`'s special tokens and post-processor), so the
  tokenizer.json written is the same document; `tests/test_gguf_tokenizer.py` compares the two, and
  their ids on varied text, on SmolLM2's real file and on synthetic ones.
- SentencePiece vocabularies (`tokenizer.ggml.model` "llama": Llama 2, Mistral, Gemma 1-3) are built
  from the same fields by `gguf_spm`, as transformers' conversion builds them. Every other vocabulary
  (Phi-3's, T5's unigram, Gemma 4's) keeps the exact transformers conversion (`gguf_file.save_tokenizer`),
  at the cost of its second parse.
- The chat template and the BOS/EOS settings go to tokenizer_config.json, the keys `YueTokenizer.load`
  and `chat.find_chat_template` read.
"""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

from yue.model import gguf_spm

CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types (gguf.TokenType)
# transformers' GPT2Tokenizer defaults unk/bos/eos to this token, and adds it as a special token.
GPT2_DEFAULT_SPECIAL = "<|endoftext|>"
SPECIAL_IDS = {  # tokenizer_config.json key -> the GGUF key of its id
    "bos_token": "tokenizer.ggml.bos_token_id",
    "eos_token": "tokenizer.ggml.eos_token_id",
    "unk_token": "tokenizer.ggml.unknown_token_id",
    "pad_token": "tokenizer.ggml.padding_token_id",
}

# Pre-tokenizer splits by `tokenizer.ggml.pre`, as transformers' conversion maps them (a pre-tokenizer
# not named here keeps GPT-2's byte-level regex, as there).
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
    r"|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_SPLITS = {
    **dict.fromkeys(
        (
            "llama3",
            "llama-v3",
            "llama-bpe",
            "falcon3",
            "falcon-h1",
            "pixtral",
            "midm-2.0",
            "lfm2",
            "jina-v5-nano",
            "dbrx",
            "smaug-bpe",
        ),
        _LLAMA3_SPLIT,
    ),  # fmt: skip
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}


@cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's byte -> printable character map (`bytes_to_unicode`): a byte-level vocabulary's spelling."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    keep += list(range(ord("®"), ord("ÿ") + 1))
    chars, extra = {}, 0
    for b in range(256):
        if b in keep:
            chars[b] = chr(b)
        else:
            chars[b] = chr(256 + extra)
            extra += 1
    return chars


def fields_of(reader) -> dict:
    """The `tokenizer.*` key/values of an open `gguf.GGUFReader` (arrays as lists), plus the architecture."""
    out = {}
    for key, field in reader.fields.items():
        if key.startswith("tokenizer.") or key == "general.architecture":
            value = field.contents()
            out[key] = value.item() if hasattr(value, "item") else value
    return out


def byte_level_tokenizer(fields: dict) -> Tokenizer:
    """The byte-level BPE tokenizer of a "gpt2" vocabulary, with its added tokens and post-processor."""
    tokens: list[str] = fields["tokenizer.ggml.tokens"]
    types: list[int] = fields.get("tokenizer.ggml.token_type") or []
    spelling = byte_alphabet()
    alphabet = set(spelling.values())
    # 1. The vocabulary in the byte alphabet (a token spelled otherwise is respelled byte by byte).
    vocab = {
        t if set(t) <= alphabet else "".join(spelling[b] for b in t.encode("utf-8")): i
        for i, t in enumerate(tokens)
    }
    merges = [tuple(m.split(" ")) for m in fields.get("tokenizer.ggml.merges") or []]
    tok = Tokenizer(
        models.BPE(vocab=vocab, merges=merges, dropout=None, continuing_subword_prefix="", end_of_word_suffix="",
                   fuse_unk=False)
    )  # fmt: skip
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    # 2. Added tokens, in transformers' order: GPT2Tokenizer's default special, the file's control tokens
    #    (those spelled in the byte alphabet), its user-defined ones (those in the vocabulary).
    tok.add_tokens([AddedToken(GPT2_DEFAULT_SPECIAL, special=True)])
    control = [t for t, k in zip(tokens, types, strict=False) if k == CONTROL and set(t) <= alphabet]
    tok.add_tokens([AddedToken(t, normalized=False, special=True) for t in control])
    in_vocab = tok.get_vocab()
    user = [t for t, k in zip(tokens, types, strict=False) if k == USER_DEFINED and t in in_vocab]
    tok.add_tokens([AddedToken(t, normalized=False, special=False) for t in user])
    # 3. The named special tokens, added where not added yet.
    config = tokenizer_config(fields)
    added = {t.content for t in tok.get_added_tokens_decoder().values()}
    named = [config[k] for k in SPECIAL_IDS if config.get(k) is not None]
    tok.add_tokens([AddedToken(t, special=True) for t in dict.fromkeys(named) if t not in added])
    split = _SPLITS.get(fields.get("tokenizer.ggml.pre"))
    if split is not None:
        tok.pre_tokenizer = pre_tokenizers.Sequence(
            [pre_tokenizers.Split(Regex(split), behavior="isolated"),
             pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)]
        )  # fmt: skip
    tok.post_processor = post_processor(config, tok)
    return tok


def post_processor(config: dict, tok: Tokenizer) -> processors.TemplateProcessing:
    """BOS/EOS around a sequence as the file's add_bos_token/add_eos_token say (`update_post_processor`)."""
    bos, eos = config.get("bos_token"), config.get("eos_token")
    add_bos = bool(config.get("add_bos_token")) and bos is not None
    add_eos = bool(config.get("add_eos_token")) and eos is not None
    single = f"{bos + ':0 ' if add_bos else ''}$A:0{' ' + eos + ':0' if add_eos else ''}"
    pair = f"{single}{' ' + bos + ':1' if add_bos else ''} $B:1{' ' + eos + ':1' if add_eos else ''}"
    special = ([(bos, tok.token_to_id(bos))] if add_bos else []) + (
        [(eos, tok.token_to_id(eos))] if add_eos else []
    )
    return processors.TemplateProcessing(single=single, pair=pair, special_tokens=special)


def tokenizer_config(fields: dict) -> dict:
    """tokenizer_config.json's keys: the named special tokens, add_bos/add_eos where the file states them,
    the chat template."""
    tokens = fields["tokenizer.ggml.tokens"]
    config: dict = {}
    for name, key in SPECIAL_IDS.items():
        i = fields.get(key)
        config[name] = tokens[i] if i is not None and 0 <= i < len(tokens) else None
    for key in ("add_bos_token", "add_eos_token"):
        if f"tokenizer.ggml.{key}" in fields:
            config[key] = bool(fields[f"tokenizer.ggml.{key}"])
    if isinstance(fields.get("tokenizer.chat_template"), str):
        config["chat_template"] = fields["tokenizer.chat_template"]
    return config


def write(fields: dict, out: Path) -> bool:
    """Write tokenizer.json and tokenizer_config.json into `out` for a byte-level vocabulary or a
    SentencePiece one `gguf_spm` builds; False (nothing written) for any other kind, which the
    transformers conversion then builds."""
    if fields.get("tokenizer.ggml.model") == "gpt2" and "tokenizer.ggml.tokens" in fields:
        tok, config = byte_level_tokenizer(fields), tokenizer_config(fields)
    elif gguf_spm.kind(fields) is not None:
        config = tokenizer_config(fields)
        # transformers' default for a SentencePiece file that does not say: llama.cpp adds BOS to one.
        config.setdefault("add_bos_token", True)
        tok = gguf_spm.build(fields, [config[k] for k in SPECIAL_IDS if config.get(k) is not None])
        tok.post_processor = post_processor(config, tok)
        # transformers' saved config leaves BOS/EOS to the post-processor: `YueTokenizer.load` reads it there.
        config = {k: v for k, v in config.items() if k not in ("add_bos_token", "add_eos_token")}
    else:
        return False
    config = {k: v for k, v in config.items() if v is not None}
    (out / "tokenizer_config.json").write_text(json.dumps(config, ensure_ascii=False, indent=2))
    tok.save(str(out / "tokenizer.json"))  # last: its presence says the tokenizer is complete
    return True
