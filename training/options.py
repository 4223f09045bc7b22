"""Command-line options shared by every ``clip-train`` command."""

from __future__ import annotations

# CLIP_STORE is the one name the service and both command lines read; MODEL_STORE is a deprecated
# alias. ``StoreOpt`` is the command's --store, ``GroupStoreOpt`` the one before the command: a
# --store given after the command wins, else the group's flag, variable or default applies.
from model_store.cli_options import DEFAULT_STORE, GroupStoreOpt, StoreOpt

__all__ = ["DEFAULT_STORE", "GroupStoreOpt", "StoreOpt", "set_threads"]


def set_threads(threads: int) -> None:
    """A command's ``--threads``: torch's intra-op threads for this process (0: leave torch's
    default). torch is imported here, when a command that computes starts, not with the program."""
    if threads:
        import torch

        torch.set_num_threads(threads)
