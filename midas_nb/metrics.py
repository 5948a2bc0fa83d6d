"""Metrics of the MIDAS analysis (DESIGN.md §6), each with its direction and its source.

Every metric is registered with Quantus-style metadata (Hedström et al., 2023, Quantus,
https://arxiv.org/abs/2202.06861): whether a higher value is better, its category and the
paper it comes from. ``list_metrics()`` / ``get_metric(name)`` give access to them.

==========================  ==============  ===========================================
metric                      higher better   source
==========================  ==============  ===========================================
``part_miou``               yes             IoU of kept tokens vs part patches (MIDAS)
``box_coverage``            yes             the same IoU against the object box
``insertion_deletion_auc``  yes (IDAUC)     Petsiuk et al., 2018, RISE, arXiv:1806.07421
``decoupling_D``            yes             MIDAS: D = mIoU_t − mIoU_ref in the IDAUC band
``point_in_box``            yes             Shi et al., 2026, LaSt-ViT, arXiv:2602.22394
``pruned_accuracy``         yes             top-1 accuracy of the pruned model
``throughput``              yes             images per second, device-synchronised
==========================  ==============  ===========================================

Helpers: ``patch_score`` (the LaSt-ViT map behind ``point_in_box``), ``curve_auc``
(trapezoid rule), ``gaussian_blur`` (the RISE insertion substrate) and ``bootstrap_ci``
(percentile bootstrap over images, Efron & Tibshirani, 1993, *An Introduction to the
Bootstrap*, ch. 13).

Shapes: ``B`` images, ``N`` patch tokens (row-major over the patch grid, prefix tokens
excluded), ``T = P + N`` tokens, ``D`` embedding width, ``S`` insertion/deletion steps.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .vit import classify_tokens, embed_tokens, gather_tokens, grid_size, num_prefix_tokens, run_blocks

__all__ = [
    "MetricSpec",
    "register_metric",
    "list_metrics",
    "get_metric",
    "PartIoU",
    "part_miou",
    "box_coverage",
    "InsDel",
    "insertion_deletion_auc",
    "insertion_counts",
    "curve_auc",
    "gaussian_blur",
    "decoupling_D",
    "D_STATUSES",
    "hierarchical_bootstrap",
    "patch_score",
    "point_in_box",
    "pruned_accuracy",
    "measure_throughput",
    "bootstrap_ci",
    "COVERAGE_KINDS",
]

MetricCategory = Literal["localisation", "faithfulness", "decoupling", "accuracy", "efficiency"]


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """A registered metric: the function and its metadata.

    Attributes:
        name: registry key.
        fn: the function computing it.
        higher_is_better: direction of the headline value.
        category: ``"localisation" | "faithfulness" | "decoupling" | "accuracy" | "efficiency"``.
        reference: the source (paper and arXiv link, or the MIDAS definition).
        summary: a one-line definition.
        field_directions: for metrics that return several values, ``{field: higher_is_better}``
            (e.g. ``insertion_deletion_auc``: ``ins_auc`` ↑, ``del_auc`` ↓, ``idauc`` ↑).
    """

    name: str
    fn: Callable[..., Any]
    higher_is_better: bool
    category: MetricCategory
    reference: str
    summary: str
    field_directions: Mapping[str, bool] = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


_METRICS: dict[str, MetricSpec] = {}


def register_metric(
    name: str,
    *,
    higher_is_better: bool,
    category: MetricCategory,
    reference: str,
    summary: str,
    field_directions: Mapping[str, bool] | None = None,
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``fn`` under ``name``; also sets ``fn.higher_is_better``."""

    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in _METRICS:
            raise ValueError(f"metric {name!r} is already registered")
        _METRICS[name] = MetricSpec(name, fn, higher_is_better, category, reference, summary,
                                    dict(field_directions or {}))
        fn.higher_is_better = higher_is_better  # type: ignore[attr-defined]
        fn.metric_reference = reference  # type: ignore[attr-defined]
        return fn

    return deco


def list_metrics(category: MetricCategory | None = None) -> list[str]:
    """Names of the registered metrics (optionally of one ``category``), in registration order."""
    return [n for n, m in _METRICS.items() if category is None or m.category == category]


def get_metric(name: str) -> MetricSpec:
    """The :class:`MetricSpec` registered under ``name``.

    Raises:
        ValueError: for an unknown name (the message lists the known ones).
    """
    if name not in _METRICS:
        raise ValueError(f"unknown metric {name!r}; expected one of {list_metrics()}")
    return _METRICS[name]


# ---------------------------------------------------------------------------------------------
# part coverage
# ---------------------------------------------------------------------------------------------
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


# ---------------------------------------------------------------------------------------------
# insertion / deletion
# ---------------------------------------------------------------------------------------------
@dataclass
class InsDel:
    """Insertion and deletion curves of ``p_c`` and their areas.

    Attributes:
        ins_auc: ``[B]`` area under the insertion curve.
        del_auc: ``[B]`` area under the deletion curve.
        idauc: ``[B]`` ``ins_auc − del_auc``.
        fractions: ``[S+1]`` ``k_s / N``: the fraction of patch tokens inserted (insertion
            curve) or deleted (deletion curve) at step ``s``; runs from 0 to 1.
        ins_curve: ``[B,S+1]`` ``p_c`` with the top-``k_s`` ranked patches present.
        del_curve: ``[B,S+1]`` ``p_c`` with the top-``k_s`` ranked patches removed.
        class_index: ``[B]`` the class ``c`` whose probability was tracked.
        space: ``"token"`` or ``"pixel"``.
    """

    ins_auc: Tensor
    del_auc: Tensor
    idauc: Tensor
    fractions: Tensor
    ins_curve: Tensor
    del_curve: Tensor
    class_index: Tensor
    space: str = "token"

    @property
    def steps(self) -> int:
        """Number of steps ``S``."""
        return int(self.fractions.numel()) - 1


