"""Write the committed API contract (``clients/openapi.json``) and the settings reference.

    python scripts/export_openapi.py                      # rewrite clients/openapi.json
    python scripts/export_openapi.py --check              # exit 1 if it is out of date
    python scripts/export_openapi.py --config-doc         # rewrite docs/configuration.md
    python scripts/export_openapi.py --config-doc --check

The schema comes from ``create_app(settings).openapi()`` with default settings plus one API key
(the environment is ignored, so the file does not depend on who runs this) and without the
lifespan, so no model is loaded. The same check also audits that every operation documents its error answers with the
``ErrorResponse`` envelope.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
# Importable from anywhere (``python scripts/export_openapi.py``, or loaded by path in tests):
# the repo root for ``service``, this folder for the ``config_doc`` helper beside it.
for _entry in (str(REPO), str(Path(__file__).resolve().parent)):
    if _entry not in sys.path:
        sys.path.insert(0, _entry)

from config_doc import config_doc  # noqa: E402

from service.config import Settings  # noqa: E402

OPENAPI_PATH = REPO / "clients" / "openapi.json"
CONFIG_DOC_PATH = REPO / "docs" / "configuration.md"
ENVELOPE_REF = "#/components/schemas/ErrorResponse"
# What each operation must document; any other authenticated operation needs at least 401/403.
SCORING_ERRORS = frozenset({400, 401, 403, 404, 413, 422, 429, 503})
REQUIRED_ERRORS: dict[tuple[str, str], frozenset[int]] = {
    ("get", "/models"): frozenset({401, 403, 503}),
    ("get", "/models/{name}"): frozenset({401, 403, 404, 503}),
    ("get", "/readyz"): frozenset({503}),
}


# ----------------------------------------------------------------------------- OpenAPI
def default_settings() -> Settings:
    """Settings from their defaults only: ``CLIP_*`` variables of the caller must not leak in."""

    class _Defaults(Settings):
        @classmethod
        def settings_customise_sources(  # type: ignore[override]
            cls, settings_cls: Any, init_settings: Any, **_: Any
        ) -> tuple[Any, ...]:
            return (init_settings,)

    return _Defaults()


def build_schema() -> dict[str, Any]:
    """The schema of a server with API keys (the contract covers every deployment: the bearer
    scheme is declared where a server with keys requires it; one without keys serves the same
    schema without it)."""
    from pydantic import SecretStr

    from service.app import create_app

    settings = default_settings().model_copy(update={"api_keys": [SecretStr("contract")]})
    return create_app(settings).openapi()


def render(schema: dict[str, Any]) -> str:
    return json.dumps(schema, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


def diff_summary(old: Any, new: Any, path: str = "", limit: int = 40) -> list[str]:
    """``a > b > c`` lines for what changed from ``old`` (committed) to ``new`` (the app)."""
    out: list[str] = []

    def walk(a: Any, b: Any, where: str) -> None:
        if len(out) >= limit:
            return
        if isinstance(a, dict) and isinstance(b, dict):
            for key in sorted(set(a) | set(b)):
                sub = f"{where} > {key}" if where else str(key)
                if key not in a:
                    out.append(f"+ {sub} (only in the app)")
                elif key not in b:
                    out.append(f"- {sub} (only in the committed file)")
                else:
                    walk(a[key], b[key], sub)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b, strict=True)):
                walk(x, y, f"{where} > {i}")
        elif a != b:
            out.append(f"~ {where or '(root)'}: {json.dumps(a)[:80]} -> {json.dumps(b)[:80]}")

    walk(old, new, path)
    return out[:limit]


def audit(schema: dict[str, Any]) -> tuple[list[str], list[str]]:
    """``(problems, notes)``: problems break the contract (missing or non-envelope error
    answers, an unauthenticated operation); notes are gaps worth closing but not failures."""
    from service.auth import PUBLIC_PATHS

    problems: list[str] = []
    gaps: dict[str, list[str]] = {}
    for path, item in sorted(schema.get("paths", {}).items()):
        for method, op in sorted(item.items()):
            where = f"{method.upper()} {path}"
            responses = op.get("responses", {})
            declared = {int(code) for code in responses if code.isdigit() and int(code) >= 400}
            if (method, path) in REQUIRED_ERRORS:
                required = REQUIRED_ERRORS[(method, path)]
            elif path in PUBLIC_PATHS:
                required = frozenset()
            else:
                required = SCORING_ERRORS if method == "post" else frozenset({401, 403})
            for code in sorted(required - declared):
                problems.append(f"{where}: no {code} response declared")
            for code in sorted(declared):
                content = responses[str(code)].get("content", {}).get("application/json", {})
                if content.get("schema", {}).get("$ref") != ENVELOPE_REF:
                    problems.append(f"{where}: {code} is not documented with the ErrorResponse envelope")
            if path not in PUBLIC_PATHS and not op.get("security"):
                problems.append(f"{where}: needs an API key but declares no security scheme")
            for code in (429, 503):
                if code in declared and "Retry-After" not in responses[str(code)].get("headers", {}):
                    gaps.setdefault(f"{code} answers do not document their Retry-After header", []).append(where)
            if path not in PUBLIC_PATHS and 500 not in declared:
                gaps.setdefault("500 internal_error is not declared", []).append(where)
    notes = [f"{gap}: {', '.join(ops)}" for gap, ops in gaps.items()]
    return problems, notes


# ----------------------------------------------------------------------------- main
def _write_or_check(path: Path, text: str, check: bool, summary: list[str]) -> int:
    rel = path.relative_to(REPO)
    if not check:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text, encoding="utf-8")
        print(f"wrote {rel}")
        return 0
    current = path.read_text(encoding="utf-8") if path.exists() else None
    if current == text:
        print(f"{rel} is up to date")
        return 0
    print(f"{rel} is out of date" if current is not None else f"{rel} is missing", file=sys.stderr)
    for line in summary:
        print(f"  {line}", file=sys.stderr)
    return 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--check", action="store_true", help="compare instead of writing; exit 1 on a difference")
    parser.add_argument("--config-doc", action="store_true", help="docs/configuration.md instead of the OpenAPI file")
    args = parser.parse_args(argv)
    if args.config_doc:
        return _write_or_check(
            CONFIG_DOC_PATH,
            config_doc(),
            args.check,
            ["regenerate with: python scripts/export_openapi.py --config-doc"],
        )
    schema = build_schema()
    problems, notes = audit(schema)
    for note in notes:
        print(f"note: {note}", file=sys.stderr)
    for problem in problems:
        print(f"error: {problem}", file=sys.stderr)
    summary: list[str] = []
    if args.check and OPENAPI_PATH.exists():
        try:
            summary = diff_summary(json.loads(OPENAPI_PATH.read_text(encoding="utf-8")), schema)
        except ValueError:
            summary = ["the committed file is not valid JSON"]
    summary.append("regenerate with: python scripts/export_openapi.py")
    status = _write_or_check(OPENAPI_PATH, render(schema), args.check, summary)
    return 1 if problems else status


if __name__ == "__main__":
    raise SystemExit(main())
