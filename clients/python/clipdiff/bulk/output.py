"""The Parquet output of a bulk run, written so that a killed run resumes where it stopped.

While a run goes, each row group is written to its own file in ``OUT.parquet.parts/``
(``part-000000.parquet``, ...): written under a temporary name and renamed when complete, so
a part on disk is always whole, and the parts hold consecutive rows in input order. A run that
finds that folder resumes after its last complete part (every row exactly once); at the end the
parts become the row groups of ``OUT.parquet`` (written under a temporary name, renamed) and the
folder is removed. The folder also keeps the run's settings (``run.json``): a resume with other
settings is refused rather than mixing two runs in one file.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

__all__ = ["OutputExists", "PartedOutput"]

SETTINGS_KEY = b"clipdiff.bulk"


class OutputExists(ValueError):
    """The output (or its parts) belongs to a run with other settings."""


class PartedOutput:
    def __init__(self, path: str | Path, schema: pa.Schema, settings: dict[str, Any]) -> None:
        self.path = Path(path)
        self.parts = self.path.with_name(self.path.name + ".parts")
        self.settings = settings
        self.schema = schema.with_metadata({SETTINGS_KEY: json.dumps(settings, sort_keys=True).encode()})
        self._next = 0

    def _part(self, number: int) -> Path:
        return self.parts / f"part-{number:06d}.parquet"

    def finished_rows(self) -> int | None:
        """Rows of a finished output with these settings, None when there is none.

        Raises:
            OutputExists: the output was written with other settings.
        """
        if self.parts.exists() or not self.path.exists():
            return None
        meta = pq.read_schema(self.path).metadata or {}
        if json.loads(meta.get(SETTINGS_KEY, b"null")) != self.settings:
            raise OutputExists(f"{self.path} exists and was written by another run (use overwrite to replace it)")
        return int(pq.read_metadata(self.path).num_rows)

    def resume(self, overwrite: bool = False) -> int:
        """Prepare the parts folder; return the rows its complete parts already hold.

        Raises:
            OutputExists: the parts belong to a run with other settings and ``overwrite`` is False.
        """
        run_file = self.parts / "run.json"
        if overwrite:
            shutil.rmtree(self.parts, ignore_errors=True)
            self.path.unlink(missing_ok=True)
        if self.parts.exists() and run_file.exists():
            if json.loads(run_file.read_text()) != self.settings:
                raise OutputExists(
                    f"{self.parts} holds a stopped run with other settings (use overwrite to start again)"
                )
        else:
            self.parts.mkdir(parents=True, exist_ok=True)
            run_file.write_text(json.dumps(self.settings, sort_keys=True))
        for stale in self.parts.glob("*.tmp"):  # a part being written when the run was killed
            stale.unlink()
        done = sorted(self.parts.glob("part-*.parquet"))
        self._next = len(done)
        return sum(int(pq.read_metadata(p).num_rows) for p in done)

    def write(self, rows: list[dict[str, Any]]) -> None:
        """Write ``rows`` (in input order, after the rows already written) as the next part."""
        table = pa.Table.from_pylist(rows, schema=self.schema)
        final = self._part(self._next)
        temporary = final.with_name(final.name + ".tmp")
        pq.write_table(table, temporary)
        os.replace(temporary, final)
        self._next += 1

    def finish(self) -> int:
        """Join the parts into the output file, one row group each; return its rows."""
        temporary = self.path.with_name(self.path.name + ".tmp")
        rows = 0
        with pq.ParquetWriter(temporary, self.schema) as writer:
            for part in sorted(self.parts.glob("part-*.parquet")):
                table = pq.read_table(part, schema=self.schema)
                writer.write_table(table, row_group_size=max(1, table.num_rows))
                rows += table.num_rows
        os.replace(temporary, self.path)
        shutil.rmtree(self.parts)
        return rows
