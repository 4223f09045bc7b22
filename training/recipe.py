"""The recipe of the embedded default model: every stage from scratch to a published, evaluated version.

``DefaultRecipe`` holds what a build is made of (sizes, steps, seed, device, evaluation, aliases);
``build_default_version`` runs the stages in order (base CLIP, PC-CLIP, SemCLIP and its ablations,
YUKINO's text encoder and inverter, the DCSM scorer), evaluates the stored weights and publishes.
Each stage's result is kept in the run directory with its config, so a rerun resumes.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import torch
from open_clip.model import CLIP

from clipcore.models.bundle import ModelBundle
from clipcore.models.preprocess import PreprocessConfig
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import ModelStore
from model_store.evaluation import bind
from training.evaluation import EvalConfig, evaluate
from training.train_base import BaseTrainConfig, train_base
from training.train_dcsm import DCSMTrainConfig, train_dcsm_files
from training.train_pcclip import PCClipConfig, train_pcclip, with_state
from training.train_semclip import VARIANT_WEIGHTS, SemClipConfig, train_semclip, triplet_dataset
from training.train_yukino import OTIConfig, YukinoConfig, YukinoTextConfig, train_inverter, train_yukino_text
from training.world.differences import comparative_text
from training.world.vocab import COLOUR_NAMES, HELD_OUT_COMBOS, SHAPES

CONFIG_DIR = Path(__file__).parent / "configs"
# Earlier names of configs in CONFIG_DIR, still accepted: old name -> current name.
CONFIG_ALIASES = {"fashion-tiny": "vit-tiny-32"}
Log = Callable[[str], None]

# Smoke builds (CI): a scorer that trains in seconds.
_SMOKE_DCSM: dict[str, Any] = {"samples": 256, "epochs": 1, "batch_size": 64, "val_samples": 32}
SMOKE_EVAL = EvalConfig(
    seeds=(0, 1),
    n_zeroshot=60,
    n_pairs=40,
    n_compositional=40,
    n_pil=20,
    n_calibration=60,
    n_semclip=40,
    n_yukino=16,
    n_negation=20,
    n_retrieval=10,
)


@dataclass
class DefaultRecipe:
    """What one build of the default model is made of."""

    name: str = "default"
    config: str = "shapes-vit-tiny"
    run_dir: Path = Path("runs/default")
    steps: int = 1700  # base training steps in all
    schedule_steps: int = 2200  # horizon of the warm-up + cosine schedule
    align_start: int = 1400  # first step of the mask-alignment phase
    pcclip_steps: int = 800
    semclip_steps: int = 400
    yukino_steps: int = 4000
    seed: int = 0
    device: str = "cpu"
    eval: EvalConfig = field(default_factory=EvalConfig)
    aliases: list[str] = field(default_factory=list)
    # The preprocessing the version is published with (its manifest's): every stage encodes its
    # images with it, as serving will.
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)

    def smoke(self) -> DefaultRecipe:
        """The tiny configuration CI builds in a minute: few steps, a small evaluation."""
        steps = min(self.steps, 30)
        seeds = self.eval.seeds[: min(len(self.eval.seeds), 2)]
        return DefaultRecipe(
            name=self.name, config="shapes-smoke", run_dir=self.run_dir, steps=steps, schedule_steps=steps,
            align_start=2 * steps // 3, pcclip_steps=min(self.pcclip_steps, 20),
            semclip_steps=min(self.semclip_steps, 20), yukino_steps=min(self.yukino_steps, 20), seed=self.seed,
            device=self.device, eval=EvalConfig(**{**asdict(SMOKE_EVAL), "seeds": seeds}), aliases=self.aliases,
            preprocess=self.preprocess,
        )  # fmt: skip


def model_config(name_or_path: str) -> dict:
    """A JSON file, a config of training/configs, or an open_clip architecture name (``ViT-B-32``)."""
    path = Path(name_or_path)
    if not path.exists():
        path = CONFIG_DIR / f"{CONFIG_ALIASES.get(name_or_path, name_or_path)}.json"
    if not path.exists():
        import open_clip

        config = open_clip.get_model_config(name_or_path)
        if config is None:
            raise ValueError(
                f"no model config {name_or_path!r}: not a file, not in {CONFIG_DIR}, not an open_clip name"
            )
        return dict(config)
    return json.loads(path.read_text())


def comparatives_library() -> list[dict[str, str]]:
    """Comparatives in the trained phrasing for every ordered pair of shape, colour and
    colour-shape labels ("circle", "red", "red circle")."""
    out = []
    combos = tuple(f"{c} {s}" for c in COLOUR_NAMES for s in SHAPES)
    for attribute, labels in (("shape", SHAPES), ("colour", COLOUR_NAMES), ("combo", combos)):
        for a in labels:
            for b in labels:
                if a != b:
                    out.append({"a": a, "b": b, "text": comparative_text(a, b, attribute)})
    return out


def _cached_stage(path: Path, config: dict, train: Callable[[], Any], log: Log = print) -> Any:
    """A stage's result from ``path`` when it was produced with the same config, else trained and saved."""
    if path.exists():
        saved = torch.load(path, weights_only=False)
        if saved["config"] == config:
            log(f"reusing {path}")
            return saved["result"]
    result = train()
    torch.save({"config": config, "result": result}, path)
    return result


