"""`yue eval`: validation numbers of a model folder on a corpus."""

from __future__ import annotations

import json

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
