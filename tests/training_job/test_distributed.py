"""Two CPU ranks under torchrun (gloo, 127.0.0.1) train what one process trains on the same global batch."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch

WORKER = Path(__file__).with_name("ddp_worker.py")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _run(args: list[str], out: Path) -> None:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    proc = subprocess.run([*args, str(WORKER), str(out)], env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    single, ranks = tmp_path_factory.mktemp("single"), tmp_path_factory.mktemp("ranks")
    _run([sys.executable], single)
    torchrun = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr",
                "127.0.0.1", "--master_port", str(_free_port())]  # fmt: skip
    _run(torchrun, ranks)
    return single, ranks


@pytest.mark.slow
def test_two_ranks_match_one_process(runs: tuple[Path, Path]) -> None:
    single, ranks = runs
    one, two = torch.load(single / "weights.pt"), torch.load(ranks / "weights.pt")
    assert (one["world_size"], two["world_size"]) == (1, 2)
    for method in ("pcclip", "semclip"):
        assert one[method].keys() == two[method].keys()
        for key, value in one[method].items():
            a, b = two[method][key], value
            if key.endswith("attn.in_proj_bias"):
                # The key bias (middle third) has a zero gradient in exact arithmetic (a softmax
                # ignores a shift shared by every key), so AdamW's normalised step turns float
                # noise into lr-sized moves there; it changes no output. Compare q and v biases.
                a, b = torch.cat([a.chunk(3)[0], a.chunk(3)[2]]), torch.cat([b.chunk(3)[0], b.chunk(3)[2]])
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6, msg=f"{method} {key}")
    loss_one = json.loads((single / "losses.json").read_text())
    loss_two = json.loads((ranks / "losses.json").read_text())
    for name in ("pc", "sem"):
        assert loss_two[name] == pytest.approx(loss_one[name], rel=1e-4)


@pytest.mark.slow
def test_training_moved_the_weights(runs: tuple[Path, Path]) -> None:
    """The comparison above is not vacuous: the finetune changed the text tower."""
    single, _ = runs
    trained = torch.load(single / "weights.pt")["pcclip"]
    torch.manual_seed(0)
    from clipcore.models.clip_model import build_model
    from training.recipe import model_config

    initial = build_model(model_config("shapes-smoke")).state_dict()
    moved = max((trained[k] - initial[k]).abs().max().item() for k in trained if k.startswith("transformer."))
    assert moved > 1e-3


def _comparable(key: str, t: torch.Tensor) -> torch.Tensor:
    # The key bias (middle third): zero gradient in exact arithmetic, see above.
    return torch.cat([t.chunk(3)[0], t.chunk(3)[2]]) if key.endswith("attn.in_proj_bias") else t


@pytest.mark.slow
def test_pcclip_on_user_data_under_torchrun(tmp_path: Path) -> None:
    """``torchrun ... -m training.cli pcclip`` with 2 ranks: features computed in shards, one version
    published (by rank 0), the same text encoder as one process trains."""
    from safetensors.torch import load_file

    from model_store import ModelStore
    from training.userdata.demo_data import write_user_dataset

    data = write_user_dataset(tmp_path / "data", per_label=8, scenes=4)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MASTER_ADDR": "127.0.0.1"}
    weights = {}
    # One random starting version, copied: both runs train the same weights.
    init = [sys.executable, "-m", "training.cli", "init-random", "fruit", "--store", str(tmp_path / "store-init")]
    subprocess.run(init, env=env, check=True, capture_output=True, timeout=300)
    for runs, name in ((1, "single"), (2, "ranks")):
        store = tmp_path / f"store-{name}"
        shutil.copytree(tmp_path / "store-init", store)
        launcher = [sys.executable] if runs == 1 else [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_addr", "127.0.0.1",
            "--master_port", str(_free_port())]  # fmt: skip
        cmd = [*launcher, "-m", "training.cli", "pcclip", "--model", "fruit@v1", "--data", str(data),
               "--store", str(store), "--steps", "30", "--batch-size", "16", "--run-dir", str(tmp_path / f"run-{name}"),
               "--feature-cache", str(tmp_path / f"cache-{name}")]  # fmt: skip
        proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
        ms = ModelStore(store)
        assert ms.list_versions("fruit") == ["v1", "v2"]  # rank 0 alone published
        weights[name] = load_file(str(ms.file_path("fruit", "v2", "text_pcclip.safetensors")))
    assert weights["single"].keys() == weights["ranks"].keys()
    for key, value in weights["single"].items():
        # Published text encoders are float16: one ulp of rounding apart at most.
        a, b = _comparable(key, weights["ranks"][key]).float(), _comparable(key, value).float()
        torch.testing.assert_close(a, b, rtol=2e-3, atol=1e-5, msg=key)
