"""The PostgreSQL + pgvector collection backend (``collections.url = postgresql://...``).

The same calls as the embedded store, in SQL: a catalogue table (``clip_collections``, one row a
collection, with its item count kept in the same transaction as the adds so ``info`` never
counts a million rows), and per collection an items table (``clip_items_<key>``: the id, the
metadata as JSONB under a GIN index, the vector as pgvector ``vector(d)``) and a table of DCSM
tokens (``clip_dense_<key>``, float16 bytes) that a search never reads. A re-embedding's staged
copy is listed in ``clip_staged`` and its running job's record kept in ``clip_jobs``; the server
that runs a collection's job holds a session-level advisory lock on it (``claim_job``). Tables are named by the
catalogue's key, not the collection name: names may be 64 characters, identifiers only 63.

The kNN is ``ORDER BY vector <#> query`` (pgvector's negative inner product; the vectors are unit
length, so it orders as cosine does). ``index=exact`` (the default) is a sequential scan, exact
like the embedded store; ``index=hnsw`` adds an HNSW index (``vector_ip_ops``), approximate, with
``hnsw.ef_search`` and, under a filter, pgvector's iterative scan so a selective filter still
fills ``k``. Filters are JSONB containment (``metadata @> '{"k": v}'``), which is equality within
one JSON type (1 = 1.0, 1 != true != "1"), as the embedded store matches.

Any server that can reach the database shares the collections (unlike the embedded folder). A
database that cannot be reached answers 503 ``not_ready`` on the collection routes only: the
pool reconnects by itself, and the server starts and scores without it.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Any
from urllib.parse import parse_qsl, quote, urlencode, urlparse, urlunparse

import numpy as np
import psycopg
from pgvector.psycopg import register_vector
from psycopg import sql
from psycopg.types.json import Jsonb
from psycopg_pool import ConnectionPool, PoolTimeout

from clipcore.errors import ClipError, ErrorCode, bad_input
from service.collections.store import (
    CollectionInfo,
    IndexKind,
    IndexSpec,
    JobLease,
    NewItem,
    Scalar,
    StoredHit,
    StoredImage,
    check_name,
    unknown,
)

# This backend's own options in the URL's query; every other one goes to libpq (sslmode, ...).
_OPTIONS = ("index", "hnsw_m", "hnsw_ef_construction", "ef_search", "pool_wait_s")

# The first key of the session-level advisory lock that leases a collection's job (the second is
# the collection's key): "clip" in ASCII, so other users of the database's advisory locks can tell.
LEASE_SPACE = 0x636C6970

_CATALOGUE = """
CREATE TABLE IF NOT EXISTS clip_collections (
    key serial PRIMARY KEY, name text UNIQUE NOT NULL, model text NOT NULL, version text NOT NULL,
    dim integer NOT NULL, dense boolean NOT NULL, count bigint NOT NULL DEFAULT 0,
    created_at text NOT NULL)
"""
# A re-embedding's staged copy of a collection (its tables ``clip_items_<key>_staged`` and
# ``clip_dense_<key>_staged``): the version, width and DCSM flag it is built for.
_STAGED = """
CREATE TABLE IF NOT EXISTS clip_staged (
    key integer PRIMARY KEY REFERENCES clip_collections ON DELETE CASCADE, version text NOT NULL,
    dim integer NOT NULL, dense boolean NOT NULL)
"""

# A running job's record (``save_job``): one row a collection, gone with it, and removed by
# ``commit_staged`` in the transaction that switches the collection.
_JOBS = """
CREATE TABLE IF NOT EXISTS clip_jobs (
    key integer PRIMARY KEY REFERENCES clip_collections ON DELETE CASCADE, job jsonb NOT NULL)
