"""Comparative prompting's figures: zero-shot with and without comparatives, overall and on the
classes the comparatives name (the "confused" ones).

The classifier is the service's ``POST /classify``: probabilities of each label's class embedding
(``clipcore.methods.zero_shot``), and with comparatives the class embeddings blended by
``apply_comparatives`` and gated by the standard answer's margin (``gated_probs``). A data source
gives the image embeddings, their true classes and the comparatives as (target, source, unit
direction) triples; a user's dataset evaluates at the service's request settings, the shapes world
also chooses the settings on a calibration set (``calibrated_sweep``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from clipcore.methods.common import l2_normalize
from clipcore.methods.comparative import apply_comparatives, gated_probs
from clipcore.methods.zero_shot import zero_shot_probs
from clipcore.models.bundle import ModelBundle
from clipcore.tasks import flat_prompts, label_embeddings, label_prompts

Comparative = tuple[int, int, np.ndarray]  # target class, source class, unit direction


def library_for(library: Sequence[dict], labels: Sequence[str]) -> list[tuple[str, str, str]]:
    """The library's comparatives whose two labels are both among ``labels`` (as the service selects)."""
    known = set(labels)
    return [(str(c["a"]), str(c["b"]), str(c["text"])) for c in library if c["a"] in known and c["b"] in known]


def comparative_probs(
    images: np.ndarray,
    classes: np.ndarray,
    comparatives: Sequence[Comparative],
    scale: float,
    alpha: float,
    symmetric: bool,
    gate: float | None,
) -> tuple[np.ndarray, np.ndarray | None]:
    """(standard probabilities, probabilities with comparatives); the second is None without
    comparatives."""
    standard = zero_shot_probs(images, classes, scale)
    if not comparatives:
        return standard, None
    blended = zero_shot_probs(images, apply_comparatives(classes, comparatives, alpha, symmetric), scale)
    probs, _ = gated_probs(standard, blended, gate)
    return standard, probs


def confused_accuracy(pred: np.ndarray, y: np.ndarray, targeted: Sequence[int]) -> float:
    """Accuracy on the images whose true class a comparative names (NaN when there are none)."""
    mask = np.isin(y, targeted)
    return float(np.mean(pred[mask] == y[mask])) if mask.any() else math.nan


class ComparativeClassifier:
    """``POST /classify`` over ``labels`` with one text encoder: the prompts of each label and the
    version's comparatives among those labels, at the given request settings."""

    def __init__(
        self,
        bundle: ModelBundle,
        labels: Sequence[str],
        encoder: str,
        templates: Sequence[str] | None,
        alpha: float,
        symmetric: bool,
        gate_margin: float | None,
    ) -> None:
        self.labels, self.scale = list(labels), bundle.logit_scale
        self.alpha, self.symmetric, self.gate_margin = alpha, symmetric, gate_margin
        prompts = label_prompts(self.labels, templates)
        self.comps = library_for(bundle.comparatives, self.labels)
        texts = flat_prompts(prompts) + [t for _, _, t in self.comps]
        vectors = bundle.encode_texts(texts, encoder) if texts else np.zeros((0, bundle.embed_dim))
        self.classes, offset = label_embeddings(prompts, vectors)
        index = {label: i for i, label in enumerate(self.labels)}
        d = l2_normalize(vectors[offset:]) if self.comps else vectors[offset:]
        self.triples = [(index[a], index[b], d[k]) for k, (a, b, _) in enumerate(self.comps)]
        self.targeted = sorted({index[x] for a, b, _ in self.comps for x in (a, b)})

    def predict(self, images: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Standard predictions and, where there are comparatives for these labels, the
        comparative ones."""
        standard, comparative = comparative_probs(images, self.classes, self.triples, self.scale, self.alpha,
                                                  self.symmetric, self.gate_margin)  # fmt: skip
        return standard.argmax(1), None if comparative is None else comparative.argmax(1)

    def figures(self, y: np.ndarray, standard: np.ndarray, comparative: np.ndarray) -> dict[str, float]:
        """Accuracy with comparatives, overall and on the confused classes, beside the standard
        accuracy on those classes."""
        return {
            "zeroshot_comparative.acc": float(np.mean(comparative == y)),
            "zeroshot.confused_acc": confused_accuracy(standard, y, self.targeted),
            "zeroshot_comparative.confused_acc": confused_accuracy(comparative, y, self.targeted),
        }


def calibrated_sweep(
    calibration: tuple[np.ndarray, np.ndarray],
    test: tuple[np.ndarray, np.ndarray],
    classes: np.ndarray,
    comparatives: Sequence[Comparative],
    targeted: Sequence[int],
    scale: float,
) -> dict[str, object]:
    """Accuracy (on the confused classes and overall) without comparatives and with the setting
    (alpha, symmetric, margin gate) chosen on the calibration images, reported on the disjoint test
    images; also the paper's default setting and the whole sweep."""

    def accuracy(x: np.ndarray, y: np.ndarray, alpha: float, sym: bool, gate: float | None) -> tuple[float, float]:
        standard, comparative = comparative_probs(x, classes, comparatives, scale, alpha, sym, gate)
        pred = (standard if comparative is None else comparative).argmax(1)
        return confused_accuracy(pred, y, targeted), float(np.mean(pred == y))

    (cal_x, cal_y), (test_x, test_y) = calibration, test
    sweep = []
    for alpha in (0.5, 0.7, 0.8, 0.9):
        for sym in (False, True):
            for gate in (None, 0.2, 0.5):
                cal = accuracy(cal_x, cal_y, alpha, sym, gate)
                result = accuracy(test_x, test_y, alpha, sym, gate)
                sweep.append(
                    {
                        "alpha": alpha,
                        "symmetric": sym,
                        "gate": gate,
                        "cal_confused": cal[0],
                        "cal_overall": cal[1],
                        "confused": result[0],
                        "overall": result[1],
                    }
                )
    base_test = accuracy(test_x, test_y, 1.0, False, None)
    base_cal_overall = accuracy(cal_x, cal_y, 1.0, False, None)[1]

    def selection_score(r: dict) -> tuple[float, float]:
        # Gain on the confused classes, penalising any loss of overall accuracy.
        return r["cal_confused"] - 2 * max(0.0, base_cal_overall - r["cal_overall"]), -r["alpha"]

    best = max(sweep, key=selection_score)
    return {
        "standard.confused": base_test[0],
        "standard.overall": base_test[1],
        "selected.confused": best["confused"],
        "selected.overall": best["overall"],
        "selected": {k: best[k] for k in ("alpha", "symmetric", "gate")},
        "paper_default.confused": next(
            r["confused"] for r in sweep if r["alpha"] == 0.9 and not r["symmetric"] and r["gate"] is None
        ),
        "sweep": sweep,
    }
