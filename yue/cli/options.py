"""Command options made from a typed config (a frozen dataclass), so the CLI does not re-type its fields.

`config_options(ServeConfig)` adds one `--field-name` option per field to a command, with the field's
type and default and, as help, the field's entry in the class docstring's `Attributes:` section (one
text for the library's docs and the CLI's help). The command then receives the built config as its
`config` argument: a bad value fails in the config's own validation, naming the field.
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import typing

import typer


def field_help(config_cls: type) -> dict[str, str]:
    """Each field's text in the class docstring's `Attributes:` section (Google style), one line."""
    doc = inspect.getdoc(config_cls) or ""
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    helps, name = {}, None
    for line in section.splitlines():
        if m := re.match(r"^    (\w+): (.*)$", line):
            name, helps[m.group(1)] = m.group(1), m.group(2)
        elif name and line.startswith("        "):
            helps[name] += " " + line.strip()
        elif line.strip():  # the section ended
            break
    return helps


def config_options(
    config_cls: type,
    *,
    exclude: tuple[str, ...] = (),
    flags: dict[str, str] | None = None,
    zero_is_none: tuple[str, ...] = (),
    envvars: dict[str, str] | None = None,
):
    """Decorate a Typer command `fn(..., config)` with an option per field of `config_cls`.

    Args:
        config_cls: a dataclass whose fields are the options.
        exclude: fields the command does not offer (their defaults apply).
        flags: a field's option name where it is not `--field-name` (e.g. `{"drain_timeout_s": "--drain-timeout"}`).
        zero_is_none: `int | None` fields whose "no bound" (None) is written 0 on the command line.
        envvars: a field's environment variable, read where the option is not given (e.g. a secret).
    """
    flags, envvars = flags or {}, envvars or {}
    hints = typing.get_type_hints(config_cls)
    helps = field_help(config_cls)
    fields = [f for f in dataclasses.fields(config_cls) if f.name not in exclude]

    def option(f: dataclasses.Field) -> inspect.Parameter:
        kind = hints[f.name]
        default = f.default
        if f.name in zero_is_none:  # the command line's 0 for None
            kind, default = int, 0 if default is None else default
        text = helps.get(f.name, "")
        if f.name in zero_is_none:
            text = text.replace("None = ", "0 = ")
        flag = flags.get(f.name, "--" + f.name.replace("_", "-"))
        return inspect.Parameter(
            f.name,
            inspect.Parameter.KEYWORD_ONLY,
            default=typer.Option(default, flag, help=text, envvar=envvars.get(f.name)),
            annotation=kind,
        )

    def decorate(fn):
        own_hints = typing.get_type_hints(fn)  # resolved here: Typer reads them in this module's globals
        own = [
            p.replace(annotation=own_hints[name])
            for name, p in inspect.signature(fn).parameters.items()
            if name != "config"
        ]

        @functools.wraps(fn)
        def command(**kwargs):
            values = {f.name: kwargs.pop(f.name) for f in fields}
            for name in zero_is_none:
                values[name] = values[name] or None
            return fn(config=config_cls(**values), **kwargs)

        params = [*own, *(option(f) for f in fields)]
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # Typer reads `__signature__`, not the wrapped function's
        return command

    return decorate
