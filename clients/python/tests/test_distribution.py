"""The SDK installs beside the unrelated package that owns its old name.

``clip-client`` on the public index (Jina's CLIP-as-service client) owns the ``clip_client``
import package this SDK was once called. This test builds the SDK's wheel and installs it with
the real ``clip-client`` from the index into one folder: each distribution must own its own
files, and each import name must resolve to its own package (``clipdiff`` imports).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path

import pytest

SDK = Path(__file__).resolve().parents[1]
OLD_NAME = "clip-client==0.8.3"


def pip(*args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pip", "--disable-pip-version-check", *args],
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # Built from a copy so no build folder is left in the checkout.
    root = tmp_path_factory.mktemp("sdk")
    source = root / "src"
    shutil.copytree(SDK, source, ignore=shutil.ignore_patterns("*.egg-info", "build", "tests", "__pycache__"))
    built = pip("wheel", "--no-deps", "--no-build-isolation", "-w", str(root / "dist"), str(source))
    assert built.returncode == 0, built.stderr
    (path,) = (root / "dist").glob("clipdiff_client-*.whl")
    return path


def test_the_wheel_holds_only_its_own_names(wheel: Path) -> None:
    tops = {name.split("/")[0] for name in zipfile.ZipFile(wheel).namelist()}
    assert tops == {"clipdiff", f"clipdiff_client-{wheel.name.split('-')[1]}.dist-info"}


@pytest.mark.slow
def test_installs_beside_the_package_of_the_old_name(wheel: Path, tmp_path: Path) -> None:
    fetched = pip("download", "--no-deps", "--no-binary", ":all:", "-d", str(tmp_path / "dl"), OLD_NAME)
    if fetched.returncode != 0:
        pytest.skip(f"{OLD_NAME} could not be fetched from the package index: {fetched.stderr[-300:]}")
    target = tmp_path / "site"
    (old,) = (tmp_path / "dl").iterdir()
    installed = pip("install", "--no-deps", "--target", str(target), str(old), str(wheel))
    assert installed.returncode == 0, installed.stderr

    dists = {d.metadata["Name"]: d for d in metadata.distributions(path=[str(target)])}
    assert set(dists) == {"clip-client", "clipdiff-client"}
    owned = {name: {str(f) for f in d.files or [] if ".dist-info" not in str(f)} for name, d in dists.items()}
    assert owned["clip-client"] and owned["clipdiff-client"]
    assert not owned["clip-client"] & owned["clipdiff-client"]  # no file belongs to both
    assert (target / "clip_client" / "__init__.py").read_text().startswith("__version__ = '0.8.3'")

    # Importing clip_client itself needs its own dependencies (jina, docarray), not installed
    # here; what matters is that its name finds its package while clipdiff imports from the folder.
    probe = (
        "import importlib.util, clipdiff; "
        "print(clipdiff.__file__); print(importlib.util.find_spec('clip_client').origin); "
        "from clipdiff import Client; print(Client.__name__)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}
    command = [sys.executable, "-c", probe]
    ran = subprocess.run(command, capture_output=True, text=True, env=env, cwd=tmp_path, timeout=60)
    assert ran.returncode == 0, ran.stderr
    sdk_file, old_file, client = ran.stdout.split()
    assert Path(sdk_file) == target / "clipdiff" / "__init__.py"
    assert Path(old_file) == target / "clip_client" / "__init__.py"
    assert client == "Client"
