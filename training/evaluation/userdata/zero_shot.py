"""Zero-shot accuracy on the user's labels, with and without the version's comparatives library.

The classifier is exactly the service's ``POST /classify``: the prompts of each label
(``clipcore.tasks``), the comparatives of the version's library whose two labels are both among the
dataset's labels, blended by ``apply_comparatives`` at the request defaults (alpha 0.9, one-sided,
no margin gate). "Confused classes" are the labels those comparatives name: the pairs the library
was built for (the top off-diagonal entries of a calibration confusion matrix).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from clipcore.methods.common import l2_normalize
from clipcore.methods.comparative import apply_comparatives, confused_pairs, gated_probs
from clipcore.tasks import flat_prompts, label_embeddings, label_prompts, label_scores
from training.datasets.records import LabelRecord
from training.evaluation.userdata.data import EvalSet, UserEvalConfig, sample


def library_for(library: Sequence[dict], labels: Sequence[str]) -> list[tuple[str, str, str]]:
    """The library's comparatives whose two labels are both among ``labels`` (as the service selects)."""
    known = set(labels)
    return [(str(c["a"]), str(c["b"]), str(c["text"])) for c in library if c["a"] in known and c["b"] in known]


def confusion(y_true: np.ndarray, y_pred: np.ndarray, n: int) -> np.ndarray:
    return np.bincount(y_true * n + y_pred, minlength=n * n).reshape(n, n)


class ZeroShot:
    """Zero-shot figures of one encoder on one evaluation set."""

    def __init__(self, es: EvalSet, cfg: UserEvalConfig, encoder: str) -> None:
        self.es, self.cfg, self.encoder = es, cfg, encoder
        self.labels = sorted({i.record.label for i in es.labelled})  # type: ignore[union-attr]
        bundle = es.bundle
        prompts = label_prompts(self.labels, cfg.templates)
        self.comps = library_for(bundle.comparatives, self.labels)
        texts = flat_prompts(prompts) + [t for _, _, t in self.comps]
        vectors = bundle.encode_texts(texts, encoder) if texts else np.zeros((0, bundle.embed_dim))
        self.classes, offset = label_embeddings(prompts, vectors)
        index = {label: i for i, label in enumerate(self.labels)}
        d = l2_normalize(vectors[offset:]) if self.comps else vectors[offset:]
        self.triples = [(index[a], index[b], d[k]) for k, (a, b, _) in enumerate(self.comps)]
        self.targeted = sorted({index[x] for a, b, _ in self.comps for x in (a, b)})

    def predict(self, emb: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """Standard predictions and, where the version has comparatives for these labels, the
        comparative ones."""
        scale = self.es.bundle.logit_scale
        probs, _ = label_scores(emb, self.classes, scale)
        if not self.triples:
            return probs.argmax(1), None
        blended = apply_comparatives(self.classes, self.triples, alpha=self.cfg.alpha, symmetric=self.cfg.symmetric)
        probs_cmp, _ = label_scores(emb, blended, scale)
        gated, _ = gated_probs(probs, probs_cmp, self.cfg.gate_margin)
        return probs.argmax(1), gated.argmax(1)

    def run(self, seed: int) -> tuple[dict[str, float], dict[str, object]]:
        items = sample(self.es.labelled, self.cfg.n_zeroshot, seed, salt=1)
        y = np.array([self.labels.index(i.record.label) for i in items if isinstance(i.record, LabelRecord)])
        emb = self.es.embed([i.images[0] for i in items])
        standard, comparative = self.predict(emb)
        n = len(self.labels)
        flat = {"zeroshot.acc": float(np.mean(standard == y))}
        per_class = {self.labels[c]: float(np.mean(standard[y == c] == c)) for c in range(n) if (y == c).any()}
        details: dict[str, object] = {
            "labels": self.labels,
            "encoder": self.encoder,
            "n_images": len(items),
            "per_class": per_class,
            "confusion": confusion(y, standard, n).tolist(),
            "confused_pairs": [(self.labels[a], self.labels[b], c) for a, b, c in confused_pairs(y, standard, n, 3)],
        }
        if comparative is not None:
            mask = np.isin(y, self.targeted)
            flat["zeroshot_comparative.acc"] = float(np.mean(comparative == y))
            flat["zeroshot.confused_acc"] = float(np.mean(standard[mask] == y[mask])) if mask.any() else float("nan")
            flat["zeroshot_comparative.confused_acc"] = (
                float(np.mean(comparative[mask] == y[mask])) if mask.any() else float("nan")
            )
            details["confusion_comparative"] = confusion(y, comparative, n).tolist()
            details["comparative_classes"] = [self.labels[c] for c in self.targeted]
            details["comparatives"] = len(self.comps)
        return flat, details
