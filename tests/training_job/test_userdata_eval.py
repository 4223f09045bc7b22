"""``clip-train evaluate --data``: real Fashion-MNIST images, a real tiny model, eval.json and the
HTML report written into the version; what the version lacks is skipped and said."""

from __future__ import annotations

import html
import json
import math
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from clipcore.models.clip_model import build_model
from clipcore.models.publish import TrainedModel, publish_bundle
from model_store import ModelStore
from training.cli import app
from training.datasets.fashion_mnist import LABELS, read_idx
from training.derive import DerivedParts, publish_derived
from training.recipe import model_config

SOURCE = Path("/usr/share/datasets/fashion-mnist")
pytestmark = pytest.mark.skipif(not SOURCE.exists(), reason="apt-get install dataset-fashion-mnist")
runner = CliRunner()


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("fmnist")
    result = runner.invoke(app, ["data", "fashion-mnist", str(out), "--limit", "40", "--test-limit", "60"])
    assert result.exit_code == 0, result.output
    return out


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("store")
    store = ModelStore(root)
    torch.manual_seed(0)
    config = model_config("shapes-smoke")
    publish_bundle(store, "fm", TrainedModel(build_model(config), config), aliases=["plain"])
    library = [
        {"a": "shirt", "b": "t-shirt", "text": "The first image shows long sleeves, while the second short ones."},
        {"a": "t-shirt", "b": "shirt", "text": "The first image shows short sleeves, while the second long ones."},
        {"a": "coat", "b": "planet", "text": "A label the data does not have: never used."},
    ]
    publish_derived(
        store,
        "fm@plain",
        DerivedParts(files={"comparatives.json": json.dumps(library).encode()}),
        aliases=["with-library"],
    )
    return root


def test_the_converter_writes_the_raw_pixels_and_labels(data: Path) -> None:
    images, labels = read_idx(SOURCE / "t10k-images-idx3-ubyte.gz"), read_idx(SOURCE / "t10k-labels-idx1-ubyte.gz")
    assert images.shape == (10000, 28, 28)
    rows = [json.loads(line) for line in (data / "test.jsonl").read_text().splitlines()]
    assert len(rows) == 60 and len((data / "train.jsonl").read_text().splitlines()) == 40
    for i in (0, 59):
        assert np.array_equal(np.asarray(Image.open(data / rows[i]["image"])), images[i])
        assert rows[i]["label"] == LABELS[labels[i]]
    assert set(json.loads((data / "labels.json").read_text())) == set(LABELS)


