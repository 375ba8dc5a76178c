"""Training commands: `yue train-tokenizer`, `yue train`, `yue self-distill`, `yue train-router`, `yue finetune`."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from yue.cli.common import MODEL_HELP, app, command_line, user_errors
from yue.cli.options import config_options
from yue.train.config import FinetuneConfig, TrainConfig
from yue.train.router import RouterTrainConfig
from yue.train.selfdistill import NARFinetuneConfig


@app.command("train-tokenizer")
@user_errors
def train_tokenizer_cmd(
    corpus: str = typer.Option("stdlib", help="'stdlib', a .jsonl / text file, or a folder of source files."),
    vocab_size: int = typer.Option(8192, help="BPE vocabulary size, special tokens included."),
    out: Path = typer.Option(..., help="Folder (or .json path) for tokenizer.json."),
    val_fraction: float = typer.Option(0.02, help="Share of files held out (never seen by the tokenizer)."),
) -> None:
    """Train a byte-level BPE tokenizer on a corpus's training split."""
    from yue.train.data import train_tokenizer

    if vocab_size < 260:
        raise ValueError(f"vocab_size must be >= 260, got {vocab_size}")
    typer.echo(f"wrote {train_tokenizer(corpus, vocab_size, out, val_fraction)}")


@app.command("train")
@user_errors
@config_options(
    TrainConfig,
    exclude=("train_set",),  # --nar-only sets it
    required=("out",),
    csv=("betas",),
)
def train_cmd(
    resume: bool = typer.Option(False, help="Continue from the last checkpoint in OUT."),
    nar_only: bool = typer.Option(False, help="Stage 2: train the NAR set only (AR frozen); needs --init."),
    data: str | None = typer.Option(None, help="Training data for --nar-only (overrides --corpus)."),
    config: TrainConfig | None = None,
) -> None:
    """Train a yue model with the joint AR + NAR loss (runs under `accelerate launch` unchanged)."""
    from yue.train.loop import train

    if nar_only or data is not None:
        config = replace(
            config,
            train_set="nar" if nar_only else config.train_set,
            corpus=data if data is not None else config.corpus,
        )
    typer.echo(f"model: {train(config, resume=resume)}")


