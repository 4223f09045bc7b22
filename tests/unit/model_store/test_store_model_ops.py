"""Model operations on a real store (a directory and a real S3 server): the gated promotion, the
canary and the shadow in the alias table, the alias log, schema 1 migration, GC and conditional writes."""

from __future__ import annotations

import json
import threading
from typing import Any

import pytest
from conftest import Root
from model_store_helpers import (
    NEGATION,
    default_eval,
    evaluated_files,
    manifest_fields,
    negation_fell,
    publish_evaluated,
    publish_simple,
    write_eval,
)

from model_store import ModelStore, PreconditionFailed, StoreError
from model_store.aliases import AliasEntry, Stamp
from model_store.errors import GateRefused, WriteConflict
from model_store.gate import GatePolicy


def annex(report: dict[str, Any]) -> bytes:
    return json.dumps(report).encode()


@pytest.fixture
def evaluated(store: ModelStore) -> ModelStore:
    """v1 the baseline; v2 its negation figure fell; v3 and v4 as good; v5 without eval.json."""
    base = default_eval()
    for i, report in enumerate((base, negation_fell(base), base, base, None)):
        version = publish_simple(store, f"weights {i}".encode())
        if report is not None:
            write_eval(store, "clip", version, report)
    return store


@pytest.mark.slow
def test_the_gate_refuses_a_negation_drop_until_forced_with_a_reason(evaluated: ModelStore, root: Root) -> None:
    assert evaluated.promote("clip", "production", "v1") is None
    first = evaluated.alias_log("clip")["production"][-1]
    assert first.action == "promote" and first.gate is not None and first.gate.result == "not gated"

    shown = []
    with pytest.raises(GateRefused, match=NEGATION) as refused:
        evaluated.promote("clip", "production", "v2", on_gate=shown.append)
    assert refused.value.report.regressed == [NEGATION] and shown == [refused.value.report]
    assert evaluated.alias_target("clip", "production") == "v1"
    assert len(evaluated.alias_log("clip")["production"]) == 1  # a refusal writes nothing

    with pytest.raises(StoreError, match="reason"):
        evaluated.promote("clip", "production", "v2", force=True)
    assert evaluated.promote("clip", "production", "v2", force=True, reason="negation traded for recall") == "v1"
    forced = evaluated.alias_log("clip")["production"][-1]
    assert (forced.action, forced.from_, forced.to, forced.forced) == ("promote", "v1", "v2", True)
    assert forced.reason == "negation traded for recall" and forced.actor and "@" in forced.actor
    assert forced.gate is not None and forced.gate.result == "fail" and forced.gate.regressed == [NEGATION]
    assert forced.at is not None and forced.at.endswith("Z")

    assert evaluated.rollback("clip", "production") == "v1"
    back = evaluated.alias_log("clip")["production"][-1]
    assert (back.action, back.from_, back.to, back.gate) == ("rollback", "v2", "v1", None)
    assert evaluated.alias_target("clip", "production") == "v1"
    on_disk = json.loads(root.read("clip/aliases.json"))
    assert on_disk["schema_version"] == 2 and on_disk["history"]["production"][1]["from"] == "v1"


def test_candidates_without_the_figures_and_unreadable_reports_are_refused(evaluated: ModelStore) -> None:
    evaluated.promote("clip", "production", "v1")
    with pytest.raises(GateRefused, match="v5 has no eval.json") as refused:
        evaluated.promote("clip", "production", "v5")
    assert len(refused.value.report.missing) > 300
    evaluated.write_annex("clip", "v3", "eval.json", b"{not json")
    with pytest.raises(GateRefused, match="not valid JSON"):
        evaluated.promote("clip", "production", "v3")
    evaluated.promote("clip", "staging", "v5")  # first target of staging: not gated
    evaluated.promote("clip", "staging", "v4")  # v5 has no eval.json: nothing to hold v4 against, v4 has one
    gate = evaluated.alias_log("clip")["staging"][-1].gate
    assert gate is not None and gate.result == "not gated"
    assert gate.note == "v5 has no eval.json: nothing to compare with; v4's evaluation is the reference from now on"


def test_an_evaluation_copied_from_other_weights_is_no_evaluation(evaluated: ModelStore, root: Root) -> None:
    evaluated.promote("clip", "production", "v1")
    root.write("clip/versions/v5/eval.json", root.read("clip/versions/v1/eval.json"))  # v1's figures, v5's weights
    with pytest.raises(GateRefused, match=r"the eval.json of v5 belongs to other weights \(v1's\)") as refused:
        evaluated.promote("clip", "production", "v5")
    assert refused.value.report.compared == 0 and len(refused.value.report.missing) > 300
    assert evaluated.alias_target("clip", "production") == "v1"

    # A copy in the current target is no evaluation either: the candidate must bring its own.
    evaluated.promote("clip", "staging", "v5")  # first target
    assert evaluated.gate("clip", "staging", "v3").passed
    unevaluated = publish_simple(evaluated, b"random weights")
    report = evaluated.gate("clip", "staging", unevaluated)
    assert not report.passed and report.problem is not None
    assert "neither v5 nor v6 has an evaluation" in report.problem and "belongs to other weights" in report.problem


