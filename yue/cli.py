"""The `yue` command: thin subcommands over library functions (keyword arguments only).

User mistakes (ValueError, including CheckpointError) print one line and exit with code 2, no
traceback. Each subcommand imports what it needs inside its body, so `yue --help` stays fast.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Fast text generation with an AR-NAR Mixture-of-Transformers.",
)


def user_errors(fn):
    """Turn ValueError / FileNotFoundError into a one-line message and exit code 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except (ValueError, FileNotFoundError) as e:
            typer.echo(f"error: {e}", err=True)
            raise typer.Exit(code=2) from None

    return wrapper


@app.command()
@user_errors
def generate(
    prompt: str = typer.Argument(..., help="Text to continue."),
    model: Path | None = typer.Option(None, help="Model folder (default: the shipped yue-code-mini)."),
    mode: str = typer.Option("hybrid", help="ar | verified | hybrid | nar"),
    router_threshold: float | None = typer.Option(None, help="p_ar above this goes AR (default: model's)."),
    max_new_tokens: int = typer.Option(128, help="Maximum tokens to generate."),
    temperature: float = typer.Option(0.0, help="0 = greedy."),
    top_k: int = typer.Option(0, help="Keep the k most likely tokens (0 = off)."),
    top_p: float = typer.Option(1.0, help="Nucleus mass in (0, 1]."),
    repetition_penalty: float = typer.Option(1.0, help="> 1 discourages repeats."),
    seed: int | None = typer.Option(None, help="Random seed for sampling."),
    stop: list[str] = typer.Option([], help="Stop string (repeatable)."),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    stream: bool = typer.Option(False, help="Print text as it is generated."),
    trace: bool = typer.Option(False, help="Print the router's per-step trace to stderr."),
    trace_json: Path | None = typer.Option(None, help="Write the per-step trace as JSON to this file."),
) -> None:
    """Continue PROMPT and print the completion."""
    import json
    from dataclasses import asdict

    import yue
    from yue.config import DecodeConfig

    cfg = DecodeConfig(
        mode=mode,
        max_new_tokens=max_new_tokens,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        repetition_penalty=repetition_penalty,
        seed=seed,
        stop=tuple(stop),
        router_threshold=router_threshold,
        trace=trace or trace_json is not None,
    )
    engine = yue.load(model, device=device)
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
            f"({stats.tokens_per_forward:.2f}/forward), ar={stats.ar_tokens} nar={stats.nar_tokens}, "
            f"{stats.new_tokens / max(stats.total_s, 1e-9):.1f} tok/s",
            err=True,
        )
    if trace_json is not None:
        trace_json.write_text(
            json.dumps({"steps": [asdict(s) for s in steps], "stats": stats.to_dict()}, indent=1)
        )


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


def main() -> None:
    app()


if __name__ == "__main__":
    main()
