"""A user's dataset loaded whole, validated before any training, and split by content.

``load_dataset(path)`` reads every record (``source.read_source``), checks each image exists and
decodes, checks labels against the declared label set, and returns the items with every problem
found (file and line each). Training commands call ``require_valid`` and stop on any problem.

The label set is declared in ``labels.json`` beside the data (or given explicitly): a list of label
names, or an object mapping each label to its attributes (``{"coat": {"sleeves": "long"}}``),
which generated difference texts and comparatives read. Without a declaration, the labels seen are
the label set and nothing is unknown.

Splits are decided by the sha256 of each record's image content (the first image of a pair), so
the same picture always lands in the same split, whatever file, order or name it has: train,
validation and test never share an image. A training file with a held-out file beside it
(``test.jsonl`` next to ``train.jsonl``, as ``data import-folder`` writes it from a ``test/`` tree
and ``data fashion-mnist`` from the official test set) has its test part elsewhere: the records
whose content would fall in the test split are trained on instead of left unused.
"""

from __future__ import annotations

import hashlib
import json
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from training.datasets.records import LabelRecord, Record
from training.datasets.source import Item, Place, Problem, decode_problem, read_source

Split = Literal["train", "val", "test"]
LABELS_FILE = "labels.json"
TEST_FILE = "test.jsonl"
DEFAULT_FRACTIONS: dict[Split, float] = {"train": 0.8, "val": 0.1, "test": 0.1}


class InvalidDataset(Exception):
    """Raised by ``require_valid``: the message lists every problem (file and line)."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = list(problems)
        listed = "\n".join(f"  {p}" for p in self.problems[:200])
        more = f"\n  ... and {len(self.problems) - 200} more" if len(self.problems) > 200 else ""
        super().__init__(f"{len(self.problems)} problem(s) in the dataset:\n{listed}{more}")


@dataclass
class Dataset:
    items: list[Item]
    labels: dict[str, dict[str, str]]  # label -> attributes
    problems: list[Problem] = field(default_factory=list)
    test_file: Path | None = None  # the held-out file beside this one: no test part of its own
    _splits: dict[str, Split] = field(default_factory=dict, repr=False)  # place -> split, computed once

    def of_kind(self, kind: str) -> list[Item]:
        return [item for item in self.items if item.record.kind == kind]

    def counts(self) -> dict[str, int]:
        return dict(Counter(item.record.kind for item in self.items))

    def split(self, name: Split) -> list[Item]:
        """The items of one split (default fractions 0.8 / 0.1 / 0.1; 0.9 / 0.1 / none with a
        ``test_file`` beside: its test part is that file)."""
        for item in self.items:
            if str(item.place) not in self._splits:
                own = split_of(item)
                self._splits[str(item.place)] = "train" if own == "test" and self.test_file is not None else own
        return [item for item in self.items if self._splits[str(item.place)] == name]


def read_labels(path: Path) -> dict[str, dict[str, str]] | Problem:
    """A ``labels.json``: a list of names, or names mapped to attribute objects."""
    place = Place(str(path), 1)
    try:
        obj = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        return Problem(place, f"cannot read the label set: {exc}")
    if isinstance(obj, list) and all(isinstance(x, str) and x.strip() for x in obj):
        return {x.strip(): {} for x in obj}
    if isinstance(obj, dict) and all(
        isinstance(v, dict) and all(isinstance(a, str) and isinstance(b, str) for a, b in v.items())
        for v in obj.values()
    ):
        return {str(k).strip(): dict(v) for k, v in obj.items()}
    return Problem(place, "the label set must be a list of names or an object of name -> {attribute: value}")


def _declared_labels(path: Path, labels: Path | None) -> tuple[dict[str, dict[str, str]] | None, list[Problem]]:
    candidate = labels or ((path if path.is_dir() else path.parent) / LABELS_FILE)
    if labels is None and not candidate.exists():
        return None, []
    declared = read_labels(candidate)
    return (None, [declared]) if isinstance(declared, Problem) else (declared, [])


def load_dataset(path: Path, labels: Path | None = None, check_images: bool = True) -> Dataset:
    """Every record under ``path`` with every problem found: parse errors, missing or undecodable
    images, labels outside the declared set (``labels`` or ``labels.json`` beside the data)."""
    declared, problems = _declared_labels(path, labels)
    items: list[Item] = []
    checked: dict[str, str | None] = {}
    for entry in read_source(path):
        if isinstance(entry, Problem):
            problems.append(entry)
            continue
        broken = False
        if check_images:
            for ref in entry.images:
                key = str(ref.path) if ref.path is not None else f"{entry.place}:{ref.name}"
                if key not in checked:
                    checked[key] = decode_problem(ref)
                if checked[key] is not None:
                    problems.append(Problem(entry.place, checked[key]))  # type: ignore[arg-type]
                    broken = True
        record = entry.record
        if declared is not None and isinstance(record, LabelRecord) and record.label not in declared:
            near = ", ".join(sorted(declared)[:8])
            problems.append(Problem(entry.place, f"unknown label {record.label!r} (the label set has: {near}...)"))
            broken = True
        if not broken:
            items.append(entry)
    label_set = declared if declared is not None else _seen_labels(items)
    return Dataset(items=items, labels=label_set, problems=problems, test_file=separate_test_file(path))


def separate_test_file(path: Path) -> Path | None:
    """The held-out file beside a training file (``test.jsonl`` next to ``train.jsonl``); None when
    there is none, or ``path`` is that file or a folder."""
    if not path.is_file() or path.name == TEST_FILE:
        return None
    beside = path.parent / TEST_FILE
    return beside if beside.is_file() else None


def _seen_labels(items: Iterable[Item]) -> dict[str, dict[str, str]]:
    out: dict[str, dict[str, str]] = {}
    for item in items:
        if isinstance(item.record, LabelRecord):
            out.setdefault(item.record.label, dict(item.record.attributes))
    return dict(sorted(out.items()))


def require_valid(dataset: Dataset) -> Dataset:
    if dataset.problems:
        raise InvalidDataset(dataset.problems)
    if not dataset.items:
        raise InvalidDataset([Problem(Place("dataset", 0), "no records")])
    return dataset


def content_digest(item: Item) -> str:
    return hashlib.sha256(item.images[0].read()).hexdigest()


def split_of(item: Item, fractions: dict[Split, float] | None = None) -> Split:
    """The split of ``item``, from its first image's content hash (deterministic, order-free)."""
    return split_of_digest(content_digest(item), fractions)


def split_of_digest(digest: str, fractions: dict[Split, float] | None = None) -> Split:
    """The split of an image whose content has the sha256 hex ``digest``."""
    fractions = fractions or DEFAULT_FRACTIONS
    u = int(digest[:15], 16) / 16**15  # uniform in [0, 1)
    edge = 0.0
    for name in ("train", "val", "test"):
        edge += fractions.get(name, 0.0)  # type: ignore[call-overload]
        if u < edge:
            return name  # type: ignore[return-value]
    return "test"


def records(items: Iterable[Item]) -> list[Record]:
    return [item.record for item in items]
