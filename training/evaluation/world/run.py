"""Every family of the evaluation on each seed, reported as the mean and standard error over seeds.

Every figure is computed on TEST (held-out scenes) or HELDOUT (colour-shape combinations
never rendered in training) splits, per evaluation seed, then reported as the mean and
standard error over seeds. Keys are flat, e.g. ``pcclip.rank_pair.size``; every text-encoder
variant of the version is evaluated beside ``base``. All scoring goes through the bundle
and ``clipcore.methods`` so the figures describe exactly what the service computes.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np

from clipcore.models.bundle import ModelBundle
from model_store.evaluation import bind
from training.evaluation.methods.negation import flat_figures
from training.evaluation.methods.paraphrase import flat_figures as paraphrase_flat
from training.evaluation.methods.retrieval import retrieval_gains
from training.evaluation.world.base import EvalConfig, generator_images, pil_images
from training.evaluation.world.comparatives import ComparativeEval
from training.evaluation.world.dcsm import DenseEval
from training.evaluation.world.geometry import GeometryEval
from training.evaluation.world.negation import NegationEval
from training.evaluation.world.pcclip import PairRankEval
from training.evaluation.world.retrieval import RetrievalEval
from training.evaluation.world.semclip import SemClipEval
from training.evaluation.world.yukino import YukinoEval
from training.evaluation.world.zero_shot import ZeroShotEval
from training.world.scene import Split, sample_scene


class Evaluator(
    ZeroShotEval,
    PairRankEval,
    DenseEval,
    NegationEval,
    ComparativeEval,
    SemClipEval,
    YukinoEval,
    GeometryEval,
    RetrievalEval,
):
    """Every family over one model version."""

    def run_seed(self, seed: int) -> tuple[dict[str, float], dict[str, object]]:
        flat: dict[str, float] = {}
        details: dict[str, object] = {}
        sets = {
            "zeroshot": [sample_scene(Split.TEST, seed, i, n_objects=1) for i in range(self.cfg.n_zeroshot)],
            "zeroshot_heldout": [sample_scene(Split.HELDOUT, seed, i, n_objects=1) for i in range(self.cfg.n_zeroshot)],
        }
        embs = {k: self.images(generator_images(v)) for k, v in sets.items()}
        pil_scenes = sets["zeroshot"][: self.cfg.n_pil]
        embs["zeroshot_pil"] = self.images(pil_images(self.bundle)(pil_scenes))
        sets["zeroshot_pil"] = pil_scenes
        for enc in self.encoders:
            for name, scenes in sets.items():
                for attr, v in self.zero_shot(scenes, embs[name], enc).items():
                    flat[f"{enc}.{name}.{attr}"] = v
        pairs = self.rank_pairs(seed, self.cfg.n_pairs)
        for enc, accs in self.rank_accuracy(pairs, generator_images, self.encoders).items():
            flat.update({f"{enc}.rank_pair.{k}": v for k, v in accs.items()})
        pil_pairs = {k: tuple(x[: self.cfg.n_pil] for x in v) for k, v in pairs.items()}
        for enc, accs in self.rank_accuracy(pil_pairs, pil_images(self.bundle), self.encoders).items():
            flat.update({f"{enc}.rank_pair_pil.{k}": v for k, v in accs.items()})
        flat.update(self.dense(seed))
        negation = self.negation_forms(seed)
        flat.update(flat_figures(negation))
        details["negation_forms"] = negation
        paraphrases = self.paraphrase_forms(seed)
        flat.update(paraphrase_flat(paraphrases))
        details["paraphrase_forms"] = paraphrases
        flat.update(self.retrieval(seed))
        if self.bundle.yukino is not None:
            figures, timing = self.yukino(seed)
            flat.update(figures)
            details["yukino.timing"] = timing
        for split, suffix in ((Split.TEST, ""), (Split.HELDOUT, "_heldout")):
            for enc, figures in self.semclip(seed, split, self.encoders).items():
                flat.update({f"{enc}.semclip{suffix}.{k}": v for k, v in figures.items()})
        for enc in self.encoders:
            comp = self.comparative(seed, enc)
            for k in (
                "standard.confused",
                "standard.overall",
                "selected.confused",
                "selected.overall",
                "paper_default.confused",
            ):
                flat[f"{enc}.comparative.{k}"] = comp[k]  # type: ignore[assignment]
            details[f"{enc}.comparative"] = {k: comp[k] for k in ("pairs", "selected", "sweep")}
            details[f"{enc}.text_geometry"] = self.text_geometry(enc)
        return flat, details


def dense_gains(flat: dict[str, float]) -> dict[str, float]:
    """What DCSM adds over cosine on the same hard negatives of one seed (``gain.dcsm.<kind>``, e.g.
    ``gain.dcsm.heldout.negation``): averaged over seeds like every figure, so its standard error is
    that of the paired difference, and the gate's policy can require a minimum of it."""
    return {
        f"gain.{key}": value - flat[f"cosine.{key[len('dcsm.') :]}"]
        for key, value in flat.items()
        if key.startswith("dcsm.") and f"cosine.{key[len('dcsm.') :]}" in flat
    }


def evaluate(bundle: ModelBundle, cfg: EvalConfig | None = None, log: Callable[[str], None] = print) -> dict:
    """Mean and standard error over seeds of every flat metric, plus per-seed details."""
    cfg = cfg or EvalConfig()
    ev = Evaluator(bundle, cfg)
    runs, details = [], {}
    for seed in cfg.seeds:
        flat, det = ev.run_seed(cfg.seed_offset + seed)
        flat.update(dense_gains(flat))
        flat.update(retrieval_gains(flat))
        runs.append(flat)
        details[str(seed)] = det
        log(f"seed {seed}: {len(flat)} metrics")
    metrics: dict[str, float] = {}
    for key in runs[0]:
        values = np.array([r[key] for r in runs], dtype=float)
        metrics[key] = float(np.mean(values))
        metrics[f"{key}.stderr"] = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
    samples = {
        "zeroshot": cfg.n_zeroshot,
        "rank_pair": cfg.n_pairs,
        "pil": cfg.n_pil,
        "compositional": cfg.n_compositional,
        "comparative": cfg.n_calibration,
        "retrieval": cfg.n_retrieval,
    }
    # Bound to the weights evaluated (their digests), so a copy of it in another version is no evaluation there.
    report = {"model": bundle.ref, "metrics": metrics, "seeds": list(cfg.seeds), "samples": samples, "details": details}
    return bind(report, bundle.manifest)
