"""`yue serve`: the OpenAI-compatible server, one process or replicas on Ray Serve."""

from __future__ import annotations

import functools
from pathlib import Path

import typer

from yue.cli.common import DTYPE_HELP, LOW_MEMORY_HELP, MODEL_HELP, app, user_errors


@app.command("serve")
@user_errors
def serve_cmd(
    model: str | None = typer.Option(None, help=MODEL_HELP),
    adapter: Path | None = typer.Option(None, help="A `yue finetune` adapter folder for this model."),
    host: str = typer.Option("127.0.0.1", help="Interface to bind; localhost unless told otherwise."),
    port: int = typer.Option(8000, help="TCP port."),
    api_key: str | None = typer.Option(
        None, envvar="YUE_API_KEY", help="Require 'Authorization: Bearer KEY'."
    ),
    max_batch_size: int = typer.Option(
        16, help="Generations running at once, stepped together (continuous batching); 1 = one at a time."
    ),
    max_batch_tokens: int = typer.Option(
        128,
        help="Prefill work per decode step, in prompt tokens at a prompt's start (later ones weigh more), "
        "at least one chunk, so a long prompt stalls the running requests a chunk at a time; 0 = no bound.",
    ),
    max_queue: int = typer.Option(32, help="Requests waiting beyond those; more get 503 + Retry-After."),
    max_prompt_tokens: int = typer.Option(
        8192, help="Longest prompt accepted, in tokens (at most the context); 0 = the context."
    ),
    default_max_tokens: int = typer.Option(
        2048, help="What a chat request without max_tokens may generate at most."
    ),
    max_body_bytes: int = typer.Option(1 << 20, help="Largest request body, chunked bodies included."),
    drain_timeout: float = typer.Option(
        30.0,
        help="Seconds in-flight requests may run after SIGTERM; then they end with a 503 (streams: an "
        "error chunk and [DONE]) and the server exits 0.",
    ),
    prefix_cache_mb: int = typer.Option(
        256,
        help="Prefix cache bound, in MiB of K/V: a prompt that starts like an earlier one (a chat's earlier "
        "turns) is not prefilled again, with the same output; LRU; 0 = off.",
    ),
    device: str = typer.Option("cpu", help="cpu | cuda | auto"),
    dtype: str = typer.Option("float32", help=DTYPE_HELP),
    low_memory: bool = typer.Option(False, help=LOW_MEMORY_HELP),
    log_level: str = typer.Option("info", help="uvicorn log level."),
    threads: int | None = typer.Option(
        None, help="torch threads (per replica with --replicas; default: the cores divided among them)."
    ),
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
) -> None:
    """Serve over HTTP: OpenAI-compatible /v1 API, /generate, /health, /metrics and a demo page at /."""
    import yue
    from yue.kernels.prepare import resolve_dtype
    from yue.model.adapters import check_adapter_folder
    from yue.registry import ar_source, resolve
    from yue.serve import ServeConfig, serve

    config = ServeConfig(
        host=host,
        port=port,
        api_key=api_key,
        max_batch_size=max_batch_size,
        max_batch_tokens=max_batch_tokens or None,
        max_queue=max_queue,
        max_prompt_tokens=max_prompt_tokens or None,
        default_max_tokens=default_max_tokens,
        max_body_bytes=max_body_bytes,
        drain_timeout_s=drain_timeout,
        prefix_cache_mb=prefix_cache_mb,
    )
    resolve_dtype(dtype)  # a bad name fails here, before the server starts
    folder = resolve(model)  # an unknown name or a missing package fails here, before the server starts
    if folder.is_dir():
        ar_source(folder)
    # The model loads in the background while /health answers 503; a load failure exits with status 1.
    if adapter is not None:
        check_adapter_folder(adapter)  # missing files fail here, not in the background load

    # Chat requests use the model's own template (`Engine.chat_prompt`). Picklable: Ray replicas run it.
    load = functools.partial(
        yue.load, model, device=device, dtype=dtype, adapter=adapter, low_memory=low_memory
    )
    if replicas is None and autoscale is None and address is None:
        if threads is not None:
            if threads < 1:
                raise ValueError(f"threads must be >= 1, got {threads}")
            import torch

            torch.set_num_threads(threads)
        raise typer.Exit(code=serve(load, config, log_level=log_level))
    try:
        from yue.serve import replicas as ray_replicas
    except ImportError as e:
        raise ValueError(
            f"--replicas, --autoscale and --address need Ray: pip install 'yue[ray]' ({e})"
        ) from e
    plan = ray_replicas.ReplicaConfig(
        replicas=1 if replicas is None else replicas,
        autoscale=ray_replicas.parse_autoscale(autoscale) if autoscale else None,
        threads=threads,
        address=address,
    )
    code = ray_replicas.serve_replicas(load, config, plan)
    raise typer.Exit(code=code)
