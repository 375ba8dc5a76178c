"""Measuring: `yue bench`, `yue bench-serve`, `yue bench-sizes` (`yue eval`: evaluate.py)."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import typer

from yue.bench.harness import BenchConfig
from yue.bench.profile import ProfileConfig
from yue.bench.serving import ServeBenchConfig
from yue.cli.common import LLAMA_FLAGS, MODEL_HELP, app, user_errors
from yue.cli.options import config_options
from yue.settings import LoadConfig


@app.command("bench")
@user_errors
@config_options(
    BenchConfig,
    csv=("modes", "thresholds", "verified_thresholds", "batch_sizes"),
    helps={"model": MODEL_HELP},
    aliases=LLAMA_FLAGS,
)
def bench_cmd(
    adapter: Path | None = typer.Option(
        None, help="A `yue finetune` adapter folder: the bench runs the merged model (peers too)."
    ),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the JSON document here."),
    plot: Path | None = typer.Option(None, help="Write the speed vs fidelity plot (PNG) here."),
    config: BenchConfig | None = None,
) -> None:
    """Compare the decode modes with transformers and llama.cpp on the same weights; JSON on the last line."""
    from rich.console import Console

    from yue.bench.harness import run_bench
    from yue.bench.report import plot as write_plot
    from yue.bench.report import print_report

    if adapter is not None:  # every entry, the peers included, runs the adapted weights
        config = replace(config, model=_merged_for_bench(config.model, adapter))
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    result = run_bench(config, log=lambda s: err.print(f"[bench] {s}", markup=False))
    if plot is not None:
        err.print(f"[bench] plot written to {write_plot(result, plot)}", markup=False)
    line = print_report(result)
    if json_out is not None:
        json_out.write_text(line + "\n")


@app.command("profile")
@user_errors
@config_options(
    ProfileConfig,
    csv=("modes",),
    helps={"model": MODEL_HELP},
    aliases={"max_new_tokens": ("-n", "--max-new-tokens")},
)
def profile_cmd(
    json_out: Path | None = typer.Option(None, "--json", help="Also write the JSON document here."),
    config: ProfileConfig | None = None,
) -> None:
    """Where a verifying step's time goes: each phase as a fraction of an `ar` step; JSON on the last line."""
    import json

    from yue.bench.profile import run_profile, table

    doc = run_profile(config, log=lambda s: typer.echo(f"[profile] {s}", err=True))
    typer.echo(table(doc))
    line = json.dumps(doc)
    typer.echo(line)
    if json_out is not None:
        json_out.write_text(line + "\n")


@app.command("bench-serve")
@user_errors
@config_options(
    ServeBenchConfig, csv=("batch_sizes", "clients"), aliases={"max_tokens": ("-n", "--max-new-tokens")}
)
@config_options(
    LoadConfig,
    argument="load",
    exclude=("adapter",),
    defaults={"model": "yue-code-mini"},
    aliases=LLAMA_FLAGS,
)
def bench_serve_cmd(
    json_out: Path | None = typer.Option(None, "--json", help="Also write the JSON document here."),
    load: LoadConfig | None = None,
    config: ServeBenchConfig | None = None,
) -> None:
    """Tokens/s (prefill and decode apart) and time to first token of `yue serve` under concurrent
    streamed clients; with --chat-turns N, time to first token per turn of N-turn chats with the prefix
    cache and without. JSON last."""
    from yue.bench.chat import bench_chat, chat_report
    from yue.bench.serving import bench_serve, report
    from yue.engine import load_from

    engine = load_from(load)
    run = bench_chat if config.chat_turns else bench_serve  # the chat bench, or the levels
    result = run(
        engine, config, log=lambda s: typer.echo(f"[bench-serve] {s}", err=True), precision=load.dtype
    )
    if config.chat_turns:
        text = chat_report(result)
    else:
        text = report(result, config.batch_sizes[0], config.batch_sizes[-1])
    typer.echo(text)
    if json_out is not None:
        json_out.write_text(text.splitlines()[-1] + "\n")


def _merged_for_bench(model: str | None, adapter: Path) -> Path:
    """The model with `adapter` merged, in a temporary folder removed at exit."""
    import atexit
    import shutil
    import tempfile

    from yue.registry import model_name
    from yue.train.finetune import merge_to_folder

    tmp = Path(tempfile.mkdtemp(prefix="yue-bench-merged-"))
    atexit.register(shutil.rmtree, tmp, ignore_errors=True)
    name = f"{model_name(model)}+{adapter.name}"  # the report's model name
    return str(merge_to_folder(model, adapter, tmp / name))


@app.command("bench-sizes")
@user_errors
def bench_sizes_cmd(
    shapes: str = typer.Option("llama-3.2-1b", help="Comma-separated shapes (yue.bench.gguf_shapes.SHAPES)."),
    threads: str = typer.Option("1,2", help="Comma-separated thread counts."),
    repeats: int = typer.Option(3, help="Speed runs (fresh processes) per thread count, for the spread."),
    tokens: int = typer.Option(32, help="Timed new tokens per run."),
    ctx_size: int = typer.Option(4096, help="KV cache length both peers allocate."),
    peers: str = typer.Option("yue,llamacpp", help="Comma-separated: yue, llamacpp."),
    out: Path | None = typer.Option(None, help="Also write the JSON document here."),
) -> None:
    """yue vs llama.cpp on random-weight GGUFs of real shapes (speed and memory only); JSON last."""
    from yue.bench.sizes import SizesConfig, print_report, run_sizes

    def csv(s: str) -> tuple[str, ...]:
        return tuple(x.strip() for x in s.split(",") if x.strip())

    try:
        thread_counts = tuple(int(x) for x in csv(threads))
    except ValueError:
        raise ValueError(f"threads: {threads!r} is not a comma-separated list of integers") from None
    config = SizesConfig(csv(shapes), thread_counts, repeats, tokens, ctx_size, csv(peers))
    doc = run_sizes(config, log=lambda s: typer.echo(f"[bench-sizes] {s}", err=True))
    line = print_report(doc)
    if out is not None:
        out.write_text(line + "\n")
