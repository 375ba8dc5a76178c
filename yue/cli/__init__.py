"""The `yue` command: thin subcommands over library functions, one module per group of commands.

User mistakes (ValueError, including CheckpointError) print one line and exit with code 2, no
traceback (`common.user_errors`). A command's options come from the typed config its library function
takes (`options.config_options`): parse -> config (checked there, naming the field) -> call. Each
subcommand imports the work it runs inside its body; only the configs load with the command modules.
"""

# Registered in the order `yue --help` lists them: using a model first, then making and measuring one.
from yue.cli import generate, chat, models, serve, train, distill, bench  # noqa: F401, I001
from yue.cli.common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
