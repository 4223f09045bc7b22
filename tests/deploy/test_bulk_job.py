"""The bulk Indexed Job (k8s/bulk): each completion index scores its own shard into its own file.

The manifest is rendered as kubectl would (deploy/render_kustomize.py), its invariants checked,
and then every completion index's command line is run as the pod would run it (the Job's
``$(VAR)`` references filled in from the container's environment, /data on a temporary folder)
against a real server: the shards' outputs, concatenated, hold every row of the dataset once.
"""

from __future__ import annotations

import base64
import importlib.util
import re
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
Obj = dict[str, Any]
# Where the Job controller puts a pod's completion index.
COMPLETION_INDEX = "['batch.kubernetes.io/job-completion-index']"


def _renderer() -> Any:
    spec = importlib.util.spec_from_file_location("render_kustomize", REPO / "deploy" / "render_kustomize.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules.setdefault("render_kustomize", module)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def job() -> Obj:
    objs = _renderer().render(REPO / "k8s" / "bulk")
    (found,) = [o for o in objs if o["kind"] == "Job"]
    assert all(o["metadata"]["namespace"] == "clip" for o in objs)
    return found


def container_of(job: Obj) -> Obj:
    (container,) = job["spec"]["template"]["spec"]["containers"]
    return container


def env_values(container: Obj, index: int) -> dict[str, str]:
    """The container's environment as the pod of completion ``index`` sees it."""
    values = {}
    for var in container["env"]:
        if "value" in var:
            values[var["name"]] = var["value"]
        elif (
            var["valueFrom"]
            .get("fieldRef", {})
            .get("fieldPath", "")
            .endswith("['batch.kubernetes.io/job-completion-index']")
        ):
            values[var["name"]] = str(index)
    return values


def expand(args: list[str], values: dict[str, str]) -> list[str]:
    return [re.sub(r"\$\((\w+)\)", lambda m: values[m.group(1)], a) for a in args]


def test_indexed_job_with_one_shard_per_completion(job: Obj) -> None:
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["template"]["spec"]["restartPolicy"] == "Never"  # what backoffLimitPerIndex requires
    container = container_of(job)
    values = env_values(container, 0)
    assert int(values["SHARD_COUNT"]) == spec["completions"], "SHARD_COUNT must equal completions"
    args = container["args"]
    assert args[:2] == ["bulk", "embed"] and "$(SHARD_INDEX)/$(SHARD_COUNT)" in args
    # Each index writes its own file, so no two pods ever share an output.
    outputs = {expand(args, env_values(container, i))[args.index("--output") + 1] for i in range(spec["completions"])}
    assert len(outputs) == spec["completions"]
    assert all(o.startswith("/data/output/") for o in outputs) and args[args.index("--input") + 1].startswith("/data/")
    mounts = {m["mountPath"]: m for m in container["volumeMounts"]}
    assert not mounts["/data"].get("readOnly", False) and mounts["/etc/clip/bulk"]["readOnly"] is True
    assert container["securityContext"]["readOnlyRootFilesystem"] is True and "/tmp" in mounts
    assert {"cpu", "memory"} <= set(container["resources"]["limits"])


def test_the_image_runs_the_command_the_job_names(job: Obj) -> None:
    dockerfile = (REPO / "deploy" / "Dockerfile.bulk").read_text()
    entry = re.search(r"^ENTRYPOINT (\[.*\])$", dockerfile, re.MULTILINE)
    assert entry is not None and yaml.safe_load(entry.group(1)) == ["clipdiff"]
    assert "USER 10001:10001" in dockerfile and "clients/python[bulk]" in dockerfile
    assert container_of(job)["image"] == "registry.example.com/clip/clip-bulk:0.1.0"
    ignore = (REPO / ".dockerignore").read_text()
    assert "!clients/python/" in ignore


@pytest.fixture(scope="module")
def url(tmp_path_factory: pytest.TempPathFactory, publish_model: Any, serve_app: Any) -> Iterator[str]:
    store = tmp_path_factory.mktemp("bulk-job-store")
    publish_model(store, "tiny")
    with serve_app(store=str(store), model="tiny@production") as running:
        yield running.url


@pytest.mark.slow  # a server of its own
def test_every_index_as_the_pod_runs_it_covers_the_dataset_once(
    job: Obj, tmp_path: Path, url: str, make_image: Any
) -> None:
    pq = pytest.importorskip("pyarrow.parquet")
    from clipdiff.cli import main

    inputs = tmp_path / "input"
    inputs.mkdir()
    for i in range(19):
        (inputs / f"{i:03d}.png").write_bytes(base64.b64decode(make_image(px=32 + i)["data"]))
    container = container_of(job)
    files = []
    for index in range(job["spec"]["completions"]):
        args = [a.replace("/data/", f"{tmp_path}/") for a in expand(container["args"], env_values(container, index))]
        assert main([*args, "--url", url, "--progress", "none"]) == 0
        files.append(Path(args[args.index("--output") + 1]))
    merged = [row for f in sorted(files) for row in pq.read_table(f).to_pylist()]
    assert sorted(r["index"] for r in merged) == list(range(19))
    assert all(r["error"] is None and len(r["embedding"]) > 0 for r in merged)
