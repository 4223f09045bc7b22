"""SemCLIP on the shapes world: caption triplets (original, paraphrase, negation) of TEST or HELDOUT
scenes, and paraphrase consistency over the grammar's paraphrase forms on their objects' phrases;
the figures are ``training.evaluation.methods.semclip``'s and ``...methods.paraphrase``'s."""

from __future__ import annotations

from collections.abc import Sequence
from functools import partial

import numpy as np

from training.evaluation.methods.paraphrase import paraphrase_consistency
from training.evaluation.methods.semclip import prompt_accuracy, triplet_figures
from training.evaluation.world.base import EvalBase, generator_images
from training.generate.negation_grammar import PARAPHRASE_FORMS
from training.world.captions import noun_phrase
from training.world.scene import Split
from training.world.semantic import NEGATION_KINDS, triplet_set
from training.world.vocab import SHAPES


class SemClipEval(EvalBase):
    def semclip(self, seed: int, split: Split, encoders: Sequence[str]) -> dict[str, dict[str, float]]:
        """Original-over-negation accuracy, top-1 text-to-image retrieval of original and
        paraphrased captions among the set's images, the composite score, and the zero-shot
        shape accuracy with "this is a photo of a X." vs "this is not a photo of a X." prompts
        (a model that reads "not" picks a wrong shape for the negated prompts)."""
        triplets = triplet_set(split, seed, self.cfg.n_semclip)
        images = self.images(generator_images([t.scene for t in triplets]))
        singles = [t.scene for t in triplets if len(t.scene.objects) == 1]
        single_images = images[[len(t.scene.objects) == 1 for t in triplets]]
        truth = np.array([s.objects[0].shape for s in singles])
        kinds = np.array([t.negation_kind for t in triplets])
        out: dict[str, dict[str, float]] = {}
        for enc in encoders:
            orig = self.texts([t.original for t in triplets], enc)
            para = self.texts([t.paraphrase for t in triplets], enc)
            neg = self.texts([t.negation for t in triplets], enc)
            figures = triplet_figures(images, orig, para, neg, kinds, NEGATION_KINDS)
            for form, template in (
                ("photo", "this is a photo of a {}."),
                ("not_photo", "this is not a photo of a {}."),
            ):
                classes = self.texts([template.format(shape) for shape in SHAPES], enc)
                figures[f"zeroshot_{form}"] = prompt_accuracy(single_images, classes, SHAPES, truth)
            figures["photo_minus_not"] = figures["zeroshot_photo"] - figures["zeroshot_not_photo"]
            out[enc] = figures
        return out

    def paraphrase_forms(self, seed: int, split: Split = Split.TEST) -> dict[str, dict[str, float]]:
        """Per text encoder, paraphrase consistency (``training.evaluation.methods.paraphrase``) on the
        distinct phrases ("red circle", "large red circle") of ``n_semclip`` scenes' objects."""
        scenes = [t.scene for t in triplet_set(split, seed, self.cfg.n_semclip)]
        phrases = sorted({noun_phrase(o, size=size) for s in scenes for o in s.objects for size in (False, True)})
        return {enc: paraphrase_consistency(phrases, partial(self.texts, encoder=enc), PARAPHRASE_FORMS)
                for enc in self.encoders}  # fmt: skip
