"""``clip-train import``: publish a user's open_clip model (checkpoint, hub folder or cached
pretrained tag) as a validated store version.

It lives in the training job's command line because it builds and runs the model (the store's
own ``model-store`` command stays free of model code); the work is in
``clipcore.models.importing`` and the load check in ``clipcore.models.validate``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.console import Console
from rich.markup import escape

from model_store import ModelStore, StoreError
from model_store.alias_views import print_gate
from model_store.cli_options import output_console
from model_store.digest import sha256_stream
from training.commands.configured import options_command
from training.options import StoreOpt

console = output_console(highlight=False, soft_wrap=True)


def _floats(text: str | None, option: str) -> list[float] | None:
    if text is None:
        return None
    try:
        values = [float(x) for x in text.split(",")]
    except ValueError:
        raise typer.BadParameter(f"{option} takes three comma-separated numbers, e.g. 0.5,0.5,0.5") from None
    if len(values) != 3:
        raise typer.BadParameter(f"{option} takes three comma-separated numbers, got {len(values)}")
    return values


def tokenizer_fields(files: dict[str, Path]) -> dict[str, Any]:
    """``TrainedModel`` fields that carry a Hugging Face tokenizer into the version."""
    from clipcore.models.hf_tokenizer import HF_TOKENIZER_PREFIX, TOKENIZER_DIR

    if not files:
        return {}
    return {
        "extra_files": {f"{TOKENIZER_DIR}/{name}": path.read_bytes() for name, path in files.items()},
        "tokenizer": f"{HF_TOKENIZER_PREFIX}{TOKENIZER_DIR}",
    }


def _check_store_location(store: str) -> bool:
    """A local store folder may be new, but not in a folder that does not exist either: a typo in
    ``--store`` (``/typo/path``) would otherwise create a store nobody serves and import into it."""
    if "://" in store:
        return False
    path = Path(store).expanduser()
    if path.exists():
        if not path.is_dir():
            _fail(f"--store {store}: not a folder")
        return False
    if not path.parent.is_dir():
        _fail(f"--store {store}: neither this folder nor {path.parent} exists; check the path (or CLIP_STORE), "
              "or create the folder first to start a new store there")  # fmt: skip
    return True  # a new store in an existing folder: said when the import succeeds


def _fail(message: str) -> NoReturn:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"[red]error:[/red] {escape(message)}")
    raise typer.Exit(code=1)


@dataclass
class ImportOptions:
    """``clip-train import``'s options."""

    name: Annotated[str, typer.Argument(help="Model name in the store.")]
    store: StoreOpt = "models"
    arch: Annotated[
        str | None,
        typer.Option(
            help="open_clip model name (ViT-B-32, MobileCLIP-S1, ...) or path to a model config JSON. "
            "Optional with --hf-dir (the folder's config is used)."
        ),
    ] = None  # fmt: skip
    weights: Annotated[
        Path | None, typer.Option(help="State dict: .pt, .pth, .bin or .safetensors (state_dict / module. unwrapped).")
    ] = None
    hf_dir: Annotated[
        Path | None,
        typer.Option(
            help="open_clip hub-style folder: open_clip_config.json + open_clip_model.safetensors or "
            "open_clip_pytorch_model.bin."
        ),
    ] = None  # fmt: skip
    pretrained: Annotated[
        str | None, typer.Option(help="open_clip pretrained tag, read from the local open_clip / HF caches only.")
    ] = None
    allow_download: Annotated[
        bool, typer.Option(help="With --pretrained: download the weights when no cache holds them.")
    ] = False
    cache_dir: Annotated[Path | None, typer.Option(help="Cache folder to look in instead of the defaults.")] = None
    tokenizer_dir: Annotated[
        Path | None,
        typer.Option(
            help="Saved Hugging Face tokenizer folder, for architectures whose text config names hf_tokenizer_name "
            "(default: the --hf-dir folder, then the local Hugging Face cache)."
        ),
    ] = None  # fmt: skip
    preprocess_tag: Annotated[
        str | None,
        typer.Option(
            help="Take mean, std, interpolation and resize mode from this open_clip pretrained tag's "
            "config (no download)."
        ),
    ] = None  # fmt: skip
    mean: Annotated[str | None, typer.Option(help="Pixel mean, e.g. 0.5,0.5,0.5 (overrides the config).")] = None
    std: Annotated[str | None, typer.Option(help="Pixel std, e.g. 0.5,0.5,0.5 (overrides the config).")] = None
    interpolation: Annotated[str | None, typer.Option(help="bicubic or bilinear (overrides the config).")] = None
    resize_mode: Annotated[str | None, typer.Option(help="shortest, longest or squash (overrides).")] = None
    fp16: Annotated[bool, typer.Option(help="Store the weights as float16 (half the size).")] = False
    alias: Annotated[
        list[str] | None,
        typer.Option(help="Aliases to point at the new version, through the evaluation gate (none by default)."),
    ] = None
    version: Annotated[str | None, typer.Option(help="Version name (default: the next vN).")] = None
    notes: Annotated[str, typer.Option(help="Free text stored in the manifest.")] = ""


def import_model(o: ImportOptions) -> None:
    """Import an open_clip model into the store: weights copied into a new version as safetensors,
    a manifest written from the open_clip and pretrained configs, the model built from that manifest
    and run on one image and two texts before anything is published."""
    import torch

    from clipcore.models.importing import ModelImportError, load_planned_model, plan_import
    from clipcore.models.publish import TrainedModel, publish_bundle
    from clipcore.models.validate import validate_version

    new_store = _check_store_location(o.store)
    overrides: dict[str, Any] = {}
    for key, value in (("mean", _floats(o.mean, "--mean")), ("std", _floats(o.std, "--std")),
                       ("interpolation", o.interpolation), ("resize_mode", o.resize_mode)):  # fmt: skip
        if value is not None:
            overrides[key] = value
    try:
        plan = plan_import(
            o.arch, weights=o.weights, hf_dir=o.hf_dir, pretrained=o.pretrained, preprocess_tag=o.preprocess_tag,
            preprocess_overrides=overrides, cache_dir=o.cache_dir, allow_download=o.allow_download,
            tokenizer_dir=o.tokenizer_dir,
        )  # fmt: skip
        model = load_planned_model(plan)
        with plan.checkpoint.open("rb") as checkpoint:
            source = {**plan.source, "sha256": sha256_stream(checkpoint)[0]}
        with torch.no_grad():
            trained = TrainedModel(
                model,  # type: ignore[arg-type]
                plan.architecture,
                fp16=o.fp16,
                preprocess=plan.preprocess,
                training={"imported_from": source},
                notes=o.notes,
                **tokenizer_fields(plan.tokenizer_files),
            )
            manifest = publish_bundle(
                ModelStore(o.store, validator=validate_version), o.name, trained, aliases=o.alias or (),
                version=o.version, on_gate=lambda report: print_gate(console, report),
            )  # fmt: skip
    except (ModelImportError, StoreError) as exc:
        _fail(str(exc))
    aliases = f" ({', '.join(o.alias)} -> {manifest.version})" if o.alias else " (no alias: promote it when ready)"
    console.print(
        f"[green]imported[/green] {manifest.ref}{aliases}: {manifest.image_size} px, embed_dim {manifest.embed_dim}, "
        f"{manifest.total_bytes:,} bytes"
    )
    if new_store:
        console.print(f"(a new model store at {Path(o.store).expanduser().resolve()}: serve it with --store)")


import_cmd = options_command(ImportOptions, import_model)
