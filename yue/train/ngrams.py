"""`yue build-ngrams`: the n-gram table of a model's own answers (`decode/corpus.py`), written into its folder.

The answers are a top-layer distillation's greedy sequences (`ChatSequences` files); a prompt repeated
across files counts once. `extend` keeps the folder's table and adds only the contexts it lacks, so
new answers join without the old ones having to be kept.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from yue.config import YueConfig
from yue.decode.corpus import CorpusNgrams, load_ngrams
from yue.model.hf import NGRAMS_FILE
from yue.train.topnar import ChatSequences


@dataclass(frozen=True)
class NgramConfig:
    """Which continuations the table keeps (`yue build-ngrams`' options; `CorpusNgrams.build` checks them).

    Attributes:
        min_count: keep a continuation seen at least this many times.
        min_share: ... and in at least this share of its context's occurrences.
        max_order: longest context looked up (tokens).
        extend: keep the folder's table and add only the contexts it lacks (new answers, old ones gone).
    """

    min_count: int = 2
    min_share: float = 0.3
    max_order: int = 4
    extend: bool = False


def build_model_ngrams(
    model_dir: Path, sequences: list[Path], cfg: NgramConfig = NgramConfig()
) -> tuple[int, int]:
    """Build (or extend) `model_dir`'s n-gram table from the answers in `sequences`; returns (contexts in
    the table, answers read)."""
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"not a model folder (no config.json): {model_dir}")
    vocab = YueConfig.from_pretrained(str(model_dir)).vocab_size
    old = load_ngrams(model_dir, vocab) if cfg.extend else None  # read (and checked) before the build
    if cfg.extend and old is None:
        raise FileNotFoundError(f"--extend: {model_dir} has no {NGRAMS_FILE} to extend")
    pairs, seen = [], set()
    for file in sequences:
        for ids, p in ChatSequences.load(file).pairs():
            if (prompt := tuple(ids[:p])) not in seen:
                seen.add(prompt)
                pairs.append((ids, p))
    table = CorpusNgrams.build(
        pairs, vocab, max_order=cfg.max_order, min_count=cfg.min_count, min_share=cfg.min_share
    )
    source = f"{len(pairs)} answers from " + ", ".join(str(f) for f in sequences)
    if old is not None:
        source = f"{old.source}; extended with {source}"
        table = old.extended(table)
    table.save(model_dir / NGRAMS_FILE, source=source)
    return len(table), len(pairs)
