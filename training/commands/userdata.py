"""``clip-train pcclip|dcsm|semclip|yukino|comparatives``: one command per method on a user's data.

Each command validates the data (every problem printed with its file and line; nothing trains
on bad data), loads ``--model name@alias`` from the store, trains, and publishes a new version
that keeps the base's parts and adds its own. The work itself is in ``training.userdata``
(``run_pcclip`` etc.), which other programs may call directly.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from model_store import Manifest, ModelStore
from model_store.cli_options import output_console
from model_store.errors import StoreError
from training.datasets.dataset import InvalidDataset
from training.options import StoreOpt, set_threads

if TYPE_CHECKING:
    from training.userdata.context import RunContext

# Each command imports torch and its trainer when it runs (training/commands/world.py says why).

console = output_console()

ModelOpt = Annotated[str, typer.Option("--model", help="Base version in the store: name@alias or name@version.")]
DataOpt = Annotated[Path, typer.Option("--data", help="A .jsonl file, a .tar WebDataset shard, or a folder of them.")]
LabelsOpt = Annotated[
    Path | None, typer.Option("--labels", help="Label set (JSON); default: labels.json beside the data.")
]
NameOpt = Annotated[str | None, typer.Option("--name", help="Model name to publish under (default: the base's).")]
AliasOpt = Annotated[list[str] | None, typer.Option("--alias", help="Aliases to point at the new version.")]
DeviceOpt = Annotated[str, typer.Option("--device", help="cpu, cuda or cuda:N.")]
PrecisionOpt = Annotated[
    str, typer.Option("--precision", help="auto (bf16/fp16 autocast on CUDA, fp32 on CPU), fp32, bf16 or fp16.")
]
SeedOpt = Annotated[int, typer.Option("--seed", help="Random seed (batches, initialisation, generated texts).")]
StepsOpt = Annotated[int, typer.Option("--steps", help="Optimisation steps.")]
BatchOpt = Annotated[int, typer.Option("--batch-size", help="Items per step.")]
LrOpt = Annotated[float, typer.Option("--lr", help="Peak learning rate (warm-up, then cosine decay).")]
RunDirOpt = Annotated[
    Path | None, typer.Option("--run-dir", help="Checkpoints and caches of this run (default: runs/<command>).")
]
ResumeOpt = Annotated[
    bool, typer.Option("--resume/--restart", help="Continue from the run directory's checkpoint, or start over.")
]
StopAfterOpt = Annotated[
    int | None, typer.Option("--stop-after", help="End this run after N steps in all (resume later); publish nothing.")
]
ThreadsOpt = Annotated[
    int, typer.Option("--threads", help="torch intra-op threads (0: torch's default; 1 on a shared or small CPU).")
]
CacheOpt = Annotated[
    Path | None,
    typer.Option(
        "--feature-cache", envvar="CLIP_FEATURE_CACHE", help="Frozen image features (default ~/.cache/clip-train)."
    ),
]


def open_context(
    command: str,
    store: str,
    model: str,
    data: Path,
    labels: Path | None,
    run_dir: Path | None,
    resume: bool,
    cache: Path | None,
    device: str,
    precision: str,
    seed: int,
) -> RunContext:
    """Validate the data and load the base; exit 1 with every problem listed when the data is bad."""
    from training import distributed
    from training.userdata.context import RunContext

    directory = run_dir or Path("runs") / command
    if not resume:
        for old in directory.glob(f"{command}.checkpoint.pt"):
            old.unlink()
    try:
        _, device = distributed.setup(device)  # under torchrun: join the ranks (gloo / NCCL)
        return RunContext.open(
            ModelStore(store), model, data, labels=labels, run_dir=directory, cache_dir=cache, device=device,
            precision=precision, seed=seed, log=console.print,  # type: ignore[arg-type]
        )  # fmt: skip
    except InvalidDataset as exc:
        report_problems(exc)
        raise typer.Exit(1) from None
    except (ValueError, StoreError) as exc:  # an unknown model or device: say which, no traceback
        console.print(f"[red]{exc}[/red]", markup=False)
        raise typer.Exit(1) from None


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


def pcclip_cmd(
    model: ModelOpt, data: DataOpt, labels: LabelsOpt = None, store: StoreOpt = "models", name: NameOpt = None,
    alias: AliasOpt = None, device: DeviceOpt = "cpu", precision: PrecisionOpt = "auto", seed: SeedOpt = 0,
    steps: StepsOpt = 300, batch_size: BatchOpt = 64, lr: LrOpt = 1e-4,
    temperature: Annotated[float, typer.Option(help="Difference-loss temperature.")] = 0.1,
    caption_weight: Annotated[float, typer.Option(help="Weight of the image-caption loss that keeps zero-shot.")] = 0.3,
    generated_pairs: Annotated[int, typer.Option(help="Pairs with generated difference texts from labels.")] = 2000,
    ensemble_weight: Annotated[float, typer.Option(help="w * finetuned + (1 - w) * base.")] = 1.0,
    make_default: Annotated[bool, typer.Option(help="Make pcclip the version's default text encoder.")] = True,
    run_dir: RunDirOpt = None, resume: ResumeOpt = True, stop_after: StopAfterOpt = None,
    feature_cache: CacheOpt = None, threads: ThreadsOpt = 0,
) -> None:  # fmt: skip
    """PC-CLIP: finetune the text tower on difference texts (yours, or generated from labels)."""
    from training.userdata.pcclip import PCClipRun, run_pcclip

    set_threads(threads)
    ctx = open_context("pcclip", store, model, data, labels, run_dir, resume, feature_cache, device, precision, seed)
    cfg = PCClipRun(steps=steps, batch_size=batch_size, lr=lr, temperature=temperature, caption_weight=caption_weight,
                    generated_pairs=generated_pairs, ensemble_weight=ensemble_weight, make_default=make_default,
                    stop_after=stop_after)  # fmt: skip
    finish(lambda: run_pcclip(ctx, cfg, name=name, aliases=_aliases(alias)), _aliases(alias))


def dcsm_cmd(
    model: ModelOpt, data: DataOpt, labels: LabelsOpt = None, store: StoreOpt = "models", name: NameOpt = None,
    alias: AliasOpt = None, device: DeviceOpt = "cpu", precision: PrecisionOpt = "auto", seed: SeedOpt = 0,
    steps: StepsOpt = 600, batch_size: BatchOpt = 32, lr: LrOpt = 2e-3,
    channels: Annotated[int, typer.Option(help="Scorer conv channels.")] = 32,
    hidden: Annotated[int, typer.Option(help="Scorer head width.")] = 128,
    run_dir: RunDirOpt = None, resume: ResumeOpt = True, stop_after: StopAfterOpt = None,
    feature_cache: CacheOpt = None, threads: ThreadsOpt = 0,
) -> None:  # fmt: skip
    """DCSM: train a dense scorer on captions and hard negatives (yours, or generated by rule)."""
    from training.userdata.dcsm import DCSMRun, run_dcsm

    set_threads(threads)
    ctx = open_context("dcsm", store, model, data, labels, run_dir, resume, feature_cache, device, precision, seed)
    cfg = DCSMRun(steps=steps, batch_size=batch_size, lr=lr, channels=channels, hidden=hidden, stop_after=stop_after)
    finish(lambda: run_dcsm(ctx, cfg, name=name, aliases=_aliases(alias)), _aliases(alias))


def semclip_cmd(
    model: ModelOpt, data: DataOpt, labels: LabelsOpt = None, store: StoreOpt = "models", name: NameOpt = None,
    alias: AliasOpt = None, device: DeviceOpt = "cpu", precision: PrecisionOpt = "auto", seed: SeedOpt = 0,
    steps: StepsOpt = 300, batch_size: BatchOpt = 64, lr: LrOpt = 1e-4,
    run_dir: RunDirOpt = None, resume: ResumeOpt = True, stop_after: StopAfterOpt = None,
    feature_cache: CacheOpt = None, threads: ThreadsOpt = 0,
) -> None:  # fmt: skip
    """SemCLIP: finetune the text tower so paraphrases agree and negations part (both generated)."""
    from training.userdata.semclip import SemClipRun, run_semclip

    set_threads(threads)
    ctx = open_context("semclip", store, model, data, labels, run_dir, resume, feature_cache, device, precision, seed)
    cfg = SemClipRun(steps=steps, batch_size=batch_size, lr=lr, stop_after=stop_after)
    finish(lambda: run_semclip(ctx, cfg, name=name, aliases=_aliases(alias)), _aliases(alias))


def yukino_cmd(
    model: ModelOpt, data: DataOpt, labels: LabelsOpt = None, store: StoreOpt = "models", name: NameOpt = None,
    alias: AliasOpt = None, device: DeviceOpt = "cpu", precision: PrecisionOpt = "auto", seed: SeedOpt = 0,
    steps: StepsOpt = 500, batch_size: BatchOpt = 64, lr: LrOpt = 3e-4,
    text_encoder: Annotated[str | None, typer.Option(help="Text encoder to invert into (default: the base's).")] = None,
    run_dir: RunDirOpt = None, resume: ResumeOpt = True, stop_after: StopAfterOpt = None,
    feature_cache: CacheOpt = None, threads: ThreadsOpt = 0,
) -> None:  # fmt: skip
    """YUKINO: train the image-to-pseudo-token inverter on your captions."""
    from training.userdata.yukino import YukinoRun, run_yukino

    set_threads(threads)
    ctx = open_context("yukino", store, model, data, labels, run_dir, resume, feature_cache, device, precision, seed)
    cfg = YukinoRun(steps=steps, batch_size=batch_size, lr=lr, text_encoder=text_encoder, stop_after=stop_after)
    finish(lambda: run_yukino(ctx, cfg, name=name, aliases=_aliases(alias)), _aliases(alias))


def comparatives_cmd(
    model: ModelOpt, data: DataOpt, labels: LabelsOpt = None, store: StoreOpt = "models", name: NameOpt = None,
    alias: AliasOpt = None, device: DeviceOpt = "cpu", precision: PrecisionOpt = "auto", seed: SeedOpt = 0,
    pairs: Annotated[int, typer.Option(help="Most-confused label pairs to write comparatives for.")] = 3,
    generator: Annotated[str, typer.Option(help="template (from label attributes) or llm.")] = "template",
    llm_base_url: Annotated[str | None, typer.Option(help="OpenAI-compatible API root, e.g. http://host/v1.")] = None,
    llm_model: Annotated[str | None, typer.Option(help="Model name the endpoint serves.")] = None,
    llm_key_env: Annotated[str, typer.Option(help="Environment variable holding the API key.")] = "OPENAI_API_KEY",
    llm_samples: Annotated[int, typer.Option(help="Answers asked per ordered pair.")] = 3,
    run_dir: RunDirOpt = None, feature_cache: CacheOpt = None, threads: ThreadsOpt = 0,
) -> None:  # fmt: skip
    """Comparatives: find the label pairs the model confuses, write texts for them into a new version."""
    from training.userdata.comparatives import ComparativesRun, run_comparatives

    set_threads(threads)
    ctx = open_context(
        "comparatives", store, model, data, labels, run_dir, True, feature_cache, device, precision, seed
    )
    cfg = ComparativesRun(pairs=pairs, generator=generator, llm_base_url=llm_base_url, llm_model=llm_model,
                          llm_key_env=llm_key_env, llm_samples=llm_samples)  # fmt: skip
    aliases = _aliases(alias)
    finish(lambda: run_comparatives(ctx, cfg, llm_cache=ctx.run_dir / "llm-cache", name=name, aliases=aliases)[0],
           aliases)  # fmt: skip


def register(app: typer.Typer) -> None:
    """Add the per-method commands to ``clip-train``."""
    commands: dict[str, Callable[..., Any]] = {
        "pcclip": pcclip_cmd,
        "dcsm": dcsm_cmd,
        "semclip": semclip_cmd,
        "yukino": yukino_cmd,
        "comparatives": comparatives_cmd,
    }
    for command, fn in commands.items():
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
        lambda: run_user_base(ModelStore(store), name, dataset, model_config, cfg, run_dir, seed=seed, device=device,
                              precision=precision, aliases=aliases, log=console.print),  # type: ignore[arg-type]
        aliases,
    )  # fmt: skip
