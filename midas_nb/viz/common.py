"""Drawing helpers shared by the figures: arrays and images back to numpy / RGB, class names for
titles, kept-patch rectangles, non-overlapping point labels."""
from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import torch
from matplotlib.patches import Rectangle

from .output import FONT, Normalization


def to_numpy(x: Any) -> np.ndarray:
    """A tensor (detached, as float32, on the CPU) or anything ``np.asarray`` takes, as a numpy
    array of the same shape."""
    if isinstance(x, torch.Tensor):
        return x.detach().float().cpu().numpy()
    return np.asarray(x)


def image_to_rgb(image: Any, normalization: Normalization = None) -> np.ndarray:
    """``[3,H,W]`` (tensor or array) → ``[H,W,3]`` float in ``[0,1]`` for ``imshow``.

    With ``normalization = (mean, std)`` the backbone normalisation is undone
    (``x·std + mean``); without it each image is min–max rescaled.
    """
    x = to_numpy(image).astype(np.float64)
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


def short_name(name: Any, limit: int = 26) -> str:
    """A class name for a title: CUB's ``"017.Cardinal"`` → ``"Cardinal"``, cut to ``limit`` characters."""
    name = str(name).split(".", 1)[-1].replace("_", " ")
    return name if len(name) <= limit else name[: limit - 1] + "…"


def patch_rects(ax, mask: np.ndarray, rows: int, cols: int, patch_h: float, patch_w: float,
                **style) -> None:
    """Draw one ``Rectangle`` (matplotlib ``style`` keywords) on ``ax`` per true entry of
    ``mask [rows*cols]`` (row-major patch order), each ``patch_w × patch_h`` in data units (px)."""
    for t in np.flatnonzero(mask):
        r, c = divmod(int(t), cols)
        ax.add_patch(Rectangle((c * patch_w, r * patch_h), patch_w, patch_h, **style))


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
    frame = np.array(ax.get_window_extent(renderer).extents)  # [x0, y0, x1, y1]
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
            cost += (box[2] - box[0]) * (box[3] - box[1]) - _overlap(box, frame)   # the part outside the axes
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

