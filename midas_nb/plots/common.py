"""Drawing helpers shared by the figures: images back to RGB, patch grids, panels."""
from __future__ import annotations

import math
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Rectangle

from .output import FONT, Normalization


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
def _np(x: Any) -> np.ndarray:
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def image_to_rgb(image: Any, normalization: Normalization = None) -> np.ndarray:
    """``[3,H,W]`` (tensor or array) → ``[H,W,3]`` float in ``[0,1]`` for ``imshow``.

    With ``normalization = (mean, std)`` the backbone normalisation is undone
    (``x·std + mean``); without it each image is min–max rescaled.
    """
    x = _np(image).astype(np.float64)
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        raise ValueError(f"image must be [3,H,W] (or [1,H,W]), got shape {x.shape}")
    if normalization is not None:
        mean, std = (np.asarray(v, dtype=np.float64).reshape(-1, 1, 1) for v in normalization)
        x = x * std + mean
    else:
        lo, hi = x.min(), x.max()
        x = (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)
    x = np.clip(x, 0.0, 1.0).transpose(1, 2, 0)
    return np.repeat(x, 3, axis=2) if x.shape[2] == 1 else x


def _grid_of(grid: Sequence[int] | int | None, n: int) -> tuple[int, int]:
    if grid is None:
        side = int(round(math.sqrt(n)))
        if side * side != n:
            raise ValueError(f"cannot infer a square patch grid from N={n}; pass grid=(rows, cols)")
        return side, side
    if isinstance(grid, int):
        grid = (grid, grid)
    rows, cols = (int(g) for g in grid)
    if rows * cols != n:
        raise ValueError(f"grid {rows}x{cols} does not hold N={n} patch tokens")
    return rows, cols


def _batch_fields(data: Any, n: int | None) -> dict[str, np.ndarray | list]:
    """Images and annotations of a Sample or Batch (first ``n``) as stacked arrays."""
    if hasattr(data, "images"):
        images, parts, boxes = data.images, data.parts, data.boxes
        part_mask, box_mask = data.part_mask, data.box_mask
        labels = [int(v) for v in _np(data.labels).ravel()]
        ids = list(getattr(data, "image_ids", [str(i) for i in range(len(labels))]))
    elif hasattr(data, "image"):
        images, parts, boxes = data.image[None], data.parts[None], data.box[None]
        part_mask, box_mask = data.part_mask[None], data.box_mask[None]
        labels, ids = [int(data.label)], [str(getattr(data, "image_id", "0"))]
    else:
        raise TypeError(f"expected a midas_nb.data Sample or Batch, got {type(data).__name__}")
    m = len(labels) if n is None else min(int(n), len(labels))
    return dict(images=_np(images)[:m], parts=_np(parts)[:m], boxes=_np(boxes)[:m],
                part_mask=_np(part_mask)[:m].astype(bool), box_mask=_np(box_mask)[:m].astype(bool),
                labels=labels[:m], ids=ids[:m])


def _short_name(name: str, limit: int = 26) -> str:
    """A class name for a panel title: CUB's ``"017.Cardinal"`` → ``"Cardinal"``, truncated."""
    name = str(name).split(".", 1)[-1].replace("_", " ")
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _patch_rects(ax, mask: np.ndarray, rows: int, cols: int, patch_h: float, patch_w: float,
                 **style) -> None:
    for t in np.flatnonzero(mask):
        r, c = divmod(int(t), cols)
        ax.add_patch(Rectangle((c * patch_w, r * patch_h), patch_w, patch_h, **style))


def _draw_grid(ax, rows: int, cols: int, H: int, W: int) -> None:
    for r in range(1, rows):
        ax.axhline(r * H / rows, color="white", lw=0.4, alpha=0.6)
    for c in range(1, cols):
        ax.axvline(c * W / cols, color="white", lw=0.4, alpha=0.6)


def _pixel_axes(ax, show_labels: bool) -> None:
    ax.tick_params(labelsize=FONT["tick"] - 1)
    if show_labels:
        ax.set_xlabel("x (px)", fontsize=FONT["tick"])
        ax.set_ylabel("y (px)", fontsize=FONT["tick"])


def _panels(n: int, ncols: int, size: float = 3.0):
    ncols = max(1, min(ncols, n))
    nrows = math.ceil(n / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(size * ncols, size * nrows + 0.6), squeeze=False)
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    return fig, axes.ravel()[:n]


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------
def _normalise_map(m: np.ndarray, how: str) -> np.ndarray:
    if how == "rank":
        order = np.argsort(np.argsort(m, kind="stable"), kind="stable")
        return order / max(1, m.size - 1)
    lo, hi = np.nanmin(m), np.nanmax(m)
    return (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)


def place_point_labels(ax, points: Sequence[tuple[float, float]], labels: Sequence[str], *,
                       fontsize: float | None = None, pad: float = 2.0) -> list:
    """Annotate each data point with its label so that no two labels overlap, none covers a
    marker and each stays inside the axes.

    Greedy: the labels are placed in order; each tries offsets (points) around its marker,
    nearest first, and takes the first whose box (measured with the figure's renderer) clears
    the boxes already placed and every marker; when none does, the one with the least overlap.
    Call it after the axes' limits and the figure's layout are final (offsets are in points,
    positions in data units). Returns the annotations.
    """
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    fontsize = FONT["annot"] if fontsize is None else fontsize
    to_px = ax.transData.transform
    marker_r = 6.0 * fig.dpi / 72  # half a marker (ms 8) plus a little, in pixels
    markers = [np.r_[to_px(p) - marker_r, to_px(p) + marker_r] for p in points]
    frame = ax.get_window_extent(renderer)
    offsets = [(dx * r, dy * r) for r in (7, 14, 24) for dx, dy in
               ((1, 0.7), (1, -1.2), (-1, 0.7), (-1, -1.2), (0, 1.3), (0, -1.8), (1.2, 0), (-1.2, 0))]
    placed: list[np.ndarray] = []
    texts = []
    for (x, y), label in zip(points, labels):
        best = None
        for dx, dy in offsets:
            t = ax.annotate(label, (x, y), textcoords="offset points", xytext=(dx, dy), fontsize=fontsize,
                            ha="left" if dx > 0 else "right" if dx < 0 else "center",
                            va="bottom" if dy > 0 else "top" if dy < 0 else "center")
            bb = t.get_window_extent(renderer)
            box = np.array([bb.x0 - pad, bb.y0 - pad, bb.x1 + pad, bb.y1 + pad])
            cost = sum(_overlap(box, o) for o in placed + markers)
            cost += _overlap_outside(box, frame)
            if best is None or cost < best[0]:
                if best is not None:
                    best[1].remove()
                best = (cost, t, box)
            else:
                t.remove()
            if cost == 0:
                break
        placed.append(best[2])
        texts.append(best[1])
    return texts


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    """Area shared by two boxes ``[x0, y0, x1, y1]`` (pixels)."""
    w = min(a[2], b[2]) - max(a[0], b[0])
    h = min(a[3], b[3]) - max(a[1], b[1])
    return float(w * h) if w > 0 and h > 0 else 0.0


def _overlap_outside(box: np.ndarray, frame) -> float:
    """Area of ``box`` outside the axes' frame."""
    inside = _overlap(box, np.array([frame.x0, frame.y0, frame.x1, frame.y1]))
    return float((box[2] - box[0]) * (box[3] - box[1])) - inside
