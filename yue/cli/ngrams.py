"""`yue build-ngrams`: a model's table of its own answers (its options' config loads the n-gram code,
so the command has a module of its own and `yue models` stays light)."""

from __future__ import annotations

from pathlib import Path

import typer

from yue.cli.common import app, user_errors
from yue.cli.options import config_options
from yue.train.ngrams import NgramConfig


@app.command("build-ngrams")
@user_errors
@config_options(NgramConfig)
def build_ngrams_cmd(
    model_dir: Path = typer.Argument(..., help="yue model folder: ngrams.safetensors is written into it."),
    sequences: list[Path] = typer.Option(
        ...,
        "--sequences",
        help="The model's own greedy answers: a `yue distill-recipe --nar-layers` run's work/sequences.json "
        "(or .json.gz); repeatable. Prompts repeated across files count once.",
    ),
    config: NgramConfig | None = None,
) -> None:
    """Build the n-gram table of a model's own answers, from which `verified` drafts where the context
    has no copy (decode/corpus.py). The output stays `ar`'s; only speed changes."""
    from yue.model.hf import NGRAMS_FILE
    from yue.train.ngrams import build_model_ngrams

    contexts, answers = build_model_ngrams(model_dir, sequences, config)
    typer.echo(f"wrote {model_dir / NGRAMS_FILE}: {contexts:,} contexts from {answers:,} answers")
