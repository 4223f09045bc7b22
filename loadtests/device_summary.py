"""The summary ``loadtests/device_host_path.sh`` prints: front-end scaling and % of the tower ceiling.

Reads ``bench_host_path --json`` files whose service variants are named ``w1``, ``w2``, ``w4``, ...
(the number of front-ends; ``w1`` is the single process) and prints, per file, req/s per variant
and concurrency, the speed-up over ``w1`` and the engine's CPU per answer. With ``--tower-log``
(the output of ``bench_cuda --auto``), the ceiling is the images/s at the largest timed batch of
the candidate ``auto`` chose, and each cell is also given as a share of it.

    python -m loadtests.device_summary cpu_tiny.json cuda_b32.json --tower-log tower_b32.txt
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from statistics import median
from typing import Any

_CHOSEN = re.compile(r"^auto decision: \w+ (?P<backend>\w+) (?P<precision>\w+)", re.M)


def tower_ceiling(log: str) -> tuple[str, float] | None:
    """(candidate, images/s at its largest timed batch) of what ``auto`` chose, from bench_cuda's output."""
    chosen = _CHOSEN.search(log)
    if chosen is None:
        return None
    label = f"{chosen['backend']} {chosen['precision']}"
    line = re.search(rf"^  {re.escape(label)}: (?P<figures>.+?) images/s", log, re.M)
    if line is None:
        return None
    figures = {int(bs): float(v) for bs, v in re.findall(r"batch (\d+) ([\d.]+)", line["figures"])}
    return (label, figures[max(figures)]) if figures else None


def _workers(name: str) -> int:
    return int(name[1:]) if re.fullmatch(r"w\d+", name) else 0


def summary(record: dict[str, Any], ceiling: tuple[str, float] | None) -> str:
    cells = record["cells"]
    servers = sorted({c["server"] for c in cells}, key=_workers)
    concurrency = sorted({c["concurrency"] for c in cells})

    def rate(server: str, k: int, key: str = "req_per_s") -> float | None:
        runs = [c[key] for c in cells if c["server"] == server and c["concurrency"] == k]
        return median(runs) if runs else None

    lines = [f"{record['command']}", f"machine: {record['machine']['cpu']}, {record['machine']['cores']} cores", "",
             "| front-ends | " + " | ".join(f"c={k} req/s" for k in concurrency) + " | engine CPU ms/answer |",
             "|---|" + "---|" * (len(concurrency) + 1)]  # fmt: skip
    for server in servers:
        row = []
        for k in concurrency:
            mine, base = rate(server, k), rate("w1", k)
            text = "-" if mine is None else f"{mine:.1f}"
            if mine is not None and base and server != "w1":
                text += f" ({mine / base:.2f}x)"
            if mine is not None and ceiling is not None:
                images = rate(server, k, "images_per_s") or 0.0
                text += f", {100 * images / ceiling[1]:.0f}% of tower"
            row.append(text)
        top = max(c["concurrency"] for c in cells if c["server"] == server)
        engine = rate(server, top, "engine_cpu_ms_per_request")
        lines.append(f"| {_workers(server) or server} | " + " | ".join(row) + f" | {engine:.2f} (c={top}) |")
    if ceiling is not None:
        lines.append(f"\ntower ceiling: {ceiling[0]} (auto's choice), {ceiling[1]:.0f} images/s at its largest batch")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("runs", nargs="+", type=Path, help="bench_host_path --json files")
    parser.add_argument("--tower-log", type=Path, default=None, help="bench_cuda --auto output, for the runs on CUDA")
    args = parser.parse_args(argv)
    for path in args.runs:
        record = json.loads(path.read_text())
        cuda = any("CLIP_DEVICE" in v["env"] for v in record["services"])
        ceiling = tower_ceiling(args.tower_log.read_text()) if cuda and args.tower_log else None
        print(f"\n## {path.name}\n")
        print(summary(record, ceiling))


if __name__ == "__main__":
    main()
