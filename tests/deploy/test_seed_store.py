"""deploy/seed_store.py: filling a cluster's store volume from the image's baked store."""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from model_store import ModelStore

REPO = Path(__file__).resolve().parents[2]


def _load() -> ModuleType:
    spec = importlib.util.spec_from_file_location("seed_store", REPO / "deploy" / "seed_store.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["seed_store"] = module
    spec.loader.exec_module(module)
    return module


seed_store = _load()


@pytest.fixture(scope="module")
def baked(tmp_path_factory: pytest.TempPathFactory, publish_model: Callable[..., str]) -> Path:
    """A source store like the image's /models: tiny@v1 (production) and tiny@v2 (staging)."""
    root = tmp_path_factory.mktemp("baked")
    publish_model(root, "tiny", seed=0, aliases=("production",))
    publish_model(root, "tiny", seed=1, aliases=("staging",))
    return root


def test_seeds_an_empty_volume_and_verifies(baked: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "volume"
    assert seed_store.main(["--source", str(baked), "--target", str(target), "--verify", "tiny@production"]) == 0
    store = ModelStore(target)
    assert store.list_versions("tiny") == ["v1", "v2"]
    assert store.aliases("tiny") == ModelStore(baked).aliases("tiny")
    assert "ok tiny@production -> tiny@v1" in capsys.readouterr().out
    assert not [p for p in (target / "tiny").iterdir() if p.name.startswith(".staging")]


def test_of_a_served_set_the_first_model_is_verified(
    baked: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # The other models of CLIP_MODEL may be published after seeding: the service serves without them.
    refs = "tiny@staging,other@production"
    assert seed_store.main(["--source", str(baked), "--target", str(tmp_path / "volume"), "--verify", refs]) == 0
    assert "ok tiny@staging -> tiny@v2" in capsys.readouterr().out


def test_reseeding_keeps_promotions_and_adds_only_missing_versions(baked: Path, tmp_path: Path) -> None:
    target = tmp_path / "volume"
    seed_store.seed(baked, target)
    store = ModelStore(target)
    # An operator's promotion on the volume (forced: random weights, never evaluated).
    store.promote("tiny", "production", "v2", force=True, reason="random weights, never evaluated")
    assert seed_store.seed(baked, target) == []
    assert store.alias_target("tiny", "production") == "v2"


def test_cleans_a_leftover_read_only_staging_copy(baked: Path, tmp_path: Path) -> None:
    target = tmp_path / "volume"
    stale = target / "tiny" / f"{seed_store.STAGING_PREFIX}v1"
    stale.mkdir(parents=True)
    (stale / "model.safetensors").write_bytes(b"half a file")
    stale.chmod(0o555)
    seed_store.seed(baked, target)
    assert not stale.exists()
    ModelStore(target).verify("tiny", "v1")


def test_verify_fails_on_a_corrupt_volume(baked: Path, tmp_path: Path) -> None:
    target = tmp_path / "volume"
    seed_store.seed(baked, target)
    weights = target / "tiny" / "versions" / "v1" / "model.safetensors"
    weights.chmod(0o644)
    weights.write_bytes(b"corrupt")
    assert seed_store.main(["--source", str(baked), "--target", str(target), "--verify", "tiny@production"]) == 1
    assert seed_store.main(["--source", str(baked), "--target", str(target), "--verify", "tiny@nope"]) == 1


@pytest.mark.slow
def test_seeds_a_bucket_through_the_store(baked: Path, s3_env: Any, capsys: pytest.CaptureFixture[str]) -> None:
    target = s3_env.new_location()
    assert seed_store.main(["--source", str(baked), "--target", target, "--verify", "tiny@production"]) == 0
    assert "ok tiny@production -> tiny@v1" in capsys.readouterr().out
    store, source = ModelStore(target), ModelStore(baked)
    assert store.list_versions("tiny") == ["v1", "v2"]
    assert store.aliases("tiny") == source.aliases("tiny")
    for version in ("v1", "v2"):
        assert store.manifest("tiny", version) == source.manifest("tiny", version)  # same files, same digests
        store.verify("tiny", version)
    # An operator's promotion in the bucket is kept (forced: random weights, never evaluated).
    store.promote("tiny", "production", "v2", force=True, reason="random weights, never evaluated")
    assert seed_store.main(["--source", str(baked), "--target", target]) == 0
    assert store.alias_target("tiny", "production") == "v2"
    assert "target already holds every version" in capsys.readouterr().out


def test_an_unknown_target_scheme_is_refused(baked: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    assert seed_store.main(["--source", str(baked), "--target", "gs://bucket/models"]) == 1
    assert list(tmp_path.iterdir()) == []