def insertion_counts(n_patches: int, steps: int) -> list[int]:
    """``k_s = round(s·N/S)`` for ``s = 0..S``, halves rounded up (integer arithmetic).

    Raises:
        ValueError: if ``steps < 1`` or ``n_patches < 1``.
    """
    if steps < 1 or n_patches < 1:
        raise ValueError(f"need steps ≥ 1 and n_patches ≥ 1, got steps={steps}, n_patches={n_patches}")
    return [(2 * s * n_patches + steps) // (2 * steps) for s in range(steps + 1)]


def curve_auc(curve: Tensor, fractions: Tensor) -> Tensor:
    """Trapezoid-rule area under ``curve [..., S+1]`` over ``fractions [S+1]`` (``0..1``).

    Returns ``[...]`` in the curve's units (a probability: the AUC lies in ``[0, 1]``).
    """
    if curve.shape[-1] != fractions.numel():
        raise ValueError(f"curve has {curve.shape[-1]} points but fractions has {fractions.numel()}")
    return torch.trapezoid(curve, fractions.to(curve), dim=-1)


def gaussian_blur(images: Tensor, sigma: float = 5.0, kernel_size: int = 11) -> Tensor:
    """Separable Gaussian blur of ``images [B,C,H,W]`` with reflect padding; same shape.

    The kernel is ``exp(−x²/2σ²)`` on ``x = −r..r``, ``r = kernel_size // 2``, normalised to sum
    1 — the same as ``scipy.ndimage.gaussian_filter(sigma=σ, truncate=r/σ, mode="mirror")``.
    Defaults (σ = 5 px, 11 taps) are those of RISE's insertion substrate (Petsiuk et al., 2018,
    https://arxiv.org/abs/1806.07421, official code ``gkern(11, 5)``).

    Raises:
        ValueError: for an even or non-positive ``kernel_size`` or ``sigma ≤ 0``.
    """
    if kernel_size < 1 or kernel_size % 2 == 0 or sigma <= 0:
        raise ValueError(f"need an odd kernel_size ≥ 1 and sigma > 0, got {kernel_size}, {sigma}")
    C = images.shape[1]
    r = kernel_size // 2
    x = torch.arange(-r, r + 1, dtype=torch.float64, device=images.device)
    k1 = torch.exp(-(x ** 2) / (2 * sigma ** 2))
    k1 = (k1 / k1.sum()).to(images.dtype)
    out = F.pad(images, (r, r, r, r), mode="reflect")
    out = F.conv2d(out, k1.view(1, 1, 1, -1).expand(C, 1, 1, -1), groups=C)
    return F.conv2d(out, k1.view(1, 1, -1, 1).expand(C, 1, -1, 1), groups=C)


def _check_ranking(ranking: Tensor, B: int, N: int) -> None:
    if ranking.shape != (B, N):
        raise ValueError(f"ranking must be [B,N] = [{B},{N}] (scores over patch tokens), got "
                         f"{tuple(ranking.shape)}")
    if ranking.is_floating_point() and bool(torch.isnan(ranking).any()):
        raise ValueError("ranking contains NaN scores; expected finite scores (higher = more important)")


def _chunks(n: int, size: int | None) -> list[slice]:
    size = n if size is None else max(1, int(size))
    return [slice(i, min(n, i + size)) for i in range(0, n, size)]


def _probs_of(logits: Tensor, class_index: Tensor) -> Tensor:
    return logits.float().softmax(-1).gather(1, class_index.view(-1, 1)).squeeze(1)


@register_metric("insertion_deletion_auc", higher_is_better=True, category="faithfulness",
                 reference="Petsiuk et al., 2018, RISE, https://arxiv.org/abs/1806.07421 "
                           "(token-space variant: DESIGN.md §6)",
                 summary="IDAUC = insertion AUC − deletion AUC of p_c as patches enter / leave in "
                         "rank order",
                 field_directions={"ins_auc": True, "del_auc": False, "idauc": True})
def insertion_deletion_auc(
    backbone: nn.Module,
    images: Tensor,
    ranking: Tensor,
    steps: int = 10,
    class_index: Tensor | None = None,
    space: Literal["token", "pixel"] = "token",
    batch_size: int | None = None,
    *,
    device: torch.device | str | None = None,
    blur_sigma: float = 5.0,
    blur_kernel_size: int = 11,
    delete_value: float = 0.0,
) -> InsDel:
    """Insertion and deletion AUC of ``p_c`` along a patch ranking, and IDAUC = ins − del.

    Implementation of the insertion/deletion game of Petsiuk et al., 2018 (RISE,
    https://arxiv.org/abs/1806.07421) at patch granularity. Patches are ordered by
    ``ranking`` (higher score = more important; ties broken by the lower patch index). At step
    ``s = 0..S`` the top ``k_s = round(s·N/S)`` ranked patches (:func:`insertion_counts`) are

    - *inserted*: only they are present — ``ins_curve[:, s]``;
    - *deleted*: they are removed, the other ``N − k_s`` remain — ``del_curve[:, s]``;

    and ``p_c`` = softmax probability of class ``c`` is recorded. Both AUCs are trapezoids over
    the fraction ``k_s/N`` (:func:`curve_auc`), so they lie in ``[0, 1]``.

    ``space="token"`` (DESIGN.md §6, the default): patches enter / leave the *token sequence*
    (token dropping, positions kept, as in DynamicViT/EViT pruning). Prefix tokens are always
    present; ``k = 0`` is the prefix tokens alone. Tokens are embedded once per batch
    (``vit.embed_tokens``); each distinct token count is one batched ``run_blocks`` +
    ``classify_tokens`` forward (insertion with ``k`` tokens and deletion with ``N − k``
    remaining share it). Kept tokens stay in row-major order, so the full set reproduces the
    plain forward exactly; "all tokens" and "prefix only" are each computed once.

    ``space="pixel"`` (RISE): full forwards on modified images. Insertion starts from
    :func:`gaussian_blur` (σ = ``blur_sigma`` px, ``blur_kernel_size`` taps; RISE's defaults)
    and pastes the original pixels of the top-``k_s`` patches; deletion sets the pixels of the
    top-``k_s`` patches to ``delete_value``. The default ``0.0`` is the dataset mean when the
    images are normalised with that mean (``(x − mean)/std``), as all midas_nb datasets are.

    Args:
        backbone: a timm-style ViT (``patch_embed.grid_size``, ``num_prefix_tokens``, ``blocks``,
            ``norm``, ``forward_head``). Run in eval mode (switched temporarily, then restored).
        images: ``[B,3,H,W]`` normalised images.
        ranking: ``[B,N]`` patch scores, higher = more important (integers allowed).
        steps: ``S ≥ 1``.
        class_index: ``[B]`` class ``c`` per image; ``None`` → the full model's prediction
            (computed once, from the same forward as the "all patches" point).
        space: ``"token"`` or ``"pixel"``.
        batch_size: most sequences per forward; ``None`` → one forward per token count (token
            space: ``B`` or ``2B`` rows) or per step (pixel space: ``2B`` images).
        device: where to compute; ``None`` → ``images.device``. The backbone must live there.
        blur_sigma, blur_kernel_size: the insertion substrate (pixel space only).
        delete_value: the deletion value in normalised space (pixel space only).

    Returns:
        :class:`InsDel` with ``[B]`` AUCs, ``[S+1]`` fractions and ``[B,S+1]`` curves, on
        ``device``.

    Raises:
        ValueError: for a bad ``space``, ``steps``, ranking or class-index shape, NaN scores, an
            image size that is not a multiple of the patch grid (pixel space), or a non-finite
            ``p_c`` (e.g. a backbone that average-pools patch tokens cannot classify ``k = 0``).

    Example::

        >>> out = insertion_deletion_auc(model, images, scores, steps=10)   # images Bx3x224x224
        >>> out.idauc.shape, out.ins_curve.shape                            # [B], [B, 11]
    """
    if space not in ("token", "pixel"):
        raise ValueError(f"space must be 'token' or 'pixel', got {space!r}")
    if images.dim() != 4:
        raise ValueError(f"images must be [B,3,H,W], got {tuple(images.shape)}")
    dev = torch.device(device) if device is not None else images.device
    images = images.to(dev)
    ranking = ranking.to(dev)
    B = images.shape[0]
    rows, cols = grid_size(backbone)
    N = rows * cols
    P = num_prefix_tokens(backbone)
    _check_ranking(ranking, B, N)
    counts = insertion_counts(N, int(steps))
    S = len(counts) - 1
    if class_index is not None:
        class_index = torch.as_tensor(class_index, device=dev).long().view(-1)
        if class_index.numel() != B:
            raise ValueError(f"class_index must be [B] = [{B}], got {tuple(class_index.shape)}")
    # descending, stable: equal scores keep index order, so ties go to the lower index
    order = torch.sort(ranking, dim=1, descending=True, stable=True).indices
    # rank_pos[b, j] = position of patch j in the ranking
    rank_pos = torch.empty_like(order)
    rank_pos.scatter_(1, order, torch.arange(N, device=dev).expand(B, N))

    was_training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            if space == "token":
                ins_p, del_p, class_index = _insdel_token(backbone, images, order, counts, N, P,
                                                          class_index, batch_size)
            else:
                ins_p, del_p, class_index = _insdel_pixel(
                    backbone, images, rank_pos, counts, N, (rows, cols), class_index, batch_size,
                    blur_sigma, blur_kernel_size, delete_value)
    finally:
        backbone.train(was_training)

    ins_curve = torch.stack(ins_p, dim=1)
    del_curve = torch.stack(del_p, dim=1)
    if not (bool(torch.isfinite(ins_curve).all()) and bool(torch.isfinite(del_curve).all())):
        raise ValueError("p_c is not finite at some step; a backbone that pools patch tokens "
                         "(global_pool='avg') has no prediction from prefix tokens alone (k = 0)")
    fractions = torch.tensor(counts, dtype=torch.float32, device=dev) / N
    ins_auc = curve_auc(ins_curve, fractions)
    del_auc = curve_auc(del_curve, fractions)
    return InsDel(ins_auc, del_auc, ins_auc - del_auc, fractions, ins_curve, del_curve,
                  class_index, space)


def _insdel_token(backbone: nn.Module, images: Tensor, order: Tensor, counts: list[int], N: int,
                  P: int, class_index: Tensor | None, batch_size: int | None
                  ) -> tuple[list[Tensor], list[Tensor], Tensor]:
    B = images.shape[0]
    x = embed_tokens(backbone, images)                       # [B,P+N,D], once per batch

    def forward(seqs: Tensor) -> Tensor:                     # [R,P+k,D] → logits [R,C]
        return torch.cat([classify_tokens(backbone, run_blocks(backbone, seqs[sl]))
                          for sl in _chunks(seqs.shape[0], batch_size)])

    # "full": all patches (insertion k=N, deletion k=0); "empty": prefix only (ins 0, del N)
    full_logits = forward(x)
    if class_index is None:
        class_index = full_logits.argmax(-1)
    probs: dict[Any, Tensor] = {"full": _probs_of(full_logits, class_index)}

    def ins_key(k: int) -> Any:
        return "full" if k == N else "empty" if k == 0 else ("ins", k)

    def del_key(k: int) -> Any:
        return "full" if k == 0 else "empty" if k == N else ("del", k)

    # every distinct sequence, grouped by its token count (one batched forward per count)
    by_count: dict[int, dict[Any, Tensor]] = {}
    for k in counts:
        for key, idx in ((ins_key(k), order[:, :k]), (del_key(k), order[:, k:])):
            if key != "full":
                by_count.setdefault(idx.shape[1], {})[key] = idx
    for count, group in by_count.items():
        keys = list(group)
        # row-major order inside the kept set, as in the unpruned sequence
        seqs = torch.cat([gather_tokens(x, group[key].sort(dim=1).values, P) for key in keys])
        p = _probs_of(forward(seqs), class_index.repeat(len(keys)))
        for i, key in enumerate(keys):
            probs[key] = p[i * B:(i + 1) * B]
    ins = [probs[ins_key(k)] for k in counts]
    dele = [probs[del_key(k)] for k in counts]
    return ins, dele, class_index


def _insdel_pixel(backbone: nn.Module, images: Tensor, rank_pos: Tensor, counts: list[int], N: int,
                  grid: tuple[int, int], class_index: Tensor | None, batch_size: int | None,
                  blur_sigma: float, blur_kernel_size: int, delete_value: float
                  ) -> tuple[list[Tensor], list[Tensor], Tensor]:
    B, _, H, W = images.shape
    rows, cols = grid
    if H % rows or W % cols:
        raise ValueError(f"image size {H}x{W} is not a multiple of the patch grid {rows}x{cols}")
    ph, pw = H // rows, W // cols

    def forward(imgs: Tensor) -> Tensor:
        return torch.cat([classify_tokens(backbone, run_blocks(backbone, embed_tokens(backbone, imgs[sl])))
                          for sl in _chunks(imgs.shape[0], batch_size)])

    def pixel_mask(k: int) -> Tensor:                        # top-k patches → [B,1,H,W] bool
        m = (rank_pos < k).view(B, 1, rows, cols)
        return m.repeat_interleave(ph, 2).repeat_interleave(pw, 3)

    full_logits = forward(images)
    if class_index is None:
        class_index = full_logits.argmax(-1)
    p_full = _probs_of(full_logits, class_index)
    blurred = gaussian_blur(images, blur_sigma, blur_kernel_size)
    baseline = torch.full_like(images, float(delete_value))
    ins: list[Tensor] = []
    dele: list[Tensor] = []
    for k in counts:
        parts, kinds = [], []
        if k < N:
            parts.append(torch.where(pixel_mask(k), images, blurred))
            kinds.append("ins")
        if k > 0:
            parts.append(torch.where(pixel_mask(k), baseline, images))
            kinds.append("del")
        p = _probs_of(forward(torch.cat(parts)), class_index.repeat(len(parts))) if parts else None
        got = {kind: p[i * B:(i + 1) * B] for i, kind in enumerate(kinds)}
        ins.append(got.get("ins", p_full))
        dele.append(got.get("del", p_full))
    return ins, dele, class_index


# ---------------------------------------------------------------------------------------------
# decoupling D
# ---------------------------------------------------------------------------------------------
DEFAULT_CELL = ("dataset", "backbone", "depth", "budget")
DEFAULT_CONDITION_KEY = ("condition", "target", "relaxation")
_BAND_EPS = 1e-12   # so that ΔIDAUC = −band computed in floating point counts as inside
#: the statuses :func:`decoupling_D` gives a (cell, condition)
D_STATUSES = ("in band", "outside band", "not resolved", "undefined", "no reference")


def _as_float_list(v: Any) -> list[float] | None:
    """A per-image list (JSON ``null`` → NaN), or ``None`` when the row has none."""
    if v is None or isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, str):          # a table read back from CSV (results.load_table parses these)
        import json
        v = json.loads(v)
    try:
        return [math.nan if x is None else float(x) for x in v]
    except TypeError:
        return None


