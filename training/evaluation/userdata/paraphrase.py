"""Paraphrase consistency over the grammar's paraphrase forms on a user's phrases (docs/negation.md):
the labels, and the phrases of up to ``n_captions`` caption records drawn by the seed, each read
by every text encoder of the version; figures as ``training.evaluation.methods.paraphrase``
defines them."""

from __future__ import annotations

from functools import partial

import numpy as np

from training.datasets.records import CaptionRecord, NegativesRecord
from training.evaluation.methods.paraphrase import paraphrase_consistency
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, sample
from training.generate.grammar_triplets import caption_phrase
from training.generate.negation_grammar import PARAPHRASE_FORMS


def paraphrase_forms(es: EvalSet, cfg: UserEvalConfig, seed: int) -> dict[str, dict[str, float]]:
    """Per text encoder, every paraphrase figure (empty with fewer than two distinct phrases)."""
    phrases = sorted({i.record.label for i in es.labelled})  # type: ignore[union-attr]
    captioned = [i for i in es.items if isinstance(i.record, CaptionRecord | NegativesRecord)]
    phrases += [caption_phrase(i.record.caption) for i in sample(captioned, cfg.n_captions, seed, salt=8)]  # type: ignore[union-attr]
    phrases = list(dict.fromkeys(phrases))
    if len(phrases) < 2:
        return {}
    return {enc: paraphrase_consistency(phrases, partial(_encode, es, enc), PARAPHRASE_FORMS)
            for enc in es.bundle.text_models}  # fmt: skip


def _encode(es: EvalSet, encoder: str, texts: list[str]) -> np.ndarray:
    return es.bundle.encode_texts(texts, encoder)
