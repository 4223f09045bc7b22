"""The training Job's own commands (read from k8s/base/train-job.yaml), run locally on the smoke
configuration, publish a version that a running service picks up without a restart."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


def job_commands() -> tuple[list[str], list[str]]:
    job = yaml.safe_load((ROOT / "k8s/base/train-job.yaml").read_text())
    pod = job["spec"]["template"]["spec"]
    train = next(c for c in pod["initContainers"] if c["name"] == "train")
    promote = next(c for c in pod["containers"] if c.get("command") == ["model-store"])
    return list(train["args"]), list(promote["args"])


def local(args: list[str], store: Path, run_dir: Path) -> list[str]:
    """The Job's arguments with its volume paths mapped to local temporary folders."""
    mapping = {"/models": str(store), "/work/runs/default": str(run_dir)}
    return [mapping.get(a, a) for a in args]


@pytest.mark.slow
def test_train_job_commands_publish_a_version_the_service_picks_up(
    tmp_path: Path, serve_app: Any, publish_model: Any
) -> None:
    store, run_dir = tmp_path / "models", tmp_path / "runs"
    publish_model(store, "default", aliases=("production",))
    train_args, promote_args = job_commands()
    assert train_args[0] == "build-default" and "staging" in train_args
    with serve_app(
        store=str(store), model="default@production", watch_interval_s=0.5, probes_list_models=True
    ) as running:
        client = httpx.Client(base_url=running.url, timeout=30)
        assert client.get("/readyz").json()["model"] == "default@v1"
        subprocess.run(
            [sys.executable, "-m", "training.cli", *local(train_args, store, run_dir), "--smoke", "--eval-seeds", "1"],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=600,
        )
        assert client.get("/readyz").json()["model"] == "default@v1"  # staging does not move production
        subprocess.run(
            [sys.executable, "-c", "from model_store.cli import app; app()", *local(promote_args, store, run_dir)],
            cwd=ROOT,
            check=True,
            capture_output=True,
            timeout=120,
        )
        deadline = time.time() + 60
        while time.time() < deadline and client.get("/readyz").json()["model"] != "default@v2":
            time.sleep(0.5)
        assert client.get("/readyz").json()["model"] == "default@v2"
        body = client.post("/embed", json={"texts": ["a red circle"]}).json()
        assert body["model"] == "default@v2"
