"""A folder of class folders (torchvision's ImageFolder layout) to label records, as
``clip-train data import-folder`` writes them (docs/data.md).

Two layouts are read:

    ROOT/<class>/<image>                      one tree; the test part is held out by content
    ROOT/train/<class>/<image>                a training and a test tree
    ROOT/test/<class>/<image>

Images may sit deeper inside a class folder (``ROOT/<class>/a/b.jpg``); files that are not
images (``.txt``, ``.DS_Store``, ...) and hidden files and folders are skipped. A class's label is
its folder name with underscores read as spaces (``ankle_boot`` -> ``ankle boot``), as a caption
says it ("a photo of a ankle boot."). With ``--split-from TEST_ROOT`` the test part is that tree
instead. Without a test tree, the images whose content hash falls in the dataset's own test split
(10 %, ``dataset.split_of``) go to ``test.jsonl`` and the others to ``train.jsonl``, so inside
``train.jsonl`` the split by content gives train and validation records and no training command
ever reads a test image.

The output is the format the Fashion-MNIST converter writes:

    OUT/labels.json           the label set (with the attributes of ``--attributes``, if given)
    OUT/train.jsonl           {"image": "images/train/<class>/<file>", "label": ..., "attributes"?: ...}
    OUT/test.jsonl            the same for the test part, which no training command reads
    OUT/images/{train,test}/<class>/...   the images, copied byte for byte (or, with
                              ``copy=False``, not copied: the records name the originals)

Everything is checked before anything is written: an empty folder, a single class, a class
folder without images, an image that does not decode (named with its path), layouts mixed in one
root, test classes the training tree lacks, labels the attribute file does not name. Every
problem is listed at once (``FolderProblems``).
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from training.datasets.dataset import read_labels, split_of_digest
from training.datasets.source import IMAGE_EXTENSIONS, ImageRef, Problem, decode_problem

# What ImageFolder reads that the records' readers decode too.
FOLDER_EXTENSIONS = frozenset((*IMAGE_EXTENSIONS, "tif", "tiff"))
SPLIT_NAMES = ("train", "test")
# Folder names that mean a split, not a class: met beside train/ and test/, they are a layout error.
_OTHER_SPLITS = frozenset(("val", "valid", "validation", "dev", "eval"))


class FolderProblems(Exception):
    """Every reason the folder cannot be imported, one per line."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        shown = "\n".join(f"  {p}" for p in problems[:50])
        more = f"\n  ... and {len(problems) - 50} more" if len(problems) > 50 else ""
        super().__init__(f"{len(problems)} problem(s), nothing written:\n{shown}{more}")


@dataclass
class Tree:
    """One tree of class folders: label -> its images (sorted), and the folder each label came from."""

    root: Path
    images: dict[str, list[Path]] = field(default_factory=dict)
    folders: dict[str, str] = field(default_factory=dict)
    skipped: int = 0  # files that are not images


@dataclass(frozen=True)
class ImportResult:
    train: int
    test: int
    labels: list[str]
    test_from: str  # "test/", "--split-from DIR" or "held out by content"
    skipped: int


def label_of(folder: str) -> str:
    """The label a class folder stands for: underscores read as spaces, spaces collapsed."""
    return re.sub(r"\s+", " ", folder.replace("_", " ")).strip()


def _visible(path: Path) -> bool:
    return not path.name.startswith(".")


def _is_image(path: Path) -> bool:
    return path.suffix.lower().lstrip(".") in FOLDER_EXTENSIONS


def _subfolders(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_dir() and _visible(p))


def _loose_images(root: Path) -> list[Path]:
    return sorted(p for p in root.iterdir() if p.is_file() and _visible(p) and _is_image(p))


def read_tree(root: Path, problems: list[str]) -> Tree:
    """The class folders directly under ``root`` and the images under each (at any depth)."""
    tree = Tree(root)
    if not root.is_dir():
        problems.append(f"{root}: no such folder")
        return tree
    loose = _loose_images(root)
    classes = _subfolders(root)
    if loose and classes:
        problems.append(
            f"{root}: mixed layouts: {len(loose)} image(s) directly in the folder (e.g. {loose[0].name}) beside "
            f"class folders ({', '.join(p.name for p in classes[:5])}); put every image in its class folder"
        )
    elif loose:
        problems.append(
            f"{root}: {len(loose)} image(s) but no class folders: the layout is {root}/<class>/<image>, "
            "one folder per class"
        )
    elif not classes:
        problems.append(f"{root}: empty: no class folders ({root}/<class>/<image>)")
    for folder in classes:
        label = label_of(folder.name)
        if not label:
            problems.append(f"{folder}: a class folder needs a name with letters or digits")
            continue
        if label in tree.folders:
            problems.append(f"{folder}: the same label {label!r} as {root / tree.folders[label]}")
            continue
        found: list[Path] = []
        for dirpath, dirnames, filenames in os.walk(folder, followlinks=True):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
            for name in sorted(filenames):
                path = Path(dirpath) / name
                if not _visible(path):
                    continue
                if _is_image(path):
                    found.append(path)
                else:
                    tree.skipped += 1
        if not found:
            problems.append(f"{folder}: class {label!r} has no images ({', '.join(sorted(FOLDER_EXTENSIONS))})")
            continue
        tree.images[label] = found
        tree.folders[label] = folder.name
    return tree


