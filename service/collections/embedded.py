"""The embedded collection backend: one SQLite file per collection, searched with FAISS.

SQLite holds everything durable (ids, metadata as JSON, the float32 vectors, the float16 DCSM
tokens in a table of their own so a search never reads them, and the collection's info: its
model version and index choice). The vector index (``vector_index.py``) is keyed by the SQLite
row key. An exact one (``IndexFlatIP``, the default) is rebuilt from SQLite when a collection is
first used; an HNSW graph costs minutes of CPU to build at a million items, so it is also kept in
a file beside the database (``{name}.{uid}.hnsw``, written at shutdown and after a build) and
brought up to date from SQLite when loaded, so a crash never leaves the two apart. ``uid`` is
drawn anew for every database file, so a re-embedded collection's new file never meets the old
version's graph. Measured against LanceDB in docs/benchmarks.md ("Collections"). The index lives
in this process: one server process owns a folder (several replicas on one shared volume would
each see only their own adds).
"""

from __future__ import annotations

import json
import os
import sqlite3
import threading
import uuid
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

import faiss
import numpy as np

from clipcore.errors import ClipError, ErrorCode
from service.collections.store import (
    CollectionInfo,
    IndexSpec,
    JobLease,
    NewItem,
    Scalar,
    StoredHit,
    StoredImage,
    check_name,
    unknown,
)
from service.collections.vector_index import ExactIndex, HnswIndex, VectorIndex

_SCHEMA = """
CREATE TABLE info (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE items (key INTEGER PRIMARY KEY AUTOINCREMENT, id TEXT UNIQUE NOT NULL,
                    metadata TEXT NOT NULL, vector BLOB NOT NULL, image TEXT);
CREATE TABLE dense (key INTEGER PRIMARY KEY, tokens BLOB NOT NULL);
"""
_JOB = "job"  # the ``info`` key of a running job's record (a re-embedding, an import)
# A metadata (key, value) as the filters match it: equal only within one JSON type (1 == 1.0,
# 1 != true != "1").
_Term = tuple[str, str, Scalar]


def _terms(metadata: Mapping[str, Scalar]) -> list[_Term]:
    out: list[_Term] = []
    for key, value in metadata.items():
        kind = "bool" if isinstance(value, bool) else "text" if isinstance(value, str) else "number"
        out.append((key, kind, value))
    return out


@dataclass
class _Open:
    db: sqlite3.Connection
    info: dict[str, object]
    index: VectorIndex
    lock: threading.Lock
    hnsw_file: Path | None  # where an HNSW graph is kept (None: exact)
    # (key, type, value) -> row keys: the filters' inverted index, kept in memory like the vectors
    # (a json_extract scan of 100,000 rows in SQLite took 250 ms a search).
    postings: dict[_Term, set[int]] = field(default_factory=dict)
    # Set (under ``lock``) once the collection was dropped or replaced by a re-embedded version:
    # a caller that waited for the lock then finds the collection anew (gone: 404, not a closed
    # database's 500).
    closed: bool = False

    def post(self, key: int, metadata: Mapping[str, Scalar]) -> None:
        for term in _terms(metadata):
            self.postings.setdefault(term, set()).add(key)

    def unpost(self, key: int, metadata: Mapping[str, Scalar]) -> None:
        for term in _terms(metadata):
            keys = self.postings.get(term)
            if keys is not None:
                keys.discard(key)
                if not keys:
                    del self.postings[term]


