"""``python -m service`` / ``clip-service``: run the HTTP service under uvicorn.

Flags mirror the ``CLIP_*`` environment settings and win over them; everything else (limits,
batching, API keys, ...) is set through the environment (see ``service.config``).
"""

from __future__ import annotations

import argparse
import logging
import signal
import sys
from collections.abc import Sequence
from typing import Any

from pydantic import ValidationError

from model_store.version import package_version


def parse_args(argv: Sequence[str] | None) -> dict[str, Any]:
    parser = argparse.ArgumentParser(prog="clip-service", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=package_version(), help="print the version and exit")
    parser.add_argument("--host", help="bind address (CLIP_HOST, default 127.0.0.1)")
    parser.add_argument("--port", type=int, help="port (CLIP_PORT, default 8000)")
    parser.add_argument("--store", help="model store: a directory or s3://bucket/prefix (CLIP_STORE, default ./models)")
    parser.add_argument(
        "--model",
        help="model refs to serve, comma-separated (name, name@alias, name@version); the first answers requests "
        "that name none (CLIP_MODEL, default default@production)",
    )
    parser.add_argument("--redis-url", help="redis://host:port/db for the shared cache (CLIP_REDIS_URL)")
    parser.add_argument("--device", help="cpu, cuda, cuda:N or auto (CLIP_DEVICE, default cpu)")
    parser.add_argument(
        "--log-level", choices=["debug", "info", "warning", "error", "critical"], help="CLIP_LOG_LEVEL, default info"
    )
    args = vars(parser.parse_args(argv))
    return {key: value for key, value in args.items() if value is not None}


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> None:
    from service import http_server
    from service.app import create_app
    from service.config import Settings

    overrides = parse_args(argv)
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        print(f"invalid settings:\n{exc}", file=sys.stderr)
        raise SystemExit(2) from None
    logging.basicConfig(level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s %(message)s")
    # uvicorn drains in-flight requests on SIGTERM, then re-raises the signal with the handler
    # that was installed before it started: make that one a clean exit (code 0).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    http_server.run(
        create_app(settings),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        access_log=False,  # the service logs one structured line per request itself
        timeout_graceful_shutdown=settings.graceful_shutdown_s,
        max_header_bytes=settings.max_header_bytes,
        header_timeout_s=settings.header_timeout_s,
        body_idle_timeout_s=settings.body_idle_timeout_s,
        body_timeout_s=settings.body_timeout_s,
        keep_alive_s=settings.keep_alive_s,
    )


if __name__ == "__main__":
    main()
