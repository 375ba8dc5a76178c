"""`yue eval`: a model's validation numbers on a corpus (AR loss, NAR loss, NAR accuracy per slot).

Reuses the training loop's `evaluate` on the corpus's validation split (the same deterministic split
by file that training used), so the numbers are comparable with a training log's evaluations.
"""

from __future__ import annotations

import math
from pathlib import Path

from yue.model.hf import load_model
from yue.tokenizer import YueTokenizer
from yue.train.config import TrainConfig
from yue.train.data import PackedSequences, encode_documents, read_corpus, split_documents
from yue.train.loop import evaluate


def evaluate_model(
    model_dir: str | Path,
    corpus: str = "stdlib",
    batches: int = 8,
    batch_size: int = 8,
    seq_len: int = 256,
    anchors: int = 8,
    val_fraction: float = 0.02,
    seed: int = 0,
) -> dict:
    """Validation metrics of the model in `model_dir` on `corpus`'s validation split.

    Returns:
        {"ar_loss", "ar_perplexity", "nar_loss", "nar_acc_per_slot", "sequences"}.
    """
    model = load_model(model_dir)
    tokenizer = YueTokenizer.load(model_dir)
    cfg = TrainConfig(
        corpus=corpus,
        out=str(model_dir),
        seq_len=seq_len,
        batch_size=batch_size,
        anchors=anchors,
        block_size=model.config.block_size,
        eval_batches=batches,
        val_fraction=val_fraction,
        seed=seed,
    )
    _, val_docs = split_documents(read_corpus(corpus), val_fraction)
    if not val_docs:
        raise ValueError(f"corpus: {corpus!r} has no validation files at val_fraction={val_fraction}")
    val = PackedSequences(encode_documents(val_docs, tokenizer, seed), seq_len, seed)
    result = evaluate(model, model, val, cfg, model.device)
    return {
        "ar_loss": result.ar_loss,
        "ar_perplexity": math.exp(result.ar_loss),
        "nar_loss": result.nar_loss,
        "nar_acc_per_slot": result.nar_acc_per_slot,
        "sequences": min(len(val), batches * batch_size),
    }
