"""Every method's hyperparameters, as data: one dataclass per method, without torch.

They live in one torch-free module so a command line can build its flags and read a config file
from them without loading torch (``clip-train --help`` answers at once); each method module
names its own as ``Hyper`` (``training.methods.pcclip.Hyper`` is ``PCClipHyper``) and a data
source's run configuration subclasses it, adding only its own fields (batch size, what it
renders or reads, checkpoints), so a method's hyperparameters are built once per run.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class BaseHyper:
    """Base training's own hyperparameters; a data source's run configuration subclasses it and
    adds its own fields (batch size, what it renders or reads)."""

    steps: int = 2000
    lr: float = 1e-3
    weight_decay: float = 0.1
    warmup_steps: int = 60
    text_freeze_steps: int = 300
    filip_weight: float = 0.5  # 0: no token-level term (DCSM then has little to read)
    filip_start: int | None = None  # None: where the text freeze ends
    grad_clip: float = 1.0
    checkpoint_every: int = 100
    # Warm-up + cosine over ``schedule_steps`` (default: all steps); from ``phase2_start`` on,
    # a constant ``phase2_lr_frac * lr``.
    schedule_steps: int | None = None
    phase2_start: int | None = None
    phase2_lr_frac: float = 0.1
    align_weight: float = 0.0  # token-to-object mask alignment from ``align_start`` on
    align_start: int = 0
    align_temperature: float = 0.05


@dataclass
class PCClipHyper:
    """PC-CLIP's own hyperparameters; a data source's run configuration subclasses it and adds
    its own fields."""

    steps: int = 300
    lr: float = 1e-4
    temperature: float = 0.1  # of the difference loss
    loss: str = "contrastive"  # or "mse"
    caption_weight: float = 0.3  # the image-caption loss that keeps zero-shot
    ensemble_weight: float = 1.0  # w * finetuned + (1 - w) * base


@dataclass
class SemClipHyper:
    """SemCLIP's own hyperparameters; a data source's run configuration subclasses it and adds
    its own fields."""

    steps: int = 300
    lr: float = 1e-4
    weights: tuple[float, float, float] = (1.0, 1.0, 1.0)  # clip, paraphrase, negation
    directions: int = 2  # of the random projection subspace
    normalise: bool = True
    negatives_in_clip: bool = True


@dataclass
class DCSMHyper:
    """DCSM's own hyperparameters; a data source's run configuration subclasses it and adds its
    own fields."""

    steps: int = 600  # the schedule's length
    lr: float = 2e-3
    weight_decay: float = 0.05
    warmup_steps: int = 30
    k_random: int = 2  # random in-batch candidates per anchor and side


@dataclass
class OTIHyper:
    """The per-image optimisation of OTI."""

    steps: int = 150
    lr: float = 0.02
    margin: float = 0.2
    reg_weight: float = 0.1
    batch_size: int = 256


@dataclass
class TextHyper:
    """The text finetune YUKINO matches in (0 steps: match in the start encoder as it is)."""

    steps: int = 2000
    lr: float = 1e-3
    structure_lr: float = 1e-3  # the structure encoder, trained from scratch alongside
    image_weight: float = 0.2  # the image term's weight when a structure term is there
    scale: float = 100.0


@dataclass
class YukinoHyper:
    """YUKINO's own hyperparameters (the inverter's, and its OTI teacher's and text finetune's);
    a data source's run configuration subclasses it and adds its own fields."""

    steps: int = 500
    lr: float = 3e-4
    width: int = 512
    scale: float = 100.0
    distill_weight: float = 0.5  # toward OTI's tokens, on the rows OTI taught
    oti_items: int = 1000  # images OTI teaches (0: no teacher)
    oti: OTIHyper = field(default_factory=OTIHyper)
    text: TextHyper = field(default_factory=TextHyper)
