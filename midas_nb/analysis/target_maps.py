"""The target maps ``{id: [M,N]}`` measured on their own, before any scorer learns them: coverage, the IoU
ceiling, insertion/deletion and Point-in-Box (notebooks 01, 02, 04, 06, through the study's methods of the
same names: ``Study.target_coverage``, ``iou_ceiling``, ``insertion_deletion``, ``point_in_box``)."""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import pandas as pd
import torch
from torch import Tensor, nn

from ..backbones.vit import grid_size, keep_count
from ..data import Batch, evaluation_subset
from ..metrics import (bootstrap_ci, box_coverage, InsDel, insertion_deletion_auc, iou_ceiling, part_miou, point_in_box)
from ..pruning import keep_mask_from_indices, select_top_k
from ..targets import LAST_VOTES_K
from .last import pib_columns, pib_table

__all__ = ["target_coverage", "iou_ceiling_table", "target_insdel", "target_pib_table"]


def _reference(test_set: Any, images: Sequence[int]) -> Tensor:
    """``[M,N]`` bool: the part masks of ``images``, their box masks on a set without part keypoints."""
    return torch.stack([test_set[i].part_mask if test_set.has_parts else test_set[i].box_mask for i in images])


def target_coverage(maps: Mapping[str, Tensor], test_set: Any, budget: float, *, n_boot: int = 1000) -> pd.DataFrame:
    """Part mIoU (:func:`midas_nb.metrics.part_miou`; box coverage on a set without part keypoints) of each
    map's own top ``k = ceil(b·N)`` patch tokens; ``maps``: ``{id: [M,N]}`` over every image of ``test_set``,
    in its order; ``budget``: the kept fraction ``b``.

    Returns one row per map: ``target``, ``miou``, ``miou_lo``, ``miou_hi`` (bootstrap 95 % CI over images,
    ``n_boot`` resamples), ``n_images``, ``n_skipped``, ``coverage_kind``, ``budget``, ``image_ids``,
    ``miou_per_image``. Raises ``ValueError``: ``budget`` not in ``(0, 1]`` (:func:`~midas_nb.backbones.vit.keep_count`).
    """
    ref = _reference(test_set, range(len(test_set)))
    metric = part_miou if test_set.has_parts else box_coverage
    rows = []
    for k, v in maps.items():
        keep = keep_mask_from_indices(select_top_k(v.float(), keep_count(budget, v.shape[1])), v.shape[1])
        r = metric(keep, ref)
        mean, lo, hi = bootstrap_ci(r.per_image, n_boot=n_boot)
        rows.append(dict(target=k, miou=mean, miou_lo=lo, miou_hi=hi, n_images=r.n_images, n_skipped=r.n_skipped,
                         coverage_kind=r.name, budget=float(budget), image_ids=list(test_set.image_ids),
                         miou_per_image=[float(x) for x in r.per_image]))
    return pd.DataFrame(rows)


def iou_ceiling_table(test_set: Any, budgets: Sequence[float], *, max_images: int | None = None,
                      subset_seed: int = 0) -> pd.DataFrame:
    """The best part mIoU (box coverage) any ranking reaches at each of ``budgets`` (kept fractions): the mean
    of :func:`midas_nb.metrics.iou_ceiling` at ``k = ceil(b·N)`` over the images coverage evaluates
    (:func:`midas_nb.data.evaluation_subset` of ``max_images``, ``None``: all, drawn with ``subset_seed``).

    Returns one row per budget: ``budget``, ``k``, ``ceiling``, ``n_images`` (those with a reference patch),
    ``coverage_kind``. Raises ``ValueError``: a budget not in ``(0, 1]``.
    """
    ref = _reference(test_set, evaluation_subset(len(test_set), max_images, subset_seed))
    rows = []
    for b in budgets:
        k = keep_count(b, ref.shape[1])
        c = iou_ceiling(ref, k, boxes=not test_set.has_parts)
        rows.append(dict(budget=float(b), k=k, ceiling=float(c.nanmean()), n_images=int(c.isfinite().sum()),
                         coverage_kind="part mIoU" if test_set.has_parts else "box coverage"))
    return pd.DataFrame(rows)


def target_insdel(model: nn.Module, batch: Batch, maps: Mapping[str, Tensor], *, steps: int,
                  device: str | torch.device = "cpu") -> dict[str, InsDel]:
    """``{id: InsDel}``: insertion/deletion curves (:func:`midas_nb.metrics.insertion_deletion_auc`, ``steps``
    steps, on ``device``) of ``model`` on ``batch.images`` ``[B,3,H,W]``, ranked by rows ``batch.indices`` of
    each map ``{id: [M,N]}``."""
    images = batch.images.to(device)
    return {k: insertion_deletion_auc(model, images, v[batch.indices].to(device), steps=steps, device=device)
            for k, v in maps.items()}


def target_pib_table(model: nn.Module, test_set: Any, maps: Mapping[str, Tensor], *, max_images: int | None = None,
                     subset_seed: int = 0, device: str | torch.device = "cpu", n_boot: int = 1000) -> pd.DataFrame:
    """Point-in-Box (DESIGN.md §6; Shi et al., 2026, LaSt-ViT) of ``model``'s Patch Score (:func:`~.last.pib_table`)
    and of each map's top patch (:func:`midas_nb.metrics.point_in_box`; ``maps``: ``{id: [M,N]}`` over every
    image of ``test_set``, in its order) on the same seeded ``max_images`` (``None``: all).

    Returns ``patch_score``'s row, then one per map: ``ranking``, ``pib``, ``pib_lo``, ``pib_hi`` (95 % CI,
    ``n_boot`` resamples), ``pib_centre``, ``pib_box_area``, ``n_images``, ``last_K`` (``last_votes`` only).
    """
    subset = evaluation_subset(len(test_set), max_images, subset_seed)
    pib = pib_table({"patch_score": model}, test_set, max_images=max_images, subset_seed=subset_seed, device=device,
                    n_boot=n_boot, progress=False)
    cols = ["pib", "pib_lo", "pib_hi", "pib_centre", "pib_box_area"]
    rows = [dict(ranking="patch_score", **{c: pib.at[0, c] for c in cols}, n_images=len(subset))]
    box = torch.stack([test_set[i].box_mask for i in subset])
    for k, v in maps.items():
        hits = point_in_box(v[subset].float(), box)
        rows.append(dict(ranking=k, **pib_columns(hits, box, grid_size(model), n_boot=n_boot), n_images=len(subset),
                         **({"last_K": LAST_VOTES_K} if k == "last_votes" else {})))
    return pd.DataFrame(rows)
