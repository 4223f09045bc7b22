"""Evaluation of a model version on held-out shapes-world data (DESIGN section 4).

Every figure is computed on TEST (held-out scenes) or HELDOUT (colour-shape combinations
never rendered in training) splits, per evaluation seed, then reported as the mean and
standard error over seeds. Keys are flat, e.g. ``pcclip.rank_pair.size``; every text-encoder
variant of the version is evaluated beside ``base``. All scoring goes through the bundle
and ``service.methods`` so the figures describe exactly what the service computes.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from service.encoders.bundle import BASE_ENCODER, ModelBundle
from service.encoders.yukino import prompt_features
from service.methods.comparative import apply_comparatives, confused_pairs, gated_probs
from service.methods.pairwise_rank import pair_scores
from service.methods.semclip import composite_score, original_over_negation, retrieval_top1
from service.methods.yukino import paired_yes_no_scores, winoground
from service.methods.zero_shot import class_embeddings, zero_shot_logits, zero_shot_probs
from training.dense_eval import dense_metrics
from training.probes import ATTRIBUTE_PROMPTS
from training.train_yukino import OTIConfig, oti
from training.world.differences import comparative_text, eval_text
from training.world.hard_negatives import KINDS, hard_negative_set
from training.world.render import draw_scene_pil, render_batch
from training.world.scene import Scene, Split, make_object, sample_scene, single_scene
from training.world.semantic import NEGATION_KINDS, triplet_set
from training.world.vocab import COLOUR_NAMES, HELD_OUT_COMBOS, SHAPES, SIZE_RANGES

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
    seed_offset: int = 1000  # evaluation seeds never coincide with training seeds


def generator_images(scenes: Sequence[Scene]) -> np.ndarray:
    return render_batch(list(scenes), 64, seed=None)


def pil_images(bundle: ModelBundle) -> ImageSource:
    """The second renderer: PIL drawings at 224 px on flat backgrounds, resized by the service path."""
    backgrounds = ((255, 255, 255), (0, 0, 0), (235, 235, 235), (40, 40, 40))

    def draw(scenes: Sequence[Scene]) -> np.ndarray:
        return np.stack([bundle.preprocess(draw_scene_pil(s, 224, backgrounds[i % 4])) for i, s in enumerate(scenes)])

    return draw


class Evaluator:
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
        flat = self.texts([t.format(label) for label in labels for t in templates], encoder)
        k = len(templates)
        return class_embeddings([flat[i * k : (i + 1) * k] for i in range(len(labels))])

    # ------------------------------------------------------------------ zero-shot
    def zero_shot(self, scenes: Sequence[Scene], emb: np.ndarray, encoder: str) -> dict[str, float]:
        out = {}
        for attribute, (labels, templates) in ATTRIBUTE_PROMPTS.items():
            truth = np.array([getattr(s.objects[0], attribute) for s in scenes])
            keep = np.isin(truth, labels)
            logits, _ = zero_shot_logits(emb[keep], self.classifier(labels, templates, encoder), 1.0)
            out[attribute] = float(np.mean(np.asarray(labels)[logits.argmax(1)] == truth[keep]))
        return out

    # ------------------------------------------------------------------ pair ranking
    def rank_pairs(self, seed: int, n: int) -> dict[str, tuple[list[Scene], list[Scene], list[str]]]:
        """Per attribute: first scenes, second scenes, texts; the text is true of (first, second)."""
        rng = np.random.default_rng([seed, 21])
        sets: dict[str, tuple[list[Scene], list[Scene], list[str]]] = {}
        for attribute in ("size", "size_same_class", "colour", "shape"):
            firsts, seconds, texts = [], [], []
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

    # ------------------------------------------------------------------ dense scoring vs cosine
    def dense(self, seed: int) -> dict[str, float]:
        """DCSM (when the version has a scorer) and plain cosine on binding, spatial and negation
        hard negatives, plus the localisation of the dense features (training/dense_eval.py)."""
        pre = self.bundle.manifest.preprocess
        return dense_metrics(
            self.bundle.model,
            getattr(self.bundle, "dcsm", None),
            seed,
            n=self.cfg.n_compositional,
            context_length=self.bundle.context_length,
            mean=pre["mean"],
            std=pre["std"],
            device=self.bundle.device,
        )

    # ------------------------------------------------------------------ comparative prompting
    def comparative(self, seed: int, encoder: str) -> dict[str, object]:
        """Colour-shape classification with and without comparatives on the 3 most-confused pairs.

        Labels are the trained colour-shape combinations ("red circle", ...), so the three
        pairs target a few of 30 classes and "overall" shows what happens to the others.

        The comparative configuration (alpha, symmetric, gate) is chosen on a calibration set
        and reported on a disjoint test set; the whole sweep is kept for the table.
        """
        labels = [f"{c} {s}" for c in COLOUR_NAMES for s in SHAPES if (c, s) not in HELD_OUT_COMBOS]
        templates = ATTRIBUTE_PROMPTS["shape"][1]
        cls = self.classifier(labels, templates, encoder)
        scale = self.bundle.logit_scale

        def split_set(offset: int) -> tuple[np.ndarray, np.ndarray]:
            key = (seed, offset)
            if key not in self._image_sets:  # shared by every encoder
                scenes = [
                    sample_scene(Split.TEST, seed, offset + i, n_objects=1) for i in range(self.cfg.n_calibration)
                ]
                y = np.array([labels.index(f"{s.objects[0].colour} {s.objects[0].shape}") for s in scenes])
                self._image_sets[key] = (self.images(generator_images(scenes)), y)
            return self._image_sets[key]

        (cal_x, cal_y), (test_x, test_y) = split_set(2 * 10**6), split_set(3 * 10**6)
        std_cal = zero_shot_probs(cal_x, cls, scale)
        pairs = confused_pairs(cal_y, std_cal.argmax(1), len(labels), 3)
        comps = []
        for a, b, _ in pairs:
            for x, y in ((a, b), (b, a)):
                d = self.texts([comparative_text(labels[x], labels[y], "combo")], encoder)[0]
                comps.append((x, y, d))
        targeted = sorted({c for a, b, _ in pairs for c in (a, b)})

        def accuracy(x: np.ndarray, y: np.ndarray, alpha: float, sym: bool, gate: float | None) -> tuple[float, float]:
            std = zero_shot_probs(x, cls, scale)
            if comps:
                probs, _ = gated_probs(std, zero_shot_probs(x, apply_comparatives(cls, comps, alpha, sym), scale), gate)
            else:
                probs = std
            pred = probs.argmax(1)
            mask = np.isin(y, targeted)
            return float(np.mean(pred[mask] == y[mask])) if mask.any() else math.nan, float(np.mean(pred == y))

        sweep = []
        for alpha in (0.5, 0.7, 0.8, 0.9):
            for sym in (False, True):
                for gate in (None, 0.2, 0.5):
                    cal = accuracy(cal_x, cal_y, alpha, sym, gate)
                    test = accuracy(test_x, test_y, alpha, sym, gate)
                    sweep.append(
                        {
                            "alpha": alpha,
                            "symmetric": sym,
                            "gate": gate,
                            "cal_confused": cal[0],
                            "cal_overall": cal[1],
                            "confused": test[0],
                            "overall": test[1],
                        }
                    )
        base_test = accuracy(test_x, test_y, 1.0, False, None)
        base_cal_overall = accuracy(cal_x, cal_y, 1.0, False, None)[1]

        def selection_score(r: dict) -> tuple[float, float]:
            # Gain on the confused classes, penalising any loss of overall accuracy.
            return r["cal_confused"] - 2 * max(0.0, base_cal_overall - r["cal_overall"]), -r["alpha"]

        best = max(sweep, key=selection_score)
        return {
            "pairs": [(labels[a], labels[b], int(n)) for a, b, n in pairs],
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

    # ------------------------------------------------------------------ SemCLIP figures
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
        out: dict[str, dict[str, float]] = {}
        for enc in encoders:
            orig = self.texts([t.original for t in triplets], enc)
            para = self.texts([t.paraphrase for t in triplets], enc)
            neg = self.texts([t.negation for t in triplets], enc)
            correct = original_over_negation(images, orig, neg)
            acc_o, acc_p = float(retrieval_top1(orig, images).mean()), float(retrieval_top1(para, images).mean())
            acc_n = float(correct.mean())
            figures = {
                "orig_over_neg": acc_n,
                "retrieval_orig": acc_o,
                "retrieval_para": acc_p,
                "composite": composite_score(acc_o, acc_p, acc_n),
            }
            kinds = np.array([t.negation_kind for t in triplets])
            for kind in NEGATION_KINDS:
                if (kinds == kind).any():
                    figures[f"orig_over_neg.{kind}"] = float(correct[kinds == kind].mean())
            for form, template in (
                ("photo", "this is a photo of a {}."),
                ("not_photo", "this is not a photo of a {}."),
            ):
                classes = self.texts([template.format(shape) for shape in SHAPES], enc)
                pred = np.asarray(SHAPES)[np.argmax(single_images @ classes.T, axis=1)]
                figures[f"zeroshot_{form}"] = float(np.mean(pred == truth))
            figures["photo_minus_not"] = figures["zeroshot_photo"] - figures["zeroshot_not_photo"]
            out[enc] = figures
        return out

    # ------------------------------------------------------------------ YUKINO
    def yukino(self, seed: int) -> tuple[dict[str, float], dict[str, float]]:
        """Winoground-style 2x2 items (an image and its hard-negative image, each with the caption
        true of it) and SugarCREPE-style swap tests (one image: its caption vs the swapped one),
        for plain cosine with the base encoder, OTI, and the distilled inverter; plus ms per image
        of OTI and of the inverter (details)."""
        head = self.bundle.yukino
        assert head is not None
        items = hard_negative_set(Split.TEST, seed, self.cfg.n_yukino)
        pix0 = generator_images([h.scene for h in items])
        pix1 = generator_images([h.negative_scene for h in items])
        kinds = np.array([h.kind for h in items])
        enc = head.text_encoder
        c0, c1 = self.texts([h.positive for h in items], enc), self.texts([h.negative for h in items], enc)
        b0, b1 = (
            self.texts([h.positive for h in items], BASE_ENCODER),
            self.texts([h.negative for h in items], BASE_ENCODER),
        )
        g0, g1 = self.images(pix0), self.images(pix1)
        start = time.perf_counter()
        p0, p1 = self.bundle.yukino_prompts(pix0), self.bundle.yukino_prompts(pix1)
        inverter_ms = (time.perf_counter() - start) * 1000 / (2 * len(items))
        text_model = self.bundle.text_model(enc)
        start = time.perf_counter()
        oti_prompts = []
        for g in (g0, g1):
            pseudo = oti(text_model, torch.from_numpy(g), OTIConfig())
            with torch.no_grad():
                yes, no = prompt_features(text_model, pseudo, self.bundle.context_length)
            oti_prompts.append(np.stack([yes.numpy(), no.numpy()], axis=1))
        oti_ms = (time.perf_counter() - start) * 1000 / (2 * len(items))

        def yn(prompts: np.ndarray, captions: np.ndarray) -> np.ndarray:
            return paired_yes_no_scores(prompts[:, 0], prompts[:, 1], captions)

        scores = {
            "base": [np.sum(g * c, axis=1) for g, c in ((g0, b0), (g0, b1), (g1, b0), (g1, b1))],
            "oti": [
                yn(p, c)
                for p, c in ((oti_prompts[0], c0), (oti_prompts[0], c1), (oti_prompts[1], c0), (oti_prompts[1], c1))
            ],
            "yukino": [yn(p, c) for p, c in ((p0, c0), (p0, c1), (p1, c0), (p1, c1))],
        }
        flat: dict[str, float] = {}
        for method, (s00, s01, s10, s11) in scores.items():
            for name, hits in winoground(s00, s01, s10, s11).items():
                flat[f"{method}.winoground.{name}"] = float(hits.mean())
                for kind in KINDS:
                    flat[f"{method}.winoground.{kind}.{name}"] = float(hits[kinds == kind].mean())
            swap = np.concatenate([s00 > s01, s11 > s10])
            for kind in KINDS:
                flat[f"{method}.swap.{kind}"] = float(swap[np.concatenate([kinds, kinds]) == kind].mean())
        return flat, {"oti_ms_per_image": oti_ms, "inverter_ms_per_image": inverter_ms}

    # ------------------------------------------------------------------ text geometry
    def text_geometry(self, encoder: str) -> dict[str, float]:
        """Does text space obey difference geometry (in the spirit of the paper's Table 7)?

        ``difference_alignment``: cos(f("The first shape is c1, while the second is c2."),
        normalize(f("a photo of a c1 shape.") - f("a photo of a c2 shape."))), mean over colour
        pairs; ``reversal_cosine``: cos(f(T_ab), f(T_ba)) (negative when order is encoded);
        ``prompt_distance``: mean cosine distance between the class prompts.
        """
        labels, templates = ATTRIBUTE_PROMPTS["colour"]
        cls = self.texts([templates[0].format(c) for c in labels], encoder)
        align, rev = [], []
        for i, a in enumerate(labels):
            for j, b in enumerate(labels):
                if i == j:
                    continue
                t_ab, t_ba = self.texts(
                    [
                        f"The first shape is {a}, while the second is {b}.",
                        f"The first shape is {b}, while the second is {a}.",
                    ],
                    encoder,
                )
                diff = cls[i] - cls[j]
                align.append(float(t_ab @ diff / (np.linalg.norm(diff) + 1e-12)))
                rev.append(float(t_ab @ t_ba))
        sims = cls @ cls.T
        off = sims[~np.eye(len(labels), dtype=bool)]
        return {
            "difference_alignment": float(np.mean(align)),
            "reversal_cosine": float(np.mean(rev)),
            "prompt_distance": float(np.mean(1 - off)),
        }

    # ------------------------------------------------------------------ one seed
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


def evaluate(bundle: ModelBundle, cfg: EvalConfig | None = None, log: Callable[[str], None] = print) -> dict:
    """Mean and standard error over seeds of every flat metric, plus per-seed details."""
    cfg = cfg or EvalConfig()
    ev = Evaluator(bundle, cfg)
    runs, details = [], {}
    for seed in cfg.seeds:
        flat, det = ev.run_seed(cfg.seed_offset + seed)
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
    }
    return {"model": bundle.ref, "metrics": metrics, "seeds": list(cfg.seeds), "samples": samples, "details": details}
