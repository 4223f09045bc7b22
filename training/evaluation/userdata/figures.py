"""What each figure of a user-data evaluation is called in prose, what a model that ignores its input
would score (chance), and which component of the version it needs.

Keys are those of eval.json without their ``data.<dataset>.`` prefix (``rank_pair.label.pcclip``);
the printed table, report.html and docs/tutorial.md use the same names, with the key beside each so
that a row can be found in eval.json.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

BASE = "base"
GAIN_PREFIX = "gain."  # eval.json keys of what a component adds (``gains_per_seed`` in run.py writes them)

KIND_ORDER = ("all", "label", "attribute", "records", "negation", "swap", "relation", "user")
PAIR_TEXTS = {"label": "label difference texts", "attribute": "attribute difference texts",
              "records": "your pair records"}  # fmt: skip
NEGATIVE_KINDS = {
    "all": "caption over a hard negative (all kinds)",
    "negation": "caption over its negation",
    "label": "caption over another label's caption",
    "swap": "caption over its attributes swapped",
    "relation": "caption over its relation flipped",
    "user": "caption over your own negatives",
}
NEGATION_BASE = "hard_negatives.cosine.negation"
WINOGROUND = {"text": 0.25, "image": 0.25, "group": 1 / 6}  # random scores: P(both orders right), Winoground's


@dataclass(frozen=True)
class Figure:
    """One figure: its family (a table section and a report plot), a short label within the family,
    its full prose name, its chance level (None where there is none) and the component it needs."""

    key: str
    family: str
    short: str
    name: str
    chance: float | None = None
    needs: str | None = None  # a text encoder ("text_encoder:pcclip"), "dcsm", "yukino" or "comparatives"
    rank: int = 0  # the row's place within its family (ties keep the evaluation's order)
    # What a component's figure replaces: the key of the same measurement on the same inputs without
    # the component (DCSM's hard negatives -> cosine's), and that in words ("cosine"); None for a
    # figure no component provides. ``component_gain`` reads the difference (run.py records it per seed).
    replaces: str | None = None
    versus: str = ""
    # Where chance depends on the sample (retrieval: how many gallery items satisfy each query), the
    # key of eval.json that holds it, measured with the figure.
    chance_key: str | None = None


FAMILIES = (
    "zero-shot",
    "pair ranking",
    "hard negatives",
    "caption over its negation, by text encoder",
    "negation both ways, by phrasing (docs/negation.md)",
    "paraphrase, by phrasing (docs/negation.md)",
    "2x2 items (Winoground-style)",
    "retrieval over a gallery (collections search)",
)
RETRIEVAL_FAMILY = FAMILIES[-1]
RETRIEVAL_QUERIES = {
    "compositional": "compositional text queries",
    "negated": "negated text queries",
    "difference": '"like this one, but ..." queries',
}
RETRIEVAL_RANKINGS = {
    "cosine": ("cosine", None, ""),
    "dcsm": ("cosine top 100 re-ranked by DCSM", "cosine", "cosine"),
    "sum": ("normalize(g(q) + f(text)) . g(c)", None, ""),
    "pcclip": ("PC-CLIP, normalize(g(c) - g(q)) . f(text)", "sum", "sum baseline"),
}
NEGATION_SIDES = {
    "present": "object in the photo: caption over its negation",
    "absent": "object not in the photo: negation over the caption",
    "both": "both sides",
    "worst": "the worst held-out phrasing, both sides",
}
_NEGATION_GROUP_RANK = {"heldout": 0, "training": 1, "family": 2}
_SIDE_RANK = {"both": 0, "worst": 1, "present": 2, "absent": 3}


def _kind_rank(kind: str) -> int:
    return KIND_ORDER.index(kind) if kind in KIND_ORDER else len(KIND_ORDER)


def _encoder(enc: str) -> str | None:
    return None if enc == BASE else f"text_encoder:{enc}"


def _base_encoder(enc: str, base_key: str) -> tuple[str | None, str]:
    """(replaces, versus) of a figure read with text encoder ``enc``: the base encoder's figure."""
    return (None, "") if enc == BASE else (base_key, "base encoder")


def _standard_prompts(comparative: bool, figure: str) -> dict[str, Any]:
    return {"replaces": f"zeroshot.{figure}", "versus": "standard prompts"} if comparative else {}