@pytest.mark.slow
def test_evaluate_writes_figures_and_report_into_the_version(data: Path, root: Path, tmp_path: Path) -> None:
    args = ["evaluate", "fm@with-library", "--store", str(root), "--data", str(data / "test.jsonl"),
            "--split", "all", "--dataset-name", "fmnist", "--seeds", "2", "--n-captions", "20"]  # fmt: skip
    result = runner.invoke(app, [*args, "--out", str(tmp_path)])
    store = ModelStore(root)
    assert result.exit_code == 0, result.output
    name, version = store.resolve("fm@with-library")
    assert store.annex_files(name, version) == ["eval.json", "report.html"]
    report = json.loads(store.file_path(name, version, "eval.json").read_text())
    m = report["metrics"]
    for key in ("zeroshot.acc", "zeroshot_comparative.acc", "zeroshot.confused_acc", "rank_pair.label.base",
                "hard_negatives.cosine.all", "hard_negatives.cosine.label", "hard_negatives.cosine.negation",
                "winoground.group.cosine"):  # fmt: skip
        assert 0.0 <= m[f"data.fmnist.{key}"] <= 1.0, key
        assert f"data.fmnist.{key}.stderr" in m
    # Only the components the version has: a base encoder, no SemCLIP, PC-CLIP, DCSM or YUKINO.
    assert not [k for k in m if k.startswith(("data.fmnist.semclip", "data.fmnist.negation."))]
    assert 0.0 <= m["data.fmnist.negation_forms.base.heldout.both"] <= 1.0  # two-sided negation, cosine
    assert not [k for k in m if k.endswith((".pcclip", ".yukino")) or ".dcsm." in k]
    section = report["datasets"]["fmnist"]
    assert section["components"] == {"text_encoders": ["base"], "default_text_encoder": "base", "dcsm": False,
                                     "yukino": False, "comparatives": 2}  # fmt: skip
    zs = section["details"]["zeroshot"]
    # All 60 images every seed: accuracy is the confusion matrix's diagonal, the same on each seed.
    matrix = np.array(zs["confusion"])
    assert matrix.sum() == 60 and m["data.fmnist.zeroshot.acc"] == pytest.approx(np.trace(matrix) / 60)
    assert m["data.fmnist.zeroshot.acc.stderr"] == 0.0
    assert zs["comparative_classes"] == ["shirt", "t-shirt"] and zs["comparatives"] == 2  # "planet" left out
    targeted = [zs["labels"].index(c) for c in ("shirt", "t-shirt")]
    after = np.array(zs["confusion_comparative"])
    assert m["data.fmnist.zeroshot_comparative.confused_acc"] == pytest.approx(
        after[targeted, targeted].sum() / after[targeted].sum()
    )
    assert set(section["skipped"]) >= {"pcclip", "dcsm", "yukino"} and "comparative" not in section["skipped"]
    # The printed table: prose names with the key beside each, chance, the confused classes named.
    out = result.output
    assert "| zero-shot accuracy, 10 classes (default text encoder) | `zeroshot.acc` | " in out
    assert "zero-shot figures use the default text encoder: base" in out
    assert "| zero-shot on the 2 confused classes: shirt, t-shirt (default text encoder), with comparative prompting " \
           "| `zeroshot_comparative.confused_acc` | " in out  # fmt: skip
    assert "| caption over its negation, cosine, text encoder base | `hard_negatives.cosine.negation` | " in out
    assert "| pair ranking, label difference texts, text encoder base | `rank_pair.label.base` | " in out
    row = next(line for line in out.splitlines() if "`winoground.group.cosine`" in line)
    assert row.endswith("| 0.167 |")  # chance of the 2x2 group score
    assert "confused classes (named by the version's 2 comparatives): shirt, t-shirt" in out
    pairs = ", ".join(f"{a} / {b} ({n})" for a, b, n in zs["confused_pairs"])
    assert f"most confused pairs (seed 0's 60 images, standard prompts): {pairs}" in out
    page = store.file_path(name, version, "report.html").read_text()
    assert page.count('src="data:image/png;base64,') >= 4
    assert "<th>chance</th>" in page and "<td>caption over its negation, cosine, text encoder base</td>" in page
    assert "<code>hard_negatives.cosine.negation</code>" in page and "<td>hard_negatives" not in page
    assert "shirt, t-shirt" in page and html.escape(pairs) in page
    assert (tmp_path / "fmnist-confusion.png").read_bytes()[:4] == b"\x89PNG"
    assert report["report"] == "report.html"

    # show-eval prints the stored table again, without computing.
    shown = runner.invoke(app, ["show-eval", "fm@with-library", "--store", str(root)])
    assert shown.exit_code == 0, shown.output
    assert "| zero-shot accuracy, 10 classes (default text encoder) | `zeroshot.acc` | " in shown.output

    # A second dataset is added beside the first; the first one's figures stay.
    again = runner.invoke(app, [*args[:9], "second", "--seeds", "1", "--n-captions", "5"])
    assert again.exit_code == 0, again.output
    merged = json.loads(store.file_path(name, version, "eval.json").read_text())
    assert "data.fmnist.zeroshot.acc" in merged["metrics"] and "data.second.zeroshot.acc" in merged["metrics"]


def test_a_version_without_a_library_skips_comparatives_and_says_why(data: Path, root: Path) -> None:
    result = runner.invoke(app, ["evaluate", "fm@plain", "--store", str(root), "--data", str(data / "test.jsonl"),
                                 "--split", "all", "--seeds", "1", "--n-captions", "5", "--no-write"])  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "has no comparatives for these labels" in " ".join(result.output.split())
    store = ModelStore(root)
    name, version = store.resolve("fm@plain")
    assert store.annex_files(name, version) == []


