"""What only the PostgreSQL + pgvector store has, on a real server: the HNSW index option (recall
against exact search, a selective filter still filling k), one database shared by two stores,
its URL's options checked at start-up, an unreachable database as ``not_ready`` (503) without
the password, and values PostgreSQL cannot hold as bad input."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import psycopg
import pytest
from pgvector_server import pgvector_server_fixture, pgvector_url_fixture  # noqa: F401

from clipcore.errors import ClipError, ErrorCode
from service.collections.postgres import PostgresCollections, parse_url
from service.collections.store import NewItem, open_collections
from service.config import CollectionsSettings


def unit(rng: np.random.Generator, n: int, dim: int) -> np.ndarray:
    x = rng.standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def fill(store: PostgresCollections, vectors: np.ndarray) -> None:
    store.create("c", "m@production", "v1", vectors.shape[1], dense=False)
    items = [NewItem(f"i{i}", {"group": i % 50}, v, None) for i, v in enumerate(vectors)]
    for start in range(0, len(items), 500):
        store.upsert("c", items[start : start + 500])


def index_names(url: str) -> list[str]:
    with psycopg.connect(parse_url(url).conninfo) as conn:
        return [r[0] for r in conn.execute("SELECT indexdef FROM pg_indexes WHERE indexdef LIKE '%hnsw%'")]


@pytest.mark.slow
def test_hnsw_search_finds_nearly_what_exact_search_does_and_fills_k_under_a_filter(pgvector_url: str) -> None:
    rng = np.random.default_rng(0)
    vectors, queries = unit(rng, 3000, 32), unit(rng, 30, 32)
    store = open_collections(f"{pgvector_url}&index=hnsw&ef_search=40&hnsw_m=8")
    assert isinstance(store, PostgresCollections)
    fill(store, vectors)
    (definition,) = index_names(pgvector_url)
    assert "vector_ip_ops" in definition and "m='8'" in definition
    recalls = []
    for q in queries:
        approx = [h.id for h in store.search("c", q, 10, {})]
        exact = [h.id for h in store.search("c", q, 10, {}, exact=True)]
        want = [f"i{i}" for i in np.argsort(-(vectors @ q))[:10]]
        assert exact == want  # exact=True compares every row, the index notwithstanding
        recalls.append(len(set(approx) & set(want)) / 10)
    print("recall@10", np.mean(recalls))
    assert np.mean(recalls) >= 0.9, recalls
    # A filter keeping 1 item in 50: after ef_search=40 graph candidates alone it would leave
    # about one; the iterative scan goes on until k are found.
    hits = store.search("c", queries[0], 10, {"group": 7})
    assert len(hits) == 10 and all(h.metadata == {"group": 7} for h in hits)
    store.close()


def test_an_index_built_after_a_bulk_load_serves_the_hnsw_store(pgvector_url: str) -> None:
    rng = np.random.default_rng(1)
    vectors = unit(rng, 500, 16)
    exact = open_collections(pgvector_url)
    assert isinstance(exact, PostgresCollections)
    fill(exact, vectors)
    assert index_names(pgvector_url) == []  # index=exact builds none
    exact.build_hnsw("c")
    assert len(index_names(pgvector_url)) == 1
    hnsw = open_collections(f"{pgvector_url}&index=hnsw")
    q = vectors[7]
    assert hnsw.search("c", q, 1, {})[0].id == "i7" and exact.search("c", q, 1, {})[0].id == "i7"
    exact.close()
    hnsw.close()


def test_two_stores_on_one_database_share_the_collections_and_counts(pgvector_url: str) -> None:
    rng = np.random.default_rng(2)
    a, b = open_collections(pgvector_url), open_collections(pgvector_url)
    a.create("shared", "m@production", "v1", 8, dense=False)
    vectors = unit(rng, 4, 8)
    assert a.upsert("shared", [NewItem("x", {}, vectors[0], None), NewItem("y", {}, vectors[1], None)]) == 2
    assert b.upsert("shared", [NewItem("y", {"again": True}, vectors[2], None)]) == 2  # replaced, not added
    assert b.upsert("shared", [NewItem("z", {}, vectors[3], None)]) == 3
    assert b.remove("shared", "x") and not a.remove("shared", "x")
    assert a.info("shared").count == 2
    assert a.search("shared", vectors[2], 1, {})[0].metadata == {"again": True}
    a.close()
    b.close()


def test_text_postgres_cannot_hold_is_bad_input(pgvector_url: str) -> None:
    store = open_collections(pgvector_url)
    store.create("c", "m", "v1", 4, dense=False)
    v = np.full(4, 0.5, dtype=np.float32)
    for item in (NewItem("nul\x00id", {}, v, None), NewItem("ok", {"k": "a\x00b"}, v, None)):
        with pytest.raises(ClipError) as refused:
            store.upsert("c", [item])
        assert refused.value.code == ErrorCode.bad_input
    assert store.info("c").count == 0
    store.close()


def test_a_collection_dropped_during_a_call_is_unknown_not_a_500(pgvector_url: str) -> None:
    store = open_collections(pgvector_url)
    store.create("c", "m", "v1", 4, dense=False)
    store.upsert("c", [NewItem("a", {}, np.full(4, 0.5, dtype=np.float32), None)])
    # What another server's drop leaves between this call's catalogue read and its query.
    with psycopg.connect(parse_url(pgvector_url).conninfo, autocommit=True) as conn:
        conn.execute("DROP TABLE clip_dense_1, clip_items_1")
    with pytest.raises(ClipError) as gone:
        store.search("c", np.full(4, 0.5, dtype=np.float32), 5, {})
    assert gone.value.code == ErrorCode.unknown_collection
    store.close()


def test_an_unreachable_database_is_not_ready_and_never_shows_the_password(tmp_path: Path) -> None:
    url = f"postgresql://clip:s3cret@/clip?host={tmp_path}&pool_wait_s=0.3"
    store = open_collections(url)  # opening waits for nothing: the server starts without it
    for call in (store.list_all, lambda: store.info("c"), lambda: store.create("c", "m", "v1", 4, False)):
        with pytest.raises(ClipError) as down:
            call()
        assert down.value.code == ErrorCode.not_ready and down.value.retry_after
        assert "s3cret" not in down.value.message and str(tmp_path) in down.value.message
    store.close()


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://h/db?index=ivf",
        "postgresql://h/db?index=hnsw&ef_search=0",
        "postgresql://h/db?index=hnsw&hnsw_m=1",
        "postgresql://h/db?ef_search=many",
        "postgresql://h/db?pool_wait_s=0",
        "postgresql://h/db?no_such_libpq_option=1",
        "mysql://h/db",
    ],
)
def test_bad_urls_are_refused_at_start_up(url: str) -> None:
    with pytest.raises(ValueError):
        CollectionsSettings(url=url)


def test_good_urls_keep_libpq_options_and_drop_the_stores_own() -> None:
    options = parse_url("postgres://u:p@db.example:5433/clip?sslmode=require&index=hnsw&ef_search=200")
    assert (options.index, options.ef_search, options.hnsw_m) == ("hnsw", 200, 16)
    assert options.conninfo == "postgres://u:p@db.example:5433/clip?sslmode=require"
    assert CollectionsSettings(url="postgresql://u:p@db/clip").url == "postgresql://u:p@db/clip"


def test_server_settings_in_the_urls_options_reach_every_connection(pgvector_url: str) -> None:
    # libpq's own ``options`` (a server setting for the session): its space must stay a space on
    # its way through the store's URL parsing, not become a '+' that the server refuses.
    store = open_collections(f"{pgvector_url}&options=-c%20synchronous_commit%3Doff&index=exact")
    assert isinstance(store, PostgresCollections)
    store.create("c", "m@production", "v1", 4, dense=False)
    store.upsert("c", [NewItem("a", {}, np.array([1, 0, 0, 0], np.float32), None)])
    with store._connection() as conn:
        assert conn.execute("SHOW synchronous_commit").fetchone() == ("off",)
    assert store.info("c").count == 1
    store.close()


@pytest.mark.parametrize("configured", ["index=hnsw", "index=exact"])
def test_a_reembedded_collection_keeps_its_hnsw_index_built_once_over_the_staged_copy(
    pgvector_url: str, configured: str
) -> None:
    # index=hnsw, and an index=exact store's collection that build_hnsw indexed: the staged copy
    # is filled without an index (nothing searches it), and the switch builds it before the old
    # tables go.
    rng = np.random.default_rng(4)
    old, new = unit(rng, 300, 16), unit(rng, 300, 8)
    store = open_collections(f"{pgvector_url}&{configured}")
    assert isinstance(store, PostgresCollections)
    fill(store, old)
    if configured == "index=exact":
        store.build_hnsw("c")
    store.stage("c", "v2", 8, dense=False)
    store.upsert_staged("c", [NewItem(f"i{i}", {"group": i % 50}, v, None) for i, v in enumerate(new)])
    assert len(index_names(pgvector_url)) == 1  # the live collection's only
    info = store.commit_staged("c")
    assert (info.version, info.dim, info.count) == ("v2", 8, 300)
    (definition,) = index_names(pgvector_url)
    assert "clip_items_1_hnsw ON public.clip_items_1 USING hnsw" in definition
    hnsw = open_collections(f"{pgvector_url}&index=hnsw")
    assert [h.id for h in hnsw.search("c", new[42], 1, {})] == ["i42"]
    store.close()
    hnsw.close()
