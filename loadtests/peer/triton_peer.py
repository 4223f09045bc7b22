"""NVIDIA Triton through PyTriton as a peer: its virtualenv, its process, its request shape.

``pytriton_server.py`` (beside this file) runs in a virtualenv of its own (``--pytriton-venv``,
created on first use with ``nvidia-pytriton``, which bundles ``tritonserver``), never in the
service's. torch, open_clip and Pillow are not installed there: one ``.pth`` line appends the
service's site-packages to the virtualenv's path (after its own packages), so both servers run the
same torch build and the peer's install stays small (PyPI's torch would bring the CUDA libraries).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from loadtests.benchmark import logged_server
from loadtests.local_stack import free_port

PYTRITON_PACKAGES = ["nvidia-pytriton==0.7.0"]
SERVER_SCRIPT = Path(__file__).with_name("pytriton_server.py")
MODEL_NAME = "clip_image"  # pytriton_server.MODEL_NAME (that module imports pytriton: not here)
INFER_PATH = f"/v2/models/{MODEL_NAME}/infer"
SHARED_PTH = "clip-service-packages.pth"


def ensure_pytriton(venv: Path) -> Path:
    """The virtualenv's ``python``, installing ``nvidia-pytriton`` on first use; the ``.pth`` line
    to this interpreter's packages is (re)written every time (it names this environment)."""
    python = venv / "bin" / "python"
    if not python.exists():
        print(f"installing {' '.join(PYTRITON_PACKAGES)} into {venv} (once)", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
        subprocess.run([str(venv / "bin" / "pip"), "install", "-q", *PYTRITON_PACKAGES], check=True)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             check=True, capture_output=True, text=True).stdout.strip()  # fmt: skip
    (Path(purelib) / SHARED_PTH).write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def infer_body(image_placeholder: str) -> str:
    """Triton's KServe v2 JSON request for one base64 JPEG (a BYTES tensor of shape [1, 1])."""
    tensor = {"name": "image", "shape": [1, 1], "datatype": "BYTES", "data": [image_placeholder]}
    return json.dumps({"inputs": [tensor]})


@contextmanager
def pytriton_process(
    python: Path, config: Path, threads: int, max_batch_size: int, log: Path
) -> Iterator[tuple[subprocess.Popen[bytes], str]]:
    """``pytriton_server.py`` serving ``config``'s image tower on 127.0.0.1; (process, url) once
    the model is ready, stopped (Triton and its model process with it) when the block ends."""
    port, grpc_port, metrics_port = free_port(), free_port(), free_port()
    env = {**os.environ, "OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}
    cmd = [str(python), str(SERVER_SCRIPT), "--config", str(config), "--port", str(port), "--grpc-port",
           str(grpc_port), "--metrics-port", str(metrics_port), "--threads", str(threads),
           "--max-batch-size", str(max_batch_size)]  # fmt: skip
    url = f"http://127.0.0.1:{port}"
    with logged_server(cmd, env, log, url, probe=f"/v2/models/{MODEL_NAME}/ready") as proc:
        yield proc, url
