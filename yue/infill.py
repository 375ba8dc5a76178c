"""Fill-in-the-middle (infill) prompts, built from a tokenizer's own FIM tokens.

Design decisions:
- A model does infill only if its vocabulary has the three FIM tokens. They are found by name in the
  tokenizer's vocabulary, in the spellings code models ship (StarCoder's `<fim_prefix>`, Qwen2.5-Coder's
  `<|fim_prefix|>`), never assumed; a model without them raises `NoFimTokens` (the server's 400).
- Prompts are PSM (prefix, suffix, middle), the order both families were trained on (Bavarian et al.
  2022, "Efficient Training of Language Models to Fill in the Middle"):
      [prompt prefix] [<file_sep> name \\n text]... <fim_prefix> prefix <fim_suffix> suffix <fim_middle> [start]
  The model then writes the middle; `start` is text already typed after the cursor's line start
  (llama.cpp's `prompt`).
- Ids are joined here, never text with the tokens spelled out: user text is encoded without parsing
  control tokens, so a `<fim_suffix>` typed in a source file stays text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

# (prefix, suffix, middle, file separator) as each family spells them.
FIM_STYLES: dict[str, tuple[str, str, str, str]] = {
    "starcoder": ("<fim_prefix>", "<fim_suffix>", "<fim_middle>", "<file_sep>"),
    "qwen": ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>", "<|file_sep|>"),
}


class NoFimTokens(ValueError):
    """The model's vocabulary has no FIM tokens: it cannot fill in the middle."""


@dataclass(frozen=True)
class FimTokens:
    """A vocabulary's FIM token ids; `file_sep` None where it has no file separator."""

    style: str
    prefix: int
    suffix: int
    middle: int
    file_sep: int | None


def find_fim_tokens(tokenizer) -> FimTokens | None:
    """The FIM tokens of a `YueTokenizer`'s vocabulary, in the first style it has all three of; None if none."""
    lookup = tokenizer.tokenizer.token_to_id
    for style, names in FIM_STYLES.items():
        ids = [lookup(n) for n in names]
        if None not in ids[:3]:
            return FimTokens(style, ids[0], ids[1], ids[2], ids[3])
    return None


def infill_ids(
    tokenizer,
    prefix: str,
    suffix: str,
    *,
    extra: Sequence[tuple[str, str]] = (),
    start: str = "",
    model_name: str = "this model",
) -> list[int]:
    """A PSM infill prompt's token ids (module docstring).

    Args:
        tokenizer: a `YueTokenizer` (its `prompt_prefix`, e.g. BOS, leads the prompt).
        prefix: the text before the cursor.
        suffix: the text after it.
        extra: (file name, text) chunks of other files, as context before the prefix (llama.cpp's
            `input_extra`); joined with the file separator token where the vocabulary has one.
        start: text the middle starts with (llama.cpp's `prompt`), after <fim_middle>.
        model_name: for the error message.

    Raises:
        NoFimTokens: the vocabulary has no FIM tokens.
    """
    fim = find_fim_tokens(tokenizer)
    if fim is None:
        names = " / ".join(", ".join(n[:3]) for n in FIM_STYLES.values())
        raise NoFimTokens(f"{model_name} has no FIM tokens ({names}) in its vocabulary: it cannot infill")
    enc = tokenizer.encode
    ids = list(tokenizer.prompt_prefix)
    for name, text in extra:
        chunk = enc(f"{name}\n{text}" if name else text)
        ids += ([fim.file_sep] if fim.file_sep is not None else []) + chunk
    ids += [fim.prefix, *enc(prefix), fim.suffix, *enc(suffix), fim.middle]
    return ids + enc(start) if start else ids
