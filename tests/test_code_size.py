"""The package's sizes (docs/style.md): no Python file over 600 lines, no function over 80.

The few that are still over are listed by name with their size today, so the list can only shrink: a new
long file or function fails, and so does a listed one that grew (or one that shrank under the bound and
should leave the list).
"""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1] / "yue"
MAX_FILE_LINES, MAX_FUNCTION_LINES = 600, 80

# Known debt: path (from the package root) or "path:function" -> its size in lines today.
OVER = {
    "train/campaign.py:main": 81,
    "train/finetune.py:finetune": 88,
    "train/loop.py:train": 148,
    "train/losses.py:joint_loss": 92,
    "train/router.py:run_train_router": 105,
    "train/selfdistill.py:self_distill": 95,
    "train/topnar_run.py:distill_top_nar": 111,
}


def _sizes() -> dict[str, int]:
    sizes = {}
    for path in sorted(ROOT.rglob("*.py")):
        rel = path.relative_to(ROOT).as_posix()
        text = path.read_text(encoding="utf-8")
        sizes[rel] = text.count("\n")
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                sizes[f"{rel}:{node.name}"] = node.end_lineno - node.lineno + 1
    return sizes


def test_no_file_or_function_is_over_its_bound_unless_listed_and_none_grew():
    sizes = _sizes()
    over = {
        name: n for name, n in sizes.items() if n > (MAX_FUNCTION_LINES if ":" in name else MAX_FILE_LINES)
    }
    assert not (set(over) - set(OVER)), f"new over the bound: { {k: over[k] for k in set(over) - set(OVER)} }"
    grew = {name: (OVER[name], n) for name, n in over.items() if n > OVER[name]}
    assert not grew, f"listed and grew (listed, now): {grew}"
    left = set(OVER) - set(over)
    assert not left, f"now within the bound: remove from OVER: {sorted(left)}"
