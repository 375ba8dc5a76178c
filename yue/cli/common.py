"""Shared by the `yue` commands: the Typer app, the version option, error handling, option help."""

from __future__ import annotations

import ast
import difflib
import functools
import importlib
import inspect
from importlib.util import find_spec

import typer
from typer.core import TyperCommand, TyperGroup

try:  # the click Typer runs on: its own copy from Typer 0.24, the click package before
    from typer import _click as click
except ImportError:
    import click

# Each command -> the module under yue.cli that defines it, in the order `yue --help` lists them: using
# a model first, then making and measuring one. A module loads when one of its commands runs (or shows
# its own --help), so `yue --version`, `yue --help` and `yue models` import no torch.
COMMANDS = {
    "generate": "generate",
    "chat": "chat",
    "models": "models",
    "export-ar": "models",
    "build-ngrams": "ngrams",
    "merge": "models",
    "serve": "serve",
    "train-tokenizer": "train",
    "train": "train",
    "self-distill": "train",
    "train-router": "train",
    "finetune": "train",
    "distill": "distill",
    "distill-recipe": "distill",
    "bench": "bench",
    "bench-serve": "bench",
    "bench-sizes": "bench",
    "profile": "bench",
    "eval": "evaluate",
}


class LazyGroup(TyperGroup):
    """The `yue` group: a command's module is imported when the command is asked for; the command list
    of `yue --help` reads each command's summary (its docstring's first paragraph) from the source."""

    _listing = False

    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context | None, cmd_name: str) -> click.Command | None:
        if self._listing:
            return TyperCommand(name=cmd_name, short_help=summaries().get(cmd_name, ""))
        if cmd_name not in self.commands and cmd_name in COMMANDS:
            importlib.import_module(f"yue.cli.{COMMANDS[cmd_name]}")  # registers its commands on `app`
            for name, command in typer.main.get_command(app).commands.items():
                self.commands.setdefault(name, command)
        return self.commands.get(cmd_name)

    def resolve_command(self, ctx: click.Context, args: list[str]):
        """Typer's, with its "Did you mean" drawn from every command, not only the loaded ones."""
        try:
            return self._click_resolve_command(ctx, args)
        except click.exceptions.UsageError as e:
            if matches := difflib.get_close_matches(args[0], list(COMMANDS)) if args else []:
                e.message = f"{e.message.rstrip('.')}. Did you mean {', '.join(map(repr, matches))}?"
            raise

    def format_help(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        self._listing = True
        try:
            super().format_help(ctx, formatter)
        finally:
            self._listing = False


@functools.cache
def summaries() -> dict[str, str]:
    """Each command's summary, the first paragraph of its function's docstring, read from the command
    modules' source without importing them."""
    found = {}
    for module in dict.fromkeys(COMMANDS.values()):
        tree = ast.parse(open(find_spec(f"yue.cli.{module}").origin, encoding="utf-8").read())
        for node in ast.walk(tree):
            if not isinstance(node, ast.FunctionDef):
                continue
            for deco in node.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func) == "app.command":
                    name = deco.args[0].value if deco.args else node.name.replace("_", "-")
                    text = inspect.cleandoc(ast.get_docstring(node) or "")
                    found[name] = " ".join(text.split("\n\n")[0].split())
    return found


app = typer.Typer(
    cls=LazyGroup,
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


# llama.cpp's everyday flags, each another name of the same field wherever a command's config has it
# (`config_options(aliases=...)`): one meaning in the CLI, the Python API and the server.
LLAMA_FLAGS = {
    "threads": ("-t",),
    "ctx_size": ("-c",),
    "max_new_tokens": ("-n",),
    "temperature": ("--temp",),
}


def set_threads(threads: int | None) -> None:
    """torch's intra-op threads (llama.cpp's -t) for a command that loads its model without
    `engine.load_from` (which sets them); None leaves torch's choice."""
    if threads is not None:
        import torch

        torch.set_num_threads(threads)


MODEL_HELP = (
    "A model's name (yue-smol, yue-code-mini), a model folder or a .gguf file (default: the default model)."
)
