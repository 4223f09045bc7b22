"""Evaluation gate: may an alias move from its current target to a candidate, by their eval.json?

Pure: two parsed ``eval.json`` reports and a policy in, a ``GateReport`` out (no I/O, no training
import; the store reads the files). Both shapes ``clip-train evaluate`` writes are understood:
flat figures under ``metrics`` (``pcclip.rank_pair.size``) with their standard error beside them
(``pcclip.rank_pair.size.stderr``), and user-data evaluations, whose figures are prefixed
``data.<dataset>.`` and whose ``datasets.<dataset>`` section says which split and how many
records were evaluated.

Only reports that are their versions' evaluations reach the gate (``model_store.evaluation``: an
eval.json copied from other weights is none). Only figures both reports hold for the same data
are compared. A figure regresses when the candidate is worse than the current target by more
than its tolerance:

* the policy's tolerance for it (``gate.json``: an exact name or a glob, the longest match wins);
* else twice the larger of the two recorded standard errors (a difference the seeds alone could
  explain is not a regression);
* else one point: 0.01 for figures in [-1, 1] (accuracies, differences of accuracies), else 1 %
  of the current value.

Every figure is higher-is-better except those named otherwise here or in the policy.

The policy may also hold figures to a floor of their own, whatever the current target scored
(``minimum``): a candidate whose figure is below it, or that lacks a figure a minimum names, is
refused. With the gains a user-data evaluation records (``data.<dataset>.gain.<key>``: what a
component adds over the figure it replaces on the same inputs), "DCSM must beat cosine on
negations by at least 5 points" reads ``{"minimum": {"data.*.gain.hard_negatives.dcsm.negation": 0.05}}``.

Nothing to compare never passes silently: when the current target has no evaluation, the
candidate must have one (it becomes the reference of later moves), else the move is refused
like a regression; the first target of an alias has nothing to hold it against. Either way the
report's ``note`` says so, and the alias history keeps it.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from fnmatch import fnmatchcase
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, NonNegativeFloat

Direction = Literal["higher", "lower", "ignore"]
RowVerdict = Literal["ok", "regressed", "missing", "skipped", "below minimum"]

STDERR_SUFFIX = ".stderr"
DATA_PREFIX = "data."
POINT = 0.01
# How many failing figure names the alias history keeps per move (the file is read on every poll).
VERDICT_NAMES_LIMIT = 20

# Built in, overridable by the policy. Accuracy-like figures need no entry: higher is better.
BUILTIN_DIRECTIONS: dict[str, Direction] = {
    # Shape accuracy with "this is not a photo of a X." prompts: a model that reads "not" scores low.
    "*zeroshot_not_photo": "lower",
    # What a uniformly random patch scores: a property of the data, not of the model.
    "*.chance": "ignore",
    "*.chance.r*": "ignore",  # retrieval's chance: how many gallery items satisfy each query
    "*loss": "lower",
    "*latency*": "lower",
    "*_ms": "lower",
    "*_seconds": "lower",
}

T = TypeVar("T")


class GatePolicy(BaseModel):
    """``<name>/gate.json``: per-figure tolerances and directions (keys are names or globs)."""

    model_config = ConfigDict(extra="forbid")

    tolerance: dict[str, NonNegativeFloat] = Field(default_factory=dict)
    direction: dict[str, Direction] = Field(default_factory=dict)
    # The least value a candidate's figure may have (in the figure's units: 0.05 is 5 points of an
    # accuracy), against no other version; a name or glob no figure of the candidate matches refuses.
    minimum: dict[str, float] = Field(default_factory=dict)


class GateVerdict(BaseModel):
    """What the alias history keeps of a gate decision: the counts, and the first
    ``VERDICT_NAMES_LIMIT`` names of the figures that failed."""

    # Fields added later are ignored by readers that do not know them: the log is informative.
    model_config = ConfigDict(extra="ignore")

    result: Literal["pass", "fail", "not gated"]
    against: str | None = None
    compared: int = 0
    regressed: list[str] = Field(default_factory=list)
    missing: list[str] = Field(default_factory=list)
    below_minimum: list[str] = Field(default_factory=list)
    regressed_count: int | None = None  # None in verdicts recorded before counts were: len(regressed)
    missing_count: int | None = None
    note: str | None = None

    @property
    def regressed_total(self) -> int:
        return len(self.regressed) if self.regressed_count is None else self.regressed_count

    @property
    def missing_total(self) -> int:
        return len(self.missing) if self.missing_count is None else self.missing_count


class GateRow(BaseModel):
    """One figure: the two values, the tolerance applied and the verdict."""

    figure: str
    current: float | None
    candidate: float | None
    tolerance: float | None = None
    basis: str = ""  # where the tolerance came from, or why the figure was skipped
    direction: Direction = "higher"
    verdict: RowVerdict
    minimum: float | None = None  # set on the rows of the policy's minimums (the candidate alone)


class GateReport(BaseModel):
    """The comparison of a candidate with an alias' current target."""

    candidate: str
    against: str | None
    rows: list[GateRow] = Field(default_factory=list)
    note: str | None = None  # what the figures do not say: why nothing was compared, a report taken on its word
    problem: str | None = None  # refuses like a regression: an unreadable report, no evaluation on either side

    @property
    def regressed(self) -> list[str]:
        return [r.figure for r in self.rows if r.verdict == "regressed"]

    @property
    def missing(self) -> list[str]:
        return [r.figure for r in self.rows if r.verdict == "missing"]

    @property
    def below_minimum(self) -> list[str]:
        return [r.figure for r in self.rows if r.verdict == "below minimum"]

    @property
    def compared(self) -> int:
        return sum(r.verdict in ("ok", "regressed") and r.minimum is None for r in self.rows)

    @property
    def passed(self) -> bool:
        return self.problem is None and not self.regressed and not self.missing and not self.below_minimum

    @property
    def gated(self) -> bool:
        return self.problem is not None or any(r.verdict != "skipped" for r in self.rows)

    def add_note(self, note: str) -> None:
        self.note = f"{self.note}; {note}" if self.note else note

    def verdict(self) -> GateVerdict:
        if not self.gated:
            return GateVerdict(result="not gated", against=self.against, note=self.note)
        regressed, missing = self.regressed, self.missing
        return GateVerdict(
            result="pass" if self.passed else "fail",
            against=self.against,
            compared=self.compared,
            regressed=regressed[:VERDICT_NAMES_LIMIT],
            missing=missing[:VERDICT_NAMES_LIMIT],
            below_minimum=self.below_minimum[:VERDICT_NAMES_LIMIT],
            regressed_count=len(regressed),
            missing_count=len(missing),
            note="; ".join(n for n in (self.problem, self.note) if n) or None,
        )

    def summary(self) -> str:
        """One line: what was compared and the outcome."""
        if self.problem is not None:
            return f"gate: {self.problem}"
        if not self.gated:
            return f"gate: {self.note or 'nothing to compare'}"
        head = f"gate: {self.candidate} against {self.against}: {_count(self.compared, 'figure')} compared"
        if self.passed:  # a note is shown beside, as a warning
            return f"{head}, none regressed beyond tolerance"
        parts = []
        if self.regressed:
            parts.append(f"{len(self.regressed)} regressed beyond tolerance")
        if self.missing:
            parts.append(f"{len(self.missing)} missing from {self.candidate}")
        if self.below_minimum:
            parts.append(f"{len(self.below_minimum)} below the policy's minimum")
        note = f": {self.note}" if self.note else ""
        return f"{head}; {', '.join(parts)}{note}"


