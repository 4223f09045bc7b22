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
    ],
)
def test_the_first_significant_digit_of_the_stderr_is_shown(mean: float, stderr: float, shown: str) -> None:
    assert mean_and_stderr(mean, stderr) == shown


def test_tables_use_it() -> None:
    metrics = {"zeroshot.shape": 0.8431, "zeroshot.shape.stderr": 0.0003}
    assert cell(metrics, "zeroshot.shape") == "0.8431 ± 0.0003"
    assert "0.8431 ± 0.0003" in metrics_table(metrics, [])
