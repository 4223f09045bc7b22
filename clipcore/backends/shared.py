"""``auto`` decided once per CPU kind and shared through the model store.

``clip-train tune NAME@VERSION`` (``clipcore.backends.tune``), run on a quiet node of a kind,
times the candidates as a loading server would (``clipcore.backends.auto``) and writes the
decision and the winner's exported graphs into the store as an artifact set of the version
(``model_store.artifacts``) keyed by ``shared_key``: the CPU kind (the instruction sets that
decide which kernels run: AVX2, AVX-512 and its VNNI, BF16 and FP16 extensions, AMX, VNNI, on Arm
NEON, dot products and SVE; and torch's kernel level), the torch and onnxruntime versions, the
export scheme, the device (and GPU), the thread count, the candidate precision and the kernel
settings in the environment. A loading server with ``auto`` looks that key up first
(``adopt_shared``): when it is there, the graphs are copied into the local export folder (checked
against their digests) and the winner is built behind its parity gate, with nothing exported and
nothing timed; the decision shows as ``shared (tuned on <machine> at <time>)`` in the log and in
``/models``. Only where the store has no set for the key (another CPU kind, other versions or
settings), or the set cannot be used, does the server fall back to its local decision (``local``).
"""

from __future__ import annotations

import json
import logging
import re
from collections.abc import Callable
from pathlib import Path

import torch

from clipcore.backends.auto import DECISION_FORMAT, candidates, kernel_settings
from clipcore.backends.base import AutoDecision, BackendError, ServingTowers
from clipcore.backends.cpu import cpu_features
from clipcore.backends.onnx_export import INT8_SCHEME, OPSET, REFUSAL, SIDECAR, export_dir_for
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore, StoreError
from model_store.artifacts import ArtifactSet

log = logging.getLogger(__name__)

SHARED_FORMAT = 1
# numpy's names of the instruction sets that change which kernels torch or onnxruntime run -> tag.
KIND_FEATURES = {
    "AVX2": "avx2",
    "FMA3": "fma",
    "AVX512F": "avx512",
    "AVX512VNNI": "avx512vnni",
    "AVX512BF16": "avx512bf16",
    "AVX512FP16": "avx512fp16",
    "ASIMD": "neon",
    "ASIMDDP": "dotprod",
    "ASIMDHP": "fp16",
    "SVE": "sve",
}
# What numpy does not detect, from torch's own CPUID probes (absent in older torch: not tagged).
TORCH_PROBES = {"_is_amx_tile_supported": "amx", "_is_amx_fp16_supported": "amxfp16", "_is_vnni_supported": "vnni"}
Build = Callable[[str, str], tuple[ServingTowers, str]]


def cpu_kind() -> str:
    """The CPU kind a shared decision is for: the architecture, the instruction sets that decide
    kernels and torch's kernel level, e.g. ``x86_64-avx2-avx512-avx512vnni-fma-vnni-torch.avx512``."""
    import platform

    tags = {tag for name, tag in KIND_FEATURES.items() if name in cpu_features()}
    for probe, tag in TORCH_PROBES.items():
        check = getattr(torch.cpu, probe, None)
        try:
            if check is not None and check():
                tags.add(tag)
        except (RuntimeError, AttributeError):
            pass
    level = torch.backends.cpu.get_cpu_capability().lower()
    return "-".join([_slug(platform.machine() or "cpu"), *sorted(tags), f"torch.{_slug(level)}"])


def shared_key(device: str, threads: int | None, precision: str, max_batch: int = 64) -> tuple[str, dict[str, object]]:
    """The artifact key of a shared decision for this machine and these settings, and its parts
    (kept in the set, for operators). On CUDA the batcher's largest image batch is a part: it sets
    the batch sizes timed there and the CUDA graphs' buckets (a CPU times batch 1 and 8 whatever it is)."""
    import hashlib

    try:
        import onnxruntime

        runtime: str | None = onnxruntime.__version__
    except ImportError:
        runtime = None
    cuda = device.startswith("cuda")
    gpu = torch.cuda.get_device_name(torch.device(device)) if cuda and torch.cuda.is_available() else None
    parts: dict[str, object] = {
        "cpu_kind": cpu_kind(),
        "torch": torch.__version__,
        "onnxruntime": runtime,
        "opset": OPSET,
        "int8_scheme": INT8_SCHEME,
        "device": "cuda" if cuda else "cpu",
        "gpu": gpu,
        "threads": threads or "default",
        "precision": precision,
        "kernel_settings": kernel_settings(),
        "format": f"{DECISION_FORMAT}.{SHARED_FORMAT}",
    }
    if cuda:
        parts["max_batch"] = max_batch
    digest = hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:12]
    prefix = str(parts["cpu_kind"]) if gpu is None else f"{_slug(gpu)}-{parts['cpu_kind']}"
    return f"{prefix[:110]}-{digest}", parts


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9._]+", "-", text.lower()).strip("-._") or "x"


