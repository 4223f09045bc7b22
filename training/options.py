"""Command-line options shared by every ``clip-train`` command."""

from __future__ import annotations

# CLIP_STORE is the one name the service and both command lines read; MODEL_STORE is a deprecated
# alias. ``StoreOpt`` is the command's --store, ``GroupStoreOpt`` the one before the command: a
# --store given after the command wins, else the group's flag, variable or default applies.
from model_store.cli_options import DEFAULT_STORE, GroupStoreOpt, StoreOpt

__all__ = ["DEFAULT_STORE", "GroupStoreOpt", "StoreOpt"]