@app.command("self-distill")
@user_errors
@config_options(NARFinetuneConfig)
def self_distill_cmd(
    ctx: typer.Context,
    model: Path = typer.Option(..., help="Stage-1 model folder (its AR set stays frozen)."),
    out: Path = typer.Option(..., help="Output model folder (may equal --model to update it in place)."),
    corpus: str = typer.Option("stdlib", help="Prompts are cut from this corpus's training split."),
    sequences: int = typer.Option(576, help="AR-greedy sequences to generate (576 x 256 = 147k tokens)."),
    sequences_file: Path | None = typer.Option(None, help="Reuse / write the sequences here (safetensors)."),
    extra_sequences: list[Path] = typer.Option(
        [], help="A further round: an earlier round's sequences file whose training rows join (repeatable)."
    ),
    prompt_len: int = typer.Option(64, help="Prompt tokens per sequence."),
    new_tokens: int = typer.Option(192, help="Greedy tokens per sequence."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    config: NARFinetuneConfig | None = None,
) -> None:
    """Stage 2: fine-tune the NAR set on the AR path's own greedy outputs (self-distillation)."""
    import json

    import torch

    from yue.train.selfdistill import self_distill

    if threads is not None:
        torch.set_num_threads(threads)
    report = self_distill(
        model,
        out,
        corpus,
        sequences,
        prompt_len,
        new_tokens,
        sequences_file=sequences_file,
        cfg=config,
        extra_sequences=extra_sequences,
        command=command_line(ctx),
    )
    typer.echo(json.dumps(report))


@app.command("train-router")
@user_errors
@config_options(RouterTrainConfig, exclude=("reinit",))  # --user-labels decides it
def train_router_cmd(
    model: Path = typer.Option(..., help="Model folder; its towers stay frozen."),
    out: Path | None = typer.Option(
        None, help="Where to save the model with its new router (default: --model)."
    ),
    data: Path | None = typer.Option(None, help="AR-greedy sequences (safetensors); default: generate them."),
    corpus: str = typer.Option("stdlib", help="Without --data: prompts from this corpus's validation split."),
    sequences: int = typer.Option(256, help="Without --data: AR-greedy sequences to generate."),
    prompt_len: int = typer.Option(64, help="Prompt tokens per generated sequence."),
    new_tokens: int = typer.Option(192, help="Greedy tokens per generated sequence."),
    anchors: int = typer.Option(48, help="Labelled blocks per sequence."),
    user_labels: Path | None = typer.Option(
        None, help='JSONL {"text", "ar_spans"}: fine-tune on must-AR spans.'
    ),
    table: bool = typer.Option(True, help="Decode the dev set at several thresholds and print the table."),
    table_prompts: int = typer.Option(20, help="Dev-set prompts for the threshold table."),
    thresholds: str = typer.Option(
        "0.1,0.3,0.5,0.65,0.8,0.9", help="Comma-separated thresholds for the table."
    ),
    draft_dtype: str = typer.Option(
        "auto", help="Draft in this precision when collecting features, as decoding will (auto: int8 on CPU)."
    ),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    config: RouterTrainConfig | None = None,
) -> None:
    """Stage 3: train the router on acceptance labels (or fine-tune it on user must-AR spans)."""
    import json

    import torch

    from yue.bench.devset import load_devset
    from yue.train.router import run_train_router
    from yue.train.router_eval import format_report, format_threshold_table, threshold_table

    if threads is not None:
        torch.set_num_threads(threads)
    ths = [float(t) for t in thresholds.split(",") if t.strip()]
    if any(not 0.0 <= t <= 1.0 for t in ths):
        raise ValueError(f"thresholds must be in [0, 1], got {thresholds}")
    report = run_train_router(
        model,
        out,
        data=data,
        corpus=corpus,
        n_sequences=sequences,
        prompt_len=prompt_len,
        new_tokens=new_tokens,
        anchors_per_seq=anchors,
        user_labels=user_labels,
        cfg=replace(config, reinit=user_labels is None),
        seed=config.seed,
        drafting_dtype=draft_dtype,
    )
    typer.echo("router on held-out blocks (a_i vs acceptance label; conf = raw slot max-probability):")
    typer.echo(format_report(report["held_out"]))
    folder = out if out is not None else model
    if table:
        prompts = [r["prompt"] for r in load_devset()[:table_prompts]]
        report["threshold_table"] = threshold_table(folder, prompts, ths)
        typer.echo(format_threshold_table(report["threshold_table"]))
        (Path(folder) / "router_report.json").write_text(json.dumps(report, indent=2))
    typer.echo(json.dumps({k: v for k, v in report.items() if k not in ("before", "epoch_losses")}))


@app.command("finetune")
@user_errors
@config_options(FinetuneConfig)
def finetune_cmd(
    ctx: typer.Context,
    model: str | None = typer.Option(None, help=MODEL_HELP),
    data: Path = typer.Option(..., help='Text file, folder, JSONL {"text"} or chat JSONL {"messages"}.'),
    out: Path = typer.Option(
        ..., help="Adapter folder: peft files, drafts.safetensors, finetune_report.json."
    ),
    resume: bool = typer.Option(False, help="Continue the LoRA steps from the last checkpoint in OUT/run."),
    config: FinetuneConfig | None = None,
) -> None:
    """LoRA-fine-tune the AR set on your text, then refresh the drafts for it (report: JSON)."""
    import json

    from yue.train.finetune import finetune

    report = finetune(model, data, out, config, resume=resume, command=command_line(ctx))
    typer.echo(json.dumps({k: v for k, v in report.items() if k not in ("config", "refresh")}))
