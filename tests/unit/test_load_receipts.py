"""Alias moves say what they wait for, and trust the load check a version already passed
(``model_store.load_receipts``), on a real store with the installed validator and a tiny model.

A version published through the load check keeps a receipt; a move to it hashes its files and
skips the model build. A receipt of other validators or other weights is not trusted: the check
runs and the receipt is replaced. A move that waits for another writer's lock says so."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from model_store import ModelStore
from model_store.cli import app as store_app
from model_store.load_receipts import RECEIPT_FILE
from model_store.validators import InstalledValidators

pytestmark = pytest.mark.slow  # several load checks of a tiny model, and a 2.5 s wait for a lock

BUILDING = "building the model and running one image and two texts through it"
TRUSTED = "not run again"


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


def _receipt(root: Path, version: str) -> Path:
    return root / "tiny" / "versions" / version / RECEIPT_FILE


def test_moves_trust_the_receipt_of_their_files_and_validators_only(tmp_path: Path, publish_model: Any) -> None:
    root = tmp_path / "store"
    publish_model(root, "tiny", seed=1)
    runner = CliRunner(env={"NO_COLOR": "1"})

    def run(*args: str) -> Any:
        result = runner.invoke(store_app, ["--store", str(root), *args])
        assert result.exit_code == 0, result.output
        return result

    run("copy", "tiny@v1", "--as", "tiny@v2")  # a publish: the load check runs and leaves a receipt
    receipt = json.loads(_receipt(root, "v2").read_text())
    assert receipt["validators"] == InstalledValidators().identity() and receipt["validators"]
    assert receipt["files"] == {f: e.sha256 for f, e in ModelStore(root).manifest("tiny", "v2").files.items()}

    shadowed = run("shadow", "tiny", "v2", "--fraction", "0.5")
    assert "verifying tiny@v2: sha256 of" in shadowed.stderr and TRUSTED in shadowed.stderr, shadowed.stderr
    assert BUILDING not in shadowed.stderr
    assert shadowed.stdout.strip() == "tiny@production: v1, shadow v2 on 50 %"  # stdout: the outcome only

    # Other validators (another release, an edited validator module): the check runs again.
    _receipt(root, "v2").write_text(json.dumps({**receipt, "validators": ["clip = elsewhere:check (0.0.1)"]}))
    promoted = run("promote", "tiny@v2", "--force", "--reason", "rehearsal")
    assert BUILDING in promoted.stderr and "load check of tiny@v2: passed in" in promoted.stderr
    assert TRUSTED not in promoted.stderr
    assert json.loads(_receipt(root, "v2").read_text())["validators"] == receipt["validators"]

    # A receipt copied beside other weights is no receipt of them.
    other = publish_model(root, "tiny", seed=2, aliases=())
    _receipt(root, other).write_text(_receipt(root, "v2").read_text())
    canary = run("canary", "tiny", other, "--weight", "10", "--force", "--reason", "rehearsal")
    assert BUILDING in canary.stderr and TRUSTED not in canary.stderr

    # A rollback verifies the version it returns to and says so; it never builds the model.
    rolled = run("rollback", "tiny")
    assert BUILDING not in rolled.stderr


def test_a_move_says_it_waits_for_another_writers_lock(tmp_path: Path, publish_model: Any) -> None:
    root = tmp_path / "store"
    publish_model(root, "tiny", seed=1)
    held, release = threading.Event(), threading.Event()

    def writer() -> None:
        with ModelStore(root)._lock("tiny"):
            held.set()
            release.wait(30)

    holder = threading.Thread(target=writer)
    holder.start()
    assert held.wait(30)
    threading.Timer(2.5, release.set).start()
    started = time.monotonic()
    result = CliRunner().invoke(store_app, ["--store", str(root), "--no-load-check", "shadow", "tiny", "--off"])
    holder.join()
    assert result.exit_code == 0, result.output
    assert time.monotonic() - started >= 2.0  # it did wait for the lock
    assert "waiting for the lock of tiny: another writer" in result.stderr, result.stderr
