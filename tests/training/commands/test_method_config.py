"""``clip-train pcclip|dcsm|semclip|yukino --config FILE``: the settings come from the method's
dataclasses (each flag is a field, with the field's default), a run starts from a JSON or YAML file
with flags over it, and a wrong key or type is said in one line with nothing trained."""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import pytest
import torch
import yaml
from typer.main import get_command
from typer.testing import CliRunner

from training.cli import app
from training.commands.configured import build, read_config, split_values
from training.commands.userdata import METHODS, RunOptions
from training.userdata.demo_data import write_user_dataset
from training.userdata.settings import SemClipRun, YukinoRun


def _option_defaults(command: str) -> dict[str, object]:
    click_command = get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p.default for p in click_command.params if p.name != "config"}


@pytest.mark.parametrize("command", list(METHODS))
def test_every_flag_is_a_field_of_the_run_options_or_the_method_with_its_default(command: str) -> None:
    _, settings = METHODS[command]
    known = {f.name: f for cls in (RunOptions, settings) for f in fields(cls)}
    flags = _option_defaults(command)
    assert set(flags) <= set(known)
    for name, default in flags.items():
        f = known[name]
        expected = f.default_factory() if callable(f.default_factory) else f.default  # type: ignore[misc]
        assert default == expected or (default in (None, ()) and expected in (None, [])), name


def test_the_flags_that_the_docs_use_are_still_there() -> None:
    flags = {c: {o for p in get_command(app).commands[c].params for o in p.opts + p.secondary_opts}  # type: ignore[attr-defined]
             for c in METHODS}  # fmt: skip
    common = {"--model", "--data", "--labels", "--store", "--name", "--alias", "--device", "--precision", "--seed",
              "--run-dir", "--feature-cache", "--threads", "--config"}  # fmt: skip
    for command in METHODS:
        assert common <= flags[command], command
    trainers = {"--steps", "--batch-size", "--lr", "--resume", "--restart", "--stop-after"}
    assert trainers | {"--temperature", "--caption-weight", "--generated-pairs", "--ensemble-weight",
                       "--make-default", "--no-make-default"} <= flags["pcclip"]  # fmt: skip
    assert trainers | {"--channels", "--hidden"} <= flags["dcsm"]
    assert trainers <= flags["semclip"]
    assert trainers | {"--text-encoder"} <= flags["yukino"]
    assert {"--pairs", "--generator", "--llm-base-url", "--llm-model", "--llm-key-env", "--llm-samples"} <= flags[
        "comparatives"
    ]


@pytest.fixture(scope="module")
def user_data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_user_dataset(tmp_path_factory.mktemp("user") / "data", per_label=6, scenes=0)


@pytest.fixture
def store(tmp_path: Path, publish_model) -> Path:  # noqa: ANN001
    root = tmp_path / "store"
    publish_model(root, "tiny", comparatives=[])
    return root


@pytest.mark.slow  # trains and publishes
def test_a_run_starts_from_a_config_file_and_a_flag_overrides_it(user_data: Path, store: Path, tmp_path: Path) -> None:
    torch.set_num_threads(1)
    config = tmp_path / "run.json"
    config.write_text(json.dumps({
        "model": "tiny@production", "data": str(user_data), "store": str(store), "run_dir": str(tmp_path / "run"),
        "feature_cache": str(tmp_path / "features"), "threads": 1, "steps": 3, "batch_size": 8,
        "oti_items": 4, "oti": {"steps": 2}, "text": {"steps": 2, "lr": 1e-4}, "width": 32,
    }))  # fmt: skip
    result = CliRunner().invoke(app, ["yukino", "--config", str(config), "--steps", "4"])
    assert result.exit_code == 0, result.output
    assert "published tiny@v2" in result.output
    used = json.loads((tmp_path / "run" / "yukino.config.json").read_text())
    assert used["steps"] == 4 and used["oti"]["steps"] == 2 and used["text"]["steps"] == 2  # flag over file
    assert used["lr"] == 3e-4  # neither: the field's default


WRITERS = {"run.json": json.dumps, "run.yaml": yaml.safe_dump, "run.yml": yaml.safe_dump}


@pytest.mark.parametrize("filename", list(WRITERS))
@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"model": "tiny@production", "stepz": 3}, "unknown setting(s) stepz"),
        ({"model": "tiny@production", "steps": "many"}, "steps: Input should be a valid integer"),
        ({"model": "tiny@production", "oti": {"steps": "x"}}, "oti.steps"),
        ([1, 2], "of settings is expected"),
        ({"data": "somewhere"}, "--model"),
    ],
)
def test_a_wrong_setting_is_said_in_one_line_and_nothing_trains(
    settings: object, message: str, filename: str, tmp_path: Path, user_data: Path
) -> None:
    config = tmp_path / filename
    config.write_text(WRITERS[filename](settings))
    result = CliRunner().invoke(app, ["yukino", "--config", str(config), "--data", str(user_data),
                                      "--run-dir", str(tmp_path / "run")])  # fmt: skip
    assert result.exit_code == 1, result.output
    assert message in result.output and "Traceback" not in result.output
    assert not (tmp_path / "run" / "yukino.checkpoint.pt").exists()


def test_a_config_file_that_is_not_json_is_said(tmp_path: Path) -> None:
    config = tmp_path / "run.json"
    config.write_text("steps: 3\n")
    result = CliRunner().invoke(app, ["pcclip", "--config", str(config)])
    assert result.exit_code == 1 and "not JSON" in result.output


def test_a_config_file_that_is_not_yaml_is_said_with_its_line(tmp_path: Path) -> None:
    config = tmp_path / "run.yaml"
    config.write_text("steps: 3\noti: {steps: [\n")
    result = CliRunner().invoke(app, ["yukino", "--config", str(config)])
    assert result.exit_code == 1 and "not YAML" in result.output and "line" in result.output, result.output
    assert "Traceback" not in result.output


def test_a_yaml_file_sets_what_its_json_twin_sets_nested_settings_and_tuples_included(tmp_path: Path) -> None:
    """The docs' YAML example (block style, nested mappings, a list for a tuple, ``1e-4`` that YAML
    1.1 reads as a string) builds the same run configurations as the JSON one."""
    (tmp_path / "run.yaml").write_text(
        "model: fruit@production\nsteps: 500\noti_items: 256\noti:\n  steps: 150\ntext:\n  steps: 300\n  lr: 1e-4\n"
    )
    (tmp_path / "run.json").write_text(json.dumps(
        {"model": "fruit@production", "steps": 500, "oti_items": 256, "oti": {"steps": 150},
         "text": {"steps": 300, "lr": 1e-4}}))  # fmt: skip
    built = []
    for name in ("run.yaml", "run.json"):
        parts = split_values(read_config(tmp_path / name), [RunOptions, YukinoRun], name)
        built.append([build(cls, part, name) for cls, part in zip((RunOptions, YukinoRun), parts, strict=True)])
    assert built[0] == built[1]
    options, run = built[0]
    assert options.model == "fruit@production" and run.oti.steps == 150 and run.text.lr == 1e-4
    (tmp_path / "semclip.yaml").write_text("weights: [1.0, 0.5, 2.0]\n")
    semclip = build(SemClipRun, read_config(tmp_path / "semclip.yaml"), "semclip.yaml")
    assert semclip.weights == (1.0, 0.5, 2.0)
