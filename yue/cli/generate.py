"""`yue generate`: one prompt (an argument or standard input), one answer, streamed on a terminal."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, replace
from pathlib import Path

import typer

from yue.cli import common, remote
from yue.cli.common import LLAMA_FLAGS, app, user_errors
from yue.cli.options import config_options
from yue.settings import DecodeConfig, LoadConfig


def load_engine(load: LoadConfig):
    """`generate`'s and `chat`'s model (the engine's module, and torch, load only when a command runs)."""
    from yue.engine import load_from

    return load_from(load)


@app.command()
@user_errors
@config_options(
    DecodeConfig,
    exclude=("logprobs",),  # the command prints text, not log-probabilities
    helps={"trace": "Print the router's per-step trace to stderr."},
    aliases=LLAMA_FLAGS,
)
@config_options(LoadConfig, argument="load", aliases=LLAMA_FLAGS)
def generate(
    prompt: str = typer.Argument(
        ..., help="Text to continue, or an instruct model's user message; - reads it from standard input."
    ),
    system: str | None = typer.Option(
        None, help="A system message before PROMPT (an instruct model's chat template; not with --raw)."
    ),
    raw: bool = typer.Option(
        False,
        "--raw",
        help="An instruct model continues PROMPT as written, not as a chat message; - keeps standard "
        "input byte for byte (its final newline too).",
    ),
    stream: bool | None = typer.Option(
        None,
        "--stream/--no-stream",
        help="Print text as it is generated (default: on when standard output is a terminal).",
    ),
    trace_json: Path | None = typer.Option(None, help="Write the per-step trace as JSON to this file."),
    verbose: bool = typer.Option(
        False, "--verbose", "-v", help="Print each phase's time to stderr: imports, load, first token, rest."
    ),
    server: str | None = typer.Option(None, "--server", envvar=remote.SERVER_ENV, help=remote.SERVER_HELP),
    suffix: str | None = typer.Option(
        None, help="Fill in the middle: PROMPT is the text before, this the text after (needs FIM tokens)."
    ),
    load: LoadConfig | None = None,
    config: DecodeConfig | None = None,
) -> None:
    """Continue PROMPT and print the completion (an instruct model answers it through its chat template).

    `echo "Say hello" | yue generate -` reads the prompt from standard input, less its final newline
    (with --raw, byte for byte)."""
    prompt = read_prompt(prompt, raw=raw)
    if system is not None and raw:
        raise ValueError("--system needs the chat template, which --raw leaves out")
    live = common.on_terminal(sys.stdout) if stream is None else stream
    if server is not None:
        if trace_json is not None:
            raise ValueError("--trace-json needs the steps, which a server does not send: leave out --server")
        return _remote(server, prompt, system, raw, load, config, live, verbose)
    show_trace = config.trace
    if trace_json is not None:  # the file needs the steps recorded
        config = replace(config, trace=True)
    clock = Clock()
    with clock("imports", "torch, transformers, the engine"):
        import yue.engine  # noqa: F401  (timed apart from the load)
    with clock("load", "yue.load: model files, kernels, drafting tables"):
        engine = load_engine(load)
    if suffix is not None:  # the model's FIM tokens, never its chat template
        prompt = engine.infill(prompt, suffix)
    elif engine.instruct and not raw:
        prompt = engine.chat_prompt(_messages(prompt, system))
    elif system is not None:
        raise ValueError(f"--system needs an instruct model's chat template, which {engine.name} has not")
    steps, stats = _write(engine, prompt, config, live, show_trace)
    if verbose:
        clock.report(stats)
    if show_trace and stats is not None:
        typer.echo(_stats_line(stats), err=True)
    if trace_json is not None:
        trace_json.write_text(
            json.dumps({"steps": [asdict(s) for s in steps], "stats": stats.to_dict()}, indent=1)
        )


def _messages(prompt: str, system: str | None) -> list[dict]:
    """An instruct model's conversation for PROMPT: the system message, if any, then PROMPT."""
    return [
        *([{"role": "system", "content": system}] if system is not None else []),
        {"role": "user", "content": prompt},
    ]


def read_prompt(prompt: str, *, raw: bool) -> str:
    """The prompt as the model gets it: PROMPT itself, or with `-` standard input less its final
    newline (`echo "..." |` adds one; one `\n` or `\r\n`), or with `--raw` standard input byte for byte.
    An empty prompt, from either source, is refused the same way."""
    if prompt == "-":
        data = sys.stdin.buffer.read()
        if not raw:
            newline = next((end for end in (b"\r\n", b"\n") if data.endswith(end)), b"")
            data = data[: len(data) - len(newline)]
        try:
            prompt = data.decode("utf-8")
        except UnicodeDecodeError as e:
            raise ValueError(f"the prompt read from standard input is not UTF-8 ({e})") from None
    if not prompt.strip():
        raise ValueError("the prompt is empty: give PROMPT some text, or - and text on standard input")
    return prompt


def _remote(
    url: str,
    prompt: str,
    system: str | None,
    raw: bool,
    load: LoadConfig,
    config: DecodeConfig,
    live: bool,
    verbose: bool,
) -> None:
    """`generate --server`: the same prompt, settings and printing, the model run by `yue serve`."""
    remote.check_local_settings(load, config)
    clock = Clock()
    with clock("connect", "the server's model card"):
        server = remote.Server.connect(url, load.model)
    if server.instruct and not raw:
        deltas = server.chat(_messages(prompt, system), config)
    elif system is not None:
        raise ValueError(f"--system needs an instruct model's chat template, which {server.model} has not")
    else:
        deltas = server.completion(prompt, config)
    sent, first, text = time.perf_counter(), None, []
    for delta in deltas:
        first = first or time.perf_counter() - sent
        text.append(delta)
        if live:
            sys.stdout.write(delta)
            sys.stdout.flush()
    sys.stdout.write("\n" if live else "".join(text) + "\n")
    if verbose:
        rest = time.perf_counter() - sent - (first or 0.0)
        clock.phases += [
            ("first token", first or 0.0, "request sent, first text back"),
            ("rest", rest, "streamed"),
        ]
        clock.report(None)


def _write(engine, prompt: str, config: DecodeConfig, stream: bool, show_trace: bool) -> tuple[list, object]:
    """Generate and print the text (streamed or at the end) and, with `show_trace`, each step to stderr.
    Returns the steps and the run's stats."""
    if not stream:
        result = engine.generate(prompt, config)
        for s in result.trace if show_trace else ():
            typer.echo(s.format(), err=True)
        typer.echo(result.text)
        return result.trace, result.stats
    steps, stats = [], None
    for ev in engine.stream(prompt, config):
        sys.stdout.write(ev.delta)
        sys.stdout.flush()
        steps.extend(ev.trace)
        for s in ev.trace if show_trace else ():
            typer.echo(s.format(), err=True)
        stats = ev.stats or stats
    sys.stdout.write("\n")
    return steps, stats


class Clock:
    """`--verbose`'s phase times: named spans timed by `with clock(name, what):`, then the run's own
    (first token: encoding and prefill, and the rest of the tokens) from its stats."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.phases: list[tuple[str, float, str]] = []

    @contextmanager
    def __call__(self, name: str, what: str) -> Iterator[None]:
        t = time.perf_counter()
        yield
        self.phases.append((name, time.perf_counter() - t, what))

    def report(self, stats) -> None:
        """Print each phase, the run's own, and the total since the command started, to stderr."""
        rows = list(self.phases)
        if stats is not None:
            rest = max(stats.total_s - stats.ttft_s, 0.0)
            n = max(stats.new_tokens - 1, 0)
            rows += [
                ("first token", stats.ttft_s, "encode, prefill, first step"),
                ("rest", rest, f"{n} tokens, {n / max(rest, 1e-9):.1f} tok/s"),
            ]
        rows.append(("total", time.perf_counter() - self.start, "since the command started"))
        for name, seconds, what in rows:
            typer.echo(f"[time] {name:<12}{seconds:7.3f} s  ({what})", err=True)


def _stats_line(stats) -> str:
    return (
        f"[stats] {stats.new_tokens} tokens in {stats.forwards} forwards "
        f"({stats.draft_passes} of them drafting passes; {stats.tokens_per_forward:.2f}/forward, "
        f"{stats.tokens_per_step:.2f}/step), ar={stats.ar_tokens} nar={stats.nar_tokens}, "
        f"{stats.new_tokens / max(stats.total_s, 1e-9):.1f} tok/s"
    )
