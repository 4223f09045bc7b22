"""Host path A/B: two servers up at once, short wrk cells alternating between them.

``bench_host_path`` runs one server at a time and alternates whole rounds; on a shared machine the
load of other work moves between rounds by more than a small change saves. Here both variants run
side by side (each its own ``python -m service`` on the same temporary store and tiny ViT, from the
checkout its ``PYTHONPATH`` names), and cells of ``--cell`` seconds alternate A B, B A, A B, ... so
both meet the same moments of the machine. Per cell: the server's CPU per answer (its process
tree, from /proc), the CPU of the process that runs the model (the engine with ``CLIP_WORKERS`` > 1,
else the server itself) and the share of that spent on its main thread (the event loop: HTTP,
validation, the pipeline's bookkeeping, serialisation; the rest is the decode pool, the model
threads and the intra-op threads), req/s, p50 / p99, and the mean image batch the model ran (from
``/metrics``). Printed: medians over the cells, and B / A.

    .venv/bin/python -P -m loadtests.bench_host_ab --a base:PYTHONPATH=../wt-base --b new:PYTHONPATH=. \\
        --endpoints embed classify rank-pair --concurrency 8 32 64 --cells 6 --cell 4
"""

from __future__ import annotations

import argparse
import os
import re
import tempfile
import urllib.request
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from statistics import median

from loadtests.bench_host_path import (
    ENDPOINTS,
    TINY_VIT,
    Variant,
    base_jpegs,
    body_template,
    engine_pid,
    machine,
    parse_variant,
    run_wrk,
    service_process,
    write_bases,
    wrk_or_exit,
)


