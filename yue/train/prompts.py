"""Chat prompts for self-distilling a NAR set onto an instruct model, made from the standard library on disk.

Design decisions:
- Sources (no network, no hub): the standard library's documentation on disk, as items
  (`stdlib_docs.py`: pydoc sections, docstrings of modules, functions, classes), its passages capped;
  a prompt over ~400 tokens (`approx_tokens`) is skipped.
- Tasks: eleven kinds of request written about those items (explain, explain from its docs, summarize
  a passage, write an example, the difference between two siblings, list the arguments, rewrite a
  docstring in plain words, answer a question about a passage given in the prompt, implement a function
  from its docstring, a docstring for a signature, general requests about a topic), each with several
  phrasings. Short, concrete requests dominate: a 135M instruct model answers those best.
- Splits: by the item's split key (`stdlib_docs.split_of`: ~10% of keys `calibration`, the rest
  `train`; calibration text is never trained on).
- Determinism: every (item, task) pair yields one prompt whose phrasing is chosen by a hash of its
  name, so the pool of distinct prompts of a split does not depend on the seed; `seed` only orders
  them (tasks interleaved by weight). Past the pool size the order starts again, reshuffled, and the
  prompts repeat (a warning says so).

`python -m recipes.calibration_set` (outside the package) wrote `yue/assets/chat_calibration.jsonl` from it.
"""

from __future__ import annotations

import functools
import logging
import random
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path

from yue.train.stdlib_docs import (
    DocItem,
    Split,
    approx_tokens,
    cap_passage,
    content_hash,
    split_items,
    stable_int,
)

log = logging.getLogger(__name__)

MAX_PROMPT_TOKENS = 340  # by `approx_tokens` (~0.9 of real tokens): keeps dense code or tables near 400


@dataclass(frozen=True)
class ChatPrompt:
    """A one-turn conversation with where it came from (`source`: task and item) and its split key."""

    messages: list[dict[str, str]] = field(hash=False)
    task: str
    source: str
    key: str

    @property
    def content(self) -> str:
        return self.messages[0]["content"]


def _pick(options: list[str], *names: str) -> str:
    return options[stable_int("|".join(names)) % len(options)]


def _short(name: str) -> str:
    return name.rsplit(".", 1)[-1]


def _label(it: DocItem) -> str:
    if it.kind == "topic":
        return it.name[0].lower() + it.name[1:] if not it.name.startswith("`") else it.name
    return f"the `{it.name}` module" if it.kind == "module" else f"`{it.name}`"


def _first_paragraph(doc: str, limit: int = 400) -> str:
    return cap_passage(doc.split("\n\n")[0], limit)


def task_explain(it: DocItem) -> str | None:
    if it.kind == "topic":
        return _pick(
            [
                "Explain {l} in Python.",
                "What is {l} in Python? Keep it short.",
                "Can you explain {l} with a tiny example?",
            ],
            "explain",
            it.name,
        ).format(l=_label(it))
    return _pick(
        [
            "What does {l} do in Python?",
            "In one short paragraph, what is {l} used for?",
            "What is {l}? Keep the answer short.",
            "I saw {l} in some Python code. What does it do?",
            "Explain {l} in two or three sentences.",
        ],
        "explain",
        it.name,
    ).format(l=_label(it))


def task_explain_doc(it: DocItem) -> str | None:
    if it.kind == "topic":
        return None
    return _pick(
        [
            "Here is the documentation of `{n}`:\n\n{d}\n\nExplain in plain words what it does.",
            "Read this docstring and tell me, in two sentences, what `{n}` does.\n\n{d}",
            "{d}\n\nThat is the docstring of `{n}`. When would I use it?",
        ],
        "explain_doc",
        it.name,
    ).format(n=it.name, d=it.doc)


def task_summarize(it: DocItem) -> str | None:
    if len(it.doc) < 250 or it.kind == "function":
        return None
    return _pick(
        [
            "Summarize this passage in one sentence:\n\n{d}",
            "Give a short summary, at most three bullet points, of the following text.\n\n{d}",
            "{d}\n\nSummarize the text above in one or two sentences.",
            "What is the main idea of this text?\n\n{d}",
        ],
        "summarize",
        it.name,
    ).format(d=it.doc)


def task_example(it: DocItem) -> str | None:
    return _pick(
        [
            "Write a short Python example that uses {l}.",
            "Show me how to use {l} in a few lines of Python.",
            "Give a minimal, runnable example of {l}, with a comment on each step.",
            "Can you write a small script that demonstrates {l}? Keep it under 15 lines.",
        ],
        "example",
        it.name,
    ).format(l=_label(it))


