"""``precision=auto``: the fastest backend and precision that passes the parity gate on this machine;
``backend=auto`` with a set precision: the fastest runtime of that precision (torch or ONNX Runtime).

Candidates on a CPU: torch fp32 (the reference, always allowed), torch bf16 autocast only where
the CPU multiplies bf16 natively (AVX-512 BF16; elsewhere torch emulates it, slower than
fp32), torch with the int8 image tower (``clipcore.backends.torch_int8``), ONNX Runtime fp32
(graph optimisations on) and ONNX Runtime with the int8 image tower, the ONNX ones only where
onnxruntime is installed. On CUDA: torch fp32, torch fp16 autocast, torch fp16 with the image
tower replayed from CUDA graphs (``clipcore.backends.cuda_graphs``, backend ``torch-graphs``) and
ONNX Runtime fp32 on the CUDA provider (int8 has no CUDA kernels). Nothing is assumed about a CPU kind:
every candidate but torch fp32 is built behind its own gate on this machine (an ONNX export is
made once and kept; a refusal is recorded in its export folder for this CPU, so it is not
exported again), then the image towers of all that built are timed in interleaved rounds (every
round times each one at every timed batch size on fixed pixels, A B C A B C ...), so noise from
other processes lands on all of them alike. The timed batch sizes and the score of a round
(``timed_batches``, ``batch_weights``):

- CPU: batch 1 and 8, the geometric mean of the two (batch 1 is what a lone request waits for,
  batch 8 what a loaded server gets through; on a CPU the ranking holds at larger batches).
- CUDA: batch 1, 8, 32, 128, ... up to the batcher's largest image batch (which is timed too), the
  sizes a GPU server forms as its load rises. The score is their geometric mean weighted by
  ``1 + log2(batch)`` (1, 4, 6, 8 for 1 / 8 / 32 / 128): on a GPU the order of the candidates turns
  over with the batch size (fp16 autocast 0.57x fp32 at batch 1 and 4x at 128 on an H200), a loaded
  server spends its time in large batches, so they weigh most, and batch 1 keeps a weight, so a
  candidate much slower for a lone request has to make it up several times over under load.

Leaving the reference (the first candidate that builds: torch fp32, or torch int8 for
``backend=auto`` with int8) needs a margin over it: a candidate's per-round ratios to the reference
must have a median of at least ``MIN_GAIN`` and a gain that exceeds their spread (``compare``:
``faster``). Among the candidates clearly faster than the reference, the *leaders* are the best one
(the largest median ratio to the reference) and every one that the best is not clearly faster than
(their own comparison is unclear or within ``MIN_GAIN``): the rounds cannot rank them, but each of
them is clearly faster than the reference. One leader serves, taken by a fixed tie-break
(``tie_break``): the least memory first (``WEIGHT_BYTES``), then the fewest moving parts
(``MOVING_PARTS``), then the candidates' order; the decision names the leaders that tied and why
the one that serves won (``tie``, ``reason``). A candidate whose comparison with the reference is
itself unclear is no leader.

The decision is **deferred** only when it is unclear whether any candidate beats the reference at
all: none is clearly faster than it, and some round put one above ``MIN_GAIN`` (``unclear``); or
the best is, but a candidate whose own comparison with the reference is unclear is one the best is
not clearly faster than (that candidate cannot be told from the best nor from the reference); or
leaders tie and the serving leader's gain over the reference (margin - 1) is no larger than the
spread of its comparison with the reference plus the tie's noise (how far the leaders' median ratio
strays from 1, plus its spread: the rounds cannot rank them, so both are noise). Either way the
rounds' noise is as large as the margin, and that is how a false margin shows: of 124 measurements
of three equal candidates beside processes spinning on the same cores (as in
tests/unit/test_auto_noise.py), 16 had a candidate "clearly" faster than the reference; 12 of them
had such an unclear candidate beside it, 2 a tie as noisy as the margin (the 2 left over were taken
by the rule before ties were split as well, which took 3 in all). A real tie is far clear of it:
two int8 runtimes at 3.8x torch fp32, 1.10x apart with a spread of 0.18. Then the reference serves,
nothing is kept, and the next load of the version measures again (a server also does in the
background, below). When no candidate is faster in any round, the reference is chosen.

The decision is kept as JSON under ``<onnx cache>/auto/<name>/<version>-<key>.json``, keyed by the
version's manifest, the torch and onnxruntime versions, the export scheme, the device, the thread
count, the CPU model, its instruction sets, torch's kernel level and the kernel settings in the
environment (``KERNEL_ENV``): a restart (or a retry) with the same key builds the winner directly
(its gate still runs), without timing or touching the losers (a deferred decision is recorded for
operators, never read back); on another CPU kind the key differs and the candidates are measured
there. A winner that no longer
builds sends the selection back to measuring.

Before any of this, a server reads the decision ``clip-train tune`` shared in the model store for
its CPU kind and settings, if there is one (``clipcore.backends.shared``): then nothing is
exported or timed here, and the decision says ``shared`` instead of ``local``.

A server measures a deferred decision again in the background (``service.runtime.retime``): it
passes ``interrupted``, checked before each candidate is built and before each timed call, and the
measurement stops with ``TimingInterrupted`` as soon as it says so (a request arrived while the
server was idle). Under steady traffic it passes ``pace`` instead: called after each build and each
timed call with the seconds that work took, it sleeps long enough to keep the measurement to a
share of a core (the pauses are not counted in a candidate's timing).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch

from clipcore.backends.base import AutoDecision, BackendError, ServingTowers
from clipcore.backends.cpu import cpu_identity, has_native_bf16
from clipcore.backends.onnx_export import INT8_SCHEME, OPSET
from clipcore.backends.torch_int8 import has_int8_engine
from clipcore.models.bundle import ModelBundle

log = logging.getLogger(__name__)

REFERENCE = ("torch", "fp32")
TIMED_BATCHES = (1, 8)  # on a CPU
CUDA_FIRST_BATCHES = (1, 8, 32)  # on CUDA, then x4 until the batcher's largest image batch
MIN_GAIN = 1.1  # how much faster than the reference (or another candidate) a candidate must be to beat it
# Interleaved rounds: five give a median that ignores two disturbed rounds, and a spread to compare with.
ROUNDS = 5
# 3: torch int8 became a candidate; 4: interleaved rounds, a margin must exceed the rounds' spread
# (decisions of format 3 may have been taken on a busy machine: they are measured again); 5: leaders
# that tie are split by ``tie_break`` instead of deferring or keeping the earlier candidate (a kept
# decision of format 4 may name another leader than this rule takes: measured again, and
# ``clip-train tune`` runs again for the shared ones, whose key holds the format).
DECISION_FORMAT = 5
# Breaking a tie between leaders (``tie_break``), least memory first: the bytes the serving towers
# keep per weight. int8 keeps the image tower's linear weights in one byte (torch's and ONNX
# Runtime's alike); bf16 and fp16 are autocast, which keeps the fp32 weights and casts them per call,
# so they hold what fp32 holds.
WEIGHT_BYTES = {"int8": 1, "bf16": 4, "fp16": 4, "fp32": 4}
# Then the fewest moving parts: plain torch runs the version's own towers (nothing exported, one
# runtime); CUDA graphs replay those towers from a capture per batch bucket (static buffers, a
# second path); ONNX Runtime serves an export kept on disk in a second runtime (its own sessions,
# threads and memory arena). A backend not listed here comes last.
MOVING_PARTS = {"torch": 0, "torch-graphs": 1, "onnx": 2}
# Set, these make the libraries pick other kernels than the CPU would get (fbgemm's, MKL's, oneDNN's).
KERNEL_ENV = ("FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA")

# (backend, precision) -> (towers, description): ``clipcore.backends.select.select_towers``.
Build = Callable[[str, str], tuple[ServingTowers, str]]
# Whether a measurement must stop now (a request arrived while the server re-timed in its idle time, or a
# version started loading while it re-timed under traffic).
Interrupted = Callable[[], bool]
# Called after each piece of a measurement's work (a build, a timed call) with the seconds it took:
# it pauses the measuring thread to keep it to a share of a core (re-timing under traffic).
Pace = Callable[[float], None]


class TimingInterrupted(Exception):
    """A measurement stopped half-way because ``interrupted`` said so: nothing was decided."""


def _check(interrupted: Interrupted | None) -> None:
    if interrupted is not None and interrupted():
        raise TimingInterrupted("a request arrived")


@dataclass(frozen=True)
class Trial:
    """One candidate's outcome: images/s per timed batch size, or why it was refused."""

    backend: str
    precision: str
    images_per_s: dict[str, float] | None = None
    refused: str | None = None
    rounds: list[float] | None = None  # the score of each interleaved round
    spread: float | None = None  # (max - min) / median of ``rounds``
    weights: dict[str, float] | None = None  # each timed batch size's weight in the score (None: equal)

    @property
    def score(self) -> float:
        """Weighted geometric mean of the timed batch sizes' images/s (0 for a refused candidate)."""
        return geometric_mean(self.images_per_s or {}, self.weights)


