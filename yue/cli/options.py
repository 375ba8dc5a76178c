"""Command options made from a typed config (a frozen dataclass), so the CLI does not re-type its fields.

`config_options(ServeConfig)` adds one `--field-name` option per field to a command, with the field's
type and default and, as help, the field's entry in the class docstring's `Attributes:` section (one
text for the library's docs and the CLI's help). The command then receives the built config as its
`config` argument: a bad value fails in the config's own validation, naming the field.

How a field's type is written on the command line (`_form`):
- `int`, `float`, `str`, `bool` (a `--x/--no-x` flag), and any of them `| None`, as themselves;
- a `Literal[...]` as its values' type: the config checks the choice and names the field and choices;
- `tuple[X, ...]`: a repeatable option (`--stop a --stop b`), or one comma-separated value where the
  command lists the field in `csv` (`--modes ar,verified`, and fixed-length tuples such as `(b1, b2)`);
- `tuple[tuple[A, B], ...]`: a repeatable `A:B` option (`--logit-bias 42:-100`).
"""

from __future__ import annotations

import dataclasses
import functools
import inspect
import re
import types
import typing
from collections.abc import Callable

import typer


def field_help(config_cls: type) -> dict[str, str]:
    """Each field's text in the class docstring's `Attributes:` section (Google style), one line. An
    entry may name several fields that share one text (`temperature, top_p, seed: ...`, `a / b: ...`)."""
    doc = inspect.getdoc(config_cls) or ""
    section = doc.split("Attributes:", 1)[1] if "Attributes:" in doc else ""
    texts, names = [], []
    for line in section.splitlines():
        if m := re.match(r"^    (\w+(?:(?:, | / )\w+)*): (.*)$", line):
            texts.append(m.group(2))
            names.append(re.split(r", | / ", m.group(1)))
        elif texts and line.startswith("        "):
            texts[-1] += " " + line.strip()
        elif line.strip():  # the section ended
            break
    return {name: text for group, text in zip(names, texts, strict=True) for name in group}


@dataclasses.dataclass(frozen=True)
class _Form:
    """How one config field is written on the command line."""

    annotation: object  # the type Typer parses the option's text as
    to_config: Callable[[typing.Any], typing.Any]  # the parsed value -> the field's value
    to_cli: Callable[[typing.Any], typing.Any]  # a field's value (its default) -> the option's default
    metavar: str | None = None


def _same(value):
    return value


def _text(value) -> str:
    """A value as a user writes it: 0.05, 1 (not 1.0), ar."""
    return f"{value:g}" if isinstance(value, float) else str(value)


def _parsing(name: str, what: str, parse: Callable[[str], typing.Any]) -> Callable[[str], typing.Any]:
    """`parse`, failing with a message that names the field, the form expected and the text given."""

    def parsed(text: str):
        try:
            return parse(text)
        except ValueError:
            raise ValueError(f"{name}: expected {what}, got {text!r}") from None

    return parsed


def _scalar(kind) -> type:
    """The type Typer parses for a scalar field type (a Literal's values are strings)."""
    if typing.get_origin(kind) is typing.Literal:
        return type(typing.get_args(kind)[0])
    if kind in (int, float, str, bool):
        return kind
    raise TypeError(f"no command-line form for {kind!r}: exclude the field or give it one")


def _tuple_form(name: str, kind, csv: bool) -> _Form:
    """A tuple field's form: repeatable `A:B` pairs, a repeatable option, or one comma-separated value."""
    args = [a for a in typing.get_args(kind) if a is not Ellipsis]
    if typing.get_origin(args[0]) is tuple:  # pairs: a repeatable A:B
        a, b = typing.get_args(args[0])

        def split(text: str) -> tuple:
            left, right = text.split(":")  # not one colon: ValueError
            return a(left.strip()), b(right.strip())

        pair = _parsing(name, f"{a.__name__}:{b.__name__}", split)
        return _Form(
            list[str],
            lambda v: tuple(pair(t) for t in v),
            lambda d: [f"{x}:{_text(y)}" for x, y in d],
            metavar=f"{a.__name__.upper()}:{b.__name__.upper()}",
        )
    item = _scalar(args[0])
    if not csv:  # a repeatable option
        return _Form(list[item], tuple, list)
    items = _parsing(
        name,
        f"comma-separated {item.__name__}s",
        lambda text: tuple(item(x.strip()) for x in text.split(",") if x.strip()),
    )
    return _Form(str, items, lambda d: ",".join(_text(x) for x in d), metavar=f"{item.__name__.upper()},...")