def describe(key: str, zeroshot: Mapping[str, Any] | None = None) -> Figure:
    """The figure of ``key`` (relative to ``data.<dataset>.``); ``zeroshot`` is the dataset's
    ``details.zeroshot`` (its labels, encoder and the classes the comparatives name). Keys this
    module does not know keep their key as their name."""
    zs = zeroshot or {}
    parts = key.split(".")
    n_labels = len(zs.get("labels", []))
    chance_zs = 1 / n_labels if n_labels else None
    if parts[0] in ("zeroshot", "zeroshot_comparative") and len(parts) == 2:
        enc = " (default text encoder)"
        comparative = parts[0] == "zeroshot_comparative"
        with_cmp = ", with comparative prompting" if comparative else ""
        needs = "comparatives" if comparative else None
        if parts[1] == "acc":
            classes = f"{n_labels} classes" if n_labels else "all classes"
            name = f"zero-shot accuracy, {classes}{enc}{with_cmp}"
            short = "all classes" + (", comparatives" if comparative else "")
            return Figure(key, "zero-shot", short, name, chance_zs, needs, **_standard_prompts(comparative, parts[1]))
        if parts[1] == "confused_acc":
            targeted = list(zs.get("comparative_classes", []))
            named = f"the {len(targeted)} confused classes: {', '.join(targeted)}" if targeted else "confused classes"
            name = f"zero-shot on {named}{enc}{with_cmp}"
            short = "confused classes" + (", comparatives" if comparative else "")
            return Figure(key, "zero-shot", short, name, chance_zs, "comparatives",
                          **_standard_prompts(comparative, parts[1]))  # fmt: skip
    if parts[0] == "rank_pair" and len(parts) == 3:
        kind, enc = parts[1], parts[2]
        texts = PAIR_TEXTS.get(kind, f"{kind} texts")
        return Figure(key, "pair ranking", f"{kind} texts, {enc}", f"pair ranking, {texts}, text encoder {enc}", 0.5,
                      _encoder(enc), _kind_rank(kind), *_base_encoder(enc, f"rank_pair.{kind}.{BASE}"))  # fmt: skip
    if parts[0] == "hard_negatives" and len(parts) == 3:
        scorer, kind = parts[1], parts[2]
        what = NEGATIVE_KINDS.get(kind, f"caption over a hard negative ({kind})")
        how = "DCSM" if scorer == "dcsm" else f"{scorer}, text encoder {BASE}"
        dcsm = scorer == "dcsm"
        return Figure(key, "hard negatives", f"{kind}, {'DCSM' if dcsm else scorer}", f"{what}, {how}", 0.5,
                      "dcsm" if dcsm else None, _kind_rank(kind),
                      f"hard_negatives.cosine.{kind}" if dcsm else None, "cosine" if dcsm else "")  # fmt: skip
    if (parts[0] == "negation" and len(parts) == 2) or parts[:2] == ["semclip", "orig_over_neg"] and len(parts) == 3:
        enc = parts[-1]  # semclip.orig_over_neg.<encoder>: the same figure in eval.json files written before
        # The base encoder's figure is the hard negatives' negation kind (the same captions and negations).
        return Figure(key, "caption over its negation, by text encoder", enc,
                      f"caption over its negation, cosine, text encoder {enc}", 0.5, _encoder(enc), 0,
                      *_base_encoder(enc, NEGATION_BASE))  # fmt: skip
    if parts[0] == "negation_forms" and len(parts) in (4, 5):
        return _negation_form_figure(key, parts[1], parts[2:])
    if parts[0] == "paraphrase_forms" and len(parts) in (3, 4):
        return _paraphrase_form_figure(key, parts[1], parts[2:])
    if parts[0] == "winoground" and len(parts) == 3:
        score, method = parts[1], parts[2]
        how = "YUKINO" if method == "yukino" else method
        yukino = method == "yukino"
        return Figure(key, "2x2 items (Winoground-style)", f"{score}, {how}", f"2x2 items, {score} score, {how}",
                      WINOGROUND.get(score), "yukino" if yukino else None, 0,
                      f"winoground.{score}.cosine" if yukino else None, "cosine" if yukino else "")  # fmt: skip
    if parts[0] == "retrieval" and len(parts) == 4 and parts[2] in RETRIEVAL_RANKINGS:
        return _retrieval_figure(key, parts[1], parts[2], parts[3])
    return Figure(key, "other", key, key)


