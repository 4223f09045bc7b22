"""Importing a user's open_clip model into the store: architecture, weights, preprocessing.

Three sources of weights, each read the way open_clip itself reads them (``load_checkpoint``: a
``state_dict`` wrapper and ``module.`` prefixes are unwrapped, pre-CustomText text keys converted):

- a state-dict file (``.pt``, ``.pth``, ``.bin``, ``.safetensors``);
- an open_clip hub-style folder (``open_clip_config.json`` with ``model_cfg`` and
  ``preprocess_cfg``, plus ``open_clip_model.safetensors`` or ``open_clip_pytorch_model.bin``);
- a pretrained tag of a named architecture, found in the local open_clip or Hugging Face caches
  only; a download happens only when asked for (``allow_download``).

The weights are re-saved as one safetensors file inside the version, so the version is
self-contained and checksummed; the manifest records the architecture, image size, the
preprocessing of the pretrained or hub config, tokenizer and context length. The store's
validator then builds the model from that manifest and runs it before anything is published.
"""

from __future__ import annotations

import difflib
import json
import os
import re
import zipfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import open_clip
import torch
from huggingface_hub import constants as hf_constants
from huggingface_hub import try_to_load_from_cache
from open_clip.constants import HF_CONFIG_NAME, HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME

from clipcore.models.clip_model import architecture_config, build_model, config_image_size
from clipcore.models.hf_tokenizer import TOKENIZER_FILES, find_tokenizer_files
from clipcore.models.preprocess import PreprocessConfig

WEIGHT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")
PREPROCESS_KEYS = ("mean", "std", "interpolation", "resize_mode")


class ModelImportError(ValueError):
    """The import cannot proceed; the message says what is wrong and what to do."""


@dataclass
class ImportPlan:
    """What will be published: the manifest's architecture, the built model, where its weights
    came from (recorded in the manifest, without local paths) and its preprocessing."""

    architecture: dict[str, Any]
    checkpoint: Path
    source: dict[str, Any]
    preprocess: PreprocessConfig = field(default_factory=PreprocessConfig)
    tokenizer_files: dict[str, Path] = field(default_factory=dict)  # a Hugging Face tokenizer's, by name


def _known_models_hint(name: str) -> str:
    close = difflib.get_close_matches(name, open_clip.list_models(), n=5)
    return (
        f" (close: {', '.join(close)})"
        if close
        else " (`python -c 'import open_clip; print(open_clip.list_models())'`)"
    )


