"""``clipdiff bulk embed`` on a dataset of N images against the service's own ``/embed``, in one run.

1. Writes ``--images`` unique JPEGs into a folder (shapes-world scenes from a pool of a few hundred,
   made unique by a counter in a comment segment, as ``bench_host_path``'s pool: no embedding is
   ever served from the cache) and as many other unique ones for the baseline.
2. Starts ``python -m service`` (this checkout, no Redis) on ``--store`` / ``--model`` (default: the
   committed default model).
3. Alternates the two, each on half the images: the **baseline** (this process: ``httpx`` posting
   ``/embed`` bodies built in advance, ``--batch`` images each, ``--concurrency`` in flight: the
   best a client can draw from ``/embed``) and **bulk** (``python -m clipdiff bulk embed`` in a
   separate process, same batch and concurrency). The first bulk process is killed with SIGKILL
   once at least half the rows are written; the second resumes it. The output is then checked:
   every row exactly once, in input order, none failed.

Printed: images/s of each phase, bulk / baseline (whole bulk wall time, process starts and the
resume included; and bulk's rate while scoring), the server's CPU per image in each phase (its
process tree, from /proc) and the clients' CPU per image, with the machine.

    .venv/bin/python -m loadtests.bench_bulk --images 20000
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx

from loadtests.bench_host_path import COUNTER_AT, COUNTER_LEN, ROOT, base_jpegs, service_process
from loadtests.bench_rss import tree_cpu_s

SDK = ROOT / "clients" / "python"


def unique_jpeg(base: bytes, n: int) -> bytes:
    """``base`` (with the counter placeholder) carrying ``n`` in its comment segment."""
    return base[:COUNTER_AT] + f"{n:0{COUNTER_LEN}d}".encode() + base[COUNTER_AT + COUNTER_LEN :]


def write_folder(folder: Path, pool: list[bytes], first: int, count: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    for i in range(count):
        (folder / f"{i:06d}.jpg").write_bytes(unique_jpeg(pool[i % len(pool)], first + i))


@dataclass
class Phase:
    name: str
    images: int
    wall_s: float
    server_cpu_s: float
    client_cpu_s: float

    @property
    def rate(self) -> float:
        return self.images / self.wall_s


async def _post_all(url: str, bodies: list[bytes], concurrency: int) -> None:
    queue = iter(bodies)
    headers = {"content-type": "application/json"}
    async with httpx.AsyncClient(base_url=url, timeout=600) as client:

        async def worker() -> None:
            for body in queue:
                answer = await client.post("/embed", content=body, headers=headers)
                answer.raise_for_status()

        await asyncio.gather(*(worker() for _ in range(concurrency)))


def baseline(url: str, pid: int, images: list[bytes], batch: int, concurrency: int) -> Phase:
    """``/embed`` at its best: bodies built before the clock starts, nothing else to do."""
    bodies = [
        json.dumps({"images": [{"data": base64.b64encode(x).decode()} for x in images[i : i + batch]]}).encode()
        for i in range(0, len(images), batch)
    ]
    cpu0, server0, wall0 = time.process_time(), tree_cpu_s(pid), time.perf_counter()
    asyncio.run(_post_all(url, bodies, concurrency))
    wall = time.perf_counter() - wall0
    return Phase("/embed", len(images), wall, tree_cpu_s(pid) - server0, time.process_time() - cpu0)


def bulk_command(url: str, folder: Path, out: Path, batch: int, concurrency: int) -> list[str]:
    return [sys.executable, "-m", "clipdiff", "bulk", "embed", "--url", url, "--input", str(folder),
            "--output", str(out), "--batch-size", str(batch), "--concurrency", str(concurrency),
            "--row-group-rows", str(batch * 8), "--progress", "plain", "--progress-interval", "10"]  # fmt: skip


def _written(parts: Path) -> int:
    import pyarrow.parquet as pq

    return sum(pq.read_metadata(p).num_rows for p in parts.glob("part-*.parquet"))


def bulk(url: str, pid: int, command: list[str], log: Path, kill_at: int | None) -> tuple[Phase, int]:
    """Run bulk (until ``kill_at`` rows are written, then SIGKILL); its phase and the rows on disk."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(SDK), os.environ.get("PYTHONPATH", "")])}
    out = Path(command[command.index("--output") + 1])
    parts = out.with_name(out.name + ".parts")
    server0, wall0 = tree_cpu_s(pid), time.perf_counter()
    with log.open("ab") as sink:
        proc = subprocess.Popen(command, env=env, stdout=sink, stderr=sink)
        killed = False
        while kill_at is not None and proc.poll() is None:
            if parts.exists() and _written(parts) >= kill_at:
                proc.send_signal(signal.SIGKILL)
                killed = True
                break
            time.sleep(0.05)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.perf_counter() - wall0
    if kill_at is not None and not killed:
        raise SystemExit(f"bulk ended (status {status}) before {kill_at} rows were written; see {log}")
    if kill_at is None and status != 0:
        raise SystemExit(f"bulk failed with status {status}; see {log}")
    rows = _written(parts) if killed else 0
    name = "bulk, killed" if killed else "bulk, resumed"
    return Phase(name, 0, wall, tree_cpu_s(pid) - server0, usage.ru_utime + usage.ru_stime), rows