def _count(n: int, noun: str) -> str:
    return f"{n} {noun}" + ("" if n == 1 else "s")


def figures(report: Mapping[str, Any]) -> dict[str, tuple[float, float | None]]:
    """``metrics`` of an eval.json as figure -> (value, standard error or None)."""
    metrics = report.get("metrics")
    if not isinstance(metrics, Mapping):
        return {}
    numbers = {k: float(v) for k, v in metrics.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    out: dict[str, tuple[float, float | None]] = {}
    for key, value in numbers.items():
        if not key.endswith(STDERR_SUFFIX):
            out[key] = (value, numbers.get(key + STDERR_SUFFIX))
    return out


def _lookup(table: Mapping[str, T], figure: str) -> T | None:
    if figure in table:
        return table[figure]
    matches = [p for p in table if fnmatchcase(figure, p)]
    return table[max(matches, key=lambda p: (len(p), p))] if matches else None


def direction_of(figure: str, policy: GatePolicy) -> Direction:
    return _lookup(policy.direction, figure) or _lookup(BUILTIN_DIRECTIONS, figure) or "higher"


def tolerance_of(
    figure: str, current: float, candidate: float, stderrs: Iterable[float | None], policy: GatePolicy
) -> tuple[float, str]:
    """(tolerance, where it came from) for one figure."""
    override = _lookup(policy.tolerance, figure)
    if override is not None:
        return float(override), "policy"
    # A stderr of 0 comes from a single seed (or seeds that all agree): no estimate of the noise.
    recorded = [s for s in stderrs if s is not None and math.isfinite(s) and s > 0]
    if recorded:
        return 2 * max(recorded), "2 x stderr"
    if abs(current) <= 1 and abs(candidate) <= 1:
        return POINT, "1 point"
    return POINT * abs(current), "1 %"


def _dataset_of(figure: str, datasets: Iterable[str]) -> str | None:
    if not figure.startswith(DATA_PREFIX):
        return None
    names = [n for n in datasets if figure.startswith(f"{DATA_PREFIX}{n}.")]
    return max(names, key=len) if names else None


def _different_data(current: Mapping[str, Any], candidate: Mapping[str, Any]) -> dict[str, str]:
    """Datasets both evaluated, but on a different split or number of records: dataset -> why."""
    out: dict[str, str] = {}
    ours, theirs = current.get("datasets"), candidate.get("datasets")
    if not isinstance(ours, Mapping) or not isinstance(theirs, Mapping):
        return out
    for name in ours.keys() & theirs.keys():
        a, b = ours[name], theirs[name]
        if not isinstance(a, Mapping) or not isinstance(b, Mapping):
            continue
        for field in ("split", "records"):
            if a.get(field) != b.get(field):
                out[name] = f"other data ({field} {a.get(field)} vs {b.get(field)})"
                break
    return out


def _row(
    figure: str, current: tuple[float, float | None], candidate: tuple[float, float | None] | None, policy: GatePolicy
) -> GateRow:
    value, stderr = current
    direction = direction_of(figure, policy)
    if direction == "ignore":
        return GateRow(figure=figure, current=value, candidate=candidate and candidate[0], direction=direction,
                       verdict="skipped", basis="ignored")  # fmt: skip
    if not math.isfinite(value):  # undefined for the current target (e.g. an empty subset)
        return GateRow(figure=figure, current=value, candidate=candidate and candidate[0], direction=direction,
                       verdict="skipped", basis="undefined for the current target")  # fmt: skip
    if candidate is None or not math.isfinite(candidate[0]):
        return GateRow(figure=figure, current=value, candidate=None, direction=direction, verdict="missing")
    new, new_stderr = candidate
    tolerance, basis = tolerance_of(figure, value, new, (stderr, new_stderr), policy)
    worse_by = value - new if direction == "higher" else new - value
    verdict: RowVerdict = "regressed" if worse_by > tolerance else "ok"
    return GateRow(figure=figure, current=value, candidate=new, tolerance=tolerance, basis=basis,
                   direction=direction, verdict=verdict)  # fmt: skip


def compare_reports(
    current: Mapping[str, Any] | None,
    candidate: Mapping[str, Any] | None,
    *,
    candidate_version: str,
    current_version: str | None,
    policy: GatePolicy | None = None,
    current_missing: str | None = None,
    candidate_missing: str | None = None,
    notes: Iterable[str] = (),
) -> GateReport:
    """Gate ``candidate_version`` (report ``candidate``) against ``current_version`` (report
    ``current``); ``None`` for a version without an evaluation, and ``*_missing`` saying why when it
    is not simply the lack of an eval.json (a copy of another version's). The first target of an
    alias is not gated. A current target without figures has nothing to hold the candidate
    against: the candidate needs figures of its own, or the move is refused. A candidate without
    an eval.json lacks every figure. ``notes`` (e.g. a report taken on its word) are added."""
    policy = policy or GatePolicy()
    report = GateReport(candidate=candidate_version, against=current_version)
    if current_version is None:
        report.note = "first target of the alias: not gated"
        return report
    for note in notes:
        report.add_note(note)
    ours = figures(current) if current is not None else {}
    theirs = figures(candidate) if candidate is not None else {}
    lacking = candidate_missing or _no_figures(candidate, theirs, candidate_version)
    report.rows += minimum_rows(ours, theirs, policy)
    if not ours:
        why = current_missing or _no_figures(current, ours, current_version)
        if lacking is None:
            report.add_note(
                f"{why}: nothing to compare with; {candidate_version}'s evaluation is the reference from now on"
            )
        else:
            report.problem = (
                f"neither {current_version} nor {candidate_version} has an evaluation to gate the move ({why}; "
                f"{lacking}): evaluate {candidate_version} (`clip-train evaluate`)"
            )
        return report
    if lacking is not None:
        report.add_note(f"{lacking} (run `clip-train evaluate`)")
    other_data = _different_data(current or {}, candidate or {})
    for figure in sorted(ours):
        dataset = _dataset_of(figure, other_data)
        if dataset is not None:
            report.rows.append(GateRow(figure=figure, current=ours[figure][0], candidate=theirs.get(figure, (None,))[0],
                                       verdict="skipped", basis=other_data[dataset]))  # fmt: skip
            continue
        report.rows.append(_row(figure, ours[figure], theirs.get(figure), policy))
    return report


def minimum_rows(
    current: Mapping[str, tuple[float, float | None]],
    candidate: Mapping[str, tuple[float, float | None]],
    policy: GatePolicy,
) -> list[GateRow]:
    """The policy's minimums checked on the candidate's figures (the current target's value is
    shown beside, not used); a minimum no figure of the candidate matches is a missing row."""
    if not policy.minimum:
        return []
    rows, matched = [], set()
    for figure in sorted(candidate):
        floor = _lookup(policy.minimum, figure)
        if floor is None:
            continue
        matched |= {p for p in policy.minimum if p == figure or fnmatchcase(figure, p)}
        value = candidate[figure][0]
        verdict: RowVerdict = "ok" if math.isfinite(value) and value >= floor else "below minimum"
        rows.append(GateRow(figure=figure, current=current.get(figure, (None,))[0], candidate=value,
                            basis=f"policy minimum {floor:g}", verdict=verdict, minimum=floor))  # fmt: skip
    for pattern in sorted(set(policy.minimum) - matched):
        rows.append(GateRow(figure=pattern, current=None, candidate=None, verdict="missing",
                            basis=f"policy minimum {policy.minimum[pattern]:g}: no such figure",
                            minimum=policy.minimum[pattern]))  # fmt: skip
    return rows


def _no_figures(report: Mapping[str, Any] | None, found: Mapping[str, Any], version: str) -> str | None:
    """Why ``version`` has no figures to gate with (None when it has some)."""
    if report is None:
        return f"{version} has no eval.json"
    return None if found else f"the eval.json of {version} holds no figures"
