"""The settings reference (``docs/configuration.md``), generated from the code that reads them.

Rows come from ``service.config.Settings`` (types, defaults, bounds, nested groups) and the flag
table from the parser of ``python -m service`` itself, so the page cannot drift from the code;
``scripts/export_openapi.py --config-doc`` writes it and the contract tests compare it.
"""

from __future__ import annotations

import argparse
import json
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from service.config import Settings

# Used only where a field has no ``Field(description=...)`` of its own; a setting with neither
# makes the generator fail, so a new setting cannot ship undocumented.
FALLBACK_DESCRIPTIONS: dict[str, str] = {
    "host": "Bind address of the HTTP server.",
    "port": "TCP port of the HTTP server.",
    "store": "Model-store location: a directory (relative paths are taken from the working directory) or "
    "`s3://bucket/prefix` on S3-compatible object storage, reached with the standard AWS environment or profile "
    "(`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_PROFILE`, credentials; see docs/operations.md). Other schemes are "
    "refused. The `model-store` and `clip-train` command lines read the same variable (`MODEL_STORE` is a "
    "deprecated alias there).",
    "device": "Torch device; `auto` picks CUDA when available.",
    "redis_url": "`redis://[user:password@]host:port/db` of the shared embedding cache. Optional: "
    "without it (or while it is down) only the in-process LRU is used. Redacted in logs.",
    "cache_ttl_s": "Lifetime of an embedding in Redis, in seconds (7 days).",
    "lru_items": "Embeddings kept in the in-process LRU cache (0 disables it).",
    "redis_timeout_s": "Timeout of one Redis call; a slow Redis counts as a miss.",
    "redis_retry_after_s": "After a Redis failure, how long the cache skips Redis before probing it again.",
    "limits.max_body_bytes": "Largest request body (20 MiB).",
    "limits.max_images": "Images per request (`images`), for /classify, /rank and /embed.",
    "limits.max_labels": "Labels per /classify request.",
    "limits.max_texts": "Texts per /embed request.",
    "limits.max_text_chars": "Characters per text (label, template, description, difference, comparative).",
    "limits.max_pixels": "Pixels per image, checked from the image header before decoding.",
    "limits.max_image_bytes": "Encoded bytes per image (10 MiB).",
    "limits.max_pairs": "Pairs per /rank-pair request.",
    "limits.max_prompts_per_label": "Templates per request and descriptions per label.",
    "limits.max_comparatives": "Comparatives per /classify request.",
    "batching.max_batch_images": "Largest image batch handed to the model.",
    "batching.max_batch_texts": "Largest text batch handed to the model.",
    "batching.max_wait_ms": "How long a batch waits to fill before it runs (0: run as soon as the model is free).",
    "batching.max_queue": "Items a batcher queues; beyond it requests answer 429 with `Retry-After`.",
    "batching.request_timeout_s": "Budget of one request in the batchers; beyond it 504 `timeout`.",
    "batching.decode_workers": "Threads that decode and preprocess images.",
    "allow_url_images": 'Accept `{"url": ...}` images (fetched with an SSRF guard).',
    "url_allowlist": "Hosts (exact names or IP literals) that may be fetched even when they resolve "
    "to private, loopback or link-local addresses; every other host must resolve to public addresses.",
    "url_timeout_s": "Total time allowed to fetch one image URL (redirects included).",
    "api_keys": "Accepted API keys (`Authorization: Bearer <key>`); empty with no `api_keys_file`: "
    "no authentication. Redacted in logs.",
    "api_keys_file": "File with one API key per line (`#` comments allowed), re-read when it changes.",
    "watch_interval_s": "How often the model alias is checked for a new version.",
    "drain_timeout_s": "How long a swapped-out version may keep finishing requests.",
    "graceful_shutdown_s": "How long SIGTERM waits for in-flight requests.",
    "warmup": "Run a warm-up batch before a loaded version serves (and before /readyz says ready).",
    "log_level": "Log level (case-insensitive).",
    "cors_origins": "Origins allowed by CORS; empty: no CORS headers at all.",
}
_SCALARS = {str: "string", int: "integer", float: "number", bool: "boolean", Path: "path", SecretStr: "secret string"}


def describe_type(annotation: Any) -> str:
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if origin is typing.Literal:
        return "one of " + ", ".join(f"`{a}`" for a in args)
    if origin is list:
        return f"JSON list of {describe_type(args[0])}s"
    if args and type(None) in args:
        rest = [a for a in args if a is not type(None)]
        return describe_type(rest[0]) + ", optional" if len(rest) == 1 else " or ".join(map(describe_type, rest))
    return _SCALARS.get(annotation, getattr(annotation, "__name__", str(annotation)))


