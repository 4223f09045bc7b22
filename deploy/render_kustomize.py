"""Render a kustomization without kustomize: the subset this repository's k8s/ files use.

Supported: ``resources`` (files and kustomization directories), ``namespace``, ``labels``
(``includeSelectors: false``), ``images`` (newName / newTag / digest) and ``patches``
(strategic-merge documents from ``path`` or inline ``patch``, optional ``target`` by kind and
name; ``$patch: delete`` for whole objects and for named list elements). Anything else is
rejected loudly, so a kustomization that grows past this subset fails validation here instead
of rendering something different from ``kubectl kustomize``.
deploy/validate.sh compares the two outputs whenever kustomize is installed.

    python deploy/render_kustomize.py k8s/overlays/cpu [-o rendered.yaml]
"""

from __future__ import annotations

import argparse
import copy
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

Resource = dict[str, Any]

KUSTOMIZATION_FILES = ("kustomization.yaml", "kustomization.yml", "Kustomization")
SUPPORTED_KEYS = {"apiVersion", "kind", "resources", "namespace", "labels", "images", "patches"}
CLUSTER_SCOPED = {
    "Namespace", "ClusterRole", "ClusterRoleBinding", "CustomResourceDefinition", "PersistentVolume",
    "StorageClass", "PriorityClass", "IngressClass", "RuntimeClass", "CSIDriver", "APIService",
    "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration", "Node", "VolumeAttachment",
}  # fmt: skip
# kustomize's "legacy" output order: these kinds first, in this order; the rest by kind, then name.
ORDER_FIRST = [
    "Namespace", "ResourceQuota", "StorageClass", "CustomResourceDefinition", "ServiceAccount",
    "PodSecurityPolicy", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding", "ConfigMap",
    "Secret", "Endpoints", "Service", "LimitRange", "PriorityClass", "PersistentVolume",
    "PersistentVolumeClaim", "Deployment", "StatefulSet", "CronJob", "PodDisruptionBudget",
]  # fmt: skip
ORDER_LAST = ["MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"]
# Where `labels: includeTemplates: true` also writes, per kind.
TEMPLATE_LABEL_PATHS: dict[str, list[tuple[str, ...]]] = {
    **{k: [("spec", "template", "metadata", "labels")]
       for k in ("Deployment", "ReplicaSet", "DaemonSet", "StatefulSet", "Job", "ReplicationController")},
    "CronJob": [("spec", "jobTemplate", "metadata", "labels"),
                ("spec", "jobTemplate", "spec", "template", "metadata", "labels")],
}  # fmt: skip
CONTAINER_LISTS = ("containers", "initContainers", "ephemeralContainers")


class KustomizeError(ValueError):
    """The kustomization uses something this renderer does not implement, or is invalid."""


def _load_docs(path: Path) -> list[Resource]:
    with path.open(encoding="utf-8") as fh:
        docs = [d for d in yaml.safe_load_all(fh) if d is not None]
    for doc in docs:
        if not isinstance(doc, dict) or "kind" not in doc or "metadata" not in doc:
            raise KustomizeError(f"{path}: every document must be a Kubernetes object")
    return docs


def _kustomization_file(directory: Path) -> Path:
    for name in KUSTOMIZATION_FILES:
        if (directory / name).is_file():
            return directory / name
    raise KustomizeError(f"{directory}: no kustomization file")


def render(directory: str | Path) -> list[Resource]:
    """All objects of the kustomization in ``directory``, transformed and in kustomize order."""
    return sorted(_build(Path(directory).resolve(), stack=()), key=_order_key)


def _build(directory: Path, stack: tuple[Path, ...]) -> list[Resource]:
    if directory in stack:
        raise KustomizeError(f"cycle through {directory}")
    kfile = _kustomization_file(directory)
    spec = yaml.safe_load(kfile.read_text(encoding="utf-8")) or {}
    unknown = set(spec) - SUPPORTED_KEYS
    if unknown:
        raise KustomizeError(f"{kfile}: unsupported fields {sorted(unknown)}")
    resources: list[Resource] = []
    for entry in spec.get("resources", []):
        target = (directory / entry).resolve()
        if target.is_dir():
            resources.extend(_build(target, (*stack, directory)))
        elif target.is_file():
            resources.extend(_load_docs(target))
        else:
            raise KustomizeError(f"{kfile}: resource {entry!r} not found")
    _check_unique(resources, kfile)
    for patch in spec.get("patches", []):
        _apply_patch(resources, patch, directory, kfile)
    if "namespace" in spec:
        for res in resources:
            if res["kind"] == "Namespace":
                res["metadata"]["name"] = spec["namespace"]
            elif res["kind"] not in CLUSTER_SCOPED:
                res["metadata"]["namespace"] = spec["namespace"]
    for label_set in spec.get("labels", []):
        _apply_labels(resources, label_set, kfile)
    for image in spec.get("images", []):
        for res in resources:
            for container in _containers(res):
                container["image"] = _retag(container.get("image", ""), image)
    return resources


