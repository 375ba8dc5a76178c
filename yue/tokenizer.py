"""Byte-level BPE tokenizer (Hugging Face `tokenizers`) and the incremental detokenizer for streaming.

Design decisions:
- Byte-level BPE: any UTF-8 text, Chinese and emoji included, round-trips exactly; there is no
  unknown token. Saved as a single `tokenizer.json` beside the weights.
- Special tokens have fixed ids 0..3 (`<|pad|>`, `<|bos|>`, `<|eos|>`, `<|mask|>`), matching the
  defaults of `YueConfig`, so a config never disagrees with its tokenizer.
- Two conventions for prompts. A yue-trained tokenizer (a folder with tokenizer.json only): prompts
  start after `<|eos|>`, as documents did in training, and control-token names in text stay text.
  A Hugging Face tokenizer (a tokenizer_config.json beside it: a Llama folder, a converted GGUF):
  encoding follows transformers' exactly (control tokens in text are parsed, BOS first only where
  the tokenizer adds it), and its chat template, if any, makes the model an instruct model.
- Streaming decodes the whole generated suffix each step and holds back text while it ends in an
  incomplete UTF-8 sequence (U+FFFD), so a delta never splits a character; at the end, a character
  still incomplete (cut by the token limit) is dropped, so neither stream nor text ends in U+FFFD.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

PAD, BOS, EOS, MASK = "<|pad|>", "<|bos|>", "<|eos|>", "<|mask|>"
SPECIAL_TOKENS = [PAD, BOS, EOS, MASK]  # ids 0, 1, 2, 3


class YueTokenizer:
    """A thin wrapper over `tokenizers.Tokenizer` with the special ids the model expects."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        special_ids: dict[str, int | None] | None = None,
        *,
        parse_special: bool = False,
        prompt_prefix: list[int] | None = None,
        chat_template: str | None = None,
    ) -> None:
        """Wrap a `tokenizers.Tokenizer`.

        Args:
            tokenizer: must contain the special tokens by name, unless `special_ids` supplies the ids
                (a distilled Llama's tokenizer names them its own way; its model config knows the ids).
            special_ids: fallback ids for missing names, keys "pad", "bos", "eos", "mask".
            parse_special: read control tokens written in text as those tokens (transformers' default);
                False keeps them text (yue's: a prompt cannot forge `<|eos|>`).
            prompt_prefix: ids a prompt starts with (default: `[eos_id]`, yue's document separator).
            chat_template: the tokenizer's own chat template (an instruct model's), or None.
        """
        self.tokenizer = tokenizer
        self.tokenizer.encode_special_tokens = not parse_special
        fallback = special_ids or {}
        ids = []
        for key, name in zip(("pad", "bos", "eos", "mask"), SPECIAL_TOKENS, strict=True):
            i = tokenizer.token_to_id(name)
            ids.append(i if i is not None else fallback.get(key))
        if any(i is None for i in ids):
            raise ValueError(f"tokenizer lacks special tokens {SPECIAL_TOKENS}")
        self.pad_id, self.bos_id, self.eos_id, self.mask_id = ids
        self.prompt_prefix = [self.eos_id] if prompt_prefix is None else list(prompt_prefix)
        self.chat_template = chat_template

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
        """Load `tokenizer.json` from a file or a model folder (see `__init__` for `special_ids`).

        A `tokenizer_config.json` beside it marks a Hugging Face tokenizer (see the module docstring):
        control tokens are parsed, the prompt prefix is BOS if it says `add_bos_token` (else whatever
        the tokenizer's post-processor puts first), and its chat template is the model's.
        """
        path = Path(path)
        file = path / "tokenizer.json" if path.is_dir() else path
        if not file.is_file():
            raise FileNotFoundError(f"tokenizer not found: {file}")
        try:
            tok = Tokenizer.from_file(str(file))
        except Exception as e:  # tokenizers raises a bare Exception on malformed JSON
            raise ValueError(f"corrupt tokenizer file {file}: {e}") from e
        hf_config = file.parent / "tokenizer_config.json"
        if not hf_config.is_file():
            return cls(tok, special_ids)
        try:
            settings = json.loads(hf_config.read_text(encoding="utf-8"))
        except ValueError as e:
            raise ValueError(f"corrupt tokenizer config {hf_config}: {e}") from e
        add_bos = settings.get("add_bos_token")  # absent: the post-processor decides, as in transformers
        bos = (special_ids or {}).get("bos")  # the model config's BOS; an HF vocabulary has no <|bos|>
        bos = bos if bos is not None else tok.token_to_id(BOS)
        prefix = (
            _post_processor_prefix(tok) if add_bos is None else [bos] if add_bos and bos is not None else []
        )
        template = _template(settings, file.parent)
        return cls(tok, special_ids, parse_special=True, prompt_prefix=prefix, chat_template=template)

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
        """The text's token ids (no special tokens added).

        Raises:
            ValueError: text that is not valid Unicode (a lone UTF-16 surrogate, as JSON's "\\ud800" or
                a `surrogateescape` decode makes: tokenizers would raise a bare TypeError).
        """
        try:
            return self.tokenizer.encode(text, add_special_tokens=False).ids
        except TypeError:
            if isinstance(text, str):  # only then looked at: no extra pass over every prompt
                try:
                    text.encode("utf-8")
                except UnicodeEncodeError as e:
                    at = e.start
                    raise ValueError(
                        f"the text is not valid Unicode: a lone surrogate {text[at]!r} at character {at}"
                    ) from None
            raise

    def encode_prompt(self, text: str) -> list[int]:
        """A prompt's ids (`Engine.encode`): `prompt_prefix`, then the text's tokens; a text that already
        starts with the prefix gets no second one, and an empty prompt gets BOS to condition on."""
        ids, prefix = self.encode(text), self.prompt_prefix
        if prefix and ids[: len(prefix)] == prefix:
            return ids
        return prefix + ids if prefix or ids else [self.bos_id]

    def decode(self, ids: Iterable[int], skip_special_tokens: bool = True) -> str:
        return self.tokenizer.decode(list(ids), skip_special_tokens=skip_special_tokens)


