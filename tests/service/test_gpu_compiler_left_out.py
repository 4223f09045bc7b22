"""A CPU server does not import triton (the GPU kernel compiler torch's CUDA wheels bring along),
and still imports and runs everything it serves with."""

from __future__ import annotations

import importlib.util
import subprocess
import sys

import pytest

pytestmark = pytest.mark.slow  # each test starts a Python that imports torch and the service

SCRIPT = """
import sys
from service.__main__ import leave_out_gpu_compiler
leave_out_gpu_compiler(sys.argv[1])
import open_clip, torch, torch._dynamo
import service.app
model = torch.nn.Linear(4, 2)
assert model(torch.ones(1, 4)).shape == (1, 2)
print(sys.modules.get("triton") is not None)
"""


def loads_triton(device: str) -> bool:
    out = subprocess.run([sys.executable, "-c", SCRIPT, device], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return out.stdout.strip().splitlines()[-1] == "True"


def test_cpu_server_leaves_triton_out() -> None:
    assert not loads_triton("cpu")


def test_cuda_server_keeps_whatever_torch_imports() -> None:
    installed = importlib.util.find_spec("triton") is not None
    assert loads_triton("cuda") == installed