def _check_unique(resources: list[Resource], kfile: Path) -> None:
    seen: set[tuple[str, str, str]] = set()
    for res in resources:
        key = (res["kind"], res["metadata"].get("namespace", ""), res["metadata"]["name"])
        if key in seen:
            raise KustomizeError(f"{kfile}: duplicate resource {key}")
        seen.add(key)


def _apply_labels(resources: list[Resource], label_set: dict[str, Any], kfile: Path) -> None:
    if label_set.get("includeSelectors", False):
        raise KustomizeError(f"{kfile}: labels with includeSelectors: true are not supported")
    pairs = {str(k): str(v) for k, v in (label_set.get("pairs") or {}).items()}
    for res in resources:
        res["metadata"].setdefault("labels", {}).update(pairs)
        if label_set.get("includeTemplates", False):
            for path in TEMPLATE_LABEL_PATHS.get(res["kind"], []):
                _ensure_dict(res, path).update(pairs)


def _ensure_dict(obj: dict[str, Any], path: tuple[str, ...]) -> dict[str, Any]:
    for key in path:
        if obj.get(key) is None:
            obj[key] = {}
        obj = obj[key]
    return obj


def _containers(obj: Any) -> Iterator[dict[str, Any]]:
    """Every container object, wherever a pod spec sits (Deployment, Job, CronJob, ...)."""
    if isinstance(obj, dict):
        for key, value in obj.items():
            if key in CONTAINER_LISTS and isinstance(value, list):
                yield from (c for c in value if isinstance(c, dict))
            else:
                yield from _containers(value)
    elif isinstance(obj, list):
        for item in obj:
            yield from _containers(item)


def _split_image(image: str) -> tuple[str, str]:
    """``repo[:tag][@digest]`` -> (repo, suffix); a port in the registry host is not a tag."""
    if "@" in image:
        name, digest = image.split("@", 1)
        return name, "@" + digest
    slash, colon = image.rfind("/"), image.rfind(":")
    if colon > slash:
        return image[:colon], image[colon:]
    return image, ""


def _retag(image: str, rule: dict[str, Any]) -> str:
    name, suffix = _split_image(image)
    if name != rule.get("name"):
        return image
    name = rule.get("newName", name)
    if "digest" in rule:
        suffix = "@" + str(rule["digest"])
    elif "newTag" in rule:
        suffix = ":" + str(rule["newTag"])
    return name + suffix


def _apply_patch(resources: list[Resource], entry: dict[str, Any], directory: Path, kfile: Path) -> None:
    if set(entry) - {"path", "patch", "target"}:
        raise KustomizeError(f"{kfile}: unsupported patch options {sorted(set(entry) - {'path', 'patch', 'target'})}")
    if "path" in entry:
        docs = _load_docs(directory / entry["path"])
    else:
        docs = [d for d in yaml.safe_load_all(entry.get("patch", "")) if d is not None]
    if len(docs) != 1 or not isinstance(docs[0], dict):
        raise KustomizeError(f"{kfile}: a patch must be one strategic-merge document (no JSON6902)")
    patch = docs[0]
    target = entry.get("target") or {"kind": patch.get("kind"), "name": patch.get("metadata", {}).get("name")}
    if set(target) - {"kind", "name", "namespace"}:
        raise KustomizeError(f"{kfile}: patch targets may only select by kind, name and namespace")
    matches = [r for r in resources if all(_field(r, k) == v for k, v in target.items())]
    if not matches:
        raise KustomizeError(f"{kfile}: patch target {target} matches no resource")
    if patch.get("$patch") == "delete":  # the whole object goes (an overlay dropping a base resource)
        resources[:] = [r for r in resources if not any(r is m for m in matches)]
        return
    for res in matches:
        merged = strategic_merge(res, {k: v for k, v in patch.items() if k not in ("apiVersion", "kind", "metadata")})
        merged["metadata"] = strategic_merge(
            res["metadata"], {k: v for k, v in patch.get("metadata", {}).items() if k not in ("name", "namespace")}
        )
        res.clear()
        res.update(merged)


