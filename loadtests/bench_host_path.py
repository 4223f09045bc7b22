"""Host path: what the service turns the machine into, in answers, when the model costs almost nothing.

The model is a tiny random ViT (``loadtests/tiny_vit.json``: 64 px input, 16 px patches, 2 layers
of width 128 in each tower, embedding 128; seed 0), so what is measured is the *host path*: HTTP,
JSON, base64, validation, image decode and preprocessing, batching, serialisation. Against:

- **Infinity** serving the same dimensions (``loadtests.peer``: its own virtualenv, created on
  first use, a ``transformers.CLIPModel`` built from the same config, torch engine, CPU;
  ``--no-infinity`` skips it), on ``POST /embeddings``;
- **NVIDIA Triton through PyTriton** (``--pytriton``; ``loadtests.peer.triton_peer``: its own
  virtualenv, created on first use) serving the same image tower (random weights, torch, CPU) with
  its dynamic batcher, on Triton's own KServe v2 HTTP protocol (``POST /v2/models/clip_image/infer``,
  one BYTES tensor holding the base64 JPEG; FP32 embeddings back in JSON); base64, JPEG decode and
  preprocessing run in the Python model function (``loadtests/peer/pytriton_server.py``);
- **the decode-only ceiling**: in-process, on the same cores, the service's own code path
  for one image (``service.images.decode_base64`` of the same base64, ``decode_image`` with the
  service's default limits, ``bundle.preprocess`` to 64 px) looped for ``--ceiling-duration``
  seconds in 1 and in ``os.cpu_count()`` worker processes, images/s; the latter again before every
  later round, and the shares use the median of those readings (a shared host's speed drifts).

Load: ``wrk`` (C + LuaJIT; ``apt-get install wrk``), one thread by default, a closed loop of
``--concurrency`` connections for ``--duration`` seconds per cell after ``--warmup`` seconds of the
same load (not counted). ``loadtests/wrk_unique_jpeg.lua`` builds each body from a few hundred
224 px JPEGs (shapes-world scenes, quality 90) that carry a decimal counter in a comment segment:
only the counter is base64-encoded per image, so every image of the run is new bytes (no cache
hits) at almost no cost to the generator. Its CPU time (user + system) per request is printed per
cell: what the generator takes from the cores the servers share.

``--arch`` serves another model (an open_clip name such as ``ViT-B-32``, random weights) for the
same measurements without Infinity. ``--service two:CLIP_WORKERS=2`` runs front-ends and an engine
(docs/operations.md): the tables then give the engine process's CPU per answer beside the whole
tree's, and the memory table each process's RSS.

This service runs as ``python -m service`` (this checkout) on a temporary store,
``CLIP_MODEL=bench@production``, ``--threads`` intra-op threads (Infinity gets the same), once per
``--service NAME:ENV=VALUE,ENV=VALUE`` variant (default ``torch-fp32``, no extra environment).
Servers run one at a time; ``--rounds`` alternate their order. Endpoints (``--endpoints``):
``embed`` (both servers), ``classify`` (one image, 20 fixed labels) and ``rank-pair`` (two images,
one difference text), this service only. Each server's resident memory (its process tree) is read
idle after the first warm-up and after its last cell.

Output: per endpoint a table (req/s per round, p50 / p99 of the better round, each service
variant / each peer as the ratio of the medians over rounds, % of the decode-only ceiling on all
cores, wrk's CPU per request), the memory table, the machine and the command; ``--json OUT``
writes every figure.

    .venv/bin/python -m loadtests.bench_host_path --duration 10 --rounds 2 --threads 2
    .venv/bin/python -m loadtests.bench_host_path --service torch-fp32 --service auto:CLIP_PRECISION=auto \\
        --endpoints embed classify rank-pair --concurrency 1 8 32 --json host_path.json
"""

from __future__ import annotations

import argparse
import base64
import json
import multiprocessing
import os
import random
import re
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from statistics import median
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
HERE = Path(__file__).resolve().parent
TINY_VIT = HERE / "tiny_vit.json"
WRK_SCRIPT = HERE / "wrk_unique_jpeg.lua"
SERVED_NAME = "clip"  # Infinity's served model name
ENDPOINTS = {"embed": 1, "classify": 1, "rank-pair": 2}  # images per request
# The counter: 15 decimal digits from byte 6 of each JPEG (SOI, COM marker, COM length, then the
# comment). Both are multiples of 3, so base64 splits there without padding.
COUNTER_AT, COUNTER_LEN = 6, 15
CEILING_CELL = 9999  # the counter's cell digits for the in-process ceiling's images
IMG = "@IMG@"  # where the Lua script puts each image's base64 in a body template
PEERS = ("infinity", "pytriton")  # the other servers, embed only


