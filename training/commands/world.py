"""``clip-train world-bench|base|build-default|evaluate|show-eval|pcclip-sweep|heatmap|init-random``:
the shapes world's commands, and evaluating or building a version (``base --data`` and
``evaluate --data`` hand users' data to ``training.commands.userdata`` and
``training.evaluation.userdata``).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import typer

from model_store import ModelStore
from model_store.cli_options import output_console
from model_store.errors import StoreError
from training.commands.configured import options_command
from training.options import StoreOpt, set_threads

# Each command imports what it runs (torch, open_clip, the trainers) when it runs: `clip-train
# --help`, `data validate` or `show-eval` should not wait seconds for libraries they never use.

# soft_wrap: lines are never broken at the width rich assumes for a pipe (80 columns), so a
# markdown table piped to a file or another program keeps one row per line.
console = output_console(soft_wrap=True)


DeviceOpt = Annotated[str, typer.Option(help="cpu, cuda or cuda:N.")]
ConfigOpt = Annotated[str, typer.Option(help="Model config: a name in training/configs or a JSON path.")]
SeedOpt = Annotated[int, typer.Option(help="Random seed.")]
RefArg = Annotated[str, typer.Argument(help="Version in the store: name, name@alias or name@version.")]


def world_bench(
    n: Annotated[int, typer.Option(help="Scenes to render.")] = 2000,
    seed: Annotated[int, typer.Option(help="Seed of the scenes.")] = 0,
) -> None:
    """Measure scene sampling and rendering speed (scenes/s)."""
    from training.world.render import render_batch
    from training.world.scene import Split, sample_scene

    t0 = time.perf_counter()
    scenes = [sample_scene(Split.TRAIN, seed, i) for i in range(n)]
    t1 = time.perf_counter()
    render_batch(scenes, 64, seed=seed)
    t2 = time.perf_counter()
    console.print(
        f"sample {n / (t1 - t0):,.0f} scenes/s, render 64x64 {n / (t2 - t1):,.0f} scenes/s, "
        f"end to end {n / (t2 - t0):,.0f} scenes/s"
    )


@dataclass
class BaseOptions:
    """``clip-train base``'s options."""

    out: Annotated[Path, typer.Option(help="Run directory (checkpoints, resume).")] = Path("runs/base")
    config: ConfigOpt = "shapes-vit-tiny"
    steps: Annotated[int, typer.Option(help="Training steps.")] = 2200
    batch_size: Annotated[int, typer.Option(help="Scenes (or your images) per step.")] = 128
    seed: SeedOpt = 0
    device: DeviceOpt = "cpu"
    threads: Annotated[int, typer.Option(help="torch intra-op threads (0: torch's default).")] = 0
    data: Annotated[
        Path | None, typer.Option(help="Train on your captions / labelled images instead (docs/data.md).")
    ] = None
    labels: Annotated[Path | None, typer.Option(help="With --data: the label set (default labels.json).")] = None
    store: StoreOpt = "models"
    name: Annotated[str, typer.Option(help="With --data: the model name to publish under.")] = "user"
    alias: Annotated[list[str] | None, typer.Option(help="With --data: aliases to point at the version.")] = None
    precision: Annotated[str, typer.Option(help="With --data: bf16 (default), fp16 or fp32 autocast.")] = "bf16"
    lr: Annotated[float, typer.Option(help="With --data: peak learning rate.")] = 1e-3
    text_freeze_steps: Annotated[int, typer.Option(help="With --data: steps with the text tower frozen.")] = 300
    stop_after: Annotated[int | None, typer.Option(help="With --data: end after N steps in all (resume later).")] = None
    attribute_captions: Annotated[
        bool,
        typer.Option(help="With --data: also caption labelled images by their labels' attributes (labels.json)."),
    ] = False