"""


@dataclass(frozen=True)
class PostgresOptions:
    conninfo: str  # the URL less this backend's options
    index: IndexKind = "exact"
    hnsw_m: int = 16
    hnsw_ef_construction: int = 64
    ef_search: int = 100
    pool_wait_s: float = 5.0  # how long a call waits for a connection before answering 503


def parse_url(url: str) -> PostgresOptions:
    """``postgresql://user:pass@host:port/db?index=hnsw&ef_search=100``: checked at start-up."""
    parsed = urlparse(url)
    if parsed.scheme not in ("postgresql", "postgres"):
        raise ValueError(f"not a postgresql:// URL: scheme {parsed.scheme!r}")
    query = parse_qsl(parsed.query, keep_blank_values=True)
    ours = {k: v for k, v in query if k in _OPTIONS}
    # quote, not urlencode's default quote_plus: libpq reads no '+' as a space (``options=-c%20x%3Dy``).
    libpq = urlencode([(k, v) for k, v in query if k not in _OPTIONS], quote_via=quote)
    rest = urlunparse(parsed._replace(query=libpq))
    try:
        psycopg.conninfo.conninfo_to_dict(rest)
    except psycopg.ProgrammingError as e:
        raise ValueError(f"collections.url is no valid PostgreSQL connection URL: {e}") from None
    index = ours.get("index", "exact")
    if index not in ("exact", "hnsw"):
        raise ValueError(f"collections.url: index is 'exact' or 'hnsw', not {index!r}")
    try:
        options = PostgresOptions(
            rest,
            index,  # type: ignore[arg-type]
            hnsw_m=int(ours.get("hnsw_m", 16)),
            hnsw_ef_construction=int(ours.get("hnsw_ef_construction", 64)),
            ef_search=int(ours.get("ef_search", 100)),
            pool_wait_s=float(ours.get("pool_wait_s", 5.0)),
        )
    except ValueError:
        raise ValueError("collections.url: hnsw_m, hnsw_ef_construction and ef_search are integers") from None
    # pgvector's own bounds (ef_search above 1000 is refused by the server).
    if not (2 <= options.hnsw_m <= 100 and 4 <= options.hnsw_ef_construction <= 1000):
        raise ValueError("collections.url: hnsw_m is 2-100 and hnsw_ef_construction 4-1000")
    if not (1 <= options.ef_search <= 1000) or options.pool_wait_s <= 0:
        raise ValueError("collections.url: ef_search is 1-1000 and pool_wait_s above 0")
    return options


def _configure(conn: psycopg.Connection[Any]) -> None:
    """A new connection: the extension and the catalogue exist, ``vector`` reads as numpy."""
    for attempt in range(3):
        try:
            with conn.transaction():
                # Created only where missing: a role without the right to create them can use
                # a database where an administrator did.
                if conn.execute("SELECT 1 FROM pg_extension WHERE extname = 'vector'").fetchone() is None:
                    conn.execute("CREATE EXTENSION IF NOT EXISTS vector")
                if conn.execute("SELECT to_regclass('clip_collections')").fetchone() == (None,):
                    conn.execute(_CATALOGUE)
                if conn.execute("SELECT to_regclass('clip_staged')").fetchone() == (None,):
                    conn.execute(_STAGED)
                if conn.execute("SELECT to_regclass('clip_jobs')").fetchone() == (None,):
                    conn.execute(_JOBS)
            break
        except psycopg.errors.UniqueViolation:
            # IF NOT EXISTS is no lock: two connections creating them at once, one loses; the
            # other's now exist.
            if attempt == 2:
                raise
    register_vector(conn)


@dataclass(frozen=True)
class _Row:
    key: int
    info: CollectionInfo

    @property
    def items(self) -> sql.Identifier:
        return _items(self.key)

    @property
    def dense(self) -> sql.Identifier:
        return _dense(self.key)


def _items(key: int, staged: bool = False) -> sql.Identifier:
    return sql.Identifier(f"clip_items_{key}{'_staged' if staged else ''}")


def _dense(key: int, staged: bool = False) -> sql.Identifier:
    return sql.Identifier(f"clip_dense_{key}{'_staged' if staged else ''}")


