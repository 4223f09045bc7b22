"""The alias side of ``ModelStore``: read entries and logs, and move aliases through the gate.

Every move runs under the model's lock: read ``aliases.json`` with its tag, change the table,
write it back only if nobody replaced it meanwhile (a conditional PUT on S3), so a writer whose
lease expired cannot overwrite its successor's move. A move's preconditions are checked on the
table it replaces, inside that block, so they hold at the moment of the write: ``expect`` (the
alias' primary the caller saw), no other canary running (unless ``replace``), and for a rollback
what it takes out of service, or that the alias was not just rolled back by someone else.
Versions are verified (checksums, and the validator when installed, unless the version's load-check
receipt says it passed with these files: ``model_store.load_receipts``) outside the lock, since
hashing weights and building a model take a while; the gate runs inside it, against the target
the table holds at the moment of the move. A move tells its ``on_step`` what it is about to wait
for (the CLI prints it on stderr).

The gate compares the candidate's ``eval.json`` with the alias' primary's, under the model's
``gate.json`` policy (``model_store.gate``), once each report is proven to be its version's
evaluation (``model_store.evaluation``: bound to the version's weights, not copied from another).
Moves that point requests at a version (promote, canary, publish with aliases) are gated;
rollbacks and shadows are not (a rollback is the way out, and a shadow's answers are never
returned).
"""

from __future__ import annotations

import getpass
import json
import math
import socket
import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pydantic import ValidationError

from model_store.aliases import ALIASES_FILE, SCHEMA_VERSION, AliasEntry, AliasEvent, AliasTable, Stamp
from model_store.errors import GateRefused, PreconditionFailed, StoreError
from model_store.evaluation import EVAL_FILE, provenance, unbound_note
from model_store.gate import GatePolicy, GateReport, compare_reports
from model_store.manifest import utc_now_iso
from model_store.naming import validate_name

if TYPE_CHECKING:
    from model_store.backends import StorageBackend
    from model_store.manifest import Manifest

GATE_FILE = "gate.json"

GateHook = Callable[[GateReport], None]
# Told what a move is about to wait for (hashing weights, the load check, another writer's lock).
StepHook = Callable[[str], None]
# A lock taken within this is not worth a line; one held longer by another writer is.
LOCK_NOTICE_S = 1.0


def _ignore(_line: str) -> None:
    pass


@contextmanager
def _said_if_slow(on_step: StepHook | None, seconds: float, line: str) -> Iterator[None]:
    """Call ``on_step(line)`` (from a timer thread) if the block is still running after ``seconds``."""
    if on_step is None:
        yield
        return
    timer = threading.Timer(seconds, on_step, (line,))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


def default_actor() -> str | None:
    """``user@host`` of this process, when the system can say (containers may have no user name)."""
    try:
        return f"{getpass.getuser()}@{socket.gethostname()}"
    except (KeyError, OSError):
        return None


def check_reason(force: bool, reason: str | None) -> str | None:
    reason = reason.strip() if reason else None
    if force and not reason:
        raise StoreError("a forced move needs a reason (--reason): the alias history keeps it")
    return reason


@dataclass(frozen=True)
class _Evaluation:
    """A version's eval.json as the gate takes it."""

    report: dict[str, Any] | None = None  # None: no evaluation of this version
    problem: str | None = None  # unreadable: refuses like a regression
    foreign: str | None = None  # there, but not this version's (a copy)
    note: str | None = None  # taken on its word


def _parse_json(raw: bytes | None, what: str) -> tuple[dict[str, Any] | None, str | None]:
    """(report, problem): a report the gate cannot read refuses like a regression."""
    if raw is None:
        return None, None
    try:
        value = json.loads(raw)
    except ValueError as exc:
        return None, f"{what} is not valid JSON ({exc})"
    if not isinstance(value, dict):
        return None, f"{what} is not a JSON object"
    return value, None


