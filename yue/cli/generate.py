"""`yue generate`: one prompt (an argument or standard input), one answer, streamed on a terminal."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict, replace
from pathlib import Path

import typer

from yue.cli import common
from yue.cli.common import app, user_errors
from yue.cli.options import config_options
from yue.config import DecodeConfig, LoadConfig


def load_engine(load: LoadConfig):
    """`generate`'s and `chat`'s model (the engine's module, and torch, load only when a command runs)."""
    from yue.engine import load_from

    return load_from(load)


@app.command()
@user_errors
@config_options(
    DecodeConfig,
    exclude=("logprobs",),  # the command prints text, not log-probabilities
    helps={"trace": "Print the router's per-step trace to stderr."},
)
@config_options(LoadConfig, argument="load")
def generate(
    prompt: str = typer.Argument(
        ..., help="Text to continue, or an instruct model's user message; - reads it from standard input."
    ),
    system: str | None = typer.Option(
        None, help="A system message before PROMPT (an instruct model's chat template; not with --raw)."
    ),
    raw: bool = typer.Option(
        False, "--raw", help="An instruct model continues PROMPT as written, not as a chat message."
    ),
    stream: bool | None = typer.Option(
        None,
        "--stream/--no-stream",
        help="Print text as it is generated (default: on when standard output is a terminal).",
    ),
    trace_json: Path | None = typer.Option(None, help="Write the per-step trace as JSON to this file."),
    suffix: str | None = typer.Option(
        None, help="Fill in the middle: PROMPT is the text before, this the text after (needs FIM tokens)."
    ),
    load: LoadConfig | None = None,
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
    engine = load_engine(load)
    if suffix is not None:  # the model's FIM tokens, never its chat template
        prompt = engine.infill(prompt, suffix)
    elif engine.instruct and not raw:
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