def task_list_args(it: DocItem) -> str | None:
    if it.kind not in ("function", "class") or it.signature in ("", "()") or len(it.signature) > 160:
        return None
    return _pick(
        [
            "List the arguments of `{n}{s}` and say briefly what each one is for.",
            "What parameters does `{n}` take? Its signature is `{s}`.",
            "Here is a signature: `{n}{s}`. Explain each parameter in one line.",
            "Documentation of `{n}{s}`:\n\n{d}\n\nList its arguments with a short description of each.",
        ],
        "list_args",
        it.name,
    ).format(n=it.name, s=it.signature, d=it.doc)


def task_rewrite_doc(it: DocItem) -> str | None:
    if it.kind not in ("function", "class") or len(it.doc) < 80:
        return None
    return _pick(
        [
            "Rewrite this docstring in plain words for a beginner:\n\n{d}",
            "Make this documentation shorter and simpler, keeping its meaning:\n\n{d}",
            "Explain this docstring of `{n}` as if to someone new to Python:\n\n{d}",
        ],
        "rewrite_doc",
        it.name,
    ).format(n=it.name, d=it.doc)


_QUESTIONS = {
    "function": [
        "What does `{n}` return?",
        "What does `{n}` do?",
        "Which arguments does the passage mention?",
    ],
    "class": ["What is `{n}` used for?", "What does an instance of `{n}` represent?"],
    "module": ["What is the `{n}` module for?", "Name two things the passage says the module provides."],
    "topic": ["What rule does the passage describe?", "Give one example of what the passage describes."],
}


def task_qa_passage(it: DocItem) -> str | None:
    if len(it.doc) < 120:
        return None
    question = _pick(_QUESTIONS[it.kind], "qa_q", it.name).format(n=it.name)
    return _pick(
        [
            "Read the passage and answer the question.\n\nPassage:\n{d}\n\nQuestion: {q}",
            "{d}\n\nBased only on the text above: {q}",
            "Answer using this passage.\n\n{d}\n\n{q}",
        ],
        "qa_passage",
        it.name,
    ).format(d=it.doc, q=question)


def task_implement(it: DocItem) -> str | None:
    if it.kind != "function" or len(it.doc) > 600 or it.signature in ("", "()") or len(it.signature) > 120:
        return None
    sig, doc = f"{_short(it.name)}{it.signature}", it.doc
    if _pick(["plain", "code"], "implement_form", it.name) == "plain":
        return f'Write a Python function `{sig}` that does what this docstring says:\n\n"""{doc}"""'
    body = textwrap.indent(f'"""{doc}"""', "    ")
    return f"Implement this function:\n\n```python\ndef {sig}:\n{body}\n```"


def task_docstring(it: DocItem) -> str | None:
    if it.kind != "function" or it.signature in ("", "()") or len(it.signature) > 120:
        return None
    return _pick(
        [
            "Write a one-line docstring for this function:\n\ndef {s}: ...",
            "Suggest a good docstring for `def {s}`. Keep it to two lines.",
        ],
        "docstring",
        it.name,
    ).format(s=f"{_short(it.name)}{it.signature}")


def task_general(it: DocItem) -> str | None:
    if it.kind not in ("module", "topic", "class") or it.name.endswith(("Error", "Exception", "Warning")):
        return None
    return _pick(
        [
            "Give me three tips for using {l}.",
            "What are common mistakes people make with {l}?",
            "Write a short beginner tutorial about {l}.",
            "Why would I use {l}? Give two real-world use cases.",
            "Write a quiz question with its answer about {l}.",
            "Explain {l} to a ten-year-old.",
        ],
        "general",
        it.name,
    ).format(l=_label(it))


def task_difference(a: DocItem, b: DocItem) -> str | None:
    la, lb = (f"`{x.name}`" if x.kind != "topic" else x.name for x in (a, b))
    form = _pick(["plain", "when", "compare", "docs"], "difference", a.name, b.name)
    if form == "docs":
        da, db = _first_paragraph(a.doc), _first_paragraph(b.doc)
        return (
            f"Here are two descriptions.\n\n{la}: {da}\n\n{lb}: {db}\n\nWhat is the difference between them?"
        )
    return {
        "plain": f"What is the difference between {la} and {lb}?",
        "when": f"When should I use {la} instead of {lb}?",
        "compare": f"Compare {la} and {lb} in a few sentences.",
    }[form]