def test_a_forced_move_does_not_switch_the_gate_off(evaluated: ModelStore) -> None:
    evaluated.promote("clip", "production", "v1")
    evaluated.promote("clip", "production", "v5", force=True, reason="plumbing test on unevaluated weights")
    forced = evaluated.alias_log("clip")["production"][-1]
    assert forced.forced and forced.gate is not None and forced.gate.result == "fail"
    assert forced.gate.missing_count is not None and forced.gate.missing_count > 300  # every figure, counted
    assert len(forced.gate.missing) == 20  # the names kept are capped
    unevaluated = publish_simple(evaluated, b"random weights")
    with pytest.raises(GateRefused, match="neither v5 nor v6 has an evaluation to gate the move"):
        evaluated.promote("clip", "production", unevaluated)
    assert evaluated.alias_target("clip", "production") == "v5"
    evaluated.promote("clip", "production", "v3")  # an evaluated candidate restores the reference
    moved = evaluated.alias_log("clip")["production"][-1]
    assert moved.gate is not None and moved.gate.result == "not gated" and not moved.forced
    assert "v3's evaluation is the reference from now on" in (moved.gate.note or "")
    with pytest.raises(GateRefused, match="v2"):
        evaluated.promote("clip", "production", "v2")  # gated against v3 again


def test_evaluations_written_before_the_binding_are_taken_on_their_word(evaluated: ModelStore, root: Root) -> None:
    legacy = {"model": "clip@v1", **{k: v for k, v in default_eval().items() if k not in ("model", "version")}}
    root.write("clip/versions/v1/eval.json", annex(legacy))
    evaluated.promote("clip", "production", "v1")
    report = evaluated.gate("clip", "production", "v3")
    assert report.passed and report.compared > 300
    assert "the eval.json of v1 records no weights" in (report.note or "")
    evaluated.promote("clip", "production", "v3")
    gate = evaluated.alias_log("clip")["production"][-1].gate
    assert gate is not None and gate.result == "pass" and "records no weights" in (gate.note or "")
    root.write("clip/versions/v4/eval.json", annex(legacy))  # names clip@v1: a copy
    with pytest.raises(GateRefused, match="the eval.json of v4 was written for clip@v1"):
        evaluated.promote("clip", "production", "v4")


def test_the_models_policy_sets_tolerances(evaluated: ModelStore, root: Root) -> None:
    evaluated.promote("clip", "production", "v1")
    assert not evaluated.gate("clip", "production", "v2").passed
    evaluated.set_gate_policy("clip", GatePolicy(tolerance={"pcclip.semclip.*": 0.2}))
    assert json.loads(root.read("clip/gate.json"))["tolerance"] == {"pcclip.semclip.*": 0.2}
    assert evaluated.gate("clip", "production", "v2").passed
    evaluated.promote("clip", "production", "v2")
    evaluated.set_gate_policy("clip", None)
    assert evaluated.gate_policy("clip") == GatePolicy()
    root.write("clip/gate.json", b'{"tolerance": {"x": -1}}')
    with pytest.raises(StoreError, match="gate.json is invalid"):
        evaluated.gate("clip", "production", "v3")


