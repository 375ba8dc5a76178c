"""`yue serve`: the OpenAI-compatible server, one process or replicas on Ray Serve."""

from __future__ import annotations

import functools
from pathlib import Path

import typer

from yue.cli.common import LLAMA_FLAGS, app, user_errors
from yue.cli.options import config_options
from yue.serve.config import ServeConfig
from yue.settings import LoadConfig


@app.command("serve")
@user_errors
@config_options(
    ServeConfig,
    exclude=("retry_after_s",),
    flags={"drain_timeout_s": "--drain-timeout"},
    zero_is_none=("max_batch_tokens", "max_prompt_tokens"),
    envvars={"api_key": "YUE_API_KEY"},
)
@config_options(
    LoadConfig,
    argument="load",
    aliases=LLAMA_FLAGS,
    helps={"threads": "torch threads (per replica with --replicas; default: the cores divided among them)."},
)
def serve_cmd(
    log_level: str = typer.Option("info", help="uvicorn log level."),
    replicas: int | None = typer.Option(
        None, help="Run N replicas on Ray Serve, each its own model copy and batch (needs the ray extra)."
    ),
    autoscale: str | None = typer.Option(
        None, help="MIN:MAX replicas on Ray Serve, scaled on ongoing requests per replica."
    ),
    address: str | None = typer.Option(
        None,
        help="Join this Ray cluster (e.g. auto) with --replicas/--autoscale; default: start a local one.",
    ),
    load: LoadConfig | None = None,
    config: ServeConfig | None = None,
) -> None:
    """Serve over HTTP: OpenAI-compatible /v1 API, /generate, /health, /metrics and a demo page at /."""
    from yue.engine import load_from
    from yue.model.adapters import check_adapter_folder
    from yue.registry import ar_source, resolve
    from yue.serve import serve

    # LoadConfig checked the precisions' names; an unknown model name or a missing package fails here,
    # before the server starts.
    folder = resolve(load.model)
    if folder.is_dir():
        ar_source(folder)
    # The model loads in the background while /health answers 503; a load failure exits with status 1.
    if load.adapter is not None:
        check_adapter_folder(Path(load.adapter))  # missing files fail here, not in the background load

    # Chat requests use the model's own template (`Engine.chat_prompt`). Picklable: Ray replicas run it.
    loader = functools.partial(load_from, load)
    if replicas is None and autoscale is None and address is None:
        raise typer.Exit(code=serve(loader, config, log_level=log_level))
    try:
        from yue.serve import replicas as ray_replicas
    except ImportError as e:
        raise ValueError(
            f"--replicas, --autoscale and --address need Ray: pip install 'yue[ray]' ({e})"
        ) from e
    plan = ray_replicas.ReplicaConfig(
        replicas=1 if replicas is None else replicas,
        autoscale=ray_replicas.parse_autoscale(autoscale) if autoscale else None,
        threads=load.threads,
        address=address,
    )
    code = ray_replicas.serve_replicas(loader, config, plan)
    raise typer.Exit(code=code)
