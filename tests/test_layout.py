"""The house's layout: the installed package holds the library only. What made the shipped models (the
campaigns, their cards and summaries) lives in `recipes/` at the repository root, which nothing in
`yue/` imports and the wheel leaves out (`[tool.setuptools.packages.find] include = ["yue*"]`)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "yue"
# Modules that made a shipped model and nothing a user's training imports: recipes/ holds them.
RECIPE_MODULES = {"card", "summary", "campaign", "yue_smol_campaign", "calibration_set"}


def _imported_names(path: Path) -> set[str]:
    """Absolute module names `path` imports (module level or inside functions)."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module)
    return names


def _is_main_guard(node: ast.stmt) -> bool:
    """`if __name__ == "__main__":`."""
    test = node.test if isinstance(node, ast.If) else None
    return (
        isinstance(test, ast.Compare)
        and isinstance(test.left, ast.Name)
        and test.left.id == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in test.comparators)
    )


def test_nothing_in_the_package_imports_recipes():
    offenders = {
        str(p.relative_to(ROOT)): sorted(n for n in _imported_names(p) if n.split(".")[0] == "recipes")
        for p in PACKAGE.rglob("*.py")
    }
    assert not {k: v for k, v in offenders.items() if v}, offenders


def test_train_holds_no_campaign_or_card_module():
    modules = {p.stem for p in (PACKAGE / "train").glob("*.py")}
    assert not modules & RECIPE_MODULES, sorted(modules & RECIPE_MODULES)
    assert {"card", "summary", "yue_smol_campaign"} <= {p.stem for p in (ROOT / "recipes").glob("*.py")}


def test_train_modules_are_library_modules_not_scripts():
    """A script that made a model has a `__main__` block; in yue/train none does (the CLI runs the library)."""
    scripts = [
        str(p.relative_to(ROOT))
        for p in (PACKAGE / "train").glob("*.py")
        if any(_is_main_guard(n) for n in ast.parse(p.read_text(encoding="utf-8")).body)
    ]
    assert not scripts, scripts


def test_every_recipe_the_readme_lists_exists_and_every_recipe_is_listed():
    readme = (ROOT / "recipes" / "README.md").read_text(encoding="utf-8")
    files = {p.name for p in (ROOT / "recipes").iterdir() if p.suffix in (".py", ".sh")} - {"__init__.py"}
    missing = sorted(f for f in files if f"`{f}`" not in readme)
    assert not missing, f"recipes/README.md does not describe {missing}"
