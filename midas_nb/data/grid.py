"""Rasterise part keypoints and boxes onto the patch-token grid.

The grid is row-major: for an image of ``H x W`` pixels and patch size ``p``
there are ``gh = H // p`` rows and ``gw = W // p`` columns of patches and patch
``(i, j)`` is token ``i * gw + j`` (``N = gh * gw``), matching the token order of a
ViT's patch embedding (DESIGN.md §3).

Coordinates are continuous pixels (pixel ``(r, c)`` covers ``[c, c+1) x [r, r+1)``),
so a point ``(x, y)`` lies in patch ``(floor(y / p), floor(x / p))``. Points on the
far border (``x == W`` or ``y == H``, e.g. after a horizontal flip of ``x == 0``)
are assigned to the last row / column.
"""

from __future__ import annotations

import math
from typing import Sequence

import torch
from torch import Tensor

__all__ = ["grid_shape", "num_patches", "part_mask_from_keypoints", "box_mask_from_box", "patch_centres"]

ImageSize = int | Sequence[int]


def _hw(image_size: ImageSize) -> tuple[int, int]:
    h, w = (image_size, image_size) if isinstance(image_size, int) else (int(v) for v in image_size)
    return h, w


def _patch_index(x: Tensor, y: Tensor, patch_size: int, gh: int, gw: int) -> Tensor:
    """Row-major index of the patch holding pixel point ``(x, y)``; the far border goes to the last row/column."""
    col = torch.clamp(torch.floor(x / patch_size), 0, gw - 1).long()
    return torch.clamp(torch.floor(y / patch_size), 0, gh - 1).long() * gw + col


def grid_shape(image_size: ImageSize, patch_size: int) -> tuple[int, int]:
    """Return ``(gh, gw)`` for an image of ``image_size`` (``int`` or ``(H, W)``, pixels).

    Raises:
        ValueError: ``patch_size < 1`` or ``H``/``W`` not a positive multiple of
            ``patch_size``.
    """
    (h, w), p = _hw(image_size), int(patch_size)
    if p < 1:
        raise ValueError(f"patch_size must be >= 1, got {patch_size}")
    if h <= 0 or w <= 0 or h % p or w % p:
        raise ValueError(f"image size (H={h}, W={w}) must be positive multiples of patch_size={p}")
    return h // p, w // p


def num_patches(image_size: ImageSize, patch_size: int) -> int:
    """``N = (H/p) * (W/p)``."""
    gh, gw = grid_shape(image_size, patch_size)
    return gh * gw


def patch_centres(image_size: ImageSize, patch_size: int) -> Tensor:
    """``[N, 2]`` float32 ``(x, y)`` centres of the patches in pixels, row-major."""
    gh, gw = grid_shape(image_size, patch_size)
    p = float(patch_size)
    ys = (torch.arange(gh, dtype=torch.float32) + 0.5) * p
    xs = (torch.arange(gw, dtype=torch.float32) + 0.5) * p
    yy, xx = torch.meshgrid(ys, xs, indexing="ij")
    return torch.stack([xx.reshape(-1), yy.reshape(-1)], dim=1)


def part_mask_from_keypoints(parts: Tensor, image_size: ImageSize, patch_size: int) -> Tensor:
    """Patches holding at least one visible keypoint.

    Args:
        parts: ``[..., P, 3]`` ``(x, y, visible)`` in pixels of the (transformed) image.
            Keypoints with ``visible <= 0`` or outside ``[0, W] x [0, H]`` are ignored.
        image_size: ``int`` or ``(H, W)`` in pixels, multiples of ``patch_size``.
        patch_size: patch side in pixels.

    Returns:
        ``[..., N]`` bool, row-major. All False when no keypoint is visible (also
        for ``P = 0``).

    Raises:
        ValueError: bad image / patch size, or ``parts`` not shaped ``[..., P, 3]``.
    """
    gh, gw = grid_shape(image_size, patch_size)
    h, w = _hw(image_size)
    parts = torch.as_tensor(parts, dtype=torch.float32)
    if parts.ndim < 2 or parts.shape[-1] != 3:
        raise ValueError(f"parts must be shaped [..., P, 3] (x, y, visible), got {tuple(parts.shape)}")
    lead = parts.shape[:-2]
    flat = parts.reshape(math.prod(lead), parts.shape[-2], 3)
    x, y, v = flat[..., 0], flat[..., 1], flat[..., 2]
    ok = (v > 0) & (x >= 0) & (x <= w) & (y >= 0) & (y <= h) & torch.isfinite(x) & torch.isfinite(y)
    idx = _patch_index(x, y, patch_size, gh, gw)
    idx = torch.where(ok, idx, torch.zeros_like(idx))
    # scatter with 'amax' so an ignored point (routed to patch 0 with value 0) never
    # clears a visible one
    mask = torch.zeros(flat.shape[0], gh * gw, dtype=torch.int32)
    if flat.shape[1] > 0:
        mask.scatter_reduce_(1, idx, ok.to(torch.int32), reduce="amax")
    return mask.bool().reshape(*lead, gh * gw)


def box_mask_from_box(box: Tensor, image_size: ImageSize, patch_size: int) -> Tensor:
    """Patches whose centre lies inside the box (closed interval on both ends).

    A non-empty box (``x1 > x0`` and ``y1 > y0`` after clipping to the image) that
    contains no patch centre (smaller than a patch) is given the single patch that
    contains the box centre, so every non-empty box covers at least one patch.

    Args:
        box: ``[..., 4]`` ``(x0, y0, x1, y1)`` in pixels.
        image_size: ``int`` or ``(H, W)`` in pixels, multiples of ``patch_size``.
        patch_size: patch side in pixels.

    Returns:
        ``[..., N]`` bool, row-major; all False for an empty (zero-area) box.

    Raises:
        ValueError: bad image / patch size, or ``box`` not shaped ``[..., 4]``.
    """
    gh, gw = grid_shape(image_size, patch_size)
    h, w = _hw(image_size)
    box = torch.as_tensor(box, dtype=torch.float32)
    if box.ndim < 1 or box.shape[-1] != 4:
        raise ValueError(f"box must be shaped [..., 4] (x0, y0, x1, y1), got {tuple(box.shape)}")
    lead = box.shape[:-1]
    lim = torch.tensor([w, h, w, h], dtype=torch.float32)
    x0, y0, x1, y1 = box.reshape(-1, 4).clamp(torch.zeros(4), lim).unbind(1)
    c = patch_centres((h, w), patch_size)  # [N, 2]
    cx, cy = c[None, :, 0], c[None, :, 1]
    mask = (cx >= x0[:, None]) & (cx <= x1[:, None]) & (cy >= y0[:, None]) & (cy <= y1[:, None])
    nonempty = (x1 > x0) & (y1 > y0)
    need = nonempty & ~mask.any(dim=1)
    if bool(need.any()):
        rows = torch.nonzero(need).flatten()
        mask[rows, _patch_index((x0 + x1) / 2, (y0 + y1) / 2, patch_size, gh, gw)[rows]] = True
    mask &= nonempty[:, None]
    return mask.reshape(*lead, gh * gw)