SINGLE_TASKS: dict[str, Callable[[DocItem], str | None]] = {
    "explain": task_explain,
    "explain_doc": task_explain_doc,
    "summarize": task_summarize,
    "example": task_example,
    "list_args": task_list_args,
    "rewrite_doc": task_rewrite_doc,
    "qa_passage": task_qa_passage,
    "implement": task_implement,
    "docstring": task_docstring,
    "general": task_general,
}
# Relative draw weights: short, concrete requests first.
TASK_WEIGHTS = {
    "explain": 3.0,
    "example": 2.0,
    "explain_doc": 1.5,
    "summarize": 1.5,
    "qa_passage": 1.5,
    "implement": 1.5,
    "difference": 1.5,
    "general": 1.5,
    "list_args": 1.0,
    "rewrite_doc": 1.0,
    "docstring": 0.5,
}


def _pairs(items: Iterable[DocItem]) -> list[tuple[DocItem, DocItem]]:
    """Sibling pairs: each item with the next one of its module (functions, classes) or of the topics."""
    groups: dict[str, dict[str, DocItem]] = {}
    for it in items:
        if it.kind == "topic":
            group = "topic"
        elif it.kind in ("function", "class"):
            group = f"{it.kind}:{it.name.rsplit('.', 1)[0]}"
        else:
            continue
        groups.setdefault(group, {}).setdefault(it.name, it)  # a section's first passage stands for it
    pairs = []
    for _, group in sorted(groups.items()):
        order = sorted(group.values(), key=lambda it: stable_int("pair|" + it.name))
        pairs.extend(zip(order, order[1:], strict=False))
    return pairs


def prompt_pool(split: Split, root: str | Path | None = None) -> dict[str, tuple[ChatPrompt, ...]]:
    """Every distinct prompt of a split, by task (seed-independent; the first of equal texts wins)."""
    return _prompt_pool(split, str(root or ""))


@functools.lru_cache(maxsize=4)
def _prompt_pool(split: Split, root: str) -> dict[str, tuple[ChatPrompt, ...]]:
    items = split_items(split, root)
    seen: set[str] = set()
    pool: dict[str, list[ChatPrompt]] = {t: [] for t in TASK_WEIGHTS}

    def add(task: str, text: str | None, source: str, key: str) -> None:
        if text and approx_tokens(text) <= MAX_PROMPT_TOKENS and content_hash(text) not in seen:
            seen.add(content_hash(text))
            pool[task].append(ChatPrompt([{"role": "user", "content": text}], task, source, key))

    for it in items:
        for task, make in SINGLE_TASKS.items():
            add(task, make(it), f"stdlib:{it.kind}:{it.name}", it.key)
    for a, b in _pairs(items):
        add("difference", task_difference(a, b), f"stdlib:{a.kind}:{a.name}|{b.name}", a.key)
    return {t: tuple(p) for t, p in pool.items()}


def count_chat_prompts(split: Split = "train", root: str | Path | None = None) -> int:
    """How many distinct prompts a split offers before `stdlib_chat_prompts` starts repeating."""
    return sum(len(p) for p in prompt_pool(split, root).values())


def chat_prompt_records(
    n: int, seed: int = 0, split: Split = "train", root: str | Path | None = None
) -> list[ChatPrompt]:
    """`n` prompts of `split`, tasks interleaved by TASK_WEIGHTS, each task's prompts in a seeded order.

    Distinct until the pool is spent; then the pool starts again in a new order (with a warning).
    """
    if n < 0:
        raise ValueError(f"n must be >= 0, got {n}")
    pool = prompt_pool(split, root)
    rng = random.Random(seed)
    out: list[ChatPrompt] = []
    epoch = 0
    while len(out) < n:
        queues = {t: rng.sample(p, len(p)) for t, p in pool.items() if p}
        if not queues:
            raise ValueError(f"the {split} split has no prompts")
        if epoch == 1:
            log.warning("asked for %d prompts; the %s split has %d distinct: repeating", n, split, len(out))
        while len(out) < n and queues:
            tasks = sorted(queues)
            task = rng.choices(tasks, weights=[TASK_WEIGHTS[t] for t in tasks])[0]
            out.append(queues[task].pop())
            if not queues[task]:
                del queues[task]
        epoch += 1
    return out


def stdlib_chat_prompts(n: int, seed: int = 0, split: Split = "train") -> list[list[dict[str, str]]]:
    """`n` one-turn conversations `[{"role": "user", "content": ...}]` from the stdlib's docs.

    Same (n, seed, split) and interpreter -> same prompts; "train" and "calibration" come from disjoint
    top-level packages / pydoc sections (see the module docstring).
    """
    return [[dict(m) for m in p.messages] for p in chat_prompt_records(n, seed, split)]
