"""Every command of docs/tutorial.md, run as written on a small slice of Fashion-MNIST.

The shell blocks are read from the tutorial itself, so a command that changes there is tested as
changed. Sizes are cut down (a few hundred images, a few steps: this checks that the commands
work and chain, not the tutorial's figures); everything else is passed as written. The LLM
stand-in and the service run in-process on free ports of 127.0.0.1, and the tutorial's curl and
SDK calls are sent to them. The commands run in an empty folder standing for the repository root,
which holds nothing but ``tutorial/`` afterwards (the tutorial's one git-ignored folder), and the
last step's folder of class folders (JPEGs) is imported and trained on like the converted photos.
"""

from __future__ import annotations

import contextlib
import json
import re
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from typer.testing import CliRunner

from model_store import ModelStore
from model_store.cli import app as store_app
from tests.training_job.fake_llm import fake_llm_server
from training.cli import app

REPO = Path(__file__).resolve().parents[2]
TUTORIAL = REPO / "docs" / "tutorial.md"
SOURCE = Path("/usr/share/datasets/fashion-mnist")
pytestmark = [pytest.mark.slow, pytest.mark.skipif(not SOURCE.exists(), reason="apt-get install dataset-fashion-mnist")]

# The small slice: option -> value, applied wherever the tutorial passes the option.
SMALL = {
    "--limit": "300", "--test-limit": "120", "--steps": "4", "--batch-size": "16", "--text-freeze-steps": "2",
    "--generated-pairs": "40", "--seeds": "2", "--n-zeroshot": "60", "--n-pairs": "40", "--n-captions": "10",
    "--channels": "8", "--hidden": "32", "--llm-samples": "1",
}  # fmt: skip


def blocks(kind: str) -> list[str]:
    return re.findall(rf"```{kind}\n(.*?)```", TUTORIAL.read_text(), flags=re.S)


def commands(block: str) -> list[str]:
    """Logical lines: continuations joined, comments and blank lines dropped."""
    joined = re.sub(r"\\\n\s*", " ", block)
    return [line.strip() for line in joined.splitlines() if line.strip() and not line.strip().startswith("#")]


def shrink(argv: list[str]) -> list[str]:
    out = list(argv)
    for i, arg in enumerate(out[:-1]):
        if arg in SMALL:
            out[i + 1] = SMALL[arg]
    return out


