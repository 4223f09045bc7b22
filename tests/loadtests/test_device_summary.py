"""loadtests/device_summary.py: the tower ceiling read from bench_cuda's output, the scaling table."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from loadtests.device_summary import summary, tower_ceiling

REPO = Path(__file__).resolve().parents[2]

TOWER_LOG = """auto: torch fp16 (CUDA graphs), chosen
auto decision: chosen torch fp16_graphs (margin 6.1, spread 0.02, 2 rounds, 9.0 s)
  torch fp32: batch 1 310.0, batch 64 2100.5 images/s (weights 1: 1, 64: 8; rounds 2)
  torch fp16_graphs: batch 1 900.0, batch 64 12800.0 images/s (weights 1: 1, 64: 8; rounds 2)
"""


def test_the_ceiling_is_the_chosen_candidates_largest_batch() -> None:
    assert tower_ceiling(TOWER_LOG) == ("torch fp16_graphs", 12800.0)
    assert tower_ceiling("no decision here") is None


def _cell(server: str, c: int, rate: float, engine_ms: float) -> dict[str, Any]:
    return {"server": server, "concurrency": c, "req_per_s": rate, "images_per_s": rate,
            "engine_cpu_ms_per_request": engine_ms}  # fmt: skip


def test_the_table_gives_each_front_end_count_against_one_process() -> None:
    record = {
        "command": "bench",
        "machine": {"cpu": "AMD EPYC", "cores": 16},
        "cells": [_cell("w1", 8, 100.0, 5.0), _cell("w4", 8, 350.0, 1.5), _cell("w1", 64, 120.0, 4.0)],
    }
    rows = {line.split("|")[1].strip(): line for line in summary(record, ("torch fp32", 1000.0)).splitlines()
            if line.startswith("| ")}  # fmt: skip
    assert "350.0 (3.50x), 35% of tower" in rows["4"]
    assert "100.0, 10% of tower" in rows["1"] and rows["1"].endswith("| 4.00 (c=64) |")
    assert rows["4"].endswith("| 1.50 (c=8) |")  # its highest concurrency measured


@pytest.mark.slow
def test_the_device_script_runs_here_in_quick_mode(tmp_path: Path) -> None:
    if shutil.which("wrk") is None:
        pytest.skip("wrk is not installed (apt-get install wrk)")
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": os.environ.get("PYTHON", sys.executable)}
    out = subprocess.run(["bash", str(REPO / "loadtests" / "device_host_path.sh"), "--quick"], cwd=REPO, env=env,
                         capture_output=True, text=True, timeout=1200)  # fmt: skip
    assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
    table = (tmp_path / "summary.md").read_text()
    assert "| 1 |" in table and "| 2 |" in table  # w1 and two front-ends, on any machine of 2 cores or more
