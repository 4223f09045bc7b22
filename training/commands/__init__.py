"""The ``clip-train`` commands (Typer), one module per group; ``training.cli`` is the entry point.

- ``data``: ``clip-train data ...`` (validate, import datasets);
- ``import_model``: ``clip-train import`` (a user's open_clip model);
- ``tune``: ``clip-train tune`` (serving decisions measured on this machine);
- ``userdata``: one command per method on a user's data (``pcclip``, ``dcsm``, ``semclip``,
  ``yukino``, ``comparatives``) and ``base --data``;
- ``world``: the shapes world, building and evaluating versions (``base``, ``build-default``,
  ``evaluate``, ``show-eval``, ...).

The work itself is in the modules these call, which other programs may call directly.
"""

from __future__ import annotations

import typer

from training.commands import data, import_model, tune, userdata, world


def register(app: typer.Typer) -> None:
    """Every command and group on ``app``, in the order ``--help`` lists them."""
    app.add_typer(data.data_app, name="data")
    app.command("import")(import_model.import_cmd)
    app.command("tune")(tune.tune_cmd)
    userdata.register(app)
    world.register(app)
