"""YUKINO on the shapes world: 2x2 items of a TEST scene and its hard-negative scene, for plain
cosine, OTI (optimised per image here) and the inverter; the figures are
``training.evaluation.methods.yukino``'s."""

from __future__ import annotations

import time

import numpy as np
import torch

from clipcore.models.bundle import BASE_ENCODER
from clipcore.models.yukino import prompt_features
from training.evaluation.methods.yukino import cosine_2x2, winoground_by_kind, yes_no_2x2
from training.evaluation.world.base import EvalBase, generator_images
from training.train_yukino import OTIConfig, oti
from training.world.hard_negatives import KINDS, hard_negative_set
from training.world.scene import Split


class YukinoEval(EvalBase):
    def yukino(self, seed: int) -> tuple[dict[str, float], dict[str, float]]:
        """Winoground-style 2x2 items (an image and its hard-negative image, each with the caption
        true of it) and SugarCREPE-style swap tests (one image: its caption vs the swapped one),
        for plain cosine with the base encoder, OTI, and the distilled inverter; plus ms per image
        of OTI and of the inverter (details)."""
        head = self.bundle.yukino
        assert head is not None
        items = hard_negative_set(Split.TEST, seed, self.cfg.n_yukino)
        pix0 = generator_images([h.scene for h in items])
        pix1 = generator_images([h.negative_scene for h in items])
        kinds = np.array([h.kind for h in items])
        enc = head.text_encoder
        c0, c1 = self.texts([h.positive for h in items], enc), self.texts([h.negative for h in items], enc)
        b0, b1 = (
            self.texts([h.positive for h in items], BASE_ENCODER),
            self.texts([h.negative for h in items], BASE_ENCODER),
        )
        g0, g1 = self.images(pix0), self.images(pix1)
        start = time.perf_counter()
        p0, p1 = self.bundle.yukino_prompts(pix0), self.bundle.yukino_prompts(pix1)
        inverter_ms = (time.perf_counter() - start) * 1000 / (2 * len(items))
        text_model = self.bundle.text_model(enc)
        start = time.perf_counter()
        oti_prompts = []
        device = next(text_model.parameters()).device  # every tensor follows the model (CPU or CUDA)
        for g in (g0, g1):
            pseudo = oti(text_model, torch.from_numpy(g), OTIConfig(), device=str(device))
            with torch.no_grad():
                yes, no = prompt_features(text_model, pseudo.to(device), self.bundle.context_length)
            oti_prompts.append(np.stack([yes.float().cpu().numpy(), no.float().cpu().numpy()], axis=1))
        oti_ms = (time.perf_counter() - start) * 1000 / (2 * len(items))

        scores = {
            "base": cosine_2x2(g0, g1, b0, b1),
            "oti": yes_no_2x2(oti_prompts[0], oti_prompts[1], c0, c1),
            "yukino": yes_no_2x2(p0, p1, c0, c1),
        }
        flat = winoground_by_kind(scores, kinds, KINDS)
        return flat, {"oti_ms_per_image": oti_ms, "inverter_ms_per_image": inverter_ms}
