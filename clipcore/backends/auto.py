"""``precision=auto``: the fastest backend and precision that passes the parity gate on this machine;
``backend=auto`` with a set precision: the fastest runtime of that precision (torch or ONNX Runtime).

Candidates on a CPU: torch fp32 (the reference, always allowed), torch bf16 autocast only where
the CPU multiplies bf16 natively (AVX-512 BF16; elsewhere torch emulates it, slower than
fp32), torch with the int8 image tower (``clipcore.backends.torch_int8``), ONNX Runtime fp32
(graph optimisations on) and ONNX Runtime with the int8 image tower, the ONNX ones only where
onnxruntime is installed. On CUDA: torch fp32, torch fp16 autocast and ONNX
Runtime fp32 on the CUDA provider (int8 has no CUDA kernels). Nothing is assumed about a CPU kind:
every candidate but torch fp32 is built behind its own gate on this machine (an ONNX export is
made once and kept; a refusal is recorded in its export folder for this CPU, so it is not
exported again), then its image tower is timed for a moment at batch 1 and at batch 8 on fixed
pixels; the score is the geometric mean of the two (batch 1 is what a lone request waits for,
batch 8 what a loaded server gets through). A candidate replaces the best so far only when it is
at least ``MIN_GAIN`` faster, so timing noise never trades exact fp32 for a backend that is not
clearly faster.

The decision is kept as JSON under ``<onnx cache>/auto/<name>/<version>-<key>.json``, keyed by the
version's manifest, the torch and onnxruntime versions, the export scheme, the device, the thread
count, the CPU model, its instruction sets, torch's kernel level and the kernel settings in the
environment (``KERNEL_ENV``): a restart (or a retry) with the same key
builds the winner directly (its gate still runs), without timing or touching the losers; on
another CPU kind the key differs and the candidates are measured there. A winner that no longer
builds sends the selection back to measuring.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch

from clipcore.backends.base import BackendError, ServingTowers
from clipcore.backends.cpu import cpu_identity, has_native_bf16
from clipcore.backends.onnx_export import INT8_SCHEME, OPSET
from clipcore.backends.torch_int8 import has_int8_engine
from clipcore.models.bundle import ModelBundle

log = logging.getLogger(__name__)

REFERENCE = ("torch", "fp32")
TIMED_BATCHES = (1, 8)
MIN_GAIN = 1.1  # how much faster than the best so far a candidate must be to replace it
DECISION_FORMAT = 3  # 3: torch int8 became a candidate
# Set, these make the libraries pick other kernels than the CPU would get (fbgemm's, MKL's, oneDNN's).
KERNEL_ENV = ("FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")

# (backend, precision) -> (towers, description): ``clipcore.backends.select.select_towers``.
Build = Callable[[str, str], tuple[ServingTowers, str]]


@dataclass(frozen=True)
class Trial:
    """One candidate's outcome: images/s per timed batch size, or why it was refused."""

    backend: str
    precision: str
    images_per_s: dict[str, float] | None = None
    refused: str | None = None

    @property
    def score(self) -> float:
        """Geometric mean of the timed batch sizes' images/s (0 for a refused candidate)."""
        if not self.images_per_s:
            return 0.0
        values = list(self.images_per_s.values())
        return math.exp(sum(math.log(max(v, 1e-9)) for v in values) / len(values))


def candidates(device: str, precision: str = "auto") -> list[tuple[str, str]]:
    """(backend, precision) pairs worth trying on ``device``, torch fp32 first; only those of
    ``precision`` unless it is ``auto`` (``backend=auto``: the runtime is chosen, not the arithmetic)."""
    every = _every_candidate(device)
    return every if precision == "auto" else [c for c in every if c[1] == precision]


def _every_candidate(device: str) -> list[tuple[str, str]]:
    out = [REFERENCE]
    cuda = device.startswith("cuda")
    if cuda:
        out.append(("torch", "fp16"))
    else:
        if has_native_bf16():
            out.append(("torch", "bf16"))
        if has_int8_engine():
            out.append(("torch", "int8"))
    try:
        import onnxruntime
    except ImportError:
        return out
    out.append(("onnx", "fp32"))
    if not cuda:
        out.append(("onnx", "int8"))
    elif "CUDAExecutionProvider" not in onnxruntime.get_available_providers():
        out.remove(("onnx", "fp32"))  # a CPU onnxruntime on a CUDA machine: not a CUDA candidate
    return out


def kernel_settings() -> list[str]:
    """``NAME=value`` of each ``KERNEL_ENV`` setting in the environment."""
    return [f"{name}={os.environ[name]}" for name in KERNEL_ENV if os.environ.get(name)]


def machine_identity(device: str) -> str:
    """What decides which kernels run: the CPU (model, instruction sets), torch's kernel level, the
    libraries' kernel settings in the environment and, on CUDA, the GPU."""
    identity = f"{cpu_identity()}, torch kernels {torch.backends.cpu.get_cpu_capability()}"
    identity += "".join(f", {setting}" for setting in kernel_settings())
    if device.startswith("cuda") and torch.cuda.is_available():
        identity += f", {torch.cuda.get_device_name(torch.device(device))}"
    return identity