def option(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_the_tutorial_runs_as_written(tmp_path: Path, serve_app: Any, monkeypatch: pytest.MonkeyPatch) -> None:  # noqa: ANN401
    torch.set_num_threads(1)
    work = tmp_path / "repo"
    work.mkdir()
    monkeypatch.chdir(work)
    monkeypatch.setenv("CLIP_FEATURE_CACHE", str(tmp_path / "features"))
    runner = CliRunner()
    outputs: list[str] = []
    shell: list[str] = []  # curl lines, run once the service is up
    with contextlib.ExitStack() as stack:
        server = llm = None
        store_dir = ""
        for line in (c for block in blocks("bash") for c in commands(block)):
            argv = shlex.split(line.rstrip("&").strip())
            if argv[0] == ".venv/bin/clip-train":
                small = shrink(argv[1:])
                if "--llm-base-url" in small:
                    assert llm is not None, "the tutorial uses the LLM stand-in before starting it"
                    small[small.index("--llm-base-url") + 1] = llm[0]
                result = runner.invoke(app, small, catch_exceptions=False)
                assert result.exit_code == 0, f"{line}\n{result.output}"
                outputs.append(result.output)
            elif argv[0] == ".venv/bin/model-store":
                result = runner.invoke(store_app, argv[1:], catch_exceptions=False)
                # `gate` is a dry run that exits 1 when the move would be refused; all else must pass.
                assert result.exit_code == 0 or (argv[1] == "gate" and result.exit_code == 1), (
                    f"{line}\n{result.output}"
                )
                outputs.append(result.output)
            elif argv[:3] == [".venv/bin/python", "-m", "tests.training_job.fake_llm"]:
                llm = stack.enter_context(fake_llm_server())
            elif argv[0] == "export":
                name, _, value = argv[1].partition("=")
                monkeypatch.setenv(name, value)
            elif argv[:3] == [".venv/bin/python", "-m", "service"]:
                store_dir = option(argv, "--store")
                server = stack.enter_context(serve_app(store=store_dir, model=option(argv, "--model")))
            elif argv[:2] == [".venv/bin/python", "scripts/eval_retrieval.py"]:
                # The retrieval rows alone, on fewer seeds and a smaller gallery than the tutorial's.
                script = [sys.executable, str(REPO / argv[1]), *argv[2:], "--seeds", "1", "--n-gallery", "60"]
                done = subprocess.run(script, capture_output=True, text=True, timeout=300, cwd=work)
                assert done.returncode == 0 and "negated" in done.stdout, f"{line}\n{done.stdout}\n{done.stderr}"
                outputs.append(done.stdout)
            elif argv[0] == "kill":
                continue  # the stand-in's process: here a thread, stopped with the test
            elif argv[0] == "curl" or re.match(r"^[A-Z_]+=", line):
                shell.append(line + ("\necho" if argv[0] == "curl" else ""))  # one answer per line
            else:
                pytest.fail(f"the test does not know how to run this tutorial command: {line}")
        assert server is not None and llm is not None and shell
        port = server.url.rsplit(":", 1)[1]
        lines = [line.replace("127.0.0.1:8000", f"127.0.0.1:{port}") for line in shell]
        script = "set -euo pipefail\n" + "\n".join(lines)
        proc = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=300, cwd=work)
        assert proc.returncode == 0, proc.stderr
        answers = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")]
        assert answers, proc.stdout
        store = ModelStore(work / store_dir)
        name, version = store.resolve("fashion@production")
        assert all(a["model"] == f"{name}@{version}" for a in answers), answers
        classified = [a for a in answers if "comparative" in a]
        assert classified and classified[0]["comparative"]["source"] == "library"
        # The answer says what step 6 measured of the library on the same labels.
        (measured,) = classified[0]["comparative"]["measured"]
        assert measured["dataset"] == "fashion-test" and measured["same_labels"] and measured["classes"] == 10
        for code in blocks("python"):  # the SDK calls
            exec(code.replace("http://127.0.0.1:8000", server.url), {})  # noqa: S102

    manifest = store.manifest(name, version)
    assert manifest.training["method"] == "comparatives"
    assert {"dcsm"} <= set(manifest.components) and manifest.components["default_text_encoder"] == "pcclip"
    annex = store.annex_files(name, version)
    assert "eval.json" in annex and "report.html" in annex
    assert any("published fashion-llm@v1" in out for out in outputs), "the LLM library was not published"
    assert (work / "tutorial" / "reports").is_dir()
    assert [p.name for p in work.iterdir()] == ["tutorial"], "the tutorial wrote outside tutorial/"
    assert "/tutorial/" in (TUTORIAL.parents[1] / ".gitignore").read_text().splitlines()
    # Step 9: the class folders (JPEGs) were imported with their test tree and trained on.
    imported = [json.loads(line) for line in (work / "tutorial" / "mine" / "train.jsonl").read_text().splitlines()]
    assert imported and all(r["image"].startswith("images/train/") and r["image"].endswith(".jpg") for r in imported)
    assert (work / "tutorial" / "mine" / "test.jsonl").read_text().strip()
    mine, mine_version = store.resolve("mine@v4")  # base, pcclip, dcsm, comparatives: no alias moved
    assert store.manifest(mine, mine_version).training["method"] == "comparatives"
    assert "eval.json" in store.annex_files(mine, mine_version)
    # Step 9 evaluates its base too, and compares the result with it.
    assert "eval.json" in store.annex_files(*store.resolve("mine@v1"))
    assert any(f"| `mine@v1` | `mine@{mine_version}` | change | chance |" in out for out in outputs)
    # Step 6 compares the result with the base: both versions' columns, the change, chance levels, and only
    # figures of components some version has (PC-CLIP and DCSM, no SemCLIP).
    compared = next(out for out in outputs if f"| `fashion@v1` | `{name}@{version}` | change | chance |" in out)
    for key in ("zeroshot.acc", "rank_pair.label.pcclip", "hard_negatives.dcsm.negation", "negation.pcclip"):
        assert f"| `{key}` |" in compared, key
    assert "semclip." not in compared and "most confused pairs" in compared
    # fashion@v4 keeps fashion@v1's base encoder and image tower: its base and cosine rows are v1's (docs say so).
    for key in ("rank_pair.label.base", "rank_pair.attribute.base", "hard_negatives.cosine.all",
                "hard_negatives.cosine.negation", "winoground.group.cosine"):  # fmt: skip
        row = next(line for line in compared.splitlines() if f"| `{key}` |" in line)
        cells = [cell.strip() for cell in row.strip().strip("|").split("|")]
        assert cells[2] == cells[3] and cells[4].startswith("+0.000 ± "), row
    # Each component's row says what it adds over the figure it replaces on the same inputs.
    added = {"rank_pair.label.pcclip": "base encoder", "hard_negatives.dcsm.negation": "cosine",
             "negation.pcclip": "base encoder", "zeroshot_comparative.acc": "standard prompts"}  # fmt: skip
    for key, versus in added.items():
        row = next(line for line in compared.splitlines() if f"| `{key}` |" in line)
        assert f" vs {versus}" in row.split("|")[5], row
    promoted = store.alias_log("fashion", "production")["production"][-1]
    assert promoted.forced and promoted.reason and promoted.to == version  # the gate's override is on record
