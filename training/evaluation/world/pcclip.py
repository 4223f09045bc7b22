"""PC-CLIP pair ranking: which of two images is the 'first' of a difference text (base vs finetuned)."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.pairwise_rank import pair_scores
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
            swap = rng.random(len(texts)) < 0.5  # present the true first image as "b" half the time
            ga, gb = np.where(swap[:, None], g2, g1), np.where(swap[:, None], g1, g2)
            for enc in encoders:
                s = pair_scores(ga, gb, self.texts(texts, enc))
                out[enc][attribute] = float(np.mean((s > 0) != swap))
        return out
