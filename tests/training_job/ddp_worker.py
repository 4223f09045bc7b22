"""Run a PC-CLIP and a SemCLIP finetune of a tiny CLIP, in one process or as one rank of a torchrun
job, and (on rank 0) save the final text-tower weights and the last logged losses.

Usage: [torchrun --nproc_per_node N] python tests/training_job/ddp_worker.py OUT_DIR
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from clipcore.models.clip_model import build_model
from clipcore.models.preprocess import PreprocessConfig
from training import distributed
from training.recipe import model_config
from training.train_pcclip import PCClipConfig, train_pcclip
from training.train_semclip import SemClipConfig, train_semclip


def main(out: Path) -> None:
    torch.set_num_threads(1)
    world, device = distributed.setup("cpu")
    torch.manual_seed(0)
    base = build_model(model_config("shapes-smoke"))  # the same random init on every rank
    losses: dict[str, float] = {}

    def capture(name: str):  # noqa: ANN202
        def log(message: str) -> None:
            losses.setdefault(name + ".log", message)  # type: ignore[arg-type]

        return log

    pre = PreprocessConfig()  # what a from-scratch base is published with
    pc = train_pcclip(base, PCClipConfig(pairs=96, steps=100, batch_size=16, seed=0, device=device),
                      out_dir=out / f"pc-{world.rank}", log=capture("pcclip"), preprocess=pre)  # fmt: skip
    sem = train_semclip(base, SemClipConfig(scenes=64, steps=100, batch_size=16, seed=0, device=device),
                        out_dir=out / f"sem-{world.rank}", log=capture("semclip"), preprocess=pre)  # fmt: skip
    if world.main:
        for name in ("pc", "sem"):
            history = json.loads(
                (out / f"{name}-0" / f"{'pcclip' if name == 'pc' else 'semclip'}_history.json").read_text()
            )
            losses[name] = history["history"][-1]["loss"]
        torch.save({"pcclip": pc, "semclip": sem, "world_size": world.size}, out / "weights.pt")
        (out / "losses.json").write_text(json.dumps({k: v for k, v in losses.items() if not k.endswith(".log")}))
    distributed.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
