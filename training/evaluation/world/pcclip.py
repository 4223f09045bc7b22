"""PC-CLIP pair ranking on the shapes world: pairs of single-object TEST scenes that differ in size
(also within one size class), colour or shape, drawn by either renderer; the figure is
``training.evaluation.methods.pcclip``'s."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from training.evaluation.methods.pcclip import presented, ranked_right, swapped
from training.evaluation.world.base import EvalBase, ImageSource
from training.world.differences import eval_text
from training.world.scene import Scene, Split, make_object, single_scene
from training.world.vocab import SIZE_RANGES


class PairRankEval(EvalBase):
    def rank_pairs(self, seed: int, n: int) -> dict[str, tuple[list[Scene], list[Scene], list[str]]]:
        """Per attribute: first scenes, second scenes, texts; the text is true of (first, second)."""
        rng = np.random.default_rng([seed, 21])
        sets: dict[str, tuple[list[Scene], list[Scene], list[str]]] = {}
        for attribute in ("size", "size_same_class", "colour", "shape"):
            firsts: list[Scene] = []
            seconds: list[Scene] = []
            texts: list[str] = []
            while len(texts) < n:
                if attribute == "size":
                    a, b = make_object(rng, Split.TEST, size="large"), make_object(rng, Split.TEST, size="small")
                elif attribute == "size_same_class":
                    cls = ("small", "medium", "large")[rng.integers(3)]
                    lo, hi = SIZE_RANGES[cls]
                    r2 = rng.uniform(lo, hi / 1.15)
                    r1 = rng.uniform(r2 * 1.15, hi)
                    a = make_object(rng, Split.TEST, size=cls, radius=r1)
                    b = make_object(rng, Split.TEST, size=cls, radius=r2)
                else:
                    a, b = make_object(rng, Split.TEST), make_object(rng, Split.TEST)
                    if getattr(a, attribute) == getattr(b, attribute):
                        continue
                text = eval_text("size" if attribute.startswith("size") else attribute, a, b)
                firsts.append(single_scene(a, rng))
                seconds.append(single_scene(b, rng))
                texts.append(text)
            sets[attribute] = (firsts, seconds, texts)
        return sets

    def rank_accuracy(self, sets: dict, source: ImageSource, encoders: Sequence[str]) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {e: {} for e in encoders}
        rng = np.random.default_rng(3)
        for attribute, (firsts, seconds, texts) in sets.items():
            g1, g2 = self.images(source(firsts)), self.images(source(seconds))
            swap = swapped(rng, len(texts))  # one stream over the attributes, in their order
            ga, gb = presented(g1, g2, swap)
            for enc in encoders:
                out[enc][attribute] = float(np.mean(ranked_right(ga, gb, self.texts(texts, enc), swap)))
        return out
