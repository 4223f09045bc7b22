"""``clip-train tune``: decide ``auto`` once for this CPU kind and share it through the store.

The candidates are built and timed exactly as a loading server times them
(``clipcore.backends.select``, interleaved rounds, a winner only when its margin exceeds the
rounds' spread), in a private export folder, with a longer timing than a server can afford at
start (``seconds`` per candidate; a deferred decision is measured again, longer, up to
``attempts`` times). The decision and the winner's exported graphs are then written into the store
as the version's artifact set keyed by ``clipcore.backends.shared.shared_key``, which every
server of this CPU kind and these settings reads instead of exporting and timing. A decision that
stays deferred writes nothing: servers keep deciding locally.
"""

from __future__ import annotations

import json
import logging
import platform
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

from clipcore.backends.auto import decision_path
from clipcore.backends.base import AutoDecision
from clipcore.backends.cpu import cpu_model
from clipcore.backends.onnx_export import export_dir_for
from clipcore.backends.select import select_towers
from clipcore.backends.shared import shared_key, winner_files
from clipcore.models.bundle import ModelBundle
from model_store import ModelStore
from model_store.artifacts import ArtifactSet

log = logging.getLogger(__name__)


class TuneError(Exception):
    """Nothing to share: no candidates to compare, or the rounds never settled it."""


@dataclass(frozen=True)
class Tuned:
    ref: str
    decision: AutoDecision
    described: str
    written: ArtifactSet


def tune(
    store: ModelStore,
    ref: str,
    *,
    device: str = "cpu",
    threads: int | None = None,
    precision: str = "auto",
    seconds: float = 3.0,
    attempts: int = 3,
    machine: str | None = None,
    max_batch: int = 64,
) -> Tuned:
    """Time the candidates of ``precision`` (``auto``: every backend and precision; ``fp32`` or
    ``int8``: the runtimes of that arithmetic) for ``ref`` here and write the decision with its
    graphs into ``store``. ``threads`` must be the servers' ``CLIP_TORCH_THREADS`` (the key holds
    it), and on CUDA ``max_batch`` their ``CLIP_BATCHING__MAX_BATCH_IMAGES``; ``machine`` names this
    machine in the record (default: the CPU model and host name)."""
    name, version = store.resolve(ref)
    bundle = ModelBundle.load(store, f"{name}@{version}", device)
    if threads:
        torch.set_num_threads(threads)
    key, parts = shared_key(device, threads, precision, max_batch)
    with tempfile.TemporaryDirectory(prefix="clip-tune-") as tmp:
        cache = Path(tmp)
        decision, described = None, ""
        for attempt in range(1, attempts + 1):
            towers, described = select_towers(bundle, backend="auto", precision=precision, device=device,
                                              onnx_cache_root=cache, threads=threads, max_batch=max_batch,
                                              seconds=seconds * attempt)  # fmt: skip
            decision = towers.auto
            del towers
            if decision is None:
                raise TuneError(
                    f"precision {precision} on {device} has one runtime here ({described}): nothing to tune"
                )
            if decision.outcome == "chosen":
                break
            log.warning("tune %s: attempt %d of %d deferred (%s)", bundle.ref, attempt, attempts, decision.reason)
        assert decision is not None
        if decision.outcome != "chosen":
            raise TuneError(f"the rounds could not settle it after {attempts} attempts ({decision.reason}): "
                            "nothing written, servers keep deciding locally; run it on a quieter node")  # fmt: skip
        kept = decision_path(cache, bundle, device, threads, precision, max_batch)
        trials = json.loads(kept.read_text()).get("trials", [])
        files: dict[str, Path] = {}
        if decision.backend == "onnx":
            files = winner_files(export_dir_for(cache, bundle, "int8" if decision.precision == "int8" else "fp32"))
        meta = {
            **asdict(decision),
            "tuned_on": machine or f"{cpu_model()} ({platform.node() or 'unknown host'})",
            "trials": trials,
            "key_parts": parts,
            "described": described,
        }
        meta["outcome"] = "shared"
        written = store.put_artifacts(bundle.name, bundle.version, key, files, meta)
    return Tuned(bundle.ref, decision, described, written)
