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
def train_cmd(
    corpus: str = typer.Option("stdlib", help="'stdlib', a .jsonl / text file, or a folder of source files."),
    out: Path = typer.Option(..., help="Run folder: checkpoints, log.jsonl, final model in OUT/model."),
    tokenizer: Path | None = typer.Option(None, help="tokenizer.json (default: trained on the corpus)."),
    vocab_size: int = typer.Option(8192, help="Vocabulary size when the tokenizer is trained here."),
    steps: int = typer.Option(1000, help="Optimizer steps."),
    seq_len: int = typer.Option(256, help="Tokens per training sequence."),
    batch_size: int = typer.Option(16, help="Sequences per step (per process)."),
    lr: float = typer.Option(3e-3, help="Peak learning rate (warm-up, then cosine)."),
    warmup_steps: int = typer.Option(100, help="Linear warm-up steps."),
    block_size: int = typer.Option(8, help="K: slots per NAR block."),
    anchors: int = typer.Option(8, help="M: NAR blocks per sequence."),
    alpha: float = typer.Option(1.0, help="Weight of the AR cross-entropy."),
    beta: float = typer.Option(0.8, help="Weight of the NAR cross-entropy."),
    gamma: float = typer.Option(0.2, help="Weight of KL(sg(p_AR) || p_NAR)."),
    reveal_prob: float = typer.Option(0.1, help="Chance a slot sees its true token (mask-predict)."),
    hidden_size: int = typer.Option(256, help="Model width."),
    layers: int = typer.Option(4, help="Transformer layers."),
    heads: int = typer.Option(8, help="Attention heads."),
    kv_heads: int = typer.Option(4, help="Key/value heads (grouped-query attention)."),
    intermediate_size: int = typer.Option(688, help="MLP width."),
    eval_every: int = typer.Option(200, help="Evaluate every N steps."),
    save_every: int = typer.Option(200, help="Checkpoint every N steps."),
    seed: int = typer.Option(0, help="Seed for init, data order, anchors."),
    threads: int | None = typer.Option(None, help="torch threads (default: torch's choice)."),
    resume: bool = typer.Option(False, help="Continue from the last checkpoint in OUT."),
    nar_only: bool = typer.Option(False, help="Stage 2: train the NAR set only (AR frozen); needs --init."),
    init: Path | None = typer.Option(None, help="Start from this model folder."),
    data: str | None = typer.Option(None, help="Training data for --nar-only (overrides --corpus)."),
) -> None:
    """Train a yue model with the joint AR + NAR loss (runs under `accelerate launch` unchanged)."""
    from yue.train.config import TrainConfig
    from yue.train.loop import train

    cfg = TrainConfig(
        corpus=data if data is not None else corpus,
        out=str(out),
        tokenizer=str(tokenizer) if tokenizer else None,
        vocab_size=vocab_size,
        init=str(init) if init else None,
        train_set="nar" if nar_only else "all",
        steps=steps,
        seq_len=seq_len,
        batch_size=batch_size,
        lr=lr,
        warmup_steps=warmup_steps,
        block_size=block_size,
        anchors=anchors,
        alpha=alpha,
        beta=beta,
        gamma=gamma,
        reveal_prob=reveal_prob,
        hidden_size=hidden_size,
        layers=layers,
        heads=heads,
        kv_heads=kv_heads,
        intermediate_size=intermediate_size,
        eval_every=eval_every,
        save_every=save_every,
        seed=seed,
        threads=threads,
    )
    typer.echo(f"model: {train(cfg, resume=resume)}")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