def winner_files(export_dir: Path) -> dict[str, Path]:
    """The files of an export a server needs: the graphs and their sidecar (not a refusal)."""
    return {p.name: p for p in sorted(export_dir.iterdir()) if p.is_file() and p.name != REFUSAL}


def adopt_shared(
    store: ModelStore,
    bundle: ModelBundle,
    build: Build,
    *,
    device: str,
    cache_root: Path,
    threads: int | None,
    precision: str = "auto",
    max_batch: int = 64,
) -> tuple[ServingTowers, str] | None:
    """The towers of the decision shared in ``store`` for this CPU kind and these settings, with its
    graphs copied into the local export folder; None (after saying why in the log) when there is
    none or it cannot be used here, and the caller decides locally."""
    key, _ = shared_key(device, threads, precision, max_batch)
    try:
        found = store.artifacts(bundle.name, bundle.version, key)
        if found is None:
            others = store.artifact_keys(bundle.name, bundle.version)
            there = f"the store has decisions for {', '.join(others)}" if others else "none was tuned"
            log.info("auto for %s: no shared decision for %s (%s); decision: local", bundle.ref, key, there)
            return None
        pair = (str(found.meta["backend"]), str(found.meta["precision"]))
    except (StoreError, OSError, KeyError) as exc:
        log.warning("auto for %s: the shared decision %s cannot be read (%s); decision: local", bundle.ref, key, exc)
        return None
    if pair not in candidates(device, precision):
        log.warning("auto for %s: the shared decision %s chose %s %s, not a candidate here; decision: local",
                    bundle.ref, key, *pair)  # fmt: skip
        return None
    try:
        if found.files:
            _fetch_export(store, found, export_dir_for(cache_root, bundle, "int8" if pair[1] == "int8" else "fp32"))
        towers, described = build(*pair)
    except (BackendError, StoreError, OSError) as exc:
        log.warning("auto for %s: the shared decision %s (%s %s) cannot serve here (%s); decision: local",
                    bundle.ref, key, *pair, exc)  # fmt: skip
        return None
    meta = found.meta
    decision = AutoDecision(
        "shared",
        *pair,
        margin=_number(meta.get("margin")),
        spread=_number(meta.get("spread")),
        rounds=int(meta.get("rounds") or 0),
        seconds=float(meta.get("seconds") or 0.0),
        at=float(meta.get("at") or 0.0),
        tuned_on=str(meta.get("tuned_on") or "") or None,
        # Tuned by a version that splits ties (``clipcore.backends.auto.tie_break``): which leaders tied, why it won.
        reason=str(meta["reason"]) if meta.get("tie") and meta.get("reason") else None,
        tie=tuple(map(str, meta["tie"])) if isinstance(meta.get("tie"), list) and meta["tie"] else None,
    )
    towers.auto = decision
    log.info("auto for %s: %s %s, decision: %s (key %s)", bundle.ref, *pair, decision.provenance, key)
    return towers, f"{described}; auto: decision: {decision.provenance}"


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, int | float) else None


def _fetch_export(store: ModelStore, found: ArtifactSet, export_dir: Path) -> None:
    """Copy the shared export into ``export_dir`` unless it holds exactly that one already; the
    sidecar goes last (an interrupted copy has none, so it is never loaded half-way)."""
    sidecar = export_dir / SIDECAR
    if sidecar.is_file() and SIDECAR in found.files:
        import hashlib

        if hashlib.sha256(sidecar.read_bytes()).hexdigest() == found.files[SIDECAR]:
            return  # the same graphs (their digests are in the sidecar, checked on load)
    sidecar.unlink(missing_ok=True)
    (export_dir / REFUSAL).unlink(missing_ok=True)  # a refusal was of the graphs these replace
    for filename in sorted(found.files, key=lambda name: name == SIDECAR):
        store.fetch_artifact(found, filename, export_dir / filename)