def _hnsw(key: int, staged: bool = False) -> sql.Identifier:
    return sql.Identifier(f"clip_items_{key}{'_staged' if staged else ''}_hnsw")


class PostgresCollections:
    def __init__(self, options: PostgresOptions) -> None:
        self.options = options
        self._where = _where_of(options.conninfo)
        # min_size 1: one connection kept; more (up to the collections' 2 threads and a spare)
        # opened on demand. Opened without waiting: the server starts while the database is down.
        self._pool: ConnectionPool[psycopg.Connection[Any]] = ConnectionPool(
            options.conninfo,
            min_size=1,
            max_size=3,
            open=False,
            kwargs={"autocommit": True},  # a transaction only where a call opens one
            configure=_configure,
            check=ConnectionPool.check_connection,
            timeout=options.pool_wait_s,
            reconnect_timeout=60,
            name="collections",
        )
        self._pool.open(wait=False)

    # ------------------------------------------------------------------ catalogue
    @property
    def index(self) -> IndexSpec:
        """Every collection's index, as ``collections.url`` chose it (one choice for the database)."""
        o = self.options
        return IndexSpec(o.index, o.hnsw_m, o.hnsw_ef_construction, o.ef_search)

    def create(
        self, name: str, model: str, version: str, dim: int, dense: bool, index: IndexSpec | None = None
    ) -> CollectionInfo:
        check_name(name)
        if index is not None and index != self.index:
            raise bad_input(
                "on PostgreSQL the index of every collection is the one collections.url chooses "
                f"({self.index.kind}; ?index=hnsw&hnsw_m=16&hnsw_ef_construction=64&ef_search=100): "
                "leave 'index' out or ask for that one",
                "index",
            )
        created = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        with self._connection() as conn, conn.transaction():
            found = conn.execute(
                "INSERT INTO clip_collections (name, model, version, dim, dense, created_at) "
                "VALUES (%s, %s, %s, %s, %s, %s) ON CONFLICT (name) DO NOTHING RETURNING key",
                (name, model, version, dim, dense, created),
            ).fetchone()
            if found is None:
                raise ClipError(ErrorCode.collection_exists, f"collection {name!r} exists already", "name")
            row = _Row(found[0], CollectionInfo(name, model, version, dim, dense, 0, created))
            self._create_tables(conn, row.key, dim, staged=False)
        return replace(row.info, index=self.index)

    def _create_tables(self, conn: psycopg.Connection[Any], key: int, dim: int, staged: bool) -> None:
        """A collection's tables; the live ones with the HNSW index of ``index=hnsw``, a staged copy
        without: it is filled whole before anything searches it, so ``commit_staged`` builds its
        index once over all its rows, many times cheaper than keeping it up row by row."""
        items, dense = _items(key, staged), _dense(key, staged)
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (key bigserial PRIMARY KEY, id text UNIQUE NOT NULL, "
                "metadata jsonb NOT NULL, vector vector({}) NOT NULL, image text)"
            ).format(items, sql.Literal(dim))
        )
        conn.execute(sql.SQL("CREATE INDEX ON {} USING gin (metadata jsonb_path_ops)").format(items))
        conn.execute(
            sql.SQL(
                "CREATE TABLE {} (key bigint PRIMARY KEY REFERENCES {} ON DELETE CASCADE, tokens bytea NOT NULL)"
            ).format(dense, items)
        )
        if self.options.index == "hnsw" and not staged:
            self._create_hnsw(conn, key, staged)

    def build_hnsw(self, name: str) -> None:
        """Add the HNSW index to a filled collection (a bulk load indexes faster after the rows)."""
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name)
            # The graph is built in memory when it fits; past maintenance_work_mem it is built on
            # disk, many times slower.
            conn.execute("SET LOCAL maintenance_work_mem = '2GB'")
            self._create_hnsw(conn, row.key, staged=False)

    def _create_hnsw(self, conn: psycopg.Connection[Any], key: int, staged: bool) -> None:
        conn.execute(
            sql.SQL(
                "CREATE INDEX IF NOT EXISTS {} ON {} USING hnsw (vector vector_ip_ops) "
                "WITH (m = {}, ef_construction = {})"
            ).format(
                _hnsw(key, staged),
                _items(key, staged),
                sql.Literal(self.options.hnsw_m),
                sql.Literal(self.options.hnsw_ef_construction),
            )
        )

    def list_all(self) -> list[CollectionInfo]:
        with self._connection() as conn:
            rows = conn.execute(f"{_SELECT_ROW} ORDER BY name").fetchall()  # noqa: S608
            return [replace(_row_of(r).info, index=self.index) for r in rows]

    def info(self, name: str) -> CollectionInfo:
        with self._connection() as conn:
            return replace(self._row(conn, name).info, index=self.index)

    def drop(self, name: str) -> None:
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name, lock=True)
            conn.execute(sql.SQL("DROP TABLE {}, {}").format(row.dense, row.items))
            self._drop_staged(conn, row.key)
            conn.execute("DELETE FROM clip_collections WHERE key = %s", (row.key,))

    def close(self) -> None:
        self._pool.close()

    # ------------------------------------------------------------------ items
    def upsert(self, name: str, items: Sequence[NewItem]) -> int:
        items = list({item.id: item for item in items}.values())  # an id given twice: the last one
        with self._connection() as conn, conn.transaction():
            # The catalogue row locked first: concurrent adds to one collection keep its count right.
            row = self._row(conn, name, lock=True)
            if not items:
                return row.info.count
            added = _write_items(conn, row.key, row.info.dim, items, staged=False)
            (count,) = conn.execute(  # type: ignore[misc]
                "UPDATE clip_collections SET count = count + %s WHERE key = %s RETURNING count", (added, row.key)
            ).fetchone()
            return int(count)

    def remove(self, name: str, item_id: str) -> bool:
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name, lock=True)
            gone = conn.execute(sql.SQL("DELETE FROM {} WHERE id = %s").format(row.items), (item_id,)).rowcount
            if gone:
                conn.execute("UPDATE clip_collections SET count = count - 1 WHERE key = %s", (row.key,))
            return bool(gone)

    def search(
        self,
        name: str,
        query: np.ndarray,
        k: int,
        where: Mapping[str, Scalar],
        ef_search: int | None = None,
        *,
        exact: bool | None = None,
    ) -> list[StoredHit]:
        """``exact`` overrides the URL's index choice (the benchmark's recall reference);
        ``ef_search`` the URL's ``ef_search`` for this search."""
        exact = self.options.index == "exact" if exact is None else exact
        q = _vector(query, None)
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name)
            if k <= 0 or row.info.count == 0:
                return []
            if exact:
                # A sequential scan even where an HNSW index exists: every row compared.
                conn.execute("SET LOCAL enable_indexscan = off")
            else:
                conn.execute(
                    "SELECT set_config('hnsw.ef_search', %s, true)",
                    (str(max(ef_search or self.options.ef_search, min(k, 1000))),),
                )
                if where:
                    # Without it the filter applies after the graph's ef_search candidates: a
                    # selective filter would leave fewer than k.
                    conn.execute("SET LOCAL hnsw.iterative_scan = strict_order")
            condition = sql.SQL("WHERE metadata @> %(where)s") if where else sql.SQL("")
            rows = conn.execute(
                sql.SQL(
                    "SELECT id, metadata, vector, -(vector <#> %(q)s) FROM {} {} ORDER BY vector <#> %(q)s LIMIT %(k)s"
                ).format(row.items, condition),
                {"q": q, "where": Jsonb(dict(where)), "k": k},
            ).fetchall()
            return [StoredHit(i, m, float(s), v.to_numpy().astype(np.float32)) for i, m, v, s in rows]

    def dense_tokens(self, name: str, ids: Sequence[str]) -> list[np.ndarray]:
        with self._connection() as conn:
            row = self._row(conn, name)
            dim = row.info.dim
            found = {
                item_id: np.frombuffer(blob, dtype=np.float16).reshape(-1, dim).astype(np.float32)
                for item_id, blob in conn.execute(
                    sql.SQL("SELECT i.id, d.tokens FROM {} i JOIN {} d USING (key) WHERE i.id = ANY(%s)").format(
                        row.items, row.dense
                    ),
                    (list(ids),),
                )
            }
            return [found[i] for i in ids]

    # ------------------------------------------------------------------ re-embedding
    def stored_images(self, name: str) -> list[StoredImage]:
        with self._connection() as conn:
            row = self._row(conn, name)
            rows = conn.execute(sql.SQL("SELECT id, metadata, image FROM {} ORDER BY key").format(row.items))
            return [StoredImage(item_id, metadata, image) for item_id, metadata, image in rows]

    def stage(self, name: str, version: str, dim: int, dense: bool) -> None:
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name, lock=True)
            self._drop_staged(conn, row.key)
            self._create_tables(conn, row.key, dim, staged=True)
            conn.execute("INSERT INTO clip_staged VALUES (%s, %s, %s, %s)", (row.key, version, dim, dense))

    def upsert_staged(self, name: str, items: Sequence[NewItem]) -> int:
        items = list({item.id: item for item in items}.values())
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name, lock=True)
            dim = self._staged_dim(conn, name, row.key)
            if items:
                _write_items(conn, row.key, dim, items, staged=True)
            (count,) = conn.execute(  # type: ignore[misc]
                sql.SQL("SELECT count(*) FROM {}").format(_items(row.key, staged=True))
            ).fetchone()
            return int(count)

    def commit_staged(self, name: str) -> CollectionInfo:
        # One transaction: PostgreSQL's DDL is transactional, and the DROP waits for the searches
        # that read the old tables, so a search sees the old version's items or the new one's.
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name, lock=True)
            staged = conn.execute("SELECT version, dim, dense FROM clip_staged WHERE key = %s", (row.key,)).fetchone()
            if staged is None:
                raise ClipError(ErrorCode.not_found, f"collection {name!r} has no re-embedded version staged", "name")
            version, dim, dense = staged
            indexed = conn.execute("SELECT to_regclass(%s)", (f"clip_items_{row.key}_hnsw",)).fetchone() != (None,)
            if self.options.index == "hnsw" or indexed:
                # The staged copy's index, built before the old tables go: the collection is never
                # searched without the index it had.
                conn.execute("SET LOCAL maintenance_work_mem = '2GB'")
                self._create_hnsw(conn, row.key, staged=True)
            conn.execute(sql.SQL("DROP TABLE {}, {}").format(row.dense, row.items))
            for old, new in ((_items(row.key, True), row.items), (_dense(row.key, True), row.dense)):
                conn.execute(sql.SQL("ALTER TABLE {} RENAME TO {}").format(old, new))
            conn.execute(sql.SQL("ALTER INDEX IF EXISTS {} RENAME TO {}").format(_hnsw(row.key, True), _hnsw(row.key)))
            (count,) = conn.execute(  # type: ignore[misc]
                sql.SQL("SELECT count(*) FROM {}").format(row.items)
            ).fetchone()
            conn.execute(
                "UPDATE clip_collections SET version = %s, dim = %s, dense = %s, count = %s WHERE key = %s",
                (version, dim, dense, count, row.key),
            )
            conn.execute("DELETE FROM clip_staged WHERE key = %s", (row.key,))
            conn.execute("DELETE FROM clip_jobs WHERE key = %s", (row.key,))
        return self.info(name)

    def discard_staged(self, name: str) -> None:
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name, lock=True)
            self._drop_staged(conn, row.key)

    def staged_images(self, name: str) -> tuple[str, list[StoredImage]] | None:
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name)
            found = conn.execute("SELECT version FROM clip_staged WHERE key = %s", (row.key,)).fetchone()
            if found is None:
                return None
            rows = conn.execute(
                sql.SQL("SELECT id, metadata, image FROM {} ORDER BY key").format(_items(row.key, True))
            )
            return str(found[0]), [StoredImage(item_id, metadata, image) for item_id, metadata, image in rows]

    # ------------------------------------------------------------------ jobs
    def save_job(self, name: str, job: Mapping[str, object] | None) -> None:
        with self._connection() as conn, conn.transaction():
            row = self._row(conn, name)
            if job is None:
                conn.execute("DELETE FROM clip_jobs WHERE key = %s", (row.key,))
            else:
                conn.execute(
                    "INSERT INTO clip_jobs VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET job = EXCLUDED.job",
                    (row.key, Jsonb(dict(job))),
                )

    def saved_jobs(self) -> dict[str, dict[str, object]]:
        with self._connection() as conn:
            rows = conn.execute("SELECT c.name, j.job FROM clip_jobs j JOIN clip_collections c USING (key)")
            return {name: dict(job) for name, job in rows}

    def saved_job(self, name: str) -> dict[str, object] | None:
        with self._connection() as conn:
            found = conn.execute(
                "SELECT j.job FROM clip_jobs j JOIN clip_collections c USING (key) WHERE c.name = %s", (name,)
            ).fetchone()
            return None if found is None else dict(found[0])

    def claim_job(self, name: str) -> JobLease | None:
        with self._connection() as conn:
            key = self._row(conn, name).key
        # A connection of its own, outside the pool, for as long as the job runs: the advisory lock
        # is the session's, so PostgreSQL itself releases it when the server holding it dies
        # (its connection closes) or is cut off; a pooled connection would be handed on.
        try:
            session = psycopg.connect(
                self.options.conninfo, autocommit=True, connect_timeout=max(1, round(self.options.pool_wait_s))
            )
        except psycopg.OperationalError as e:
            raise self._unreachable(_first_line(e)) from None
        try:
            (held,) = session.execute("SELECT pg_try_advisory_lock(%s, %s)", (LEASE_SPACE, key)).fetchone()  # type: ignore[misc]
        except psycopg.Error as e:
            session.close()
            raise self._unreachable(_first_line(e)) from None
        if not held:
            session.close()
            return None
        return _AdvisoryLease(session)

    @staticmethod
    def _drop_staged(conn: psycopg.Connection[Any], key: int) -> None:
        conn.execute(sql.SQL("DROP TABLE IF EXISTS {}, {}").format(_dense(key, True), _items(key, True)))
        conn.execute("DELETE FROM clip_staged WHERE key = %s", (key,))

    @staticmethod
    def _staged_dim(conn: psycopg.Connection[Any], name: str, key: int) -> int:
        found = conn.execute("SELECT dim FROM clip_staged WHERE key = %s", (key,)).fetchone()
        if found is None:  # discarded or dropped meanwhile
            raise unknown(name)
        return int(found[0])

    # ------------------------------------------------------------------ internals
    @contextmanager
    def _connection(self) -> Iterator[psycopg.Connection[Any]]:
        """A pooled connection; the database unreachable is 503 ``not_ready``, never a 500."""
        try:
            with self._pool.connection() as conn:
                yield conn
        except PoolTimeout:
            raise self._unreachable("no connection within the pool's wait") from None
        except psycopg.OperationalError as e:
            raise self._unreachable(_first_line(e)) from None
        except psycopg.errors.UndefinedTable:
            # Its tables dropped by another call (or server) between reading the catalogue and using them.
            raise ClipError(
                ErrorCode.unknown_collection, "the collection was dropped while this call ran", "name"
            ) from None
        except psycopg.DataError as e:
            # A value PostgreSQL cannot hold that SQLite can (a NUL character in text or JSONB).
            raise ClipError(
                ErrorCode.bad_input, f"the collections database refused a value: {_first_line(e)}"
            ) from None

    def _unreachable(self, why: str) -> ClipError:
        return ClipError(
            ErrorCode.not_ready,
            f"the collections database ({self._where}) cannot be reached: {why}; collections answer again once it is "
            "back (the server reconnects by itself)",
            retry_after=5,
        )

    @staticmethod
    def _row(conn: psycopg.Connection[Any], name: str, lock: bool = False) -> _Row:
        check_name(name)
        found = conn.execute(
            f"{_SELECT_ROW} WHERE name = %s{' FOR UPDATE' if lock else ''}",  # noqa: S608
            (name,),
        ).fetchone()
        if found is None:
            raise unknown(name)
        return _row_of(found)


