"""`yue eval`: validation numbers of a model folder on a corpus."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from yue.cli import app


def test_eval_reports_losses_and_per_slot_accuracy(tiny_model_dir, tmp_path):
    corpus = tmp_path / "src"
    corpus.mkdir()
    for i in range(60):  # enough files that the hash split puts some in validation
        (corpus / f"m{i}.py").write_text(f"def f{i}(x):\n    return x + {i}\n" * 20)
    res = CliRunner().invoke(
        app, ["eval", "--model", tiny_model_dir, "--corpus", str(corpus), "--batches", "1", "--seq-len", "32"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(next(ln for ln in res.output.splitlines() if ln.startswith("{")))
    assert out["ar_loss"] > 0 and len(out["nar_acc_per_slot"]) == 4
    assert all(0.0 <= a <= 1.0 for a in out["nar_acc_per_slot"])


def test_eval_on_a_missing_model_is_a_one_line_error(tmp_path):
    res = CliRunner().invoke(app, ["eval", "--model", str(tmp_path / "nope")])
    assert res.exit_code == 2


def test_eval_of_a_one_document_corpus_scores_the_whole_text(tiny_model_dir, tmp_path):
    # A .txt file is one document: no validation split to hold out, so the whole text (said so).
    text = tmp_path / "notes.txt"
    text.write_text("def add(a, b):\n    return a + b\n" * 40)
    res = CliRunner().invoke(
        app, ["eval", "--model", tiny_model_dir, "--corpus", str(text), "--seq-len", "32"]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(res.output.strip().splitlines()[-1])
    assert out["ar_loss"] > 0 and out["split"].startswith("all") and out["sequences"] >= 1


def test_eval_of_an_ar_only_gguf_gives_the_ar_loss_transformers_gives(tiny_gguf, gguf_cache, tmp_path):
    import torch

    from yue.engine import load_unprepared
    from yue.train.data import PackedSequences, encode_documents, read_corpus
    from yue.train.evaluate import EvalConfig, evaluate_model

    text = tmp_path / "notes.txt"
    text.write_text("Hello, world! How are you today? " * 40)
    out = evaluate_model(tiny_gguf.path, EvalConfig(corpus=str(text), batches=1, batch_size=2, seq_len=16))
    assert (out["nar_loss"], out["nar_acc_per_slot"], out["nar"]) == (None, None, "no NAR set")
    tokenizer = load_unprepared(tiny_gguf.path)[1]
    x = PackedSequences(encode_documents(read_corpus(text), tokenizer, 0), 16, 0).data[:2]
    with torch.inference_mode():
        ref = float(tiny_gguf.reference_model()(input_ids=x, labels=x).loss)
    assert out["ar_loss"] == pytest.approx(ref, rel=1e-4)
