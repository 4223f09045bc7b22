"""``python -m service`` / ``clip-service``: run the HTTP service under uvicorn.

Every setting of ``service.config.Settings`` is a flag (``service.cli``) and a ``CLIP_*``
environment variable; flags win over variables, variables over defaults.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
from collections.abc import Sequence

from pydantic import ValidationError

from service.cli import describe_errors, parse_args, unknown_variables
from service.config import Settings
from service.logs import install_logging

__all__ = ["main", "parse_args"]

logger = logging.getLogger("service")


def leave_out_gpu_compiler(device: str) -> None:
    """On the CPU, keep ``triton`` out of the process: torch's CUDA wheels install it, and importing
    open_clip (torchvision, then ``torch._dynamo``) imports it whenever it is installed, mapping its
    70 MiB library into every CPU server. It only compiles GPU kernels; on the CPU nothing the
    service runs uses it. A ``None`` entry in ``sys.modules`` makes ``import triton`` raise
    ImportError and ``importlib.util.find_spec("triton")`` return None: torch then behaves as
    without triton installed. A process that already imported it keeps it."""
    if device == "cpu":
        sys.modules.setdefault("triton", None)  # type: ignore[arg-type]


def _exit_cleanly(signum: int, frame: object) -> None:
    raise SystemExit(0)


def main(argv: Sequence[str] | None = None) -> None:
    overrides = parse_args(argv)  # --help, --version and malformed flags end here, before the app is imported
    warnings = unknown_variables(os.environ)
    try:
        settings = Settings(**overrides)
    except ValidationError as exc:
        # A misspelt variable inside a group is refused here: its hint belongs beside the error.
        hints = "".join(f"\nwarning: {warning}" for warning in warnings)
        print(f"invalid settings:\n{describe_errors(exc)}{hints}", file=sys.stderr)
        raise SystemExit(2) from None
    install_logging(settings.log_level)
    for warning in warnings:
        logger.warning(warning)

    leave_out_gpu_compiler(settings.device)
    from service import http_server

    # A port in use is said before the seconds of importing torch and open_clip, as bad settings are.
    http_server.check_can_listen(settings.host, settings.port)
    from service.split.supervisor import workers_for

    workers = workers_for(settings)
    if workers > 1:  # an engine process and front-end processes (service.split)
        from service.split import supervisor

        raise SystemExit(supervisor.run(settings, list(argv) if argv is not None else sys.argv[1:], workers))
    # The application imports torch and open_clip (seconds): only once the settings are known to be good.
    from service.app import create_app

    # uvicorn drains in-flight requests on SIGTERM, then re-raises the signal with the handler
    # that was installed before it started: make that one a clean exit (code 0).
    signal.signal(signal.SIGTERM, _exit_cleanly)
    http_server.run_served(create_app(settings), settings, host=settings.host, port=settings.port)


if __name__ == "__main__":
    main()