# ----------------------------------------------------------------------------- unique JPEGs
def with_counter_segment(jpeg: bytes) -> bytes:
    """``jpeg`` with a COM segment right after SOI holding ``COUNTER_LEN`` zeros (the placeholder)."""
    if jpeg[:2] != b"\xff\xd8":
        raise ValueError("not a JPEG (no SOI marker)")
    segment = b"\xff\xfe" + (COUNTER_LEN + 2).to_bytes(2, "big") + b"0" * COUNTER_LEN
    return jpeg[:2] + segment + jpeg[2:]


def base_jpegs(count: int, px: int = 224, quality: int = 90, seed: int = 0) -> list[bytes]:
    """``count`` different shapes-world scenes (one or two shapes, as ``JpegPool``'s), JPEG at
    ``quality``, each with the counter placeholder."""
    import io

    from training.world.render import draw_scene_pil
    from training.world.scene import Scene, SceneObject
    from training.world.vocab import COLOUR_NAMES, SHAPES

    rng = random.Random(seed)
    out = []
    for _ in range(count):
        objects = tuple(
            SceneObject(
                rng.choice(SHAPES),
                rng.choice(COLOUR_NAMES),
                "medium",
                rng.uniform(0.1, 0.2),
                rng.uniform(0.25, 0.75),
                rng.uniform(0.25, 0.75),
            )
            for _ in range(rng.randint(1, 2))
        )
        image = draw_scene_pil(Scene(objects=objects, relation=None), size=px)
        buf = io.BytesIO()
        image.convert("RGB").save(buf, format="JPEG", quality=quality)
        out.append(with_counter_segment(buf.getvalue()))
    return out


def split_base64(jpeg: bytes) -> tuple[str, str]:
    """The base64 of the bytes before the counter and of those after it."""
    end = COUNTER_AT + COUNTER_LEN
    return base64.b64encode(jpeg[:COUNTER_AT]).decode(), base64.b64encode(jpeg[end:]).decode()


def counter_bytes(cell: int, thread: int, n: int) -> bytes:
    """What the Lua script writes into image ``n`` of wrk thread ``thread`` in run ``cell``."""
    return f"{cell:04d}{thread:02d}{n:09d}".encode()


def image_base64(parts: tuple[str, str], counter: bytes) -> str:
    return parts[0] + base64.b64encode(counter).decode() + parts[1]


def write_bases(path: Path, jpegs: list[bytes]) -> None:
    path.write_text("".join(" ".join(split_base64(j)) + "\n" for j in jpegs))


def read_bases(path: Path) -> list[tuple[str, str]]:
    return [(head, tail) for head, tail in (line.split(" ") for line in path.read_text().splitlines())]


def body_template(server_kind: str, endpoint: str) -> tuple[str, str]:
    """(path, JSON body with ``@IMG@`` for each image's base64) of one request."""
    from loadtests.run import DIFFERENCE, LABELS_20

    image = {"data": IMG}
    if server_kind == "pytriton":
        if endpoint != "embed":
            raise ValueError(f"the PyTriton peer answers embed only, not {endpoint}")
        from loadtests.peer.triton_peer import INFER_PATH, infer_body

        return INFER_PATH, infer_body(IMG)
    if server_kind == "infinity":
        if endpoint != "embed":
            raise ValueError(f"Infinity answers embed only, not {endpoint}")
        body: dict[str, Any] = {"input": [f"data:image/jpeg;base64,{IMG}"], "modality": "image", "model": SERVED_NAME}
        return "/embeddings", json.dumps(body)
    if endpoint == "embed":
        return "/embed", json.dumps({"images": [image]})
    if endpoint == "classify":
        return "/classify", json.dumps({"images": [image], "labels": LABELS_20})
    if endpoint == "rank-pair":
        return "/rank-pair", json.dumps({"image_a": image, "image_b": image, "difference": DIFFERENCE})
    raise ValueError(f"unknown endpoint {endpoint!r}; known: {list(ENDPOINTS)}")


# ----------------------------------------------------------------------------- wrk
def wrk_or_exit() -> str:
    exe = shutil.which("wrk")
    if exe is None:
        raise SystemExit("wrk is not installed: apt-get install wrk (Debian's package), then run again")
    return exe


