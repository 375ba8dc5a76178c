"""`yue generate`: one prompt (an argument or standard input), one answer, streamed on a terminal."""

from __future__ import annotations

import sys
from pathlib import Path

import typer

from yue.cli import common
from yue.cli.common import DTYPE_HELP, LOW_MEMORY_HELP, MODEL_HELP, app, user_errors


def _sampling(
    mode: str | None,
    max_new_tokens: int,
    temperature: float,
    top_k: int,
    top_p: float,
    repetition_penalty: float,
    seed: int | None,
    stop: list[str],
    **more,
):
    """`generate`'s and `chat`'s decoding options as a DecodeConfig, checked before the model loads (a
    bad value fails at once, not after a load); mode None is the model's default."""
    from yue.config import DecodeConfig

    return DecodeConfig(
        mode=mode,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
        stop=tuple(stop),
        **more,
    )


@app.command()
@user_errors
def generate(
    prompt: str = typer.Argument(
        ..., help="Text to continue, or an instruct model's user message; - reads it from standard input."
    ),
    model: str | None = typer.Option(None, help=MODEL_HELP),
    system: str | None = typer.Option(
        None, help="A system message before PROMPT (an instruct model's chat template; not with --raw)."
    ),
    adapter: Path | None = typer.Option(None, help="A `yue finetune` adapter folder for this model."),
    mode: str | None = typer.Option(
        None,
        help="ar | verified | hybrid | nar (default: the model's default_mode: verified for yue-smol, hybrid for yue-code-mini; ar without a NAR set).",
    ),
    raw: bool = typer.Option(
        False, "--raw", help="An instruct model continues PROMPT as written, not as a chat message."
    ),
    router_threshold: float | None = typer.Option(
        None,
        help="The mode's dial (default: the model's). hybrid: tolerance t, a draft is kept when "
        "p_AR(draft) >= (1 - t) * max p_AR (0 = exact, as verified). verified: slots are drafted where "
        "the router's p_ar <= this (speed only).",
    ),
    drafting: str = typer.Option(
        "separate",
        help="separate (a NAR-only drafting pass, slot 1 revealed) | fused (the block in the step's forward).",
    ),
    draft_dtype: str = typer.Option(
        "auto",
        help="Drafting weights: auto (int8 on CPU) | int8 | bfloat16 | float32. ar/verified output is the same.",
    ),
    max_new_tokens: int = typer.Option(128, help="Maximum tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_k: int = typer.Option(0, help="Keep the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, help="Nucleus mass in (0, 1]."),
    repetition_penalty: float = typer.Option(1.0, help="> 1 discourages repeats."),
    seed: int | None = typer.Option(None, help="Random seed for sampling."),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    dtype: str = typer.Option("float32", help=DTYPE_HELP),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP),
    stream: bool | None = typer.Option(
        None,
        "--stream/--no-stream",
        help="Print text as it is generated (default: on when standard output is a terminal).",
    ),
    trace: bool = typer.Option(False, help="Print the router's per-step trace to stderr."),
    trace_json: Path | None = typer.Option(None, help="Write the per-step trace as JSON to this file."),
) -> None:
    """Continue PROMPT and print the completion (an instruct model answers it through its chat template).

    `echo "Say hello" | yue generate -` reads the prompt from standard input."""
    import json
    from dataclasses import asdict

    import yue

    if prompt == "-":
        prompt = sys.stdin.read()
        if not prompt.strip():
            raise ValueError("the prompt read from standard input is empty")
    if system is not None and raw:
        raise ValueError("--system needs the chat template, which --raw leaves out")
    if stream is None:
        stream = common.on_terminal(sys.stdout)
    cfg = _sampling(
        mode,
        max_new_tokens,
        temperature,
        top_k,
        top_p,
        repetition_penalty,
        seed,
        stop,
        router_threshold=router_threshold,
        drafting=drafting,
        trace=trace or trace_json is not None,
    )
    engine = yue.load(
        model, device=device, dtype=dtype, nar_dtype=draft_dtype, adapter=adapter, low_memory=low_memory
    )
    if engine.instruct and not raw:
        system_message = [{"role": "system", "content": system}] if system is not None else []
        prompt = engine.chat_prompt([*system_message, {"role": "user", "content": prompt}])
    elif system is not None:
        raise ValueError(f"--system needs an instruct model's chat template, which {engine.name} has not")
    steps, stats = [], None
    if stream:
        for ev in engine.stream(prompt, cfg):
            sys.stdout.write(ev.delta)
            sys.stdout.flush()
            steps.extend(ev.trace)
            if trace:
                for s in ev.trace:
                    typer.echo(s.format(), err=True)
            stats = ev.stats or stats
        sys.stdout.write("\n")
    else:
        result = engine.generate(prompt, cfg)
        steps, stats = result.trace, result.stats
        if trace:
            for s in steps:
                typer.echo(s.format(), err=True)
        typer.echo(result.text)
    if trace and stats is not None:
        typer.echo(
            f"[stats] {stats.new_tokens} tokens in {stats.forwards} forwards "
            f"({stats.draft_passes} of them drafting passes; {stats.tokens_per_forward:.2f}/forward, "
            f"{stats.tokens_per_step:.2f}/step), ar={stats.ar_tokens} nar={stats.nar_tokens}, "
            f"{stats.new_tokens / max(stats.total_s, 1e-9):.1f} tok/s",
            err=True,
        )
    if trace_json is not None:
        trace_json.write_text(
            json.dumps({"steps": [asdict(s) for s in steps], "stats": stats.to_dict()}, indent=1)
        )
