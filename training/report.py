"""Markdown tables of evaluation results (printed by the CLI, pasted into docs)."""

from __future__ import annotations

from collections.abc import Callable, Mapping

from training.evaluation.userdata.figures import mean_and_stderr, summary_lines

DATA_PREFIX = "data."  # figures of a user's dataset: data.<dataset>.<figure>
GAIN_COLUMN = "dcsm - cosine"  # the dense table's column of DCSM's paired gain over cosine


def _cell(metrics: Mapping[str, float], key: str) -> str:
    if key not in metrics:
        return "-"
    err = metrics.get(f"{key}.stderr")
    return mean_and_stderr(metrics[key], err) if err is not None else f"{metrics[key]:.3f}"


def metrics_table(metrics: Mapping[str, float], encoders: list[str]) -> str:
    """One row per metric, one column per text encoder; encoder-free keys in their own rows."""
    rows: dict[str, None] = {}
    plain: list[str] = []
    for key in metrics:
        if key.endswith(".stderr"):
            continue
        head, _, rest = key.partition(".")
        if head in encoders:
            rows.setdefault(rest)
        else:
            plain.append(key)
    lines = ["| metric | " + " | ".join(encoders) + " |", "|---|" + "---|" * len(encoders)]
    for rest in rows:
        lines.append(f"| {rest} | " + " | ".join(_cell(metrics, f"{e}.{rest}") for e in encoders) + " |")
    for key in plain:
        lines.append(f"| {key} | {_cell(metrics, key)} |" + " |" * (len(encoders) - 1))
    return "\n".join(lines)


def retrieval_table(metrics: Mapping[str, float]) -> str:
    """Recall@k of each kind of query: the first stage (or baseline), the second stage, what the second
    adds on the same queries (paired per seed) and chance; empty without retrieval figures."""
    lines = ["| queries | recall | cosine / sum baseline | DCSM re-rank / PC-CLIP | change | chance |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    for kind, (first, second) in (("compositional", ("cosine", "dcsm")), ("negated", ("cosine", "dcsm")),
                                  ("difference", ("sum", "pcclip"))):  # fmt: skip
        for at in ("r1", "r10"):
            if f"retrieval.{kind}.{first}.{at}" not in metrics:
                continue
            cells = [_cell(metrics, f"retrieval.{kind}.{ranking}.{at}") for ranking in (first, second)]
            gain = f"gain.retrieval.{kind}.{second}.{at}"
            change = "-" if gain not in metrics else ("+" if metrics[gain] >= 0 else "") + _cell(metrics, gain)
            # Chance is a property of the gallery and the queries: no standard error worth printing.
            level = metrics.get(f"retrieval.{kind}.chance.{at}")
            chance = "-" if level is None else f"{level:.3f}" if level >= 0.01 else f"{level:.2g}"
            lines.append(f"| {kind} | recall@{at[1:]} | {cells[0]} | {cells[1]} | {change} | {chance} |")
    return "\n".join(lines) if len(lines) > 2 else ""


def sweep_table(sweep: list[Mapping[str, object]]) -> str:
    lines = ["| alpha | symmetric | gate | confused (test) | overall (test) |", "|---|---|---|---|---|"]
    for r in sweep:
        lines.append(f"| {r['alpha']} | {r['symmetric']} | {r['gate']} | {r['confused']:.3f} | {r['overall']:.3f} |")
    return "\n".join(lines)


def print_report(report: dict, print_: Callable[..., None]) -> None:
    """The evaluation report as markdown through ``print_`` (a rich console's ``print``: it takes
    ``markup=False``): the metric tables, the comparative sweep, text geometry; then the table of
    each dataset of the user's own it was evaluated on (``clip-train evaluate --data``)."""
    if "seeds" in report:  # the built-in world's evaluation
        _print_world(report, print_)
    for name in report.get("datasets", {}):
        for line in summary_lines(report, name):
            print_(line, markup=False)


def _print_world(report: dict, print_: Callable[..., None]) -> None:
    metrics = {k: v for k, v in report["metrics"].items() if not k.startswith(DATA_PREFIX)}
    encoders = sorted({k.split(".")[0] for k in metrics if ".zeroshot." in k}, key=lambda e: (e != "base", e))
    print_(f"\n## Evaluation of {report['model']} (mean ± stderr over seeds {report['seeds']})\n")
    matching = {k: v for k, v in metrics.items() if k.split(".")[1] in ("winoground", "swap")}
    print_(
        metrics_table(
            {k: v for k, v in metrics.items() if k.split(".")[0] in encoders and k not in matching}, encoders
        ),
        markup=False,
    )
    if matching:
        print_("\n### Compositional caption matching: 2x2 (Winoground-style) and swap tests\n")
        print_(metrics_table(matching, ["base", "oti", "yukino"]), markup=False)
    dense = {k: v for k, v in metrics.items() if k.split(".")[0] in ("cosine", "dcsm", "readout", "dense")}
    if dense:
        # What DCSM adds over cosine on the same negatives: its column, from the paired gains.
        gains = {GAIN_COLUMN + k[len("gain.dcsm") :]: v for k, v in metrics.items() if k.startswith("gain.dcsm.")}
        print_("\n### Dense scoring (2-way: caption vs its hard negative) and localisation\n")
        print_(metrics_table({**dense, **gains}, ["cosine", "dcsm"] + ([GAIN_COLUMN] if gains else [])), markup=False)
    retrieval = retrieval_table(metrics)
    if retrieval:
        print_("\n### Retrieval over a gallery (recall@k; docs/evaluation.md)\n")
        print_(retrieval, markup=False)
    details = report.get("details", {})
    first = details.get(str(report["seeds"][0]), {})
    for enc in encoders:
        comp = first.get(f"{enc}.comparative")
        if comp:
            print_(f"\n### Comparative prompting sweep, {enc} (seed {report['seeds'][0]}; pairs {comp['pairs']})\n")
            print_(sweep_table(comp["sweep"]), markup=False)
        geo = first.get(f"{enc}.text_geometry")
        if geo:
            print_(f"\ntext geometry ({enc}): " + ", ".join(f"{k} {v:.3f}" for k, v in geo.items()), markup=False)
