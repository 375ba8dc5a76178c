"""Bench prompt sets: JSONL files of raw prompts or chat messages, a held-out set first.

Design decisions:
- A line is `{"prompt": str, "reference"?: str}` (raw text, continued as is) or
  `{"messages": [{"role": str, "content": str}, ...], "reference"?: str}` (a chat). Other keys (a
  source, an id) are ignored. Messages go through the model's chat template (`Engine.chat_prompt`,
  generation prompt included) ONCE, here; every mode and every peer is then fed that prompt's ids
  (`Prompt.ids = Engine.encode(text)`), so all entries decode from the same tokens.
- Raw prompts stay raw, even for an instruct model (as completions do).
- A run reports one or more sets: the held-out set first, then a development set labelled as such
  (the split defaults such as the router threshold were chosen on; docs/design.md §6). Defaults: a chat model
  gets the shipped held-out chat prompts plus the calibration split; an optional base model of prose
  (`registry.PACKAGED`, prompts "text": Gemma 3 270M) the held-out text continuations (openings of
  public-domain books, written from memory; no development set: nothing is tuned on text yet); any
  other model (yue-code-mini) the held-out code prompts (cut from third-party packages) plus its
  development set (Lib/test).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from yue.bench.devset import CHAT_SETS
from yue.bench.devset import DEFAULT_OUT as DEVSET  # code prompts from Lib/test (yue-code-mini's dev set)
from yue.bench.devset import HELD_OUT as CODE_TEST  # code prompts from third-party packages: held out
from yue.bench.runners import Prompt
from yue.jsonl import iter_jsonl
from yue.registry import ASSETS, PACKAGED

CHAT_TEST = CHAT_SETS["test"]  # held-out chat prompts written by hand: nothing was trained or tuned on them
CHAT_CALIBRATION = CHAT_SETS["calibration"]  # chat prompts from the stdlib's calibration split
TEXT_TEST = ASSETS / "text_test.jsonl"  # held-out prose to continue: public-domain books' openings

Split = Literal["held-out", "dev"]
SPLIT_LABELS: dict[str, str] = {
    "held-out": "held-out (nothing was trained or tuned on it)",
    "dev": "dev (calibration split: defaults were chosen on it)",
}


@dataclass(frozen=True)
class PromptSet:
    """One prompt file of a run. split: "held-out" (reported first) or "dev" (labelled as such)."""

    name: str
    split: Split
    path: Path
    prompts: list[Prompt]


def is_instruct(engine) -> bool:
    """Whether the engine's model is an instruct model: one with a chat template of its own
    (`Engine.instruct`). It decides the default prompt sets; chat lines are templated for any model
    that can render them (`Engine.chat_prompt`)."""
    return bool(getattr(engine, "instruct", False))


def _messages(value: object, where: str) -> list[dict[str, str]]:
    """Validate a chat: a non-empty list of {"role": str, "content": str}."""
    ok = (
        isinstance(value, list)
        and value
        and all(
            isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)
            for m in value
        )
    )
    if not ok:
        raise ValueError(f'{where}: "messages" must be a non-empty list of {{"role": str, "content": str}}')
    return [{"role": m["role"], "content": m["content"]} for m in value]


def prompt_text(row: object, engine, where: str) -> str:
    """The text a JSONL row asks the model to continue: raw, or its messages through the chat template.

    Args:
        row: the parsed JSONL line.
        engine: the loaded Engine (`chat_prompt` applies its template, generation prompt included).
        where: "file:line", for error messages.
    """
    if isinstance(row, dict) and isinstance(row.get("prompt"), str):
        return row["prompt"]
    if isinstance(row, dict) and "messages" in row:
        messages = _messages(row["messages"], where)
        if not hasattr(engine, "chat_prompt"):
            raise ValueError(f"{where}: chat messages need a chat template; {engine.name} cannot render one")
        return engine.chat_prompt(messages)
    raise ValueError(f'{where}: each line must be an object with a string "prompt" or a "messages" list')


def load_prompts(path: str | Path, engine, limit: int | None = None) -> list[Prompt]:
    """Read a JSONL prompt file into Prompts (text, reference, the ids every entry is fed).

    Args:
        path: the JSONL file (see the module docstring for the two line forms).
        engine: the loaded Engine: its chat template and `encode` make the text and the ids.
        limit: keep only the first `limit` prompts.
    Raises:
        FileNotFoundError: no such file. ValueError: a bad line (file:line in the message) or no prompts.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"prompts file not found: {path}")
    out = []
    for where, row in iter_jsonl(path):
        text = prompt_text(row, engine, where)
        reference = row.get("reference")
        if reference is not None and not isinstance(reference, str):
            raise ValueError(f'{where}: "reference" must be a string')
        out.append(Prompt(text, reference, engine.encode(text)))
        if limit is not None and len(out) == limit:
            break
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def default_files(engine) -> list[tuple[Split, Path]]:
    """The sets a run uses when none is given: held-out + calibration chat prompts for a chat model,
    held-out text continuations for a named base model of prose, else held-out + development code
    prompts (of each pair, those that ship)."""
    named = PACKAGED.get(getattr(engine, "name", None))
    if not is_instruct(engine) and named is not None and named.prompts == "text":
        return [("held-out", TEXT_TEST)]
    if is_instruct(engine):
        chat = [(s, p) for s, p in (("held-out", CHAT_TEST), ("dev", CHAT_CALIBRATION)) if p.is_file()]
        if chat:
            return chat
    return [(s, p) for s, p in (("held-out", CODE_TEST), ("dev", DEVSET)) if p.is_file()]


def prompt_sets(
    engine, held_out: str | Path | None, dev: str | Path | None, limit: int | None
) -> list[PromptSet]:
    """The run's prompt sets, held-out first: the files given, or `default_files` when none is."""
    if held_out is None and dev is None:
        files = default_files(engine)
    else:
        files = [
            (split_of(Path(p), s), Path(p))
            for s, p in (("held-out", held_out), ("dev", dev))
            if p is not None
        ]
    return [PromptSet(p.stem, s, p, load_prompts(p, engine, limit)) for s, p in files]


def split_of(path: Path, given: Split) -> Split:
    """A file's split: a shipped development file (the chat calibration split, yue-code-mini's dev set)
    is "dev" even when given as the held-out set (`--prompts`), so a run on it never reads as held-out."""
    shipped_dev = {f.resolve() for f in (CHAT_CALIBRATION, DEVSET) if f.is_file()}
    return "dev" if path.is_file() and path.resolve() in shipped_dev else given