def _field(res: Resource, key: str) -> Any:
    return res.get("kind") if key == "kind" else res["metadata"].get(key)


def strategic_merge(base: Any, patch: Any) -> Any:
    """Strategic merge as kustomize applies it to the fields we patch.

    Maps merge key by key (a null value deletes the key); lists of objects that all carry a
    ``name`` (containers, volumes, env) merge element-wise by name, and an element carrying
    ``$patch: delete`` removes its namesake; any other list is replaced. A patch document
    with ``$patch: delete`` removes the object (see ``_apply_patch``).
    """
    if isinstance(patch, dict) and isinstance(base, dict):
        if any(str(k).startswith("$") for k in patch):
            raise KustomizeError(f"strategic-merge directives are not supported: {sorted(patch)}")
        out = copy.deepcopy(base)
        for key, value in patch.items():
            if value is None:
                out.pop(key, None)
            else:
                out[key] = strategic_merge(base.get(key), value)
        return out
    if isinstance(patch, list) and isinstance(base, list) and _named(base) and _named(patch):
        # As kustomize orders them: elements new to the list first (in patch order), then the
        # base's, merged in place; an element with ``$patch: delete`` removes its namesake.
        merged = copy.deepcopy(base)
        added: list[Any] = []
        for item in patch:
            names = [kept["name"] for kept in merged]
            if item.get("$patch") == "delete":
                if set(item) - {"name", "mountPath", "$patch"}:
                    raise KustomizeError(f"a deleted list element names only its keys: {sorted(item)}")
                merged = [kept for kept in merged if kept["name"] != item["name"]]
            elif item["name"] in names:
                position = names.index(item["name"])
                merged[position] = strategic_merge(merged[position], item)
            else:
                added.append(copy.deepcopy(item))
        return added + merged
    return copy.deepcopy(patch)


def _named(items: list[Any]) -> bool:
    return bool(items) and all(isinstance(i, dict) and "name" in i for i in items)


def _order_key(res: Resource) -> tuple[int, str, str, str]:
    kind = res["kind"]
    if kind in ORDER_FIRST:
        rank = ORDER_FIRST.index(kind)
    elif kind in ORDER_LAST:
        rank = len(ORDER_FIRST) + 1 + ORDER_LAST.index(kind)
    else:
        rank = len(ORDER_FIRST)
    return rank, kind, res["metadata"].get("namespace", ""), res["metadata"]["name"]


def dump(resources: list[Resource]) -> str:
    return yaml.safe_dump_all(resources, sort_keys=True, default_flow_style=False, width=1_000_000)


def differences(mine: list[Resource], reference: list[Resource]) -> list[str]:
    """Objects that differ between two renderings (order of documents included)."""

    def key(r: Resource) -> str:
        return f"{r['kind']}/{r['metadata'].get('namespace', '')}/{r['metadata']['name']}"

    problems = [f"only in reference: {k}" for k in sorted({key(r) for r in reference} - {key(r) for r in mine})]
    problems += [f"only here: {k}" for k in sorted({key(r) for r in mine} - {key(r) for r in reference})]
    by_key = {key(r): r for r in reference}
    problems += [f"differs: {key(r)}" for r in mine if key(r) in by_key and by_key[key(r)] != r]
    if not problems and [key(r) for r in mine] != [key(r) for r in reference]:
        problems.append("same objects, different order")
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", type=Path, help="directory holding a kustomization.yaml")
    parser.add_argument("-o", "--output", type=Path, help="write here instead of stdout")
    parser.add_argument(
        "--compare",
        type=Path,
        metavar="RENDERED",
        help="compare with kustomize's output in RENDERED instead of printing",
    )
    args = parser.parse_args(argv)
    try:
        resources = render(args.directory)
        if args.compare:
            reference = [d for d in yaml.safe_load_all(args.compare.read_text(encoding="utf-8")) if d]
            problems = differences(resources, reference)
            for line in problems:
                print(f"render_kustomize: {args.directory}: {line}", file=sys.stderr)
            return 1 if problems else 0
        text = dump(resources)
    except (KustomizeError, OSError, yaml.YAMLError) as exc:
        print(f"render_kustomize: {exc}", file=sys.stderr)
        return 1
    if args.output:
        args.output.write_text(text, encoding="utf-8")
    else:
        sys.stdout.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