class EmbeddedCollections:
    def __init__(self, root: Path) -> None:
        self.root = root
        self._open: dict[str, _Open] = {}
        self._lock = threading.Lock()  # guards _open and creation/removal of files

    # ------------------------------------------------------------------ catalogue
    def _path(self, name: str) -> Path:
        return self.root / f"{check_name(name)}.sqlite"

    def create(
        self, name: str, model: str, version: str, dim: int, dense: bool, index: IndexSpec | None = None
    ) -> CollectionInfo:
        path = self._path(name)
        info = {
            "model": model,
            "version": version,
            "dim": dim,
            "dense": dense,
            "created_at": datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            "index": (index or IndexSpec()).as_json(),
        }
        with self._lock:
            if path.exists():
                raise ClipError(ErrorCode.collection_exists, f"collection {name!r} exists already", "name")
            with self._writing():
                self.root.mkdir(parents=True, exist_ok=True)
                partial = path.with_suffix(".partial")
                self._new_file(partial, info)
                partial.rename(path)  # the collection exists once it is complete
        return self.info(name)

    @staticmethod
    def _new_file(path: Path, info: Mapping[str, object]) -> None:
        path.unlink(missing_ok=True)
        info = {**info, "uid": uuid.uuid4().hex}  # names this file's HNSW graph
        db = sqlite3.connect(path)
        try:
            db.executescript(_SCHEMA)
            db.executemany("INSERT INTO info VALUES (?, ?)", [(k, json.dumps(v)) for k, v in info.items()])
            db.commit()
        finally:
            db.close()

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """A write the folder refuses (not writable, full, not a folder) is the server's storage
        failing, not the request: 503 with the reason, never a 500."""
        try:
            yield
        except (OSError, sqlite3.OperationalError) as exc:
            raise ClipError(
                ErrorCode.not_ready, f"the collections folder {str(self.root)!r} cannot be written: {exc}"
            ) from exc

    def list_all(self) -> list[CollectionInfo]:
        if not self.root.is_dir():
            return []
        out = []
        for path in sorted(self.root.glob("*.sqlite")):
            try:
                out.append(self.info(path.stem))
            except ClipError as exc:  # dropped since the folder was listed
                if exc.code is not ErrorCode.unknown_collection:
                    raise
        return out

    def info(self, name: str) -> CollectionInfo:
        with self._use(name) as coll:
            (count,) = coll.db.execute("SELECT count(*) FROM items").fetchone()
            i = coll.info
            return CollectionInfo(
                name, str(i["model"]), str(i["version"]), int(i["dim"]), bool(i["dense"]), int(count),  # type: ignore[call-overload]
                str(i["created_at"]), IndexSpec.from_json(i.get("index")),
            )  # fmt: skip

    def drop(self, name: str) -> None:
        path = self._path(name)
        with self._lock:
            self._close(name, keep=False)
            if not path.exists():
                raise unknown(name)
            with self._writing():
                path.unlink()
                for extra in ("-wal", "-shm", "-journal", ".staged"):
                    Path(f"{path}{extra}").unlink(missing_ok=True)
                self._remove_graphs(name)

    def _remove_graphs(self, name: str) -> None:
        """Every HNSW graph file of ``name`` (names hold no dots, so the pattern is its own)."""
        for graph in [*self.root.glob(f"{name}.*.hnsw"), *self.root.glob(f"{name}.*.partial")]:
            graph.unlink(missing_ok=True)

    def _close(self, name: str, keep: bool) -> None:
        """Closes the open collection ``name`` (under ``self._lock``); its waiting callers find it
        anew. ``keep``: an HNSW graph changed since it was saved is saved (a shutdown), so the next
        start loads it rather than building it again."""
        coll = self._open.pop(name, None)
        if coll is not None:
            with coll.lock:
                coll.closed = True
                coll.db.close()
                if keep:
                    self._save_graph(coll)

    def _save_graph(self, coll: _Open) -> None:
        if coll.hnsw_file is not None and isinstance(coll.index, HnswIndex) and coll.index.changed:
            with self._writing():
                coll.index.save(coll.hnsw_file)

    def close(self) -> None:
        with self._lock:
            for name in list(self._open):
                self._close(name, keep=True)

    # ------------------------------------------------------------------ items
    def upsert(self, name: str, items: Sequence[NewItem]) -> int:
        items = list({item.id: item for item in items}.values())  # an id given twice: the last one
        with self._use(name) as coll:
            db, dim = coll.db, int(coll.info["dim"])  # type: ignore[call-overload]
            replaced: list[tuple[int, dict[str, Scalar]]] = []
            added: list[tuple[int, np.ndarray, Mapping[str, Scalar]]] = []
            with self._writing(), db:  # one transaction: all items or none
                for item in items:
                    vector = np.ascontiguousarray(item.vector, dtype=np.float32)
                    assert vector.shape == (dim,), (vector.shape, dim)
                    row = db.execute("SELECT key, metadata FROM items WHERE id = ?", (item.id,)).fetchone()
                    if row is not None:
                        replaced.append((row[0], json.loads(row[1])))
                        db.execute("DELETE FROM items WHERE key = ?", row[:1])
                        db.execute("DELETE FROM dense WHERE key = ?", row[:1])
                    key = _insert(db, coll.info, item, vector)
                    added.append((key, vector, item.metadata))
            if replaced:
                coll.index.remove(k for k, _ in replaced)
                for key, metadata in replaced:
                    coll.unpost(key, metadata)
            if added:
                keys = np.asarray([k for k, _, _ in added], dtype=np.int64)
                coll.index.add(keys, np.stack([v for _, v, _ in added]))
                for key, _, new in added:
                    coll.post(key, new)
            self._compact(coll)
            return coll.index.count

    def remove(self, name: str, item_id: str) -> bool:
        with self._use(name) as coll:
            with self._writing(), coll.db:
                row = coll.db.execute("SELECT key, metadata FROM items WHERE id = ?", (item_id,)).fetchone()
                if row is None:
                    return False
                coll.db.execute("DELETE FROM items WHERE key = ?", row[:1])
                coll.db.execute("DELETE FROM dense WHERE key = ?", row[:1])
            coll.index.remove([row[0]])
            coll.unpost(row[0], json.loads(row[1]))
            self._compact(coll)
            return True

    def _compact(self, coll: _Open) -> None:
        """An HNSW graph whose tombstones passed their share is built anew from its live entries
        (in the write that passed it: minutes of CPU at a million items) and saved."""
        if isinstance(coll.index, HnswIndex) and coll.index.needs_rebuild():
            coll.index = coll.index.rebuilt()
            self._save_graph(coll)

    def search(
        self, name: str, query: np.ndarray, k: int, where: Mapping[str, Scalar], ef_search: int | None = None
    ) -> list[StoredHit]:
        with self._use(name) as coll:
            among = None
            if where:
                among = self._matching(coll, where)
                if not among:
                    return []
            hits = coll.index.search(query, k, among, ef_search)
            if not hits:
                return []
            rows = self._rows(coll.db, [key for key, _ in hits])
            out = []
            for key, score in hits:
                item_id, metadata, vector = rows[key]
                out.append(StoredHit(item_id, json.loads(metadata), score, np.frombuffer(vector, dtype=np.float32)))
            return out

    def dense_tokens(self, name: str, ids: Sequence[str]) -> list[np.ndarray]:
        with self._use(name) as coll:
            dim = int(coll.info["dim"])  # type: ignore[call-overload]
            marks = ",".join("?" * len(ids))
            found = {
                item_id: np.frombuffer(blob, dtype=np.float16).reshape(-1, dim).astype(np.float32)
                for item_id, blob in coll.db.execute(
                    f"SELECT items.id, dense.tokens FROM items JOIN dense ON dense.key = items.key "  # noqa: S608
                    f"WHERE items.id IN ({marks})",
                    list(ids),
                )
            }
            return [found[i] for i in ids]

    # ------------------------------------------------------------------ re-embedding
    def stored_images(self, name: str) -> list[StoredImage]:
        with self._use(name) as coll:
            rows = coll.db.execute("SELECT id, metadata, image FROM items ORDER BY key").fetchall()
        return [StoredImage(item_id, json.loads(metadata), image) for item_id, metadata, image in rows]

    def stage(self, name: str, version: str, dim: int, dense: bool) -> None:
        with self._use(name) as coll:
            kept = {k: v for k, v in coll.info.items() if k not in ("dense_tokens", _JOB, "uid")}
        with self._lock, self._writing():
            self._new_file(self._staged(name), {**kept, "version": version, "dim": dim, "dense": dense})

    def upsert_staged(self, name: str, items: Sequence[NewItem]) -> int:
        staged = self._staged(name)
        with self._lock:  # a drop meanwhile removed the staged file: not created anew here
            if not staged.exists():
                raise unknown(name)
            db = sqlite3.connect(staged, check_same_thread=False)
        try:
            with self._writing(), db:
                info: dict[str, object] = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM info")}
                for item in {item.id: item for item in items}.values():
                    row = db.execute("SELECT key FROM items WHERE id = ?", (item.id,)).fetchone()
                    if row is not None:
                        db.execute("DELETE FROM items WHERE key = ?", row)
                        db.execute("DELETE FROM dense WHERE key = ?", row)
                    _insert(db, info, item, np.ascontiguousarray(item.vector, dtype=np.float32))
                (count,) = db.execute("SELECT count(*) FROM items").fetchone()
            return int(count)
        finally:
            db.close()

    def commit_staged(self, name: str) -> CollectionInfo:
        path, staged = self._path(name), self._staged(name)
        with self._lock:
            self._close(name, keep=False)  # its callers waiting for it load the new file
            if not path.exists():
                staged.unlink(missing_ok=True)
                raise unknown(name)
            if not staged.exists():
                raise ClipError(ErrorCode.not_found, f"collection {name!r} has no re-embedded version staged", "name")
            with self._writing():
                # The old file's connection closed cleanly (its WAL checkpointed into it): nothing
                # of it may be left to apply to the new file.
                for extra in ("-wal", "-shm"):
                    Path(f"{path}{extra}").unlink(missing_ok=True)
                os.replace(staged, path)  # atomic: a reader sees the old version or the new one
                # The old version's graph (the new file's uid names no file yet: built on load).
                self._remove_graphs(name)
        return self.info(name)

    def discard_staged(self, name: str) -> None:
        with self._lock, self._writing():
            self._staged(name).unlink(missing_ok=True)

    def _staged(self, name: str) -> Path:
        return Path(f"{self._path(name)}.staged")

    def staged_images(self, name: str) -> tuple[str, list[StoredImage]] | None:
        with self._lock:
            staged = self._staged(name)
            if not staged.exists():
                return None
            db = sqlite3.connect(staged, check_same_thread=False)
        try:
            (version,) = db.execute("SELECT value FROM info WHERE key = 'version'").fetchone()
            rows = db.execute("SELECT id, metadata, image FROM items ORDER BY key").fetchall()
        finally:
            db.close()
        return json.loads(version), [StoredImage(i, json.loads(metadata), image) for i, metadata, image in rows]

    # ------------------------------------------------------------------ jobs
    def save_job(self, name: str, job: Mapping[str, object] | None) -> None:
        # In the collection's own file: replacing it by the staged copy (which has none) ends the
        # job in the same atomic step, and dropping the collection removes it.
        with self._use(name) as coll, self._writing(), coll.db:
            if job is None:
                coll.db.execute("DELETE FROM info WHERE key = ?", (_JOB,))
            else:
                coll.db.execute("INSERT OR REPLACE INTO info VALUES (?, ?)", (_JOB, json.dumps(dict(job))))

    def saved_jobs(self) -> dict[str, dict[str, object]]:
        out: dict[str, dict[str, object]] = {}
        if not self.root.is_dir():
            return out
        for path in sorted(self.root.glob("*.sqlite")):
            # Read from the file, not through ``_use``: opening a collection loads its whole index.
            db = sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True)
            try:
                found = db.execute("SELECT value FROM info WHERE key = ?", (_JOB,)).fetchone()
            except sqlite3.Error:  # dropped or replaced while listed
                found = None
            finally:
                db.close()
            if found is not None:
                out[path.stem] = json.loads(found[0])
        return out

    def saved_job(self, name: str) -> dict[str, object] | None:
        with self._use(name) as coll:
            found = coll.db.execute("SELECT value FROM info WHERE key = ?", (_JOB,)).fetchone()
        return None if found is None else dict(json.loads(found[0]))

    def claim_job(self, name: str) -> JobLease | None:
        # One server process owns the folder, and runs one job a collection (``JobBoard``): the
        # lease is always its own.
        if not self._path(name).exists():
            raise unknown(name)
        return _OwnFolder()

    # ------------------------------------------------------------------ internals
    @staticmethod
    def _matching(coll: _Open, where: Mapping[str, Scalar]) -> set[int]:
        """Row keys whose metadata has every ``where`` key equal to its value."""
        found: set[int] | None = None
        for term in _terms(where):
            keys = coll.postings.get(term, set())
            found = set(keys) if found is None else found & keys
            if not found:
                return set()
        return found or set()

    @staticmethod
    def _rows(db: sqlite3.Connection, keys: Sequence[int]) -> dict[int, tuple[str, str, bytes]]:
        marks = ",".join("?" * len(keys))
        sql = f"SELECT key, id, metadata, vector FROM items WHERE key IN ({marks})"  # noqa: S608
        return {int(k): (i, m, v) for k, i, m, v in db.execute(sql, list(keys))}

    @contextmanager
    def _use(self, name: str) -> Iterator[_Open]:
        # One OpenMP thread for FAISS in the calling thread (a per-thread setting: the model
        # threads keep theirs): a single query gains nothing from more, and on a busy 2-core
        # machine a second spinning thread made a top-10 search at 100,000 vectors 14x slower.
        faiss.omp_set_num_threads(1)
        while True:
            with self._lock:
                coll = self._open.get(name)
                if coll is None:
                    coll = self._load(name)
                    self._open[name] = coll
            with coll.lock:
                if not coll.closed:
                    yield coll
                    return

    def _load(self, name: str) -> _Open:
        path = self._path(name)
        if not path.exists():
            raise unknown(name)
        db = sqlite3.connect(path, check_same_thread=False)  # used under its lock from worker threads
        db.execute("PRAGMA journal_mode=WAL")
        if "image" not in {row[1] for row in db.execute("PRAGMA table_info(items)")}:
            with self._writing(), db:  # a file from before images were kept
                db.execute("ALTER TABLE items ADD COLUMN image TEXT")
        info: dict[str, object] = {k: json.loads(v) for k, v in db.execute("SELECT key, value FROM info")}
        if "uid" not in info:  # a file from before graphs were kept
            info["uid"] = uuid.uuid4().hex
            with self._writing(), db:
                db.execute("INSERT INTO info VALUES ('uid', ?)", (json.dumps(info["uid"]),))
        dim = int(info["dim"])  # type: ignore[call-overload]
        spec = IndexSpec.from_json(info.get("index"))
        if spec.kind == "exact":
            exact = ExactIndex(dim)
            coll = _Open(db, info, exact, threading.Lock(), None)
            keys, vectors = [], []
            for key, metadata, blob in db.execute("SELECT key, metadata, vector FROM items ORDER BY key"):
                keys.append(key)
                vectors.append(np.frombuffer(blob, dtype=np.float32))
                coll.post(key, json.loads(metadata))
            if keys:
                exact.add(np.asarray(keys, dtype=np.int64), np.stack(vectors))
            return coll
        # HNSW: the saved graph, brought up to date (the vectors read only for items it lacks).
        graph_file = self.root / f"{name}.{info['uid']}.hnsw"
        coll = _Open(db, info, ExactIndex(dim), threading.Lock(), graph_file)
        stored = []
        for key, metadata in db.execute("SELECT key, metadata FROM items ORDER BY key"):
            stored.append(key)
            coll.post(key, json.loads(metadata))
        coll.index = HnswIndex.load(
            graph_file, dim, spec, np.asarray(stored, dtype=np.int64), lambda keys: _vectors(db, keys)
        )
        self._compact(coll)
        self._save_graph(coll)
        return coll


