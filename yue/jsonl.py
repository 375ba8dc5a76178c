"""Reading JSONL files the same way everywhere: blank lines skipped, every error naming file:line."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path


def iter_jsonl(path: str | Path) -> Iterator[tuple[str, object]]:
    """Yield ("file:line", parsed value) for each non-blank line of a JSONL file.

    Raises:
        FileNotFoundError: no such file. ValueError: a line that is not JSON (file:line in the message).
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"file not found: {path}")
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{n}"
            try:
                yield where, json.loads(line)
            except ValueError as e:
                raise ValueError(f"{where}: not JSON ({e})") from None
