"""What every family of the evaluation shares: its config, the two image renderers, and an
evaluator base that caches text and image embeddings of one model version."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np

from clipcore.models.bundle import ModelBundle
from clipcore.tasks import flat_prompts, label_embeddings, label_prompts
from training.world.render import draw_scene_pil, render_batch
from training.world.scene import Scene

ImageSource = Callable[[Sequence[Scene]], np.ndarray]


@dataclass
class EvalConfig:
    seeds: tuple[int, ...] = (0, 1, 2)
    n_zeroshot: int = 500
    n_pairs: int = 400
    n_compositional: int = 300  # hard-negative items per kind and image source
    n_pil: int = 200
    n_calibration: int = 1500
    n_yukino: int = 200  # 2x2 items (two images, two captions) for YUKINO
    n_semclip: int = 500  # caption triplets per split (retrieval is among this many images)
    n_negation: int = 200  # scenes for two-sided negation (each asked both sides of every form)
    n_retrieval: int = 100  # retrieval items per kind of hard negative and per difference attribute
    seed_offset: int = 1000  # evaluation seeds never coincide with training seeds


def generator_images(scenes: Sequence[Scene]) -> np.ndarray:
    return render_batch(list(scenes), 64, seed=None)


def pil_images(bundle: ModelBundle) -> ImageSource:
    """The second renderer: PIL drawings at 224 px on flat backgrounds, resized by the service path."""
    backgrounds = ((255, 255, 255), (0, 0, 0), (235, 235, 235), (40, 40, 40))

    def draw(scenes: Sequence[Scene]) -> np.ndarray:
        return np.stack([bundle.preprocess(draw_scene_pil(s, 224, backgrounds[i % 4])) for i, s in enumerate(scenes)])

    return draw


class EvalBase:
    """Cached embeddings of one version; the families below are mixins over it."""

    def __init__(self, bundle: ModelBundle, cfg: EvalConfig) -> None:
        self.bundle, self.cfg = bundle, cfg
        self.encoders = list(bundle.text_models)
        self._text_cache: dict[tuple[str, str], np.ndarray] = {}
        self._image_sets: dict[tuple[int, int], tuple[np.ndarray, np.ndarray]] = {}

    def texts(self, texts: Sequence[str], encoder: str) -> np.ndarray:
        missing = [t for t in dict.fromkeys(texts) if (encoder, t) not in self._text_cache]
        for i in range(0, len(missing), 512):
            chunk = missing[i : i + 512]
            for t, e in zip(chunk, self.bundle.encode_texts(chunk, encoder)):
                self._text_cache[(encoder, t)] = e
        return np.stack([self._text_cache[(encoder, t)] for t in texts])

    def images(self, arrays: np.ndarray) -> np.ndarray:
        return np.concatenate([self.bundle.encode_images(arrays[i : i + 256]) for i in range(0, len(arrays), 256)])

    def classifier(self, labels: Sequence[str], templates: Sequence[str], encoder: str) -> np.ndarray:
        prompts = label_prompts(labels, templates)
        return label_embeddings(prompts, self.texts(flat_prompts(prompts), encoder))[0]