def _per_image(row: Mapping[str, Any], ids_col: str, val_col: str) -> dict[str, float] | None:
    """``{image_id: value}`` of one results row, or ``None`` when it has no per-image values."""
    ids, vals = row.get(ids_col), _as_float_list(row.get(val_col))
    if ids is None or vals is None or (isinstance(ids, float) and math.isnan(ids)):
        return None
    if isinstance(ids, str):
        import json
        ids = json.loads(ids)
    ids = [str(i) for i in ids]
    if len(ids) != len(vals) or not ids:
        return None
    return dict(zip(ids, vals))


def hierarchical_bootstrap(
    values: np.ndarray,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
    resample_seeds: bool = True,
) -> tuple[float, float]:
    """Percentile bootstrap ``(1−alpha)`` interval of ``mean_s nanmean_i values[s, i]``.

    Each resample draws the seeds (rows) with replacement — when ``resample_seeds`` and there
    is more than one — and, independently, the images (columns) with replacement, *the same
    images for every seed* (the test images are one sample shared by all seeds), then takes the
    mean over the drawn seeds of the NaN-skipping mean over the drawn images. With one seed it
    is the ordinary bootstrap over images; passing paired differences ``x_t − x_ref`` of the
    same images makes it the paired bootstrap (Efron & Tibshirani, 1993, ch. 13; the two-stage
    resampling of Davison & Hinkley, 1997, §3.8). Counts are drawn as multinomial weights, so
    one resample costs two small matrix products.

    Args:
        values: ``[S, n]`` per-seed, per-image values (``NaN`` = image not counted for that seed).
        n_boot, alpha, seed: resamples, level, RNG seed (numpy ``default_rng``).
        resample_seeds: also resample the seeds (the interval then covers seed variation).

    Returns:
        ``(lo, hi)``; ``(nan, nan)`` when no value is finite.
    """
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"values must be [S, n] (seeds × images), got shape {x.shape}")
    valid = np.isfinite(x)
    if not valid.any():
        return math.nan, math.nan
    S, n = x.shape
    xv = np.where(valid, x, 0.0)
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    chunk = max(1, min(n_boot, 4_000_000 // max(1, n)))
    for start in range(0, n_boot, chunk):
        m = min(chunk, n_boot - start)
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=m).astype(np.float64)          # [m, n]
        if resample_seeds and S > 1:
            v = rng.multinomial(S, np.full(S, 1.0 / S), size=m).astype(np.float64)      # [m, S]
        else:
            v = np.ones((m, S))
        num, den = w @ xv.T, w @ valid.T.astype(np.float64)                              # [m, S]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_seed = num / den
        ok = den > 0
        v = np.where(ok, v, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start:start + m] = (v * np.where(ok, per_seed, 0.0)).sum(1) / v.sum(1)
    stats = stats[np.isfinite(stats)]
    if stats.size == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


def _paired_matrix(rows: list[Mapping[str, Any]], refs: list[Mapping[str, Any] | None],
                   ids_col: str, val_col: str) -> np.ndarray | None:
    """``[S, n]`` per-image differences condition − reference over the images every row shares;
    ``None`` when a row lacks per-image values or no image is shared. ``refs[s] is None``: no
    reference (values themselves)."""
    cond = [_per_image(r, ids_col, val_col) for r in rows]
    ref = [None if r is None else _per_image(r, ids_col, val_col) for r in refs]
    if any(c is None for c in cond) or any(rf is None and r is not None for rf, r in zip(ref, refs)):
        return None
    common = set(cond[0])
    for d in cond[1:] + [rf for rf in ref if rf is not None]:
        common &= set(d)
    ids = sorted(common)
    if not ids:
        return None
    out = np.array([[c[i] - (rf[i] if rf is not None else 0.0) for i in ids] for c, rf in zip(cond, ref)])
    return out


@register_metric("decoupling_D", higher_is_better=True, category="decoupling",
                 reference="MIDAS (DESIGN.md §6): D(t) = mIoU_t − mIoU_ref where "
                           "IDAUC_t − IDAUC_ref ≥ −0.01",
                 summary="part-coverage gain over the reference scorer at faithfulness parity")
def decoupling_D(
    table: pd.DataFrame,
    reference: str = "reference",
    band: float = 0.01,
    miou_col: str = "miou",
    idauc_col: str = "idauc",
    by: Sequence[str] | None = None,
    *,
    condition_cols: Sequence[str] = DEFAULT_CONDITION_KEY,
    seed_col: str = "seed",
    miou_unit: Literal["fraction", "percent"] = "fraction",
    per_seed: bool = False,
    n_boot: int = 1000,
    alpha: float = 0.05,
    ci_seed: int = 0,
) -> pd.DataFrame:
    """Decoupling ``D(t) = mIoU_t − mIoU_ref`` with the IDAUC parity band (MIDAS, DESIGN.md §6).

    Within each cell (``by``: dataset, backbone, depth, budget) every condition is compared with
    the reference condition (``condition == reference``, the training-free T0 scorer):

    - ``D_pp = mIoU_t − mIoU_ref`` in percentage points (×100 when ``miou_unit="fraction"``);
    - ``delta_idauc = IDAUC_t − IDAUC_ref`` (IDAUC units);
    - ``in_band = delta_idauc ≥ −band`` (asymmetric: faithfulness gains always count): the
      point decision; ``NA`` when ``delta_idauc`` is undefined (NaN).

    Differences are taken per seed when the reference has a row with the same seed in that
    cell (``ref_paired``), otherwise against the reference's mean over its seeds (the
    reference has no parameters, so one seed usually suffices). They are then aggregated
    over seeds: mean, sample std (``ddof=1``; NaN for one seed) and ``n_seeds``; ``in_band``
    of the aggregate uses the mean ``delta_idauc`` and ``in_band_frac`` is the fraction of
    seeds in the band. The reference itself appears with ``D_pp = 0``.

    **Intervals** (95 % for ``alpha=0.05``): ``D_pp_lo``/``D_pp_hi`` and
    ``delta_idauc_lo``/``delta_idauc_hi`` are *paired* percentile-bootstrap intervals of the
    aggregated differences: each resample draws the test images (the same images for the
    condition and its reference, matched by image id — so the image-to-image variation both
    share cancels) and, with several seeds, the seeds too (:func:`hierarchical_bootstrap`); the
    interval therefore covers image sampling and, over seeds, seed variation. They need the
    per-image columns the protocol stores (``image_ids``/``miou_per_image``,
    ``idauc_image_ids``/``idauc_per_image``); rows without them get NaN intervals.

    ``status`` — ``"undefined"`` when ``D_pp`` or ``delta_idauc`` is NaN (e.g. no IDAUC was
    measured, ``idauc_steps=0``, or no image had a visible part): never in or out of the band;
    ``"no reference"`` when the cell has no reference row; otherwise, with an interval,
    ``"in band"`` when the whole ΔIDAUC interval is ``≥ −band``, ``"outside band"`` when it is
    entirely below, ``"not resolved"`` when it straddles ``−band`` (``band_resolved`` False);
    without an interval the point decision (``band_resolved`` NA). Rows are never dropped.

    Args:
        table: results rows (``midas_nb.results`` schema or any frame with these columns).
        reference: the reference condition's name in ``condition_cols[0]``.
        band: the parity band (IDAUC units), default 0.01.
        miou_col, idauc_col: metric columns.
        by: cell columns; ``None`` → those of ``("dataset","backbone","depth","budget")``
            present in ``table``.
        condition_cols: columns identifying a condition inside a cell; the first must exist,
            the others are used where present.
        seed_col: the seed column (optional in ``table``).
        miou_unit: ``"fraction"`` (mIoU in [0,1]) or ``"percent"``.
        per_seed: return the per-row differences instead of the aggregate (intervals over
            images only).
        n_boot, alpha, ci_seed: bootstrap resamples, level and RNG seed of the intervals.

    Returns:
        One row per (cell, condition) with ``by``, the condition columns, ``D_pp``,
        ``D_pp_lo``, ``D_pp_hi``, ``D_pp_std``, ``delta_idauc``, ``delta_idauc_lo``,
        ``delta_idauc_hi``, ``delta_idauc_std``, ``n_seeds``, ``in_band`` (nullable boolean),
        ``band_resolved`` (nullable boolean), ``in_band_frac``, ``status`` (one of
        :data:`D_STATUSES`), ``D_cell`` (display string, e.g. ``"+2.11"``, ``"+1.49 (outside
        band)"``, ``"+0.40 (band not resolved)"``, ``"undefined (IDAUC is NaN)"``), ``miou``,
        ``idauc``, ``miou_ref``, ``idauc_ref``, ``ref_paired``, ``n_paired_images`` (images
        of the ΔIDAUC interval; 0 without one); metric columns keep the names
        ``miou``/``idauc`` whatever ``miou_col``/``idauc_col`` were.

    Raises:
        ValueError: for missing columns, an unknown ``miou_unit`` or no reference row at all.
    """
    if miou_unit not in ("fraction", "percent"):
        raise ValueError(f"miou_unit must be 'fraction' or 'percent', got {miou_unit!r}")
    cond_col = condition_cols[0]
    missing = [c for c in (cond_col, miou_col, idauc_col) if c not in table.columns]
    if by is None:
        by = [c for c in DEFAULT_CELL if c in table.columns]
    else:
        missing += [c for c in by if c not in table.columns]
    if missing:
        raise ValueError(f"decoupling_D: table is missing column(s) {missing}; has "
                         f"{list(table.columns)}")
    by = list(by)
    if not (table[cond_col] == reference).any():
        raise ValueError(f"decoupling_D: no reference row ({cond_col} == {reference!r}); "
                         f"conditions present: {sorted(table[cond_col].astype(str).unique())}")
    key = [c for c in condition_cols if c in table.columns]
    scale = 100.0 if miou_unit == "fraction" else 1.0
    has_seed = seed_col in table.columns
    # per-image columns follow the metric columns' names (miou → miou_per_image, image_ids)
    pim = {"m": ("image_ids", f"{miou_col}_per_image"), "i": ("idauc_image_ids", f"{idauc_col}_per_image")}

    df = table.reset_index(drop=True).copy()
    df["_row"] = np.arange(len(df))
    df["_cell"] = 0                                      # a constant key when ``by`` is empty
    cell = by + ["_cell"]
    df = df.rename(columns={miou_col: "_m", idauc_col: "_i"})
    ref = df[df[cond_col] == reference]
    ref_mean = ref.groupby(cell, dropna=False)[["_m", "_i"]].mean().add_suffix("_refmean").reset_index()
    df = df.merge(ref_mean, on=cell, how="left")
    if has_seed:
        ref_seed = (ref.groupby(cell + [seed_col], dropna=False)[["_m", "_i"]].mean()
                    .add_suffix("_refseed").reset_index())
        df = df.merge(ref_seed, on=cell + [seed_col], how="left")
        paired = df["_m_refseed"].notna() | df["_i_refseed"].notna()
        df["miou_ref"] = df["_m_refseed"].where(paired, df["_m_refmean"])
        df["idauc_ref"] = df["_i_refseed"].where(paired, df["_i_refmean"])
    else:
        paired = pd.Series(False, index=df.index)
        df["miou_ref"], df["idauc_ref"] = df["_m_refmean"], df["_i_refmean"]
    df["ref_paired"] = paired.astype(bool)
    df["miou"], df["idauc"] = df["_m"], df["_i"]
    df["D_pp"] = (df["miou"] - df["miou_ref"]) * scale
    df["delta_idauc"] = df["idauc"] - df["idauc_ref"]
    # a cell "has a reference" when it has a reference row, even if that row's values are NaN
    df = df.merge(ref[cell].drop_duplicates().assign(has_reference=True), on=cell, how="left")
    df["has_reference"] = df["has_reference"].fillna(False).astype(bool)
    df = df.sort_values("_row").reset_index(drop=True)

    # the reference row(s) each condition row is paired with, as original rows of ``table``
    src = table.reset_index(drop=True)
    ref_rows: dict[tuple, list[int]] = {}
    for _, r in df[df[cond_col] == reference].iterrows():
        ref_rows.setdefault(tuple(r[c] for c in cell), []).append(int(r["_row"]))

    def _ref_for(r: pd.Series) -> Mapping[str, Any] | None:
        cands = ref_rows.get(tuple(r[c] for c in cell), [])
        if not cands:
            return None
        if has_seed:
            same = [i for i in cands if df.at[i, seed_col] == r[seed_col]]
            if same:
                return src.iloc[same[0]].to_dict()
        if len(cands) == 1:
            return src.iloc[cands[0]].to_dict()
        # several unpaired reference rows: their per-image mean
        rows = [src.iloc[i].to_dict() for i in cands]
        out = dict(rows[0])
        for idc, vc in pim.values():
            maps = [_per_image(x, idc, vc) for x in rows]
            if any(m is None for m in maps):
                out[vc] = None
                continue
            ids = sorted(set.intersection(*(set(m) for m in maps)))
            out[idc], out[vc] = ids, [float(np.nanmean([m[i] for m in maps])) for i in ids]
        return out

    def _intervals(members: pd.DataFrame) -> dict[str, Any]:
        rows = [src.iloc[int(i)].to_dict() for i in members["_row"]]
        refs = [_ref_for(r) for _, r in members.iterrows()]
        out: dict[str, Any] = {}
        for tag, name, sc in (("m", "D_pp", scale), ("i", "delta_idauc", 1.0)):
            if any(rf is None for rf in refs):
                mat = None
            else:
                mat = _paired_matrix(rows, refs, *pim[tag])
            lo, hi = (hierarchical_bootstrap(mat, n_boot, alpha, ci_seed) if mat is not None
                      else (math.nan, math.nan))
            out[f"{name}_lo"], out[f"{name}_hi"] = lo * sc, hi * sc
            if tag == "i":
                out["n_paired_images"] = 0 if mat is None else int(mat.shape[1])
        return out

    if per_seed:
        out = df.copy()
        ci = pd.DataFrame([_intervals(df.iloc[[k]]) for k in range(len(df))], index=df.index)
        out = pd.concat([out, ci], axis=1)
        out["n_seeds"] = 1
    else:
        g = df.groupby(cell + key, dropna=False, sort=False)
        df["_in_point"] = (df["delta_idauc"] >= -band - _BAND_EPS).where(df["delta_idauc"].notna())
        out = g.agg(
            D_pp=("D_pp", "mean"), D_pp_std=("D_pp", "std"),
            delta_idauc=("delta_idauc", "mean"), delta_idauc_std=("delta_idauc", "std"),
            n_seeds=("D_pp", "size"), in_band_frac=("_in_point", "mean"),
            miou=("miou", "mean"), idauc=("idauc", "mean"),
            miou_ref=("miou_ref", "mean"), idauc_ref=("idauc_ref", "mean"),
            ref_paired=("ref_paired", "all"), has_reference=("has_reference", "all"),
            _rows=("_row", list),
        ).reset_index()
        # a mean over seeds is NaN when any seed's difference is undefined (never a silent subset)
        for c in ("D_pp", "delta_idauc"):
            bad = g[c].apply(lambda s: bool(s.isna().any())).to_numpy()
            out.loc[bad, c] = np.nan
        ci = pd.DataFrame([_intervals(df[df["_row"].isin(rows)]) for rows in out["_rows"]], index=out.index)
        out = pd.concat([out.drop(columns=["_rows"]), ci], axis=1)
    has_d = out["D_pp"].notna() & out["delta_idauc"].notna()
    point = (out["delta_idauc"] >= -band - _BAND_EPS)
    out["in_band"] = pd.array([bool(p) if h else pd.NA for p, h in zip(point, has_d)], dtype="boolean")
    lo, hi = out["delta_idauc_lo"], out["delta_idauc_hi"]
    has_ci = has_d & lo.notna() & hi.notna()
    inside, outside = lo >= -band - _BAND_EPS, hi < -band - _BAND_EPS
    out["band_resolved"] = pd.array([bool(a or b) if c else pd.NA for a, b, c in zip(inside, outside, has_ci)],
                                    dtype="boolean")
    status = []
    for hr, hd, hc, ins, outs, p in zip(out["has_reference"], has_d, has_ci, inside, outside, point):
        if not hr:
            status.append("no reference")
        elif not hd:
            status.append("undefined")
        elif hc:
            status.append("in band" if ins else "outside band" if outs else "not resolved")
        else:
            status.append("in band" if p else "outside band")
    out["status"] = status

    def _cell_text(d: float, s: str, m: float, i: float) -> str:
        if s == "no reference":
            return "n/a (no reference)"
        if s == "undefined":
            what = " and ".join(n for n, v in (("mIoU", m), ("IDAUC", i)) if not np.isfinite(v)) or "D"
            return f"undefined ({what} is NaN)"
        return f"{d:+.2f}" + {"in band": "", "outside band": " (outside band)",
                              "not resolved": " (band not resolved)"}[s]

    out["D_cell"] = [_cell_text(d, s, m, i) for d, s, m, i in
                     zip(out["D_pp"], out["status"], out["D_pp"], out["delta_idauc"])]
    cols = by + key + [c for c in ("D_pp", "D_pp_lo", "D_pp_hi", "D_pp_std", "delta_idauc",
                                   "delta_idauc_lo", "delta_idauc_hi", "delta_idauc_std",
                                   "n_seeds", "in_band", "band_resolved", "in_band_frac", "status",
                                   "D_cell", "miou", "idauc", "miou_ref", "idauc_ref", "ref_paired",
                                   "n_paired_images")
                       if c in out.columns]
    if per_seed:
        cols = by + key + ([seed_col] if has_seed else []) + cols[len(by) + len(key):]
    result = out[cols].reset_index(drop=True)
    result.attrs["interval"] = (f"{100 * (1 - alpha):g} % paired percentile bootstrap over test images "
                                f"(and seeds when there are several), {n_boot} resamples")
    return result


# ---------------------------------------------------------------------------------------------
# LaSt-ViT probes
# ---------------------------------------------------------------------------------------------
def patch_score(hidden_last: Tensor, num_prefix: int) -> Tensor:
    """LaSt-ViT patch score: ``cos(h_CLS, h_j)`` at the output of the last block.

    Shi, Yu & Yang, 2026, *Vision Transformers Need More Than Registers* (LaSt-ViT),
    https://arxiv.org/abs/2602.22394.

    Args:
        hidden_last: ``[B,T,D]`` output of the last block (``CaptureResult.hidden[-1]``), CLS
            first.
        num_prefix: ``P``, prefix tokens to strip (the CLS token is token 0).

    Returns:
        ``[B,N]`` cosine similarities in ``[−1, 1]``.
    """
    if hidden_last.dim() != 3 or hidden_last.shape[1] <= num_prefix:
        raise ValueError(f"hidden_last must be [B,T,D] with T > num_prefix={num_prefix}, got "
                         f"{tuple(hidden_last.shape)}")
    cls = hidden_last[:, :1]
    patches = hidden_last[:, num_prefix:]
    return F.cosine_similarity(patches, cls, dim=-1)


@register_metric("point_in_box", higher_is_better=True, category="localisation",
                 reference="Shi et al., 2026, LaSt-ViT, https://arxiv.org/abs/2602.22394",
                 summary="the top-scoring patch lies inside the object box")
def point_in_box(scores: Tensor, box_mask: Tensor) -> Tensor:
    """Point-in-Box (LaSt-ViT): is the highest-scoring patch inside the object box?

    Args:
        scores: ``[B,N]`` patch scores (e.g. :func:`patch_score`); ties go to the lower index.
        box_mask: ``[B,N]`` bool, patches inside the object box.

    Returns:
        ``[B]`` bool; its mean is the PiB rate.
    """
    if scores.dim() != 2 or scores.shape != box_mask.shape:
        raise ValueError(f"scores and box_mask must both be [B,N], got {tuple(scores.shape)} "
                         f"and {tuple(box_mask.shape)}")
    top = scores.argmax(dim=1, keepdim=True)    # first maximal index
    return box_mask.bool().gather(1, top).squeeze(1)


# ---------------------------------------------------------------------------------------------
# accuracy, speed, uncertainty
# ---------------------------------------------------------------------------------------------
@register_metric("pruned_accuracy", higher_is_better=True, category="accuracy",
                 reference="top-1 accuracy",
                 summary="fraction of images whose pruned-model prediction equals the label")
def pruned_accuracy(logits: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy of ``logits [B,C]`` against ``labels [B]`` (a fraction in ``[0,1]``).

    Per-image correctness for :func:`bootstrap_ci` is ``(logits.argmax(-1) == labels)``.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [B,C] and labels [B], got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    return float((logits.argmax(-1) == labels.to(logits.device)).float().mean())


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _num_images(batch: Any) -> int:
    for attr in ("images",):
        if hasattr(batch, attr):
            return int(getattr(batch, attr).shape[0])
    if isinstance(batch, Tensor):
        return int(batch.shape[0])
    return len(batch)


@register_metric("throughput", higher_is_better=True, category="efficiency",
                 reference="wall-clock images per second (device-synchronised)",
                 summary="images per second of the pruned forward")
def measure_throughput(
    fn: Callable[[Any], Any],
    batch: Any,
    repeats: int = 10,
    warmup: int = 2,
    *,
    device: torch.device | str | None = None,
) -> float:
    """Images per second of ``fn(batch)``, timed over ``repeats`` calls after ``warmup`` calls.

    Runs under ``torch.no_grad``; on CUDA the device is synchronised before starting and
    stopping the clock (kernels are asynchronous).

    Args:
        fn: callable taking ``batch``.
        batch: a ``[B,...]`` tensor, a ``Batch`` (``.images``), or a sized sequence.
        repeats: timed calls (≥ 1).
        warmup: untimed calls first.
        device: device to synchronise; ``None`` → that of ``batch`` (``batch.images``).

    Returns:
        ``B · repeats / seconds`` (images/s).
    """
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    if device is None:
        t = batch.images if hasattr(batch, "images") else batch
        device = t.device if isinstance(t, Tensor) else None
    dev = torch.device(device) if device is not None else None
    n = _num_images(batch)
    with torch.no_grad():
        for _ in range(warmup):
            fn(batch)
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn(batch)
        _sync(dev)
        elapsed = time.perf_counter() - t0
    return n * repeats / max(elapsed, 1e-12)


def bootstrap_ci(
    values: Tensor | np.ndarray | Sequence[float],
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap ``(1−alpha)`` CI over images, ignoring NaNs.

    Resamples the non-NaN values with replacement ``n_boot`` times (``numpy`` generator seeded
    by ``seed``) and takes the ``alpha/2`` and ``1−alpha/2`` quantiles of the resampled means
    (Efron & Tibshirani, 1993, ch. 13). A constant gives a zero-width interval; one value gives
    ``(v, v, v)``; no value gives ``(nan, nan, nan)``.

    Returns:
        ``(mean, lo, hi)`` as floats.
    """
    if not (0.0 < alpha < 1.0) or n_boot < 1:
        raise ValueError(f"need 0 < alpha < 1 and n_boot ≥ 1, got alpha={alpha}, n_boot={n_boot}")
    if isinstance(values, Tensor):
        values = values.detach().float().cpu().numpy()
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    step = max(1, 2_000_000 // v.size)                   # bound memory to ~16 MB of indices
    for i in range(0, n_boot, step):
        m = min(step, n_boot - i)
        boot[i:i + m] = v[rng.integers(0, v.size, size=(m, v.size))].mean(axis=1)
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return mean, float(lo), float(hi)
