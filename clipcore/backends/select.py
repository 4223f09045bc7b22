"""Which towers encode a version's batches: torch (fp32, bf16, fp16, int8) or ONNX Runtime (fp32, int8),
or with ``precision="auto"`` the fastest of them that passes the gate here, with ``backend="auto"``
the fastest runtime of the set precision (``clipcore.backends.auto``), or what ``clip-train tune``
measured for this CPU kind when the version's store holds it (``clipcore.backends.shared``)."""

from __future__ import annotations

import time
from pathlib import Path

import torch

from clipcore.backends.auto import Interrupted, Pace, candidates, fastest_towers
from clipcore.backends.base import BackendError, ServingTowers
from clipcore.backends.cuda_graphs import GraphedTorchTowers
from clipcore.backends.onnx import ensure_towers
from clipcore.backends.onnx_export import ImagePrecision, export_dir_for
from clipcore.backends.parity import require_parity
from clipcore.backends.shared import adopt_shared
from clipcore.backends.torch_int8 import Int8TorchTowers
from clipcore.backends.torch_towers import AUTOCAST_DTYPES, TorchTowers
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore


def select_towers(
    bundle: ModelBundle,
    *,
    backend: str,
    precision: str,
    device: str,
    onnx_cache_root: Path,
    threads: int | None,
    max_batch: int = 64,
    store: ModelStore | None = None,
    seconds: float = 1.0,
    interrupted: Interrupted | None = None,
    pace: Pace | None = None,
) -> tuple[ServingTowers, str]:
    """The towers of ``backend`` at ``precision``, behind the parity gate, and a description for
    the log. Raises ``BackendError`` for a version that fails the gate. ``precision="auto"`` ignores
    ``backend``: every backend is a candidate. ``backend="auto"``: every runtime of ``precision`` is.
    ``backend="torch-graphs"`` (a candidate of ``auto`` on CUDA): fp16 with the image tower replayed
    from CUDA graphs, one per batch bucket up to ``max_batch`` (the batcher's largest image batch).
    With ``store`` (the version's), a decision ``clip-train tune`` shared there for this CPU kind
    and these settings is used, with its exported graphs, instead of timing here; ``seconds``: how
    long each candidate is timed when it is timed here; ``interrupted``: asked while timing, which
    stops with ``TimingInterrupted`` once it says so; ``pace``: called after each build (the shared
    decision's too) and each timed call with the seconds it took (``clipcore.backends.auto``)."""
    if backend == "auto" and precision != "auto":
        runtimes = candidates(device, precision)
        if len(runtimes) <= 1:  # one runtime of this precision here (bf16 and fp16 are torch's): nothing to time
            backend = runtimes[0][0] if runtimes else "torch"
    if precision == "auto" or backend == "auto":

        def build(candidate_backend: str, candidate_precision: str) -> tuple[ServingTowers, str]:
            return select_towers(bundle, backend=candidate_backend, precision=candidate_precision, device=device,
                                 onnx_cache_root=onnx_cache_root, threads=threads, max_batch=max_batch)  # fmt: skip

        def paced_build(candidate_backend: str, candidate_precision: str) -> tuple[ServingTowers, str]:
            started = time.perf_counter()
            try:
                return build(candidate_backend, candidate_precision)
            finally:
                if pace is not None:
                    pace(time.perf_counter() - started)

        if store is not None:
            shared = adopt_shared(store, bundle, paced_build, device=device, cache_root=onnx_cache_root,
                                  threads=threads, precision=precision, max_batch=max_batch)  # fmt: skip
            if shared is not None:
                return shared
        return fastest_towers(bundle, build, device=device, cache_root=onnx_cache_root, threads=threads,
                              precision=precision, seconds=seconds, max_batch=max_batch,
                              interrupted=interrupted, pace=pace)  # fmt: skip
    if backend == "onnx":
        # A first export turns torch's MHA fast path off process-wide while it traces (see export_towers):
        # a version serving meanwhile computes on the math path, equal within float rounding.
        image_precision: ImagePrecision = "int8" if precision == "int8" else "fp32"
        export_dir = export_dir_for(onnx_cache_root, bundle, image_precision)
        dense = bundle.dense is not None
        towers = ensure_towers(
            bundle,
            export_dir,
            device,
            threads,
            variants=True,
            image_precision=image_precision,
            dense=dense,
        )
        graphs = "pooled and dense" if dense else "pooled"
        # /score/dense reads its features from the gated dense graphs too.
        # The dense image graph runs the image graph's operators at its precision (int8 too: the
        # same weights, quantised alike), so its pooled output is the image graph's.
        serving = ServingTowers(bundle, towers, towers if dense else None, pooled_in_dense_pass=dense)
        return serving, f"onnx {image_precision} ({graphs}; {', '.join(towers.providers)}; export {export_dir})"
    if backend == "torch-graphs":
        if not device.startswith("cuda") or precision != "fp16":
            raise BackendError(f"CUDA graphs serve fp16 on a CUDA device, not {precision} on {device}")
        graphed = GraphedTorchTowers(bundle, max_batch)
        worst = require_parity(bundle, graphed, label="torch fp16 + CUDA graphs")
        sizes = "/".join(map(str, graphed.buckets))
        described = f"torch fp16 + CUDA graphs (batches {sizes}; min probe cosine {worst:.6f})"
        return ServingTowers(bundle, graphed), described
    if precision == "fp32":
        return ServingTowers(bundle, TorchTowers(bundle), pooled_in_dense_pass=True), "torch fp32"
    if precision == "int8":
        int8 = Int8TorchTowers(bundle)
        worst = require_parity(bundle, int8, label="torch int8")
        engine = torch.backends.quantized.engine
        described = f"torch int8 ({int8.quantised} int8 linears, {engine} engine; min probe cosine {worst:.6f})"
        return ServingTowers(bundle, int8), described
    low = TorchTowers(bundle, AUTOCAST_DTYPES[precision])
    worst = require_parity(bundle, low, label=f"torch {precision}")
    return ServingTowers(bundle, low), f"torch {precision} (min probe cosine {worst:.6f})"
