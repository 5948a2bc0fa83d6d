"""Insertion / deletion AUC (RISE, Petsiuk et al., 2018, arXiv:1806.07421) in token or pixel space."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..backbones.vit import classify_tokens, embed_tokens, gather_tokens, grid_size, num_prefix_tokens, run_blocks
from .registry import register_metric


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
                 summary="IDAUC = insertion AUC − deletion AUC of p_c as patches enter / leave in rank order",
                 field_directions={"ins_auc": True, "del_auc": False, "idauc": True})
def insertion_deletion_auc(backbone: nn.Module, images: Tensor, ranking: Tensor, steps: int = 10,
                           class_index: Tensor | None = None, space: Literal["token", "pixel"] = "token",
                           batch_size: int | None = None, *, device: torch.device | str | None = None,
                           blur_sigma: float = 5.0, blur_kernel_size: int = 11, delete_value: float = 0.0,
                           full_probs: Tensor | None = None) -> InsDel:
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
        images: ``[B,3,H,W]`` normalised images, or (token space) their ``[B,P+N,D]`` tokens from
            ``vit.embed_tokens``: the same for every ranking of these images, embedded once for all.
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
        full_probs: ``[B]`` ``p_c`` with every patch token (token space, with ``class_index``): the
            same for every ranking of these images, computed once for all (decision 0071).

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
    if images.dim() != 4 and not (space == "token" and images.dim() == 3):
        raise ValueError(f"images must be [B,3,H,W] (token space: or [B,P+N,D] tokens), got {tuple(images.shape)}")
    if full_probs is not None and (space != "token" or class_index is None):
        raise ValueError("full_probs needs space='token' and the class_index it was computed for")
    dev = torch.device(device) if device is not None else images.device
    images, ranking = images.to(dev), ranking.to(dev)
    B = images.shape[0]
    rows, cols = grid_size(backbone)
    N = rows * cols
    P = num_prefix_tokens(backbone)
    _check_ranking(ranking, B, N)
    counts = insertion_counts(N, int(steps))
    if class_index is not None:
        class_index = torch.as_tensor(class_index, device=dev).long().view(-1)
        if class_index.numel() != B:
            raise ValueError(f"class_index must be [B] = [{B}], got {tuple(class_index.shape)}")
    # descending, stable: equal scores keep index order, so ties go to the lower index
    order = torch.sort(ranking, dim=1, descending=True, stable=True).indices
    # rank_pos[b, j] = position of patch j in the ranking
    rank_pos = torch.empty_like(order).scatter_(1, order, torch.arange(N, device=dev).expand(B, N))

    was_training = backbone.training
    backbone.eval()
    try:
        with torch.no_grad():
            if space == "token":
                ins_p, del_p, class_index = _insdel_token(backbone, images, order, counts, N, P,
                                                          class_index, batch_size, full_probs)
            else:
                ins_p, del_p, class_index = _insdel_pixel(
                    backbone, images, rank_pos, counts, N, (rows, cols), class_index, batch_size,
                    blur_sigma, blur_kernel_size, delete_value)
    finally:
        backbone.train(was_training)

    ins_curve, del_curve = torch.stack(ins_p, dim=1), torch.stack(del_p, dim=1)
    if not (bool(torch.isfinite(ins_curve).all()) and bool(torch.isfinite(del_curve).all())):
        raise ValueError("p_c is not finite at some step; a backbone that pools patch tokens "
                         "(global_pool='avg') has no prediction from prefix tokens alone (k = 0)")
    fractions = torch.tensor(counts, dtype=torch.float32, device=dev) / N
    ins_auc, del_auc = curve_auc(ins_curve, fractions), curve_auc(del_curve, fractions)
    return InsDel(ins_auc, del_auc, ins_auc - del_auc, fractions, ins_curve, del_curve, class_index, space)


def _insdel_token(backbone: nn.Module, images: Tensor, order: Tensor, counts: list[int], N: int,
                  P: int, class_index: Tensor | None, batch_size: int | None, full_probs: Tensor | None
                  ) -> tuple[list[Tensor], list[Tensor], Tensor]:
    B = images.shape[0]
    x = images if images.dim() == 3 else embed_tokens(backbone, images)     # [B,P+N,D], once per batch

    def forward(seqs: Tensor) -> Tensor:                     # [R,P+k,D] → logits [R,C]
        return torch.cat([classify_tokens(backbone, run_blocks(backbone, seqs[sl]))
                          for sl in _chunks(seqs.shape[0], batch_size)])

    # "full": all patches (insertion k=N, deletion k=0); "empty": prefix only (ins 0, del N)
    if full_probs is None:
        full_logits = forward(x)
        class_index = full_logits.argmax(-1) if class_index is None else class_index
        full_probs = _probs_of(full_logits, class_index)
    probs: dict[Any, Tensor] = {"full": full_probs.to(x.device).float()}

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
    return [probs[ins_key(k)] for k in counts], [probs[del_key(k)] for k in counts], class_index


def _insdel_pixel(backbone: nn.Module, images: Tensor, rank_pos: Tensor, counts: list[int], N: int,
                  grid: tuple[int, int], class_index: Tensor | None, batch_size: int | None, blur_sigma: float,
                  blur_kernel_size: int, delete_value: float) -> tuple[list[Tensor], list[Tensor], Tensor]:
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
    class_index = full_logits.argmax(-1) if class_index is None else class_index
    p_full = _probs_of(full_logits, class_index)
    blurred = gaussian_blur(images, blur_sigma, blur_kernel_size)
    baseline = torch.full_like(images, float(delete_value))
    ins, dele = [], []
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
