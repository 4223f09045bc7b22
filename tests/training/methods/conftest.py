"""Fixtures of the method tests: a real tiny CLIP (the shapes-smoke config, random weights); the
resume check they share is in ``resume_checks`` (a module of its own: ``conftest`` names several
modules in one test run)."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
import torch
from resume_checks import SMOKE

from clipcore.models.clip_model import build_model


@pytest.fixture(scope="module", autouse=True)
def one_thread() -> Iterator[None]:
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # the test machine's cores are shared
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def tiny() -> torch.nn.Module:
    torch.manual_seed(0)
    return build_model(json.loads(SMOKE.read_text())).eval()
