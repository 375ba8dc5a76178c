"""`yue eval`: a model's validation numbers on a corpus (AR loss, NAR loss, NAR accuracy per slot).

Reuses the training loop's `evaluate` on the corpus's validation split (the same deterministic split
by file that training used), so the numbers are comparable with a training log's evaluations.
"""

from __future__ import annotations

import math
from pathlib import Path

import torch

from yue.engine import load_unprepared
from yue.settings import EvalConfig  # noqa: F401  (its home before yue.settings)
from yue.train.config import TrainConfig
from yue.train.data import PackedSequences, encode_documents, read_corpus, split_documents
from yue.train.loop import evaluate


def evaluate_model(model_dir: str | Path | None, cfg: EvalConfig = EvalConfig()) -> dict:
    """Validation metrics of a model on `cfg.corpus`'s validation split.

    Args:
        model_dir: a model as `yue.load` takes it (a shipped name, a folder, a GGUF; None: the default).
    Returns:
        {"ar_loss", "ar_perplexity", "nar_loss", "nar_acc_per_slot", "sequences", "split"}; "nar_loss"
        and "nar_acc_per_slot" None, with "nar" saying why, for a model whose NAR set is not scored here.
    """
    model, tokenizer, files = load_unprepared(model_dir)
    corpus, batch_size, seq_len, seed = cfg.corpus, cfg.batch_size, cfg.seq_len, cfg.seed
    context = model.config.max_position_embeddings
    if seq_len > context:  # positions past the model's own table: refuse by name, never an IndexError
        raise ValueError(f"seq_len {seq_len} is longer than the model's context ({context} positions)")
    train_cfg = TrainConfig(
        corpus=corpus,
        out=str(files.yue_dir or files.tokenizer_dir),
        seq_len=seq_len,
        batch_size=batch_size,
        anchors=cfg.anchors,
        block_size=model.config.block_size,
        eval_batches=cfg.batches,
        val_fraction=cfg.val_fraction,
        seed=seed,
    )
    docs = read_corpus(corpus)
    _, val_docs = split_documents(docs, cfg.val_fraction)
    split = "validation"
    if not val_docs:  # one document (a .txt file): no split to hold out, and this command trains nothing
        val_docs, split = docs, "all (a one-document corpus has no validation split)"
    val = PackedSequences(encode_documents(val_docs, tokenizer, seed), seq_len, seed)
    top = int(val.data.max()) if val.data.numel() else -1
    if top >= model.config.vocab_size:  # a tokenizer with ids (added tokens) the model has no rows for
        raise ValueError(
            f"corpus: its tokens reach id {top}, but the model's vocabulary has {model.config.vocab_size} "
            "rows: the model and its tokenizer do not match"
        )
    sequences = min(len(val), cfg.batches * batch_size)
    out = {"sequences": sequences, "split": split}
    if model.config.nar_start > 0 or not model.config.has_nar:
        # A top-layer NAR set (yue-smol) trains on the model's own answers from cached entry features
        # (`yue distill --nar-layers`, whose report holds its numbers), a plain Llama has none: the AR
        # loss here, no NAR numbers.
        ar, nar, acc = ar_loss(model, val, sequences, batch_size), None, None
        out["nar"] = (
            "a top-layer NAR set: see its distillation report" if model.config.has_nar else "no NAR set"
        )
    else:
        result = evaluate(model, model, val, train_cfg, model.device)
        ar, nar, acc = result.ar_loss, result.nar_loss, result.nar_acc_per_slot
    return {"ar_loss": ar, "ar_perplexity": math.exp(ar), "nar_loss": nar, "nar_acc_per_slot": acc} | out


@torch.inference_mode()
def ar_loss(model, val: PackedSequences, sequences: int, batch_size: int) -> float:
    """Mean next-token cross-entropy of the AR path over the first `sequences` of `val`."""
    losses = []
    for start in range(0, sequences, batch_size):
        x = val.data[start : min(start + batch_size, sequences)].to(model.device)
        losses.append(float(model(input_ids=x, labels=x).loss) * len(x))
    return sum(losses) / sequences
