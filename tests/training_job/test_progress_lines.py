"""Training output read from a log: periodic one-line progress instead of a bar printed once at the
end, the base loss beside its chance level, and --threads on every command that computes."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from typer.main import get_command
from typer.testing import CliRunner

from training.cli import app
from training.progress import StepProgress, chance_loss, loss_with_chance
from training.userdata.demo_data import write_user_dataset


def test_without_a_terminal_a_line_is_printed_every_interval_and_at_the_end() -> None:
    lines: list[str] = []
    with StepProgress("base", total=3, terminal=False, every_seconds=0.0, write=lines.append) as bar:
        for step in range(3):
            bar.update(info=f"loss {4.0 - step:.3f}")
    assert [line.rsplit(" elapsed ", 1)[0] for line in lines] == [
        "base 1/3 loss 4.000",
        "base 2/3 loss 3.000",
        "base 3/3 loss 2.000",
    ]
    quiet: list[str] = []
    with StepProgress("dcsm", total=50, completed=10, terminal=False, write=quiet.append) as bar:
        for _ in range(40):
            bar.update()
    assert len(quiet) == 1 and quiet[0].startswith("dcsm 50/50 elapsed ")  # the interval never passed


def test_chance_level_is_ln_batch_size() -> None:
    assert chance_loss(128) == pytest.approx(4.852, abs=1e-3)
    assert loss_with_chance(4.876, 128) == "4.876 (chance: ln 128 = 4.852)"


def test_every_training_command_takes_threads() -> None:
    commands = get_command(app).commands  # type: ignore[attr-defined]
    for name in ("base", "evaluate", "build-default", "pcclip-sweep", "pcclip", "dcsm", "semclip", "yukino",
                 "comparatives"):  # fmt: skip
        assert "threads" in {p.name for p in commands[name].params}, name


def test_base_on_data_logs_progress_lines_and_the_loss_with_its_chance(tmp_path: Path) -> None:
    data = write_user_dataset(tmp_path / "data", per_label=2, scenes=2)
    before = torch.get_num_threads()
    result = CliRunner().invoke(app, ["base", "--data", str(data), "--store", str(tmp_path / "models"), "--config",
                                      "shapes-smoke", "--out", str(tmp_path / "run"), "--steps", "3", "--batch-size",
                                      "8", "--text-freeze-steps", "1", "--threads", "1"])  # fmt: skip
    torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    # A line, not a bar (CliRunner's output is no terminal), with one loss, labelled, beside its chance
    # level: the same loss the last line reports.
    line = next(line for line in result.output.splitlines() if line.startswith("base 3/3 "))
    assert " contrastive loss " in line and line.count(" loss ") == 1 and "(chance: ln 8 = 2.079)" in line
    last = next(line for line in result.output.splitlines() if "image-text contrastive loss at step 3 " in line)
    assert line.split("contrastive loss ")[1][:5] == last.split("at step 3 ")[1][:5]


def test_pcclip_reports_its_contrastive_terms_beside_chance(tmp_path: Path, publish_model) -> None:  # noqa: ANN001
    data = write_user_dataset(tmp_path / "data", per_label=2, scenes=2)
    publish_model(tmp_path / "models", "tiny", comparatives=[])
    before = torch.get_num_threads()
    result = CliRunner().invoke(app, ["pcclip", "--model", "tiny@production", "--data", str(data), "--store",
                                      str(tmp_path / "models"), "--steps", "2", "--batch-size", "4",
                                      "--generated-pairs", "8", "--run-dir", str(tmp_path / "run"), "--feature-cache",
                                      str(tmp_path / "features"), "--threads", "1"])  # fmt: skip
    torch.set_num_threads(before)
    assert result.exit_code == 0, result.output
    out = " ".join(result.output.split())
    assert "pcclip 2/2 difference loss " in out and "(chance: ln 4 = 1.386) elapsed" in out
    assert "difference " in out and "(chance: ln 4 = 1.386)" in out
