"""The offline training job: shapes-world data, base CLIP, PC-CLIP, evaluation, publishing.

Separate from the server; everything it produces goes through the model store.
"""

from __future__ import annotations

import json
import math
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Annotated, Any

import numpy as np
import torch
import typer
from open_clip.model import CLIP
from rich.console import Console

from model_store import ModelStore
from service.encoders.bundle import ModelBundle
from service.encoders.clip_model import build_model
from training.datasets.cli import data_app
from training.evaluate import EvalConfig, Evaluator, evaluate, generator_images
from training.publish import publish_bundle
from training.report import metrics_table, sweep_table
from training.train_base import BaseTrainConfig, train_base
from training.train_dcsm import DCSMTrainConfig, train_dcsm_files
from training.train_pcclip import PCClipConfig, train_pcclip, with_state
from training.train_semclip import VARIANT_WEIGHTS, SemClipConfig, train_semclip, triplet_dataset
from training.train_yukino import OTIConfig, YukinoConfig, YukinoTextConfig, train_inverter, train_yukino_text
from training.world.differences import comparative_text
from training.world.render import render_batch
from training.world.scene import Split, sample_scene
from training.world.vocab import COLOUR_NAMES, HELD_OUT_COMBOS, SHAPES

app = typer.Typer(help="Train, evaluate and publish shapes-world CLIP models.", no_args_is_help=True)
app.add_typer(data_app, name="data")
console = Console()
CONFIG_DIR = Path(__file__).parent / "configs"

# Smoke builds (CI): a scorer that trains in seconds.
_SMOKE_DCSM = {"samples": 256, "epochs": 1, "batch_size": 64, "val_samples": 32}

StoreOpt = Annotated[Path, typer.Option("--store", envvar="MODEL_STORE", help="Model store root.")]
DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")]


def model_config(name_or_path: str) -> dict:
    path = Path(name_or_path)
    if not path.exists():
        path = CONFIG_DIR / f"{name_or_path}.json"
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


@app.command("world-bench")
def world_bench(n: int = 2000, seed: int = 0) -> None:
    """Measure scene sampling and rendering speed (scenes/s)."""
    t0 = time.perf_counter()
    scenes = [sample_scene(Split.TRAIN, seed, i) for i in range(n)]
    t1 = time.perf_counter()
    render_batch(scenes, 64, seed=seed)
    t2 = time.perf_counter()
    console.print(
        f"sample {n / (t1 - t0):,.0f} scenes/s, render 64x64 {n / (t2 - t1):,.0f} scenes/s, "
        f"end to end {n / (t2 - t0):,.0f} scenes/s"
    )


@app.command("base")
def base_cmd(
    out: Annotated[Path, typer.Option(help="Run directory (checkpoints, resume).")] = Path("runs/base"),
    config: str = "shapes-vit-tiny",
    steps: int = 2200,
    batch_size: int = 128,
    seed: int = 0,
    device: DeviceOpt = "cpu",
    threads: int = 0,
) -> None:
    """Train the base CLIP from scratch (resumes from OUT/checkpoint.pt)."""
    if threads:
        torch.set_num_threads(threads)
    cfg = BaseTrainConfig(
        model_config=model_config(config),
        steps=steps,
        batch_size=batch_size,
        seed=seed,
        device=device,
        bf16=device == "cpu" or device.startswith("cuda"),
    )
    train_base(cfg, out, log=console.print)


def _cached_stage(path: Path, config: dict, train: Callable[[], Any]) -> Any:
    """A stage's result from ``path`` when it was produced with the same config, else trained and saved."""
    if path.exists():
        saved = torch.load(path, weights_only=False)
        if saved["config"] == config:
            console.print(f"reusing {path}")
            return saved["result"]
    result = train()
    torch.save({"config": config, "result": result}, path)
    return result


def _semclip_variants(model: CLIP, steps: int, seed: int, device: str, run_dir: Path) -> dict[str, dict]:
    """SemCLIP and its paraphrase-only / negation-only ablations, sharing one triplet dataset."""
    small = steps <= 50
    data: dict | None = None
    states = {}
    for variant, weights in VARIANT_WEIGHTS.items():
        cfg = SemClipConfig(steps=steps, weights=weights, seed=seed, device=device,
                            scenes=256 if small else 12000, batch_size=32 if small else 128)

        def train(cfg: SemClipConfig = cfg, variant: str = variant) -> dict:
            nonlocal data
            data = data or triplet_dataset(cfg, model)
            return train_semclip(model, cfg, data=data, out_dir=run_dir / variant, log=console.print)

        states[variant] = _cached_stage(run_dir / f"{variant}.pt", asdict(cfg), train)
    return states


