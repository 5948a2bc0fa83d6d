"""Figures over the photos: part keypoints on the patch grid, target heatmaps."""
from __future__ import annotations

import math
import textwrap
from typing import Any, Literal, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch
from matplotlib.collections import LineCollection

from .common import (BOX_HANDLE, class_name, colorbar, draw_parts_or_box, finish_figure, FONT, image_to_rgb,
                     KEYPOINT_HANDLE, label_axes, Normalization, panel_grid, PART_COLOR, patch_rects, to_numpy,
                     unit_range)


def show_parts_on_grid(data: Any, patch_size: int, *, n: int = 4, normalization: Normalization = None,
                       class_names: Sequence[str] | None = None, save: str | None = None) -> Figure:
    """The first ``n`` photos of a :class:`midas_nb.data.Batch` with part keypoints, part-mask patches and the
    object box on the grid of ``patch_size``-pixel patches: what part mIoU compares kept tokens against (DESIGN.md
    §6); without part keypoints (``parts [B,0,3]``) the box patches. ``normalization``: ``(mean, std)`` to undo."""
    images = to_numpy(data.images)[:n]
    B, _, H, W = images.shape
    parts_all = to_numpy(data.parts)[:B]
    rows, cols = H // int(patch_size), W // int(patch_size)
    boxes_only = parts_all.ndim < 2 or parts_all.shape[1] == 0  # no part keypoints: box coverage
    kind = "box" if boxes_only else "part"
    masks = to_numpy(data.box_mask if boxes_only else data.part_mask)[:B].astype(bool)
    fig, axes = panel_grid(B, 4, (3.0, 3.0), (0, 0.6))
    for i, ax in enumerate(axes):
        ax.imshow(image_to_rgb(images[i], normalization), extent=(0, W, H, 0))
        ax.hlines(np.arange(1, rows) * H / rows, 0, W, color="white", lw=0.4, alpha=0.6)
        ax.vlines(np.arange(1, cols) * W / cols, 0, H, color="white", lw=0.4, alpha=0.6)
        patch_rects(ax, masks[i], rows, cols, H / rows, W / cols,
                    facecolor=PART_COLOR, edgecolor="darkorange", alpha=0.45, lw=0.8)
        draw_parts_or_box(ax, parts_all[i], data.boxes[i])
        ax.set(xlim=(0, W), ylim=(H, 0))
        first = ax.get_subplotspec().is_first_col()
        label_axes(ax, "x (px)" if first else None, "y (px)" if first else None, grid=None, size=FONT["tick"],
                   title=f"{class_name(class_names, int(data.labels[i]))}\n{kind} patches: {int(masks[i].sum())} "
                         f"of {rows * cols}", title_size=FONT["annot"])
    handles = [] if boxes_only else [KEYPOINT_HANDLE]
    handles += [Patch(facecolor=PART_COLOR, edgecolor="darkorange", alpha=0.6,
                      label=f"{kind} patch ({patch_size}×{patch_size} px)"), BOX_HANDLE]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=FONT["legend"], frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(f"Object boxes on the {rows}×{cols} patch grid (no part keypoints: box coverage)" if boxes_only
                 else f"Part keypoints on the {rows}×{cols} patch grid", fontsize=FONT["title"])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return finish_figure(fig, save)