def timed_batches(device: str, max_batch: int) -> tuple[int, ...]:
    """The batch sizes candidates are timed at: 1 and 8 on a CPU; on CUDA 1, 8, 32, 128, ... below
    the batcher's largest image batch ``max_batch``, and ``max_batch`` itself (never above it)."""
    top = max(1, max_batch)
    if not device.startswith("cuda"):
        return tuple(sorted({min(b, top) for b in TIMED_BATCHES}))
    sizes = [b for b in CUDA_FIRST_BATCHES if b < top]
    b = CUDA_FIRST_BATCHES[-1] * 4
    while b < top:
        sizes.append(b)
        b *= 4
    return (*sizes, top)


def batch_weights(batch_sizes: Sequence[int], device: str) -> dict[str, float]:
    """Each timed batch size's weight in a round's score: equal on a CPU, ``1 + log2(batch)`` on CUDA."""
    cuda = device.startswith("cuda")
    return {str(b): (1.0 + math.log2(b)) if cuda else 1.0 for b in batch_sizes}


def candidates(device: str, precision: str = "auto") -> list[tuple[str, str]]:
    """(backend, precision) pairs worth trying on ``device``, torch fp32 first; only those of
    ``precision`` unless it is ``auto`` (``backend=auto``: the runtime is chosen, not the arithmetic)."""
    every = _every_candidate(device)
    return every if precision == "auto" else [c for c in every if c[1] == precision]