class AliasMoves:
    """Mixin of ``ModelStore``: everything that reads or writes ``<name>/aliases.json``."""

    if TYPE_CHECKING:  # provided by ModelStore
        backend: StorageBackend

        def _lock(self, name: str, break_lock: bool = False) -> AbstractContextManager[None]: ...
        def _require_model(self, name: str) -> None: ...
        def _require_version(self, name: str, version: str) -> None: ...
        def _vkey(self, name: str, version: str, *rest: str) -> str: ...
        def _validate(
            self, manifest: Manifest, key: str, on_step: StepHook | None = None, trust_receipt: bool = False
        ) -> None: ...
        def manifest(self, name: str, version: str) -> Manifest: ...
        def verify(self, name: str, version: str) -> None: ...

    # ------------------------------------------------------------------ table I/O
    @staticmethod
    def _parse_aliases(name: str, raw: bytes) -> AliasTable:
        try:
            return AliasTable.model_validate_json(raw)
        except ValidationError as exc:
            try:
                schema = json.loads(raw).get("schema_version")
            except (ValueError, AttributeError):
                schema = None
            if isinstance(schema, int) and schema > SCHEMA_VERSION:
                raise StoreError(
                    f"{name}/{ALIASES_FILE} has schema_version {schema}, newer than this model_store reads: upgrade it"
                ) from None
            raise StoreError(f"{name}/{ALIASES_FILE} is corrupt ({exc.error_count()} errors)") from None

    def _read_aliases(self, name: str) -> AliasTable:
        try:
            raw = self.backend.read_bytes(f"{name}/{ALIASES_FILE}")
        except FileNotFoundError:
            return AliasTable()
        return self._parse_aliases(name, raw)

    def _read_aliases_tagged(self, name: str) -> tuple[AliasTable, str | None]:
        try:
            raw, tag = self.backend.read_tagged(f"{name}/{ALIASES_FILE}")
        except FileNotFoundError:
            return AliasTable(), None
        return self._parse_aliases(name, raw), tag

    def _write_aliases(self, name: str, table: AliasTable, tag: str | None) -> None:
        self.backend.put_atomic_if(f"{name}/{ALIASES_FILE}", table.to_json().encode(), tag)

    @contextmanager
    def _editing(self, name: str, break_lock: bool = False, on_step: StepHook | None = None) -> Iterator[AliasTable]:
        """The table under the model's lock, written back (conditionally) when the block succeeds.
        Callers hold nothing else: the lock is taken here (``break_lock``: see ``rollback``);
        ``on_step`` hears it when another writer holds the lock for more than ``LOCK_NOTICE_S``."""
        with ExitStack() as held:
            waiting = f"waiting for the lock of {name}: another writer (a publish or an alias move) holds it"
            with _said_if_slow(on_step, LOCK_NOTICE_S, waiting):
                held.enter_context(self._lock(name, break_lock))
            table, tag = self._read_aliases_tagged(name)
            before = table.to_json()
            yield table
            if table.to_json() != before:  # a no-op move writes nothing
                self._write_aliases(name, table, tag)

    # ------------------------------------------------------------------ reading
    def aliases(self, name: str) -> dict[str, str]:
        """Current alias -> primary version map of ``name``."""
        self._require_model(name)
        return self._read_aliases(name).targets()

    def alias_entries(self, name: str) -> dict[str, AliasEntry]:
        """Current alias -> entry (primary, canary and weight, shadow and fraction) of ``name``."""
        self._require_model(name)
        return dict(self._read_aliases(name).aliases)

    def alias_history(self, name: str) -> dict[str, list[str]]:
        """Previous targets per alias, oldest first (the last one is what ``rollback`` restores)."""
        self._require_model(name)
        return {alias: list(past) for alias, past in self._read_aliases(name).previous.items()}

    def alias_log(self, name: str, alias: str | None = None) -> dict[str, list[AliasEvent]]:
        """Every recorded move per alias (or of ``alias`` only), oldest first."""
        self._require_model(name)
        if alias is not None:
            validate_name(alias, "alias")
        log = self._read_aliases(name).history
        return {a: list(events) for a, events in log.items() if alias is None or a == alias}

    def alias_target(self, name: str, alias: str) -> str | None:
        """Cheap re-read of one alias' primary version, meant to be polled by servers that hot-swap."""
        validate_name(name, "model name")
        validate_name(alias, "alias")
        return self._read_aliases(name).target(alias)

    def alias_entry(self, name: str, alias: str) -> AliasEntry | None:
        """Cheap re-read of one alias' whole entry (one read of one small file), for servers that
        route a canary's share and run a shadow (``model_store.routing``)."""
        validate_name(name, "model name")
        validate_name(alias, "alias")
        return self._read_aliases(name).aliases.get(alias)

    # ------------------------------------------------------------------ gate
    def gate_policy(self, name: str) -> GatePolicy:
        """``<name>/gate.json`` (the default policy when there is none)."""
        self._require_model(name)
        try:
            raw = self.backend.read_bytes(f"{name}/{GATE_FILE}")
        except FileNotFoundError:
            return GatePolicy()
        try:
            return GatePolicy.model_validate_json(raw)
        except ValidationError as exc:
            raise StoreError(f"{name}/{GATE_FILE} is invalid: {exc.errors()[0]['msg']}") from None

    def set_gate_policy(self, name: str, policy: GatePolicy | None) -> None:
        """Replace ``<name>/gate.json`` (None: remove it, back to the default policy)."""
        self._require_model(name)
        with self._lock(name):
            if policy is None:
                self.backend.delete_tree(f"{name}/{GATE_FILE}")
            else:
                self.backend.put_atomic(f"{name}/{GATE_FILE}", (policy.model_dump_json(indent=2) + "\n").encode())

    def _evaluation(self, name: str, version: str) -> _Evaluation:
        """The eval.json of ``name@version`` if it is that version's evaluation (bound to its weights)."""
        try:
            raw = self.backend.read_bytes(self._vkey(name, version, EVAL_FILE))
        except FileNotFoundError:
            return _Evaluation()
        report, problem = _parse_json(raw, f"the {EVAL_FILE} of {name}@{version}")
        if report is None:
            return _Evaluation(problem=problem)
        origin = provenance(report, self.manifest(name, version))
        if not origin.belongs:
            return _Evaluation(foreign=origin.foreign)
        return _Evaluation(report=report, note=unbound_note(version) if origin.unbound else None)

    def _gate_report(self, name: str, current: str | None, candidate: str) -> GateReport:
        policy = self.gate_policy(name)
        if current is None:
            return compare_reports(None, None, candidate_version=candidate, current_version=None, policy=policy)
        ours, theirs = self._evaluation(name, current), self._evaluation(name, candidate)
        report = compare_reports(
            ours.report, theirs.report, candidate_version=candidate, current_version=current, policy=policy,
            current_missing=ours.foreign, candidate_missing=theirs.foreign,
            notes=[note for note in (ours.note, theirs.note) if note],
        )  # fmt: skip
        report.problem = ours.problem or theirs.problem or report.problem
        return report

    def gate(self, name: str, alias: str, version: str) -> GateReport:
        """What the gate says now of moving ``alias`` to ``version`` (a dry run: nothing moves)."""
        validate_name(alias, "alias")
        self._require_version(name, version)
        return self._gate_report(name, self._read_aliases(name).target(alias), version)

    def _gated_stamp(
        self, name: str, alias: str, table: AliasTable, version: str, force: bool, reason: str | None,
        actor: str | None, on_gate: GateHook | None, command: str = "", published: bool = False,
    ) -> Stamp:  # fmt: skip
        """Run the gate for moving ``alias`` to ``version``; raise ``GateRefused`` unless it passes
        or the move is forced (``command``: how to force it, for the message)."""
        report = self._gate_report(name, table.target(alias), version)
        if on_gate is not None:
            on_gate(report)
        if not report.passed and not force:
            done = f"published {name}@{version}, but " if published else ""
            command = command or f"model-store promote {name}@{version} --alias {alias}"
            raise GateRefused(
                f"{done}refusing to point {name}@{alias} at {version}: {_failures(report)}; "
                f"to move it anyway: {command} --force --reason '...'",
                report,
            )
        return Stamp(at=utc_now_iso(), actor=actor or default_actor(), reason=reason, forced=force,
                     gate=report.verdict())  # fmt: skip

    def _checked(self, name: str, version: str, on_step: StepHook | None = None) -> None:
        """Checksums and the validator, outside the lock (hashing weights can take a while); the
        validator only when no receipt says it passed these files (``model_store.load_receipts``)."""
        self._verified(name, version, on_step)
        self._validate(self.manifest(name, version), self._vkey(name, version), on_step, trust_receipt=True)

    def _verified(self, name: str, version: str, on_step: StepHook | None) -> None:
        manifest = self.manifest(name, version)
        (on_step or _ignore)(
            f"verifying {name}@{version}: sha256 of {len(manifest.files)} files ({manifest.total_bytes:,} bytes)"
        )
        self.verify(name, version)

    # ------------------------------------------------------------------ moves
    def promote(
        self, name: str, alias: str, version: str, *, force: bool = False, reason: str | None = None,
        actor: str | None = None, on_gate: GateHook | None = None, expect: str | None = None,
        on_step: StepHook | None = None,
    ) -> str | None:  # fmt: skip
        """Point ``alias`` at a verified ``version`` that passes the gate (or ``force`` with a
        ``reason``); return the previous primary (kept for rollback). Promoting a running canary's
        version ends the canary at 100 %. ``expect``: the primary the alias must have at the
        moment of the write (``NOWHERE``: none), else ``PreconditionFailed``."""
        validate_name(alias, "alias")
        reason = check_reason(force, reason)
        self._expecting(name, alias, expect)
        self._checked(name, version, on_step)
        with self._editing(name, on_step=on_step) as table:
            self._require_version(name, version)  # may have been collected meanwhile
            table.check_expect(alias, expect)
            previous = table.target(alias)
            table.check_promote(alias, version)
            entry = table.aliases.get(alias)
            if entry is not None and entry.version == version:
                return previous  # already there: nothing gated, nothing logged
            stamp = self._gated_stamp(name, alias, table, version, force, reason, actor, on_gate)
            table.set(alias, version, stamp)
        return previous

    def canary(
        self, name: str, alias: str, version: str, weight: float, *, force: bool = False, reason: str | None = None,
        actor: str | None = None, on_gate: GateHook | None = None, expect: str | None = None, replace: bool = False,
        on_step: StepHook | None = None,
    ) -> AliasEntry:  # fmt: skip
        """Give a verified ``version`` ``weight`` percent (0 < weight < 100) of ``alias``' requests,
        beside its primary, if it passes the gate against the primary (or ``force`` with a
        ``reason``); start a canary or change its weight. A canary of another version is replaced
        only with ``replace``, else ``PreconditionFailed``; so is a primary other than ``expect``.
        End it with ``promote`` (100 %) or ``rollback`` (0 %)."""
        validate_name(alias, "alias")
        reason = check_reason(force, reason)
        if not (math.isfinite(weight) and 0 < weight < 100):
            raise StoreError(f"a canary's weight is a percentage strictly between 0 and 100, got {weight:g}")
        self._expecting(name, alias, expect, lambda table: table.check_canary(alias, version, weight, replace))
        self._checked(name, version, on_step)
        with self._editing(name, on_step=on_step) as table:
            self._require_version(name, version)
            table.check_expect(alias, expect)
            table.check_canary(alias, version, weight, replace)
            current = table.aliases[alias].canary
            if current is not None and (current.version, current.weight) == (version, weight):
                return table.aliases[alias]
            command = f"model-store canary {name} {version} --alias {alias} --weight {weight:g}"
            stamp = self._gated_stamp(name, alias, table, version, force, reason, actor, on_gate, command)
            table.start_canary(alias, version, weight, stamp, replace)
            return table.aliases[alias]

    def shadow(
        self, name: str, alias: str, version: str | None, fraction: float = 0.1, *, reason: str | None = None,
        actor: str | None = None, expect: str | None = None, on_step: StepHook | None = None,
    ) -> AliasEntry:  # fmt: skip
        """Re-run ``fraction`` (0 < f <= 1) of ``alias``' requests on a verified ``version`` after
        answering them (``version=None`` removes the shadow). Not gated: its answers are only
        compared. ``expect``: the primary the alias must have, as for ``promote``."""
        validate_name(alias, "alias")
        if version is not None:
            if not (math.isfinite(fraction) and 0 < fraction <= 1):
                raise StoreError(f"a shadow's fraction is in (0, 1], got {fraction:g}")
            self._expecting(name, alias, expect)
            self._checked(name, version, on_step)
        else:
            self._require_model(name)
        with self._editing(name, on_step=on_step) as table:
            table.check_expect(alias, expect)
            if version is not None:
                self._require_version(name, version)
            stamp = Stamp(at=utc_now_iso(), actor=actor or default_actor(), reason=check_reason(False, reason))
            table.set_shadow(alias, version, fraction, stamp)
            entry = table.aliases[alias]
        return entry

    def rollback(
        self, name: str, alias: str, *, reason: str | None = None, actor: str | None = None,
        expect: str | None = None, break_lock: bool = False, on_step: StepHook | None = None,
    ) -> str:  # fmt: skip
        """End a running canary at 0 % (the primary, already serving, answers everything again), or
        else return ``alias`` to its previous version after verifying it; return the version that
        now answers everything. Never gated: it is the way out.

        Applies once: ``expect`` names the version the rollback takes out of service (the canary's
        while one runs, else the primary: what its history event records as ``from``); without it,
        a rollback right after another one (by anyone) is refused, so two operators rolling back
        the same incident do not also roll back the version before it. Either way the alias must
        not move between this call's read and its write. Refusals raise ``PreconditionFailed``.

        ``break_lock``: for emergencies, take the model's lock over from its holder at once instead
        of waiting for its lease to run out (S3; a local lock dies with its holder). The alias
        table's conditional write still refuses to overwrite a move the holder made meanwhile."""
        self._require_model(name)
        validate_name(alias, "alias")
        reason = check_reason(False, reason)
        before = self._read_aliases(name)
        source = before.check_rollback(alias, expect)
        target = before.rollback_target(alias)
        entry = before.aliases.get(alias)
        assert target is not None and entry is not None  # check_rollback found something to roll back
        if entry.canary is None:
            self._verified(name, target, on_step)
        with self._editing(name, break_lock, on_step) as table:
            if table.aliases.get(alias) != entry or table.rollback_target(alias) != target:
                raise PreconditionFailed(
                    f"{alias} moved while this rollback of {source} was being checked (it now serves "
                    f"{table.serving(alias)}): nothing rolled back{table.describe_move(alias)}"
                )
            stamp = Stamp(at=utc_now_iso(), actor=actor or default_actor(), reason=reason)
            table.rollback(alias, stamp, expect=source)
        return target

    def _expecting(
        self, name: str, alias: str, expect: str | None, check: Callable[[AliasTable], None] | None = None
    ) -> None:
        """Fail fast, before verifying weights, when the alias is already not as the caller expects
        (the checks that count run again on the table the move replaces)."""
        if expect is None and check is None:
            return
        table = self._read_aliases(name)
        table.check_expect(alias, expect)
        if check is not None:
            check(table)

    def _point_published(
        self, name: str, version: str, aliases: Sequence[str], on_gate: GateHook | None = None, force: bool = False,
        reason: str | None = None,
    ) -> None:  # fmt: skip
        """Point ``aliases`` at a version ``publish`` just committed; the caller holds the lock.
        All or none: if the gate refuses one alias, none moves (the version stays published)."""
        table, tag = self._read_aliases_tagged(name)
        stamps: dict[str, Stamp] = {}
        for alias in aliases:
            if table.target(alias) == version or alias in stamps:
                continue
            try:
                table.check_promote(alias, version)
            except StoreError as exc:
                raise StoreError(f"published {name}@{version}, but did not move {alias}: {exc}") from None
            stamps[alias] = self._gated_stamp(name, alias, table, version, force, reason, None, on_gate, published=True)
        for alias, stamp in stamps.items():
            table.set(alias, version, stamp)
        if stamps:
            self._write_aliases(name, table, tag)


def _failures(report: GateReport) -> str:
    if report.problem is not None:
        return report.problem
    parts = []
    for row in report.rows:
        if row.verdict == "regressed":
            parts.append(f"{row.figure} {row.current:.4f} -> {row.candidate:.4f} (tolerance {row.tolerance:.4f})")
        elif row.verdict == "below minimum":
            parts.append(f"{row.figure} {row.candidate:.4f} below the policy's minimum {row.minimum:g}")
        elif row.verdict == "missing":
            parts.append(f"{row.figure} missing")
    head = report.summary().removeprefix("gate: ")
    if report.compared == 0 and report.missing and report.note is not None:
        return head  # the candidate has no (valid) eval.json: every figure is missing, the note says why once
    shown = "; ".join(parts[:5]) + (f"; and {len(parts) - 5} more" if len(parts) > 5 else "")
    return f"{head} ({shown})" if shown else head
