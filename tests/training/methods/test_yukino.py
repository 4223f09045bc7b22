"""YUKINO (``training.methods.yukino``) on synthetic features and a real tiny CLIP's text tower:
the text finetune's loss falls (structure and image terms, twins left out of the negatives),
OTI's pseudo-tokens lower its loss, the inverter's matching loss falls with and without OTI's
teacher, and each stage resumes to the uninterrupted result."""

from __future__ import annotations

import copy
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from resume_checks import resumes_to_the_uninterrupted_result

from clipcore.methods.losses import yukino_matching_loss, yukino_oti_loss
from clipcore.models.clip_model import normalize, text_features
from clipcore.models.yukino import YukinoHead, prompt_features
from training.encode import Tokenize, encode_texts
from training.methods import yukino
from training.methods.checkpoint import Checkpoints, Runtime

COLOURS = ("red", "blue", "green", "yellow")
SHAPES = ("circle", "square", "star", "cross")
CAPTIONS = [f"a {c} {s} left of a {c2} {s2}" for c, s, c2, s2 in zip(COLOURS, SHAPES, COLOURS[1:] + COLOURS[:1],
                                                                      SHAPES[::-1], strict=True)]  # fmt: skip
SWAPPED = [f"a {c2} {s} left of a {c} {s2}" for c, s, c2, s2 in zip(COLOURS, SHAPES, COLOURS[1:] + COLOURS[:1],
                                                                     SHAPES[::-1], strict=True)]  # fmt: skip


def text_data() -> yukino.TextData:
    """Four items, each a caption and its swapped twin (rows i and i + 4), with distinct images
    and structure features."""
    gen = torch.Generator().manual_seed(0)
    n = len(CAPTIONS)
    return yukino.TextData(
        tokens=Tokenize(32)(CAPTIONS + SWAPPED),
        images=torch.nn.functional.normalize(torch.randn(2 * n, 32, generator=gen), dim=-1),
        twins=torch.cat([torch.arange(n, 2 * n), torch.arange(n)]),
        structure=torch.randn(2 * n, 12, generator=gen),
    )


def all_rows(step: int) -> torch.Tensor:
    return torch.arange(8)


def finetune(tiny: torch.nn.Module, hyper: yukino.TextHyper, checkpoints: Checkpoints, log: Callable) -> dict:
    state, _ = yukino.finetune_text(tiny, text_data(), all_rows, hyper, runtime=Runtime(log=log),  # type: ignore[arg-type]
                                    checkpoints=checkpoints)  # fmt: skip
    return state


@pytest.mark.slow  # tens of optimisation steps
def test_the_text_finetune_tells_swapped_captions_apart(tiny: torch.nn.Module) -> None:
    def swap_cosine(model: torch.nn.Module) -> float:
        with torch.no_grad():
            f = normalize(text_features(model, Tokenize(32)(CAPTIONS + SWAPPED))[0].float())  # type: ignore[arg-type]
        return float((f[:4] * f[4:]).sum(-1).mean())

    after = copy.deepcopy(tiny)
    after.load_state_dict(finetune(tiny, yukino.TextHyper(steps=40, lr=2e-3, structure_lr=1e-2), Checkpoints(), print))
    assert swap_cosine(after) < swap_cosine(tiny) - 0.1


def test_oti_tokens_lower_its_loss(tiny: torch.nn.Module) -> None:
    concepts = yukino.concept_embeddings(tiny, Tokenize(32), [*COLOURS, *SHAPES])  # type: ignore[arg-type]
    targets = torch.nn.functional.normalize(torch.randn(3, 32, generator=torch.Generator().manual_seed(2)), dim=-1)

    def loss_of(v: torch.Tensor) -> float:
        with torch.no_grad():
            yes, no = prompt_features(tiny, v, 32)  # type: ignore[arg-type]
            return float(yukino_oti_loss(yes, no, targets, v, concepts).mean())

    found = yukino.oti(tiny, targets, concepts, yukino.OTIHyper(steps=30))  # type: ignore[arg-type]
    assert found.shape == (3, concepts.shape[1])
    assert loss_of(found) < loss_of(concepts.mean(0, keepdim=True).repeat(3, 1)) - 0.05


def inverter_data(tiny: torch.nn.Module, teacher: bool) -> yukino.InverterData:
    gen = torch.Generator().manual_seed(3)
    tokens = torch.nn.functional.normalize(torch.randn(8, 5, 32, generator=gen), dim=-1)
    captions = encode_texts(tiny, Tokenize(32), CAPTIONS + SWAPPED)  # type: ignore[arg-type]
    width = int(tiny.token_embedding.weight.shape[1])  # type: ignore[union-attr,index]
    taught = torch.randn(4, width, generator=gen) * 0.02 if teacher else None
    return yukino.InverterData(tokens, captions, taught)


def invert(tiny: torch.nn.Module, hyper: yukino.Hyper, checkpoints: Checkpoints, log: Callable, teacher: bool = True):
    rows = lambda step: torch.from_numpy(np.random.default_rng([0, step]).choice(8, size=6, replace=False))  # noqa: E731
    return yukino.train_inverter(tiny, "base", inverter_data(tiny, teacher), rows, hyper, runtime=Runtime(log=log),  # type: ignore[arg-type]
                                 checkpoints=checkpoints)  # fmt: skip


@pytest.mark.slow  # tens of optimisation steps
def test_the_inverter_trains_with_and_without_a_teacher(tiny: torch.nn.Module) -> None:
    data = inverter_data(tiny, teacher=False)

    def matching_loss(head: YukinoHead) -> float:
        with torch.no_grad():
            yes, no = prompt_features(tiny, head.inverter(data.tokens.flatten(1)), 32)  # type: ignore[arg-type]
            return float(yukino_matching_loss(yes, no, data.captions, 100.0))

    for teacher in (True, False):
        hyper = yukino.Hyper(steps=60, lr=1e-3, width=32, distill_weight=0.5 if teacher else 0.0)
        untrained, _ = invert(tiny, hyper, Checkpoints(stop_after=0), print, teacher)
        trained, _ = invert(tiny, hyper, Checkpoints(), print, teacher)
        assert matching_loss(trained) < matching_loss(untrained) - 0.1, teacher


def test_each_stage_resumes_to_the_uninterrupted_result(tiny: torch.nn.Module, tmp_path: Path) -> None:
    text = yukino.TextHyper(steps=6, lr=1e-3)
    logs = resumes_to_the_uninterrupted_result(lambda c, log: finetune(tiny, text, c, log), tmp_path / "text", stop=3)
    assert "yukino text: resumed from step 3" in logs
    hyper = yukino.Hyper(steps=6, lr=1e-3, width=32)
    logs = resumes_to_the_uninterrupted_result(lambda c, log: invert(tiny, hyper, c, log)[0].inverter.state_dict(),
                                               tmp_path / "inverter", stop=3)  # fmt: skip
    assert "yukino: resumed from step 3" in logs