def _semclip_variants(
    model: CLIP, preprocess: PreprocessConfig, steps: int, seed: int, device: str, run_dir: Path, log: Log = print
) -> dict[str, dict]:
    """SemCLIP and its paraphrase-only / negation-only ablations, sharing one triplet dataset."""
    small = steps <= 50
    data: dict | None = None
    states = {}
    for variant, weights in VARIANT_WEIGHTS.items():
        cfg = SemClipConfig(
            steps=steps,
            weights=weights,
            seed=seed,
            device=device,
            scenes=256 if small else 12000,
            batch_size=32 if small else 128,
        )

        def train(cfg: SemClipConfig = cfg, variant: str = variant) -> dict:
            nonlocal data
            data = data or triplet_dataset(cfg, model, preprocess)
            return train_semclip(model, cfg, data=data, out_dir=run_dir / variant, log=log, preprocess=preprocess)

        states[variant] = _cached_stage(run_dir / f"{variant}.pt", asdict(cfg), train, log)
    return states


def _yukino(
    model: CLIP,
    preprocess: PreprocessConfig,
    sem_states: dict[str, dict],
    steps: int,
    seed: int,
    device: str,
    run_dir: Path,
    log: Log = print,
) -> tuple[dict[str, torch.Tensor], dict[str, bytes], dict]:
    """YUKINO's text variant (from SemCLIP's) and the inverter over it: the variant's state, the
    inverter's files and its manifest component."""
    small = steps <= 50
    text_cfg = YukinoTextConfig(
        seed=seed,
        device=device,
        items=64 if small else YukinoTextConfig.items,
        steps=steps if small else YukinoTextConfig.steps,
        batch_items=16 if small else 64,
    )
    cfg = YukinoConfig(
        steps=steps,
        seed=seed,
        device=device,
        items=128 if small else 6000,
        oti_items=32 if small else 1000,
        batch_items=16 if small else 64,
        oti=OTIConfig(steps=10 if small else OTIConfig.steps),
        text=text_cfg,
    )

    def train_text() -> dict[str, torch.Tensor]:
        start = with_state(model, sem_states[text_cfg.start])
        return train_yukino_text(model, start, text_cfg, out_dir=run_dir, log=log, preprocess=preprocess)

    text_state = _cached_stage(run_dir / "yukino_text.pt", asdict(text_cfg), train_text, log)

    def train() -> tuple[dict[str, bytes], dict]:
        text_model = with_state(model, text_state)
        head = train_inverter(model, text_model, cfg, out_dir=run_dir, log=log, preprocess=preprocess)
        return head.to_files()

    files, component = _cached_stage(run_dir / "yukino.pt", asdict(cfg), train, log)
    return text_state, files, component


