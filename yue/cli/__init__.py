"""The `yue` command: thin subcommands over library functions, one module per group of commands.

User mistakes (ValueError, including CheckpointError) print one line and exit with code 2, no
traceback (`common.user_errors`). Each subcommand imports what it needs inside its body, so `yue --help`
stays fast.
"""

# Registered in the order `yue --help` lists them: using a model first, then making and measuring one.
from yue.cli import generate, chat, models, serve, train, distill, bench  # noqa: F401, I001
from yue.cli.common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