def _every_candidate(device: str) -> list[tuple[str, str]]:
    out = [REFERENCE]
    cuda = device.startswith("cuda")
    if cuda:
        out += [("torch", "fp16"), ("torch-graphs", "fp16")]
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


def decision_path(
    root: Path, bundle: ModelBundle, device: str, threads: int | None, precision: str = "auto", max_batch: int = 64
) -> Path:
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
    if device.startswith("cuda"):  # timed at the batch sizes the batcher forms (CPU keys stay as they were)
        parts.append(f"batches {','.join(map(str, timed_batches(device, max_batch)))}")
    key = hashlib.sha256("|".join(parts).encode()).hexdigest()[:16]
    return root / "auto" / bundle.name / f"{bundle.version}-{key}.json"


def time_rounds(
    encoders: Sequence[Callable[[np.ndarray], np.ndarray]],
    image_size: int,
    seconds: float,
    rounds: int = ROUNDS,
    batch_sizes: Sequence[int] = TIMED_BATCHES,
    interrupted: Interrupted | None = None,
    pace: Pace | None = None,
) -> list[list[dict[str, float]]]:
    """Per encoder, its images/s per timed batch size in each of ``rounds`` interleaved rounds: every
    round times every encoder at every batch size, A B C A B C ..., so a burst of other work on the
    cores lands on all of them alike instead of on whichever was being timed. Each encoder gets about
    ``seconds`` in all, split over the rounds and batch sizes; a slot is the median of its calls (at
    least one). ``interrupted`` is asked before every call: when it says so, ``TimingInterrupted``
    is raised at once (no call waits for the rest of a round). ``pace`` is called after every call
    (warm-up ones too) with its duration; the time it pauses does not count in a slot."""
    rng = np.random.default_rng(0)
    batches = [rng.integers(0, 256, (bs, image_size, image_size, 3), dtype=np.uint8) for bs in batch_sizes]

    def paced(started: float) -> float:
        """Hand the call that started at ``started`` to ``pace``; the seconds it paused."""
        if pace is None:
            return 0.0
        ended = time.perf_counter()
        pace(ended - started)
        return time.perf_counter() - ended

    for encode in encoders:
        for batch in batches:
            _check(interrupted)
            t0 = time.perf_counter()
            encode(batch)  # warm-up: first calls allocate
            paced(t0)
    slot = seconds / (rounds * len(batches))
    figures: list[list[dict[str, float]]] = [[] for _ in encoders]
    for _ in range(rounds):
        for i, encode in enumerate(encoders):
            figure = {}
            for batch in batches:
                times: list[float] = []
                paused = 0.0
                start = time.perf_counter()
                while not times or time.perf_counter() - start - paused < slot:
                    _check(interrupted)
                    t0 = time.perf_counter()
                    encode(batch)
                    times.append(time.perf_counter() - t0)
                    paused += paced(t0)
                figure[str(len(batch))] = len(batch) / max(float(np.median(times)), 1e-12)
            figures[i].append(figure)
    return figures


