"""DCSM on the shapes world: rendered hard-negative items on frozen dense features of a trained CLIP;
the method itself (scorer, losses and loop) is ``training.methods.dcsm``.

The CLIP is frozen, so the dense token and patch features of every training item (image,
caption, hard-negative image, hard-negative caption) are computed once and kept in memory as
fp16; the scorer then trains for many epochs from that cache, which is what makes a
from-scratch scorer fit on a CPU in minutes. Distinct captions are encoded once. Every hard
negative has an image of its own, so the step loss is ``dcsm.in_batch_pairs``.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from open_clip.model import CLIP

from clipcore.methods.dcsm import DEFAULT_SCORER_CONFIG, FUNCTIONAL_GROUPS, DCSMScorer, functional_row_table
from clipcore.models.dense import DenseEncoder, dcsm_component, dcsm_files
from clipcore.models.preprocess import PreprocessConfig
from training.methods import dcsm
from training.methods.checkpoint import Checkpoints, Runtime
from training.progress import StepProgress
from training.world.hard_negatives import DEFAULT_MIX, HardNegative, hard_negative_set
from training.world.render import render_batch
from training.world.scene import Split

Log = Callable[[str], None]


# v6's 18,000 items in ``DEFAULT_MIX``'s proportions (binding, spatial, "X without Y" negation) plus
# 4,500 two-sided items of the negation grammar's training forms (``negation_sides``, composed
# captions): without the latter a scorer only learns that the caption with a negation word loses
# on the image it was drawn from, and reads held-out phrasings of "no X" both ways at 0.59
# (docs/negation.md, "The shapes world").
WORLD_ITEMS = 18000
NEGATION_SIDES_ITEMS = 4500
WORLD_MIX: dict[str, float] = {
    **{kind: share * WORLD_ITEMS / (WORLD_ITEMS + NEGATION_SIDES_ITEMS) for kind, share in DEFAULT_MIX.items()},
    "negation_sides": NEGATION_SIDES_ITEMS / (WORLD_ITEMS + NEGATION_SIDES_ITEMS),
}


@dataclass
class DCSMTrainConfig(dcsm.Hyper):
    """DCSM on the shapes world: ``dcsm.Hyper`` and the items the world renders; the schedule's
    length is ``epochs`` epochs over the items (``steps`` 0) unless ``steps`` is set."""

    steps: int = 0
    warmup_steps: int = 50
    samples: int = WORLD_ITEMS + NEGATION_SIDES_ITEMS  # training items; each gives two images and two captions
    epochs: int = 12
    batch_size: int = 256  # items per step (2x anchors)
    val_samples: int = 400  # TEST items scored after every epoch
    seed: int = 0
    table_seed: int = 0
    device: str = "cpu"
    # Torch CPU threads while this runs (0: leave as is). One thread, because on a small CPU
    # shared with another job two OpenMP threads wait on each other: measured 4x slower per
    # step and 1.5-2x slower encoding than one thread on the 2-core build machine.
    threads: int = 1
    encode_batch: int = 128
    scorer: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_SCORER_CONFIG))
    functional_groups: dict[str, list[str]] = field(
        default_factory=lambda: {g: list(w) for g, w in FUNCTIONAL_GROUPS.items()}
    )
    mix: dict[str, float] = field(default_factory=lambda: dict(WORLD_MIX))


def build_cache(
    encoder: DenseEncoder, items: Sequence[HardNegative], render_seed: int, batch: int = 512, name: str = "features"
) -> dcsm.DenseItems:
    """The items' dense features in memory: row 2i item i's scene/caption, row 2i+1 its hard negative."""
    scenes = [s for it in items for s in (it.scene, it.negative_scene)]
    captions = [c for it in items for c in (it.positive, it.negative)]
    distinct = list(dict.fromkeys(captions))
    where = {c: i for i, c in enumerate(distinct)}
    img_chunks = []
    rng = np.random.default_rng(render_seed)
    with StepProgress(name, total=len(scenes) + len(distinct)) as bar:
        for i in range(0, len(scenes), batch):
            arrays = render_batch(
                scenes[i : i + batch], encoder.model.visual.image_size[0], seed=int(rng.integers(2**31))
            )
            img_chunks.append(encoder.image_tokens(arrays).half())
            bar.update(len(arrays), info="images")
        texts = dcsm.encode_texts(encoder, distinct, batch, lambda n: bar.update(n, info="captions"))
    return dcsm.DenseItems(
        torch.cat(img_chunks), texts, torch.tensor([where[c] for c in captions]), [it.kind for it in items]
    )


def train_dcsm(
    model: CLIP,
    context_length: int,
    cfg: DCSMTrainConfig,
    out_dir: Path | None = None,
    log: Log = print,
    *,
    preprocess: PreprocessConfig,
) -> tuple[dict[str, torch.Tensor], dict[str, Any], torch.Tensor]:
    """Train a scorer on ``model``'s frozen dense features: (scorer_state, scorer_config, table).
    ``preprocess``: the base version's.

    With ``out_dir`` the scorer is checkpointed after every epoch (and resumed from there:
    the feature cache is rebuilt deterministically) and the history is written as JSON.
    """
    threads = torch.get_num_threads()
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    try:
        return _train(model, context_length, cfg, out_dir, log, preprocess)
    finally:
        torch.set_num_threads(threads)


def _train(
    model: CLIP, context_length: int, cfg: DCSMTrainConfig, out_dir: Path | None, log: Log, preprocess: PreprocessConfig
) -> tuple[dict[str, torch.Tensor], dict[str, Any], torch.Tensor]:
    torch.manual_seed(cfg.seed)
    model = model.to(cfg.device).eval()
    length = int(cfg.scorer.get("length", DEFAULT_SCORER_CONFIG["length"]))
    encoder = DenseEncoder(
        model, context_length, cfg.functional_groups, length, preprocess.mean, preprocess.std, device=cfg.device
    )
    t0, c0 = time.time(), time.process_time()
    train = build_cache(
        encoder,
        hard_negative_set(Split.TRAIN, cfg.seed, cfg.samples, cfg.mix),
        render_seed=cfg.seed,
        batch=cfg.encode_batch,
        name="dcsm features",
    )
    val = build_cache(
        encoder,
        hard_negative_set(Split.TEST, cfg.seed + 500, cfg.val_samples, cfg.mix),
        render_seed=cfg.seed + 1,
        batch=cfg.encode_batch,
        name="dcsm val",
    )
    cache_seconds, cache_cpu = time.time() - t0, time.process_time() - c0
    n_positions = train.images.shape[1]
    config = dcsm.scorer_config(n_positions, cfg.functional_groups, cfg.table_seed, **cfg.scorer)
    table = functional_row_table(config["functional_groups"], n_positions, cfg.table_seed)
    log(
        f"dcsm: cached {cfg.samples} items ({train.texts.tokens.shape[0]} distinct captions) in {cache_seconds:.1f}s "
        f"({cache_cpu:.1f} CPU s)"
    )

    steps_per_epoch = max(1, cfg.samples // cfg.batch_size)
    hyper = cfg if cfg.steps else replace(cfg, steps=steps_per_epoch * cfg.epochs)
    checkpoints = Checkpoints(
        None if out_dir is None else out_dir / "dcsm_checkpoint.pt",
        every=steps_per_epoch,
        settings={"config": config, "train": asdict(cfg)},  # another scorer or other items: start over
    )
    losses: list[float] = []
    accs: list[float] = []
    t1, c1 = time.time(), time.process_time()

    def after_step(step: int, scorer: DCSMScorer, loss: float, fit: float, history: list[dict[str, Any]]) -> None:
        losses.append(loss)
        accs.append(fit)
        epoch, s = divmod(step, steps_per_epoch)
        if s + 1 < steps_per_epoch:
            return
        val_acc = dcsm.two_way_accuracy(scorer.cpu(), val, table)
        scorer.to(cfg.device).train()
        history.append(
            {
                "epoch": epoch + 1,
                "loss": float(np.mean(losses)),
                "fit": float(np.mean(accs)),
                "val": val_acc,
                "seconds": time.time() - t1,
                "cpu_seconds": time.process_time() - c1,
            }
        )
        log(
            f"dcsm epoch {epoch + 1}: DCSM loss {np.mean(losses):.3f}, batch accuracy {np.mean(accs):.3f} "
            "(caption over its hard negative on training batches, chance 0.5); held out: "
            + " ".join(f"{k} {v:.3f}" for k, v in val_acc.items())
        )
        losses.clear()
        accs.clear()

    def info(step: int, loss: float, fit: float) -> str:
        return f"epoch {step // steps_per_epoch + 1} DCSM loss {np.mean(losses[-20:]) if losses else loss:.3f}"

    items = dcsm.in_batch_pairs(train, table, hyper, batch_size=cfg.batch_size, steps_per_epoch=steps_per_epoch,
                                seed=cfg.seed, device=cfg.device)  # fmt: skip
    state, history = dcsm.train(config, items, hyper, runtime=Runtime(cfg.seed, cfg.device, log=log),
                                checkpoints=checkpoints, after_step=after_step, info=info)  # fmt: skip
    train_seconds, train_cpu = time.time() - t1, time.process_time() - c1
    log(f"dcsm: trained in {train_seconds:.1f}s ({train_cpu:.1f} CPU s)")
    if out_dir is not None:
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "dcsm_history.json").write_text(
            json.dumps(
                {
                    "train": asdict(cfg),
                    "cache_seconds": cache_seconds,
                    "cache_cpu_seconds": cache_cpu,
                    "train_seconds": train_seconds,
                    "train_cpu_seconds": train_cpu,
                    "history": history,
                },
                indent=2,
            )
        )
    return state, config, table


def train_dcsm_files(
    model: CLIP,
    context_length: int,
    cfg: DCSMTrainConfig,
    out_dir: Path | None = None,
    log: Log = print,
    *,
    preprocess: PreprocessConfig,
) -> tuple[dict[str, bytes], dict[str, Any]]:
    """Train and package: ``(files, component)`` for ``TrainedModel(extra_files=files,
    components={"dcsm": component})``."""
    state, config, table = train_dcsm(model, context_length, cfg, out_dir, log, preprocess=preprocess)
    return dcsm_files(state, config, table), dcsm_component(config)
