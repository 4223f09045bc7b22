"""YUKINO: its text encoder, optimisation-based textual inversion (OTI) and the distilled inverter.

YUKINO matches captions in the linguistic space of a text encoder, which must tell apart
captions that differ only in which attribute belongs to which object, or in a relation. The
shapes-world base encoders do not (``training.caption_probe``: even the ground-truth scene
gets 2x2 group 0.04-0.07 through them, 0.50 through this variant), so ``train_yukino_text``
first finetunes a text variant for it. Inversion and inverter then work in the input space of
that frozen variant and keep the image tower frozen.

* ``train_yukino_text``: from the SemCLIP variant, on batches that hold both images and both
  captions of hard-negative items (a swap is always a candidate), a contrastive loss between
  each caption and its ground-truth scene (``training.world.structure.SceneEncoder``, trained
  alongside, then dropped), which makes swapped captions embed apart; plus, at a small weight,
  the CLIP loss against the frozen image embeddings with each item's swapped partner left out
  of the negatives (pooled embeddings of a swap are near-identical, and contrasting them would
  pull the two captions back together), which keeps the variant usable for plain cosine.

* ``oti``: per image, gradient steps on one pseudo-token ``v*`` under
  ``clipcore.methods.losses.yukino_oti_loss`` (yes prompt toward the image embedding, no prompt
  away, ``v*`` near real concept-word embeddings). Slow: it is the teacher and the reference.
* ``train_inverter``: the 3-layer MLP from the image's class + patch tokens to ``v*``, trained
  with ``yukino_matching_loss`` (each image picks its caption, each caption its image) on
  batches of hard-negative items with both images and both captions (swapped colours, reversed
  relations, negations), plus a distillation term toward OTI's tokens.
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from open_clip.model import CLIP

from clipcore.methods.losses import clip_contrastive_loss, yukino_oti_loss
from clipcore.models.clip_model import normalize, text_features, tokenizer_for
from clipcore.models.preprocess import PreprocessConfig
from clipcore.models.yukino import YukinoHead, prompt_features
from training.encode import Tokenize, encode_image_tokens, encode_images, encode_texts
from training.methods import yukino
from training.text_finetune import finetune_text_tower
from training.world.hard_negatives import hard_negative_set
from training.world.render import render_batch
from training.world.scene import Split
from training.world.structure import SceneEncoder, scene_features
from training.world.vocab import COLOUR_NAMES, SHAPES, SIZES

CONCEPT_WORDS: tuple[str, ...] = (*SHAPES, *COLOUR_NAMES, *SIZES, "shape")


@dataclass
class OTIConfig:
    steps: int = 150
    lr: float = 0.02
    margin: float = 0.2
    reg_weight: float = 0.1
    batch_size: int = 256


@dataclass
class YukinoTextConfig:
    start: str = "semclip"  # the text variant it is finetuned from
    items: int = 8000  # hard-negative items; each gives two images and two captions
    steps: int = 2000
    batch_items: int = 64
    lr: float = 1e-3
    scene_lr: float = 1e-3  # the scene encoder, trained from scratch alongside
    image_weight: float = 0.2  # the CLIP term against the frozen image embeddings
    scale: float = 100.0
    seed: int = 0
    device: str = "cpu"


def train_yukino_text(
    base: CLIP,
    start: CLIP,
    cfg: YukinoTextConfig,
    out_dir: Path | None = None,
    log=print,  # noqa: ANN001
    *,
    preprocess: PreprocessConfig,
) -> dict[str, torch.Tensor]:
    """The text variant YUKINO matches in (see the module docstring); returns its state dict.
    ``preprocess``: the base version's."""
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
    targets = torch.from_numpy(np.stack([scene_features(s) for s in scenes]))
    tokens = Tokenize(start.context_length)(captions)
    log(f"yukino text: {len(scenes)} images and captions prepared in {time.time() - t0:.1f}s")
    torch.manual_seed(cfg.seed)
    scene_encoder = SceneEncoder(images.shape[1]).to(cfg.device)
    rng = np.random.default_rng([cfg.seed, 71])
    n, b = len(items), cfg.batch_items
    partner = torch.roll(torch.eye(2 * b, dtype=torch.bool), b, dims=1)  # row i <-> its swapped twin

    def step_loss(model: CLIP, step: int) -> tuple[torch.Tensor, str]:
        chosen = torch.from_numpy(rng.choice(n, size=b, replace=False))
        idx = torch.cat([chosen, chosen + n])  # both images and both captions of every item
        feats = normalize(text_features(model, tokens[idx].to(cfg.device))[0].float())
        scenes_v = F.normalize(scene_encoder(targets[idx].to(cfg.device)), dim=-1)
        scene = clip_contrastive_loss(scenes_v, feats, cfg.scale)
        image = clip_contrastive_loss(images[idx].to(cfg.device), feats, cfg.scale, exclude=partner)
        return scene + cfg.image_weight * image, f"scene {scene.item():.3f} image {image.item():.3f}"

    state, history = finetune_text_tower(
        start, step_loss, steps=cfg.steps, lr=cfg.lr, seed=cfg.seed, device=cfg.device, label="yukino text",
        extra=list(scene_encoder.parameters()), extra_lr=cfg.scene_lr,
    )  # fmt: skip
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "yukino_text_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}))
    return state