class _OwnFolder:
    """The lease of a job on the embedded store: held as long as the process lives."""

    def holds(self) -> bool:
        return True

    def release(self) -> None:
        pass


def _vectors(db: sqlite3.Connection, keys: np.ndarray) -> np.ndarray:
    """The stored vectors of these row keys, in their order."""
    marks = ",".join("?" * len(keys))
    sql = f"SELECT key, vector FROM items WHERE key IN ({marks})"  # noqa: S608
    found = {int(k): np.frombuffer(v, dtype=np.float32) for k, v in db.execute(sql, keys.tolist())}
    return np.stack([found[int(k)] for k in keys])


def _insert(db: sqlite3.Connection, info: dict[str, object], item: NewItem, vector: np.ndarray) -> int:
    """Writes one item's row (and its DCSM tokens); returns its row key."""
    cur = db.execute(
        "INSERT INTO items (id, metadata, vector, image) VALUES (?, ?, ?, ?)",
        (item.id, json.dumps(dict(item.metadata)), vector.tobytes(), item.image),
    )
    key = int(cur.lastrowid or 0)
    if item.dense is not None:
        tokens = np.ascontiguousarray(item.dense, dtype=np.float16)
        db.execute("INSERT INTO dense VALUES (?, ?)", (key, tokens.tobytes()))
        if "dense_tokens" not in info:
            info["dense_tokens"] = int(tokens.shape[0])
            db.execute("INSERT INTO info VALUES ('dense_tokens', ?)", (str(tokens.shape[0]),))
    return key
