"""Part coverage: IoU of the kept patch tokens with the part patches (part mIoU) or the object box."""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from .registry import register_metric


COVERAGE_KINDS = ("part mIoU", "box coverage")


@dataclass
class PartIoU:
    """IoU of the kept-token mask against a part (or box) mask, per image and averaged.

    Attributes:
        per_image: ``[B]`` float IoU; ``NaN`` for images skipped (no part patch).
        mean: mean of ``per_image`` over the images that were not skipped (``NaN`` if none).
        n_images: ``B``, every image seen (skipped ones included).
        n_skipped: images without any part patch, left out of ``mean``.
        name: ``"part mIoU"`` or ``"box coverage"`` — the label to show beside the number.
    """

    per_image: Tensor
    mean: float
    n_images: int
    n_skipped: int
    name: str = "part mIoU"

    @property
    def n_used(self) -> int:
        """Images that entered the mean (``n_images − n_skipped``)."""
        return self.n_images - self.n_skipped


def _mask_iou(keep_mask: Tensor, ref_mask: Tensor, name: str) -> PartIoU:
    if keep_mask.dim() != 2 or keep_mask.shape != ref_mask.shape:
        raise ValueError(f"keep_mask and the {name} mask must both be [B,N] of the same shape, got "
                         f"{tuple(keep_mask.shape)} and {tuple(ref_mask.shape)}")
    keep, ref = keep_mask.bool(), ref_mask.bool()
    inter = (keep & ref).sum(1).double()
    union = (keep | ref).sum(1).double()
    has_ref = ref.any(1)
    # union ≥ |ref| > 0 wherever ref has a patch, so the division is safe there
    per_image = torch.where(has_ref, inter / union.clamp_min(1), torch.full_like(inter, math.nan))
    n_skipped = int((~has_ref).sum())
    mean = float(per_image[has_ref].mean()) if bool(has_ref.any()) else math.nan
    return PartIoU(per_image.float(), mean, int(keep.shape[0]), n_skipped, name)


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
                 reference="MIDAS (DESIGN.md §6): part mIoU with the object box for datasets "
                           "without parts",
                 summary="IoU of the kept patch tokens with the object-box patches")
def box_coverage(keep_mask: Tensor, box_mask: Tensor) -> PartIoU:
    """Box coverage: :func:`part_miou` computed against the object box (``Sample.box_mask``).

    For datasets without part annotations (FGVC-Aircraft, Stanford Cars). Same computation and
    skipping rule (images whose box covers no patch are skipped); the result is labelled
    ``"box coverage"`` so that it is never shown as part mIoU.
    """
    return _mask_iou(keep_mask, box_mask, "box coverage")


def iou_ceiling(ref_mask: Tensor, k: int) -> Tensor:
    """The highest IoU any ranking can reach when it keeps ``k`` patch tokens, per image.

    Keeping exactly ``k`` tokens against a reference mask of ``|P|`` patches, the overlap is at
    most ``min(k, |P|)`` and the union at least ``max(k, |P|)``, so
    ``IoU ≤ min(k, |P|) / max(k, |P|)`` — reached by keeping the part patches first. Part mIoU
    (and box coverage) are read against this ceiling, not against 1 (notebook 00; with
    fractions ``f = |P|/N`` and ``b ≈ k/N`` it is ``min(f, b) / max(f, b)``).

    Args:
        ref_mask: ``[B,N]`` bool, the part (or box) patches.
        k: kept patch tokens, ``1 ≤ k ≤ N`` (:func:`midas_nb.vit.keep_count`).

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
    return torch.where(p > 0, ceil, torch.full_like(p, math.nan))
