"""Every family the version and the data allow, per seed, as the mean and standard error over seeds.

Keys are flat and carry the dataset's name, e.g. ``data.fashion-mnist_test.zeroshot.acc`` or
``data.<name>.rank_pair.label.pcclip``, and what each component adds over the figure it
replaces (``data.<name>.gain.rank_pair.label.pcclip``: PC-CLIP's encoder minus the base encoder);
what could not be evaluated is listed under ``skipped`` with the reason (the version lacks the
component, or the data lacks the records). Figures exist only for components the version has
(``components`` in the section); ``figures.py`` names them.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from clipcore.models.bundle import BASE_ENCODER, ModelBundle
from model_store import Manifest
from model_store.evaluation import bind, provenance
from training.evaluation.methods.negation import flat_figures
from training.evaluation.methods.paraphrase import flat_figures as paraphrase_flat
from training.evaluation.userdata.data import UserEvalConfig, load_eval_set
from training.evaluation.userdata.dcsm import dense_vs_cosine
from training.evaluation.userdata.figures import describe, gain_key
from training.evaluation.userdata.negation import negation_forms
from training.evaluation.userdata.paraphrase import paraphrase_forms
from training.evaluation.userdata.pcclip import pair_ranking
from training.evaluation.userdata.retrieval import retrieval
from training.evaluation.userdata.semclip import negation_by_encoder
from training.evaluation.userdata.yukino import yukino_2x2
from training.evaluation.userdata.zero_shot import ZeroShot


def skipped_families(bundle: ModelBundle, zero_shot: ZeroShot | None, has_captions: bool) -> dict[str, str]:
    out: dict[str, str] = {}
    if zero_shot is None:
        out["zeroshot"] = "the evaluated records have fewer than two labels"
    elif not zero_shot.comps:
        out["comparative"] = f"{bundle.ref} has no comparatives for these labels (run `clip-train comparatives`)"
    if "pcclip" not in bundle.text_models:
        out["pcclip"] = f"{bundle.ref} has no PC-CLIP text encoder (pair ranking is reported for the base only)"
    if bundle.dcsm is None:
        out["dcsm"] = f"{bundle.ref} has no DCSM scorer (hard negatives are scored by cosine only)"
    if not any(k.startswith("semclip") for k in bundle.text_models):
        out["semclip"] = f"{bundle.ref} has no SemCLIP text encoder (negation is reported for the encoders it has)"
    if bundle.yukino is None:
        out["yukino"] = f"{bundle.ref} has no YUKINO head (2x2 items are scored by cosine only)"
    if not has_captions:
        out["captions"] = "no caption records: hard negatives and negations are made from label captions"
    return out


def components_of(bundle: ModelBundle, zero_shot: ZeroShot | None) -> dict[str, Any]:
    """What the version has that figures depend on (from its manifest's ``components`` and its
    comparatives library): the table and the report show a figure only when its component is here."""
    return {
        "text_encoders": list(bundle.text_models),
        "default_text_encoder": bundle.default_text_encoder,
        "dcsm": bundle.dcsm is not None,
        "yukino": bundle.yukino is not None,
        "comparatives": len(zero_shot.comps) if zero_shot is not None else 0,
    }


def gains_per_seed(flat: dict[str, float]) -> dict[str, float]:
    """What each component adds on one seed: its figure minus the figure it replaces, measured on
    the same images and texts (``gain.<key>``, e.g. ``gain.hard_negatives.dcsm.negation``). Averaged
    over seeds like every figure, their standard error is that of the paired difference, and the
    evaluation gate can hold a component to a minimum gain (``minimum`` in gate.json)."""
    out = {}
    for key, value in flat.items():
        replaced = describe(key).replaces
        if replaced is not None and replaced in flat:
            out[gain_key(key)] = value - flat[replaced]
    return out


def evaluate_user_data(
    bundle: ModelBundle, path: Path, cfg: UserEvalConfig, name: str, log: Callable[[str], None] = print
) -> tuple[dict[str, float], dict[str, Any]]:
    """(flat metrics with their ``.stderr``, the dataset's section of eval.json)."""
    es = load_eval_set(path, bundle, cfg.split)
    es.batch_size = cfg.batch_size
    encoders = list(bundle.text_models)
    labels = {i.record.label for i in es.labelled}  # type: ignore[union-attr]
    zero_shot = ZeroShot(es, cfg, bundle.default_text_encoder) if len(labels) >= 2 else None
    has_captions = any(i.record.kind in ("caption", "negatives") for i in es.items)
    runs: list[dict[str, float]] = []
    details: dict[str, Any] = {}
    for seed in cfg.seeds:
        flat: dict[str, float] = {}
        if zero_shot is not None:
            figures, zs_details = zero_shot.run(seed)
            flat.update(figures)
            details.setdefault("zeroshot", zs_details)  # the first seed's confusion matrices
        flat.update(pair_ranking(es, cfg, encoders, seed))
        flat.update(dense_vs_cosine(es, cfg, seed))
        flat.update(negation_by_encoder(es, cfg, [e for e in encoders if e != BASE_ENCODER], seed))
        two_sided = negation_forms(es, cfg, seed)
        flat.update(flat_figures(two_sided))
        if two_sided:
            details.setdefault("negation_forms", two_sided)  # the first seed's per-form figures
        paraphrases = paraphrase_forms(es, cfg, seed)
        flat.update(paraphrase_flat(paraphrases))
        if paraphrases:
            details.setdefault("paraphrase_forms", paraphrases)
        flat.update(yukino_2x2(es, cfg, seed))
        flat.update(retrieval(es, cfg, seed))
        flat.update(gains_per_seed(flat))
        runs.append(flat)
        log(f"{name}: seed {seed}: {len(flat)} figures")
    prefix = f"data.{name}."
    metrics: dict[str, float] = {}
    for key in runs[0]:
        values = np.array([r.get(key, math.nan) for r in runs], dtype=float)
        metrics[prefix + key] = float(np.mean(values))
        stderr = float(np.std(values, ddof=1) / math.sqrt(len(values))) if len(values) > 1 else 0.0
        metrics[prefix + key + ".stderr"] = stderr
    section = {
        "path": str(path),
        "split": cfg.split,
        "records": len(es.items),
        "seeds": list(cfg.seeds),
        "encoders": encoders,
        "components": components_of(bundle, zero_shot),
        "config": {
            "alpha": cfg.alpha,
            "symmetric": cfg.symmetric,
            "gate_margin": cfg.gate_margin,
            "n_zeroshot": cfg.n_zeroshot,
            "n_pairs": cfg.n_pairs,
            "n_captions": cfg.n_captions,
            "n_yukino": cfg.n_yukino,
            "n_gallery": cfg.n_gallery,
        },  # fmt: skip
        "skipped": skipped_families(bundle, zero_shot, has_captions),
        "details": details,
    }
    return metrics, section


def merge_into_eval(
    existing: dict[str, Any] | None, manifest: Manifest, name: str, metrics: dict, section: dict
) -> dict:
    """eval.json with this dataset's figures replaced (other datasets and the built-in world kept),
    bound to the version ``manifest`` describes. An ``existing`` report that is not this version's
    evaluation (one copied from other weights) is not kept."""
    if existing is not None and not provenance(existing, manifest).belongs:
        existing = None
    report = bind(existing or {"metrics": {}}, manifest)
    prefix = f"data.{name}."
    kept = {k: v for k, v in report.get("metrics", {}).items() if not k.startswith(prefix)}
    report["metrics"] = {**kept, **metrics}
    report["datasets"] = {**report.get("datasets", {}), name: section}
    return report