class _AdvisoryLease:
    """A collection's job lease: a session-level advisory lock, held by its own connection."""

    def __init__(self, session: psycopg.Connection[Any]) -> None:
        self._session = session

    def holds(self) -> bool:
        # A session that still answers still holds its lock (only an unlock or its end frees it).
        try:
            self._session.execute("SELECT 1")
        except psycopg.Error:
            return False
        return True

    def release(self) -> None:
        self._session.close()  # the session's end releases its advisory locks


def _write_items(conn: psycopg.Connection[Any], key: int, dim: int, items: Sequence[NewItem], staged: bool) -> int:
    """Inserts or replaces ``items`` (ids distinct) with their DCSM tokens; returns how many were new."""
    added = 0
    with conn.cursor() as cur:
        # xmax = 0 only on a row this statement inserted (not one it updated).
        cur.executemany(
            sql.SQL(
                "INSERT INTO {} (id, metadata, vector, image) VALUES (%s, %s, %s, %s) ON CONFLICT (id) DO UPDATE "
                "SET metadata = EXCLUDED.metadata, vector = EXCLUDED.vector, image = EXCLUDED.image "
                "RETURNING key, xmax = 0"
            ).format(_items(key, staged)),
            [(item.id, Jsonb(dict(item.metadata)), _vector(item.vector, dim), item.image) for item in items],
            returning=True,
        )
        keys = []
        while True:
            row_key, inserted = cur.fetchone()  # type: ignore[misc]
            keys.append(row_key)
            added += bool(inserted)
            if not cur.nextset():
                break
        tokens = [
            (row_key, np.ascontiguousarray(item.dense, dtype=np.float16).tobytes())
            for row_key, item in zip(keys, items, strict=True)
            if item.dense is not None
        ]
        if tokens:
            cur.executemany(
                sql.SQL(
                    "INSERT INTO {} VALUES (%s, %s) ON CONFLICT (key) DO UPDATE SET tokens = EXCLUDED.tokens"
                ).format(_dense(key, staged)),
                tokens,
            )
    return added


_SELECT_ROW = "SELECT key, name, model, version, dim, dense, count, created_at FROM clip_collections"


def _row_of(r: Sequence[Any]) -> _Row:
    key, name, model, version, dim, dense, count, created = r
    return _Row(int(key), CollectionInfo(name, model, version, int(dim), bool(dense), int(count), created))


def _first_line(e: Exception) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _vector(v: np.ndarray, dim: int | None) -> np.ndarray:
    vector = np.ascontiguousarray(v, dtype=np.float32).reshape(-1)
    assert dim is None or vector.shape == (dim,), (vector.shape, dim)
    return vector


def _where_of(conninfo: str) -> str:
    """host:port/db of a connection URL for messages, never its password."""
    params = psycopg.conninfo.conninfo_to_dict(conninfo)
    host = params.get("host") or "localhost"
    port = f":{params['port']}" if params.get("port") else ""
    return f"{host}{port}/{params.get('dbname') or params.get('user') or ''}"