def geometric_mean(images_per_s: dict[str, float], weights: dict[str, float] | None = None) -> float:
    """The score of one set of figures (images/s per batch size), weighted by ``weights`` per batch
    size (``batch_weights``; None: equal): no batch size may hide the others."""
    if not images_per_s:
        return 0.0
    w = {bs: (weights or {}).get(bs, 1.0) for bs in images_per_s}
    total = sum(w.values())
    return math.exp(sum(w[bs] * math.log(max(v, 1e-9)) for bs, v in images_per_s.items()) / total)


def compare(candidate: Sequence[float], best: Sequence[float]) -> tuple[float, float, str]:
    """``candidate``'s per-round scores against ``best``'s, paired round by round (the same moment of
    the machine): the median ratio (the margin), the ratios' interquartile range relative to it (the noise), and a
    verdict: ``faster`` when the margin is at least ``MIN_GAIN`` and its gain exceeds the spread,
    ``not faster`` when no round reached ``MIN_GAIN``, ``unclear`` otherwise."""
    ratios = [c / max(b, 1e-12) for c, b in zip(candidate, best, strict=True)]
    margin = float(np.median(ratios))
    # The interquartile range: one or two rounds hit by a burst widen it less than they would max - min,
    # so a quiet-enough machine still decides; a noise that shifts most rounds widens it.
    q1, q3 = np.percentile(ratios, [25, 75])
    spread = float(q3 - q1) / max(margin, 1e-12)
    if margin >= MIN_GAIN and margin - 1 > spread:
        return margin, spread, "faster"
    if max(ratios) < MIN_GAIN:
        return margin, spread, "not faster"
    return margin, spread, "unclear"


