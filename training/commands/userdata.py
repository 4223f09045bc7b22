"""``clip-train pcclip|dcsm|semclip|yukino|comparatives``: one command per method on a user's data.

Each command validates the data (every problem printed with its file and line; nothing trains
on bad data), loads ``--model name@alias`` from the store, trains, and publishes a new version
that keeps the base's parts and adds its own. The work itself is in ``training.userdata``
(``run_pcclip`` etc.), which other programs may call directly.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from model_store import Manifest, ModelStore
from model_store.cli_options import output_console
from model_store.errors import StoreError
from training.commands.configured import ConfigError, FlagSpec, configured_command
from training.datasets.dataset import InvalidDataset
from training.options import DEFAULT_STORE, StoreOpt, set_threads

# The run configurations are torch-free dataclasses; the trainers are imported when a command runs.
from training.userdata.settings import ComparativesRun, DCSMRun, PCClipRun, SemClipRun, YukinoRun

if TYPE_CHECKING:
    from training.userdata.context import RunContext

# Each command imports torch and its trainer when it runs (training/commands/world.py says why).

console = output_console()


@dataclass
class RunOptions:
    """What every method command needs besides the method's settings: the base, the data, where
    to publish, the machine, and the run directory."""

    model: str | None = None  # required: from the flag or the config file
    data: Path | None = None  # required
    labels: Path | None = None
    store: str = DEFAULT_STORE
    name: str | None = None
    alias: list[str] = field(default_factory=list)
    device: str = "cpu"
    precision: str = "auto"
    seed: int = 0
    run_dir: Path | None = None
    resume: bool = True
    feature_cache: Path | None = None
    threads: int = 0

    def aliases(self) -> tuple[str, ...]:
        return tuple(self.alias)


FLAGS: dict[str, FlagSpec] = {
    "model": FlagSpec("Base version in the store: name@alias or name@version (required).", ("--model",)),
    "data": FlagSpec("A .jsonl file, a .tar WebDataset shard, or a folder of them (required).", ("--data",)),
    "labels": FlagSpec("Label set (JSON); default: labels.json beside the data."),
    "store": FlagSpec("", annotation=StoreOpt),
    "name": FlagSpec("Model name to publish under (default: the base's)."),
    "alias": FlagSpec("Aliases to point at the new version."),
    "device": FlagSpec("cpu, cuda or cuda:N."),
    "precision": FlagSpec("auto (bf16/fp16 autocast on CUDA, fp32 on CPU), fp32, bf16 or fp16."),
    "seed": FlagSpec("Random seed (batches, initialisation, generated texts)."),
    "run_dir": FlagSpec("Checkpoints and caches of this run (default: runs/<command>)."),
    "resume": FlagSpec("Continue from the run directory's checkpoint, or start over.", ("--resume/--restart",)),
    "feature_cache": FlagSpec("Frozen image features (default ~/.cache/clip-train).", envvar="CLIP_FEATURE_CACHE"),
    "threads": FlagSpec("torch intra-op threads (0: torch's default; 1 on a shared or small CPU)."),
    # The methods' settings (their Hyper and what a user's data adds).
    "steps": FlagSpec("Optimisation steps."),
    "batch_size": FlagSpec("Items per step."),
    "lr": FlagSpec("Peak learning rate (warm-up, then cosine decay)."),
    "checkpoint_every": FlagSpec("Steps between checkpoints."),
    "stop_after": FlagSpec("End this run after N steps in all (resume later); publish nothing."),
    "temperature": FlagSpec("Difference-loss temperature."),
    "loss": FlagSpec("Difference loss: contrastive or mse."),
    "caption_weight": FlagSpec("Weight of the image-caption loss that keeps zero-shot."),
    "generated_pairs": FlagSpec("Pairs with generated difference texts from labels."),
    "ensemble_weight": FlagSpec("w * finetuned + (1 - w) * base."),
    "make_default": FlagSpec("Make pcclip the version's default text encoder."),
    "weight_decay": FlagSpec("AdamW weight decay."),
    "warmup_steps": FlagSpec("Learning-rate warm-up steps."),
    "k_random": FlagSpec("Other items' captions per image and other images per caption."),
    "channels": FlagSpec("Scorer conv channels."),
    "hidden": FlagSpec("Scorer head width."),
    "table_seed": FlagSpec("Seed of the functional-word row table."),
    "attribute_captions": FlagSpec("Also train on labels' declared attributes without their names (labels.json)."),
    "directions": FlagSpec("Random projection directions of the SemCLIP loss."),
    "normalise": FlagSpec("Normalise the projected features in the SemCLIP loss."),
    "negatives_in_clip": FlagSpec("Use the negations as extra negatives in the CLIP term."),
    "width": FlagSpec("Inverter hidden width."),
    "scale": FlagSpec("Logit scale of the matching loss."),
    "distill_weight": FlagSpec("Weight of the distillation toward OTI's tokens (0: no OTI)."),
    "oti_items": FlagSpec("Images OTI teaches the inverter on (0: no OTI)."),
    "text_encoder": FlagSpec("Text encoder the text finetune starts from (default: the base's)."),
    "pairs": FlagSpec("Most-confused label pairs to write comparatives for."),
    "generator": FlagSpec("template (from label attributes) or llm."),
    "llm_base_url": FlagSpec("OpenAI-compatible API root, e.g. http://host/v1."),
    "llm_model": FlagSpec("Model name the endpoint serves."),
    "llm_key_env": FlagSpec("Environment variable holding the API key."),
    "llm_samples": FlagSpec("Answers asked per ordered pair."),
    "split": FlagSpec("Split whose labelled images calibrate (train, val or test)."),
}


def config_error(exc: ConfigError) -> None:
    console.print(f"[red]{exc}[/red]", markup=False)
    raise typer.Exit(1)


def open_context(command: str, options: RunOptions) -> RunContext:
    """Validate the data and load the base; exit 1 with every problem listed when the data is bad."""
    from training import distributed
    from training.userdata.context import RunContext

    if options.model is None or options.data is None:
        missing = " and ".join(f"--{k}" for k in ("model", "data") if getattr(options, k) is None)
        config_error(ConfigError(f'{missing} (or the config file\'s "model" / "data") is required'))
    assert options.model is not None and options.data is not None
    set_threads(options.threads)
    directory = options.run_dir or Path("runs") / command
    if not options.resume:
        for old in directory.glob(f"{command}*.checkpoint.pt"):
            old.unlink()
    try:
        _, device = distributed.setup(options.device)  # under torchrun: join the ranks (gloo / NCCL)
        return RunContext.open(
            ModelStore(options.store), options.model, options.data, labels=options.labels, run_dir=directory,
            cache_dir=options.feature_cache, device=device, precision=options.precision,  # type: ignore[arg-type]
            seed=options.seed, log=console.print,
        )  # fmt: skip
    except InvalidDataset as exc:
        report_problems(exc)
        raise typer.Exit(1) from None
    except (ValueError, StoreError) as exc:  # an unknown model or device: say which, no traceback
        console.print(f"[red]{exc}[/red]", markup=False)
        raise typer.Exit(1) from None


def save_settings(ctx: RunContext, command: str, options: RunOptions, cfg: Any) -> None:
    """The run's resolved settings beside its checkpoints (``--config`` reads this file back)."""
    settings = {**asdict(options), **asdict(cfg)}
    path = ctx.run_dir / f"{command}.config.json"
    path.write_text(json.dumps(settings, indent=2, default=str) + "\n")


