"""Shared by the `yue` commands: the Typer app, the version option, error handling, option help."""

from __future__ import annotations

import functools

import typer

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    help="Fast text generation with an AR-NAR Mixture-of-Transformers.",
)


def _version() -> str:
    """The installed distribution's version, read from its metadata without importing torch; a source
    tree run without installing falls back to the package's own `__version__`."""
    from importlib.metadata import PackageNotFoundError, version

    from yue.errors import DISTRIBUTION

    try:
        return version(DISTRIBUTION)
    except PackageNotFoundError:
        import yue

        return yue.__version__


def _print_version(value: bool) -> None:
    if value:
        typer.echo(f"yue {_version()}")
        raise typer.Exit()


@app.callback()
def main_options(
    version: bool = typer.Option(
        False, "--version", callback=_print_version, is_eager=True, help="Print the version and exit."
    ),
) -> None:
    """Fast text generation with an AR-NAR Mixture-of-Transformers."""


def on_terminal(stream) -> bool:
    """Whether a standard stream is a terminal (a seam for tests, whose runner swaps the streams)."""
    return stream.isatty()


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


def command_line(ctx: typer.Context) -> str:
    """The command as the user gave it (options set on the command line only), for reports."""
    import shlex

    parts = ["yue", ctx.info_name or ""]
    for name, value in ctx.params.items():
        source = ctx.get_parameter_source(name)  # typer's own click enum, so compare by name
        if source is None or source.name != "COMMANDLINE":
            continue
        for v in value if isinstance(value, (list, tuple)) else [value]:
            parts += [f"--{name.replace('_', '-')}", shlex.quote(str(v))]
    return " ".join(parts)


MODEL_HELP = (
    "A model's name (yue-smol, yue-code-mini), a model folder or a .gguf file (default: the default model)."
)