def base(o: BaseOptions) -> None:
    """Train a base CLIP from scratch: on the shapes world (resumes from OUT/checkpoint.pt), or with --data on
    your captions at the config's own image size, publishing a version (resumes from OUT/base.checkpoint.pt)."""
    from training.recipe import DefaultRecipe, model_config
    from training.train_base import BaseTrainConfig, train_base

    set_threads(o.threads)
    if o.attribute_captions and o.data is None:
        console.print("[red]--attribute-captions needs --data: the shapes world's captions are generated[/red]")
        raise typer.Exit(1)
    if o.data is not None:
        from training.commands.userdata import train_base_on_data

        train_base_on_data(o.data, o.labels, model_config(o.config), o.out, o.store, o.name, tuple(o.alias or ()),
                           steps=o.steps, batch_size=o.batch_size, lr=o.lr, text_freeze_steps=o.text_freeze_steps,
                           seed=o.seed, device=o.device, precision=o.precision, stop_after=o.stop_after,
                           attribute_captions=o.attribute_captions)  # fmt: skip
        return
    cfg = BaseTrainConfig(
        model_config=model_config(o.config),
        steps=o.steps,
        batch_size=o.batch_size,
        seed=o.seed,
        device=o.device,
        bf16=o.device == "cpu" or o.device.startswith("cuda"),
    )
    # Normalised as build-default publishes the default model (DefaultRecipe.preprocess).
    train_base(cfg, o.out, preprocess=DefaultRecipe().preprocess, log=console.print)


@dataclass
class BuildOptions:
    """``clip-train build-default``'s options."""

    store: StoreOpt = "models"
    name: Annotated[str, typer.Option(help="Model name in the store.")] = "default"
    config: ConfigOpt = "shapes-vit-tiny"
    run_dir: Annotated[Path, typer.Option(help="Checkpoints; rerunning resumes.")] = Path("runs/default")
    steps: Annotated[int, typer.Option(help="Base training steps in all.")] = 1700
    schedule_steps: Annotated[int, typer.Option(help="Horizon of the warm-up + cosine schedule.")] = 2200
    align_start: Annotated[int, typer.Option(help="First step of the mask-alignment phase.")] = 1400
    pcclip_steps: Annotated[int, typer.Option(help="PC-CLIP text-tower finetune steps.")] = 800
    semclip_steps: Annotated[int, typer.Option(help="SemCLIP steps (each variant).")] = 400
    yukino_steps: Annotated[int, typer.Option(help="YUKINO inverter steps.")] = 4000
    seed: SeedOpt = 0
    device: DeviceOpt = "cpu"
    promote: Annotated[list[str] | None, typer.Option(help="Aliases to point at the new version.")] = None
    eval_seeds: Annotated[int, typer.Option(help="Evaluation seeds (mean and standard error over them).")] = 3
    smoke: Annotated[bool, typer.Option(help="Tiny config, few steps, small evaluation (CI).")] = False
    threads: Annotated[int, typer.Option(help="torch intra-op threads (0: torch's default).")] = 0


