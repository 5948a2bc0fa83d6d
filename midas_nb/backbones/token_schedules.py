"""Fewer tokens per training step of the distilled student: PatchDropout by cells and
progressive token resolution (:class:`~midas_nb.backbones.recipes.DistillRecipe` ``token_keep``
and ``coarse_epochs``; both off by default; docs/decisions/0002-progressive-token-resolution.md).

Both work on the cells of the teacher's grid (``h'×w'``, stride 32: 7×7 at 224 px), so the
token labels of a kept or averaged cell stay exact. Tokens are ``[B,P+N,D]``: ``P`` prefix
tokens (always kept) and ``N = h·w`` patch tokens in row-major order."""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn


def drop_cells(tokens: Tensor, num_prefix: int, grid: tuple[int, int], cell_grid: tuple[int, int], keep: float,
               generator: torch.Generator) -> tuple[Tensor, Tensor]:
    """PatchDropout by cells (Liu et al., 2023, https://arxiv.org/abs/2208.07220): keep the prefix
    tokens and the patch tokens of a random ``k = max(1, round(keep·h'·w'))`` of the ``h'×w'``
    cells of ``cell_grid`` per image (each cell = ``(h/h')×(w/w')`` patch tokens), in cell order.

    Args:
        tokens: ``[B,P+N,D]`` with ``N = h·w`` patch tokens in row-major order.
        num_prefix: ``P``.
        grid: ``(h, w)``, multiples of ``cell_grid``.
        cell_grid: ``(h', w')``.
        keep: fraction of cells kept, in ``(0, 1]``.
        generator: the RNG of the kept cells.

    Returns:
        ``(kept tokens [B,P+k·f,D], kept cells [B,k])`` with ``f`` patch tokens per cell; the
        patch tokens of cell ``cells[:, i]`` are rows ``P+i·f … P+(i+1)·f−1``.
    """
    (h, w), (ch, cw) = grid, cell_grid
    if h % ch or w % cw:
        raise ValueError(f"patch grid {grid} must be a multiple of the cell grid {cell_grid}")
    B, C = tokens.shape[0], ch * cw
    fy, fx = h // ch, w // cw
    k = max(1, round(keep * C))
    cells = torch.rand(B, C, generator=generator).argsort(1)[:, :k].sort(1).values.to(tokens.device)
    r, c = cells // cw, cells % cw                                                   # [B,k]
    dy = torch.arange(fy, device=tokens.device).repeat_interleave(fx)                # [f]
    dx = torch.arange(fx, device=tokens.device).repeat(fy)
    idx = ((r[..., None] * fy + dy) * w + c[..., None] * fx + dx).reshape(B, -1)     # [B,k·f]
    patches = tokens[:, num_prefix:].gather(1, idx[..., None].expand(-1, -1, tokens.shape[-1]))
    return torch.cat([tokens[:, :num_prefix], patches], 1), cells


def coarse_tokens(tokens: Tensor, num_prefix: int, grid: tuple[int, int], cell_grid: tuple[int, int]) -> Tensor:
    """Progressive token resolution's coarse stage (:attr:`DistillRecipe.coarse_epochs`): the
    patch tokens of each cell of ``cell_grid`` replaced by their mean (position embedding
    included), prefix tokens unchanged.

    ``[B,P+h·w,D] → [B,P+h'·w',D]`` (row-major cells; ``grid = (h, w)`` a multiple of
    ``cell_grid = (h', w')``).

    Raises:
        ValueError: if ``grid`` is not a multiple of ``cell_grid``.
    """
    (h, w), (ch, cw) = grid, cell_grid
    if h % ch or w % cw:
        raise ValueError(f"patch grid {grid} must be a multiple of the cell grid {cell_grid}")
    B, _, D = tokens.shape
    patches = tokens[:, num_prefix:].reshape(B, h, w, D).permute(0, 3, 1, 2)
    cells = F.avg_pool2d(patches, (h // ch, w // cw)).flatten(2).transpose(1, 2)
    return torch.cat([tokens[:, :num_prefix], cells], 1)


def kept_token_label_loss(patch_tokens: Tensor, head: nn.Linear, cells: Tensor, teacher_maps: Tensor) -> Tensor:
    """:func:`token_label_loss` on the kept cells of :func:`drop_cells`: the student's score of a
    cell is the mean of ``head`` over its patch tokens (what ``_token_maps``' average pooling
    gives with every token present), KL per kept cell, mean over kept cells and images.

    ``patch_tokens [B,k·f,D]``, ``cells [B,k]``, ``teacher_maps [B,K,h',w']``; returns a scalar.
    """
    B, k = cells.shape
    s = head(patch_tokens).float().reshape(B, k, -1, head.out_features).mean(2)          # [B,k,K]
    t = teacher_maps.flatten(2).transpose(1, 2)                                            # [B,h'w',K]
    t = t.gather(1, cells[..., None].expand(-1, -1, t.shape[-1]))
    kl = F.kl_div(F.log_softmax(s, -1), F.log_softmax(t.float(), -1), reduction="none", log_target=True)
    return kl.sum(-1).mean()
