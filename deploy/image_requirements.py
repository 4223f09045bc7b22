"""What an image variant installs, read from pyproject.toml: the requirements file(s) for pip.

Runs in the builder stage of deploy/Dockerfile and deploy/Dockerfile.train before anything is
installed, so it needs only the standard library:

    python image_requirements.py cpu            # every requirement of the cpu variant
    python image_requirements.py cpu --torch    # only the torch packages, with their pins

The cpu variant installs the ``--torch`` lines first from PyTorch's CPU package index, then the
whole list from the default index: pip keeps the CPU builds, because a local version label
(``2.14.1+cpu``) satisfies a pin without one (``torch==2.14.1``). The default index's Linux torch
wheel is the CUDA build, whose libraries a CPU server maps and partly initialises on
``import torch`` (about 300 MiB of resident memory more per process: docs/benchmarks.md).
"""

from __future__ import annotations

import argparse
import re
import tomllib
from pathlib import Path

# The optional-dependency group each variant adds (`cpu`: onnxruntime, `cuda`: onnxruntime-gpu;
# never both, they install the same module).
VARIANT_EXTRAS = {"cpu": "cpu", "cuda": "gpu"}
# Packages whose CPU builds live on PyTorch's own index (same versions, `+cpu` local label).
TORCH_PACKAGES = ("torch", "torchvision")


def requirement_name(requirement: str) -> str:
    """``torch`` of ``torch==2.14.1``, ``uvicorn`` of ``uvicorn[standard]>=0.29`` (PEP 503 normalised)."""
    match = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if match is None:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", match.group(1)).lower()


def requirements(pyproject: Path, variant: str) -> list[str]:
    """The project's dependencies plus the variant's extra, as pyproject.toml writes them."""
    project = tomllib.loads(pyproject.read_text())["project"]
    return [*project["dependencies"], *project["optional-dependencies"][VARIANT_EXTRAS[variant]]]


def torch_requirements(pyproject: Path, variant: str) -> list[str]:
    """The torch packages' lines of :func:`requirements` (each must be pinned)."""
    lines = [r for r in requirements(pyproject, variant) if requirement_name(r) in TORCH_PACKAGES]
    unpinned = [r for r in lines if "==" not in r]
    if unpinned or len(lines) != len(TORCH_PACKAGES):
        raise ValueError(f"pyproject.toml must pin each of {TORCH_PACKAGES} with ==, found {lines}")
    return lines


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("variant", choices=sorted(VARIANT_EXTRAS))
    parser.add_argument("--torch", action="store_true", help="only the torch packages' lines")
    parser.add_argument("--pyproject", type=Path, default=Path("pyproject.toml"))
    args = parser.parse_args(argv)
    lines = (torch_requirements if args.torch else requirements)(args.pyproject, args.variant)
    print("\n".join(lines))


if __name__ == "__main__":
    main()