def _form(name: str, kind, *, csv: bool, zero_is_none: bool) -> _Form:
    """The command-line form of field `name` of type `kind` (module docstring)."""
    if zero_is_none:  # the command line's 0 for None
        return _Form(int, lambda v: v or None, lambda d: 0 if d is None else d)
    inner = [a for a in typing.get_args(kind) if a is not type(None)]
    optional = typing.get_origin(kind) in (typing.Union, types.UnionType) and len(inner) == 1
    if optional:
        kind = inner[0]
    if typing.get_origin(kind) is tuple:
        form = _tuple_form(name, kind, csv)
    else:
        form = _Form(_scalar(kind), _same, _same)
    if not optional:
        return form
    return _Form(
        form.annotation | None,
        lambda v: None if v is None else form.to_config(v),
        lambda d: None if d is None else form.to_cli(d),
        form.metavar,
    )


def _default(f: dataclasses.Field, defaults: dict):
    """The field's default on this command: the command's own where it gives one, else the config's."""
    if f.name in defaults:
        return defaults[f.name]
    if f.default_factory is not dataclasses.MISSING:
        return f.default_factory()
    return f.default


def _parameter(
    name: str,
    form: _Form,
    default,
    text: str,
    flag: str | None,
    envvar: str | None,
    aliases: tuple[str, ...] = (),
) -> inspect.Parameter:
    """Field `name`'s keyword parameter of the command, as Typer reads it: `--name` (a bool:
    `--name/--no-name`) unless the command names the flag, and any other names (`-n`) beside it."""
    dashed = name.replace("_", "-")
    flag = flag or (f"--{dashed}/--no-{dashed}" if form.annotation is bool else f"--{dashed}")
    option = typer.Option(default, flag, *aliases, help=text, envvar=envvar, metavar=form.metavar)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=form.annotation)


def config_options(
    config_cls: type,
    *,
    exclude: tuple[str, ...] = (),
    flags: dict[str, str] | None = None,
    aliases: dict[str, tuple[str, ...]] | None = None,
    zero_is_none: tuple[str, ...] = (),
    envvars: dict[str, str] | None = None,
    csv: tuple[str, ...] = (),
    required: tuple[str, ...] = (),
    defaults: dict[str, typing.Any] | None = None,
    helps: dict[str, str] | None = None,
    argument: str = "config",
):
    """Decorate a Typer command `fn(..., config)` with an option per field of `config_cls`; a command
    that takes two configs names the second one's parameter (`argument="load"`).

    Args:
        config_cls: a dataclass whose fields are the options.
        exclude: fields the command does not offer (their defaults apply).
        flags: a field's option name where it is not `--field-name` (e.g. `{"drain_timeout_s": "--drain-timeout"}`).
        aliases: more names of a field's option, where the config has the field (llama.cpp's `-n`,
            `--temp`: `common.LLAMA_FLAGS`).
        zero_is_none: `int | None` fields whose "no bound" (None) is written 0 on the command line.
        envvars: a field's environment variable, read where the option is not given (e.g. a secret).
        csv: tuple fields written as one comma-separated value, not a repeated option.
        required: fields the command line must give (no default).
        defaults: a field's default where the command's differs from the config's (a chat reply's length).
        helps: a field's help where the command shares one text with other commands (`--model`).
        argument: the command's parameter that receives the built config.
    """
    flags, envvars, defaults, aliases = flags or {}, envvars or {}, defaults or {}, aliases or {}
    hints = typing.get_type_hints(config_cls)
    helps = {**field_help(config_cls), **(helps or {})}
    fields = [f for f in dataclasses.fields(config_cls) if f.name not in exclude]
    forms = {
        f.name: _form(f.name, hints[f.name], csv=f.name in csv, zero_is_none=f.name in zero_is_none)
        for f in fields
    }

    def option(f: dataclasses.Field) -> inspect.Parameter:
        text = helps.get(f.name, "")
        if f.name in zero_is_none:
            text = text.replace("None = ", "0 = ")
        default = ... if f.name in required else forms[f.name].to_cli(_default(f, defaults))
        return _parameter(
            f.name,
            forms[f.name],
            default,
            text,
            flags.get(f.name),
            envvars.get(f.name),
            aliases.get(f.name, ()),
        )

    def decorate(fn):
        own_hints = typing.get_type_hints(fn)  # resolved here: Typer reads them in this module's globals
        own = [
            p.replace(annotation=own_hints[name])
            for name, p in inspect.signature(fn).parameters.items()
            if name != argument
        ]

        @functools.wraps(fn)
        def command(**kwargs):
            values = {f.name: forms[f.name].to_config(kwargs.pop(f.name)) for f in fields}
            return fn(**{argument: config_cls(**values)}, **kwargs)

        params = [*own, *(option(f) for f in fields)]
        command.__signature__ = inspect.Signature(params)
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # Typer reads `__signature__`, not the wrapped function's
        return command

    return decorate
