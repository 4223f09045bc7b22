"""Both collection stores, the embedded one on real files and PostgreSQL + pgvector on a real
server, through the same calls: what they answer after a restart (the embedded index and filters
rebuilt from SQLite), replacement and removal, exact search, bad names."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector_server import pgvector_server_fixture, pgvector_url_fixture  # noqa: F401

from clipcore.errors import ClipError, ErrorCode
from service.collections.embedded import EmbeddedCollections
from service.collections.store import CollectionStore, NewItem, collections_path, open_collections

OpenStore = Callable[[], CollectionStore]


@pytest.fixture(params=["embedded", "postgres"])
def open_store(request: pytest.FixtureRequest, tmp_path: Path) -> OpenStore:
    """Opens the backend's store (again: a restart) on the same folder or database."""
    url = f"file://{tmp_path}" if request.param == "embedded" else request.getfixturevalue("pgvector_url")
    return lambda: open_collections(url)


def unit(rng: np.random.Generator, n: int, dim: int = 16) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def test_a_reopened_store_answers_as_before_and_keeps_removals(open_store: OpenStore) -> None:
    rng = np.random.default_rng(0)
    vectors = unit(rng, 50)
    store = open_store()
    store.create("c", "m@production", "v1", 16, dense=True)
    tokens = rng.standard_normal((50, 5, 16)).astype(np.float16)
    store.upsert("c", [NewItem(f"i{i}", {"even": i % 2 == 0, "n": i}, vectors[i], tokens[i]) for i in range(50)])
    assert store.remove("c", "i0") and not store.remove("c", "i0")
    store.upsert("c", [NewItem("i2", {"even": False, "n": 2}, vectors[3], tokens[3])])  # replaced
    query = unit(rng, 1)[0]
    before = store.search("c", query, 10, {"even": True})
    store.close()

    reopened = open_store()
    assert reopened.info("c").count == 49
    after = reopened.search("c", query, 10, {"even": True})
    assert [(h.id, h.metadata) for h in after] == [(h.id, h.metadata) for h in before]
    ids = [h.id for h in after]
    assert "i0" not in ids and "i2" not in ids and all(h.metadata["even"] is True for h in after)
    # Exact: the best 10 of the even items by inner product, in order.
    even = [i for i in range(4, 50, 2)]
    want = sorted(even, key=lambda i: -float(vectors[i] @ query))[:10]
    assert ids == [f"i{i}" for i in want]
    np.testing.assert_allclose([h.cosine for h in after], [vectors[i] @ query for i in want], atol=1e-6)
    np.testing.assert_array_equal(reopened.dense_tokens("c", ["i2"])[0], tokens[3].astype(np.float32))
    assert reopened.search("c", query, 5, {"n": 2.0})[0].id == "i2"  # 2 == 2.0, one JSON number
    assert reopened.search("c", query, 5, {"n": True}) == []  # a number is no boolean
    assert reopened.search("c", query, 5, {"n": "2"}) == []  # nor a string
    assert reopened.search("c", query, 5, {"even": True, "n": 4})[0].id == "i4"  # every key must match
    reopened.close()


def test_names(open_store: OpenStore) -> None:
    store = open_store()
    with pytest.raises(ClipError) as bad:
        store.create("../x", "m", "v1", 4, dense=False)
    assert bad.value.code == ErrorCode.bad_input
    with pytest.raises(ClipError) as missing:
        store.info("absent")
    assert missing.value.code == ErrorCode.unknown_collection
    store.create("a", "m", "v1", 4, dense=False)
    with pytest.raises(ClipError) as taken:
        store.create("a", "m", "v1", 4, dense=False)
    assert taken.value.code == ErrorCode.collection_exists
    with pytest.raises(ClipError) as missing:
        store.upsert("absent", [])
    assert missing.value.code == ErrorCode.unknown_collection
    store.create("b", "m", "v1", 4, dense=False)
    assert store.upsert("b", []) == 0
    assert [c.name for c in store.list_all()] == ["a", "b"]
    store.drop("a")
    assert [c.name for c in store.list_all()] == ["b"]
    store.drop("b")
    assert store.list_all() == []
    with pytest.raises(ClipError) as gone:
        store.drop("a")
    assert gone.value.code == ErrorCode.unknown_collection
    store.create("a", "m", "v2", 4, dense=False)  # the name is free again, empty
    assert (store.info("a").version, store.info("a").count) == ("v2", 0)
    store.close()


def test_a_dropped_embedded_collection_leaves_no_file(tmp_path: Path) -> None:
    store = open_collections(f"file://{tmp_path}")
    store.create("a", "m", "v1", 4, dense=False)
    store.drop("a")
    assert not list(tmp_path.iterdir())


def test_urls() -> None:
    assert collections_path("file:///var/lib/clip") == Path("/var/lib/clip")
    assert collections_path("file:collections") == Path("collections")
    for url in ("postgresql://db/clip", "/var/lib/clip", "file://host/x"):
        with pytest.raises(ValueError):
            collections_path(url)


