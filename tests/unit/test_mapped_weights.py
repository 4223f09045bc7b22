"""A version's fp32 weight file becomes the model's parameters as a mapping of the file, not a
copy: what the kernel can drop and read again, and untouched rows that take no memory."""

from __future__ import annotations

from pathlib import Path

import torch

from clipcore.models.bundle import ModelBundle
from loadtests.local_stack import publish_tiny
from model_store import ModelStore


def mapped_ranges(path: Path) -> list[tuple[int, int]]:
    """The address ranges of this process that map ``path`` (``/proc/self/maps``)."""
    ranges = []
    for line in Path("/proc/self/maps").read_text().splitlines():
        fields = line.split(maxsplit=5)
        if len(fields) == 6 and Path(fields[5]) == path:
            start, end = (int(x, 16) for x in fields[0].split("-"))
            ranges.append((start, end))
    return ranges


def test_fp32_weights_are_the_files_pages_and_the_file_never_changes(tmp_path: Path) -> None:
    publish_tiny(tmp_path)  # fp32 weight files
    bundle = ModelBundle.load(ModelStore(tmp_path), "tiny@production")
    assert bundle.components.weights_dtype == "float32"
    weights = (bundle.directory / str(bundle.components.weights)).resolve()
    ranges = mapped_ranges(weights)
    assert ranges, "the weight file is not mapped"
    params = dict(bundle.model.named_parameters())
    inside = [n for n, p in params.items() if any(a <= p.data_ptr() < b for a, b in ranges)]
    assert set(inside) == set(params)  # every parameter is read from the file's pages

    before, table = weights.read_bytes(), params["token_embedding.weight"].detach().clone()
    with torch.no_grad():  # a write (a finetune's step) copies the page it touches, never the file
        params["token_embedding.weight"].add_(1.0)
    assert weights.read_bytes() == before
    assert ModelBundle.load(ModelStore(tmp_path), "tiny@production").model.token_embedding.weight.equal(table)