def _retrieval_figure(key: str, kind: str, ranking: str, at: str) -> Figure:
    """``retrieval.<kind>.<ranking>.r<k>``: recall@k over a gallery (``training.evaluation.methods.retrieval``)."""
    how, replaced, versus = RETRIEVAL_RANKINGS[ranking]
    queries = RETRIEVAL_QUERIES.get(kind, f"{kind} queries")
    recall = f"recall@{at[1:]}"
    rank = list(RETRIEVAL_QUERIES).index(kind) * 10 if kind in RETRIEVAL_QUERIES else 30
    rank += (0 if at == "r1" else 4) + (0 if replaced is None else 1)
    return Figure(key, RETRIEVAL_FAMILY, f"{kind}, {ranking}, {recall}", f"{queries}, {recall}, {how}", None,
                  "dcsm" if ranking == "dcsm" else None, rank,
                  None if replaced is None else f"retrieval.{kind}.{replaced}.{at}", versus,
                  f"retrieval.{kind}.chance.{at}")  # fmt: skip


def _negation_form_figure(key: str, scorer: str, rest: list[str]) -> Figure:
    """``negation_forms.<scorer>.heldout|training.<side>`` and ``...family.<family>.<side>``:
    two-sided negation over the grammar's phrasings (``training.evaluation.methods.negation``)."""
    group, side = rest[0], rest[-1]
    where = {"heldout": "held-out phrasings", "training": "training phrasings"}.get(group, f"{rest[1]} phrasings")
    how = "DCSM" if scorer == "dcsm" else f"cosine, text encoder {scorer}"
    rank = _NEGATION_GROUP_RANK.get(group, 3) * 10 + _SIDE_RANK.get(side, 4) + (0 if scorer == "dcsm" else 100)
    # DCSM's figure replaces cosine through the base encoder on the same photos and phrasings, a
    # finetuned text encoder's the base encoder's.
    base = ".".join(["negation_forms", BASE, *rest])
    replaces = (base, "cosine") if scorer == "dcsm" else _base_encoder(scorer, base)
    return Figure(key, "negation both ways, by phrasing (docs/negation.md)", f"{where}, {side}, {how}",
                  f"negation, {where}, {NEGATION_SIDES.get(side, side)}, {how}", 0.5,
                  "dcsm" if scorer == "dcsm" else _encoder(scorer), rank, *replaces)  # fmt: skip


def _paraphrase_form_figure(key: str, encoder: str, rest: list[str]) -> Figure:
    """``paraphrase_forms.<encoder>.heldout[.worst]|training`` and ``...family.<family>``: a
    paraphrase closer to its own caption than to every other (``training.evaluation.methods.paraphrase``;
    chance is 1 / the number of phrases, which the data decides: none is printed)."""
    group = rest[0]
    where = {"heldout": "held-out phrasings", "training": "training phrasings"}.get(group, f"{rest[-1]} phrasings")
    if rest[-1] == "worst":
        where = "the worst held-out phrasing"
    rank = _NEGATION_GROUP_RANK.get(group, 3) * 10 + (1 if rest[-1] == "worst" else 0)
    replaces = _base_encoder(encoder, ".".join(["paraphrase_forms", BASE, *rest]))
    return Figure(key, "paraphrase, by phrasing (docs/negation.md)", f"{where}, {encoder}",
                  f"paraphrase closest to its own caption, {where}, text encoder {encoder}", None,
                  _encoder(encoder), rank, *replaces)  # fmt: skip


def has_component(components: Mapping[str, Any] | None, needs: str | None) -> bool:
    """Whether a version with ``components`` (a dataset section's ``components``) has what a figure
    needs; True when the section does not say (eval.json files written before it did)."""
    if needs is None or components is None:
        return True
    if needs.startswith("text_encoder:"):
        return needs.partition(":")[2] in components.get("text_encoders", [])
    return bool(components.get(needs))


def _is_figure(key: str) -> bool:
    """A row of its own: not a standard error, nor a component's gain (that is in its row's change),
    nor a retrieval chance level (that is in its rows' chance column)."""
    return not key.endswith(".stderr") and not key.startswith(GAIN_PREFIX) and ".chance.r" not in key


