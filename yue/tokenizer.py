"""Byte-level BPE tokenizer (Hugging Face `tokenizers`) and the incremental detokenizer for streaming.

Design decisions:
- Byte-level BPE: any UTF-8 text, Chinese and emoji included, round-trips exactly; there is no
  unknown token. Saved as a single `tokenizer.json` beside the weights.
- Special tokens have fixed ids 0..3 (`<|pad|>`, `<|bos|>`, `<|eos|>`, `<|mask|>`), matching the
  defaults of `YueConfig`, so a config never disagrees with its tokenizer.
- Streaming decodes the whole generated suffix each step and holds back text while it ends in an
  incomplete UTF-8 sequence (U+FFFD), so a delta never splits a character.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS, MASK = "<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, MASK]  # ids 0, 1, 2, 3


class YueTokenizer:
    """A thin wrapper over `tokenizers.Tokenizer` with the special ids the model expects."""

    def __init__(self, tokenizer: Tokenizer, special_ids: dict[str, int | None] | None = None) -> None:
        """Wrap a `tokenizers.Tokenizer`.

        Args:
            tokenizer: must contain the special tokens by name, unless `special_ids` supplies the ids
                (a distilled Llama's tokenizer names them its own way; its model config knows the ids).
            special_ids: fallback ids for missing names, keys "pad", "bos", "eos", "mask".
        """
        self.tokenizer = tokenizer
        # Text that merely contains "<|eos|>" etc. is ordinary text, never a control token.
        self.tokenizer.encode_special_tokens = True
        fallback = special_ids or {}
        ids = []
        for key, name in zip(("pad", "bos", "eos", "mask"), SPECIAL_TOKENS, strict=True):
            i = tokenizer.token_to_id(name)
            ids.append(i if i is not None else fallback.get(key))
        if any(i is None for i in ids):
            raise ValueError(f"tokenizer lacks special tokens {SPECIAL_TOKENS}")
        self.pad_id, self.bos_id, self.eos_id, self.mask_id = ids

    @classmethod
    def train(cls, texts: Iterable[str], vocab_size: int = 8192, show_progress: bool = False) -> YueTokenizer:
        """Train a byte-level BPE on `texts` (seconds for a small corpus)."""
        if vocab_size < len(SPECIAL_TOKENS) + 256:
            raise ValueError(f"vocab_size must be >= {len(SPECIAL_TOKENS) + 256}, got {vocab_size}")
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=SPECIAL_TOKENS,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=show_progress,
        )
        tok.train_from_iterator(texts, trainer=trainer)
        return cls(tok)

    @classmethod
    def load(cls, path: str | Path, special_ids: dict[str, int | None] | None = None) -> YueTokenizer:
        """Load `tokenizer.json` from a file or a model folder (see `__init__` for `special_ids`)."""
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer not found: {file}")
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise ValueError(f"corrupt tokenizer file {file}: {e}") from e
        return cls(tok, special_ids)

    def save(self, path: str | Path) -> Path:
        """Write `tokenizer.json` into a folder (or to the given file path)."""
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() or not path.suffix else path
        file.parent.mkdir(parents=True, exist_ok=True)
        self.tokenizer.save(str(file))
        return file

    @property
    def vocab_size(self) -> int:
        return self.tokenizer.get_vocab_size()

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False).ids

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


class IncrementalDetokenizer:
    """Turns a growing list of token ids into text deltas that never split a UTF-8 character.

    Byte-level BPE tokens can end inside a multi-byte character; decoding such a prefix yields U+FFFD
    at the end. We hold those bytes back until the character completes.

    Each push decodes a short window, not the whole list (the prefix/read offsets of Hugging Face's
    text-generation-inference): ids[prefix:read] are the tokens of the last emitted delta, ids[read:]
    the ones not emitted yet. The delta is what decoding ids[prefix:] adds to decoding ids[prefix:read];
    both start at the same token, so whatever a decoder does at a window's start cancels out. A push
    costs O(1) however long the generation (decoding all ids each time made a stream O(n^2)).
    """

    def __init__(self, tokenizer: YueTokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.text = ""  # text emitted so far
        self.prefix = 0  # ids[prefix:read]: the tokens of the last delta emitted
        self.read = 0  # ids[:read] are in self.text

    def push(self, new_ids: Iterable[int]) -> str:
        """Append tokens; return the newly completed text (possibly empty)."""
        self.ids.extend(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Emit whatever is held back at the end of generation (a dangling partial character)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        head = self.tokenizer.decode(self.ids[self.prefix : self.read])
        window = self.tokenizer.decode(self.ids[self.prefix :])
        if not final and (len(window) <= len(head) or window.endswith("\ufffd")):
            return ""  # nothing new, or a character still incomplete: wait for more tokens
        delta = window[len(head) :]
        self.text += delta
        self.prefix, self.read = self.read, len(self.ids)
        return delta


def iter_deltas(tokenizer: YueTokenizer, chunks: Iterable[list[int]]) -> Iterator[str]:
    """Text deltas for a stream of token-id chunks (convenience for tests and adapters)."""
    detok = IncrementalDetokenizer(tokenizer)
    for chunk in chunks:
        if delta := detok.push(chunk):
            yield delta
    if tail := detok.flush():
        yield tail