def fastest_towers(
    bundle: ModelBundle,
    build: Build,
    *,
    device: str,
    cache_root: Path,
    threads: int | None,
    precision: str = "auto",
    seconds: float | None = None,
    max_batch: int = 64,
    interrupted: Interrupted | None = None,
    pace: Pace | None = None,
) -> tuple[ServingTowers, str]:
    """The towers of the fastest candidate (of ``precision``, or of any with ``auto``) that passes the
    gate, and a description for the log; ``towers.auto`` says how it was decided. The first candidate
    that builds is the reference a later one must clearly beat (``compare``): torch fp32 for fp32 and
    ``auto``, torch int8 (no export) for int8. Leaders that the rounds cannot rank are split by
    ``tie_break`` (``_decide``). When the rounds cannot tell whether any candidate beats the reference
    (``unclear``), the decision is deferred: the reference serves and no decision is kept, so the next
    load of the version measures again. Raises ``BackendError`` when no candidate passes
    (never for fp32: torch fp32 is the reference). ``max_batch``: the batcher's largest image batch
    (on CUDA the timed batch sizes go up to it); ``seconds``: timing per candidate (default 1 on a
    CPU, 2 on CUDA, where more batch sizes share it); ``interrupted``: asked before each candidate is
    built and each timed call, ``TimingInterrupted`` once it says so (nothing is decided or kept);
    ``pace``: called after each build and each timed call with the seconds it took (``Pace``)."""
    contenders = candidates(device, precision)
    batch_sizes = timed_batches(device, max_batch)
    weights = batch_weights(batch_sizes, device)
    if seconds is None:
        seconds = 2.0 if device.startswith("cuda") else 1.0
    if threads:
        torch.set_num_threads(threads)  # time torch with the model thread's count (per-thread in OpenMP)
    path = decision_path(cache_root, bundle, device, threads, precision, max_batch)
    remembered = _read_decision(path)
    if remembered is not None and remembered[0] in contenders:
        try:
            towers, described = build(*remembered[0])
            towers.auto = replace(remembered[1], outcome="remembered")
            return towers, f"{described}; auto: remembered in {path}; decision: local"
        except BackendError as exc:
            log.warning("auto: %s %s no longer builds for %s (%s); measuring again",
                        *remembered[0], bundle.ref, exc)  # fmt: skip
    trials: list[Trial] = []
    # Every candidate that builds is held until the rounds end (they are timed in turns): memory
    # for a few image towers at once while a version loads.
    built: list[tuple[Trial, ServingTowers, str]] = []
    for backend, arithmetic in contenders:
        _check(interrupted)
        building = time.perf_counter()
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
        finally:
            if pace is not None:  # a build (an export, a parity gate) is work to pace too
                pace(time.perf_counter() - building)
        trial = Trial(backend, arithmetic, weights=weights)
        trials.append(trial)
        built.append((trial, towers, described))
    if not built:
        refusals = "; ".join(f"{t.backend} {t.precision}: {t.refused}" for t in trials)
        raise BackendError(f"no {precision} runtime passes for {bundle.ref} ({refusals or 'none on ' + device})")
    started = time.perf_counter()
    encoders = [t.encode_images for _, t, _ in built]
    # Passed only when set: a replaced ``time_rounds`` (a test's) need not know the arguments.
    optional: dict[str, Any] = {}
    if interrupted is not None:
        optional["interrupted"] = interrupted
    if pace is not None:
        optional["pace"] = pace
    figures = time_rounds(encoders, bundle.image_size, seconds, batch_sizes=batch_sizes, **optional)
    elapsed = time.perf_counter() - started
    scores = [[geometric_mean(f, weights) for f in per_round] for per_round in figures]
    measured = {id(trial): _measured(trial, f) for (trial, _, _), f in zip(built, figures, strict=True)}
    trials = [measured.get(id(t), t) for t in trials]
    decision, best = _decide([measured[id(trial)] for trial, _, _ in built], scores, elapsed)
    _, towers, described = built[best]
    del built  # the losers' sessions are freed with their last reference
    _write_decision(path, bundle, decision, trials)
    towers.auto = decision
    summary = ", ".join(
        f"{t.backend} {t.precision} " + (f"{t.score:.1f} images/s" if t.refused is None else "refused") for t in trials
    )
    if decision.outcome == "deferred":
        log.warning("auto for %s: %s; deferred (%s): %s %s serves, measured again while idle or at the next load",
                    bundle.ref, summary, decision.reason, decision.backend, decision.precision)  # fmt: skip
        return towers, f"{described}; auto: {summary}; deferred: {decision.reason}; decision: local"
    tied = f"; {decision.reason}" if decision.tie else ""
    log.info("auto for %s: %s; chose %s %s (%.2fx, spread %.2f over %d rounds%s; kept in %s); decision: local",
             bundle.ref, summary, decision.backend, decision.precision, decision.margin, decision.spread,
             decision.rounds, tied, path)  # fmt: skip
    return towers, f"{described}; auto: {summary}{tied}; decision: local"


