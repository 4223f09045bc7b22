"""``loadtests.bench_rss`` reads the memory of a server's whole process tree (a server that forks
workers is measured with them)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from loadtests.bench_rss import describe_mappings, rss_by_mapping, tree_rss_mib


def own_rss_mib() -> float:
    line = next(x for x in open("/proc/self/status").read().splitlines() if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


def test_tree_rss_counts_the_children() -> None:
    assert tree_rss_mib(os.getpid()) > 0
    # A child holding 64 MiB of touched memory.
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while tree_rss_mib(child.pid) < 64 and time.monotonic() < deadline:
            time.sleep(0.1)
        assert tree_rss_mib(child.pid) >= 64
        assert tree_rss_mib(os.getpid()) - own_rss_mib() >= 63  # the child's, on top of this process's
    finally:
        child.kill()
        child.wait()
    assert tree_rss_mib(child.pid) == 0  # an ended process holds nothing


def test_rss_by_mapping_separates_anonymous_memory_from_libraries() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import time; b = bytearray(64 << 20); time.sleep(60)"])
    try:
        deadline = time.monotonic() + 30
        while rss_by_mapping(child.pid).get("anonymous", 0) < 64 and time.monotonic() < deadline:
            time.sleep(0.1)
        groups = rss_by_mapping(child.pid)
        assert groups["anonymous"] >= 64  # the bytearray
        assert any(name.startswith("libc") and name.endswith(".so") for name in groups)
        assert abs(sum(groups.values()) - tree_rss_mib(child.pid)) < 8  # the parts add up to VmRSS
        text = describe_mappings(groups)
        assert text.startswith("anonymous ") and "shared libraries " in text
    finally:
        child.kill()
        child.wait()
    assert rss_by_mapping(child.pid) == {}