def test_a_staged_version_replaces_the_collection_at_once(open_store: OpenStore, tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    old, new = unit(rng, 3), unit(rng, 3, dim=8)
    store = open_store()
    on_disk = isinstance(store, EmbeddedCollections)
    store.create("c", "m@production", "v1", 16, dense=False)
    store.upsert("c", [NewItem(f"i{i}", {"n": i}, old[i], None, f"{i:064x}") for i in range(3)])
    assert [(s.id, s.metadata, s.image) for s in store.stored_images("c")] == [
        (f"i{i}", {"n": i}, f"{i:064x}") for i in range(3)
    ]
    store.stage("c", "v2", 8, dense=False)
    assert store.upsert_staged("c", [NewItem(f"i{i}", {"n": i}, new[i], None, f"{i:064x}") for i in range(2)]) == 2
    # Until the commit the collection is the old version, whole; the staged copy is listed nowhere.
    assert (store.info("c").version, store.info("c").count) == ("v1", 3)
    assert [i.name for i in store.list_all()] == ["c"]
    assert store.search("c", old[2], 1, {})[0].id == "i2"
    assert store.upsert_staged("c", [NewItem("i2", {"n": 2}, new[2], None, f"{2:064x}")]) == 3
    info = store.commit_staged("c")
    assert (info.version, info.dim, info.count) == ("v2", 8, 3)
    (hit,) = store.search("c", new[1], 1, {"n": 1})
    assert hit.id == "i1" and hit.cosine == pytest.approx(1, abs=1e-6)
    store.close()
    # What was committed is kept; a collection dropped while a version is staged takes the
    # staged copy with it.
    store = open_store()
    assert store.info("c").version == "v2"
    store.stage("c", "v3", 8, dense=False)
    store.drop("c")
    assert store.list_all() == [] and not (on_disk and list(tmp_path.iterdir()))
    with pytest.raises(ClipError) as gone:
        store.upsert_staged("c", [NewItem("i0", {}, new[0], None)])
    assert gone.value.code == ErrorCode.unknown_collection and not (on_disk and list(tmp_path.iterdir()))
    # A staged copy discarded leaves the collection as it was; a commit without one is refused.
    store.create("d", "m@production", "v1", 16, dense=False)
    store.upsert("d", [NewItem("i0", {}, old[0], None, f"{0:064x}")])
    store.stage("d", "v2", 8, dense=False)
    store.discard_staged("d")
    with pytest.raises(ClipError):
        store.commit_staged("d")
    assert (store.info("d").version, store.info("d").count) == ("v1", 1)
    store.close()


def test_a_running_jobs_record_and_its_staged_copy_outlive_the_store_and_end_with_the_switch(
    open_store: OpenStore,
) -> None:
    rng = np.random.default_rng(2)
    old, new = unit(rng, 3), unit(rng, 3, dim=8)
    store = open_store()
    for name in ("c", "d"):
        store.create(name, "m@production", "v1", 16, dense=False)
        store.upsert(name, [NewItem(f"i{i}", {"n": i}, old[i], None, f"{i:064x}") for i in range(3)])
    assert store.saved_jobs() == {} and store.staged_images("c") is None
    record = {"kind": "reembed", "model": "m@v2", "version": "v2", "total": 3, "done": 0, "started_at": "t"}
    store.save_job("c", record)
    store.stage("c", "v2", 8, dense=False)
    store.upsert_staged("c", [NewItem("i0", {"n": 0}, new[0], None, f"{0:064x}")])
    store.save_job("c", {**record, "done": 1})  # progress replaces the record
    store.save_job("d", record)
    store.save_job("d", None)  # a failed job's record is removed
    store.close()
    # A restart: the record and the staged copy are there, the collection still on its version.
    store = open_store()
    assert store.saved_jobs() == {"c": {**record, "done": 1}}
    assert store.saved_job("c") == {**record, "done": 1} and store.saved_job("d") is None
    staged = store.staged_images("c")
    assert staged is not None and staged[0] == "v2"
    assert [(s.id, s.metadata, s.image) for s in staged[1]] == [("i0", {"n": 0}, f"{0:064x}")]
    assert store.info("c").version == "v1"
    store.upsert_staged("c", [NewItem(f"i{i}", {"n": i}, new[i], None, f"{i:064x}") for i in (1, 2)])
    # The switch ends the job: the collection's new version carries no record.
    assert store.commit_staged("c").version == "v2"
    assert store.saved_jobs() == {} and store.staged_images("c") is None
    store.save_job("d", record)
    store.drop("d")  # a dropped collection takes its record with it
    assert store.saved_jobs() == {}
    store.close()


def test_one_store_at_a_time_holds_a_collections_job_lease_until_it_releases_it_or_its_session_ends(
    pgvector_url: str,
) -> None:
    """Two stores on one database (two servers): the second cannot claim the lease the first
    holds; once the holder releases it, or its session ends without a word (a killed server's
    connection), the second claims it; a lease whose session is gone no longer holds."""
    first, second = open_collections(pgvector_url), open_collections(pgvector_url)
    try:
        first.create("leased", "m@production", "v1", 4, dense=False)
        first.create("other", "m@production", "v1", 4, dense=False)
        lease = first.claim_job("leased")
        assert lease is not None and lease.holds()
        assert second.claim_job("leased") is None
        other = second.claim_job("other")  # one lease a collection
        assert other is not None
        other.release()
        lease.release()
        taken = second.claim_job("leased")
        assert taken is not None and first.claim_job("leased") is None
        # The holder's session ended by the database (as when its server dies): the lease is free.
        session = taken._session  # type: ignore[attr-defined]
        with psycopg.connect(pgvector_url, autocommit=True) as admin:
            admin.execute("SELECT pg_terminate_backend(%s)", (session.info.backend_pid,))
        assert not taken.holds()
        again = first.claim_job("leased")
        assert again is not None
        again.release()
        with pytest.raises(ClipError) as absent:
            first.claim_job("absent")
        assert absent.value.code == ErrorCode.unknown_collection
    finally:
        first.close()
        second.close()


def test_the_embedded_store_leases_every_job_to_its_own_process(tmp_path: Path) -> None:
    store = EmbeddedCollections(tmp_path)
    store.create("c", "m@production", "v1", 4, dense=False)
    lease = store.claim_job("c")
    assert lease is not None and lease.holds()
    lease.release()
    with pytest.raises(ClipError):
        store.claim_job("absent")