def build(o: BuildOptions) -> None:
    """Train every stage from scratch (base CLIP, PC-CLIP, SemCLIP, YUKINO, DCSM), evaluate on held-out
    data, publish a version with its figures; point aliases at it only when --promote names them."""
    import numpy as np
    import torch

    from clipcore.models.validate import validate_version
    from training.evaluation import EvalConfig
    from training.recipe import DefaultRecipe, build_default_version
    from training.report import print_report

    set_threads(o.threads)
    torch.manual_seed(o.seed)
    np.random.seed(o.seed)
    recipe = DefaultRecipe(
        name=o.name, config=o.config, run_dir=o.run_dir, steps=o.steps, schedule_steps=o.schedule_steps,
        align_start=o.align_start, pcclip_steps=o.pcclip_steps, semclip_steps=o.semclip_steps,
        yukino_steps=o.yukino_steps, seed=o.seed, device=o.device, eval=EvalConfig(seeds=tuple(range(o.eval_seeds))),
        aliases=list(o.promote or []),
    )  # fmt: skip
    try:
        report = build_default_version(
            ModelStore(o.store, validator=validate_version), recipe.smoke() if o.smoke else recipe, log=console.print
        )
    except StoreError as exc:  # e.g. the evaluation gate refused --promote (the version is published)
        console.print(str(exc), style="red", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(1) from None
    print_report(report, console.print)


@dataclass
class EvaluateOptions:
    """``clip-train evaluate``'s options."""

    ref: RefArg
    store: StoreOpt = "models"
    device: DeviceOpt = "cpu"
    seeds: Annotated[int, typer.Option(help="Evaluation seeds (mean and standard error over them).")] = 3
    write: Annotated[bool, typer.Option(help="Write eval.json (and report.html) into the version.")] = True
    data: Annotated[
        Path | None, typer.Option(help="A dataset of your own (docs/data.md) instead of the built-in world.")
    ] = None
    split: Annotated[str, typer.Option(help="With --data: train, val, test or all (a held-out file).")] = "test"
    dataset_name: Annotated[str | None, typer.Option(help="With --data: the key prefix (default: from the path).")] = (
        None
    )
    out: Annotated[Path | None, typer.Option(help="With --data: also write report.html, PNGs and eval.json here.")] = (
        None
    )
    n_zeroshot: Annotated[int, typer.Option(help="With --data: labelled images per seed.")] = 2000
    n_pairs: Annotated[int, typer.Option(help="With --data: image pairs per seed.")] = 1000
    n_captions: Annotated[int, typer.Option(help="With --data: captions per seed (DCSM, SemCLIP).")] = 300
    n_gallery: Annotated[int, typer.Option(help="With --data: labelled images per seed in the retrieval gallery.")] = (
        500
    )
    threads: Annotated[int, typer.Option(help="torch intra-op threads (0: torch's default).")] = 0
    compare: Annotated[
        str | None,
        typer.Option(help="With --data: name@version whose figures on the same data are shown beside, with changes."),
    ] = None


def evaluate_version(o: EvaluateOptions) -> None:
    """Evaluate a stored version on held-out data; print a markdown table, write eval.json.

    With --data: on your own labelled images and captions (zero-shot with and without the
    version's comparatives, pair ranking, DCSM, SemCLIP, YUKINO where the version has them),
    written under data.<name>. in eval.json with an HTML report (report.html) beside it; the table
    names each figure in words with its key and chance level, and --compare adds a column."""
    from clipcore.models.bundle import ModelBundle
    from training.datasets.dataset import InvalidDataset
    from training.evaluation import EvalConfig, evaluate
    from training.evaluation.userdata.command import evaluate_on_data
    from training.evaluation.userdata.data import UserEvalConfig
    from training.evaluation.userdata.figures import summary_lines
    from training.report import print_report

    set_threads(o.threads)
    model_store = ModelStore(o.store)
    if o.data is not None:
        if o.split not in ("train", "val", "test", "all"):
            raise typer.BadParameter("--split must be train, val, test or all")
        cfg = UserEvalConfig(seeds=tuple(range(o.seeds)), split=o.split, n_zeroshot=o.n_zeroshot,  # type: ignore[arg-type]
                             n_pairs=o.n_pairs, n_captions=o.n_captions, n_gallery=o.n_gallery)  # fmt: skip
        try:
            report, name = evaluate_on_data(model_store, o.ref, o.data, cfg, name=o.dataset_name, device=o.device,
                                            write=o.write, out=o.out, compare=o.compare, log=console.print)  # fmt: skip
        except (InvalidDataset, ValueError, StoreError) as exc:  # bad data, or no such model / version
            console.print(str(exc), style="red", soft_wrap=True, highlight=False, markup=False)
            raise typer.Exit(1) from None
        for line in summary_lines(report, name):
            console.print(line, markup=False)
        return
    if o.compare is not None:
        raise typer.BadParameter("--compare needs --data (the built-in world's figures: model-store gate)")
    bundle = ModelBundle.load(model_store, o.ref, device=o.device)
    report = evaluate(bundle, EvalConfig(seeds=tuple(range(o.seeds))), log=console.print)
    if o.write:
        model_store.write_annex(bundle.name, bundle.version, "eval.json", json.dumps(report, indent=2).encode())
    print_report(report, console.print)


def show_eval(ref: RefArg, store: StoreOpt = "models") -> None:
    """Print the stored evaluation table of a version (no computation)."""
    from training.report import print_report

    model_store = ModelStore(store)
    name, version = model_store.resolve(ref)
    raw = model_store.read_annex(name, version, "eval.json")
    if raw is None:
        console.print(f"[red]{name}@{version} has no eval.json; run `clip-train evaluate {ref}`")
        raise typer.Exit(1)
    print_report(json.loads(raw), console.print)


def pcclip_sweep(
    run_dir: Annotated[Path, typer.Option(help="Run directory holding base/model.pt.")] = Path("runs/default"),
    config: ConfigOpt = "shapes-vit-tiny",
    temperatures: Annotated[
        str, typer.Option(help="Comma-separated difference-loss temperatures.")
    ] = "0.05,0.1,0.3,1.0",
    losses: Annotated[str, typer.Option(help="Comma-separated losses: contrastive, mse.")] = "contrastive",
    steps: Annotated[int, typer.Option(help="Finetune steps per setting.")] = 300,
    fine_size_fraction: Annotated[float, typer.Option(help="Share of pairs of the same size class.")] = 0.5,
    caption_weight: Annotated[float, typer.Option(help="Weight of the image-caption loss.")] = 0.3,
    device: DeviceOpt = "cpu",
    threads: Annotated[int, typer.Option(help="torch intra-op threads (0: torch's default).")] = 0,
) -> None:
    """Sweep the PC-CLIP difference temperature (and loss) on held-out pair ranking + zero-shot."""
    import torch

    from clipcore.models.bundle import ModelBundle
    from clipcore.models.clip_model import build_model
    from clipcore.models.publish import TrainedModel, publish_bundle
    from training.evaluation import EvalConfig, Evaluator, generator_images
    from training.recipe import DefaultRecipe, model_config
    from training.train_pcclip import PCClipConfig, train_pcclip
    from training.world.scene import Split, sample_scene

    set_threads(threads)
    arch = model_config(config)
    base = build_model(arch)
    base.load_state_dict(torch.load(run_dir / "base" / "model.pt", map_location="cpu"))
    preprocess = DefaultRecipe().preprocess  # what build-default publishes base/model.pt with
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
            state = train_pcclip(base, cfg, log=lambda _: None, preprocess=preprocess)
            with tempfile.TemporaryDirectory() as tmp:
                scratch = ModelStore(tmp)
                publish_bundle(
                    scratch, "sweep", TrainedModel(base, arch, text_variants={"pcclip": state}, preprocess=preprocess)
                )
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


def heatmap(
    ref: Annotated[str, typer.Argument(help="Version with a DCSM scorer: name, name@alias or name@version.")],
    image: Annotated[Path, typer.Argument(help="Image file (any format PIL reads).")],
    text: Annotated[str, typer.Argument(help="Text whose tokens are matched to the image's patches.")],
    out: Annotated[Path, typer.Option(help="PNG to write.")] = Path("heatmap.png"),
    store: StoreOpt = "models",
) -> None:
    """Render the DCSM token x patch maps of IMAGE and TEXT as a PNG (as POST /score/dense/heatmap)."""
    from PIL import Image

    from clipcore.heatmap import render_heatmap_png
    from clipcore.models.bundle import ModelBundle

    bundle = ModelBundle.load(ModelStore(store), ref)
    out.write_bytes(render_heatmap_png(bundle, Image.open(image), text))
    console.print(f"wrote {out}")


def init_random(
    name: Annotated[str, typer.Argument(help="Model name to publish the random version under.")],
    store: StoreOpt = "models",
    config: ConfigOpt = "shapes-smoke",
    seed: SeedOpt = 0,
    alias: Annotated[
        list[str] | None, typer.Option(help="Aliases to point at it, through the evaluation gate (none by default).")
    ] = None,
) -> None:
    """Publish a randomly initialised model (for load tests of real-sized architectures); no alias
    moves unless --alias names one."""
    import torch

    from clipcore.models.clip_model import build_model
    from clipcore.models.publish import TrainedModel, publish_bundle
    from clipcore.models.validate import validate_version
    from model_store.alias_views import print_gate
    from training.recipe import model_config

    torch.manual_seed(seed)
    try:
        manifest = publish_bundle(
            ModelStore(store, validator=validate_version),
            name,
            TrainedModel(
                build_model(model_config(config)),
                model_config(config),
                notes="random weights: for speed and plumbing tests only",
            ),
            aliases=alias or (),
            on_gate=lambda report: print_gate(console, report),
        )
    except StoreError as exc:  # e.g. the evaluation gate refused to move an alias to random weights
        console.print(str(exc), style="red", soft_wrap=True, highlight=False, markup=False)
        raise typer.Exit(1) from None
    moved = f" ({', '.join(alias)} -> {manifest.version})" if alias else " (no alias moved)"
    console.print(f"published {manifest.ref}{moved}")


def register(app: typer.Typer) -> None:
    """Add these commands to ``app`` in the order ``--help`` lists them."""
    app.command("world-bench")(world_bench)
    app.command("base")(options_command(BaseOptions, base))
    app.command("build-default")(options_command(BuildOptions, build))
    app.command("evaluate")(options_command(EvaluateOptions, evaluate_version))
    app.command("show-eval")(show_eval)
    app.command("pcclip-sweep")(pcclip_sweep)
    app.command("heatmap")(heatmap)
    app.command("init-random")(init_random)