def _yukino(
    model: CLIP, sem_states: dict[str, dict], steps: int, seed: int, device: str, run_dir: Path
) -> tuple[dict[str, torch.Tensor], dict[str, bytes], dict]:
    """YUKINO's text variant (from SemCLIP's) and the inverter over it: the variant's state, the
    inverter's files and its manifest component."""
    small = steps <= 50
    text_cfg = YukinoTextConfig(seed=seed, device=device, items=64 if small else YukinoTextConfig.items,
                                steps=steps if small else YukinoTextConfig.steps, batch_items=16 if small else 64)
    cfg = YukinoConfig(steps=steps, seed=seed, device=device, items=128 if small else 6000,
                       oti_items=32 if small else 1000, batch_items=16 if small else 64)
    oti_cfg = OTIConfig(steps=10 if small else OTIConfig.steps)

    def train_text() -> dict[str, torch.Tensor]:
        start = with_state(model, sem_states[text_cfg.start])
        return train_yukino_text(model, start, text_cfg, out_dir=run_dir, log=console.print)

    text_state = _cached_stage(run_dir / "yukino_text.pt", asdict(text_cfg), train_text)

    def train() -> tuple[dict[str, bytes], dict]:
        text_model = with_state(model, text_state)
        return train_inverter(model, text_model, cfg, oti_cfg, out_dir=run_dir, log=console.print).to_files()

    config = {**asdict(cfg), "oti": asdict(oti_cfg), "text": asdict(text_cfg)}
    files, component = _cached_stage(run_dir / "yukino.pt", config, train)
    return text_state, files, component