def test_canary_start_weight_rollback_and_promote(evaluated: ModelStore, root: Root) -> None:
    with pytest.raises(StoreError, match="points nowhere"):
        evaluated.canary("clip", "production", "v3", 10)
    evaluated.promote("clip", "production", "v1")
    entry = evaluated.canary("clip", "production", "v3", 10)
    assert entry.version == "v1" and entry.canary is not None and (entry.canary.version, entry.canary.weight) == (
        "v3", 10
    )  # fmt: skip
    assert evaluated.alias_target("clip", "production") == "v1"  # today's servers keep serving the primary
    assert evaluated.alias_entry("clip", "production") == entry
    assert evaluated.aliases("clip") == {"production": "v1"}
    raw = json.loads(root.read("clip/aliases.json"))["aliases"]["production"]
    assert raw == {"version": "v1", "canary": {"version": "v3", "weight": 10.0}, "shadow": None}

    evaluated.canary("clip", "production", "v3", 25)
    moved = evaluated.alias_log("clip")["production"][-1]
    assert moved.action == "canary-weight" and moved.weights == {"v1": 75.0, "v3": 25.0}
    assert moved.gate is not None and moved.gate.result == "pass" and moved.gate.compared > 300
    for weight in (0, 100, -5):
        with pytest.raises(StoreError, match="between 0 and 100"):
            evaluated.canary("clip", "production", "v3", weight)
    with pytest.raises(PreconditionFailed, match="a canary of v3 already runs on production .*--replace"):
        evaluated.canary("clip", "production", "v4", 10)  # another version's canary is not replaced silently
    with pytest.raises(GateRefused):
        evaluated.canary("clip", "production", "v2", 10, replace=True)  # a regressed version gets no traffic either
    with pytest.raises(StoreError, match="a canary of v3 runs"):
        evaluated.promote("clip", "production", "v4")

    assert evaluated.rollback("clip", "production") == "v1"  # ends the canary at 0 %
    ended = evaluated.alias_log("clip")["production"][-1]
    assert (ended.action, ended.from_, ended.to) == ("canary-rollback", "v3", "v1")
    assert evaluated.alias_entry("clip", "production").canary is None  # type: ignore[union-attr]
    assert evaluated.alias_history("clip") == {}  # the primary never moved

    evaluated.canary("clip", "production", "v3", 10)
    assert evaluated.promote("clip", "production", "v3") == "v1"  # ends the canary at 100 %
    promoted = evaluated.alias_log("clip")["production"][-1]
    assert (promoted.action, promoted.from_, promoted.to) == ("canary-promote", "v1", "v3")
    assert evaluated.alias_entry("clip", "production").canary is None  # type: ignore[union-attr]
    assert evaluated.alias_history("clip") == {"production": ["v1"]}
    assert evaluated.rollback("clip", "production") == "v1"
    actions = [e.action for e in evaluated.alias_log("clip", "production")["production"]]
    assert actions == ["promote", "canary-start", "canary-weight", "canary-rollback", "canary-start",
                       "canary-promote", "rollback"]  # fmt: skip


def test_shadow_set_change_and_remove(evaluated: ModelStore) -> None:
    with pytest.raises(StoreError, match="points nowhere"):
        evaluated.shadow("clip", "production", "v2", 0.2)
    evaluated.promote("clip", "production", "v1")
    entry = evaluated.shadow("clip", "production", "v2", 0.2)  # not gated: its answers are only compared
    assert entry.shadow is not None and (entry.shadow.version, entry.shadow.fraction) == ("v2", 0.2)
    assert evaluated.alias_target("clip", "production") == "v1"
    evaluated.shadow("clip", "production", "v2", 0.5)
    for bad in (0.0, 1.5):
        with pytest.raises(StoreError, match="fraction"):
            evaluated.shadow("clip", "production", "v2", bad)
    with pytest.raises(StoreError, match="primary"):
        evaluated.shadow("clip", "production", "v1", 0.2)
    assert evaluated.shadow("clip", "production", None).shadow is None
    log = evaluated.alias_log("clip")["production"]
    assert [(e.action, e.from_, e.to, e.fraction) for e in log[1:]] == [
        ("shadow-start", None, "v2", 0.2), ("shadow-start", "v2", "v2", 0.5), ("shadow-end", "v2", None, None)
    ]  # fmt: skip
    assert evaluated.shadow("clip", "production", None).shadow is None  # removing nothing logs nothing
    assert len(evaluated.alias_log("clip")["production"]) == 4


def test_gc_keeps_what_aliases_serve_shadow_and_may_roll_back_to(evaluated: ModelStore) -> None:
    evaluated.promote("clip", "production", "v1")
    evaluated.promote("clip", "production", "v3")  # v1: a rollback target
    evaluated.canary("clip", "production", "v4", 5)
    evaluated.shadow("clip", "production", "v2", 0.1)
    assert evaluated.gc("clip", dry_run=True) == ["v5"]
    evaluated.rollback("clip", "production")  # the canary ends: v4 is free
    evaluated.shadow("clip", "production", None)  # and so is v2
    assert evaluated.gc("clip") == ["v2", "v4", "v5"]
    assert evaluated.rollback("clip", "production", expect="v3") == "v1"  # right after a rollback: said so


def test_schema_1_tables_are_migrated_on_read(store: ModelStore, root: Root) -> None:
    for payload in (b"one", b"two", b"three", b"four"):
        publish_simple(store, payload)
    v1_table = {"schema_version": 1, "aliases": {"production": "v3", "staging": "v1"},
                "history": {"production": ["v1", "v2"]}}  # fmt: skip
    root.write("clip/aliases.json", json.dumps(v1_table).encode())
    assert store.aliases("clip") == {"production": "v3", "staging": "v1"}
    assert store.alias_target("clip", "production") == "v3"
    assert store.alias_history("clip") == {"production": ["v1", "v2"]}
    log = store.alias_log("clip")
    assert [(e.at, e.action, e.from_, e.to) for e in log["production"]] == [
        (None, "promote", "v1", "v2"), (None, "promote", "v2", "v3")
    ]  # fmt: skip
    assert "staging" not in log
    assert json.loads(root.read("clip/aliases.json"))["schema_version"] == 1  # reading writes nothing
    assert store.gc("clip", dry_run=True) == ["v4"]  # old history still pins what a rollback may need

    assert store.rollback("clip", "production") == "v2"
    written = json.loads(root.read("clip/aliases.json"))
    assert written["schema_version"] == 2 and written["previous"] == {"production": ["v1"]}
    assert written["aliases"]["staging"] == {"version": "v1", "canary": None, "shadow": None}
    assert [e["action"] for e in written["history"]["production"]] == ["promote", "promote", "rollback"]
    root.write("clip/aliases.json", json.dumps({**written, "schema_version": 3}).encode())
    with pytest.raises(StoreError, match="schema_version 3, newer"):
        store.aliases("clip")


