"""DCSM dense scoring against plain cosine on binding, spatial and negation hard negatives."""

from __future__ import annotations

from training.dense_eval import dense_metrics
from training.evaluation.world.base import EvalBase


class DenseEval(EvalBase):
    def dense(self, seed: int) -> dict[str, float]:
        """DCSM (when the version has a scorer) and plain cosine on binding, spatial and negation
        hard negatives, plus the localisation of the dense features (training/dense_eval.py)."""
        return dense_metrics(
            self.bundle.model,
            getattr(self.bundle, "dcsm", None),
            seed,
            n=self.cfg.n_compositional,
            context_length=self.bundle.context_length,
            mean=self.bundle.mean,
            std=self.bundle.std,
            device=self.bundle.device,
        )
