"""The images' dependency install: the cpu variant's torch packages come from PyTorch's CPU index
and stay installed when the whole list follows from the default index (real pip, offline: two
folders of small wheels stand in for the two indexes)."""

from __future__ import annotations

import re
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "deploy" / "image_requirements.py"
PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]


def lines(*args: str) -> list[str]:
    out = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, check=True)
    return out.stdout.splitlines()


def test_each_variant_installs_the_dependencies_and_its_extra() -> None:
    assert lines("cpu") == PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["cpu"]
    assert lines("cuda") == PYPROJECT["dependencies"] + PYPROJECT["optional-dependencies"]["gpu"]
    torch_lines = lines("cpu", "--torch")
    assert [line.split("==")[0] for line in torch_lines] == ["torch", "torchvision"]
    assert set(torch_lines) <= set(PYPROJECT["dependencies"])


@pytest.mark.parametrize("dockerfile", ["Dockerfile", "Dockerfile.train"])
def test_the_cpu_variant_takes_torch_from_the_cpu_index(dockerfile: str) -> None:
    text = (REPO / "deploy" / dockerfile).read_text()
    assert "ARG TORCH_CPU_INDEX=https://download.pytorch.org/whl/cpu" in text
    install = re.search(r"^RUN python image_requirements\.py .*?(?=^\s*$)", text, re.MULTILINE | re.DOTALL)
    assert install is not None, "the dependency layer reads deploy/image_requirements.py"
    step = install.group(0)
    # Only the cpu variant, and the CPU index only for the torch lines, before the whole list.
    assert '[ "$VARIANT" = cpu ] && [ -n "$TORCH_CPU_INDEX" ]' in step
    assert step.index('--index-url "$TORCH_CPU_INDEX" -r /tmp/torch.txt') < step.index("-r /tmp/requirements.txt")
    assert "COPY pyproject.toml deploy/image_requirements.py ./" in text
    assert "!deploy/image_requirements.py" in (REPO / ".dockerignore").read_text()


def wheel(folder: Path, name: str, version: str, requires: list[str]) -> None:
    """A pure-Python wheel that installs nothing but its metadata."""
    stem = f"{name.replace('-', '_')}-{version}"  # a wheel's file name writes the name with "_"
    info = f"{stem}.dist-info"
    meta = "".join(
        [f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n"] + [f"Requires-Dist: {r}\n" for r in requires]
    )
    files = {
        f"{info}/METADATA": meta,
        f"{info}/WHEEL": "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n",
    }
    files[f"{info}/RECORD"] = "".join(f"{path},,\n" for path in files) + f"{info}/RECORD,,\n"
    with zipfile.ZipFile(folder / f"{stem}-py3-none-any.whl", "w") as archive:
        for path, body in files.items():
            archive.writestr(path, body)


def pip_in(env: Path) -> list[str]:
    """This interpreter's pip, acting on the virtualenv ``env`` (which has no pip of its own)."""
    return [sys.executable, "-m", "pip", "--python", str(env / "bin" / "python")]


def installed(env: Path) -> dict[str, str]:
    out = subprocess.run([*pip_in(env), "list", "--format=freeze"], capture_output=True, text=True, check=True)
    return dict(line.split("==") for line in out.stdout.splitlines() if "==" in line)


def test_pip_keeps_the_cpu_builds_when_the_whole_list_follows(tmp_path: Path) -> None:
    """The Dockerfile's two installs, with pip: the second, from an index that has only the
    CUDA builds (no local label), must find the CPU builds' pins already satisfied."""
    torch_lines = lines("cpu", "--torch")
    pins = dict(line.split("==") for line in torch_lines)
    cpu_index, default_index = tmp_path / "cpu-index", tmp_path / "default-index"
    cpu_index.mkdir()
    default_index.mkdir()
    wheel(cpu_index, "torch", f"{pins['torch']}+cpu", [])
    wheel(cpu_index, "torchvision", f"{pins['torchvision']}+cpu", [f"torch=={pins['torch']}"])
    wheel(default_index, "torch", pins["torch"], [])
    wheel(default_index, "torchvision", pins["torchvision"], [f"torch=={pins['torch']}"])
    (tmp_path / "torch.txt").write_text("\n".join(torch_lines) + "\n")
    # The whole list's torch lines, plus a package that depends on torch as open_clip does.
    wheel(default_index, "needs-torch", "1.0", ["torch>=2.0", "torchvision"])
    (tmp_path / "requirements.txt").write_text("\n".join([*torch_lines, "needs-torch"]) + "\n")
    env = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(env)], check=True)
    pip = [*pip_in(env), "install", "--no-index", "-q"]
    subprocess.run([*pip, "--find-links", str(cpu_index), "-r", str(tmp_path / "torch.txt")], check=True)
    subprocess.run([*pip, "--find-links", str(default_index), "-r", str(tmp_path / "requirements.txt")], check=True)
    got = installed(env)
    assert got["torch"] == f"{pins['torch']}+cpu"
    assert got["torchvision"] == f"{pins['torchvision']}+cpu"
    assert got["needs-torch"] == "1.0"