def figures(metrics: Mapping[str, float], section: Mapping[str, Any], prefix: str) -> list[Figure]:
    """The figures of one dataset (keys under ``prefix``), family by family in ``FAMILIES`` order,
    leaving out any that needs a component the version does not have; after a comparison, also
    those only the compared version has (their column here is empty)."""
    zeroshot = section.get("details", {}).get("zeroshot")
    ours = [describe(k, zeroshot) for k in relative(metrics, prefix) if _is_figure(k)]
    out = [f for f in ours if has_component(section.get("components"), f.needs)]
    compare = section.get("compare")
    if compare:
        known = {f.key for f in out}
        out += [describe(k, zeroshot) for k in compare["metrics"] if _is_figure(k) and k not in known]
    order = {family: i for i, family in enumerate(FAMILIES)}
    return sorted(out, key=lambda f: (order.get(f.family, len(order)), f.rank))  # stable: else the eval's order


def mean_and_stderr(mean: float, stderr: float) -> str:
    """``0.843 ± 0.012``: three decimals, more when the standard error is smaller than that shows
    (``0.8431 ± 0.0003``, not ``± 0.000``): its first significant digit is always printed."""
    decimals = 3
    if 1e-9 < stderr < 0.0005 and math.isfinite(stderr):  # below 1e-9: equal values, rounding only
        decimals = min(12, -math.floor(math.log10(stderr)))
    return f"{mean:.{decimals}f} ± {stderr:.{decimals}f}"


def cell(metrics: Mapping[str, float], key: str) -> str:
    """``mean ± stderr`` of ``key`` in ``metrics`` (relative or absolute keys alike), ``-`` when absent."""
    if key not in metrics or not math.isfinite(metrics[key]):
        return "-"
    return mean_and_stderr(metrics[key], metrics.get(key + ".stderr", 0.0))


def signed(mean: float, stderr: float) -> str:
    """``+0.415 ± 0.012``: a change, with its sign, as ``mean_and_stderr`` prints a figure."""
    mean += 0.0  # -0.0 (a difference of two negative zeros) prints as 0
    return ("+" if mean >= 0 else "") + mean_and_stderr(mean, stderr)


def version_change(base: Mapping[str, float], ours: Mapping[str, float], key: str) -> str:
    """This version's figure minus the compared version's, with the standard error of the difference
    of two independent means (the seeds' samples are the same, so this errs on the wide side)."""
    if key not in base or key not in ours or not (math.isfinite(base[key]) and math.isfinite(ours[key])):
        return ""
    stderr = math.hypot(base.get(key + ".stderr", 0.0), ours.get(key + ".stderr", 0.0))
    return signed(ours[key] - base[key], stderr)


def gain_key(key: str) -> str:
    """Where eval.json keeps what the component of figure ``key`` adds over the figure it replaces."""
    return GAIN_PREFIX + key


def component_gain(metrics: Mapping[str, float], f: Figure) -> tuple[float, float] | None:
    """(change, standard error) of a component's figure over the one it replaces, None for a figure
    no component provides. eval.json holds it paired per seed (``gain.<key>``); files written
    before it did give the difference of the two means."""
    if f.replaces is None:
        return None
    gain = metrics.get(gain_key(f.key))
    if gain is not None and math.isfinite(gain):
        return gain, metrics.get(gain_key(f.key) + ".stderr", 0.0)
    if f.key not in metrics or f.replaces not in metrics:
        return None
    mean = metrics[f.key] - metrics[f.replaces]
    if not math.isfinite(mean):
        return None
    return mean, math.hypot(metrics.get(f.key + ".stderr", 0.0), metrics.get(f.replaces + ".stderr", 0.0))


def change(f: Figure, ours: Mapping[str, float], compared: Mapping[str, float] | None, compared_ref: str = "") -> str:
    """The change column: for a component's figure, what it adds over the figure it replaces
    (``+0.415 ± 0.012 vs cosine``); after a comparison, also this version minus the compared one."""
    parts = []
    gain = component_gain(ours, f)
    if gain is not None:
        parts.append(f"{signed(*gain)} vs {f.versus}")
    if compared is not None:
        against = version_change(compared, ours, f.key)
        if against:
            parts.append(f"{against} vs {compared_ref}" if parts else against)
    return "; ".join(parts)


def relative(metrics: Mapping[str, float], prefix: str) -> dict[str, float]:
    return {k[len(prefix) :]: v for k, v in metrics.items() if k.startswith(prefix)}


