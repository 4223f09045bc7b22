"""Collections' embedded backends on this machine: add and top-10 search at N vectors.

Compares the service's embedded backend (``service.collections.embedded``: SQLite + an exact
FAISS inner-product index) with LanceDB (a table in a local folder, brute-force search), both
fed the same random unit vectors of the default model's width in the batches one
``POST /collections/{name}/images`` adds (64 by default). Prints wall and process CPU time of
the adds (vectors per second), then per-query latency of top-10 searches (p50 / p95, ms),
plain and with a metadata equality filter that keeps about a tenth of the items.

    python -m loadtests.bench_collections --n 100000 --dim 128
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np


def unit_vectors(n: int, dim: int, seed: int) -> np.ndarray:
    x = np.random.default_rng(seed).standard_normal((n, dim)).astype(np.float32)
    return x / np.linalg.norm(x, axis=1, keepdims=True)


def timed(fn: Callable[[], Any]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    fn()
    return time.perf_counter() - wall, time.process_time() - cpu


Search = Callable[[np.ndarray], Any]


def one_query(search: Search, q: np.ndarray) -> tuple[float, float]:
    """Wall and process CPU time of one search, in ms (CPU counts every thread of the process)."""
    wall, cpu = time.perf_counter(), time.process_time()
    search(q)
    return (time.perf_counter() - wall) * 1000, (time.process_time() - cpu) * 1000


def summary(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls = sorted(w for w, _ in samples)
    return {
        "p50": statistics.median(walls),
        "p95": walls[int(0.95 * (len(walls) - 1))],
        "cpu": statistics.mean(c for _, c in samples),
    }


def embedded(folder: Path, vectors: np.ndarray, batch: int) -> tuple[dict[str, float], Search, Search]:
    from service.collections.embedded import EmbeddedCollections
    from service.collections.store import NewItem

    store = EmbeddedCollections(folder)
    store.create("bench", "bench@production", "v1", vectors.shape[1], dense=False)

    def add() -> None:
        for start in range(0, len(vectors), batch):
            items = [
                NewItem(f"img-{i}", {"shard": i % 10}, vectors[i], None)
                for i in range(start, min(start + batch, len(vectors)))
            ]
            store.upsert("bench", items)

    wall, cpu = timed(add)
    store.close()
    reopen, _ = timed(lambda: store.info("bench"))  # rebuilds the index from SQLite
    stats = {"add_wall": wall, "add_cpu": cpu, "open_s": reopen, "compact_s": 0.0}
    return (
        stats,
        lambda q: store.search("bench", q, 10, {}),
        lambda q: store.search("bench", q, 10, {"shard": 3}),
    )


def lance(folder: Path, vectors: np.ndarray, batch: int) -> tuple[dict[str, float], Search, Search]:
    import lancedb
    import pyarrow as pa

    db = lancedb.connect(str(folder))
    dim = vectors.shape[1]
    schema = pa.schema([("id", pa.string()), ("shard", pa.int64()), ("vector", pa.list_(pa.float32(), dim))])
    table = db.create_table("bench", schema=schema)

    def add() -> None:
        for start in range(0, len(vectors), batch):
            stop = min(start + batch, len(vectors))
            table.add(
                pa.table(
                    {
                        "id": [f"img-{i}" for i in range(start, stop)],
                        "shard": [i % 10 for i in range(start, stop)],
                        "vector": pa.FixedSizeListArray.from_arrays(pa.array(vectors[start:stop].ravel()), dim),
                    },
                    schema=schema,
                )
            )

    wall, cpu = timed(add)
    # Each add is a fragment; searching 1,500 of them is slow, so compact first (its time is reported).
    compact, _ = timed(table.optimize)
    open_s, _ = timed(lambda: lancedb.connect(str(folder)).open_table("bench").count_rows())
    stats = {"add_wall": wall, "add_cpu": cpu, "open_s": open_s, "compact_s": compact}
    return (
        stats,
        lambda q: table.search(q).distance_type("dot").limit(10).to_list(),
        lambda q: table.search(q).distance_type("dot").where("shard = 3", prefilter=True).limit(10).to_list(),
    )


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64, help="vectors per add (one request's images)")
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--backends", default="embedded,lancedb")
    args = parser.parse_args(argv)
    vectors = unit_vectors(args.n, args.dim, 0)
    queries = unit_vectors(args.queries, args.dim, 1)
    runs = {"embedded": embedded, "lancedb": lance}
    print(f"{args.n} vectors of {args.dim} dims, adds of {args.batch}, {args.queries} top-10 queries")
    built = {}
    folders = []
    for name in args.backends.split(","):
        folders.append(Path(tempfile.mkdtemp(prefix=f"bench-{name}-")))
        built[name] = runs[name](folders[-1], vectors, args.batch)
    # Searches interleaved query by query, so both backends see the same load on a shared machine.
    plain: dict[str, list[tuple[float, float]]] = {name: [] for name in built}
    filtered: dict[str, list[tuple[float, float]]] = {name: [] for name in built}
    for q in queries:
        for name, (_, search, search_filtered) in built.items():
            plain[name].append(one_query(search, q))
            filtered[name].append(one_query(search_filtered, q))
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)
    print(
        "backend   add s (wall)  add s (cpu)  vectors/s  reopen s  compact s  p50 ms  p95 ms  cpu ms/query  "
        "filtered p50  filtered p95  filtered cpu ms/query"
    )
    for name, (r, _, _) in built.items():
        p, f = summary(plain[name]), summary(filtered[name])
        print(
            f"{name:9} {r['add_wall']:12.1f}  {r['add_cpu']:11.1f}  {args.n / r['add_wall']:9.0f}  {r['open_s']:8.2f}  "
            f"{r['compact_s']:9.1f}  {p['p50']:6.2f}  {p['p95']:6.2f}  {p['cpu']:12.2f}  "
            f"{f['p50']:12.2f}  {f['p95']:12.2f}  {f['cpu']:21.2f}",
            flush=True,
        )


if __name__ == "__main__":
    main()
