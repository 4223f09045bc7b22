"""A comparatives library for a user's labels, written into a new version (``comparatives.json``).

1. Zero-shot predictions of the base version on a labelled calibration split (the validation
   split; all labelled images when it holds too few), with the service's own task functions.
2. The confused label pairs: the top off-diagonal entries of the confusion matrix; when fewer
   than ``pairs`` were ever confused, the pairs with the most probability mass on each other.
3. Texts for each pair in both directions from the chosen generator (``training.generate``:
   templates over the label set's attributes, or an OpenAI-compatible chat endpoint).
4. The new version keeps the base's library for other labels and adds these, so
   ``POST /classify?comparative=true`` uses them for the user's labels.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np

from clipcore.tasks import flat_prompts, label_embeddings, label_prompts, label_scores
from model_store import Manifest
from training.datasets.records import LabelRecord
from training.generate.comparatives import (
    ComparativeGenerator,
    LLMGenerator,
    TemplateGenerator,
    build_library,
    confused_label_pairs,
)
from training.generate.llm import ChatClient
from training.userdata.context import RunContext, items_of
from training.userdata.publishing import data_summary
from training.userdata.settings import ComparativesRun

MIN_CALIBRATION = 20  # images; below this the whole labelled set calibrates


def calibration_predictions(ctx: RunContext, split: str) -> tuple[list[str], np.ndarray, np.ndarray, np.ndarray]:
    """(labels, true indices, predicted indices, probabilities) on the calibration images."""
    items = items_of(ctx.dataset, "label", split)
    if len(items) < MIN_CALIBRATION:
        ctx.log(f"comparatives: {len(items)} labelled images in the {split} split; calibrating on all labelled images")
        items = items_of(ctx.dataset, "label", None)
    labels = sorted({item.record.label for item in items if isinstance(item.record, LabelRecord)} |
                    set(ctx.dataset.labels))  # fmt: skip
    if len(labels) < 2:
        raise ValueError("comparatives need labelled images (docs/data.md) of at least two labels")
    index = {label: i for i, label in enumerate(labels)}
    y_true = np.array([index[item.record.label] for item in items], dtype=np.int64)  # type: ignore[union-attr]
    images = ctx.features.of("pooled", [item.images[0] for item in items])
    prompts = label_prompts(labels)
    text = ctx.bundle.encode_texts(flat_prompts(prompts))
    class_emb, _ = label_embeddings(prompts, text)
    probs, _ = label_scores(images, class_emb, ctx.bundle.logit_scale)
    return labels, y_true, probs.argmax(axis=1).astype(np.int64), probs


def most_confused(
    labels: list[str], y_true: np.ndarray, y_pred: np.ndarray, probs: np.ndarray, k: int
) -> list[tuple[str, str, int]]:
    """The ``k`` most confused unordered pairs: by counts, then by shared probability mass."""
    pairs = confused_label_pairs(y_true, y_pred, labels, k)
    if len(pairs) < k:
        n = len(labels)
        mass = np.zeros((n, n))
        for t in range(n):
            if (y_true == t).any():
                mass[t] = probs[y_true == t].mean(axis=0)
        both = mass + mass.T
        taken = {frozenset((a, b)) for a, b, _ in pairs}
        ranked = sorted(((both[a, b], a, b) for a in range(n) for b in range(a + 1, n)), reverse=True)
        for _, a, b in ranked:
            if len(pairs) >= k:
                break
            if frozenset((labels[a], labels[b])) not in taken:
                pairs.append((labels[a], labels[b], 0))
    return pairs


def make_generator(ctx: RunContext, cfg: ComparativesRun, llm_cache: Path) -> ComparativeGenerator:
    if cfg.generator == "template":
        return TemplateGenerator(ctx.dataset.labels)
    if cfg.generator == "llm":
        if not cfg.llm_base_url or not cfg.llm_model:
            raise ValueError("the llm generator needs --llm-base-url and --llm-model")
        client = ChatClient(cfg.llm_base_url, cfg.llm_model, cache_dir=llm_cache, api_key_env=cfg.llm_key_env)
        return LLMGenerator(client, samples=cfg.llm_samples)
    raise ValueError(f"unknown generator {cfg.generator!r}: use template or llm")


def merged_library(base: list[dict[str, Any]], new: list[dict[str, str]]) -> list[dict[str, Any]]:
    """The base's comparatives except those of the pairs written anew, then the new ones."""
    replaced = {(c["a"], c["b"]) for c in new}
    return [c for c in base if (c.get("a"), c.get("b")) not in replaced] + list(new)


def run_comparatives(
    ctx: RunContext, cfg: ComparativesRun, *, llm_cache: Path, name: str | None = None, aliases: tuple[str, ...] = ()
) -> tuple[Manifest, list[dict[str, str]]]:
    """Find the confused pairs, generate their texts, publish a version holding the library."""
    from training.derive import DerivedParts, publish_derived

    labels, y_true, y_pred, probs = calibration_predictions(ctx, cfg.split)
    accuracy = float((y_true == y_pred).mean())
    pairs = most_confused(labels, y_true, y_pred, probs, cfg.pairs)
    ctx.log(f"comparatives: zero-shot accuracy {accuracy:.3f} on {len(y_true)} calibration images; confused: "
            + ", ".join(f"{a} / {b} ({n})" for a, b, n in pairs))  # fmt: skip
    generator = make_generator(ctx, cfg, llm_cache)
    library = build_library([(a, b) for a, b, _ in pairs], generator)
    calls = getattr(getattr(generator, "client", None), "calls", 0)
    ctx.log(f"comparatives: {len(library)} texts from the {generator.name} generator ({calls} requests sent)")
    if not library:
        raise ValueError("the generator gave no usable text for any confused pair; nothing to publish")
    full = merged_library(list(ctx.bundle.comparatives), library)
    settings = {k: v for k, v in asdict(cfg).items() if k != "llm_key_env"}
    manifest = publish_derived(
        ctx.store,
        ctx.bundle.ref,
        DerivedParts(
            files={"comparatives.json": json.dumps(full, indent=2).encode()},
            training={
                "method": "comparatives",
                "seed": ctx.seed,
                **settings,
                "confused_pairs": [[a, b, n] for a, b, n in pairs],
                "calibration": {"images": len(y_true), "zeroshot_accuracy": accuracy},
            },
            data=data_summary(ctx.dataset, "user"),
            notes=f"comparatives library for {len(labels)} user labels from {ctx.bundle.ref}",
        ),
        name=name,
        aliases=aliases,
    )
    return manifest, library
