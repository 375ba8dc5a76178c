"""`yue generate`: one prompt (an argument or standard input), one answer, streamed on a terminal."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import typer

from yue.cli import common
from yue.cli.common import DTYPE_HELP, LOW_MEMORY_HELP, MODEL_HELP, app, user_errors
from yue.cli.options import config_options
from yue.config import DecodeConfig


def load_engine(model: str | None, device: str, dtype: str, draft_dtype: str, low_memory: bool, adapter):
    """`generate`'s and `chat`'s model, loaded with their shared options."""
    import yue

    return yue.load(
        model, device=device, dtype=dtype, nar_dtype=draft_dtype, adapter=adapter, low_memory=low_memory
    )


@app.command()
@user_errors
@config_options(
    DecodeConfig,
    exclude=("logprobs",),  # the command prints text, not log-probabilities
    helps={"trace": "Print the router's per-step trace to stderr."},
)
def generate(
    prompt: str = typer.Argument(
        ..., help="Text to continue, or an instruct model's user message; - reads it from standard input."
    ),
    model: str | None = typer.Option(None, help=MODEL_HELP),
    system: str | None = typer.Option(
        None, help="A system message before PROMPT (an instruct model's chat template; not with --raw)."
    ),
    raw: bool = typer.Option(
        False, "--raw", help="An instruct model continues PROMPT as written, not as a chat message."
    ),
    adapter: Path | None = typer.Option(None, help="A `yue finetune` adapter folder for this model."),
    draft_dtype: str = typer.Option(
        "auto",
        help="Drafting weights: auto (int8 on CPU) | int8 | bfloat16 | float32. ar/verified output is the same.",
    ),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    dtype: str = typer.Option("float32", help=DTYPE_HELP),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP),
    stream: bool | None = typer.Option(
        None,
        "--stream/--no-stream",
        help="Print text as it is generated (default: on when standard output is a terminal).",
    ),
    trace_json: Path | None = typer.Option(None, help="Write the per-step trace as JSON to this file."),
    config: DecodeConfig | None = None,
) -> None:
    """Continue PROMPT and print the completion (an instruct model answers it through its chat template).

    `echo "Say hello" | yue generate -` reads the prompt from standard input."""
    if prompt == "-":
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise ValueError("the prompt read from standard input is empty")
    if system is not None and raw:
        raise ValueError("--system needs the chat template, which --raw leaves out")
    show_trace = config.trace
    if trace_json is not None:  # the file needs the steps recorded
        config = replace(config, trace=True)
    engine = load_engine(model, device, dtype, draft_dtype, low_memory, adapter)
    if engine.instruct and not raw:
        system_message = [{"role": "system", "content": system}] if system is not None else []
        prompt = engine.chat_prompt([*system_message, {"role": "user", "content": prompt}])
    elif system is not None:
        raise ValueError(f"--system needs an instruct model's chat template, which {engine.name} has not")
    live = common.on_terminal(sys.stdout) if stream is None else stream
    steps, stats = _write(engine, prompt, config, live, show_trace)
    if show_trace and stats is not None:
        typer.echo(_stats_line(stats), err=True)
    if trace_json is not None:
        trace_json.write_text(
            json.dumps({"steps": [asdict(s) for s in steps], "stats": stats.to_dict()}, indent=1)
        )


def _write(engine, prompt: str, config: DecodeConfig, stream: bool, show_trace: bool) -> tuple[list, object]:
    """Generate and print the text (streamed or at the end) and, with `show_trace`, each step to stderr.
    Returns the steps and the run's stats."""
    if not stream:
        result = engine.generate(prompt, config)
        for s in result.trace if show_trace else ():
            typer.echo(s.format(), err=True)
        typer.echo(result.text)
        return result.trace, result.stats
    steps, stats = [], None
    for ev in engine.stream(prompt, config):
        sys.stdout.write(ev.delta)
        sys.stdout.flush()
        steps.extend(ev.trace)
        for s in ev.trace if show_trace else ():
            typer.echo(s.format(), err=True)
        stats = ev.stats or stats
    sys.stdout.write("\n")
    return steps, stats


def _stats_line(stats) -> str:
    return (
        f"[stats] {stats.new_tokens} tokens in {stats.forwards} forwards "
        f"({stats.draft_passes} of them drafting passes; {stats.tokens_per_forward:.2f}/forward, "
        f"{stats.tokens_per_step:.2f}/step), ar={stats.ar_tokens} nar={stats.nar_tokens}, "
        f"{stats.new_tokens / max(stats.total_s, 1e-9):.1f} tok/s"
    )