def test_bad_data_stops_the_evaluation_with_its_line(data: Path, root: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"image": str(data / "images/test/00000.png"), "label": "shirt"}) + "\n{oops\n")
    result = runner.invoke(app, ["evaluate", "fm@plain", "--store", str(root), "--data", str(bad), "--split", "all"])
    assert result.exit_code == 1
    assert "bad.jsonl:2" in result.output


def test_an_unknown_version_is_named_without_a_traceback(data: Path, root: Path) -> None:
    result = runner.invoke(app, ["evaluate", "fm@nowhere", "--store", str(root), "--data", str(data / "test.jsonl")])
    assert result.exit_code == 1 and "nowhere" in result.output and "Traceback" not in result.output


@pytest.fixture(scope="module")
def with_pcclip(root: Path) -> str:
    """A version with a second text encoder (``pcclip``), no SemCLIP: ``fmp@production``."""
    from loadtests.local_stack import publish_tiny

    publish_tiny(root, "fmp", seed=3, comparatives=[])
    return "fmp@production"


def test_caption_over_its_negation_is_one_figure_per_text_encoder(data: Path, root: Path, with_pcclip: str) -> None:
    """The hard negatives' ``negation`` kind (cosine, base encoder) and the per-encoder negation
    figure read the same captions and negations: the base encoder's is not reported twice, and
    ``negation.<encoder>`` is exactly that figure read with another encoder."""
    from clipcore.models.bundle import ModelBundle
    from training.evaluation.userdata.data import UserEvalConfig, load_eval_set
    from training.evaluation.userdata.dcsm import dense_vs_cosine
    from training.evaluation.userdata.semclip import negation_by_encoder

    store = ModelStore(root)
    es = load_eval_set(data / "test.jsonl", ModelBundle.load(store, with_pcclip), "all")
    cfg = UserEvalConfig(n_captions=40)
    for seed in (0, 1):
        per_encoder = negation_by_encoder(es, cfg, ["base", "pcclip"], seed)
        assert per_encoder["negation.base"] == dense_vs_cosine(es, cfg, seed)["hard_negatives.cosine.negation"]
        assert set(per_encoder) == {"negation.base", "negation.pcclip"}

    args = ["evaluate", with_pcclip, "--store", str(root), "--data", str(data / "test.jsonl"), "--split", "all",
            "--dataset-name", "cmp", "--seeds", "2", "--n-captions", "20"]  # fmt: skip
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    name, version = store.resolve(with_pcclip)
    report = json.loads(store.file_path(name, version, "eval.json").read_text())
    keys = {k.removeprefix("data.cmp.") for k in report["metrics"] if not k.endswith(".stderr")}
    assert {"rank_pair.label.pcclip", "negation.pcclip", "hard_negatives.cosine.negation"} <= keys
    two_sided = {f"negation_forms.{enc}.heldout.{side}" for enc in ("base", "pcclip")
                 for side in ("present", "absent", "both", "worst")}  # fmt: skip
    assert two_sided <= keys and not [k for k in keys if k.startswith("negation_forms.dcsm")]  # no scorer here
    assert "| negation, held-out phrasings, both sides, cosine, text encoder pcclip | " in result.output
    # Paraphrase consistency over the grammar's paraphrase forms, per encoder, the finetuned one set
    # against the base encoder's on the same phrases (as for negation both ways).
    paraphrase = {f"paraphrase_forms.{enc}.{group}" for enc in ("base", "pcclip")
                  for group in ("heldout", "heldout.worst", "training", "family.noun")}  # fmt: skip
    assert paraphrase <= keys
    for key in ("paraphrase_forms.pcclip.heldout", "negation_forms.pcclip.heldout.both"):
        replaced = key.replace(".pcclip.", ".base.")
        assert report["metrics"][f"data.cmp.gain.{key}"] == pytest.approx(
            report["metrics"][f"data.cmp.{key}"] - report["metrics"][f"data.cmp.{replaced}"])  # fmt: skip
    assert "paraphrase_forms" in report["datasets"]["cmp"]["details"]
    assert not [k for k in keys if k.startswith("semclip") or k == "negation.base"]  # the version has no SemCLIP
    assert report["datasets"]["cmp"]["components"]["text_encoders"] == ["base", "pcclip"]
    assert "| caption over its negation, cosine, text encoder pcclip | `negation.pcclip` | " in result.output
    # What the PC-CLIP encoder adds over the base encoder on the same pairs and the same negations:
    # the paired per-seed difference, in eval.json (where the gate reads it) and in the change column.
    m = {k.removeprefix("data.cmp."): v for k, v in report["metrics"].items()}
    for key, replaced in (("rank_pair.label.pcclip", "rank_pair.label.base"),
                          ("negation.pcclip", "hard_negatives.cosine.negation")):  # fmt: skip
        assert m[f"gain.{key}"] == pytest.approx(m[key] - m[replaced]) and f"gain.{key}.stderr" in m
        assert cells(result.output, key)[3] == f"{m[f'gain.{key}']:+.3f} ± {m[f'gain.{key}.stderr']:.3f} " \
                                               "vs base encoder"  # fmt: skip
    assert not [line for line in result.output.splitlines() if "`gain." in line]  # no row of its own
    # Every row a component provides has its change; the base rows have none without --compare.
    from training.evaluation.userdata.figures import describe

    for line in result.output.splitlines():
        if line.startswith("| ") and "| key |" not in line and "| `" in line:
            row = [c.strip() for c in line.strip().strip("|").split("|")]
            has_component = describe(row[1].strip("`")).replaces is not None
            assert bool(row[3]) == has_component, line
    # The negation-by-encoder chart has the base encoder's bar (the hard negatives' negation kind).
    from training.evaluation.userdata.report import family_bars

    section = report["datasets"]["cmp"]
    bars = family_bars(report["metrics"], section, "data.cmp.")["caption over its negation, by text encoder"]
    assert [b.label for b in bars] == ["base encoder (negation, cosine)", "pcclip"]
    assert bars[0].values[0][0] == m["hard_negatives.cosine.negation"] and not bars[0].change
    assert bars[1].change.startswith(f"{m['gain.negation.pcclip']:+.3f} ± ")
    assert "semclip" not in result.output.replace("skipped semclip", "")