def _measured(trial: Trial, figures: list[dict[str, float]]) -> Trial:
    """The trial's figures: the median over rounds per batch size, each round's score, their spread."""
    scores = [geometric_mean(f, trial.weights) for f in figures]
    median = float(np.median(scores))
    per_batch = {bs: float(np.median([f[bs] for f in figures])) for bs in figures[0]}
    spread = (max(scores) - min(scores)) / max(median, 1e-12)
    return replace(trial, images_per_s=per_batch, rounds=[round(s, 3) for s in scores], spread=round(spread, 4))


def tie_break(pair: tuple[str, str]) -> tuple[int, int]:
    """Where a (backend, precision) stands when leaders tie, lowest first: the bytes its towers keep
    per weight (``WEIGHT_BYTES``), then its moving parts (``MOVING_PARTS``). Equal keys fall back on
    the candidates' order (``_decide``)."""
    backend, precision = pair
    return WEIGHT_BYTES.get(precision, max(WEIGHT_BYTES.values()) + 1), MOVING_PARTS.get(backend, len(MOVING_PARTS))


def _name(trial: Trial) -> str:
    return f"{trial.backend} {trial.precision}"


def _decide(trials: list[Trial], scores: list[list[float]], elapsed: float) -> tuple[AutoDecision, int]:
    """Which measured trial serves (an index), and the decision (module doc). The reference (index 0)
    unless a candidate is clearly faster than it; among those, the leaders (the best, the largest
    median ratio to the reference, and each that it is not clearly faster than) are split by
    ``tie_break``, then by the candidates' order, never falling back on the reference. Deferred only
    when it is unclear whether any candidate beats the reference: none is clearly faster than it and
    some comparison with it is unclear; or the best is, but a candidate whose comparison with the
    reference is unclear is one that the best is not clearly faster than; or leaders tie and the
    serving one's gain over the reference is no larger than its spread and the tie's noise together."""
    rounds = len(scores[0])
    ref = trials[0]
    against_ref = {i: compare(scores[i], scores[0]) for i in range(1, len(trials))}
    faster = [i for i, (_, _, verdict) in against_ref.items() if verdict == "faster"]
    if not faster:
        unclear = [i for i, (_, _, verdict) in against_ref.items() if verdict == "unclear"]
        if not unclear:  # no candidate was faster than the reference in any round
            return AutoDecision("chosen", ref.backend, ref.precision, 1.0, 0.0, rounds, elapsed, None,
                                time.time()), 0  # fmt: skip
        doubt = max(unclear, key=lambda i: against_ref[i][0])
        margin, spread, _ = against_ref[doubt]
        reason = (f"{_name(trials[doubt])} over {_name(ref)}: {margin:.2f}x "
                  f"with a spread of {spread:.2f} over {rounds} rounds")  # fmt: skip
        return AutoDecision("deferred", ref.backend, ref.precision, margin, spread, rounds, elapsed, reason,
                            time.time()), 0  # fmt: skip
    best = max(faster, key=lambda i: (against_ref[i][0], -i))  # the largest margin; the earlier on a tie
    shadows = [i for i, (_, _, verdict) in against_ref.items()
               if verdict == "unclear" and compare(scores[best], scores[i])[2] != "faster"]  # fmt: skip
    if shadows:
        doubt = max(shadows, key=lambda i: against_ref[i][0])
        margin, spread, _ = against_ref[doubt]
        reason = (f"{_name(trials[best])} over {_name(ref)}: {against_ref[best][0]:.2f}x, but "
                  f"{_name(trials[doubt])}, which the rounds cannot tell from it, over {_name(ref)}: "
                  f"{margin:.2f}x with a spread of {spread:.2f} over {rounds} rounds")  # fmt: skip
        return AutoDecision("deferred", ref.backend, ref.precision, margin, spread, rounds, elapsed, reason,
                            time.time()), 0  # fmt: skip
    leaders = [i for i in faster if i == best or compare(scores[best], scores[i])[2] != "faster"]
    chosen = min(leaders, key=lambda i: (*tie_break((trials[i].backend, trials[i].precision)), i))
    margin, spread, _ = against_ref[chosen]
    winner = trials[chosen]
    if len(leaders) == 1:
        return AutoDecision("chosen", winner.backend, winner.precision, margin, spread, rounds, elapsed, None,
                            time.time()), chosen  # fmt: skip
    closest = [i for i in leaders if i != best]
    # The leaders' comparisons with each other show the rounds' noise too: as the rounds cannot rank
    # them, how far their median ratio strays from 1, plus its spread, is noise. The serving one's gain
    # over the reference must exceed that on top of its own comparison's spread.
    tie_noise = max(abs(m - 1) + sp for m, sp, _ in (compare(scores[best], scores[i]) for i in closest))
    if margin - 1 <= spread + tie_noise:
        reason = (f"{_name(winner)} over {_name(ref)}: {margin:.2f}x with a spread of {spread:.2f}, within "
                  f"that and the noise of {tie_noise:.2f} between the leaders "
                  f"{', '.join(_name(trials[i]) for i in leaders)}, over {rounds} rounds")  # fmt: skip
        return AutoDecision("deferred", ref.backend, ref.precision, margin, spread, rounds, elapsed, reason,
                            time.time()), 0  # fmt: skip
    why = "; ".join(_tie_against(trials, scores, best, i, rounds) for i in closest)
    reason = (f"leaders within each other's noise, all clearly faster than {_name(ref)}: "
              f"{', '.join(_name(trials[i]) for i in leaders)} ({why}); {_name(winner)} serves: "
              f"{_why_first(winner, [trials[i] for i in leaders])}")  # fmt: skip
    return AutoDecision("chosen", winner.backend, winner.precision, margin, spread, rounds, elapsed, reason,
                        time.time(), tie=tuple(_name(trials[i]) for i in leaders)), chosen  # fmt: skip