def _template(settings: dict, folder: Path) -> str | None:
    """A Hugging Face tokenizer's chat template: tokenizer_config.json's `chat_template` (a string, or
    a list of named templates: "default"), else chat_template.jinja beside it."""
    template = settings.get("chat_template")
    if isinstance(template, list):
        template = next((t.get("template") for t in template if t.get("name") == "default"), None)
    if isinstance(template, str) and template:
        return template
    file = folder / "chat_template.jinja"
    return file.read_text(encoding="utf-8") if file.is_file() else None


def _post_processor_prefix(tok: Tokenizer) -> list[int]:
    """The ids a tokenizer's post-processor puts before a text (a Llama tokenizer's BOS), as transformers'
    `tokenizer(text)` adds them."""
    plain = tok.encode("a", add_special_tokens=False).ids
    full = tok.encode("a", add_special_tokens=True).ids
    start = next((i for i in range(len(full) - len(plain) + 1) if full[i : i + len(plain)] == plain), 0)
    return full[:start]


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
        """Emit whatever is held back at the end of generation, less a character cut short: the bytes
        of an incomplete UTF-8 sequence at the very end (where `max_new_tokens` stopped inside a
        character) are dropped, never printed as U+FFFD."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        head = self.tokenizer.decode(self.ids[self.prefix : self.read])
        window = self.tokenizer.decode(self.ids[self.prefix :])
        if not final and (len(window) <= len(head) or window.endswith("\ufffd")):
            return ""  # nothing new, or a character still incomplete: wait for more tokens
        if final:  # a cut character decodes as trailing U+FFFD; `head` never ends in one (held back)
            window = window[: max(len(head), len(window.rstrip("\ufffd")))]
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
