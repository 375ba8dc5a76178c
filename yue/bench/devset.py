"""Code prompt sets for yue-code-mini: the development set (Lib/test) and a held-out test set (third party).

Design decisions:
- Source: `Lib/test/**/*.py` of the running interpreter. The `stdlib` training recipe excludes test
  folders, so these prompts are held out by construction, yet they are the same kind of text.
- One prompt per file (40 files by default), so no single file dominates the numbers.
- A prompt starts at a `def`/`class` line and ends at the END of a line, *before* its newline
  (about 200-600 characters). Ending before the newline puts the cut on a natural token boundary of a
  byte-level BPE (whitespace runs such as "\\n        " are single tokens; a prompt ending in "\\n"
  would force an unnatural split). The reference is the true continuation from that newline on,
  cut at the first line end past ~500 characters (about 128 tokens of the default tokenizer).
- Deterministic: files are sorted, then shuffled with a seeded `random.Random`; every choice after
  that draws from the same generator.

The held-out test set (`yue/assets/code_test.jsonl`, `build_held_out`) is cut the same way from a
DIFFERENT source: the pure-Python third-party packages in HELD_OUT_PACKAGES (click, jinja2, rich,
starlette, prometheus_client), which yue depends on directly or through typer/fastapi. yue-code-mini
trained on the standard library (`Lib/**/*.py` minus test folders) and its defaults were chosen on the
dev set (Lib/test), so no text of these packages was trained or tuned on. Keep it that way: a training
or calibration recipe must not read them (`tests/test_devset.py` checks the shipped set against the
stdlib corpus by 8-line shingles). Their files are found with `importlib.util.find_spec`, without
importing them; the packages take turns (each shuffles its files with the seed), one prompt per file.
Each record's "source" is "<package>/<file relative to the package>", "version" the installed one.

`python -m yue.bench.devset [--out FILE] [--n 40] [--seed 0]` rewrites `yue/assets/devset.jsonl`;
`python -m yue.bench.devset --held-out` rewrites `yue/assets/code_test.jsonl` instead.
`load_chat_set("calibration" | "calibration-everyday" | "test")` reads the shipped chat prompt sets (see CHAT_SETS).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import json
import random
import re
import sysconfig
from pathlib import Path

DEFAULT_OUT = Path(__file__).resolve().parent.parent / "assets" / "devset.jsonl"
HELD_OUT = DEFAULT_OUT.parent / "code_test.jsonl"
# Pure-Python packages yue depends on (directly, or via typer and fastapi): the held-out set's source.
HELD_OUT_PACKAGES = ("click", "jinja2", "rich", "starlette", "prometheus_client")
_START = re.compile(r"^\s*(async\s+def|def|class)\s+\w")
# Folders of deliberately odd files (bad encodings, bad syntax, generated data).
_SKIP_PARTS = {
    "cjkencodings",
    "encoded_modules",
    "tokenizedata",
    "__pycache__",
    "data",
    "leakers",
    "crashers",
}


def test_root() -> Path:
    """The running interpreter's `Lib/test` folder."""
    return Path(sysconfig.get_paths()["stdlib"]) / "test"


def test_files(root: Path) -> list[Path]:
    """Sorted `*.py` files under `root`, minus folders of deliberately odd files."""
    if not root.is_dir():
        raise FileNotFoundError(f"no standard-library test folder at {root}")
    return [
        p
        for p in sorted(root.rglob("*.py"))
        if not (_SKIP_PARTS & set(p.relative_to(root).parts)) and "badsyntax" not in p.name
    ]


def _clean(lines: list[str]) -> bool:
    """Plain code: no very long lines, tabs or control characters."""
    return all(
        len(ln) <= 120 and "\t" not in ln and not re.search(r"[\x00-\x08\x0b-\x1f]", ln) for ln in lines
    )


