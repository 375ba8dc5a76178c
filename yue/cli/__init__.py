"""The `yue` command: thin subcommands over library functions, one module per group of commands.

User mistakes (ValueError, including CheckpointError) print one line and exit with code 2, no
traceback (`common.user_errors`). A command's options come from the typed config its library function
takes (`options.config_options`): parse -> config (checked there, naming the field) -> call. A command's
module loads only when the command is asked for (`common.COMMANDS`), and imports the work it runs inside
its body, so `yue --version`, `--help`, `yue models` and argument errors import no torch.
"""

import sys

from yue.cli.common import app

# Commands whose process ends as soon as their output is written, without the interpreter's teardown
# (`exit_now`): one answer, then exit, where a user waits on the exit too.
QUICK_EXIT = frozenset({"generate", "chat", "eval"})


def main() -> None:
    """The `yue` entry point (`python -m yue` too); tests call `app` itself, which exits as usual."""
    if len(sys.argv) < 2 or sys.argv[1] not in QUICK_EXIT:
        app()
        return
    try:
        app()
        code = 0
    except SystemExit as done:
        code = done.code
    exit_now(code)


def exit_now(code: int | str | None) -> None:
    """End the process as `sys.exit(code)` would, without the interpreter's teardown when torch was
    loaded: atexit handlers run and the standard streams are flushed, then `os._exit`. Why: after a
    model ran, clearing torch's and transformers' thousands of modules and objects takes a large share
    of a short command's wall time, for nothing a finished command needs (measured: docs/startup.md)."""
    import atexit
    import os

    if "torch" not in sys.modules:  # a light command (--server, an argument error): nothing to skip
        raise SystemExit(code)
    if isinstance(code, str):  # sys.exit("message"): the message on stderr, status 1
        print(code, file=sys.stderr)
        code = 1
    atexit._run_exitfuncs()  # logging's flush, tqdm's monitor, ... as a normal exit runs them
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (BrokenPipeError, OSError, ValueError):  # `yue generate ... | head`: the reader left
            pass
    os._exit(code or 0)


__all__ = ["app", "exit_now", "main"]
