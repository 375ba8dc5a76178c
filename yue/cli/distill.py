"""`yue distill`: a NAR set for an existing model in one command (`train/distill_run.py`), and
`yue distill-recipe`: the explicit recipes behind it, every setting by hand."""

from __future__ import annotations

from pathlib import Path

import typer

from yue.cli.common import app, user_errors
from yue.cli.options import config_options
from yue.train.recipe import RecipeConfig


@app.command("distill")
@user_errors
def distill_cmd(
    model: str = typer.Argument(
        ...,
        help="Your model: a .gguf file, a Hugging Face folder (Llama, Qwen2/3, Gemma 3, Mistral) or a name.",
    ),
    hours: float = typer.Option(..., help="Wall-time budget in hours (data, training, calibration, report)."),
    out: Path | None = typer.Option(
        None, help="Output model folder (default: ./<model>-yue). Rerun to resume."
    ),
    device: str = typer.Option("auto", help="cpu, cuda or auto (CUDA when available)."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    stop_after: str | None = typer.Option(
        None, help="Stop after this stage (plan, heldout, data, train, calibrate); rerun to continue."
    ),
) -> None:
    """Give MODEL a NAR set within a time budget: one command that chooses its shape from the model and
    this machine's costs, writes the model's own answers, trains, calibrates on a held-out split and
    writes a model folder every command takes, ending with a report (OUT/distill_report.json, .png).

    Interrupted (Ctrl-C, a kill), the same command resumes where it stopped (state in OUT/work).
    """
    import logging

    import torch

    from yue.registry import model_name
    from yue.train.distill_report import format_report
    from yue.train.distill_run import DistillStopped, distill

    if threads is not None:
        torch.set_num_threads(threads)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    out = out if out is not None else Path(f"{model_name(model)}-yue")
    try:
        report = distill(model, out, hours, device=device, stop_after=stop_after)
    except DistillStopped as e:
        typer.echo(str(e), err=True)
        return
    except KeyboardInterrupt:
        typer.echo(f"\ninterrupted: run the same command again to resume from {out / 'work'}", err=True)
        raise typer.Exit(130) from None
    typer.echo(format_report(report))


@app.command("distill-recipe")
@user_errors
@config_options(RecipeConfig)
def distill_recipe_cmd(
    base: str = typer.Option(
        ...,
        help="The AR set: a Llama-family Hugging Face folder (safetensors + tokenizer.json); with "
        "--nar-layers also a .gguf file or a model name (its AR source).",
    ),
    out: Path = typer.Option(..., help="Output yue model folder."),
    config: RecipeConfig | None = None,
) -> None:
    """`yue distill`'s explicit recipes, every setting by hand (--nar-layers: on the top layers only).

    A rerun of the same command resumes: greedy answers and training checkpoints stay in OUT/work.
    """
    import json

    from yue.train.recipe import distill_recipe

    report = distill_recipe(base, out, config)
    if config.nar_layers is not None:  # the top-layer report's summary; its model card holds the rest
        report = {k: report[k] for k in ("history", "times_s", "wall_s")}
    typer.echo(json.dumps(report))