def describe_default(field: FieldInfo) -> str:
    value = field.get_default(call_default_factory=True)
    if value is None:
        return "unset"
    if isinstance(value, bool):
        return f"`{str(value).lower()}`"
    if isinstance(value, int) and value >= 1024 * 1024 and value % (1024 * 1024) == 0:
        return f"`{value}` ({value // (1024 * 1024)} MiB)"
    if isinstance(value, list):
        return "`[]`" if not value else f"`{json.dumps(value)}`"
    return f"`{value}`"


def describe_constraints(field: FieldInfo) -> str:
    signs = {"gt": ">", "ge": ">=", "lt": "<", "le": "<="}
    return ", ".join(
        f"{sign} {getattr(m, key)}" for m in field.metadata for key, sign in signs.items() if hasattr(m, key)
    )


def settings_rows() -> list[tuple[str, str, str, str, str, str]]:
    """``(key, env var, type, default, constraints, description)`` for every setting, nested included."""
    rows: list[tuple[str, str, str, str, str, str]] = []

    def add(fields: dict[str, FieldInfo], prefix: str, env: str) -> None:
        for name, field in fields.items():
            key, var = f"{prefix}{name}", f"{env}{name.upper()}"
            ann = field.annotation
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                add(ann.model_fields, f"{key}.", f"{var}__")
                continue
            text = field.description or FALLBACK_DESCRIPTIONS.get(key)
            if not text:
                raise ValueError(f"setting {key!r} has no description: add Field(description=...) to it")
            rows.append((key, var, describe_type(ann), describe_default(field), describe_constraints(field), text))

    add(Settings.model_fields, "", Settings.model_config.get("env_prefix", ""))
    return rows


def cli_flags() -> list[tuple[str, str]]:
    """``(flag, help)`` of ``python -m service``, read from its own parser."""
    import service.__main__ as cli

    class _Captured(Exception):
        pass

    captured: list[argparse.ArgumentParser] = []
    original = argparse.ArgumentParser.parse_args

    def capture(self: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> Any:
        captured.append(self)
        raise _Captured

    argparse.ArgumentParser.parse_args = capture  # type: ignore[method-assign,assignment]
    try:
        cli.parse_args([])
    except _Captured:
        pass
    finally:
        argparse.ArgumentParser.parse_args = original  # type: ignore[method-assign]
    flags = []
    for action in captured[0]._actions:
        if not action.option_strings or action.dest == "help":
            continue
        if action.nargs == 0:  # a flag without a value (--version)
            flag = action.option_strings[-1]
        else:
            flag = action.option_strings[-1] + (
                " {" + ",".join(map(str, action.choices)) + "}" if action.choices else f" {action.dest.upper()}"
            )
        flags.append((flag, action.help or ""))
    return flags


def config_doc() -> str:
    groups = {
        name: f.annotation
        for name, f in Settings.model_fields.items()
        if isinstance(f.annotation, type) and issubclass(f.annotation, BaseModel)
    }
    lines = [
        "# Configuration",
        "",
        "<!-- Generated by `python scripts/export_openapi.py --config-doc` from `service/config.py` and",
        "     `service/__main__.py`; edit those, not this file (a test checks it is current). -->",
        "",
        "The service is configured by environment variables, read once at startup. Every setting",
        "below is an environment variable with the prefix `CLIP_`; settings of a group are joined",
        "with a double underscore (`CLIP_LIMITS__MAX_IMAGES=16`), and a whole group can also be given",
        'as JSON (`CLIP_LIMITS=\'{"max_images": 16}\'`). Lists are JSON (`CLIP_API_KEYS=\'["k1","k2"]\'`),',
        "booleans are `true`/`false`. Invalid values stop the server at startup with a message naming",
        "the setting. Secrets (`api_keys`, the password in `redis_url`) are redacted in the startup log.",
        "",
        "| Environment variable | Type | Default | Allowed | Description |",
        "| --- | --- | --- | --- | --- |",
    ]
    for _, var, kind, default, allowed, text in settings_rows():
        lines.append(f"| `{var}` | {kind} | {default} | {allowed} | {text} |")
    lines += ["", "## Groups", ""]
    for name, model in groups.items():
        doc = " ".join((model.__doc__ or "").split()).replace("``", "`")
        lines.append(f"- `CLIP_{name.upper()}__*`: {doc}")
    lines += [
        "",
        "## Command line",
        "",
        "`python -m service` (also installed as `clip-service`) starts the server under uvicorn.",
        "Flags mirror the environment settings of the same name and win over them; every other",
        "setting comes from the environment. Run from the repository root with no flags, it serves",
        "the committed default model (`default@production` from `./models`).",
        "",
        "| Flag | Meaning |",
        "| --- | --- |",
    ]
    lines += [f"| `{flag}` | {text} |" for flag, text in cli_flags()]
    lines += [
        "",
        "Example:",
        "",
        "```bash",
        "CLIP_LIMITS__MAX_IMAGES=16 CLIP_API_KEYS_FILE=/etc/clip/keys \\",
        "  python -m service --host 0.0.0.0 --port 8000 --store models --model default@production",
        "```",
        "",
    ]
    return "\n".join(lines)
