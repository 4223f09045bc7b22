"""The world's retrieval table (``clip-train evaluate`` / ``show-eval``): both rankings, the paired change
and chance per kind of query and depth; nothing without retrieval figures."""

from __future__ import annotations

from training.report import retrieval_table


def test_each_kind_and_depth_is_a_row_with_its_change_and_chance() -> None:
    metrics = {
        "retrieval.compositional.cosine.r10": 0.5, "retrieval.compositional.cosine.r10.stderr": 0.01,
        "retrieval.compositional.dcsm.r10": 0.8, "retrieval.compositional.dcsm.r10.stderr": 0.02,
        "gain.retrieval.compositional.dcsm.r10": 0.3, "gain.retrieval.compositional.dcsm.r10.stderr": 0.015,
        "retrieval.compositional.chance.r10": 0.0125, "retrieval.compositional.chance.r10.stderr": 1e-17,
        "retrieval.difference.sum.r1": 0.4, "retrieval.difference.chance.r1": 0.0025,
    }  # fmt: skip
    lines = retrieval_table(metrics).splitlines()
    assert lines[2] == "| compositional | recall@10 | 0.500 ± 0.010 | 0.800 ± 0.020 | +0.300 ± 0.015 | 0.013 |"
    # A version without PC-CLIP figures: the baseline alone, no change; a small chance keeps two digits.
    assert lines[3] == "| difference | recall@1 | 0.400 | - | - | 0.0025 |"
    assert len(lines) == 4
    assert retrieval_table({"dcsm.binding": 0.9}) == ""
