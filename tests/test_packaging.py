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
