"""PC-CLIP (``training.methods.pcclip``) on synthetic image features and a real tiny CLIP's text
tower: the difference loss falls, the image tower stays, and a stopped run resumes to the
uninterrupted result."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from resume_checks import resumes_to_the_uninterrupted_result

from clipcore.methods.losses import pcclip_difference_loss
from clipcore.models.clip_model import normalize, text_features
from training.encode import Tokenize
from training.methods import pcclip
from training.methods.checkpoint import Checkpoints, Runtime

TEXTS = [f"the first is more {w}" for w in ("red", "blue", "green", "round", "large", "small", "bright", "dark")]


def data(n: int = 32) -> pcclip.DifferenceData:
    """Pairs whose difference g(I1) - g(I2) is a fixed direction per text."""
    gen = torch.Generator().manual_seed(0)
    directions = torch.nn.functional.normalize(torch.randn(len(TEXTS), 32, generator=gen), dim=-1)
    second = torch.nn.functional.normalize(torch.randn(n, 32, generator=gen), dim=-1)
    first = torch.nn.functional.normalize(second + directions[torch.arange(n) % len(TEXTS)], dim=-1)
    texts = [TEXTS[i % len(TEXTS)] for i in range(n)]
    return pcclip.DifferenceData(first, second, texts, first, [f"a photo of {t}" for t in texts])


def batches(step: int) -> tuple[np.ndarray, np.ndarray]:
    idx = np.random.default_rng([0, step, 11]).choice(32, size=8, replace=False)
    return idx, idx


def train(tiny: torch.nn.Module, hyper: pcclip.Hyper, checkpoints: Checkpoints, log: Callable[[str], None]) -> dict:
    state, _ = pcclip.train(tiny, data(), batches, hyper, tokenize=Tokenize(32), scale=10.0,  # type: ignore[arg-type]
                            runtime=Runtime(log=log), checkpoints=checkpoints)  # fmt: skip
    return state


def difference_loss(model: torch.nn.Module) -> float:
    d = data()
    with torch.no_grad():
        f_t = normalize(text_features(model, Tokenize(32)(d.texts))[0].float())  # type: ignore[arg-type]
        return float(pcclip_difference_loss(d.first, d.second, f_t, temperature=0.1))


def test_the_difference_loss_falls_and_the_image_tower_stays(tiny: torch.nn.Module) -> None:
    import copy

    logs: list[str] = []
    state = train(tiny, pcclip.Hyper(steps=40, lr=2e-3, caption_weight=0.0), Checkpoints(), logs.append)
    after = copy.deepcopy(tiny)
    after.load_state_dict(state)
    assert difference_loss(after) < difference_loss(tiny) - 0.2
    before = tiny.state_dict()
    assert all(torch.equal(state[k], before[k]) for k in before if k.startswith("visual."))
    assert any(line.startswith("pcclip: last step's contrastive losses: difference") for line in logs)


def test_the_weight_ensemble_interpolates_toward_the_base(tiny: torch.nn.Module) -> None:
    full = train(tiny, pcclip.Hyper(steps=4, lr=1e-3), Checkpoints(), print)
    half = train(tiny, pcclip.Hyper(steps=4, lr=1e-3, ensemble_weight=0.5), Checkpoints(), print)
    base = tiny.state_dict()
    key = "text_projection"
    torch.testing.assert_close(half[key], (full[key] + base[key]) / 2)


def test_a_stopped_run_resumes_to_the_uninterrupted_result(tiny: torch.nn.Module, tmp_path: Path) -> None:
    hyper = pcclip.Hyper(steps=6, lr=1e-3)
    logs = resumes_to_the_uninterrupted_result(lambda c, log: train(tiny, hyper, c, log), tmp_path, stop=3)
    assert "pcclip: resumed from step 3" in logs
