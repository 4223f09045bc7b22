"""Alias moves that state what they expect, and cannot be turned against each other: ``--expect``
checked with the write, a second canary refused unless it replaces the first, a rollback that
applies once (on a directory and a real S3 server), and ``rollback --break-lock`` on S3."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import Root
from model_store_helpers import publish_evaluated
from store_roots import S3Root
from typer.testing import CliRunner

from model_store import AliasEntry, Canary, ModelStore, PreconditionFailed, StoreError, open_backend
from model_store.backends.s3 import S3Backend
from model_store.cli import app


@pytest.fixture
def four(store: ModelStore) -> ModelStore:
    """v1 to v4, each with an evaluation of one figure; production at v1."""
    for payload in (b"one", b"two", b"three", b"four"):
        publish_evaluated(store, payload)
    store.promote("clip", "production", "v1")
    return store


def race(root: Root, *moves: Callable[[ModelStore], Any]) -> list[BaseException | None]:
    """Run ``moves`` at once, each on its own store object (as separate processes would have):
    what each raised (None: it applied)."""
    barrier = threading.Barrier(len(moves))
    outcomes: list[BaseException | None] = [None] * len(moves)

    def run(i: int) -> None:
        store = root.store()
        barrier.wait()
        try:
            moves[i](store)
        except BaseException as exc:  # reported to the test
            outcomes[i] = exc

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(moves))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


def one_applied(outcomes: list[BaseException | None]) -> None:
    applied = [o for o in outcomes if o is None]
    refused = [o for o in outcomes if o is not None]
    assert len(applied) == 1, outcomes
    assert all(isinstance(o, PreconditionFailed) for o in refused), refused


# ------------------------------------------------------------------ --expect
def test_a_move_applies_only_where_the_alias_is_as_expected(four: ModelStore) -> None:
    with pytest.raises(PreconditionFailed, match="production points at v1, not v2 as expected: nothing moved"):
        four.promote("clip", "production", "v3", expect="v2")
    with pytest.raises(PreconditionFailed, match="points at v1, not nowhere"):
        four.promote("clip", "production", "v3", expect="-")
    with pytest.raises(PreconditionFailed, match="not v2 as expected"):
        four.canary("clip", "production", "v3", 10, expect="v2")
    with pytest.raises(PreconditionFailed, match="not v2 as expected"):
        four.shadow("clip", "production", "v3", 0.5, expect="v2")
    assert four.alias_entry("clip", "production") == AliasEntry(version="v1")
    assert len(four.alias_log("clip")["production"]) == 1  # a refusal writes nothing

    assert four.promote("clip", "staging", "v2", expect="-") is None  # a new alias: it points nowhere yet
    assert four.promote("clip", "production", "v2", expect="v1") == "v1"
    with pytest.raises(PreconditionFailed, match=r"points at v2, not v1 as expected: .*last move: promote v1 -> v2"):
        four.promote("clip", "production", "v3", expect="v1")  # the second of two promotes from v1


def test_expect_is_checked_with_the_write_not_only_before(four: ModelStore, root: Root) -> None:
    # Another writer moves the alias while this promote hashes its weights (outside the lock).
    checked = four._checked

    def meanwhile(name: str, version: str, *rest: Any) -> None:
        checked(name, version, *rest)
        root.store().promote("clip", "production", "v2")

    four._checked = meanwhile  # type: ignore[method-assign]
    with pytest.raises(PreconditionFailed, match="points at v2, not v1 as expected"):
        four.promote("clip", "production", "v3", expect="v1")
    assert four.alias_target("clip", "production") == "v2"


# ------------------------------------------------------------------ canary
def test_a_second_canary_is_refused_unless_it_replaces_the_first(four: ModelStore) -> None:
    four.canary("clip", "production", "v2", 10, reason="first")
    with pytest.raises(PreconditionFailed, match=r"a canary of v2 already runs on production \(10 %, started by "):
        four.canary("clip", "production", "v3", 20)
    four.canary("clip", "production", "v2", 30)  # its own canary's weight: not a replacement
    entry = four.canary("clip", "production", "v3", 20, replace=True, reason="v2 leaks memory")
    assert entry.canary == Canary(version="v3", weight=20)
    replaced = four.alias_log("clip")["production"][-1]
    assert (replaced.action, replaced.to, replaced.reason) == ("canary-start", "v3", "v2 leaks memory")


def test_two_canaries_at_once_one_applies(four: ModelStore, root: Root) -> None:
    outcomes = race(
        root,
        lambda store: store.canary("clip", "production", "v2", 10),
        lambda store: store.canary("clip", "production", "v3", 10),
    )
    one_applied(outcomes)
    winner = "v2" if outcomes[0] is None else "v3"
    assert four.alias_entry("clip", "production") == AliasEntry(version="v1", canary=Canary(version=winner, weight=10))
    assert [e.action for e in four.alias_log("clip")["production"]] == ["promote", "canary-start"]


# ------------------------------------------------------------------ rollback
def test_a_rollback_applies_once(four: ModelStore) -> None:
    four.promote("clip", "production", "v2")
    four.canary("clip", "production", "v3", 10)
    assert four.rollback("clip", "production", reason="errors up") == "v2"  # the canary ends
    with pytest.raises(PreconditionFailed, match=r"already rolled back \(canary-rollback v3 -> v2 by "):
        four.rollback("clip", "production")  # the second operator's: the primary stays
    with pytest.raises(PreconditionFailed, match="expected to take v3 out of service, but production serves v2"):
        four.rollback("clip", "production", expect="v3")
    assert four.alias_entry("clip", "production") == AliasEntry(version="v2")
    assert four.rollback("clip", "production", expect="v2") == "v1"  # on purpose, one step further
    back = four.alias_log("clip")["production"][-1]
    assert (back.action, back.from_, back.to) == ("rollback", "v2", "v1")  # what it rolled back from


@pytest.mark.parametrize("canary", [True, False], ids=["canary", "primary"])
def test_two_rollbacks_at_once_one_applies(four: ModelStore, root: Root, canary: bool) -> None:
    four.promote("clip", "production", "v2")
    if canary:
        four.canary("clip", "production", "v3", 10)
    else:
        four.promote("clip", "production", "v3")
    outcomes = race(root, *[lambda store: store.rollback("clip", "production")] * 2)
    one_applied(outcomes)
    assert four.alias_entry("clip", "production") == AliasEntry(version="v2")
    assert four.alias_history("clip") == {"production": ["v1"]}
    actions = [e.action for e in four.alias_log("clip")["production"]]
    assert actions[-1] == ("canary-rollback" if canary else "rollback") and actions.count(actions[-1]) == 1


def test_the_command_line_exits_3_when_a_precondition_fails(four: ModelStore, root: Root) -> None:
    runner = CliRunner(env={"COLUMNS": "200", "NO_COLOR": "1"})

    def run(*args: str) -> Any:
        return runner.invoke(app, ["--store", root.location, "--no-load-check", *args])

    result = run("promote", "clip@v2", "--expect", "v3")
    assert result.exit_code == 3 and "production points at v1, not v3 as expected" in result.output
    assert run("promote", "clip@v2", "--expect", "v1").exit_code == 0
    assert run("canary", "clip", "v3", "--weight", "10", "--expect", "v2").exit_code == 0
    result = run("canary", "clip", "v4", "--weight", "10")
    assert result.exit_code == 3 and "a canary of v3 already runs" in result.output and "--replace" in result.output
    assert run("canary", "clip", "v4", "--weight", "10", "--replace").exit_code == 0
    result = run("rollback", "clip", "--break-lock")  # nobody holds the lock: it rolls back
    assert result.exit_code == 0 and "canary v4 ended at 0 % -> v2" in result.output
    result = run("rollback", "clip")
    assert result.exit_code == 3 and "already rolled back" in result.output and "--expect v2" in result.output
    assert "nothing rolled back" in result.output and four.alias_entry("clip", "production") == AliasEntry(version="v2")
    result = run("promote", "clip@v9")
    assert result.exit_code == 1  # other errors keep exit code 1


# ------------------------------------------------------------------ rollback --break-lock
@pytest.fixture
def s3_root(s3_env: Any) -> S3Root:
    return S3Root(s3_env, s3_env.new_location())


@pytest.mark.slow
def test_rollback_break_lock_takes_a_live_holders_lock(s3_root: S3Root, tmp_path: Path) -> None:
    store = s3_root.store()
    for payload in (b"one", b"two"):
        publish_evaluated(store, payload, aliases=["production"])
    # A holder on another machine, renewing a long lease: a plain rollback would wait for it.
    elsewhere = {"owner": "other-host:7:abc", "lease_s": 3600, "host": "other-host", "pid": 7}
    s3_root.write("clip/.lock", json.dumps(elsewhere).encode())
    backend = open_backend(s3_root.location, tmp_path / "cache")
    assert isinstance(backend, S3Backend)
    backend.lock_wait_s = 1.0
    with pytest.raises(StoreError, match="timed out"):
        ModelStore(backend).rollback("clip", "production")
    backend.lock_wait_s = 60
    assert ModelStore(backend).rollback("clip", "production", break_lock=True, reason="outage") == "v1"
    assert store.alias_target("clip", "production") == "v1"
    assert not s3_root.exists("clip/.lock")  # released after the rollback