def check_output(out: Path, count: int) -> None:
    import pyarrow.parquet as pq

    table = pq.read_table(out, columns=["index", "key", "error"])
    index = table.column("index").to_pylist()
    if index != list(range(count)):
        raise SystemExit(f"{out}: rows are not 0..{count - 1} exactly once in order ({len(index)} rows)")
    if len(set(table.column("key").to_pylist())) != count:
        raise SystemExit(f"{out}: keys repeat")
    errors = [e for e in table.column("error").to_pylist() if e]
    if errors:
        raise SystemExit(f"{out}: {len(errors)} rows failed, e.g. {errors[0]}")


def machine() -> str:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            fields.setdefault(key.strip(), value.strip())
    except OSError:
        pass
    name = fields.get("model name") or platform.processor()
    cpu = f"{name} (family {fields.get('cpu family', '?')} model {fields.get('model', '?')})"
    return f"{cpu}, {os.cpu_count()} cores, load average {os.getloadavg()[0]:.1f} at the end"


def per_image_ms(seconds: float, images: int) -> str:
    return f"{1000 * seconds / images:.2f}"


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--images", type=int, default=20_000, help="rows of the bulk dataset")
    ap.add_argument("--store", default=str(ROOT / "models"))
    ap.add_argument("--model", default="default@production")
    ap.add_argument("--batch", type=int, default=64, help="images per request, both clients")
    ap.add_argument("--concurrency", type=int, default=4, help="requests in flight, both clients")
    ap.add_argument("--threads", type=int, default=2, help="the server's intra-op threads")
    ap.add_argument("--px", type=int, default=224, help="side of the JPEGs")
    ap.add_argument("--json", type=Path, help="write the figures here too")
    args = ap.parse_args(argv)

    with tempfile.TemporaryDirectory(prefix="bench-bulk-") as tmp:
        work = Path(tmp)
        pool = base_jpegs(256, px=args.px)
        write_folder(work / "dataset", pool, 0, args.images)
        half = args.images // 2
        # The baseline's own images (never the dataset's, which it would leave in the server's cache).
        others = [unique_jpeg(pool[i % len(pool)], 10**9 + i) for i in range(args.images)]
        out = work / "out.parquet"
        command = bulk_command("URL", work / "dataset", out, args.batch, args.concurrency)
        log = work / "bulk.log"
        with service_process(Path(args.store), args.model, args.threads, {}, work / "onnx", work / "server.log") as (
            proc,
            url,
        ):
            command[command.index("--url") + 1] = url
            # Warm-up (not counted): the first batches of a fresh process are slower.
            baseline(url, proc.pid, [unique_jpeg(pool[i % len(pool)], 2 * 10**9 + i) for i in range(512)],
                     args.batch, args.concurrency)  # fmt: skip
            phases = [baseline(url, proc.pid, others[:half], args.batch, args.concurrency)]
            killed, written = bulk(url, proc.pid, command, log, kill_at=half)
            killed.images = written
            phases.append(killed)
            phases.append(baseline(url, proc.pid, others[half:], args.batch, args.concurrency))
            resumed, _ = bulk(url, proc.pid, command, log, kill_at=None)
            resumed.images = args.images - written
            phases.append(resumed)
        check_output(out, args.images)
        summary_line = next(
            (line for line in reversed(log.read_text().splitlines()) if line.startswith("bulk embed:")), ""
        )

    base = [p for p in phases if p.name == "/embed"]
    runs = [p for p in phases if p.name.startswith("bulk")]
    base_rate = sum(p.images for p in base) / sum(p.wall_s for p in base)
    bulk_rate = args.images / sum(p.wall_s for p in runs)
    print(f"{args.images} images, {args.batch} per request, concurrency {args.concurrency}, model {args.model}")
    print("| phase | images | wall s | images/s | server CPU ms/image | client CPU ms/image |")
    print("|---|---|---|---|---|---|")
    for p in phases:
        print(f"| {p.name} | {p.images} | {p.wall_s:.1f} | {p.rate:.1f} | {per_image_ms(p.server_cpu_s, p.images)} "
              f"| {per_image_ms(p.client_cpu_s, p.images)} |")  # fmt: skip
    print(f"bulk: every row exactly once after the kill at {written} rows and the resume")
    print(f"bulk / /embed throughput: {bulk_rate / base_rate:.3f} ({bulk_rate:.1f} vs {base_rate:.1f} images/s)")
    print(f"bulk's last summary: {summary_line}")
    print(f"machine: {machine()}")
    if args.json:
        figures: dict[str, Any] = {
            "phases": [{**p.__dict__, "rate": p.rate} for p in phases],
            "ratio": bulk_rate / base_rate,
            "killed_at": written,
            "machine": machine(),
            "args": {k: str(v) for k, v in vars(args).items()},
        }
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
