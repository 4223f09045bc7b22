"""A standard error is never printed as ``± 0.000`` when it is not zero."""

from __future__ import annotations

import pytest

from training.evaluation.userdata.figures import cell, mean_and_stderr
from training.report import metrics_table


@pytest.mark.parametrize(
    ("mean", "stderr", "shown"),
    [
        (0.843, 0.012, "0.843 ± 0.012"),
        (0.8431, 0.0003, "0.8431 ± 0.0003"),
        (0.5, 0.00004, "0.50000 ± 0.00004"),
        (0.9, 0.0, "0.900 ± 0.000"),
        # Three equal per-seed values leave a rounding residue, not a spread worth twelve digits.
        (0.925, 1.1102230246251565e-16, "0.925 ± 0.000"),
    ],
)
def test_the_first_significant_digit_of_the_stderr_is_shown(mean: float, stderr: float, shown: str) -> None:
    assert mean_and_stderr(mean, stderr) == shown


def test_tables_use_it() -> None:
    metrics = {"zeroshot.shape": 0.8431, "zeroshot.shape.stderr": 0.0003}
    assert cell(metrics, "zeroshot.shape") == "0.8431 ± 0.0003"
    assert "0.8431 ± 0.0003" in metrics_table(metrics, [])


def test_the_world_report_has_dcsms_gain_over_cosine_beside_both() -> None:
    """The paired per-seed gain (``gain.dcsm.<kind>``, what the gate's policy can hold to a minimum)
    is its own column of the dense table, beside cosine's and DCSM's figures on the same negatives."""
    from training.evaluation.world.run import dense_gains
    from training.report import GAIN_COLUMN, print_report

    seed = {"cosine.heldout.negation": 0.2, "dcsm.heldout.negation": 0.95, "cosine.binding": 0.5,
            "readout.binding": 0.9, "base.zeroshot.shape": 0.8}  # fmt: skip
    gains = dense_gains(seed)
    assert gains == {"gain.dcsm.heldout.negation": pytest.approx(0.75)}
    metrics = {**seed, **gains, "gain.dcsm.heldout.negation.stderr": 0.01}
    lines: list[str] = []
    print_report({"model": "m@v1", "seeds": [0, 1], "metrics": metrics}, lambda line, **_: lines.append(line))
    table = next(text for text in lines if f"| metric | cosine | dcsm | {GAIN_COLUMN} |" in text)
    assert "| heldout.negation | 0.200 | 0.950 | 0.750 ± 0.010 |" in table
