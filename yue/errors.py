"""Errors a user can cause and fix: each is a ValueError whose message names the file or the command.

Kept apart from the model code so that light modules (the registry, the CLI) can raise them without
importing torch.
"""

from __future__ import annotations


class CheckpointError(ValueError):
    """A model folder is missing, truncated or corrupt. The message names the file."""


class ModelNotInstalledError(CheckpointError):
    """A named model's files come from a package that is not installed. The message gives the exact
    install command."""