def confused_lines(section: Mapping[str, Any], limit: int = 5) -> list[str]:
    """The confused classes in words: the classes the comparatives name, the most confused pairs
    and the weakest classes of the first seed's zero-shot answers."""
    zs = section.get("details", {}).get("zeroshot")
    if not zs:
        return []
    lines = []
    seed = section.get("seeds", [0])[0]
    where = f"seed {seed}'s {zs.get('n_images', '?')} images, standard prompts"
    if zs.get("comparative_classes"):
        lines.append(f"confused classes (named by the version's {zs.get('comparatives', '?')} comparatives): "
                     + ", ".join(zs["comparative_classes"]))  # fmt: skip
    pairs = zs.get("confused_pairs") or []
    if pairs:
        lines.append(f"most confused pairs ({where}): " + ", ".join(f"{a} / {b} ({n})" for a, b, n in pairs))
    per_class = zs.get("per_class") or {}
    if per_class:
        weakest = sorted(per_class.items(), key=lambda kv: (kv[1], kv[0]))[:limit]
        lines.append(f"weakest classes ({where}): " + ", ".join(f"{c} {acc:.2f}" for c, acc in weakest))
    return lines


CHANGE_NOTE = ("change: what a component adds over the figure it replaces on the same inputs (PC-CLIP's text "
               "encoder vs the base encoder, DCSM vs cosine, comparative vs standard prompts), mean ± standard error "
               "of the per-seed difference")  # fmt: skip


def change_note(compare: Mapping[str, Any] | None, ref: str) -> str:
    if not compare:
        return CHANGE_NOTE
    return f"{CHANGE_NOTE}; and {ref} minus {compare['ref']} on every figure both have"


def table_lines(metrics: Mapping[str, float], section: Mapping[str, Any], prefix: str, ref: str) -> list[str]:
    """A markdown table of one dataset's figures: prose name, key, mean ± stderr (and the compared
    version's figure, when the section holds a comparison), the change, chance."""
    compare = section.get("compare")
    ours = relative(metrics, prefix)
    seeds = ", ".join(str(s) for s in section.get("seeds", []))
    head = f"figure (mean ± stderr over seeds {seeds})"
    encoders = default_encoders(section, ref)
    lines = [f"zero-shot figures use the default text encoder: {encoders}", ""] if encoders else []
    lines += [change_note(compare, ref), ""]
    base = compare["metrics"] if compare else None
    theirs = [f"`{compare['ref']}`"] if compare else []
    heads = [head, "key", *theirs, f"`{ref}`", "change", "chance"]
    lines += ["| " + " | ".join(heads) + " |", "|" + "---|" * len(heads)]
    for f in figures(metrics, section, prefix):
        cells = [f.name, f"`{f.key}`", *([cell(base, f.key)] if base is not None else []), cell(ours, f.key),
                 change(f, ours, base, compare["ref"] if compare else ""), chance(f, ours)]  # fmt: skip
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def default_encoders(section: Mapping[str, Any], ref: str) -> str:
    """``pcclip`` or, after a comparison, ``pcclip (fashion@v4), base (fashion@v1)``: the text
    encoder the zero-shot figures of each version were read with ("" without zero-shot figures)."""
    ours = section.get("details", {}).get("zeroshot", {}).get("encoder")
    if ours is None:
        return ""
    compare = section.get("compare")
    if not compare or compare.get("default_text_encoder") is None:
        return str(ours)
    return f"{ours} ({ref}), {compare['default_text_encoder']} ({compare['ref']})"


def chance_of(f: Figure, metrics: Mapping[str, float] | None = None) -> float | None:
    """The figure's chance level: fixed, or read from ``metrics`` (relative keys) where it was measured."""
    if f.chance_key is not None and metrics is not None and math.isfinite(metrics.get(f.chance_key, math.nan)):
        return metrics[f.chance_key]
    return f.chance


def chance(f: Figure, metrics: Mapping[str, float] | None = None) -> str:
    level = chance_of(f, metrics)
    return "" if level is None else f"{level:.3f}"


def summary_lines(report: dict, name: str) -> list[str]:
    """One dataset's figures as a markdown table (prose names, their eval.json keys, mean ± standard
    error over seeds, the compared version and the change when there is one, chance), then the
    confused classes and what was skipped."""
    section = report["datasets"][name]
    lines = [f"\n{report['model']} on {name} ({section['path']}, split {section['split']}, "
             f"{section['records']} records); keys under data.{name}. in eval.json\n"]  # fmt: skip
    lines += table_lines(report["metrics"], section, f"data.{name}.", str(report["model"]))
    confused = confused_lines(section)
    if confused:
        lines.append("")
        lines += confused
    skipped = section.get("skipped", {})
    if skipped:
        lines.append("")
        lines += [f"skipped {family}: {reason}" for family, reason in skipped.items()]
    return lines
