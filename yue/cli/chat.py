"""`yue chat`: a conversation on a terminal, with line editing and a kept history."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import typer

from yue.cli import common, remote
from yue.cli.common import LLAMA_FLAGS, app, user_errors
from yue.cli.generate import load_engine
from yue.cli.options import config_options
from yue.settings import DecodeConfig, LoadConfig

CHAT_HISTORY = "chat_history"  # file under the yue cache folder ($YUE_CACHE_DIR or ~/.cache/yue)


CHAT_HISTORY_LINES = 1000


@contextmanager
def _line_editing() -> Iterator[Path | None]:
    """Line editing and a kept history for `input()` on a terminal, within the block: stdlib readline
    (absent on Windows' Python, where `input()` stays plain), its history read from CHAT_HISTORY on
    entry and written back on exit. Yields the history file, or None (no readline or no terminal)."""
    try:
        import readline
    except ImportError:
        readline = None
    if readline is None or not common.on_terminal(sys.stdin):
        yield None
        return
    from yue.registry import cache_root

    history = cache_root() / CHAT_HISTORY
    readline.clear_history()
    try:
        readline.read_history_file(history)
    except OSError:  # none yet (or unreadable): start a new one
        pass
    readline.set_history_length(CHAT_HISTORY_LINES)
    try:
        yield history
    finally:
        try:
            history.parent.mkdir(parents=True, exist_ok=True)
            readline.write_history_file(history)
        except OSError as e:  # a read-only cache loses the history, not the conversation
            typer.echo(f"warning: chat history not saved to {history}: {e}", err=True)


@app.command()
@user_errors
@config_options(
    DecodeConfig,
    exclude=("trace", "logprobs"),  # a conversation prints replies only
    defaults={"max_new_tokens": 512},  # a reply, not a completion
    aliases=LLAMA_FLAGS,
)
@config_options(LoadConfig, argument="load", aliases=LLAMA_FLAGS)
def chat(
    system: str | None = typer.Option(None, help="A system message opening the conversation."),
    server: str | None = typer.Option(None, "--server", envvar=remote.SERVER_ENV, help=remote.SERVER_HELP),
    load: LoadConfig | None = None,
    config: DecodeConfig | None = None,
) -> None:
    """Chat in the terminal: replies stream as they are written, the conversation is kept; /exit or EOF
    ends. Ctrl-C stops a reply (kept as far as it got) and ends the session at the prompt."""
    from dataclasses import replace

    if server is not None:
        remote.check_local_settings(load, config)
        engine = remote.Server.connect(server, load.model)
        name = engine.model
    else:
        engine = load_engine(load)
        name = engine.name
    config = replace(config, mode=config.mode or engine.default_mode)
    messages = [{"role": "system", "content": system}] if system else []
    typer.echo(f"{name} ({config.mode}); /exit or Ctrl-D ends, Ctrl-C stops a reply.", err=True)
    with _line_editing():
        _converse(engine, config, messages)


def _converse(engine, cfg, messages: list[dict]) -> None:
    """`chat`'s loop: read a line, stream the reply, keep both in `messages`, until /exit or EOF."""
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            typer.echo("", err=True)
            return
        if line.strip() in ("/exit", "/quit"):
            return
        if not line.strip():
            continue
        messages.append({"role": "user", "content": line})
        try:
            reply = []
            for delta in _reply(engine, cfg, messages):
                sys.stdout.write(delta)
                sys.stdout.flush()
                reply.append(delta)
        except ValueError as e:  # the conversation outgrew the context: say so, keep the session
            messages.pop()
            typer.echo(f"error: {e}", err=True)
            continue
        except KeyboardInterrupt:  # stop this reply, keep the session (and the reply as far as it got)
            typer.echo("\n[stopped]", err=True)
        sys.stdout.write("\n")
        messages.append({"role": "assistant", "content": "".join(reply)})


def _reply(engine, cfg, messages: list[dict]) -> Iterator[str]:
    """The reply's text deltas: from the engine here, or from a `yue serve` (`--server`)."""
    if isinstance(engine, remote.Server):
        yield from engine.chat(messages, cfg)
        return
    for ev in engine.stream(engine.chat_prompt(messages), cfg):
        yield ev.delta
