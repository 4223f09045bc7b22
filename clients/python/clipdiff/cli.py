"""The ``clipdiff`` command line: ``clipdiff bulk classify|rank-pairs|score-dense|embed``.

Exit status: 0 when the output is complete (rows that failed are in it, with their error),
2 for unusable arguments or an output of another run, 1 when the service stopped the run
(run the same command again to resume).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["main"]

HELP = {
    "embed": "image embeddings (per row: image)",
    "classify": "zero-shot classification over --labels (per row: image)",
    "rank-pairs": "PC-CLIP pair ranking (per row: image_a, image_b, difference or --difference)",
    "score-dense": "DCSM dense scores (per row: image, texts / text / caption, plus every --text)",
}


def _shard(value: str) -> tuple[int, int]:
    try:
        index, count = (int(x) for x in value.split("/"))
    except ValueError:
        raise argparse.ArgumentTypeError(f"--shard {value!r}: write it as INDEX/COUNT, e.g. 0/4") from None
    if count < 1 or not 0 <= index < count:
        raise argparse.ArgumentTypeError(f"--shard {value!r}: the index must be in 0..COUNT-1")
    return index, count


def _labels(values: list[str]) -> tuple[str, ...]:
    # "--labels a,b --labels c" and "--labels a --labels b" both work.
    return tuple(label.strip() for value in values for label in value.split(",") if label.strip())


def parser() -> argparse.ArgumentParser:
    top = argparse.ArgumentParser(prog="clipdiff", description="Client of the CLIP difference & composition service.")
    commands = top.add_subparsers(dest="command", required=True)
    bulk = commands.add_parser("bulk", help="score a whole dataset into a Parquet file, resumably")
    tasks = bulk.add_subparsers(dest="task", required=True)
    for name, text in HELP.items():
        p = tasks.add_parser(name, help=text, description=text)
        p.add_argument("--input", required=True, help="a folder of images, .jsonl, .parquet, or WebDataset .tar shards")
        p.add_argument("--output", required=True, help="the Parquet file to write (a stopped run resumes)")
        p.add_argument("--format", choices=["folder", "jsonl", "parquet", "webdataset"], help="the input's format")
        p.add_argument("--url", help="the service (default $CLIP_SERVICE_URL, else http://127.0.0.1:8000)")
        p.add_argument("--api-key", help="default $CLIP_SERVICE_API_KEY")
        p.add_argument("--api-key-file", type=Path, help="a file holding the key (a mounted Secret); unused if absent")
        p.add_argument("--model", help="the served model to ask (name, name@alias or name@version)")
        p.add_argument("--concurrency", type=int, help="requests in flight (default 4, capped by the server's limit)")
        p.add_argument("--batch-size", type=int, help="rows per request (default: the server's limit)")
        p.add_argument("--row-group-rows", type=int, default=1024, help="rows per row group (the resume unit)")
        p.add_argument("--shard", type=_shard, help="INDEX/COUNT: score only block INDEX of COUNT of the rows")
        p.add_argument("--overwrite", action="store_true", help="start again instead of resuming")
        p.add_argument("--retries", type=int, default=8, help="retries per request on 429 / 503 / no connection")
        p.add_argument("--progress", choices=["auto", "bar", "plain", "none"], default="auto")
        p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between plain progress lines")
        if name == "classify":
            p.add_argument("--labels", action="append", required=True, help="comma-separated labels")
            p.add_argument("--comparative", action="store_true", help="comparative prompting")
            p.add_argument("--top-k", type=int, help="labels per row in top_k_labels")
        if name in ("classify", "rank-pairs"):
            p.add_argument("--encoder", help="a text-encoder variant, e.g. semclip")
        if name == "rank-pairs":
            p.add_argument("--difference", help="the difference text of rows that have none")
        if name == "score-dense":
            p.add_argument("--text", action="append", default=[], help="a text scored on every row (repeatable)")
    return top


def main(argv: Sequence[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        from clipdiff.bulk import BulkOptions, run
        from clipdiff.bulk.output import OutputExists
        from clipdiff.bulk.runner import print_summary
    except ImportError as exc:
        print(f"clipdiff bulk needs the bulk extra (pip install 'clipdiff-client[bulk]'): {exc}", file=sys.stderr)
        return 2
    from clipdiff.errors import ClipServiceError

    api_key = args.api_key
    if api_key is None and args.api_key_file is not None and args.api_key_file.is_file():
        api_key = args.api_key_file.read_text().strip() or None

    options = BulkOptions(
        labels=_labels(getattr(args, "labels", None) or []),
        texts=tuple(getattr(args, "text", None) or ()),
        difference=getattr(args, "difference", None),
        comparative=getattr(args, "comparative", False),
        top_k=getattr(args, "top_k", None),
        encoder=getattr(args, "encoder", None),
        model=args.model,
    )
    try:
        summary = run(
            args.task,
            args.input,
            args.output,
            options=options,
            base_url=args.url,
            api_key=api_key,
            input_format=args.format,
            concurrency=args.concurrency,
            batch_size=args.batch_size,
            row_group_rows=args.row_group_rows,
            shard=args.shard,
            overwrite=args.overwrite,
            max_retries=args.retries,
            progress=args.progress,
            progress_interval=args.progress_interval,
        )
    except (OSError, ValueError, OutputExists) as exc:
        print(f"clipdiff bulk {args.task}: {exc}", file=sys.stderr)
        return 2
    except ClipServiceError as exc:
        print(f"clipdiff bulk {args.task}: stopped by the service: {exc}; run the same command again to resume",
              file=sys.stderr)  # fmt: skip
        return 1
    print_summary(summary)
    return 0


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