def _grow(lines: list[str], start: int, chars: int) -> int:
    """End index of the run of lines from `start` whose text (newlines included) first reaches `chars`."""
    end, n = start, 0
    while end < len(lines) and n < chars:
        n += len(lines[end]) + 1
        end += 1
    return end


def cut_example(
    text: str,
    rng: random.Random,
    prompt_chars: tuple[int, int] = (200, 600),
    reference_chars: int = 500,
) -> dict[str, str] | None:
    """One {"prompt", "reference"} pair from a file's text, or None if the file offers no clean cut.

    Args:
        text: the file's contents.
        rng: the seeded generator (choices are deterministic given it).
        prompt_chars: (min, max) prompt length in characters.
        reference_chars: the reference is cut at the first line end at or past this many characters.
    """
    lines = text.split("\n")
    lo, hi = prompt_chars
    target = rng.randint(lo, (lo + hi) // 2)  # the prompt grows until it reaches this length
    candidates = []
    for i, line in enumerate(lines):
        if not _START.match(line):
            continue
        j = _grow(lines, i, target)  # the prompt: line by line until `target` characters
        prompt_lines = lines[i:j]
        prompt = "\n".join(prompt_lines)
        if not (lo <= len(prompt) <= hi) or not _clean(prompt_lines):
            continue
        k = _grow(lines, j, reference_chars)  # the reference: "\n" + lines until `reference_chars`
        ref_lines = lines[j:k]
        reference = "\n" + "\n".join(ref_lines)
        if not reference_chars <= len(reference) <= reference_chars + 150 or not _clean(ref_lines):
            continue
        if len(reference.strip()) < reference_chars // 2:  # mostly blank lines
            continue
        candidates.append({"prompt": prompt, "reference": reference})
    return rng.choice(candidates) if candidates else None


def build_devset(n: int = 40, seed: int = 0, root: str | Path | None = None) -> list[dict[str, str]]:
    """`n` prompt/reference pairs from `n` different test files, deterministic given `seed`.

    Each record also names its source file (relative to the test folder) for audit.
    """
    base = Path(root) if root is not None else test_root()
    files = test_files(base)
    rng = random.Random(seed)
    rng.shuffle(files)
    records = []
    for path in files:
        try:
            text = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        example = cut_example(text, rng)
        if example is None:
            continue
        records.append({**example, "source": str(path.relative_to(base))})
        if len(records) == n:
            break
    if len(records) < n:
        raise RuntimeError(f"only {len(records)} of {n} examples could be cut from {base}")
    return records


def package_root(name: str) -> Path:
    """The folder of an installed package, found without importing it.

    Raises:
        FileNotFoundError: the package is not installed, or is a single module rather than a folder.
    """
    spec = importlib.util.find_spec(name)  # a top-level name: nothing is imported
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"package {name!r} is not installed as a folder of source files")
    return Path(next(iter(spec.submodule_search_locations)))


def package_files(root: Path) -> list[Path]:
    """Sorted `*.py` files of a package, minus caches, test folders and vendored copies."""
    skip = {"__pycache__", "test", "tests", "_vendor", "vendor"}
    return [p for p in sorted(root.rglob("*.py")) if not skip & set(p.relative_to(root).parts[:-1])]


def build_held_out(
    n: int = 40, seed: int = 0, packages: tuple[str, ...] = HELD_OUT_PACKAGES, cut=None
) -> list[dict[str, str]]:
    """`n` prompt/reference pairs from `n` different files of third-party packages, deterministic given
    `seed` and the installed versions.

    The packages take turns, so each contributes about `n / len(packages)` prompts; a package out of
    files with a clean cut drops out of the rotation. Records: prompt, reference, source
    ("<package>/<relative file>") and version (the installed distribution's, for audit).
    `cut(text, rng)` makes a file's examples (a dict, a list of them, or None; default `cut_example`).
    """
    cut = cut or cut_example
    rng = random.Random(seed)
    queues = []
    for name in packages:
        root = package_root(name)
        files = package_files(root)
        rng.shuffle(files)
        queues.append((name, root, importlib.metadata.version(name), files))
    records: list[dict[str, str]] = []
    while len(records) < n and any(files for *_, files in queues):
        for name, root, version, files in queues:
            while files and len(records) < n:
                path = files.pop(0)
                try:
                    examples = cut(path.read_text(encoding="utf-8"), rng)
                except (UnicodeDecodeError, OSError):
                    continue
                if examples:
                    source = f"{name}/{path.relative_to(root).as_posix()}"
                    examples = [examples] if isinstance(examples, dict) else examples
                    records += [{**e, "source": source, "version": version} for e in examples][: n - len(records)]
                    break
    if len(records) < n:
        raise RuntimeError(f"only {len(records)} of {n} examples could be cut from {', '.join(packages)}")
    return records


