"""The tiny DCSM test model: a random shapes-smoke CLIP with a random DCSM scorer, as published by
the dense-scoring tests and reused by the backend and benchmark tests (``publish_dense_model``
fixture in tests/conftest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

SMOKE_CONFIG = Path(__file__).resolve().parents[2] / "training" / "configs" / "shapes-smoke.json"
UNEVALUATED = "random weights for tests: never evaluated"  # why their alias moves are forced
GROUPS_EXTRA = {"beside": ["next to"]}  # a two-token functional word, on top of the defaults
TABLE_SEED = 0


def publish_dense(
    root: Path, name: str = "dense", *, broken: bool = False, seed: int = 0, aliases: tuple[str, ...] = ("production",)
) -> str:
    """A random shapes-smoke model with a random DCSM scorer; ``broken`` gives it NaN weights (the same
    ``seed`` publishes the same weights again)."""
    import torch

    from clipcore.methods.dcsm import DEFAULT_SCORER_CONFIG, DCSMScorer, functional_row_table
    from clipcore.models.clip_model import build_model
    from clipcore.models.dense import dcsm_component, dcsm_files
    from clipcore.models.publish import TrainedModel, publish_bundle
    from model_store import ModelStore

    config = json.loads(SMOKE_CONFIG.read_text())
    torch.manual_seed(seed)
    model = build_model(config)
    groups = training_groups()
    cfg = {
        **DEFAULT_SCORER_CONFIG,
        "channels": 8,
        "hidden": 32,
        "grid": 8,
        "functional_groups": groups,
        "table_seed": TABLE_SEED,
    }
    scorer = DCSMScorer(cfg)
    state = {k: v * float("nan") if broken else v for k, v in scorer.state_dict().items()}
    files = dcsm_files(state, cfg, functional_row_table(groups, 65, TABLE_SEED))
    manifest = publish_bundle(
        ModelStore(root),
        name,
        TrainedModel(model, config, extra_files=files, components={"dcsm": dcsm_component(cfg)}, fp16=False),
        aliases=list(aliases),
        force=bool(aliases),  # random weights: never evaluated, as the version they replace
        reason=UNEVALUATED if aliases else None,
    )
    return manifest.version


def training_groups() -> dict[str, list[str]]:
    from clipcore.methods.dcsm import FUNCTIONAL_GROUPS

    return {**{g: list(w) for g, w in FUNCTIONAL_GROUPS.items()}, **GROUPS_EXTRA}


def training_row(group: str) -> np.ndarray:
    """The table row training gave ``group``: row i belongs to the i-th group by name."""
    from clipcore.methods.dcsm import functional_row_table

    groups = sorted(training_groups())
    return functional_row_table(groups, 65, TABLE_SEED)[groups.index(group)].numpy()  # type: ignore[no-any-return]