def resolve_architecture(arch: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """``--arch``: an open_clip model name, or a config JSON (a bare model config or a hub-style
    ``{"model_cfg", "preprocess_cfg"}``). Returns the manifest architecture and any preprocessing."""
    path = Path(arch)
    if arch.endswith(".json") or path.is_file():
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            raise ModelImportError(f"cannot read the architecture config {arch}: {exc}") from None
        if not isinstance(data, dict):
            raise ModelImportError(f"{arch} must hold a JSON object (an open_clip model config)")
        config = data.get("model_cfg", data)
        for key in ("embed_dim", "vision_cfg", "text_cfg"):
            if key not in config:
                raise ModelImportError(f"{arch} is not an open_clip model config: it has no {key!r}")
        return dict(config), dict(data.get("preprocess_cfg", {}))
    if open_clip.get_model_config(arch) is None or ":" in arch:
        raise ModelImportError(f"open_clip has no model config named {arch!r}{_known_models_hint(arch)}")
    return {"open_clip_name": arch}, {}


def read_hub_folder(directory: Path) -> tuple[dict[str, Any], dict[str, Any], Path]:
    """The model config, preprocessing and weights file of an open_clip hub-style folder."""
    config_path = directory / HF_CONFIG_NAME
    if not directory.is_dir():
        raise ModelImportError(f"{directory} is not a directory")
    try:
        data = json.loads(config_path.read_text(encoding="utf-8"))
        model_cfg = data["model_cfg"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ModelImportError(f"{config_path} is not an open_clip hub config with a 'model_cfg': {exc}") from None
    for name in (HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME):
        if (directory / name).is_file():
            return dict(model_cfg), dict(data.get("preprocess_cfg", {})), directory / name
    raise ModelImportError(f"{directory} holds neither {HF_SAFE_WEIGHTS_NAME} nor {HF_WEIGHTS_NAME}")


def pretrained_candidates(cfg: dict[str, Any], cache_dir: Path | None) -> list[tuple[str, Path]]:
    """Where a pretrained tag's weights would be cached: (repo or url, local file) per candidate."""
    out: list[tuple[str, Path]] = []
    hub = str(cfg.get("hf_hub", ""))
    if hub:
        # open_clip's form: "org/repo/filename", or "org/repo/" for the default file names.
        repo_id, filename = (hub.rstrip("/"), "") if hub.endswith("/") else os.path.split(hub)
        hf_cache = Path(cache_dir) if cache_dir else Path(hf_constants.HF_HUB_CACHE)
        names = [filename] if filename else [HF_SAFE_WEIGHTS_NAME, HF_WEIGHTS_NAME]
        if filename.endswith((".bin", ".pth")):
            names.insert(0, filename[:-4] + ".safetensors")
        for name in names:
            found = try_to_load_from_cache(repo_id, name, cache_dir=hf_cache)
            folder = hf_cache / f"models--{repo_id.replace('/', '--')}"
            out.append((f"{repo_id}/{name}", Path(found) if isinstance(found, str) else folder / "snapshots" / name))
    url = str(cfg.get("url", ""))
    if url:
        clip_cache = Path(cache_dir) if cache_dir else Path("~/.cache/clip").expanduser()
        out.append((url, clip_cache / os.path.basename(url)))
    return out


def resolve_pretrained(
    arch: str, tag: str, cache_dir: Path | None, allow_download: bool
) -> tuple[Path, dict[str, Any]]:
    """The local weights file of ``arch``'s pretrained ``tag`` and the tag's config."""
    cfg = open_clip.get_pretrained_cfg(arch, tag)
    if not cfg:
        tags = open_clip.list_pretrained_tags_by_model(arch)
        raise ModelImportError(
            f"open_clip knows no pretrained tag {tag!r} for {arch}; known: {', '.join(tags) or 'none'}"
        )
    candidates = pretrained_candidates(cfg, cache_dir)
    for _, path in candidates:
        if path.is_file():
            return path, cfg
    if allow_download:
        try:
            downloaded = open_clip.download_pretrained(cfg, cache_dir=str(cache_dir) if cache_dir else None)
        except Exception as exc:  # noqa: BLE001 - urllib, requests and huggingface_hub each raise their own
            reason = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise ModelImportError(f"downloading the weights of {arch} {tag!r} failed: {reason}") from None
        if not downloaded or not Path(downloaded).is_file():
            raise ModelImportError(f"downloading the weights of {arch} {tag!r} gave no file")
        return Path(downloaded), cfg
    looked = "; ".join(f"{path.name} in {path.parent} (for {origin})" for origin, path in candidates)
    raise ModelImportError(
        f"the weights of {arch} {tag!r} are not in the local caches; looked for {looked}. "
        "Put the file there, pass it with --weights, or allow a download with --allow-download"
    )


def resolve_tokenizer(
    architecture: dict[str, Any], tokenizer_dir: Path | None, hf_dir: Path | None, cache_dir: Path | None
) -> dict[str, Path]:
    """The files of the Hugging Face tokenizer the architecture names (none for open_clip's BPE):
    from ``--tokenizer-dir``, else the hub folder, else the local Hugging Face cache."""
    name = architecture_config(architecture).get("text_cfg", {}).get("hf_tokenizer_name")
    if tokenizer_dir is not None:
        if not name:
            raise ModelImportError(
                "--tokenizer-dir: the architecture tokenizes with open_clip's BPE (its text config names no "
                "hf_tokenizer_name)"
            )
        found = find_tokenizer_files(tokenizer_dir)
        if not found:
            raise ModelImportError(
                f"{tokenizer_dir} holds no saved tokenizer (tokenizer.json or tokenizer_config.json)"
            )
        return found
    if not name:
        return {}
    looked = []
    if hf_dir is not None:
        if found := find_tokenizer_files(hf_dir):
            return found
        looked.append(str(hf_dir))
    hf_cache = Path(cache_dir) if cache_dir else Path(hf_constants.HF_HUB_CACHE)
    for marker in ("tokenizer_config.json", "tokenizer.json"):
        cached = try_to_load_from_cache(str(name), marker, cache_dir=hf_cache)
        if isinstance(cached, str) and (found := find_tokenizer_files(Path(cached).parent)):
            return found
    looked.append(str(hf_cache / f"models--{str(name).replace('/', '--')}"))
    raise ModelImportError(
        f"the architecture tokenizes with the Hugging Face tokenizer {name!r}, which is not here; looked in "
        f"{' and '.join(looked)} for {', '.join(TOKENIZER_FILES[:2])}. Pass its saved folder with --tokenizer-dir"
    )


def _preprocess(*layers: dict[str, Any]) -> PreprocessConfig:
    """The layers merged, later ones winning, and checked: a value the service could not apply
    (an unknown interpolation, two std values) is refused here, before anything is built."""
    merged: dict[str, Any] = PreprocessConfig().to_manifest()
    for layer in layers:
        merged.update({k: v for k, v in layer.items() if k in PREPROCESS_KEYS})
    try:
        return PreprocessConfig.from_manifest(merged)
    except (TypeError, ValueError) as exc:
        raise ModelImportError(f"preprocessing: {exc}") from None


def plan_import(
    arch: str | None,
    *,
    weights: Path | None = None,
    hf_dir: Path | None = None,
    pretrained: str | None = None,
    preprocess_tag: str | None = None,
    preprocess_overrides: dict[str, Any] | None = None,
    cache_dir: Path | None = None,
    allow_download: bool = False,
    tokenizer_dir: Path | None = None,
) -> ImportPlan:
    """Work out what an import publishes, before building anything."""
    if sum(x is not None for x in (weights, hf_dir, pretrained)) != 1:
        raise ModelImportError("give exactly one of --weights, --hf-dir and --pretrained")
    architecture: dict[str, Any]
    layers: list[dict[str, Any]] = []
    if hf_dir is not None:
        model_cfg, hub_preprocess, checkpoint = read_hub_folder(hf_dir)
        architecture, arch_preprocess = resolve_architecture(arch) if arch else (model_cfg, {})
        layers += [arch_preprocess, hub_preprocess]
        source: dict[str, Any] = {"kind": "hf_dir", "file": checkpoint.name}
    else:
        if arch is None:
            raise ModelImportError("--arch is required with --weights and --pretrained")
        architecture, arch_preprocess = resolve_architecture(arch)
        layers.append(arch_preprocess)
        if pretrained is not None:
            if "open_clip_name" not in architecture:
                raise ModelImportError("--pretrained needs --arch to be an open_clip model name, not a config file")
            checkpoint, tag_cfg = resolve_pretrained(arch, pretrained, cache_dir, allow_download)
            layers.append(tag_cfg)
            if tag_cfg.get("quick_gelu") and not architecture_config(architecture).get("quick_gelu"):
                architecture["quick_gelu"] = True  # OpenAI's weights were trained with QuickGELU
            source = {"kind": "pretrained", "tag": pretrained, "file": checkpoint.name}
        else:
            assert weights is not None
            if not weights.is_file():
                raise ModelImportError(f"no weights file at {weights}")
            if not weights.name.endswith(WEIGHT_SUFFIXES):
                raise ModelImportError(f"{weights.name}: weights must be one of {', '.join(WEIGHT_SUFFIXES)}")
            checkpoint = weights
            source = {"kind": "weights", "file": weights.name}
    if preprocess_tag is not None:
        name = architecture.get("open_clip_name", arch or "")
        tag_cfg = open_clip.get_pretrained_cfg(str(name), preprocess_tag)
        if not tag_cfg:
            raise ModelImportError(f"open_clip knows no pretrained tag {preprocess_tag!r} for {name!r}")
        layers.append(tag_cfg)
    layers.append(preprocess_overrides or {})
    tokenizer_files = resolve_tokenizer(architecture, tokenizer_dir, hf_dir, cache_dir)
    return ImportPlan(architecture, checkpoint, source, _preprocess(*layers), tokenizer_files)


def load_planned_model(plan: ImportPlan) -> torch.nn.Module:
    """Build the architecture (random weights, nothing downloaded) and load the checkpoint into it
    strictly, as open_clip's ``create_model(..., pretrained=file)`` would."""
    config = architecture_config(plan.architecture)
    config_image_size(config)  # a non-square size is refused before any work
    model = build_model(config)
    try:
        open_clip.load_checkpoint(model, str(plan.checkpoint), strict=True, weights_only=True)
    except OSError as exc:
        raise ModelImportError(f"cannot read weights from {plan.checkpoint.name}: {exc}") from None
    except (RuntimeError, AttributeError, KeyError, ValueError, TypeError) as exc:
        if zipfile.is_zipfile(plan.checkpoint) and _is_torchscript(plan.checkpoint):
            # OpenAI's original checkpoints are TorchScript archives: open_clip reads them this way.
            openai = open_clip.load_openai_model(str(plan.checkpoint), device="cpu")
            model.load_state_dict(openai.state_dict(), strict=True)  # type: ignore[attr-defined]
            return model.eval()
        raise ModelImportError(
            f"the weights in {plan.checkpoint.name} do not fit the architecture{_arch_name(plan.architecture)}: "
            f"{state_dict_mismatch(str(exc))}; check that --arch (or the config) is the one the checkpoint was "
            "trained with"
        ) from None
    return model.eval()


_SIZE_MISMATCH = re.compile(
    r"size mismatch for (\S+): copying a param with shape torch\.Size\((\[[^\]]*\])\) from checkpoint, "
    r"the shape in current model is torch\.Size\((\[[^\]]*\])\)"
)
_KEYS = re.compile(r"(Missing|Unexpected) key\(s\) in state_dict: (.*?)\.\s*$", re.MULTILINE)


def state_dict_mismatch(message: str) -> str:
    """torch's ``load_state_dict`` error in one line: how many tensors differ in shape, are missing or
    unexpected, with the first of each (its first line alone says only "Error(s) in loading ...:")."""
    parts = []
    sizes = _SIZE_MISMATCH.findall(message)
    if sizes:
        key, checkpoint, model = sizes[0]
        more = f" and {len(sizes) - 1} more" if len(sizes) > 1 else ""
        parts.append(f"{len(sizes)} tensor(s) differ in shape ({key}: {checkpoint} in the checkpoint, {model} in "
                     f"the architecture{more})")  # fmt: skip
    for kind, keys in _KEYS.findall(message):
        names = [k.strip().strip('"') for k in keys.split(",") if k.strip()]
        where = "missing from the checkpoint" if kind == "Missing" else "in the checkpoint but not the architecture"
        parts.append(f"{len(names)} {where} ({names[0]}{', ...' if len(names) > 1 else ''})")
    if not parts:
        lines = [line.strip() for line in message.strip().splitlines() if line.strip()]
        return " ".join(lines[:3]) or "unknown error"
    return "; ".join(parts)


def _arch_name(architecture: Any) -> str:
    """`` ViT-B-16`` for a named open_clip architecture, nothing for a config file's."""
    name = architecture.get("open_clip_name") if isinstance(architecture, dict) else None
    return f" {name}" if name else ""


def _is_torchscript(path: Path) -> bool:
    with zipfile.ZipFile(path) as archive:
        return any(name.endswith("constants.pkl") for name in archive.namelist())