def write_jsonl(records: list[dict[str, str]], out: str | Path) -> Path:
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    with out.open("w", encoding="utf-8") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False) + "\n")
    return out


def load_devset(path: str | Path | None = None) -> list[dict[str, str]]:
    """Read a JSONL prompt set (default: the shipped development set)."""
    path = Path(path) if path is not None else DEFAULT_OUT
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


# Chat prompt sets for instruct models, JSONL `{"messages": [{"role": "user", "content": ...}], "source": ...}`:
# - "calibration": 40 prompts made by `yue.train.prompts` from its calibration split (stdlib packages and
#   pydoc sections that the self-distillation prompts never use); defaults (threshold, draft length) are
#   chosen on it. Source "stdlib-calibration:<task>:<kind>:<name>".
# - "calibration-everyday": 40 everyday requests written by hand later, for choosing what the stdlib
#   calibration split cannot show (its questions are like the NAR set's training text; everyday ones are
#   not): the same categories as "test", none of its prompts. Source "handwritten-calibration:<category>".
# - "test": 40 held-out everyday requests written by hand for this set (writing, science, cooking,
#   travel, history, maths word problems, general Python), not derived from the stdlib; never used to
#   train or tune anything. Source "handwritten:<category>".
# Every set is excluded from model-written training prompts by content hash (`yue distill --prompts model:N`).
CHAT_SETS = {
    "calibration": DEFAULT_OUT.parent / "chat_calibration.jsonl",
    "calibration-everyday": DEFAULT_OUT.parent / "chat_calibration_everyday.jsonl",
    "test": DEFAULT_OUT.parent / "chat_test.jsonl",
}


def load_chat_set(name: str) -> list[dict]:
    """A shipped chat prompt set by name (`CHAT_SETS`); each record holds a user message.

    Raises:
        ValueError: an unknown name, or a record without a user message.
    """
    if name not in CHAT_SETS:
        raise ValueError(f"unknown chat set {name!r}; choose one of {sorted(CHAT_SETS)}")
    records = load_devset(CHAT_SETS[name])
    for i, r in enumerate(records, 1):
        messages = r.get("messages")
        if not isinstance(messages, list) or not any(
            isinstance(m, dict) and m.get("role") == "user" and isinstance(m.get("content"), str)
            for m in messages
        ):
            raise ValueError(f'{CHAT_SETS[name]}:{i}: expected a user message in "messages"')
    return records


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument(
        "--out", default=None, help="default: devset.jsonl, or code_test.jsonl with --held-out"
    )
    parser.add_argument("--n", type=int, default=40)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--root", default=None, help="test folder (default: the interpreter's Lib/test)")
    parser.add_argument(
        "--held-out",
        action="store_true",
        help=f"cut the test set from {', '.join(HELD_OUT_PACKAGES)} instead",
    )
    args = parser.parse_args(argv)
    if args.held_out:
        records = build_held_out(args.n, args.seed)
        out = write_jsonl(records, args.out or HELD_OUT)
    else:
        records = build_devset(args.n, args.seed, args.root)
        out = write_jsonl(records, args.out or DEFAULT_OUT)
    print(f"wrote {len(records)} examples to {out}")


if __name__ == "__main__":
    main()
