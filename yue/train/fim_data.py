"""Fill-in-the-middle (FIM) training rows: a tokenizer's FIM tokens added, and batches mixing FIM and
left-to-right rows as a pure function of (seed, step).

Design decisions:
- The FIM tokens are StarCoder's names (`<fim_prefix>`, `<fim_suffix>`, `<fim_middle>`), so
  `yue.infill.find_fim_tokens` recognises them by name. A vocabulary without them gets them as new
  special tokens at the end (ids vocab_size, +1, +2): every existing id and every text's encoding stay
  as they were, and the model grows by three embedding rows. No `<file_sep>` is added: no training
  row here has several files, so it would stay untrained.
- A FIM row is the document separator, then PSM (prefix, suffix, middle), the order `yue.infill`
  prompts with, or SPM in StarCoder's variant (Bavarian et al. 2022, "Efficient Training of Language
  Models to Fill in the Middle"), which trains the same middle after the prefix in another order:
      PSM: <|eos|> <fim_prefix> p <fim_suffix> s <fim_middle> m <|eos|> [left-to-right filler]
      SPM: <|eos|> <fim_prefix> <fim_suffix> s <fim_middle> p m <|eos|> [left-to-right filler]
  The closing `<|eos|>` teaches the model to stop where the middle meets the suffix. A row shorter
  than `seq_len` is filled with left-to-right tokens of the training stream, as packed documents are.
- Prefix, middle and suffix are encoded apart, as `yue.infill.infill_ids` encodes a request, so the
  token boundaries at the cuts are the ones inference meets.
- Cut points: mostly at line boundaries, half of them just before a line's newline (the cut the
  bench's code prompts use, `yue.bench.devset`: the newline and the next line's indentation stay one
  token) and half just after it; the rest at a random character of the middle's first line. Middles
  are one line half the time, else up to `max_middle_lines` lines.
- The rest of each batch is left-to-right windows of the training stream (`PackedSequences`), so the
  left-to-right task keeps being trained.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import torch
from tokenizers import AddedToken

from yue.infill import FIM_STYLES, FimTokens, find_fim_tokens
from yue.tokenizer import YueTokenizer
from yue.train.data import PackedSequences

FIM_NAMES = FIM_STYLES["starcoder"][:3]
_CONTEXT_CHARS = 3000  # text kept on each side of a middle before encoding (more than seq_len tokens)


def add_fim_tokens(tokenizer: YueTokenizer) -> FimTokens:
    """The tokenizer's FIM tokens, added as special tokens (new ids at the end) where it has none."""
    found = find_fim_tokens(tokenizer)
    if found is not None:
        return found
    tokenizer.tokenizer.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in FIM_NAMES])
    found = find_fim_tokens(tokenizer)
    if found is None:
        raise RuntimeError("FIM tokens were added but are not found by name")
    return found


def grow_vocab(model, vocab_size: int) -> int:
    """Grow a `YueForCausalLM`'s tied embedding to `vocab_size` rows; returns how many were added.

    New rows start at the mean row: a neutral input, and an output logit the model does not favour
    over the tokens it has learnt (old rows are kept bit for bit).
    """
    old = model.model.embed_tokens.weight.data  # (V, D)
    grow = vocab_size - old.shape[0]
    if grow <= 0:
        return 0
    rows = old.mean(0, keepdim=True).expand(grow, -1)  # (grow, D)
    model.model.embed_tokens = torch.nn.Embedding.from_pretrained(torch.cat([old, rows]), freeze=False)
    model.lm_head.weight = model.model.embed_tokens.weight  # tied, as the config says
    model.config.vocab_size = vocab_size
    return grow


@dataclass(frozen=True)
class FimSettings:
    """Mix and cut settings (module docstring)."""

    fim_rate: float = 0.5  # share of a batch's rows that are FIM rows
    spm_rate: float = 0.2  # share of FIM rows in SPM order
    char_cut_rate: float = 0.1  # share of middles that start at a random character
    max_middle_lines: int = 6
    max_middle_tokens: int = 96


@dataclass(frozen=True)
class FimCut:
    """One document cut into (prefix, middle, suffix) text."""

    prefix: str
    middle: str
    suffix: str