def _build(
    store: ModelStore,
    name: str,
    config: str,
    run_dir: Path,
    steps: int,
    schedule_steps: int,
    align_start: int,
    pcclip_steps: int,
    semclip_steps: int,
    yukino_steps: int,
    seed: int,
    device: str,
    eval_cfg: EvalConfig,
    aliases: list[str],
) -> dict:
    arch = model_config(config)
    base_cfg = BaseTrainConfig(
        model_config=arch,
        steps=steps,
        seed=seed,
        device=device,
        eval_every=max(1, min(250, steps)),
        checkpoint_every=max(1, min(200, steps)),
        schedule_steps=schedule_steps,
        phase2_start=align_start,
        align_start=align_start,
        align_weight=1.0,
    )
    if steps <= 50:  # smoke configurations: shorter warm-up phases
        base_cfg.text_freeze_steps = base_cfg.filip_start = steps // 3
        base_cfg.warmup_steps = max(1, steps // 5)
        base_cfg.batch_size = 32
    t0 = time.time()
    model = train_base(base_cfg, run_dir / "base", log=console.print)
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
        console.print(f"pcclip: reusing {pc_path}")
    else:
        pc_state = train_pcclip(model.cpu(), pc_cfg, run_dir, log=console.print)
        torch.save({"config": vars(pc_cfg), "state": pc_state}, pc_path)
    pc_seconds = time.time() - t0
    t0 = time.time()
    sem_states = _semclip_variants(model.cpu(), semclip_steps, seed, device, run_dir)
    sem_seconds = time.time() - t0
    t0 = time.time()
    yukino_text, yukino_files, yukino_component = _yukino(model.cpu(), sem_states, yukino_steps, seed, device, run_dir)
    yukino_seconds = time.time() - t0
    dcsm_cfg = DCSMTrainConfig(seed=seed, device=device, **(_SMOKE_DCSM if steps <= 50 else {}))
    t0 = time.time()
    dcsm_files, dcsm_component = train_dcsm_files(
        model.cpu(), model.context_length, dcsm_cfg, run_dir / "dcsm", log=console.print
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
    kwargs = dict(
        text_variants={"pcclip": pc_state, **sem_states, YukinoConfig.text_encoder: yukino_text},
        default_text_encoder="pcclip",
        comparatives=comparatives_library(),
        training=training,
        data=data,
        extra_files={**dcsm_files, **yukino_files},
        components={"dcsm": dcsm_component, "yukino": yukino_component},
    )
    with tempfile.TemporaryDirectory() as tmp:
        # Evaluate exactly what will be served: the stored (fp16) weights, loaded back.
        scratch = ModelStore(tmp)
        publish_bundle(scratch, name, model.cpu(), arch, **kwargs)  # type: ignore[arg-type]
        report = evaluate(ModelBundle.load(scratch, f"{name}@v1", device=device), eval_cfg, log=console.print)
    (run_dir / "eval.json").write_text(json.dumps(report, indent=2))
    # Undefined figures (e.g. an empty subset) stay in eval.json as NaN; the manifest holds numbers.
    flat = {k: v for k, v in report["metrics"].items() if not k.endswith(".stderr") and math.isfinite(v)}
    manifest = publish_bundle(
        store,
        name,
        model.cpu(),
        arch,
        metrics=flat,
        aliases=aliases,
        notes="Shapes-world CLIP trained from scratch; see docs/model_card.md.",
        **kwargs,
    )  # type: ignore[arg-type]
    report["model"] = manifest.ref
    store.write_annex(name, manifest.version, "eval.json", json.dumps(report, indent=2).encode())
    return report


def _print_report(report: dict) -> None:
    metrics = report["metrics"]
    encoders = sorted({k.split(".")[0] for k in metrics if ".zeroshot." in k}, key=lambda e: (e != "base", e))
    console.print(f"\n## Evaluation of {report['model']} (mean ± stderr over seeds {report['seeds']})\n")
    matching = {k: v for k, v in metrics.items() if k.split(".")[1] in ("winoground", "swap")}
    console.print(
        metrics_table(
            {k: v for k, v in metrics.items() if k.split(".")[0] in encoders and k not in matching}, encoders
        ),
        markup=False,
    )
    if matching:
        console.print("\n### Compositional caption matching: 2x2 (Winoground-style) and swap tests\n")
        console.print(metrics_table(matching, ["base", "oti", "yukino"]), markup=False)
    dense = {k: v for k, v in metrics.items() if k.split(".")[0] in ("cosine", "dcsm", "readout", "dense")}
    if dense:
        console.print("\n### Dense scoring (2-way: caption vs its hard negative) and localisation\n")
        console.print(metrics_table(dense, ["cosine", "dcsm"]), markup=False)
    details = report.get("details", {})
    first = details.get(str(report["seeds"][0]), {})
    for enc in encoders:
        comp = first.get(f"{enc}.comparative")
        if comp:
            console.print(
                f"\n### Comparative prompting sweep, {enc} (seed {report['seeds'][0]}; pairs {comp['pairs']})\n"
            )
            console.print(sweep_table(comp["sweep"]), markup=False)
        geo = first.get(f"{enc}.text_geometry")
        if geo:
            console.print(
                f"\ntext geometry ({enc}): " + ", ".join(f"{k} {v:.3f}" for k, v in geo.items()), markup=False
            )


@app.command("build-default")
def build_default(
    store: StoreOpt = Path("models"),
    name: str = "default",
    config: str = "shapes-vit-tiny",
    run_dir: Annotated[Path, typer.Option(help="Checkpoints; rerunning resumes.")] = Path("runs/default"),
    steps: Annotated[int, typer.Option(help="Base training steps in all.")] = 1700,
    schedule_steps: Annotated[int, typer.Option(help="Horizon of the warm-up + cosine schedule.")] = 2200,
    align_start: Annotated[int, typer.Option(help="First step of the mask-alignment phase.")] = 1400,
    pcclip_steps: int = 800,
    semclip_steps: int = 400,
    yukino_steps: int = 4000,
    seed: int = 0,
    device: DeviceOpt = "cpu",
    promote: Annotated[list[str] | None, typer.Option(help="Aliases to point at the new version.")] = None,
    eval_seeds: int = 3,
    smoke: Annotated[bool, typer.Option(help="Tiny config, few steps, small evaluation (CI).")] = False,
) -> None:
    """Train base + PC-CLIP, evaluate on held-out data, publish a version with its figures."""
    torch.manual_seed(seed)
    np.random.seed(seed)
    eval_cfg = EvalConfig(seeds=tuple(range(eval_seeds)))
    if smoke:
        config, steps, pcclip_steps = "shapes-smoke", min(steps, 30), min(pcclip_steps, 20)
        semclip_steps, yukino_steps = min(semclip_steps, 20), min(yukino_steps, 20)
        schedule_steps, align_start = steps, 2 * steps // 3
        eval_cfg = EvalConfig(
            seeds=tuple(range(min(eval_seeds, 2))),
            n_zeroshot=60,
            n_pairs=40,
            n_compositional=40,
            n_pil=20,
            n_calibration=60,
            n_semclip=40,
            n_yukino=16,
        )
    aliases = promote if promote is not None else ["production"]
    report = _build(
        ModelStore(store),
        name,
        config,
        run_dir,
        steps,
        schedule_steps,
        align_start,
        pcclip_steps,
        semclip_steps,
        yukino_steps,
        seed,
        device,
        eval_cfg,
        aliases,
    )
    _print_report(report)


@app.command("evaluate")
def evaluate_cmd(
    ref: str,
    store: StoreOpt = Path("models"),
    device: DeviceOpt = "cpu",
    seeds: int = 3,
    write: Annotated[bool, typer.Option(help="Write eval.json into the version.")] = True,
) -> None:
    """Evaluate a stored version on held-out data; print a markdown table, write eval.json."""
    model_store = ModelStore(store)
    bundle = ModelBundle.load(model_store, ref, device=device)
    report = evaluate(bundle, EvalConfig(seeds=tuple(range(seeds))), log=console.print)
    if write:
        model_store.write_annex(bundle.name, bundle.version, "eval.json", json.dumps(report, indent=2).encode())
    _print_report(report)


@app.command("show-eval")
def show_eval(ref: str, store: StoreOpt = Path("models")) -> None:
    """Print the stored evaluation table of a version (no computation)."""
    model_store = ModelStore(store)
    name, version = model_store.resolve(ref)
    path = model_store.version_dir(name, version) / "eval.json"
    if not path.exists():
        console.print(f"[red]{name}@{version} has no eval.json; run `clip-train evaluate {ref}`")
        raise typer.Exit(1)
    _print_report(json.loads(path.read_text()))


@app.command("pcclip-sweep")
def pcclip_sweep(
    run_dir: Annotated[Path, typer.Option(help="Run directory holding base/model.pt.")] = Path("runs/default"),
    config: str = "shapes-vit-tiny",
    temperatures: str = "0.05,0.1,0.3,1.0",
    losses: str = "contrastive",
    steps: int = 300,
    fine_size_fraction: float = 0.5,
    caption_weight: float = 0.3,
    device: DeviceOpt = "cpu",
) -> None:
    """Sweep the PC-CLIP difference temperature (and loss) on held-out pair ranking + zero-shot."""
    arch = model_config(config)
    base = build_model(arch)
    base.load_state_dict(torch.load(run_dir / "base" / "model.pt", map_location="cpu"))
    rows = []
    for loss in losses.split(","):
        for temperature in map(float, temperatures.split(",")):
            cfg = PCClipConfig(
                steps=steps,
                temperature=temperature,
                loss=loss,
                device=device,
                fine_size_fraction=fine_size_fraction,
                caption_weight=caption_weight,
            )
            state = train_pcclip(base, cfg, log=lambda _: None)
            with tempfile.TemporaryDirectory() as tmp:
                scratch = ModelStore(tmp)
                publish_bundle(scratch, "sweep", base, arch, text_variants={"pcclip": state})
                bundle = ModelBundle.load(scratch, "sweep@v1", device=device)
                ev = Evaluator(bundle, EvalConfig(n_pairs=300, n_zeroshot=300))
                ranks = ev.rank_accuracy(ev.rank_pairs(1000, 300), generator_images, ["pcclip"])["pcclip"]
                scenes = [sample_scene(Split.TEST, 1000, i, n_objects=1) for i in range(300)]
                zs = ev.zero_shot(scenes, ev.images(generator_images(scenes)), "pcclip")
            rows.append(
                {
                    "loss": loss,
                    "temperature": temperature,
                    **{f"rank.{k}": v for k, v in ranks.items()},
                    **{f"zeroshot.{k}": v for k, v in zs.items()},
                }
            )
            console.print(rows[-1])
    keys = list(rows[0])
    console.print("\n| " + " | ".join(keys) + " |\n|" + "---|" * len(keys), markup=False)
    for r in rows:
        console.print(
            "| " + " | ".join(f"{v:.3f}" if isinstance(v, float) else str(v) for v in r.values()) + " |", markup=False
        )


@app.command("heatmap")
def heatmap(
    ref: str,
    image: Annotated[Path, typer.Argument(help="Image file (any format PIL reads).")],
    text: str,
    out: Annotated[Path, typer.Option(help="PNG to write.")] = Path("heatmap.png"),
    store: StoreOpt = Path("models"),
) -> None:
    """Render the DCSM token x patch maps of IMAGE and TEXT as a PNG (as POST /score/dense/heatmap)."""
    from PIL import Image

    from service.heatmap import render_heatmap_png

    bundle = ModelBundle.load(ModelStore(store), ref)
    out.write_bytes(render_heatmap_png(bundle, Image.open(image), text))
    console.print(f"wrote {out}")


@app.command("init-random")
def init_random(
    name: str,
    store: StoreOpt = Path("models"),
    config: str = "shapes-smoke",
    seed: int = 0,
    alias: list[str] | None = None,
) -> None:
    """Publish a randomly initialised model (for load tests of real-sized architectures)."""
    torch.manual_seed(seed)
    manifest = publish_bundle(
        ModelStore(store),
        name,
        build_model(model_config(config)),
        model_config(config),
        aliases=alias if alias is not None else ["production"],
        notes="random weights: for speed and plumbing tests only",
    )
    console.print(f"published {manifest.ref}")


if __name__ == "__main__":
    app()
