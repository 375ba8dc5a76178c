"""Chat prompts for self-distilling a NAR set onto an instruct model, made from the standard library on disk.

Design decisions:
- Sources (no network, no hub): the running interpreter's pydoc topics (`pydoc_data.topics`, split into
  their sections) and the docstrings of modules, public functions, public classes and their public
  methods, read from `Lib/**/*.py` with `ast` (never imported: importing some modules has side
  effects). Test folders, site-packages, private modules and a few packages of generated or odd text
  (`encodings`, `idlelib`, `lib2to3`, ...) are skipped. Passages are capped at ~1200 characters at a
  paragraph or sentence end, and a prompt over ~400 tokens (`approx_tokens`) is skipped.
- Tasks: eleven kinds of request written about those items (explain, explain from its docs, summarize
  a passage, write an example, the difference between two siblings, list the arguments, rewrite a
  docstring in plain words, answer a question about a passage given in the prompt, implement a function
  from its docstring, a docstring for a signature, general requests about a topic), each with several
  phrasings. Short, concrete requests dominate: a 135M instruct model answers those best.
- Splits: an item's split key is its top-level package (`json` for `json.decoder.JSONDecoder`) or, for
  a pydoc section, its title; ~10% of keys (by sha256, so the same on every machine) are
  `calibration`, the rest `train`. A calibration item whose passage shares a 12-word shingle with any
  train item (e.g. `ntpath` and `posixpath` share docstrings) is dropped, so calibration text is
  never trained on.
- Determinism: every (item, task) pair yields one prompt whose phrasing is chosen by a hash of its
  name, so the pool of distinct prompts of a split does not depend on the seed; `seed` only orders
  them (tasks interleaved by weight). Past the pool size the order starts again, reshuffled, and the
  prompts repeat (a warning says so).

`python -m yue.train.prompts` rewrites `yue/assets/chat_calibration.jsonl` and prints the pool sizes.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import json
import logging
import random
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from yue.train.data import EXCLUDED_DIR_NAMES, is_test_path, stdlib_root

log = logging.getLogger(__name__)

Split = Literal["train", "calibration"]
SPLITS: tuple[str, ...] = ("train", "calibration")
CALIBRATION_FRACTION = 0.1  # of split keys (top-level packages, pydoc sections)
PASSAGE_CHARS = 1200  # ~300 tokens: with the instruction, a prompt stays under ~400 tokens
MAX_PROMPT_TOKENS = 340  # by `approx_tokens` (~0.9 of real tokens): keeps dense code or tables near 400
SHINGLE_WORDS = 12  # a shared run of this many words counts as shared text
CALIBRATION_OUT = Path(__file__).resolve().parent.parent / "assets" / "chat_calibration.jsonl"
# Top-level packages of generated, deprecated-internal or odd text (codecs tables, IDE internals, 2to3).
SKIP_PACKAGES = frozenset(
    "encodings idlelib lib2to3 turtledemo distutils pydoc_data this antigravity ensurepip".split()
)


@dataclass(frozen=True)
class DocItem:
    """One documented thing: a module, function, class or pydoc section.

    `key` decides the split; `name` is how prompts call it (`json.dumps`, or a section title);
    `signature` is `(a, b=1, *c)` for functions and classes (their `__init__`), without self/cls.
    """

    key: str
    kind: Literal["module", "function", "class", "topic"]
    name: str
    doc: str
    signature: str = ""


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


def stable_int(text: str) -> int:
    """A 64-bit integer from sha256 (Python's `hash` of str is salted per process)."""
    return int.from_bytes(hashlib.sha256(text.encode("utf-8")).digest()[:8], "big")


def split_of(key: str) -> Split:
    """The split of a split key: `calibration` for ~10% of keys, by a salted sha256."""
    return "calibration" if stable_int("yue-chat-split:" + key) / 2**64 < CALIBRATION_FRACTION else "train"


def content_hash(text: str) -> str:
    """sha256 of a prompt's text with whitespace collapsed (the disjointness tests compare these)."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


def shingles(text: str, k: int = SHINGLE_WORDS) -> set[tuple[str, ...]]:
    """Every run of `k` consecutive lower-cased words (`\\w+`) of `text`."""
    words = re.findall(r"\w+", text.lower())
    return {tuple(words[i : i + k]) for i in range(len(words) - k + 1)}


def approx_tokens(text: str) -> int:
    """Letter runs, digits, punctuation marks, indents, non-ASCII characters: a median ~0.9 of SmolLM2's
    token count (digits are single tokens there), with no tokenizer to load."""
    return len(re.findall(r"[A-Za-z]+|\d|[^\w\s]|\n[ \t]*|[^\x00-\x7f]", text))


def cap_passage(text: str, limit: int = PASSAGE_CHARS) -> str:
    """`text` cut to at most `limit` characters at a paragraph end, else a sentence end, else a space."""
    text = text.strip()
    if len(text) <= limit:
        return text
    head = text[:limit]
    for sep in ("\n\n", ". ", "\n", " "):
        cut = head.rfind(sep)
        if cut >= limit // 3:
            return head[: cut + (1 if sep == ". " else 0)].rstrip()
    return head.rstrip()


# ---------------------------------------------------------------------------------------------------
# Reading the items
# ---------------------------------------------------------------------------------------------------


def _module_name(rel: Path) -> str:
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _signature(node: ast.FunctionDef | ast.AsyncFunctionDef, method: bool) -> str:
    args = node.args
    if method and (args.posonlyargs or args.args):
        args = ast.arguments(**{**vars(args)})
        first = args.posonlyargs if args.posonlyargs else args.args
        if first[0].arg in ("self", "cls"):
            first = first[1:]
            if args.posonlyargs:
                args.posonlyargs = first
            else:
                args.args = first
    return f"({ast.unparse(args)})"


def _usable_doc(doc: str | None) -> bool:
    return bool(doc) and len(doc) >= 25 and not doc.lstrip().lower().startswith(("copyright", "xxx"))


def _file_items(tree: ast.Module, module: str, key: str) -> list[DocItem]:
    """The module's docstring, its public functions and classes, and those classes' public methods."""
    items = []
    doc = ast.get_docstring(tree)
    if _usable_doc(doc):
        items.append(DocItem(key, "module", module, cap_passage(doc)))
    for node in tree.body:
        if node.name.startswith("_") if hasattr(node, "name") else True:
            continue
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            doc = ast.get_docstring(node)
            if _usable_doc(doc):
                items.append(
                    DocItem(
                        key, "function", f"{module}.{node.name}", cap_passage(doc), _signature(node, False)
                    )
                )
        elif isinstance(node, ast.ClassDef):
            methods = [m for m in node.body if isinstance(m, ast.FunctionDef | ast.AsyncFunctionDef)]
            init = next((m for m in methods if m.name == "__init__"), None)
            doc = ast.get_docstring(node)
            if _usable_doc(doc):
                sig = _signature(init, True) if init else ""
                items.append(DocItem(key, "class", f"{module}.{node.name}", cap_passage(doc), sig))
            for m in methods:
                doc = ast.get_docstring(m)
                if not m.name.startswith("_") and _usable_doc(doc):
                    name = f"{module}.{node.name}.{m.name}"
                    items.append(DocItem(key, "function", name, cap_passage(doc), _signature(m, True)))
    return items


def _module_items(root: Path) -> list[DocItem]:
    items = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        top = rel.parts[0].removesuffix(".py")
        if top in SKIP_PACKAGES or top.startswith("_") or "-" in top or is_test_path(rel):
            continue
        if any(p in EXCLUDED_DIR_NAMES or p.startswith("_") for p in rel.parts[1:-1]):
            continue
        module = _module_name(rel)
        if any(p.startswith("_") for p in module.split(".")):
            continue
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):  # a file of another Python's syntax or with NUL bytes
            continue
        items.extend(_file_items(tree, module, top))
    return items


_HEADER = re.compile(r"^(.+)\n([*=\-])\2{2,}\n", re.MULTILINE)


def _topic_items(topics: dict[str, str]) -> list[DocItem]:
    """pydoc topics cut into their titled sections, each section once (topics repeat each other's).

    A section's title (`The "for" statement`, quotes turned into backticks) is its name and split key;
    its text is cut into passages of at most PASSAGE_CHARS.
    """
    sections: dict[str, str] = {}
    for topic in sorted(topics):
        text = topics[topic]
        heads = list(_HEADER.finditer(text))
        for h, nxt in zip(heads, heads[1:] + [None], strict=True):
            title = re.sub(r'"([^"]+)"', r"`\1`", h.group(1).strip())
            body = text[h.end() : nxt.start() if nxt else len(text)].strip()
            if len(body) >= 80 and title not in sections:
                sections[title] = body
    items = []
    for title, body in sections.items():
        rest = body
        while rest:  # consecutive passages of one section share its key (same split)
            passage = cap_passage(rest)
            if _is_prose(passage):
                items.append(DocItem("pydoc:" + title, "topic", title, passage))
            rest = rest[len(passage) :].strip() if len(rest) > len(passage) else ""
    return items


def _is_prose(passage: str) -> bool:
    """A passage that opens with a sentence and is mostly unindented text (not a table or grammar)."""
    lines = [ln for ln in passage.splitlines() if ln.strip()]
    indented = sum(ln.startswith((" ", "|", "+")) for ln in lines)
    return passage[:1].isalpha() and indented <= len(lines) // 2


def stdlib_items(root: str | Path | None = None) -> tuple[DocItem, ...]:
    """Every usable item of the interpreter's stdlib (`root`: another `Lib/` folder), in a fixed order.

    Parsing the stdlib takes a few seconds; the result is cached for the process.
    """
    return _stdlib_items(str(root or ""))


@functools.lru_cache(maxsize=2)
def _stdlib_items(root: str) -> tuple[DocItem, ...]:
    from pydoc_data.topics import topics  # a data module: a dict of str, no side effects

    return tuple(_module_items(Path(root) if root else stdlib_root()) + _topic_items(topics))


def split_items(split: Split, root: str | Path | None = None) -> tuple[DocItem, ...]:
    """The items of one split; calibration items sharing a 12-word shingle with train text are dropped."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    return _split_items(split, str(root or ""))


@functools.lru_cache(maxsize=4)
def _split_items(split: Split, root: str) -> tuple[DocItem, ...]:
    items = stdlib_items(root)
    mine = [it for it in items if split_of(it.key) == split]
    if split == "train":
        return tuple(mine)
    cal_shingles = set().union(*(shingles(it.doc) for it in mine)) if mine else set()
    leaked: set[tuple[str, ...]] = set()
    for it in split_items("train", root):
        leaked |= shingles(it.doc) & cal_shingles
    return tuple(it for it in mine if not (shingles(it.doc) & leaked))


# ---------------------------------------------------------------------------------------------------
# Tasks: each maps an item (or a pair) to one prompt, phrasing chosen by a stable hash of its name
# ---------------------------------------------------------------------------------------------------


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


def write_calibration_set(out: str | Path = CALIBRATION_OUT, n: int = 40, seed: int = 0) -> Path:
    """Write `n` calibration prompts as JSONL `{"messages": [...], "source": ...}`."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for p in chat_prompt_records(n, seed, "calibration"):
            record = {
                "messages": p.messages,
                "source": f"stdlib-calibration:{p.task}:{p.source.removeprefix('stdlib:')}",
            }
            f.write(json.dumps(record, ensure_ascii=False) + "\n")
    return out


if __name__ == "__main__":
    path = write_calibration_set()
    for split in SPLITS:
        sizes = {t: len(p) for t, p in prompt_pool(split).items()}
        print(
            f"{split}: {count_chat_prompts(split)} distinct prompts, {len(split_items(split))} items; {sizes}"
        )
    print(f"wrote {path}")
