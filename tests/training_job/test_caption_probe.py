"""Scene-structure features, and the ground-truth caption probe end to end on the tiny model."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch

from training.caption_probe import main
from training.world.scene import Scene, SceneObject
from training.world.structure import SLOT, WIDTH, SceneEncoder, scene_features
from training.world.vocab import COLOUR_NAMES, SHAPES, SIZES


def test_scene_features_put_objects_left_to_right() -> None:
    right = SceneObject(shape="circle", colour=COLOUR_NAMES[0], size=SIZES[0], radius=0.1, x=0.8, y=0.3)
    left = SceneObject(shape="cross", colour=COLOUR_NAMES[1], size=SIZES[-1], radius=0.2, x=0.2, y=0.6)
    f = scene_features(Scene(objects=(right, left))).reshape(2, SLOT)
    assert f[0, SHAPES.index("cross")] == 1 and f[1, SHAPES.index("circle")] == 1
    assert f[0, len(SHAPES) + 1] == 1 and f[1, len(SHAPES)] == 1
    np.testing.assert_allclose(f[0, -4:], (0.2, 0.6, 0.2, 1.0))
    np.testing.assert_array_equal(f[:, -6:-4], [[1, 0], [0, 1]])  # cross: left of, not above; circle: above
    single = scene_features(Scene(objects=(right,))).reshape(2, SLOT)
    assert single[1].sum() == 0 and single[0, -1] == 1 and single[0, -6:-4].sum() == 0  # an empty second slot


def test_scene_encoder_ignores_slot_order_but_not_content() -> None:
    torch.manual_seed(0)
    enc = SceneEncoder(8, width=16)
    x = torch.rand(3, WIDTH)
    swapped = torch.cat([x[:, SLOT:], x[:, :SLOT]], dim=1)
    torch.testing.assert_close(enc(x), enc(swapped))
    assert not torch.allclose(enc(x[:1]), enc(x[1:2]))


def test_probe_prints_fit_and_test_rows(tiny_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    main(["--store", str(tiny_store), "--model", "tiny@production", "--encoder", "base",
          "--train-items", "64", "--steps", "3", "--test-items", "8"])  # fmt: skip
    rows = [line for line in capsys.readouterr().out.splitlines() if re.match(r"^\| (TRAIN|TEST)", line)]
    assert [r.split("|")[1].strip() for r in rows] == ["TRAIN (fit)", *(f"TEST seed {s}" for s in (1000, 1001, 1002))]
    for row in rows:
        values = [float(v) for v in row.strip("|").split("|")[1:]]
        assert len(values) == 7 and all(0.0 <= v <= 1.0 for v in values)