def decision_path(root: Path, bundle: ModelBundle, device: str, threads: int | None, precision: str = "auto") -> Path:
    """Where the decision for this version, machine and settings (and candidate ``precision``) is kept."""
    parts = [
        bundle.manifest.model_dump_json(),
        f"torch {torch.__version__}",
        f"opset {OPSET}",
        INT8_SCHEME,
        f"device {device}",
        f"threads {threads or 'default'}",
        machine_identity(device),
        f"format {DECISION_FORMAT}",
    ]
    if precision != "auto":  # only that precision's runtimes competed
        parts.append(f"precision {precision}")
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return root / "auto" / bundle.name / f"{bundle.version}-{key}.json"


def time_images(encode: Callable[[np.ndarray], np.ndarray], image_size: int, seconds: float) -> dict[str, float]:
    """Images/s of ``encode`` per timed batch size, from the median of at least 3 calls (the median
    keeps time slices stolen by other processes out of the figure)."""
    rng = np.random.default_rng(0)
    out = {}
    for bs in TIMED_BATCHES:
        batch = rng.integers(0, 256, (bs, image_size, image_size, 3), dtype=np.uint8)
        encode(batch)  # warm-up: first calls allocate
        times: list[float] = []
        start = time.perf_counter()
        while len(times) < 3 or time.perf_counter() - start < seconds:
            t0 = time.perf_counter()
            encode(batch)
            times.append(time.perf_counter() - t0)
        out[str(bs)] = bs / float(np.median(times))
    return out


def fastest_towers(
    bundle: ModelBundle,
    build: Build,
    *,
    device: str,
    cache_root: Path,
    threads: int | None,
    precision: str = "auto",
    seconds: float = 1.0,
) -> tuple[ServingTowers, str]:
    """The towers of the fastest candidate (of ``precision``, or of any with ``auto``) that passes the
    gate, and a description for the log. The first candidate is the baseline a later one must beat by
    ``MIN_GAIN``: torch fp32 for fp32 and ``auto``, torch int8 (no export) for int8. Raises
    ``BackendError`` when no candidate passes (never for fp32: torch fp32 is the reference)."""
    contenders = candidates(device, precision)
    if threads:
        torch.set_num_threads(threads)  # time torch with the model thread's count (per-thread in OpenMP)
    path = decision_path(cache_root, bundle, device, threads, precision)
    remembered = _read_decision(path)
    if remembered is not None and remembered in contenders:
        try:
            towers, described = build(*remembered)
            return towers, f"{described}; auto: remembered in {path}"
        except BackendError as exc:
            log.warning("auto: %s %s no longer builds for %s (%s); measuring again",
                        *remembered, bundle.ref, exc)  # fmt: skip
    trials: list[Trial] = []
    best: tuple[Trial, ServingTowers, str] | None = None
    for backend, arithmetic in contenders:
        try:
            towers, described = build(backend, arithmetic)
        except BackendError as exc:
            trials.append(Trial(backend, arithmetic, refused=str(exc)))
            continue
        except Exception as exc:  # an export that crashes refuses that candidate, not the version
            if (backend, arithmetic) == REFERENCE:
                raise
            log.exception("auto: %s %s failed to build for %s", backend, arithmetic, bundle.ref)
            trials.append(Trial(backend, arithmetic, refused=f"{type(exc).__name__}: {exc}"))
            continue
        trial = Trial(backend, arithmetic, time_images(towers.encode_images, bundle.image_size, seconds))
        trials.append(trial)
        if best is None or trial.score >= MIN_GAIN * best[0].score:
            best = trial, towers, described  # a loser's sessions are freed with its last reference
        del towers
    if best is None:
        refusals = "; ".join(f"{t.backend} {t.precision}: {t.refused}" for t in trials)
        raise BackendError(f"no {precision} runtime passes for {bundle.ref} ({refusals or 'none on ' + device})")
    winner, towers, described = best
    _write_decision(path, bundle, winner, trials)
    summary = ", ".join(
        f"{t.backend} {t.precision} " + (f"{t.score:.1f} images/s" if t.refused is None else "refused") for t in trials
    )
    log.info("auto for %s: %s; chose %s %s (kept in %s)", bundle.ref, summary, winner.backend, winner.precision, path)
    return towers, f"{described}; auto: {summary}"


def _read_decision(path: Path) -> tuple[str, str] | None:
    try:
        record = json.loads(path.read_text())
        chosen = record["chosen"]
        return str(chosen["backend"]), str(chosen["precision"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _write_decision(path: Path, bundle: ModelBundle, winner: Trial, trials: list[Trial]) -> None:
    record = {
        "ref": bundle.ref,
        "chosen": {"backend": winner.backend, "precision": winner.precision},
        "trials": [asdict(t) for t in trials],
        "at": time.time(),
    }
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # pods sharing the cache never write one file
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)
    except OSError as exc:  # a read-only cache costs a measurement per start, nothing more
        log.warning("auto: cannot keep the decision in %s: %s", path, exc)