@dataclass
class WrkResult:
    """One wrk run: statuses, socket errors, latency percentiles (ms), and wrk's own CPU time."""

    ok: int
    status_503: int
    status_other: int
    socket_errors: int
    requests: int
    images_sent: int
    duration_s: float
    p50_ms: float
    p90_ms: float
    p99_ms: float
    wrk_cpu_s: float

    @property
    def req_per_s(self) -> float:
        return self.ok / self.duration_s if self.duration_s > 0 else 0.0

    @property
    def failed(self) -> int:
        return self.status_503 + self.status_other + self.socket_errors

    @property
    def wrk_cpu_ms_per_request(self) -> float:
        return 1000 * self.wrk_cpu_s / self.requests if self.requests else float("nan")


def parse_wrk(stdout: str, cpu_s: float) -> WrkResult:
    line = next((ln for ln in stdout.splitlines() if ln.startswith("HOSTBENCH ")), None)
    if line is None:
        raise ValueError("wrk printed no HOSTBENCH line")
    d = json.loads(line.removeprefix("HOSTBENCH "))
    errors, lat = d["errors"], d["latency_us"]
    return WrkResult(
        ok=d["ok"],
        status_503=d["status_503"],
        status_other=d["status_other"],
        socket_errors=errors["connect"] + errors["read"] + errors["write"] + errors["timeout"],
        requests=d["requests"],
        images_sent=d["images_sent"],
        duration_s=d["duration_us"] / 1e6,
        p50_ms=lat["p50"] / 1000,
        p90_ms=lat["p90"] / 1000,
        p99_ms=lat["p99"] / 1000,
        wrk_cpu_s=cpu_s,
    )


def run_wrk(
    url: str,
    bases: Path,
    template: Path,
    cell: int,
    concurrency: int,
    duration_s: int,
    threads: int = 1,
    timeout_s: int = 60,
) -> WrkResult:
    """One closed-loop wrk run against ``url`` (127.0.0.1 only) with the unique-JPEG script."""
    if not url.startswith(("http://127.0.0.1:", "http://localhost:")):
        raise SystemExit(f"load goes to 127.0.0.1 only (got {url})")
    threads = max(1, min(threads, concurrency))
    cmd = [wrk_or_exit(), f"-t{threads}", f"-c{concurrency}", f"-d{duration_s}s", "--latency",
           "--timeout", f"{timeout_s}s", "-s", str(WRK_SCRIPT), url, "--", str(bases), str(template),
           str(cell)]  # fmt: skip
    # wrk is the only child reaped while it runs (servers are reaped when stopped): the children's
    # CPU time before and after is wrk's.
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=duration_s + timeout_s + 60)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    if proc.returncode != 0:
        raise SystemExit(f"wrk failed ({proc.returncode}): {proc.stderr.strip() or proc.stdout.strip()}")
    try:
        return parse_wrk(proc.stdout, cpu)
    except (ValueError, KeyError) as exc:
        raise SystemExit(f"cannot read wrk's output ({exc}):\n{proc.stdout}\n{proc.stderr}") from None


# ----------------------------------------------------------------------------- decode-only ceiling
def _ceiling_worker(
    store: str, ref: str, bases: str, index: int, duration_s: float, ready: Any, go: Any, results: Any
) -> None:
    """One process of the ceiling: the service's decode path on its own unique images, for
    ``duration_s`` once every process is ready."""
    from clipcore.models.bundle import ModelBundle
    from model_store import ModelStore
    from service.config import Limits
    from service.images import decode_base64, decode_image

    bundle = ModelBundle.load(ModelStore(Path(store)), ref)
    limits, side = Limits(), bundle.image_size
    parts = read_bases(Path(bases))

    def one(n: int) -> None:
        b64 = image_base64(parts[n % len(parts)], counter_bytes(CEILING_CELL, index, n))
        data = decode_base64(b64, "images.0.data", limits.max_image_bytes)
        image = decode_image(
            data, "images.0", limits.max_pixels, min_side=side, max_aspect_ratio=limits.max_aspect_ratio
        )
        bundle.preprocess(image)

    one(0)  # warm: first calls load codecs and tables
    ready.put(index)
    if not go.wait(timeout=600):
        return
    n, start = 1, time.perf_counter()
    end = start + duration_s
    while time.perf_counter() < end:
        one(n)
        n += 1
    results.put((index, n - 1, time.perf_counter() - start))


