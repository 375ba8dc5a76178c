"""Measuring: `yue bench`, `yue bench-serve`, `yue eval`."""

from __future__ import annotations

from pathlib import Path

import typer

from yue.cli.common import DTYPE_HELP, LOW_MEMORY_HELP, MODEL_HELP, app, user_errors


@app.command("bench")
@user_errors
def bench_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    adapter: Path | None = typer.Option(
        None, help="A `yue finetune` adapter folder: the bench runs the merged model (peers too)."
    ),
    prompts: Path | None = typer.Option(
        None,
        help='Held-out prompts, reported first: JSONL of {"prompt": ...} or {"messages": [{"role", "content"}]} '
        '(+ "reference"?); messages go through the model\'s chat template for every entry alike. Default: a chat '
        "model's shipped chat_test + chat_calibration sets; gemma-3-270m (base) the held-out text_test set, raw; "
        "else the held-out code_test set (third-party packages) + the code development set.",
    ),
    dev_prompts: Path | None = typer.Option(
        None, help="A development (calibration) prompt set, reported after the held-out one and labelled dev."
    ),
    max_new_tokens: int = typer.Option(128, help="Tokens generated per prompt, by every mode."),
    modes: str = typer.Option(
        "hf-greedy,hf-prompt-lookup,llamacpp-greedy,ar,verified,hybrid,nar",
        help="Comma-separated entries to compare. llamacpp-greedy needs a model with a GGUF source and "
        "llama-cpp-python (in the repository: pip install '.\\[llamacpp]'); else it is skipped, saying why.",
    ),
    thresholds: str = typer.Option(
        "0.05,0.1,0.2,0.4", help="hybrid sweep (tolerances): adds hybrid@T entries."
    ),
    verified_thresholds: str = typer.Option(
        "1", help="Adds verified@T entries (1 = the router unasked); empty for none."
    ),
    fused_drafts: bool = typer.Option(
        True, help="Add verified+fused entries (drafts in the verifying forward, a block per draft position)."
    ),
    batch_sizes: str = typer.Option("1", help="Sizes > 1 add ar/verified throughput entries (ar@bN)."),
    repeats: int = typer.Option(1, help="Timed passes over the prompts."),
    limit: int | None = typer.Option(None, help="Use only the first N prompts."),
    threads: int = typer.Option(1, help="torch threads, the same for every mode."),
    memory: bool = typer.Option(True, help="Measure peak RSS per mode, each in its own process."),
    device: str = typer.Option("cpu", help="cpu | cuda (ours and the transformers peers; llama.cpp: cpu)."),
    cost_curve: bool = typer.Option(
        True, help="Time a verifying forward over 1..9 rows and a drafting pass (ratios to a 1-row step)."
    ),
    dtype: str = typer.Option(
        "float32",
        help=DTYPE_HELP + " Ours and the transformers peers alike (int4: ours only, the peers float32).",
    ),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP + " Ours only."),
    temperature: float = typer.Option(
        0.0, help="0 = greedy. Every entry and peer alike (ours: speculative sampling in the drafting modes)."
    ),
    top_p: float = typer.Option(1.0, help="Nucleus mass in (0, 1], every entry and peer alike."),
    seed: int = typer.Option(0, help="Prompt i is sampled with seed + i on every side: runs repeat."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the JSON document here."),
    plot: Path | None = typer.Option(None, help="Write the speed vs fidelity plot (PNG) here."),
) -> None:
    """Compare the decode modes with transformers and llama.cpp on the same weights; JSON on the last line."""
    from rich.console import Console

    from yue.bench.harness import BenchConfig, run_bench
    from yue.bench.report import plot as write_plot
    from yue.bench.report import print_report

    def csv(text: str, kind: type, name: str) -> tuple:
        try:
            return tuple(kind(x.strip()) for x in text.split(",") if x.strip())
        except ValueError:
            raise ValueError(f"{name}: expected comma-separated {kind.__name__}s, got {text!r}") from None

    if adapter is not None:  # every entry, the peers included, runs the adapted weights
        model = _merged_for_bench(model, adapter)
    cfg = BenchConfig(
        model=model,
        prompts=str(prompts) if prompts is not None else None,
        dev_prompts=str(dev_prompts) if dev_prompts is not None else None,
        max_new_tokens=max_new_tokens,
        modes=csv(modes, str, "modes"),
        thresholds=csv(thresholds, float, "thresholds"),
        verified_thresholds=csv(verified_thresholds, float, "verified_thresholds"),
        fused_drafts=fused_drafts,
        batch_sizes=csv(batch_sizes, int, "batch_sizes"),
        repeats=repeats,
        limit=limit,
        threads=threads,
        memory=memory,
        device=device,
        cost_curve=cost_curve,
        dtype=dtype,
        low_memory=low_memory,
        temperature=temperature,
        top_p=top_p,
        seed=seed,
    )
    err = Console(stderr=True, highlight=False, soft_wrap=True)
    result = run_bench(cfg, log=lambda s: err.print(f"[bench] {s}", markup=False))
    if plot is not None:
        err.print(f"[bench] plot written to {write_plot(result, plot)}", markup=False)
    line = print_report(result)
    if json_out is not None:
        json_out.write_text(line + "\n")


@app.command("bench-serve")
@user_errors
def bench_serve_cmd(
    model: str | None = typer.Option("yue-code-mini", help=MODEL_HELP),
    batch_sizes: str = typer.Option(
        "1,16", help="--max-batch-size values to compare (the first is the base)."
    ),
    clients: str = typer.Option("1,4,16,32", help="Concurrent client counts."),
    max_tokens: int = typer.Option(64, help="Tokens per completion."),
    mode: str = typer.Option(
        "verified", help="Decode mode of every request (exact modes allow the output check)."
    ),
    requests_per_client: int = typer.Option(2, help="Requests each client sends (at least 8 per level)."),
    json_out: Path | None = typer.Option(None, "--json", help="Also write the JSON document here."),
) -> None:
    """Tokens/s and time to first token of `yue serve` under concurrent streamed clients; JSON last."""
    import yue
    from yue.bench.serving import bench_serve, report

    sizes = tuple(int(x) for x in batch_sizes.split(",") if x.strip())
    levels = tuple(int(x) for x in clients.split(",") if x.strip())
    engine = yue.load(model)
    result = bench_serve(
        engine,
        batch_sizes=sizes,
        clients=levels,
        max_tokens=max_tokens,
        mode=mode,
        requests_per_client=requests_per_client,
        log=lambda s: typer.echo(f"[bench-serve] {s}", err=True),
    )
    text = report(result, sizes[0], sizes[-1])
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


@app.command("eval")
@user_errors
def eval_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    corpus: str = typer.Option("stdlib", help="'stdlib', a .txt/.jsonl file or a folder of sources."),
    batches: int = typer.Option(8, help="Validation batches to score."),
    batch_size: int = typer.Option(8, help="Sequences per batch."),
    seq_len: int = typer.Option(256, help="Tokens per sequence."),
) -> None:
    """Validation AR loss, NAR loss and NAR accuracy per slot of a model on a corpus (JSON); for a
    top-layer NAR set (yue-smol) or a plain Llama/GGUF, the AR loss."""
    import json

    from yue.registry import resolve
    from yue.train.evaluate import evaluate_model

    result = evaluate_model(resolve(model), corpus, batches, batch_size, seq_len)
    typer.echo(json.dumps(result))
