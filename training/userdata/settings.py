"""Every run configuration of the methods on a user's data, as data and without torch.

Each subclasses its method's ``Hyper`` (``training.methods.hyper``) and adds only what a user's
data needs (batch size, generated texts, checkpoints); the commands build their flags and read
``--config`` files from these (``training.commands.userdata``), and ``training.userdata.<method>``
trains from them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from training.methods.hyper import BaseHyper, DCSMHyper, PCClipHyper, SemClipHyper, TextHyper, YukinoHyper


@dataclass
class BaseRun(BaseHyper):
    """A base run on a user's data: ``base.Hyper`` and the batch size, the captions and where to stop."""

    batch_size: int = 128
    # Off by default: on, labelled images are also captioned by their label's declared attributes
    # (training.userdata.base_captions), which a search by attributes needs; the tutorial's
    # figures of a base trained on "a photo of a {label}." alone stay what they were.
    attribute_captions: bool = False
    stop_after: int | None = None


@dataclass
class PCClipRun(PCClipHyper):
    """PC-CLIP on a user's data: ``pcclip.Hyper`` and the pairs drawn from labelled images."""

    batch_size: int = 64
    generated_pairs: int = 2000  # pairs drawn from labelled images (each in both orders)
    make_default: bool = True  # the new variant answers requests that name no encoder
    checkpoint_every: int = 50
    stop_after: int | None = None


@dataclass
class DCSMRun(DCSMHyper):
    """DCSM on a user's data: ``dcsm.Hyper`` and the scorer's size, batch size and checkpoints."""

    batch_size: int = 32
    channels: int = 32  # scorer conv channels
    hidden: int = 128  # scorer head width
    table_seed: int = 0
    # Off by default: these items share the steps with the label and negation items, and on the
    # tutorial's photos (one training seed) "there is no shirt." then ranked shirts above the
    # other labels more often (pairwise 0.70 -> 0.31); a run that wants attribute search opts in.
    attribute_captions: bool = False
    checkpoint_every: int = 100
    stop_after: int | None = None


@dataclass
class SemClipRun(SemClipHyper):
    """SemCLIP on a user's data: ``semclip.Hyper`` and the batch size and checkpoints."""

    batch_size: int = 64
    checkpoint_every: int = 50
    stop_after: int | None = None


@dataclass
class YukinoRun(YukinoHyper):
    """YUKINO on a user's data: ``yukino.Hyper`` and the batch size, start encoder and checkpoints."""

    oti_items: int = 256
    text: TextHyper = field(default_factory=lambda: TextHyper(steps=300, lr=1e-4))
    batch_size: int = 64
    text_encoder: str | None = None  # the encoder the finetune starts from (default: the base's default)
    checkpoint_every: int = 100
    stop_after: int | None = None  # steps in all: the text finetune's, then the inverter's


@dataclass
class ComparativesRun:
    pairs: int = 3  # confused label pairs to write comparatives for
    generator: str = "template"  # or "llm"
    llm_base_url: str | None = None
    llm_model: str | None = None
    llm_key_env: str = "OPENAI_API_KEY"
    llm_samples: int = 3  # answers asked per ordered pair (each filtered)
    split: str = "val"
