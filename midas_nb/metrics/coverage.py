"""Part coverage: IoU of the kept patch tokens with the part patches (part mIoU) or the object box."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import Tensor

from .registry import register_metric


COVERAGE_KINDS = ("part mIoU", "box coverage")

#: A box is *informative* when it covers at most this fraction of the patch tokens. Above it, at
#: least 90 % of the tokens lie in the box, and any ranking's IoU with the box at budget ``b`` lies
#: in ``[max(0, b - (1 - f)) / f, min(b, f) / max(b, f)]``: a spread of at most ``(1 - f) / f
#: < 0.111``, the size of the effects the protocol measures, so box coverage would measure the
#: budget, not the ranking (docs/decisions/0005-informative-box.md).
INFORMATIVE_BOX_MAX_FRACTION = 0.9

#: skip reasons of :class:`PartIoU` (``skip_reasons`` keys)
SKIP_NO_PART = "no visible part"
SKIP_NO_BOX = "empty box mask"
SKIP_UNINFORMATIVE = "uninformative box"


@dataclass
class PartIoU:
    """IoU of the kept-token mask against a part (or box) mask, per image and averaged.

    Attributes:
        per_image: ``[B]`` float IoU; ``NaN`` for images skipped (no part patch).
        mean: mean of ``per_image`` over the images that were not skipped (``NaN`` if none).
        n_images: ``B``, every image seen (skipped ones included).
        n_skipped: images left out of ``mean`` (without any part / box patch, or, for box
            coverage, with an uninformative box).
        name: ``"part mIoU"`` or ``"box coverage"`` — the label to show beside the number.
        skip_reasons: ``{reason: count}`` of the skipped images (counts sum to ``n_skipped``):
            :data:`SKIP_NO_PART`, :data:`SKIP_NO_BOX`, :data:`SKIP_UNINFORMATIVE`.
    """

    per_image: Tensor
    mean: float
    n_images: int
    n_skipped: int
    name: str = "part mIoU"
    skip_reasons: dict[str, int] = field(default_factory=dict)

    @property
    def n_used(self) -> int:
        """Images that entered the mean (``n_images − n_skipped``)."""
        return self.n_images - self.n_skipped


def _mask_iou(keep_mask: Tensor, ref_mask: Tensor, name: str, skip: Tensor | None = None,
              skip_reason: str = "") -> PartIoU:
    """IoU per image; images without a reference patch, and those flagged in ``skip`` (``[B]``
    bool, counted under ``skip_reason``), are NaN and left out of the mean."""
    if keep_mask.dim() != 2 or keep_mask.shape != ref_mask.shape:
        raise ValueError(f"keep_mask and the {name} mask must both be [B,N] of the same shape, got "
                         f"{tuple(keep_mask.shape)} and {tuple(ref_mask.shape)}")
    keep, ref = keep_mask.bool(), ref_mask.bool()
    inter, union = (keep & ref).sum(1).double(), (keep | ref).sum(1).double()
    has_ref = ref.any(1)
    flagged = has_ref & skip if skip is not None else torch.zeros_like(has_ref)
    used = has_ref & ~flagged
    # union ≥ |ref| > 0 wherever ref has a patch, so the division is safe there
    per_image = torch.where(used, inter / union.clamp_min(1), torch.full_like(inter, math.nan))
    reasons = {SKIP_NO_PART if name == "part mIoU" else SKIP_NO_BOX: int((~has_ref).sum())}
    if skip is not None:
        reasons[skip_reason] = int(flagged.sum())
    reasons = {k: v for k, v in reasons.items() if v}
    mean = float(per_image[used].mean()) if bool(used.any()) else math.nan
    return PartIoU(per_image.float(), mean, int(keep.shape[0]), int((~used).sum()), name, reasons)


@register_metric("part_miou", higher_is_better=True, category="localisation",
                 reference="MIDAS (DESIGN.md §6); part keypoints of CUB-200-2011 (Wah et al., 2011)",
                 summary="IoU of the kept patch tokens with the part patches, mean over images "
                         "with ≥ 1 visible part")
def part_miou(keep_mask: Tensor, part_mask: Tensor) -> PartIoU:
    """Part mIoU: IoU of the kept-token mask with the part mask, averaged over images.

    A patch is "part" when it holds a visible part keypoint after the image's resize/crop
    (``Sample.part_mask``). Per image ``IoU = |keep ∧ part| / |keep ∨ part|``; images without a
    part patch have no defined IoU: they get ``NaN``, are left out of the mean and counted in
    ``n_skipped``.

    Args:
        keep_mask: ``[B,N]`` bool, the patch tokens the scorer keeps.
        part_mask: ``[B,N]`` bool, the part patches.

    Returns:
        :class:`PartIoU` labelled ``"part mIoU"``.

    Raises:
        ValueError: if the masks are not both ``[B,N]`` of the same shape.
    """
    return _mask_iou(keep_mask, part_mask, "part mIoU")


@register_metric("box_coverage", higher_is_better=True, category="localisation",
                 reference="MIDAS (DESIGN.md §6): part mIoU with the object box for datasets without parts",
                 summary="IoU of the kept patch tokens with the object-box patches")
def box_coverage(keep_mask: Tensor, box_mask: Tensor, *,
                 max_box_fraction: float = INFORMATIVE_BOX_MAX_FRACTION) -> PartIoU:
    """Box coverage: :func:`part_miou` computed against the object box (``Sample.box_mask``),
    over the images whose box is informative.

    For datasets without part annotations (FGVC-Aircraft, Stanford Cars). Per image
    ``IoU = |keep ∧ box| / |keep ∨ box|``. Skipped (``NaN``, left out of the mean, counted in
    ``n_skipped`` and ``skip_reasons``): images whose box mask is empty (the box left the crop,
    or the dataset blanked a known-wrong box, :data:`midas_nb.data.KNOWN_BAD_BOXES`) —
    ``"empty box mask"`` — and images whose box covers more than ``max_box_fraction`` of the
    ``N`` patch tokens — ``"uninformative box"`` (a box crop, or a close-up: the IoU then
    depends on the budget only; see :data:`INFORMATIVE_BOX_MAX_FRACTION`). The result is
    labelled ``"box coverage"`` so that it is never shown as part mIoU.

    Args:
        keep_mask: ``[B,N]`` bool, the patch tokens the scorer keeps.
        box_mask: ``[B,N]`` bool, the patches whose centre lies in the object box.
        max_box_fraction: the largest informative ``|box| / N``, in ``(0, 1]``; ``1`` keeps
            every non-empty box.

    Raises:
        ValueError: masks not both ``[B,N]`` of the same shape; ``max_box_fraction`` outside
            ``(0, 1]``.
    """
    if isinstance(max_box_fraction, bool) or not (isinstance(max_box_fraction, (int, float))
                                                  and 0 < float(max_box_fraction) <= 1):
        raise ValueError(f"max_box_fraction must be a fraction of the patch tokens in (0, 1], "
                         f"got {max_box_fraction!r}")
    skip = (box_mask.bool().sum(1).double() / box_mask.shape[1] > float(max_box_fraction)
            if box_mask.dim() == 2 and box_mask.shape[1] > 0 else None)   # None: the shape error is _mask_iou's
    return _mask_iou(keep_mask, box_mask, "box coverage", skip,
                     f"{SKIP_UNINFORMATIVE} (> {float(max_box_fraction):.0%} of the patches)")


def informative_box(box_mask: Tensor, max_box_fraction: float = INFORMATIVE_BOX_MAX_FRACTION) -> Tensor:
    """``[B]`` bool: the box mask ``[B,N]`` is non-empty and covers at most ``max_box_fraction``
    of the ``N`` patch tokens — the images :func:`box_coverage` evaluates."""
    if box_mask.dim() != 2 or box_mask.shape[1] == 0:
        raise ValueError(f"box_mask must be [B,N] with N >= 1, got {tuple(box_mask.shape)}")
    n = box_mask.bool().sum(1)
    return (n > 0) & (n.double() / box_mask.shape[1] <= float(max_box_fraction))


def iou_ceiling(ref_mask: Tensor, k: int, boxes: bool = False) -> Tensor:
    """The highest IoU any ranking can reach when it keeps ``k`` patch tokens, per image.

    Keeping exactly ``k`` tokens against a reference mask of ``|P|`` patches, the overlap is at
    most ``min(k, |P|)`` and the union at least ``max(k, |P|)``, so
    ``IoU ≤ min(k, |P|) / max(k, |P|)`` — reached by keeping the part patches first. Part mIoU
    (and box coverage) are read against this ceiling, not against 1 (notebook 00; with
    fractions ``f = |P|/N`` and ``b ≈ k/N`` it is ``min(f, b) / max(f, b)``).

    Args:
        ref_mask: ``[B,N]`` bool, the part (or box) patches.
        k: kept patch tokens, ``1 ≤ k ≤ N`` (:func:`midas_nb.backbones.vit.keep_count`).
        boxes: ``ref_mask`` holds object boxes: ``NaN`` also where :func:`informative_box` is false (the
            images box coverage leaves out).

    Returns:
        ``[B]`` float; ``NaN`` for images without a reference patch (skipped by the metrics).

    Raises:
        ValueError: ``ref_mask`` is not ``[B,N]`` or ``k`` is outside ``1..N``.
    """
    if ref_mask.dim() != 2:
        raise ValueError(f"ref_mask must be [B,N], got {tuple(ref_mask.shape)}")
    n = ref_mask.shape[1]
    if not 1 <= int(k) <= n:
        raise ValueError(f"k must be in 1..{n} (kept patch tokens), got {k!r}")
    p = ref_mask.bool().sum(1).float()
    kk = torch.full_like(p, float(k))
    ceil = torch.minimum(p, kk) / torch.maximum(p, kk)
    keep = (p > 0) & informative_box(ref_mask) if boxes else p > 0
    return torch.where(keep, ceil, torch.full_like(p, math.nan))
