"""The standard library's documentation on disk, as items to write chat prompts about (`prompts.py`).

Design decisions:
- Sources (no network, no hub): the running interpreter's pydoc topics (`pydoc_data.topics`, split into
  their sections) and the docstrings of modules, public functions, public classes and their public
  methods, read from `Lib/**/*.py` with `ast` (never imported: importing some modules has side
  effects). Test folders, site-packages, private modules and a few packages of generated or odd text
  (`encodings`, `idlelib`, `lib2to3`, ...) are skipped. Passages are capped at ~1200 characters at a
  paragraph or sentence end.
- Splits: an item's split key is its top-level package (`json` for `json.decoder.JSONDecoder`) or, for
  a pydoc section, its title; ~10% of keys (by sha256, so the same on every machine) are
  `calibration`, the rest `train`. A calibration item whose passage shares a 12-word shingle with any
  train item (e.g. `ntpath` and `posixpath` share docstrings) is dropped, so calibration text is
  never trained on.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from yue.train.data import EXCLUDED_DIR_NAMES, is_test_path, stdlib_root

Split = Literal["train", "calibration"]
SPLITS: tuple[str, ...] = ("train", "calibration")

CALIBRATION_FRACTION = 0.1  # of split keys (top-level packages, pydoc sections)
PASSAGE_CHARS = 1200  # ~300 tokens: with the instruction, a prompt stays under ~400 tokens
SHINGLE_WORDS = 12  # a shared run of this many words counts as shared text
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