def report_problems(exc: InvalidDataset) -> None:
    for problem in exc.problems:
        console.print(f"[red]{problem}[/red]", soft_wrap=True, highlight=False, markup=False)
    console.print(f"{len(exc.problems)} problem(s) in the data: nothing was trained (see `clip-train data validate`)")


def finish(run: Callable[[], Manifest | None], aliases: tuple[str, ...]) -> None:
    """Run a training and print what it published; bad input exits 1 with its message."""
    from training import distributed

    try:
        manifest = run()
    except (ValueError, StoreError) as exc:  # bad input, or the store refused (e.g. the evaluation gate)
        console.print(f"[red]{exc}[/red]", markup=False)
        raise typer.Exit(1) from None
    finally:
        main = distributed.is_main()
        distributed.shutdown()
    if not main:  # another torchrun rank: rank 0 published
        return
    if manifest is None:
        console.print("stopped early: rerun the same command to resume and publish")
        return
    console.print(f"published {manifest.ref}" + (f" ({', '.join(aliases)})" if aliases else ""))


def _aliases(alias: list[str] | None) -> tuple[str, ...]:
    return tuple(alias or ())


def _train_method(method: str, options: RunOptions, cfg: Any, train: Callable[..., Any]) -> None:
    """One method's run on user data: its run folder, its settings saved there, then ``train``."""
    ctx = open_context(method, options)
    save_settings(ctx, method, options, cfg)
    finish(lambda: train(ctx, cfg, name=options.name, aliases=options.aliases()), options.aliases())