def decode_ceiling(store: Path, ref: str, bases: Path, processes: int, duration_s: float) -> float:
    """Images/s of ``processes`` worker processes running the decode path at once (summed)."""
    ctx = multiprocessing.get_context("spawn")  # fresh interpreters: nothing of this process's threads
    ready, results, go = ctx.Queue(), ctx.Queue(), ctx.Event()
    workers = [
        ctx.Process(
            target=_ceiling_worker, args=(str(store), ref, str(bases), i, duration_s, ready, go, results), daemon=True
        )
        for i in range(processes)
    ]
    for w in workers:
        w.start()
    try:
        for _ in workers:
            ready.get(timeout=600)
        go.set()
        done = [results.get(timeout=duration_s + 600) for _ in workers]
    finally:
        for w in workers:
            w.join(timeout=30)
            if w.is_alive():
                w.kill()
    return sum(n / elapsed for _, n, elapsed in done)


# ----------------------------------------------------------------------------- servers
@dataclass
class Variant:
    name: str
    env: dict[str, str] = field(default_factory=dict)


def parse_variant(text: str) -> Variant:
    """``NAME:ENV=VALUE,ENV=VALUE`` (or ``NAME``) -> a service variant."""
    name, _, settings = text.partition(":")
    if not re.fullmatch(r"[\w.+-]+", name) or name in PEERS:
        raise argparse.ArgumentTypeError(
            f"{text!r}: a variant is NAME:ENV=VALUE,... with a plain NAME (not {' or '.join(PEERS)})"
        )
    env = {}
    for item in filter(None, settings.split(",")):
        key, eq, value = item.partition("=")
        if not eq or not re.fullmatch(r"[A-Za-z_]\w*", key):
            raise argparse.ArgumentTypeError(f"{text!r}: {item!r} is not ENV=VALUE")
        env[key] = value
    return Variant(name, env)


