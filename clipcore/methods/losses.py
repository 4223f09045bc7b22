"""Training losses and weight ensembling (torch).

Every training loss of every method lives here (contrastive, PC-CLIP, SemCLIP, YUKINO, the dense
FILIP and mask-alignment terms of base training, DCSM); the serving math is in the numpy modules.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Literal

import torch
import torch.nn.functional as F

from clipcore.methods.common import check_finite_scalar
from clipcore.methods.dcsm import DCSMScorer, _cosines, candidate_pairs, finish_maps

__all__ = [
    "clip_contrastive_loss",
    "dcsm_batch_loss",
    "dcsm_caption_negatives_loss",
    "dcsm_loss",
    "filip_loss",
    "mask_alignment_loss",
    "pcclip_difference_loss",
    "semclip_loss",
    "weight_ensemble",
    "yukino_matching_loss",
    "yukino_oti_loss",
]

_EPS = 1e-12


def _check_batch(name: str, x: torch.Tensor) -> None:
    if not isinstance(x, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if x.ndim != 2 or x.shape[0] == 0 or x.shape[1] == 0:
        raise ValueError(f"{name} must be a non-empty (B, D) tensor, got shape {tuple(x.shape)}")


def _check_same_shape(**tensors: torch.Tensor) -> None:
    for name, x in tensors.items():
        _check_batch(name, x)
    shapes = {name: tuple(x.shape) for name, x in tensors.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"inputs must share one (B, D) shape, got {shapes}")


def clip_contrastive_loss(
    a: torch.Tensor, b: torch.Tensor, logit_scale: float | torch.Tensor, exclude: torch.Tensor | None = None
) -> torch.Tensor:
    """Symmetric CLIP cross-entropy between two batches of paired embeddings.

    With ``logits = logit_scale * a @ b.T`` the loss is
    ``(CE(logits, arange(B)) + CE(logits.T, arange(B))) / 2``: row ``i`` of ``a`` must pick its
    partner ``b[i]`` among all of ``b`` and vice versa, which pulls pairs together and pushes
    every other combination in the batch apart.

    Args:
        a: ``(B, D)`` L2-normalised embeddings.
        b: ``(B, D)`` L2-normalised embeddings paired row by row with ``a``.
        logit_scale: inverse temperature, a positive float or a scalar tensor (which may be a
            learnable value; it is then not checked, to avoid a device sync).
        exclude: optional ``(B, B)`` bool, True where ``(a_i, b_j)`` is not a negative (dropped
            from both softmaxes); the diagonal must stay False.

    Raises:
        ValueError: on mismatched shapes, a bad ``logit_scale`` or a bad ``exclude``.
    """
    _check_same_shape(a=a, b=b)
    n = a.shape[0]
    if exclude is not None and (exclude.shape != (n, n) or exclude.dtype != torch.bool or exclude.diagonal().any()):
        raise ValueError(f"exclude must be a ({n}, {n}) bool tensor with a False diagonal")
    if isinstance(logit_scale, torch.Tensor):
        if logit_scale.numel() != 1:
            raise ValueError("logit_scale tensor must hold a single value")
        scale: float | torch.Tensor = logit_scale.reshape(())
    else:
        scale = check_finite_scalar(logit_scale, "logit_scale")
        if scale <= 0:
            raise ValueError(f"logit_scale must be a positive finite number, got {logit_scale!r}")
    logits = scale * (a @ b.T)
    if exclude is not None:
        logits = logits.masked_fill(exclude.to(logits.device), float("-inf"))
    targets = torch.arange(n, device=a.device)
    return (F.cross_entropy(logits, targets) + F.cross_entropy(logits.T, targets)) / 2


def pcclip_difference_loss(
    img1: torch.Tensor,
    img2: torch.Tensor,
    text: torch.Tensor,
    temperature: float,
    kind: Literal["contrastive", "mse"] = "contrastive",
) -> torch.Tensor:
    """PC-CLIP loss aligning image differences with the texts that describe them.

    ``text[i]`` describes how image 1 differs from image 2 ("the first ..., while the second
    ...").

    * ``"contrastive"``: :func:`clip_contrastive_loss` between ``normalize(img1 - img2)`` and
      ``normalize(text)`` with ``logit_scale = 1 / temperature`` (temperature 1.0 in the paper).
    * ``"mse"``: ``mean((normalize(text) - (img1 - img2))^2)`` over all ``B * D`` entries. The
      difference is deliberately not normalised: it regresses ``f(T12)`` onto
      ``g(I1) - g(I2)`` itself. ``temperature`` is validated but unused.

    Identical images give a zero difference; normalisation divides by ``max(norm, 1e-12)``, so
    that row becomes zero instead of NaN (in value and gradient).

    Args:
        img1, img2: ``(B, D)`` L2-normalised image embeddings (frozen in PC-CLIP).
        text: ``(B, D)`` text embeddings (normalised here).
        temperature: positive softmax temperature of the contrastive variant.
        kind: ``"contrastive"`` or ``"mse"``.

    Raises:
        ValueError: on mismatched shapes, a non-positive temperature or an unknown ``kind``.
    """
    _check_same_shape(img1=img1, img2=img2, text=text)
    temperature = check_finite_scalar(temperature, "temperature")
    if temperature <= 0:
        raise ValueError(f"temperature must be a positive finite number, got {temperature}")
    text_n = F.normalize(text, dim=-1, eps=_EPS)
    diff = img1 - img2
    if kind == "contrastive":
        diff_n = F.normalize(diff, dim=-1, eps=_EPS)
        return clip_contrastive_loss(diff_n, text_n, 1.0 / temperature)
    if kind == "mse":
        return F.mse_loss(text_n, diff)
    raise ValueError(f"kind must be 'contrastive' or 'mse', got {kind!r}")


def semclip_loss(
    images: torch.Tensor,
    originals: torch.Tensor,
    paraphrases: torch.Tensor,
    negations: torch.Tensor,
    directions: torch.Tensor,
    logit_scale: float,
    weights: tuple[float, float, float] = (1.0, 1.0, 1.0),
    normalise: bool = True,
    negatives_in_clip: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """SemCLIP: ``(a L_clip + b L_para + c L_neg) / (a + b + c)``.

    Text embeddings are L2-normalised, projected onto the ``(n, D)`` orthonormal ``directions``
    and (with ``normalise``) normalised again, giving ``p(t)``. Then
    ``L_para = mean(1 - cos(p(t), p(t+)))``, ``L_neg = mean(max(0, cos(p(t), p(t-))))`` and
    ``L_clip`` is the symmetric contrastive loss of images and original captions; with
    ``negatives_in_clip`` every image also has to prefer its caption to all the negations of the
    batch (the negations become extra candidates on the image-to-text side), so what the
    subspace losses separate is also separated from the image.

    Returns the loss and its three parts as floats (for logs).
    """
    _check_same_shape(images=images, originals=originals, paraphrases=paraphrases, negations=negations)
    a, b, c = (check_finite_scalar(w, "weight") for w in weights)
    if min(a, b, c) < 0 or a + b + c <= 0:
        raise ValueError(f"weights must be non-negative with a positive sum, got {weights}")
    t, tp, tn = (F.normalize(x, dim=-1, eps=_EPS) for x in (originals, paraphrases, negations))

    def project(x: torch.Tensor) -> torch.Tensor:
        p = x @ directions.T
        return F.normalize(p, dim=-1, eps=_EPS) if normalise else p

    pt, ptp, ptn = project(t), project(tp), project(tn)
    img = F.normalize(images, dim=-1, eps=_EPS)
    if negatives_in_clip:
        targets = torch.arange(img.shape[0], device=img.device)
        i2t = logit_scale * img @ torch.cat([t, tn]).T
        l_clip = (F.cross_entropy(i2t, targets) + F.cross_entropy(logit_scale * t @ img.T, targets)) / 2
    else:
        l_clip = clip_contrastive_loss(img, t, logit_scale)
    l_para = (1 - F.cosine_similarity(pt, ptp, dim=-1, eps=_EPS)).mean()
    l_neg = F.relu(F.cosine_similarity(pt, ptn, dim=-1, eps=_EPS)).mean()
    loss = (a * l_clip + b * l_para + c * l_neg) / (a + b + c)
    return loss, {"clip": l_clip.item(), "para": l_para.item(), "neg": l_neg.item()}


def yukino_oti_loss(
    yes: torch.Tensor,
    no: torch.Tensor,
    images: torch.Tensor,
    pseudo: torch.Tensor,
    concepts: torch.Tensor,
    margin: float = 0.2,
    reg_weight: float = 0.1,
) -> torch.Tensor:
    """Per-image loss of YUKINO's optimisation-based textual inversion, shape ``(B,)``.

    ``(1 - cos(yes, g)) + max(0, cos(no, g) - cos(yes, g) + margin) + reg_weight * reg``: the
    "a photo of $" prompt is pulled toward the image embedding ``g``, the "a photo of no $" prompt
    kept at least ``margin`` further away, and ``reg = 1 - max_k cos(v*, concept_k)`` keeps the
    pseudo-token near the embeddings of real concept words (``concepts``, ``(K, W)``).
    """
    _check_same_shape(yes=yes, no=no, images=images)
    cos_yes, cos_no = (F.cosine_similarity(x, images, dim=-1, eps=_EPS) for x in (yes, no))
    reg = 1 - F.cosine_similarity(pseudo[:, None], concepts[None], dim=-1, eps=_EPS).max(dim=1).values
    return (1 - cos_yes) + F.relu(cos_no - cos_yes + margin) + reg_weight * reg


def yukino_matching_loss(yes: torch.Tensor, no: torch.Tensor, captions: torch.Tensor, scale: float) -> torch.Tensor:
    """Contrastive loss of the distilled inverter on YUKINO's matching score, both ways.

    ``score[i, j] = cos(yes_i, c_j) - cos(no_i, c_j)``, with caption ``j`` true of image ``j``.
    Each image must pick its caption among the batch's (text side) and each caption its image
    (image side). Batches are meant to hold both images and both captions of hard-negative
    pairs, so the swapped caption and the swapped image are always among the candidates: the
    2x2 text and image scores are what the two terms train.
    """
    _check_same_shape(yes=yes, no=no, captions=captions)
    # The CLIP loss over (yes - no, captions) is exactly these two sides; it averages them, this sums.
    return 2 * clip_contrastive_loss(yes - no, captions, scale)


def weight_ensemble(
    base: Mapping[str, torch.Tensor], finetuned: Mapping[str, torch.Tensor], w: float
) -> dict[str, torch.Tensor]:
    """Interpolate two state dicts in weight space: ``w * finetuned + (1 - w) * base``.

    Blending the fine-tuned weights with the base weights keeps most of the fine-tuning gain
    while recovering robustness of the base model. Keys present only in ``base`` (e.g. a frozen
    image tower when only the text tower was fine-tuned) are copied from ``base``. Tensors that
    are not floating point (counters, index buffers) cannot be interpolated and are taken from
    the nearer end: ``finetuned`` if ``w >= 0.5`` else ``base``. Results have the dtype and
    device of ``base``; the inputs are not modified and the results share no memory with them.

    Raises:
        ValueError: if ``w`` is outside ``[0, 1]``, a key exists only in ``finetuned``, or
            matching keys differ in shape.
    """
    w = check_finite_scalar(w, "w")
    if not 0.0 <= w <= 1.0:
        raise ValueError(f"w must be in [0, 1], got {w}")
    extra = sorted(set(finetuned) - set(base))
    if extra:
        raise ValueError(f"finetuned has keys missing from base: {extra[:5]}")
    out: dict[str, torch.Tensor] = {}
    with torch.no_grad():
        for key, b in base.items():
            if key not in finetuned:
                out[key] = b.detach().clone()
                continue
            ft = finetuned[key]
            if tuple(ft.shape) != tuple(b.shape):
                raise ValueError(f"shape mismatch for {key!r}: base {tuple(b.shape)}, finetuned {tuple(ft.shape)}")
            ft = ft.detach().to(device=b.device, dtype=b.dtype)
            if b.is_floating_point() or b.is_complex():
                out[key] = w * ft + (1.0 - w) * b.detach()
            else:
                out[key] = (ft if w >= 0.5 else b.detach()).clone()
    return out


# ---------------------------------------------------------------- dense (token x patch) losses
def filip_loss(
    img_tok: torch.Tensor, txt_tok: torch.Tensor, txt_mask: torch.Tensor, logit_scale: torch.Tensor
) -> torch.Tensor:
    """Token-level (FILIP) contrastive loss between patch tokens and word tokens.

    sim[i, j] = mean over words t of text j of max over patches p of image i of cos(p, t),
    and the image-side counterpart; symmetric cross-entropy over the batch.
    """
    img = F.normalize(img_tok[:, 1:], dim=-1)  # patches only
    txt = F.normalize(txt_tok, dim=-1)
    sim = torch.einsum("ipd,jtd->ijpt", img, txt)  # (Bi, Bj, P, T)
    mask = txt_mask[None, :, None, :]
    t2i = sim.max(dim=2).values  # (Bi, Bj, T): best patch per word
    t2i = (t2i * txt_mask[None]).sum(-1) / txt_mask.sum(-1)[None].clamp(min=1)
    i2t = sim.masked_fill(~mask, -1e4).max(dim=3).values.mean(-1)  # (Bi, Bj): best word per patch
    labels = torch.arange(img.shape[0], device=img.device)
    return (F.cross_entropy(logit_scale * t2i.T, labels) + F.cross_entropy(logit_scale * i2t, labels)) / 2


def mask_alignment_loss(
    patch_tok: torch.Tensor,
    text_tok: torch.Tensor,
    rows: torch.Tensor,
    cols: torch.Tensor,
    targets: torch.Tensor,
    temperature: float = 0.05,
) -> torch.Tensor:
    """Cross-entropy between each named token's patch softmax and its object's mask.

    ``patch_tok`` (B, P, D) patch tokens (no class token), ``text_tok`` (B, L, D); both are
    normalised here.
    """
    if rows.numel() == 0:
        return patch_tok.sum() * 0.0
    patches = F.normalize(patch_tok, dim=-1)[rows]  # (N, P, D)
    words = F.normalize(text_tok, dim=-1)[rows, cols]  # (N, D)
    logits = torch.einsum("npd,nd->np", patches, words) / temperature
    return -(targets.to(logits.device) * F.log_softmax(logits, dim=-1)).sum(-1).mean()


def dcsm_loss(image_scores: torch.Tensor, text_scores: torch.Tensor) -> torch.Tensor:
    """Symmetric cross-entropy over candidate sets; column 0 of each row is the positive.

    ``image_scores[a, c]``: anchor a's image with its c-th candidate text;
    ``text_scores[a, c]``: anchor a's text with its c-th candidate image.
    """
    target = torch.zeros(image_scores.shape[0], dtype=torch.long, device=image_scores.device)
    return (F.cross_entropy(image_scores, target) + F.cross_entropy(text_scores, target)) / 2


def dcsm_batch_loss(
    scorer: DCSMScorer,
    img_tok: torch.Tensor,
    txt_tok: torch.Tensor,
    valid: torch.Tensor,
    row_index: torch.Tensor,
    table: torch.Tensor,
    k: int = 2,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Loss of a batch of interleaved anchors (see ``candidate_pairs``) and its 2-way accuracy.

    Each image is scored against its caption, its hard negative and k random captions; each
    caption against its image, the hard-negative image and k random images. Token features
    must be L2-normalised (as ``DenseEncoder`` returns them): cosines are dot products here,
    which saves a third of the map cost in training. The image side already holds every
    pair of an item's 2x2 block, so the text side only adds its randoms.
    """
    n2 = img_tok.shape[0]
    cand = candidate_pairs(n2 // 2, k, generator).to(img_tok.device)
    anchors = torch.arange(n2, device=img_tok.device)
    c = cand.shape[1]
    length, n_img = txt_tok.shape[1], img_tok.shape[1]
    # Image side: image a with texts cand[a], one (c*L, D) x (D, 1+P) product per image.
    texts = txt_tok[cand].reshape(n2, c * length, -1)
    t = cand.reshape(-1)
    image_scores = scorer(finish_maps(_cosines(img_tok, texts, True).reshape(n2 * c, length, n_img),
                                      valid[t], row_index[t], table)).reshape(n2, c)  # fmt: skip
    pos, cross = image_scores[:, 0], image_scores[:, 1]  # cross[a] = (image a, text a^1)
    # Text a against image a^1 is the pair (image a^1, text a) = cross[a^1].
    text_scores = torch.cat([pos[:, None], cross[anchors ^ 1][:, None]], dim=1)
    if k > 0:  # text side randoms: text a with images cand[a, 2:]
        images = img_tok[cand[:, 2:]].reshape(n2, k * n_img, -1)
        side = _cosines(images, txt_tok, True).reshape(n2, length, k, n_img).transpose(1, 2)
        t = anchors.repeat_interleave(k)
        maps = finish_maps(side.reshape(n2 * k, length, n_img), valid[t], row_index[t], table)
        text_scores = torch.cat([text_scores, scorer(maps).reshape(n2, k)], dim=1)
    accuracy = (pos > cross).float().mean()
    return dcsm_loss(image_scores, text_scores), accuracy


def dcsm_caption_negatives_loss(
    scorer: DCSMScorer,
    img_tok: torch.Tensor,
    cand_tok: torch.Tensor,
    cand_valid: torch.Tensor,
    cand_rows: torch.Tensor,
    image_cand: torch.Tensor,
    table: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """DCSM loss when hard negatives are captions only (a user's data has no negative images).

    ``img_tok`` (B, 1+P, D) images; ``cand_tok`` (B, C, L, D) each image's candidate texts with
    ``cand_valid`` / ``cand_rows`` (B, C, L): column 0 its caption, column 1 a hard negative of
    it, then any other texts (other items' captions). ``image_cand`` (B, K) indices into the batch:
    column 0 the item itself, then other images its caption is contrasted with. Features must be
    L2-normalised. Returns the symmetric loss and the share of images that score their caption
    above its hard negative.
    """
    b, c, length, d = cand_tok.shape
    n_img = img_tok.shape[1]
    sim = _cosines(img_tok[:, None], cand_tok, True).reshape(b * c, length, n_img)
    image_scores = scorer(finish_maps(sim, cand_valid.reshape(b * c, length), cand_rows.reshape(b * c, length),
                                      table)).reshape(b, c)  # fmt: skip
    k = image_cand.shape[1]
    images = img_tok[image_cand]  # (B, K, 1+P, D)
    side = _cosines(images, cand_tok[:, :1], True).reshape(b * k, length, n_img)
    valid = cand_valid[:, :1].expand(b, k, length).reshape(b * k, length)
    rows = cand_rows[:, :1].expand(b, k, length).reshape(b * k, length)
    text_scores = scorer(finish_maps(side, valid, rows, table)).reshape(b, k)
    accuracy = (image_scores[:, 0] > image_scores[:, 1]).float().mean()
    return dcsm_loss(image_scores, text_scores), accuracy