def _split_layout(root: Path, problems: list[str]) -> bool:
    """Whether ``root`` holds ``train/`` (and ``test/``) trees rather than class folders."""
    if not root.is_dir():
        return False
    names = {p.name for p in _subfolders(root)}
    if "train" not in names:
        if "test" in names:
            problems.append(f"{root}: a test/ folder but no train/ folder beside it")
        return False
    others = sorted(names - set(SPLIT_NAMES))
    if others:
        split_like = [n for n in others if n.lower() in _OTHER_SPLITS]
        hint = (
            f"; {', '.join(split_like)}/ is neither: move its class folders into train/ (the validation part is "
            "chosen there by content) or give it to --split-from"
            if split_like
            else ""
        )
        problems.append(
            f"{root}: mixed layouts: train/ beside other folders ({', '.join(others[:5])}); the layout is "
            f"either {root}/<class>/<image> or {root}/train/<class>/<image> with {root}/test/<class>/<image>{hint}"
        )
    loose = _loose_images(root)
    if loose:
        problems.append(f"{root}: images beside train/ (e.g. {loose[0].name}): put them in train/<class>/")
    return True


def _undecodable(trees: list[Tree], problems: list[str]) -> None:
    for tree in trees:
        for paths in tree.images.values():
            for path in paths:
                why = decode_problem(ImageRef(str(path), path=path))
                if why is not None:
                    problems.append(f"{path}: {why.replace(repr(str(path)) + ' ', '')}")


def _label_set(
    attributes: Path | None, labels: list[str], folders: dict[str, str], problems: list[str]
) -> dict[str, dict[str, str]]:
    """label -> attributes; from the attribute file when given (keys: a label or its folder's name)."""
    if attributes is None:
        return {label: {} for label in labels}
    declared = read_labels(attributes)
    if isinstance(declared, Problem):
        problems.append(f"{attributes}: {declared.message}")
        return {label: {} for label in labels}
    by_label = {label_of(key): value for key, value in declared.items()}
    out: dict[str, dict[str, str]] = {}
    for label in labels:
        if label in by_label:
            out[label] = by_label[label]
        else:
            problems.append(f"{attributes}: no entry for class {label!r} (folder {folders[label]}/)")
    extra = sorted(set(by_label) - set(labels))
    if extra:
        problems.append(f"{attributes}: names {', '.join(map(repr, extra))}, which no class folder holds")
    return out


def import_folder(
    root: Path, out: Path, split_from: Path | None = None, attributes: Path | None = None, copy: bool = True
) -> ImportResult:
    """Check the folder whole, then write ``labels.json``, ``train.jsonl``, ``test.jsonl`` (and the
    images) under ``out``. Raises ``FolderProblems`` listing every problem, with nothing written."""
    problems: list[str] = []
    root, out = root.resolve(), out.resolve()
    if out == root or root in out.parents:
        problems.append(f"{out}: the output folder must not be inside {root} (it would be read as a class)")
    split = _split_layout(root, problems)
    if split and split_from is not None:
        problems.append(f"{root} has its own train/ and test/ folders: drop --split-from {split_from}")
    train = read_tree(root / "train" if split else root, problems)
    test: Tree | None = None
    if split and (root / "test").is_dir():
        test, test_from = read_tree(root / "test", problems), "test/"
    elif split_from is not None:
        test, test_from = read_tree(split_from.resolve(), problems), f"--split-from {split_from}"
    else:
        test_from = "held out by content (10 %)"
    if len(train.images) == 1:
        only = next(iter(train.images))
        problems.append(
            f"{train.root}: only one class ({only!r}): zero-shot classification and difference texts need two or more"
        )
    if test is not None:
        unknown = sorted(set(test.images) - set(train.images))
        if unknown:
            problems.append(f"{test.root}: class(es) {', '.join(map(repr, unknown))} that {train.root} does not have")
    labels = sorted(train.images)
    label_set = _label_set(attributes, labels, train.folders, problems)
    _undecodable([train] + ([test] if test is not None else []), problems)
    if problems:
        raise FolderProblems(problems)

    records: dict[str, list[dict[str, object]]] = {"train": [], "test": []}
    for part, tree in (("train", train), ("test", test)):
        if tree is None:
            continue
        for label, paths in tree.images.items():
            for path in paths:
                if part == "train" and test is None:
                    held_out = split_of_digest(hashlib.sha256(path.read_bytes()).hexdigest()) == "test"
                    target_part = "test" if held_out else "train"
                else:
                    target_part = part
                image = _place(path, tree.root, out, target_part, copy)
                record: dict[str, object] = {"image": image, "label": label}
                if label_set[label]:
                    record["attributes"] = label_set[label]
                records[target_part].append(record)
    out.mkdir(parents=True, exist_ok=True)
    has_attributes = any(label_set.values())
    (out / "labels.json").write_text(json.dumps(label_set if has_attributes else labels, indent=2) + "\n")
    for part, rows in records.items():
        (out / f"{part}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    skipped = train.skipped + (test.skipped if test is not None else 0)
    return ImportResult(len(records["train"]), len(records["test"]), labels, test_from, skipped)


def _place(path: Path, tree_root: Path, out: Path, part: str, copy: bool) -> str:
    """The record's image path: the copy under ``out/images/<part>/`` (relative), or the original."""
    if not copy:
        return str(path)
    relative = path.relative_to(tree_root)
    target = out / "images" / part / relative
    target.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(path, target)
    return (Path("images") / part / relative).as_posix()
