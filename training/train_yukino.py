"""YUKINO on the shapes world: hard-negative items rendered with both images and both captions,
the scenes' ground truth for the text finetune's structure term, and the world's concept words for
OTI; the method itself (text finetune, OTI, inverter) is ``training.methods.yukino``.

The shapes-world base encoders do not tell swapped captions apart (``training.caption_probe``:
even the ground-truth scene gets 2x2 group 0.04-0.07 through them, 0.50 through the finetuned
variant), so the text variant is finetuned from SemCLIP's first, with the scene structure
(``training.world.structure``) as its target. Every step's rows are drawn from (seed, step), and
with ``out_dir`` each stage checkpoints there and resumes.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.models.preprocess import PreprocessConfig
from clipcore.models.yukino import YukinoHead
from training.encode import Tokenize, encode_image_tokens, encode_images, encode_texts
from training.methods import yukino
from training.methods.checkpoint import Checkpoints, Runtime
from training.world.hard_negatives import hard_negative_set
from training.world.render import render_batch
from training.world.scene import Split
from training.world.structure import SceneEncoder, scene_features
from training.world.vocab import COLOUR_NAMES, SHAPES, SIZES

CONCEPT_WORDS: tuple[str, ...] = (*SHAPES, *COLOUR_NAMES, *SIZES, "shape")
OTIConfig = yukino.OTIHyper  # the world's evaluation runs OTI as training does


@dataclass
class YukinoTextConfig(yukino.TextHyper):
    """The world's text finetune: ``yukino.TextHyper`` and the items it renders."""

    start: str = "semclip"  # the text variant it is finetuned from
    items: int = 8000  # hard-negative items; each gives two images and two captions
    batch_items: int = 64
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 100


def both_halves(n: int, batch_items: int, seed: int, salt: int) -> yukino.Rows:
    """Rows of ``batch_items`` items drawn from (seed, step), with both images and both captions of
    every item (row i and its twin i + n)."""

    def rows(step: int) -> torch.Tensor:
        chosen = torch.from_numpy(np.random.default_rng([seed, step, salt]).choice(n, size=batch_items, replace=False))
        return torch.cat([chosen, chosen + n])

    return rows


def _checkpoints(out_dir: Path | None, name: str, every: int, settings: dict) -> Checkpoints:
    return Checkpoints(None if out_dir is None else out_dir / f"{name}.checkpoint.pt", every=every, settings=settings)


def train_yukino_text(
    base: CLIP,
    start: CLIP,
    cfg: YukinoTextConfig,
    out_dir: Path | None = None,
    log=print,  # noqa: ANN001
    *,
    preprocess: PreprocessConfig,
) -> dict[str, torch.Tensor]:
    """The text variant YUKINO matches in; returns its state dict. ``preprocess``: the base version's."""
    t0 = time.time()
    items = hard_negative_set(Split.TRAIN, cfg.seed + 700, cfg.items)
    scenes = [h.scene for h in items] + [h.negative_scene for h in items]
    captions = [h.positive for h in items] + [h.negative for h in items]
    images = encode_images(
        base.to(cfg.device).eval(),
        preprocess,
        render_batch(scenes, base.visual.image_size[0], seed=cfg.seed + 29),
        device=cfg.device,
    )
    n = len(items)
    data = yukino.TextData(
        tokens=Tokenize(start.context_length)(captions),
        images=images,
        twins=torch.cat([torch.arange(n, 2 * n), torch.arange(n)]),
        structure=torch.from_numpy(np.stack([scene_features(s) for s in scenes])),
    )
    log(f"yukino text: {len(scenes)} images and captions prepared in {time.time() - t0:.1f}s")
    torch.manual_seed(cfg.seed)
    state, history = yukino.finetune_text(
        start, data, both_halves(n, cfg.batch_items, cfg.seed, 71), cfg,
        runtime=Runtime(cfg.seed, cfg.device, log=log), extra=SceneEncoder(images.shape[1]),
        checkpoints=_checkpoints(out_dir, "yukino_text", cfg.checkpoint_every, asdict(cfg)),
    )  # fmt: skip
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "yukino_text_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}))
    return state


@dataclass
class YukinoConfig(yukino.Hyper):
    """The world's inverter: ``yukino.Hyper`` and the items it renders."""

    steps: int = 4000
    text_encoder: str = "yukino"
    items: int = 6000  # hard-negative items; each gives two images and two captions
    batch_items: int = 64  # hard-negative items per batch: 128 images and their 128 captions
    seed: int = 0
    device: str = "cpu"
    checkpoint_every: int = 100


def concept_embeddings(model: CLIP) -> torch.Tensor:
    """Token embeddings of the world's concept words."""
    return yukino.concept_embeddings(model, Tokenize(model.context_length), CONCEPT_WORDS)


def oti(text_model: CLIP, targets: torch.Tensor, cfg: yukino.OTIHyper, device: str = "cpu") -> torch.Tensor:
    """OTI's pseudo-tokens of ``targets`` with the world's concept words."""
    return yukino.oti(text_model, targets, concept_embeddings(text_model), cfg, device)


def train_inverter(
    base: CLIP,
    text_model: CLIP,
    cfg: YukinoConfig,
    out_dir: Path | None = None,
    log=print,  # noqa: ANN001
    *,
    preprocess: PreprocessConfig,
) -> YukinoHead:
    """The inverter into ``text_model`` (``cfg.text_encoder``), taught by OTI on its first
    ``cfg.oti_items`` images."""
    torch.manual_seed(cfg.seed)
    t0 = time.time()
    items = hard_negative_set(Split.TRAIN, cfg.seed + 500, cfg.items)
    scenes = [h.scene for h in items] + [h.negative_scene for h in items]
    captions = [h.positive for h in items] + [h.negative for h in items]
    base = base.to(cfg.device).eval()
    pixels = render_batch(scenes, base.visual.image_size[0], seed=cfg.seed + 23)
    tokens = encode_image_tokens(base, preprocess, pixels, device=cfg.device)
    text_model = text_model.to(cfg.device).eval()
    for p in text_model.parameters():
        p.requires_grad_(False)
    cap = encode_texts(text_model, Tokenize(text_model.context_length), captions, device=cfg.device)
    log(f"yukino: {len(scenes)} images and captions encoded in {time.time() - t0:.1f}s")
    t0 = time.time()
    n_oti = min(cfg.oti_items, len(scenes))
    teacher = oti(text_model, tokens[:n_oti, 0], cfg.oti, cfg.device)
    log(f"yukino: OTI tokens of {n_oti} images in {time.time() - t0:.1f}s")
    head, history = yukino.train_inverter(
        text_model, cfg.text_encoder, yukino.InverterData(tokens, cap, teacher),
        both_halves(len(items), cfg.batch_items, cfg.seed, 61), cfg, runtime=Runtime(cfg.seed, cfg.device, log=log),
        checkpoints=_checkpoints(out_dir, "yukino", cfg.checkpoint_every, asdict(cfg)),
    )  # fmt: skip
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "yukino_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}))
    return head


__all__ = [
    "CONCEPT_WORDS",
    "OTIConfig",
    "YukinoConfig",
    "YukinoTextConfig",
    "concept_embeddings",
    "oti",
    "train_inverter",
    "train_yukino_text",
]