def thread_cpu_s(pid: int, tid: int) -> float:
    """User + system CPU seconds of one thread of ``pid``."""
    fields = Path(f"/proc/{pid}/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


@dataclass
class AbCell:
    variant: str
    endpoint: str
    concurrency: int
    req_per_s: float
    p50_ms: float
    p99_ms: float
    cpu_ms: float  # server process tree, per 2xx answer
    engine_ms: float  # of which the process that runs the model (the server itself without a split)
    loop_ms: float  # of which that process's main thread (the event loop)
    failed: int
    batch: float  # mean items per image batch the model ran during the cell


_BATCH_SIZE = re.compile(r'^clip_batch_size_(sum|count)\{[^}]*batcher="image"[^}]*\} (\S+)$', re.M)


def image_batches(url: str) -> tuple[float, float]:
    """(items, batches) of the image batchers so far, from the server's ``/metrics``."""
    with urllib.request.urlopen(url + "/metrics", timeout=30) as answer:
        text = answer.read().decode()
    found = {"sum": 0.0, "count": 0.0}
    for kind, value in _BATCH_SIZE.findall(text):
        found[kind] += float(value)
    return found["sum"], found["count"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--a", type=parse_variant, required=True, metavar="NAME:ENV=VALUE,...")
    parser.add_argument("--b", type=parse_variant, required=True, metavar="NAME:ENV=VALUE,...")
    parser.add_argument("--endpoints", nargs="+", default=["embed"], choices=list(ENDPOINTS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 32, 64])
    parser.add_argument("--cells", type=int, default=6, help="cells per variant, endpoint and concurrency")
    parser.add_argument("--cell", type=int, default=4, help="seconds per cell")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of load on each server before a row")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of each server")
    parser.add_argument("--arch", type=Path, default=TINY_VIT, help="open_clip config of the random model served")
    args = parser.parse_args(argv)
    if args.a.name == args.b.name:
        raise SystemExit("--a and --b need different names")
    wrk_or_exit()
    from loadtests.bench_rss import process_cpu_s, tree_cpu_s
    from loadtests.benchmark import publish_random_arch

    info = machine()
    print(f"machine: {info['cpu']}, {info['cores']} cores; load average {os.getloadavg()[0]:.1f}", flush=True)
    cells: list[AbCell] = []
    with tempfile.TemporaryDirectory(prefix="bench-host-ab-") as tmp_name, ExitStack() as stack:
        tmp = Path(tmp_name)
        ref = publish_random_arch(tmp / "store", args.arch)
        bases = tmp / "bases.txt"
        write_bases(bases, base_jpegs(256))
        servers: dict[str, tuple[int, int, str]] = {}
        for v in (args.a, args.b):
            assert isinstance(v, Variant)
            proc, url = stack.enter_context(
                service_process(
                    tmp / "store", "bench@production", args.threads, v.env, tmp / "onnx", tmp / f"{v.name}.log"
                )
            )
            servers[v.name] = (proc.pid, engine_pid(proc.pid), url)
        print(f"serving {ref}: " + ", ".join(f"{n} pid {p} (engine {e})" for n, (p, e, _) in servers.items()),
              flush=True)  # fmt: skip
        cell_id = 0
        for endpoint in args.endpoints:
            path, body = body_template("service", endpoint)
            template = tmp / f"{endpoint}.json"
            template.write_text(body + "\n")
            for c in args.concurrency:
                for _, _, url in servers.values():
                    cell_id += 1
                    if args.warmup:
                        run_wrk(url + path, bases, template, cell_id, c, args.warmup)
                for i in range(args.cells):
                    order = [args.a.name, args.b.name] if i % 2 == 0 else [args.b.name, args.a.name]
                    for name in order:
                        pid, engine, url = servers[name]
                        cell_id += 1
                        items0, batches0 = image_batches(url)
                        cpu0, engine0, loop0 = tree_cpu_s(pid), process_cpu_s(engine), thread_cpu_s(engine, engine)
                        res = run_wrk(url + path, bases, template, cell_id, c, args.cell)
                        cpu, loop = tree_cpu_s(pid) - cpu0, thread_cpu_s(engine, engine) - loop0
                        items1, batches1 = image_batches(url)
                        # One process serving: its engine is the server, one reading for both.
                        engine_cpu = cpu if engine == pid else process_cpu_s(engine) - engine0
                        ok = max(res.ok, 1)
                        cells.append(AbCell(name, endpoint, c, res.req_per_s, res.p50_ms, res.p99_ms, 1000 * cpu / ok,
                                            1000 * engine_cpu / ok, 1000 * loop / ok, res.failed,
                                            (items1 - items0) / max(batches1 - batches0, 1)))  # fmt: skip
                summary_row(cells, args.a.name, args.b.name, endpoint, c, flush=True)
    print()
    print(f"machine: {info['cpu']}, {info['cores']} cores; {args.cells} cells of {args.cell} s per variant and row, "
          f"alternating; load average at the end {os.getloadavg()[0]:.1f}")  # fmt: skip
    print(
        f"| endpoint, c | CPU ms / answer {args.a.name} | {args.b.name} | B / A | engine ms {args.a.name} | "
        f"{args.b.name} | B / A | its event loop ms {args.a.name} | {args.b.name} | req/s {args.a.name} | "
        f"{args.b.name} | p50 / p99 ms {args.a.name} | {args.b.name} | image batch {args.a.name} | {args.b.name} | "
        "failed |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for endpoint in args.endpoints:
        for c in args.concurrency:
            summary_row(cells, args.a.name, args.b.name, endpoint, c)


def summary_row(cells: list[AbCell], a: str, b: str, endpoint: str, c: int, flush: bool = False) -> None:
    """One markdown row of medians over the cells of ``endpoint`` at concurrency ``c``."""

    def med(name: str, attr: str) -> float:
        return median(getattr(x, attr) for x in cells if (x.variant, x.endpoint, x.concurrency) == (name, endpoint, c))

    failed = sum(x.failed for x in cells if (x.endpoint, x.concurrency) == (endpoint, c))
    print(f"| /{endpoint}, c={c} | {med(a, 'cpu_ms'):.2f} | {med(b, 'cpu_ms'):.2f} | "
          f"**{med(b, 'cpu_ms') / med(a, 'cpu_ms'):.2f}x** | {med(a, 'engine_ms'):.2f} | {med(b, 'engine_ms'):.2f} | "
          f"**{med(b, 'engine_ms') / med(a, 'engine_ms'):.2f}x** | {med(a, 'loop_ms'):.2f} | {med(b, 'loop_ms'):.2f} | "
          f"{med(a, 'req_per_s'):.0f} | {med(b, 'req_per_s'):.0f} | {med(a, 'p50_ms'):.0f} / {med(a, 'p99_ms'):.0f} | "
          f"{med(b, 'p50_ms'):.0f} / {med(b, 'p99_ms'):.0f} | {med(a, 'batch'):.1f} | {med(b, 'batch'):.1f} | "
          f"{failed} |", flush=flush)  # fmt: skip


if __name__ == "__main__":
    main()
