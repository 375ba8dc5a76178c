"""The documentation's relative links resolve: the README, docs/ and the model cards point at files
(bench JSON, recipes, the measurement log) that move as the project grows."""

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCS = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "recipes" / "README.md",
    *sorted((ROOT / "yue" / "assets").glob("*/README.md")),
]
LINK = re.compile(r"\]\(([^)\s]+)\)")  # markdown [text](target) and ![alt](target)


def relative_links(doc: Path) -> list[str]:
    """The link targets in `doc` that name a file of this repository (no URL, no bare #anchor)."""
    targets = (m.group(1) for m in LINK.finditer(doc.read_text(encoding="utf-8")))
    return [t.split("#")[0] for t in targets if not re.match(r"[a-z]+:", t) and not t.startswith("#")]


def test_the_checked_documents_have_links():
    """The check reads something: the README alone links the measurement log and bench files."""
    assert {"docs/results-log.md", "docs/serve.md"} <= set(relative_links(ROOT / "README.md"))


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc):
    missing = [t for t in relative_links(doc) if not (doc.parent / t).exists()]
    assert not missing, f"{doc.relative_to(ROOT)} links to missing files: {missing}"


def test_the_readme_is_a_newcomers_page():
    """Issue 62: the README stays short (dated logs live in docs/) and starts with the two commands."""
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 130
    quick = text[text.index("## Quick start") :]
    assert "yue generate" in quick.split("```")[1] and "python -m pytest" in quick.split("```")[1]
