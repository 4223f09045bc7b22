"""From-scratch contrastive training of the base CLIP on the shapes world (the loop:
``training.methods.base``).

Recipe (see docs/model_card.md for why each piece is there): conv stem, text tower frozen
at its random initialisation for the first ``text_freeze_steps`` (random text embeddings act
as fixed class targets and break the contrastive plateau on shape), a FILIP-style
token-level alignment term, AdamW with warm-up + cosine, bf16 autocast on CPU.
Data is generated on the fly: step ``s`` always sees the same scenes for a given seed.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.clip_model import build_model
from clipcore.models.preprocess import PreprocessConfig
from training.alignment import AlignmentTargets
from training.encode import Tokenize
from training.from_scratch import image_size
from training.methods import base
from training.methods.checkpoint import Checkpoints, Runtime
from training.probes import probe_set, zero_shot_accuracy
from training.progress import loss_with_chance
from training.world.captions import random_caption
from training.world.render import render_batch
from training.world.scene import Scene, Split, sample_scene


@dataclass(kw_only=True)
class BaseTrainConfig(base.Hyper):
    """The shapes world's base run: ``base.Hyper`` and what the world adds (the scenes it renders,
    evaluation during training)."""

    model_config: dict[str, Any]
    checkpoint_every: int = 200
    filip_start: int | None = 300
    batch_size: int = 128
    seed: int = 0
    bf16: bool = True
    device: str = "cpu"
    eval_every: int = 250
    eval_scenes: int = 300
    p_two_objects: float = 0.5
    extra: dict[str, Any] = field(default_factory=dict)


def make_batch(
    cfg: BaseTrainConfig, step: int, tokenize: Tokenize, preprocess: PreprocessConfig
) -> tuple[list[Scene], torch.Tensor, torch.Tensor]:
    base = step * cfg.batch_size
    scenes = [sample_scene(Split.TRAIN, cfg.seed, base + i, p_two=cfg.p_two_objects) for i in range(cfg.batch_size)]
    rng = np.random.default_rng([cfg.seed, step, 7])
    images = preprocess.normalize(render_batch(scenes, image_size(cfg.model_config), seed=int(rng.integers(2**31))))
    captions = [random_caption(s, rng) for s in scenes]
    return scenes, images, tokenize(captions)


def train_base(cfg: BaseTrainConfig, out_dir: Path, *, preprocess: PreprocessConfig, log=print) -> CLIP:  # noqa: ANN001
    """Train (or resume from ``out_dir/checkpoint.pt``); writes ``model.pt`` and a log. ``preprocess``:
    the configuration the model is published with (its images are normalised as it will be served)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(cfg.seed)
    model = build_model(cfg.model_config).to(cfg.device)
    tokenize = Tokenize(model.context_length)
    align_targets = AlignmentTargets(model.context_length)
    probes = probe_set(Split.TEST, cfg.seed, cfg.eval_scenes, image_size(cfg.model_config))
    t0 = time.time()

    def batches(step: int) -> base.Batch:
        scenes, images, tokens = make_batch(cfg, step, tokenize, preprocess)
        return base.Batch(images, tokens, lambda cpu_tokens: align_targets(scenes, cpu_tokens))

    def record(
        done: int, model: torch.nn.Module, loss: float, history: list[dict[str, Any]], contrastive: float
    ) -> str:
        if done % cfg.eval_every == 0 or done == cfg.steps:
            acc = zero_shot_accuracy(model, tokenize, probes, preprocess, device=cfg.device)
            history.append({"step": done, "loss": loss, "seconds": time.time() - t0, **acc})
            log(json.dumps(history[-1]))
        info = f"contrastive loss {loss_with_chance(contrastive, cfg.batch_size)}"
        if history:
            h = history[-1]
            info += f" | shape {h['shape']:.2f} colour {h['colour']:.2f} size {h['size']:.2f}"
        return info

    def amp() -> torch.autocast:
        return torch.autocast(device_type=cfg.device.split(":")[0], dtype=torch.bfloat16, enabled=cfg.bf16)

    # No settings check: a rerun with more --steps continues the same run.
    checkpoints = Checkpoints(out_dir / "checkpoint.pt", every=cfg.checkpoint_every)
    result = base.train(model, batches, cfg, record=record, checkpoints=checkpoints,
                        runtime=Runtime(cfg.seed, cfg.device, amp, log))  # fmt: skip
    start, history, contrastive = result.start, result.history, result.contrastive
    if start < cfg.steps:
        log(f"base: final image-text contrastive loss {loss_with_chance(contrastive, cfg.batch_size)}")
    torch.save(model.state_dict(), out_dir / "model.pt")
    (out_dir / "history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}, indent=2))
    return model
