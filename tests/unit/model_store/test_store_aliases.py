"""Reference resolution, promotion, rollback and concurrent alias updates."""

from __future__ import annotations

import json
import threading

import pytest
from conftest import Root
from model_store_helpers import publish_evaluated

from model_store import ChecksumMismatch, InvalidName, ModelNotFound, ModelStore, PreconditionFailed, StoreError


@pytest.fixture
def three(store: ModelStore) -> ModelStore:
    for payload in (b"one", b"two", b"three"):
        publish_evaluated(store, payload)
    return store


def test_resolve_bare_alias_version_and_unknown(three: ModelStore) -> None:
    with pytest.raises(ModelNotFound):
        three.resolve("clip")  # no production alias yet
    three.promote("clip", "production", "v2")
    three.promote("clip", "staging", "v3")
    assert three.resolve("clip") == ("clip", "v2")
    assert three.resolve("clip@production") == ("clip", "v2")
    assert three.resolve("clip@staging") == ("clip", "v3")
    assert three.resolve("clip@v1") == ("clip", "v1")
    for unknown in ("clip@v9", "clip@canary", "other", "other@v1"):
        with pytest.raises(ModelNotFound):
            three.resolve(unknown)
    for invalid in ("../clip", "clip@../v1", "clip@"):
        with pytest.raises(InvalidName):
            three.resolve(invalid)


def test_alias_wins_over_literal_version(three: ModelStore) -> None:
    three.promote("clip", "v1", "v3")
    assert three.resolve("clip@v1") == ("clip", "v3")


def test_publish_with_aliases(store: ModelStore) -> None:
    publish_evaluated(store, aliases=["production", "staging"])
    publish_evaluated(store, b"new", aliases=["staging"])
    assert store.aliases("clip") == {"production": "v1", "staging": "v2"}
    assert store.alias_history("clip") == {"staging": ["v1"]}


def test_promote_and_rollback_history(three: ModelStore, root: Root) -> None:
    assert three.promote("clip", "production", "v1") is None
    assert three.promote("clip", "production", "v2") == "v1"
    assert three.promote("clip", "production", "v2") == "v2"  # no-op, history not padded
    assert three.promote("clip", "production", "v3") == "v2"
    assert three.alias_history("clip") == {"production": ["v1", "v2"]}
    on_disk = json.loads(root.read("clip/aliases.json"))
    assert on_disk["schema_version"] == 2 and on_disk["aliases"]["production"]["version"] == "v3"

    assert three.rollback("clip", "production") == "v2"
    assert three.alias_target("clip", "production") == "v2"
    with pytest.raises(PreconditionFailed, match="already rolled back .* --expect v2"):
        three.rollback("clip", "production")  # a second operator's rollback of the same incident
    assert three.rollback("clip", "production", expect="v2") == "v1"  # stepping further back: said so
    assert three.alias_history("clip") == {}
    with pytest.raises(StoreError, match="no previous version"):
        three.rollback("clip", "production", expect="v1")
    assert three.aliases("clip") == {"production": "v1"}
    assert not [name for name in root.children("clip") if ".tmp-" in name]


def test_promote_refuses_unknown_or_corrupt_versions(three: ModelStore, root: Root) -> None:
    three.promote("clip", "production", "v1")
    with pytest.raises(ModelNotFound):
        three.promote("clip", "production", "v7")
    root.write("clip/versions/v2/model.safetensors", b"tampered")
    with pytest.raises(ChecksumMismatch):
        three.promote("clip", "production", "v2")
    with pytest.raises(InvalidName):
        three.promote("clip", "../prod", "v1")
    assert three.aliases("clip") == {"production": "v1"}


def test_rollback_refuses_corrupt_previous_version(three: ModelStore, root: Root) -> None:
    three.promote("clip", "production", "v1")
    three.promote("clip", "production", "v2")
    root.delete("clip/versions/v1/model.safetensors")
    with pytest.raises(ChecksumMismatch):
        three.rollback("clip", "production")
    assert three.alias_target("clip", "production") == "v2"


def test_alias_target_is_cheap_and_tolerant(three: ModelStore) -> None:
    assert three.alias_target("clip", "production") is None
    assert three.alias_target("missing-model", "production") is None
    three.promote("clip", "production", "v3")
    assert three.alias_target("clip", "production") == "v3"


def test_concurrent_promotions_lose_no_update(three: ModelStore, root: Root) -> None:
    barrier = threading.Barrier(8)
    errors: list[BaseException] = []

    def promote(i: int) -> None:
        try:
            barrier.wait()
            # Separate store objects, as separate processes would have.
            root.store().promote("clip", f"alias{i}", f"v{i % 3 + 1}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=promote, args=(i,)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    assert three.aliases("clip") == {f"alias{i}": f"v{i % 3 + 1}" for i in range(8)}