def pcclip(options: RunOptions, cfg: PCClipRun) -> None:
    """PC-CLIP: finetune the text tower on difference texts (yours, or generated from labels)."""
    from training.userdata.pcclip import run_pcclip

    _train_method("pcclip", options, cfg, run_pcclip)


def dcsm(options: RunOptions, cfg: DCSMRun) -> None:
    """DCSM: train a dense scorer on captions and hard negatives (yours, or generated by rule)."""
    from training.userdata.dcsm import run_dcsm

    _train_method("dcsm", options, cfg, run_dcsm)


def semclip(options: RunOptions, cfg: SemClipRun) -> None:
    """SemCLIP: finetune the text tower so paraphrases agree and negations part (both generated)."""
    from training.userdata.semclip import run_semclip

    _train_method("semclip", options, cfg, run_semclip)


def yukino(options: RunOptions, cfg: YukinoRun) -> None:
    """YUKINO: finetune a text variant, teach the image-to-pseudo-token inverter with OTI, train it on your captions."""
    from training.userdata.yukino import run_yukino

    _train_method("yukino", options, cfg, run_yukino)


def comparatives(options: RunOptions, cfg: ComparativesRun) -> None:
    """Comparatives: find the label pairs the model confuses, write texts for them into a new version."""
    from training.userdata.comparatives import run_comparatives

    ctx = open_context("comparatives", options)
    save_settings(ctx, "comparatives", options, cfg)
    aliases = options.aliases()
    finish(lambda: run_comparatives(ctx, cfg, llm_cache=ctx.run_dir / "llm-cache", name=options.name,
                                    aliases=aliases)[0], aliases)  # fmt: skip


# Each method's run configuration: its Hyper and what a user's data adds (training.userdata.<method>).
METHODS: dict[str, tuple[Callable[..., None], type]] = {
    "pcclip": (pcclip, PCClipRun),
    "dcsm": (dcsm, DCSMRun),
    "semclip": (semclip, SemClipRun),
    "yukino": (yukino, YukinoRun),
    "comparatives": (comparatives, ComparativesRun),
}


def register(app: typer.Typer) -> None:
    """Add the per-method commands to ``clip-train``: flags generated from ``RunOptions`` and the
    method's run configuration, and ``--config FILE``."""
    for command, (run, cfg_class) in METHODS.items():
        fn = configured_command((RunOptions, cfg_class), FLAGS, run, config_error, run.__doc__ or "")
        app.command(command)(fn)


def train_base_on_data(
    data: Path,
    labels: Path | None,
    model_config: dict[str, Any],
    run_dir: Path,
    store: str,
    name: str,
    aliases: tuple[str, ...],
    **settings: Any,
) -> None:
    """``clip-train base --data``: validate, train from scratch, publish."""
    from training.methods.checkpoint import Runtime
    from training.userdata.base import BaseRun, run_user_base
    from training.userdata.context import load_valid_dataset
    from training.userdata.device import check_device

    try:
        dataset = load_valid_dataset(data, labels)
    except InvalidDataset as exc:
        report_problems(exc)
        raise typer.Exit(1) from None
    seed, device, precision = settings.pop("seed"), check_device(settings.pop("device")), settings.pop("precision")
    cfg = BaseRun(**settings)
    finish(
        lambda: run_user_base(ModelStore(store), name, dataset, model_config, cfg, run_dir,
                              runtime=Runtime(seed, device, log=console.print), precision=precision,  # type: ignore[arg-type]
                              aliases=aliases),
        aliases,
    )  # fmt: skip