@contextmanager
def service_process(
    store: Path, ref: str, threads: int, extra_env: dict[str, str], onnx_cache: Path, log: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``python -m service`` (this checkout) on ``store`` serving ``ref``, configured by environment
    only; (process, url) once ready, stopped when the block ends."""
    from loadtests.benchmark import logged_server
    from loadtests.local_stack import free_port

    port = free_port()
    env = {**os.environ, "CLIP_HOST": "127.0.0.1", "CLIP_PORT": str(port), "CLIP_STORE": str(store),
           "CLIP_MODEL": ref, "CLIP_TORCH_THREADS": str(threads), "OMP_NUM_THREADS": str(threads),
           "MKL_NUM_THREADS": str(threads), "CLIP_LOG_LEVEL": "warning",
           "CLIP_ONNX_CACHE_DIR": str(onnx_cache)}  # fmt: skip
    env.pop("CLIP_REDIS_URL", None)
    # Capacity is measured: a closed loop of 128 clients must queue rather than get 429s.
    env.setdefault("CLIP_BATCHING__MAX_QUEUE_DELAY_S", "600")
    env.update(extra_env)
    url = f"http://127.0.0.1:{port}"
    # -P: the working directory is not put first on sys.path, so PYTHONPATH (a variant may set it
    # to another checkout) decides which code serves.
    with logged_server([sys.executable, "-P", "-m", "service"], env, log, url, cwd=ROOT) as proc:
        yield proc, url


@contextmanager
def _explain_failure(server: str, proc: subprocess.Popen[bytes], log: Path | None) -> Iterator[None]:
    """A failed wrk run says whether the server had exited, and the end of its log."""
    try:
        yield
    except SystemExit as exc:
        state = "running" if proc.poll() is None else f"exited with {proc.returncode}"
        tail = log.read_text(errors="replace")[-3000:] if log is not None and log.exists() else ""
        raise SystemExit(f"{exc}\n{server} was {state}" + (f"; its log ends:\n{tail}" if tail else "")) from None


@dataclass
class Cell:
    server: str
    round: int
    endpoint: str
    concurrency: int
    images_per_request: int
    result: WrkResult
    server_cpu_s: float = float("nan")  # CPU time of the server's process tree during the cell
    # CPU time of the process that runs the model during the cell: the engine with CLIP_WORKERS > 1,
    # the one server process otherwise (what front-end processes cannot add to)
    engine_cpu_s: float = float("nan")

    @property
    def server_cpu_ms_per_request(self) -> float:
        return 1000 * self.server_cpu_s / self.result.ok if self.result.ok else float("nan")

    @property
    def engine_cpu_ms_per_request(self) -> float:
        return 1000 * self.engine_cpu_s / self.result.ok if self.result.ok else float("nan")


ENGINE_MODULE = "service.split.engine"
FRONTEND_MODULE = "service.split.frontend"


def engine_pid(pid: int) -> int:
    """The process of ``pid``'s tree that runs the model: the engine of a split service, else ``pid``."""
    from loadtests.bench_rss import tree_processes

    return next((p for p, command, _ in tree_processes(pid) if ENGINE_MODULE in command), pid)


def rss_by_role(pid: int) -> dict[str, list[float]]:
    """RSS MiB of each process of a server's tree by role: engine, front-end (one figure each),
    supervisor; a single-process server is one ``server``."""
    from loadtests.bench_rss import tree_processes

    roles: dict[str, list[float]] = {}
    processes = tree_processes(pid)
    split = any(ENGINE_MODULE in command for _, command, _ in processes)
    for p, command, rss in processes:
        role = ("engine" if ENGINE_MODULE in command else "front-end" if FRONTEND_MODULE in command
                else ("supervisor" if split else "server") if p == pid else "other")  # fmt: skip
        roles.setdefault(role, []).append(rss)
    return roles


def machine() -> dict[str, Any]:
    """The CPU model (lscpu), its vector instruction flags, the cores this process may use."""
    model = "unknown"
    try:
        out = subprocess.run(["lscpu"], capture_output=True, text=True, timeout=10).stdout
        found = re.search(r"^Model name:\s*(.+)$", out, re.M)
        model = found.group(1).strip() if found else model
    except (OSError, subprocess.SubprocessError):
        pass
    flags: set[str] = set()
    try:
        cpuinfo = Path("/proc/cpuinfo").read_text()
        found = re.search(r"^flags\s*:\s*(.+)$", cpuinfo, re.M)
        flags = set(found.group(1).split()) if found else flags
    except OSError:
        pass
    wanted = ("avx2", "avx512f", "avx512_vnni")
    return {"cpu": model, "flags": {f: f in flags for f in wanted}, "cores": os.cpu_count() or 1,
            "usable_cores": len(os.sched_getaffinity(0))}  # fmt: skip


# ----------------------------------------------------------------------------- report
def _fmt(x: float) -> str:
    return f"{x:.0f}" if x >= 100 else f"{x:.1f}" if x >= 10 else f"{x:.2f}"


def endpoint_table(
    endpoint: str,
    cells: list[Cell],
    servers: list[str],
    concurrency: list[int],
    ceiling: float,
    processes: int,
) -> str:
    """The markdown table of one endpoint (see the module docstring)."""
    per = ENDPOINTS[endpoint]
    by: dict[tuple[str, int], list[Cell]] = {}
    for c in cells:
        by.setdefault((c.server, c.concurrency), []).append(c)
    present = [s for s in servers if any((s, k) in by for k in concurrency)]
    rounds = max((len(v) for v in by.values()), default=1)
    rounds_note = " / ".join(f"round {i}" for i in range(1, rounds + 1)) if rounds > 1 else "one round"
    lines = [
        f"### /{endpoint}: {per} unique 224 px JPEG{'s' if per > 1 else ''} per request",
        "",
        f"req/s ({rounds_note}); in brackets p50 / p99 ms of the better round.",
        "",
        "| server | " + " | ".join(f"c={k}" for k in concurrency) + " |",
        "|---|" + "---|" * len(concurrency),
    ]

    def rate(server: str, k: int) -> float | None:
        runs = by.get((server, k))
        return median(c.result.req_per_s for c in runs) if runs else None

    for s in present:
        row = []
        for k in concurrency:
            runs = by.get((s, k), [])
            if not runs:
                row.append("-")
                continue
            best = max(runs, key=lambda c: c.result.req_per_s).result
            rates = " / ".join(_fmt(c.result.req_per_s) for c in sorted(runs, key=lambda c: c.round))
            row.append(f"{rates} ({best.p50_ms:.1f} / {best.p99_ms:.1f})")
        lines.append(f"| {s} | " + " | ".join(row) + " |")
    for peer in (p for p in PEERS if p in present):
        for s in present:
            if s in PEERS:
                continue
            ratios = []
            for k in concurrency:
                mine, theirs = rate(s, k), rate(peer, k)
                ratios.append(f"**{mine / theirs:.2f}x**" if mine is not None and theirs else "-")
            lines.append(f"| {s} / {peer} (medians) | " + " | ".join(ratios) + " |")
    for s in present:
        shares = []
        for k in concurrency:
            r = rate(s, k)
            shares.append(f"{100 * r * per / ceiling:.0f}%" if r is not None and ceiling > 0 else "-")
        lines.append(f"| {s}: % of decode-only ceiling ({processes} proc.) | " + " | ".join(shares) + " |")
    costs: list[tuple[str, Callable[[Cell], float], str]] = [
        ("wrk CPU ms per request", lambda c: c.result.wrk_cpu_ms_per_request, ".3f"),
        ("server CPU ms per answer", lambda c: c.server_cpu_ms_per_request, ".2f"),
        ("engine CPU ms per answer", lambda c: c.engine_cpu_ms_per_request, ".2f"),
    ]
    for label, cost, fmt in costs:
        for s in present:
            per_concurrency = [by.get((s, k), []) for k in concurrency]
            figures = [format(median(cost(c) for c in runs), fmt) if runs else "-" for runs in per_concurrency]
            lines.append(f"| {s}: {label} | " + " | ".join(figures) + " |")
    for s in present:
        failed = [str(sum(c.result.failed for c in by.get((s, k), []))) for k in concurrency]
        lines.append(f"| {s}: non-2xx + socket errors | " + " | ".join(failed) + " |")
    return "\n".join(lines)


def rss_table(rss: dict[str, list[tuple[float, float]]], roles: dict[str, dict[str, list[float]]]) -> str:
    lines = ["| server | RSS idle after warm-up, MiB (per round) | RSS after its cells, MiB (per round) "
             "| per process after its cells, MiB (last round) |", "|---|---|---|---|"]  # fmt: skip
    for server, figures in rss.items():
        idle = " / ".join(f"{a:.0f}" for a, _ in figures)
        after = " / ".join(f"{b:.0f}" for _, b in figures)
        each = "; ".join(f"{role} {' + '.join(f'{x:.0f}' for x in v)}" for role, v in roles.get(server, {}).items())
        lines.append(f"| {server} | {idle} | {after} | {each or '-'} |")
    return "\n".join(lines)


# ----------------------------------------------------------------------------- main
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--service", dest="services", type=parse_variant, action="append", default=None,
                        metavar="NAME:ENV=VALUE,...", help="a service variant (repeatable; default torch-fp32 with "
                        "no extra environment), e.g. auto:CLIP_PRECISION=auto")  # fmt: skip
    parser.add_argument("--no-infinity", action="store_true", help="leave Infinity out")
    parser.add_argument("--arch", default=str(TINY_VIT), help="the served model: an open_clip config JSON or an "
                        "open_clip model name with random weights (ViT-B-32; Infinity needs the tiny ViT)")  # fmt: skip
    parser.add_argument("--endpoints", nargs="+", default=["embed"], choices=list(ENDPOINTS))
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 32, 64, 128])
    parser.add_argument("--duration", type=int, default=10, help="seconds per cell (wrk takes whole seconds)")
    parser.add_argument("--warmup", type=int, default=2, help="seconds of the same load before each cell")
    parser.add_argument("--rounds", type=int, default=2, help="rounds, alternating the order of the servers")
    parser.add_argument("--threads", type=int, default=2, help="intra-op threads of both servers")
    parser.add_argument("--wrk-threads", type=int, default=1, help="wrk's threads (-t)")
    parser.add_argument("--wrk-timeout", type=int, default=60, help="wrk's --timeout, seconds")
    parser.add_argument("--bases", type=int, default=256, help="base JPEGs the bodies rotate through")
    parser.add_argument("--ceiling-duration", type=float, default=5.0, help="seconds of the decode-only ceiling")
    parser.add_argument("--infinity-venv", type=Path, default=ROOT / ".bench" / "infinity-venv")
    parser.add_argument("--infinity-batch-size", type=int, default=32)
    parser.add_argument("--pytriton", action="store_true", help="add Triton through PyTriton (embed only)")
    parser.add_argument("--pytriton-venv", type=Path, default=ROOT / ".bench" / "pytriton-venv")
    parser.add_argument("--pytriton-batch-size", type=int, default=32, help="its dynamic batcher's largest batch")
    parser.add_argument("--json", type=Path, default=None, help="write every figure here")
    args = parser.parse_args(argv)
    command = shlex.join([sys.executable, "-m", "loadtests.bench_host_path",
                          *(sys.argv[1:] if argv is None else argv)])  # fmt: skip
    variants: list[Variant] = args.services or [Variant("torch-fp32")]
    if len({v.name for v in variants}) != len(variants):
        raise SystemExit("--service: each variant needs its own NAME")
    if args.arch != str(TINY_VIT) and not args.no_infinity:
        raise SystemExit("--arch: Infinity serves the tiny ViT only; add --no-infinity")
    if args.pytriton and not args.arch.endswith(".json"):
        raise SystemExit("--pytriton serves an open_clip config JSON (--arch PATH.json), not a model name")
    if min(args.concurrency) < 1 or args.duration < 1 or args.warmup < 0 or args.rounds < 1:
        raise SystemExit("--concurrency and --duration must be at least 1, --rounds at least 1")
    wrk_or_exit()
    exe = None
    if not args.no_infinity:
        from loadtests.peer.benchmark import ensure_infinity

        exe = ensure_infinity(args.infinity_venv)
    triton_python = None
    if args.pytriton:
        from loadtests.peer.triton_peer import ensure_pytriton

        triton_python = ensure_pytriton(args.pytriton_venv)

    from loadtests.bench_rss import process_cpu_s, settle_rss, tree_cpu_s, tree_rss_mib
    from loadtests.benchmark import publish_random_arch

    info = machine()
    flags = ", ".join(f"{f} {'yes' if v else 'no'}" for f, v in info["flags"].items())
    inherited = " ".join(f"{k}={v}" for k, v in sorted(os.environ.items()) if k.startswith("CLIP_"))
    print(f"command: {command}")
    print(f"machine: {info['cpu']}, {info['cores']} cores ({info['usable_cores']} usable); {flags}")
    print(f"CLIP_* from the environment (every service variant): {inherited or 'none'}", flush=True)

    with tempfile.TemporaryDirectory(prefix="bench-host-path-") as tmp_name:
        tmp = Path(tmp_name)
        store, onnx_cache = tmp / "store", tmp / "onnx"
        t0 = time.perf_counter()
        ref = publish_random_arch(store, args.arch)
        jpegs = base_jpegs(args.bases)
        bases = tmp / "bases.txt"
        write_bases(bases, jpegs)
        sizes = sorted(len(j) for j in jpegs)
        print(f"published a random {Path(args.arch).name} as {ref} (bench@production); {len(jpegs)} base JPEGs of "
              f"{sizes[0]}-{sizes[-1]} bytes (median {sizes[len(sizes) // 2]}) in {time.perf_counter() - t0:.1f} s",
              flush=True)  # fmt: skip
        peer_dir = tmp / "hf-clip"
        if exe is not None:
            from loadtests.peer.benchmark import build_peer_model

            build_peer_model(args.infinity_venv, TINY_VIT, peer_dir)

        processes = os.cpu_count() or 1
        counts = sorted({1, processes})
        ceilings = {n: decode_ceiling(store, ref, bases, n, args.ceiling_duration) for n in counts}
        ceiling = ceilings[processes]
        print("decode-only ceiling (base64 + decode_image + preprocess to the model input, in-process): "
              + ", ".join(f"{n} process{'es' if n > 1 else ''} {v:.0f} images/s" for n, v in ceilings.items()),
              flush=True)  # fmt: skip

        templates: dict[tuple[str, str], tuple[str, Path]] = {}
        for kind in ("service", *PEERS):
            for endpoint in args.endpoints if kind == "service" else ["embed"]:
                path, body = body_template(kind, endpoint)
                file = tmp / f"{kind}-{endpoint}.json"
                file.write_text(body + "\n")
                templates[kind, endpoint] = (path, file)

        servers = ([v.name for v in variants] + (["infinity"] if exe is not None else [])
                   + (["pytriton"] if triton_python is not None else []))  # fmt: skip
        cells: list[Cell] = []
        rss: dict[str, list[tuple[float, float]]] = {s: [] for s in servers}
        roles: dict[str, dict[str, list[float]]] = {}
        cell_id = 0
        # The ceiling again before every later round: the machine's speed drifts over a run (a
        # shared host), and a share of one early reading would carry that drift into every cell.
        ceiling_readings = [ceiling]
        for r in range(1, args.rounds + 1):
            if r > 1:
                ceiling_readings.append(decode_ceiling(store, ref, bases, processes, args.ceiling_duration))
                print(f"decode-only ceiling before round {r}: {ceiling_readings[-1]:.0f} images/s", flush=True)
            for server in servers if r % 2 == 1 else servers[::-1]:
                kind = server if server in PEERS else "service"
                log = tmp / f"{kind}-{server}.log"  # Infinity writes none
                if kind == "infinity":
                    from loadtests.peer.benchmark import infinity_process

                    assert exe is not None
                    context = infinity_process(exe, {SERVED_NAME: peer_dir}, args.threads, args.infinity_batch_size)
                elif kind == "pytriton":
                    from loadtests.peer.triton_peer import pytriton_process

                    assert triton_python is not None
                    context = pytriton_process(triton_python, Path(args.arch), args.threads,
                                               args.pytriton_batch_size, log)  # fmt: skip
                else:
                    variant = next(v for v in variants if v.name == server)
                    context = service_process(store, "bench@production", args.threads, variant.env, onnx_cache, log)
                with context as (proc, url), _explain_failure(server, proc, log):
                    idle = None
                    for endpoint in args.endpoints if kind == "service" else ["embed"]:
                        path, template = templates[kind, endpoint]
                        for c in args.concurrency:
                            if args.warmup:
                                cell_id += 1
                                run_wrk(url + path, bases, template, cell_id, c, args.warmup, args.wrk_threads,
                                        args.wrk_timeout)  # fmt: skip
                            if idle is None:
                                idle = settle_rss(proc.pid, 1.0)
                            cell_id += 1
                            engine = engine_pid(proc.pid)
                            cpu_before, engine_before = tree_cpu_s(proc.pid), process_cpu_s(engine)
                            res = run_wrk(url + path, bases, template, cell_id, c, args.duration, args.wrk_threads,
                                          args.wrk_timeout)  # fmt: skip
                            server_cpu = tree_cpu_s(proc.pid) - cpu_before
                            # One process serving: its engine is the server, one reading for both
                            # (two reads a moment apart differed in the last digit).
                            engine_cpu = server_cpu if engine == proc.pid else process_cpu_s(engine) - engine_before
                            cell = Cell(server, r, endpoint, c, ENDPOINTS[endpoint], res, server_cpu, engine_cpu)
                            cells.append(cell)
                            print(f"round {r} {server} {endpoint} c={c}: {res.req_per_s:.1f} req/s, p50 "
                                  f"{res.p50_ms:.1f} p90 {res.p90_ms:.1f} p99 {res.p99_ms:.1f} ms; 2xx {res.ok}, 503 "
                                  f"{res.status_503}, other {res.status_other}, socket errors {res.socket_errors}; "
                                  f"wrk CPU {res.wrk_cpu_ms_per_request:.3f} ms/request; server CPU "
                                  f"{cell.server_cpu_ms_per_request:.2f} ms/request, engine CPU "
                                  f"{cell.engine_cpu_ms_per_request:.2f} ms/request", flush=True)  # fmt: skip
                    rss[server].append((idle or tree_rss_mib(proc.pid), settle_rss(proc.pid, 1.0)))
                    roles[server] = rss_by_role(proc.pid)

    print()
    print(f"command: {command}")
    print(f"machine: {info['cpu']}, {info['cores']} cores; {flags}; {args.threads} intra-op threads per server; "
          f"wrk -t{args.wrk_threads}, {args.duration} s per cell after {args.warmup} s of warm-up")  # fmt: skip
    print("decode-only ceiling: " + ", ".join(f"{n} proc. {v:.0f} images/s" for n, v in ceilings.items()))
    ceiling = median(ceiling_readings)
    print(f"decode-only ceiling, {processes} proc., before each round: "
          + " / ".join(f"{v:.0f}" for v in ceiling_readings)
          + f" images/s; the shares below use their median, {ceiling:.0f}")  # fmt: skip
    for endpoint in args.endpoints:
        chosen = [c for c in cells if c.endpoint == endpoint]
        print()
        print(endpoint_table(endpoint, chosen, servers, args.concurrency, ceiling, processes))
    print()
    print(rss_table(rss, roles))

    if args.json is not None:
        record = {
            "command": command,
            "machine": info,
            "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items() if k != "services"},
            "services": [asdict(v) for v in variants],
            "decode_ceiling_images_per_s": {str(n): v for n, v in ceilings.items()},
            "decode_ceiling_before_each_round": ceiling_readings,
            "cells": [
                {
                    **{k: v for k, v in asdict(c).items() if k != "result"},
                    **asdict(c.result),
                    "req_per_s": c.result.req_per_s,
                    "images_per_s": c.result.req_per_s * c.images_per_request,
                    "wrk_cpu_ms_per_request": c.result.wrk_cpu_ms_per_request,
                    "server_cpu_ms_per_request": c.server_cpu_ms_per_request,
                    "engine_cpu_ms_per_request": c.engine_cpu_ms_per_request,
                    "share_of_ceiling": c.result.req_per_s * c.images_per_request / ceiling if ceiling else None,
                }
                for c in cells
            ],
            "rss_mib": {s: [{"idle": a, "after": b} for a, b in v] for s, v in rss.items()},
            "rss_mib_by_process": roles,
        }
        args.json.write_text(json.dumps(record, indent=2) + "\n")
        print(f"\nwrote {args.json}")


if __name__ == "__main__":
    main()