def test_publish_with_aliases_goes_through_the_gate(store: ModelStore) -> None:
    base = default_eval()
    store.publish("clip", evaluated_files(b"one", base), manifest_fields(), aliases=["production", "staging"])
    worse = evaluated_files(b"two", negation_fell(base))
    with pytest.raises(GateRefused, match=r"published clip@v2, but refusing to point clip@staging"):
        store.publish("clip", worse, manifest_fields(), aliases=["staging", "production"])
    assert store.list_versions("clip") == ["v1", "v2"]  # the version stays, no alias moved
    assert store.aliases("clip") == {"production": "v1", "staging": "v1"}
    with pytest.raises(GateRefused, match="v3 has no eval.json"):
        store.publish("clip", {"model.safetensors": b"three"}, manifest_fields(), aliases=["production"])
    copied = {"model.safetensors": b"four", "eval.json": annex(base)}  # default@v6's evaluation: not of these weights
    with pytest.raises(GateRefused, match=r"the eval.json of v4 belongs to other weights \(default@v6's\)"):
        store.publish("clip", copied, manifest_fields(), aliases=["production"])
    store.publish("clip", evaluated_files(b"five", base), manifest_fields(), aliases=["production"])
    assert store.aliases("clip") == {"production": "v5", "staging": "v1"}
    event = store.alias_log("clip")["production"][-1]
    assert event.gate is not None and event.gate.result == "pass" and event.gate.against == "v1"


def test_a_writer_whose_lock_was_lost_cannot_overwrite_the_table(three_versions: ModelStore, root: Root) -> None:
    store = three_versions
    store.promote("clip", "production", "v1")
    backend = store.backend
    raw, tag = backend.read_tagged("clip/aliases.json")
    store.promote("clip", "production", "v2")  # the lock's next holder moves the alias
    with pytest.raises(WriteConflict):
        backend.put_atomic_if("clip/aliases.json", raw, tag)  # the stalled writer's late write
    with pytest.raises(WriteConflict):
        backend.put_atomic_if("clip/aliases.json", raw, None)  # "create" of a table that exists
    assert store.alias_target("clip", "production") == "v2"

    behind = json.loads(root.read("clip/aliases.json"))
    behind["aliases"]["production"]["version"] = "v3"
    with pytest.raises(WriteConflict), store._editing("clip") as table:
        table.set_shadow("production", "v3", 0.5, Stamp(at="2025-01-01T00:00:00Z"))
        root.write("clip/aliases.json", json.dumps(behind).encode())  # replaced behind the lock's back
    assert store.alias_entry("clip", "production") == AliasEntry(version="v3")  # that write was kept
    backend.put_atomic_if("clip/new.json", b"{}", None)
    with pytest.raises(WriteConflict):
        backend.put_atomic_if("clip/new.json", b"{}", None)


def test_concurrent_moves_lose_no_event(three_versions: ModelStore, root: Root) -> None:
    three_versions.promote("clip", "production", "v1")
    barrier = threading.Barrier(6)
    errors: list[BaseException] = []

    def move(i: int) -> None:
        try:
            barrier.wait()
            other = root.store()  # separate store objects, as separate processes would have
            if i % 3 == 0:
                other.promote("clip", f"alias{i}", "v2", reason=f"mover {i}")
            elif i % 3 == 1:
                other.shadow("clip", "production", f"v{i % 2 + 2}", 0.1 * i, reason=f"mover {i}")
            else:
                other.canary("clip", "production", "v3", float(i), reason=f"mover {i}")
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=move, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    log = three_versions.alias_log("clip")
    reasons = {e.reason for events in log.values() for e in events if e.reason}
    assert reasons == {f"mover {i}" for i in range(6)}
    assert three_versions.aliases("clip") == {"production": "v1", "alias0": "v2", "alias3": "v2"}


@pytest.fixture
def three_versions(store: ModelStore) -> ModelStore:
    for payload in (b"one", b"two", b"three"):
        publish_evaluated(store, payload)
    return store