def _tie_against(trials: list[Trial], scores: list[list[float]], best: int, other: int, rounds: int) -> str:
    margin, spread, _ = compare(scores[best], scores[other])
    return (f"{_name(trials[best])} over {_name(trials[other])}: {margin:.2f}x "
            f"with a spread of {spread:.2f} over {rounds} rounds")  # fmt: skip


def _why_first(winner: Trial, leaders: list[Trial]) -> str:
    """Which rule of ``tie_break`` put ``winner`` ahead of the other leaders."""
    key = tie_break((winner.backend, winner.precision))
    others = [tie_break((t.backend, t.precision)) for t in leaders if t is not winner]
    memory = f"the least memory ({winner.precision}, bytes per weight: {WEIGHT_BYTES.get(winner.precision, '?')})"
    if all(key[0] < other[0] for other in others):
        return memory
    if all(key < other for other in others):
        return f"{memory}, then the fewest moving parts ({winner.backend})"
    return f"{memory} and the fewest moving parts ({winner.backend}), then the candidates' order"


def _read_decision(path: Path) -> tuple[tuple[str, str], AutoDecision] | None:
    try:
        record = json.loads(path.read_text())
        chosen = record["chosen"]
        pair = (str(chosen["backend"]), str(chosen["precision"]))
        kept = record.get("decision") or {}
        tie = kept.get("tie")
        decision = AutoDecision("remembered", *pair, margin=kept.get("margin"), spread=kept.get("spread"),
                                rounds=int(kept.get("rounds", 0)), seconds=float(kept.get("seconds", 0.0)),
                                reason=kept.get("reason") if tie else None, at=float(record.get("at", 0.0)),
                                tie=tuple(map(str, tie)) if tie else None)  # fmt: skip
        return pair, decision
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _write_decision(path: Path, bundle: ModelBundle, decision: AutoDecision, trials: list[Trial]) -> None:
    """Keep the decision; a deferred one is written without ``chosen`` (for operators: why), so it is
    never read back as a decision and the next load measures again."""
    record: dict[str, object] = {
        "ref": bundle.ref,
        "decision": asdict(decision),
        "trials": [asdict(t) for t in trials],
        "at": decision.at,
    }
    if decision.outcome == "chosen":
        record["chosen"] = {"backend": decision.backend, "precision": decision.precision}
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")  # pods sharing the cache never write one file
        tmp.write_text(json.dumps(record, indent=2))
        tmp.replace(path)
    except OSError as exc:  # a read-only cache costs a measurement per start, nothing more
        log.warning("auto: cannot keep the decision in %s: %s", path, exc)