def cells(output: str, key: str) -> list[str]:
    """The cells of the printed table's row of ``key``."""
    row = next(line for line in output.splitlines() if f"| `{key}` |" in line)
    return [cell.strip() for cell in row.strip().strip("|").split("|")]


@pytest.mark.slow
def test_compare_puts_another_versions_figures_beside(
    data: Path, root: Path, with_pcclip: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import matplotlib.axes

    store = ModelStore(root)
    common = ["--store", str(root), "--data", str(data / "test.jsonl"), "--split", "all", "--dataset-name", "cmp2",
              "--seeds", "2", "--n-captions", "20"]  # fmt: skip
    first = runner.invoke(app, ["evaluate", with_pcclip, *common])
    assert first.exit_code == 0, first.output
    chances: list[float] = []
    hlines = matplotlib.axes.Axes.hlines

    def spy(self: Any, y: float, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        chances.append(float(y))
        return hlines(self, y, *args, **kwargs)

    monkeypatch.setattr(matplotlib.axes.Axes, "hlines", spy)
    result = runner.invoke(app, ["evaluate", "fm@with-library", *common, "--compare", with_pcclip,
                                 "--out", str(tmp_path)])  # fmt: skip
    assert result.exit_code == 0, result.output
    base_name, base_version = store.resolve(with_pcclip)
    ours, theirs = f"fm@{store.resolve('fm@with-library')[1]}", f"{base_name}@{base_version}"
    out = " ".join(result.output.split())
    assert f"{theirs}: figures on cmp2 read from its eval.json" in out
    assert f"| key | `{theirs}` | `{ours}` | change | chance |" in result.output
    assert f"zero-shot figures use the default text encoder: base ({ours}), base ({theirs})" in out

    report = json.loads((tmp_path / "eval.json").read_text())
    compare = report["datasets"]["cmp2"]["compare"]
    base = json.loads(store.file_path(base_name, base_version, "eval.json").read_text())["metrics"]
    assert compare["ref"] == theirs and compare["source"] == "its eval.json"
    assert compare["metrics"]["zeroshot.acc"] == base["data.cmp2.zeroshot.acc"]
    m = report["metrics"]
    change = m["data.cmp2.zeroshot.acc"] - base["data.cmp2.zeroshot.acc"]
    change_stderr = math.hypot(m["data.cmp2.zeroshot.acc.stderr"], base["data.cmp2.zeroshot.acc.stderr"])
    row = cells(result.output, "zeroshot.acc")
    assert row[2:6] == [
        f"{base['data.cmp2.zeroshot.acc']:.3f} ± {base['data.cmp2.zeroshot.acc.stderr']:.3f}",
        f"{m['data.cmp2.zeroshot.acc']:.3f} ± {m['data.cmp2.zeroshot.acc.stderr']:.3f}",
        f"{change:+.3f} ± {change_stderr:.3f}",
        "0.100",
    ]
    # The comparatives' row: what they add over standard prompts on the same images, paired per seed.
    gain = m["data.cmp2.gain.zeroshot_comparative.acc"]
    assert gain == pytest.approx(m["data.cmp2.zeroshot_comparative.acc"] - m["data.cmp2.zeroshot.acc"])
    assert cells(result.output, "zeroshot_comparative.acc")[4].startswith(
        f"{gain:+.3f} ± {m['data.cmp2.gain.zeroshot_comparative.acc.stderr']:.3f} vs standard prompts"
    )
    # A figure only the compared version has (its PC-CLIP encoder) is in its column alone.
    row = cells(result.output, "negation.pcclip")
    assert row[2:5] == [f"{base['data.cmp2.negation.pcclip']:.3f} ± "
                                     f"{base['data.cmp2.negation.pcclip.stderr']:.3f}", "-", ""]  # fmt: skip
    page = (tmp_path / "report.html").read_text()
    assert f"<th>{theirs}</th><th>{ours}</th><th>change</th><th>chance</th>" in page
    # Chance lines: zero-shot (1 in 10), pair ranking and hard negatives (1 in 2), 2x2 text, image, group.
    assert {0.1, 0.5, 0.25} <= set(chances) and any(abs(c - 1 / 6) < 1e-9 for c in chances)

    # A version never evaluated on this data is evaluated now, and nothing is written into it.
    plain = runner.invoke(app, ["evaluate", "fm@with-library", *common, "--compare", "fm@plain", "--no-write"])
    assert plain.exit_code == 0, plain.output
    assert "has no figures on cmp2: evaluating it now" in " ".join(plain.output.split())
    assert store.annex_files(*store.resolve("fm@plain")) == []


def test_compare_with_an_unknown_version_stops_before_evaluating(data: Path, root: Path) -> None:
    result = runner.invoke(app, ["evaluate", "fm@plain", "--store", str(root), "--data", str(data / "test.jsonl"),
                                 "--split", "all", "--compare", "fm@nowhere", "--no-write"])  # fmt: skip
    assert result.exit_code == 1 and "nowhere" in result.output and "seed" not in result.output


def test_the_gate_holds_a_component_to_a_minimum_gain_through_the_policy(data: Path, root: Path) -> None:
    """A real evaluation's ``gain.zeroshot_comparative.acc`` (the comparatives over standard prompts
    on the same photos) read by the gate: a policy asking for more refuses the move, one asking for
    what it adds accepts it."""
    from model_store.gate import GatePolicy

    store = ModelStore(root)
    common = ["--store", str(root), "--data", str(data / "test.jsonl"), "--split", "all", "--dataset-name", "gated",
              "--seeds", "2", "--n-captions", "5"]  # fmt: skip
    for ref in ("fm@plain", "fm@with-library"):
        result = runner.invoke(app, ["evaluate", ref, *common])
        assert result.exit_code == 0, result.output
    name, version = store.resolve("fm@with-library")
    metrics = json.loads(store.file_path(name, version, "eval.json").read_text())["metrics"]
    gain = metrics["data.gated.gain.zeroshot_comparative.acc"]
    key = "data.gated.gain.zeroshot_comparative.acc"  # this dataset's (earlier tests add others)
    store.set_gate_policy("fm", GatePolicy(minimum={key: gain + 0.01}))
    refused = store.gate("fm", "plain", version)
    assert not refused.passed and refused.below_minimum == [key]
    assert not refused.regressed  # the same weights: no figure fell, only the comparatives add too little
    store.set_gate_policy("fm", GatePolicy(minimum={key: gain - 0.01}))
    assert store.gate("fm", "plain", version).passed
    store.set_gate_policy("fm", None)