def build_default_version(store: ModelStore, recipe: DefaultRecipe, log: Log = print) -> dict:
    """Run every stage of ``recipe``, evaluate the stored weights, publish; the evaluation report."""
    r = recipe
    name, run_dir, steps, seed, device = r.name, r.run_dir, r.steps, r.seed, r.device
    pcclip_steps, semclip_steps, yukino_steps = r.pcclip_steps, r.semclip_steps, r.yukino_steps
    arch = model_config(r.config)
    base_cfg = BaseTrainConfig(
        model_config=arch,
        steps=steps,
        seed=seed,
        device=device,
        eval_every=max(1, min(250, steps)),
        checkpoint_every=max(1, min(200, steps)),
        schedule_steps=r.schedule_steps,
        phase2_start=r.align_start,
        align_start=r.align_start,
        align_weight=1.0,
    )
    if steps <= 50:  # smoke configurations: shorter warm-up phases
        base_cfg.text_freeze_steps = base_cfg.filip_start = steps // 3
        base_cfg.warmup_steps = max(1, steps // 5)
        base_cfg.batch_size = 32
    t0 = time.time()
    model = train_base(base_cfg, run_dir / "base", preprocess=r.preprocess, log=log)
    base_seconds = time.time() - t0
    pc_cfg = PCClipConfig(
        steps=pcclip_steps,
        seed=seed,
        device=device,
        pairs=12000 if pcclip_steps > 50 else 512,
        batch_size=128 if pcclip_steps > 50 else 32,
    )
    t0 = time.time()
    pc_path = run_dir / "pcclip.pt"
    if pc_path.exists() and torch.load(pc_path, weights_only=False)["config"] == vars(pc_cfg):
        pc_state = torch.load(pc_path, weights_only=False)["state"]  # a rerun resumes after this stage
        log(f"pcclip: reusing {pc_path}")
    else:
        pc_state = train_pcclip(model.cpu(), pc_cfg, run_dir, log=log, preprocess=r.preprocess)
        torch.save({"config": vars(pc_cfg), "state": pc_state}, pc_path)
    pc_seconds = time.time() - t0
    t0 = time.time()
    sem_states = _semclip_variants(model.cpu(), r.preprocess, semclip_steps, seed, device, run_dir, log)
    sem_seconds = time.time() - t0
    t0 = time.time()
    yukino_text, yukino_files, yukino_component = _yukino(
        model.cpu(), r.preprocess, sem_states, yukino_steps, seed, device, run_dir, log
    )
    yukino_seconds = time.time() - t0
    dcsm_cfg = DCSMTrainConfig(seed=seed, device=device, **(_SMOKE_DCSM if steps <= 50 else {}))
    t0 = time.time()
    dcsm_files, dcsm_component = train_dcsm_files(
        model.cpu(), model.context_length, dcsm_cfg, run_dir / "dcsm", log=log, preprocess=r.preprocess
    )
    dcsm_seconds = time.time() - t0
    training = {
        "base": {k: v for k, v in vars(base_cfg).items() if k != "model_config"},
        "base_seconds": base_seconds,
        "pcclip": vars(pc_cfg),
        "pcclip_seconds": pc_seconds,
        "dcsm": asdict(dcsm_cfg),
        "dcsm_seconds": dcsm_seconds,
        "semclip_steps": semclip_steps,
        "semclip_seconds": sem_seconds,
        "yukino": yukino_component["config"],
        "yukino_seconds": yukino_seconds,
    }
    data = {
        "world": "shapes",
        "image_size": 64,
        "train_split": "TRAIN",
        "held_out_combos": sorted(map(list, HELD_OUT_COMBOS)),
        "pcclip_pairs": pc_cfg.pairs,
        "base_scenes_seen": steps * base_cfg.batch_size,
    }
    trained = TrainedModel(
        model.cpu(),
        arch,
        text_variants={"pcclip": pc_state, **sem_states, YukinoConfig.text_encoder: yukino_text},
        default_text_encoder="pcclip",
        comparatives=comparatives_library(),
        training=training,
        data=data,
        extra_files={**dcsm_files, **yukino_files},
        components={"dcsm": dcsm_component, "yukino": yukino_component},
        preprocess=r.preprocess,
    )
    with tempfile.TemporaryDirectory() as tmp:
        # Evaluate exactly what will be served: the stored (fp16) weights, loaded back.
        scratch = ModelStore(tmp)
        publish_bundle(scratch, name, trained)
        report = evaluate(ModelBundle.load(scratch, f"{name}@v1", device=device), r.eval, log=log)
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2))
    # Undefined figures (e.g. an empty subset) stay in eval.json as NaN; the manifest holds numbers.
    flat = {k: v for k, v in report["metrics"].items() if not k.endswith(".stderr") and math.isfinite(v)}
    # eval.json travels with the version so the store's evaluation gate sees it when --promote moves an alias.
    trained = replace(
        trained,
        extra_files={**dcsm_files, **yukino_files, "eval.json": json.dumps(report, indent=2).encode()},
        metrics=flat,
        notes="Shapes-world CLIP trained from scratch; see docs/model_card.md.",
    )
    manifest = publish_bundle(store, name, trained, aliases=r.aliases)
    report = bind(report, manifest)  # the scratch copy's files are the published ones: same binding, final ref
    store.write_annex(name, manifest.version, "eval.json", json.dumps(report, indent=2).encode())
    return report
