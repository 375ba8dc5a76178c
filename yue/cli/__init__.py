"""The `yue` command: thin subcommands over library functions, one module per group of commands.

User mistakes (ValueError, including CheckpointError) print one line and exit with code 2, no
traceback (`common.user_errors`). A command's options come from the typed config its library function
takes (`options.config_options`): parse -> config (checked there, naming the field) -> call. A command's
module loads only when the command is asked for (`common.COMMANDS`), and imports the work it runs inside
its body, so `yue --version`, `--help`, `yue models` and argument errors import no torch.
"""

from yue.cli.common import app


def main() -> None:
    app()


__all__ = ["app", "main"]