def cut_document(text: str, rng: random.Random, s: FimSettings) -> FimCut | None:
    """A random (prefix, middle, suffix) of a document whose middle starts at a non-blank line; None
    when the document has too few such lines."""
    lines = text.split("\n")
    starts = [i for i, ln in enumerate(lines) if ln.strip() and i > 0]
    if len(starts) < 2:
        return None
    i = rng.choice(starts)
    k = 1 if rng.random() < 0.5 else rng.randint(2, s.max_middle_lines)
    j = min(len(lines), i + k)  # middle = lines[i:j]
    before, mid, after = "\n".join(lines[:i]), "\n".join(lines[i:j]), "\n".join(lines[j:])
    if rng.random() < s.char_cut_rate and len(lines[i]) > 1:
        at = rng.randrange(1, len(lines[i]))  # inside the first middle line
        before, mid = before + "\n" + mid[:at], mid[at:]
        return FimCut(before, mid, "\n" + after if j < len(lines) else "")
    if rng.random() < 0.5:  # before the newline: the middle is "\n" + its lines
        return FimCut(before, "\n" + mid, "\n" + after if j < len(lines) else "")
    return FimCut(before + "\n", mid + ("\n" if j < len(lines) else ""), after)


def fim_row(
    cut: FimCut, tokenizer: YueTokenizer, fim: FimTokens, seq_len: int, spm: bool, rng: random.Random
) -> list[int] | None:
    """A FIM row's ids (module docstring), at most `seq_len` long; None if the middle is too long."""
    enc = tokenizer.tokenizer.encode_batch(
        [cut.prefix[-_CONTEXT_CHARS:], cut.middle, cut.suffix[:_CONTEXT_CHARS]], add_special_tokens=False
    )
    p, m, s = (e.ids for e in enc)
    budget = seq_len - len(m) - 5  # separator, three FIM tokens, the closing eos
    if not m or budget < 16:
        return None
    keep_p = min(len(p), max(int(budget * rng.uniform(0.4, 0.85)), budget - len(s)))
    keep_s = min(len(s), budget - keep_p)
    p, s = p[len(p) - keep_p :], s[:keep_s]
    eos = tokenizer.eos_id
    if spm:
        return [eos, fim.prefix, fim.suffix, *s, fim.middle, *p, *m, eos]
    return [eos, fim.prefix, *p, fim.suffix, *s, fim.middle, *m, eos]


class FimBatches:
    """Training batches of FIM and left-to-right rows, each batch a pure function of (seed, step).

    Args:
        texts: the training documents' texts.
        stream: the same documents as a packed left-to-right stream (`PackedSequences`), for the
            left-to-right rows and the filler.
        tokenizer, fim: the tokenizer and its FIM tokens.
        seed: the data's seed.
        settings: the mix (`FimSettings`).
    """

    def __init__(
        self,
        texts: list[str],
        stream: PackedSequences,
        tokenizer: YueTokenizer,
        fim: FimTokens,
        seed: int,
        settings: FimSettings = FimSettings(),
    ) -> None:
        self.texts, self.stream, self.tokenizer, self.fim = texts, stream, tokenizer, fim
        self.seed, self.settings, self.seq_len = seed, settings, stream.data.shape[1]
        self.weights = np.cumsum([len(t) for t in texts], dtype=np.int64)  # documents by length
        self.tokens = stream.data.flatten()  # (n * seq_len,) the stream, for filler

    def _document(self, rng: random.Random) -> str:
        at = rng.randrange(int(self.weights[-1]))
        return self.texts[int(np.searchsorted(self.weights, at, side="right"))]

    def _filler(self, n: int, rng: random.Random) -> list[int]:
        start = rng.randrange(len(self.tokens) - n) if len(self.tokens) > n else 0
        return self.tokens[start : start + n].tolist()

    def fim_row(self, rng: random.Random) -> list[int]:
        """One FIM row of exactly `seq_len` ids (a new draw until a document offers a cut)."""
        s = self.settings
        while True:
            cut = cut_document(self._document(rng), rng, s)
            if cut is None or len(self.tokenizer.encode(cut.middle)) > s.max_middle_tokens:
                continue
            row = fim_row(cut, self.tokenizer, self.fim, self.seq_len, rng.random() < s.spm_rate, rng)
            if row is not None:
                return row + self._filler(self.seq_len - len(row), rng)

    def batch(self, step: int, batch_size: int) -> tuple[torch.Tensor, int]:
        """(B, seq_len) long rows of step `step`, FIM rows first, and how many of them are FIM rows."""
        rng = random.Random(self.seed * 1_000_003 + step)
        n_fim = sum(rng.random() < self.settings.fim_rate for _ in range(batch_size))
        rows = [self.fim_row(rng) for _ in range(n_fim)]
        ar = self.stream.batch(step, batch_size)[: batch_size - n_fim]  # (B - n_fim, seq_len)
        fim = torch.tensor(rows, dtype=torch.long).reshape(n_fim, self.seq_len)
        return torch.cat([fim, ar.long()], dim=0), n_fim
