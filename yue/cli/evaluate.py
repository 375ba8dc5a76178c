"""`yue eval`: a model's validation numbers on a corpus, in-process or from a running `yue serve`."""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import typer

from yue.cli import remote
from yue.cli.common import LLAMA_FLAGS, app, user_errors
from yue.cli.options import config_options
from yue.settings import DecodeConfig, EvalConfig, LoadConfig


@app.command("eval")
@user_errors
@config_options(EvalConfig)
@config_options(  # the model and its threads; the sequences' length is --seq-len
    LoadConfig,
    argument="load",
    exclude=("adapter", "device", "dtype", "draft_dtype", "low_memory", "ctx_size"),
    aliases=LLAMA_FLAGS,
)
def eval_cmd(
    server: str | None = typer.Option(None, "--server", envvar=remote.SERVER_ENV, help=remote.SERVER_HELP),
    load: LoadConfig | None = None,
    config: EvalConfig | None = None,
) -> None:
    """Validation AR loss, NAR loss and NAR accuracy per slot of a model on a corpus (JSON); for a
    top-layer NAR set (yue-smol) or a plain Llama/GGUF, the AR loss."""
    if server is not None:
        typer.echo(json.dumps(_remote(server, load, config)))
        return
    from yue.cli.common import set_threads
    from yue.registry import resolve
    from yue.train.evaluate import evaluate_model

    set_threads(load.threads)
    typer.echo(json.dumps(evaluate_model(resolve(load.model), config)))


def _remote(url: str, load: LoadConfig, config: EvalConfig) -> dict:
    """`eval --server`: the served model scored by the server (`serve/evaluate.py`) on the same corpus.
    A corpus given as a path is sent as an absolute one (the server reads it from its own working
    folder); the threads are the server's own (`yue serve -t`)."""
    remote.check_local_settings(load, DecodeConfig())
    fields = asdict(config)
    if Path(config.corpus).exists():
        fields["corpus"] = str(Path(config.corpus).absolute())
    return remote.Server.connect(url, load.model).evaluate(fields)