@dataclass
class YukinoConfig:
    text_encoder: str = "yukino"
    items: int = 6000  # hard-negative items; each gives two images and two captions
    oti_items: int = 1000  # images distilled from OTI tokens
    steps: int = 4000
    batch_items: int = 64  # hard-negative items per batch: 128 images and their 128 captions
    lr: float = 3e-4
    width: int = 512
    scale: float = 100.0
    distill_weight: float = 0.5
    seed: int = 0
    device: str = "cpu"


def concept_embeddings(model: CLIP) -> torch.Tensor:
    """Token embeddings of the world's concept words (first BPE token of each)."""
    tok = tokenizer_for(model.context_length)
    ids = [tok.encode(w)[0] for w in CONCEPT_WORDS]
    return model.token_embedding.weight[ids].detach()


def oti(text_model: CLIP, targets: torch.Tensor, cfg: OTIConfig, device: str = "cpu") -> torch.Tensor:
    """Pseudo-tokens ``(N, W)`` for ``(N, D)`` normalised image embeddings, optimised per image."""
    concepts = concept_embeddings(text_model).to(device)
    for p in text_model.parameters():
        p.requires_grad_(False)
    out = []
    for i in range(0, len(targets), cfg.batch_size):
        out.append(_oti_batch(text_model, targets[i : i + cfg.batch_size].to(device), concepts, cfg))
    return torch.cat(out)


@torch.enable_grad()  # also when the caller (an evaluation) runs without gradients
def _oti_batch(text_model: CLIP, g: torch.Tensor, concepts: torch.Tensor, cfg: OTIConfig) -> torch.Tensor:
    v = concepts.mean(0, keepdim=True).repeat(len(g), 1).clone().requires_grad_(True)
    opt = torch.optim.Adam([v], lr=cfg.lr)
    for _ in range(cfg.steps):
        yes, no = prompt_features(text_model, v, text_model.context_length)
        loss = yukino_oti_loss(yes, no, g, v, concepts, cfg.margin, cfg.reg_weight).sum()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    return v.detach().cpu()


def train_inverter(
    base: CLIP,
    text_model: CLIP,
    cfg: YukinoConfig,
    oti_cfg: OTIConfig | None = None,
    out_dir: Path | None = None,
    log=print,  # noqa: ANN001
    *,
    preprocess: PreprocessConfig,
) -> YukinoHead:
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
    teacher = oti(text_model, tokens[:n_oti, 0], oti_cfg or OTIConfig(), cfg.device)
    log(f"yukino: OTI tokens of {n_oti} images in {time.time() - t0:.1f}s")
    rng = np.random.default_rng([cfg.seed, 61])

    def rows(step: int) -> torch.Tensor:
        chosen = torch.from_numpy(rng.choice(len(items), size=cfg.batch_items, replace=False))
        return torch.cat([chosen, chosen + len(items)])  # both images and both captions of every item

    hyper = yukino.Hyper(steps=cfg.steps, lr=cfg.lr, width=cfg.width, scale=cfg.scale,
                         distill_weight=cfg.distill_weight)  # fmt: skip
    head, history = yukino.train_inverter(
        text_model, cfg.text_encoder, yukino.InverterData(tokens, cap, teacher), rows, hyper, seed=cfg.seed,
        device=cfg.device, log_every=500, log=log,
    )  # fmt: skip
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "yukino_history.json").write_text(json.dumps({"config": asdict(cfg), "history": history}))
    return head


__all__ = [
    "OTIConfig",
    "YukinoConfig",
    "YukinoTextConfig",
    "oti",
    "train_inverter",
    "train_yukino_text",
]