def target_heatmaps(images: Any, maps: Mapping[str, Any], grid: Sequence[int] | int | None = None, *,
                    normalization: Normalization = None, normalize: Literal["rank", "minmax"] = "rank",
                    indices: Sequence[int] | Any | None = None, title: str | None = None, save: str | None = None,
                    part_mask: Any | None = None, class_names: Sequence[str] | None = None) -> Figure:
    """Target maps over the photos (the photo, then a panel per target, six a row), part patches outlined; each
    map normalised per image by ``"rank"`` (percentile, what top-k uses) or ``"minmax"``: one colour bar for all.
    ``images``: ``[B,3,H,W]`` or a :class:`midas_nb.data.Batch`; ``maps``: ``{target id: [B,N]}``, or ``[M,N]``
    with ``indices [B]``; ``grid``: ``(rows, cols)`` (``None``: square); ``part_mask``: ``[B,N]`` bool.
    ValueError: empty ``maps``, an unknown ``normalize``, a map too short or a ``grid`` not holding ``N`` tokens."""
    if normalize not in ("rank", "minmax"):
        raise ValueError(f"normalize must be 'rank' or 'minmax', got {normalize!r}")
    if not maps:
        raise ValueError("maps is empty; expected {target id: [B,N]}")
    labels = None
    if hasattr(images, "images"):  # a Batch
        part_mask = images.part_mask if part_mask is None else part_mask
        labels = [int(v) for v in to_numpy(images.labels).ravel()]
        images = images.images
    imgs = to_numpy(images)
    B, _, H, W = imgs.shape
    rows_of = slice(None) if indices is None else to_numpy(indices).astype(int).ravel()
    arrs = {k: to_numpy(v).reshape(-1, to_numpy(v).shape[-1])[rows_of] for k, v in maps.items()}
    if short := [k for k, a in arrs.items() if a.shape[0] < B]:
        raise ValueError(f"map {short[0]!r} has {arrs[short[0]].shape[0]} rows for {B} images")
    ids, n = list(arrs), next(iter(arrs.values())).shape[1]
    rows, cols = (math.isqrt(n),) * 2 if grid is None else (grid, grid) if isinstance(grid, int) else map(int, grid)
    if rows * cols != n:
        raise ValueError(f"grid {rows}x{cols} does not hold N={n} patch tokens; pass grid=(rows, cols)")
    parts = None if part_mask is None else to_numpy(part_mask).astype(bool).reshape(-1, rows * cols)
    row_labels = ([textwrap.fill(class_name(class_names, lbl, 60), 20) for lbl in labels]
                  if class_names is not None and labels else [f"image {b}" for b in range(B)])
    n_panels, fig_cols = len(ids) + 1, min(6, len(ids) + 1)
    per_image = -(-n_panels // fig_cols)
    width = 1.9 * fig_cols + 0.9   # 1.9 in panels and the colour bar: 3 images × 11 targets are 12.3 in wide
    fig, grid_axes = plt.subplots(B * per_image, fig_cols, squeeze=False,
                                  figsize=(width, (1.9 + 0.25) * B * per_image + 0.8))
    for b in range(B):
        rgb = image_to_rgb(imgs[b], normalization)
        panels = grid_axes[b * per_image:(b + 1) * per_image].ravel()
        for ax in panels[n_panels:]:
            ax.set_visible(False)
        panels[0].set_ylabel(row_labels[b], fontsize=FONT["label"], fontweight="bold")
        for ax, k in zip(panels, ["photo", *ids]):
            ax.imshow(rgb, extent=(0, W, H, 0))
            ax.set(xticks=[], yticks=[])
            ax.set_title(k, fontsize=FONT["annot"])
            if k != "photo":    # the map in [0, 1] over the photo
                m = arrs[k][b].astype(np.float64)
                m = (np.argsort(np.argsort(m, kind="stable"), kind="stable") / max(1, m.size - 1)
                     if normalize == "rank" else unit_range(m))
                im = ax.imshow(m.reshape(rows, cols), extent=(0, W, H, 0), cmap="inferno", vmin=0, vmax=1,
                               alpha=0.6, interpolation="nearest")
            if parts is not None and parts[b].any():
                _part_outline(ax, parts[b], rows, cols, H, W)
    label = ("rank percentile within the image (1 = its highest score)" if normalize == "rank"
             else "min–max normalised score per image")
    fig.tight_layout(rect=(0, 0, 1 - 0.9 / width, 0.97))
    colorbar(fig, im, label, cax=fig.add_axes((1 - 0.7 / width, 0.15, 0.015, 0.7)))
    outlined = " (gold outline: part patches)" if parts is not None and parts[:B].any() else ""
    fig.suptitle((title or f"Target maps on the {rows}×{cols} patch grid") + outlined, fontsize=FONT["title"])
    return finish_figure(fig, save)


def _part_outline(ax, mask: np.ndarray, rows: int, cols: int, H: int, W: int) -> None:
    """Outline the ``True`` patches of ``mask [rows*cols]`` (one LineCollection, ``gid="part outline"``)."""
    m = np.pad(np.asarray(mask, dtype=bool).reshape(rows, cols), 1)
    ph, pw = H / rows, W / cols
    horizontal = np.argwhere(m[1:, 1:-1] != m[:-1, 1:-1])    # (r, c): an edge at y = r·ph from x = c·pw
    vertical = np.argwhere(m[1:-1, 1:] != m[1:-1, :-1])      # (r, c): an edge at x = c·pw from y = r·ph
    segs = ([[(c * pw, r * ph), ((c + 1) * pw, r * ph)] for r, c in horizontal]
            + [[(c * pw, r * ph), (c * pw, (r + 1) * ph)] for r, c in vertical])
    ax.add_collection(LineCollection(segs, colors=PART_COLOR, linewidths=1.1, gid="part outline"))
