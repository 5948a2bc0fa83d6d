"""Figures over the photos: part keypoints on the patch grid, target heatmaps, kept patch tokens."""
from __future__ import annotations

import math
import textwrap
from typing import Any, Literal, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.collections import LineCollection
from matplotlib.lines import Line2D

from .colors import BOX_COLOR, KEYPOINT_COLOR, PART_COLOR
from .common import image_to_rgb, patch_rects, to_numpy
from .output import finish_figure, FONT, Normalization


# ---------------------------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------------------------
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
        labels = [int(v) for v in to_numpy(data.labels).ravel()]
        ids = list(getattr(data, "image_ids", [str(i) for i in range(len(labels))]))
    elif hasattr(data, "image"):
        images, parts, boxes = data.image[None], data.parts[None], data.box[None]
        part_mask, box_mask = data.part_mask[None], data.box_mask[None]
        labels, ids = [int(data.label)], [str(getattr(data, "image_id", "0"))]
    else:
        raise TypeError(f"expected a midas_nb.data Sample or Batch, got {type(data).__name__}")
    m = len(labels) if n is None else min(int(n), len(labels))
    return dict(images=to_numpy(images)[:m], parts=to_numpy(parts)[:m], boxes=to_numpy(boxes)[:m],
                part_mask=to_numpy(part_mask)[:m].astype(bool), box_mask=to_numpy(box_mask)[:m].astype(bool),
                labels=labels[:m], ids=ids[:m])


def _short_name(name: str, limit: int = 26) -> str:
    """A class name for a panel title: CUB's ``"017.Cardinal"`` → ``"Cardinal"``, truncated."""
    name = str(name).split(".", 1)[-1].replace("_", " ")
    return name if len(name) <= limit else name[: limit - 1] + "…"


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


def _normalise_map(m: np.ndarray, how: str) -> np.ndarray:
    if how == "rank":
        order = np.argsort(np.argsort(m, kind="stable"), kind="stable")
        return order / max(1, m.size - 1)
    lo, hi = np.nanmin(m), np.nanmax(m)
    return (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def show_parts_on_grid(data: Any, patch_size: int, *, n: int = 4, ncols: int = 4,
                       normalization: Normalization = None, class_names: Sequence[str] | None = None,
                       save: str | None = None) -> Figure:
    """Photos with part keypoints, the part-mask patches and the object box on the patch grid.

    Shows what part mIoU compares kept tokens against (DESIGN.md §6): a patch is "part" when
    it holds a visible keypoint after the image's resize/crop. Datasets without part keypoints
    (FGVC-Aircraft, Stanford Cars: ``parts`` is ``[B, 0, 3]``) show the box patches instead,
    which box coverage compares kept tokens against.

    Args:
        data: a :class:`midas_nb.data.Sample` or :class:`midas_nb.data.Batch` (first ``n``).
        patch_size: patch side in pixels (``H/p`` rows of patches).
        n: images to show. ncols: panels per row.
        normalization: ``(mean, std)`` of the backbone to undo for display.
        class_names: names indexed by label, for the panel titles.
        save: figure name for :func:`save_figure`.
    """
    f = _batch_fields(data, n)
    B, _, H, W = f["images"].shape
    rows, cols = H // int(patch_size), W // int(patch_size)
    boxes_only = f["parts"].ndim < 2 or f["parts"].shape[1] == 0  # no part keypoints: box coverage
    kind = "box" if boxes_only else "part"
    masks = f["box_mask"] if boxes_only else f["part_mask"]
    fig, axes = _panels(B, ncols)
    for i, ax in enumerate(axes):
        ax.imshow(image_to_rgb(f["images"][i], normalization), extent=(0, W, H, 0))
        _draw_grid(ax, rows, cols, H, W)
        patch_rects(ax, masks[i], rows, cols, H / rows, W / cols,
                    facecolor=PART_COLOR, edgecolor="darkorange", alpha=0.45, lw=0.8)
        x0, y0, x1, y1 = f["boxes"][i]
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=BOX_COLOR, lw=1.8))
        parts = f["parts"][i]
        vis = parts[:, 2] > 0 if parts.size else np.zeros(0, bool)
        if vis.any():
            ax.scatter(parts[vis, 0], parts[vis, 1], s=22, c=KEYPOINT_COLOR, edgecolors="white", linewidths=0.7,
                       zorder=3)
        ax.set_xlim(0, W)
        ax.set_ylim(H, 0)
        label = f["labels"][i]
        name = (_short_name(class_names[label]) if class_names is not None and 0 <= label < len(class_names)
                else f"class {label}")
        ax.set_title(f"{name}\n{kind} patches: {int(masks[i].sum())} of {rows * cols}",
                     fontsize=FONT["annot"])
        _pixel_axes(ax, show_labels=(i % max(1, min(ncols, B)) == 0))
    handles = ([] if boxes_only else
               [Line2D([], [], marker="o", ls="", color=KEYPOINT_COLOR, mec="white", label="visible part keypoint")])
    handles += [Patch(facecolor=PART_COLOR, edgecolor="darkorange", alpha=0.6,
                      label=f"{kind} patch ({patch_size}×{patch_size} px)"),
                Patch(fill=False, edgecolor=BOX_COLOR, lw=1.8, label="object box")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=FONT["legend"], frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(f"Object boxes on the {rows}×{cols} patch grid (no part keypoints: box coverage)" if boxes_only
                 else f"Part keypoints on the {rows}×{cols} patch grid", fontsize=FONT["title"])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return finish_figure(fig, save)


def target_heatmaps(images: Any, maps: Mapping[str, Any], grid: Sequence[int] | int | None = None, *,
                    normalization: Normalization = None, normalize: Literal["rank", "minmax"] = "rank",
                    indices: Sequence[int] | Any | None = None, titles: Mapping[str, str] | None = None,
                    row_labels: Sequence[str] | None = None, alpha: float = 0.6, title: str | None = None,
                    save: str | None = None, part_mask: Any | None = None,
                    class_names: Sequence[str] | None = None, ncols: int = 6,
                    panel_size: float = 1.9) -> Figure:
    """Target maps over the photos: one block of panels per image (the photo, then one panel per
    target, ``ncols`` panels to a row), each panel titled with its target id.

    Each map is normalised per image — by rank (``"rank"``, the percentile of each token in
    that image's ranking: what top-k pruning uses) or min–max — so that targets with
    different units (probabilities, signed input×gradient, votes) share one colour bar. Where
    a part mask is known, the part patches are outlined on every panel, so one sees whether a
    target's hot tokens fall on the parts part mIoU counts. With the defaults, 3 images × 11
    targets make 6 rows × 6 panels of 1.9 in: 12.3 in wide, legible in an HTML export.

    Args:
        images: ``[B,3,H,W]`` images (normalised for the backbone), or a
            :class:`midas_nb.data.Batch` (its ``images``; its ``part_mask`` and ``labels``
            unless ``part_mask`` / ``row_labels`` are given).
        maps: ``{target id: [B,N]}`` maps on the same images, in panel order; or maps over a
            whole split (``[M,N]``) with ``indices`` naming the rows of ``images``.
        grid: patch grid ``(rows, cols)``; ``None`` → square from ``N``.
        normalization: ``(mean, std)`` to undo for display.
        normalize: ``"rank"`` or ``"minmax"`` (per image and target).
        indices: ``[B]`` rows of the maps that belong to ``images`` (e.g. ``batch.indices``).
        titles: panel titles per target id (default: the id).
        row_labels: one label per image (default: the class name from ``class_names`` and the
            batch's labels, wrapped at 20 characters, else ``"image b"``).
        alpha: opacity of the heat map over the photo.
        title: figure title (default "Target maps on the R×C patch grid").
        save: figure name for :func:`save_figure`.
        part_mask: ``[B,N]`` bool part patches to outline; ``None`` → the batch's, if any.
            An image without part patches (box-only datasets) gets no outline.
        class_names: class names indexed by label (e.g. ``study.test_set.class_names``).
        ncols: panels per row (photo included), at least 2.
        panel_size: panel side in inches.

    Raises:
        ValueError: empty ``maps``, an unknown ``normalize``, a map with fewer rows than images,
            a ``grid`` that does not hold ``N`` tokens, or ``ncols < 2``.
    """
    if normalize not in ("rank", "minmax"):
        raise ValueError(f"normalize must be 'rank' or 'minmax', got {normalize!r}")
    if not maps:
        raise ValueError("maps is empty; expected {target id: [B,N]}")
    if ncols < 2:
        raise ValueError(f"ncols must be at least 2 (the photo and one map), got {ncols}")
    labels = None
    if hasattr(images, "images"):  # a Batch
        part_mask = images.part_mask if part_mask is None else part_mask
        labels = [int(v) for v in to_numpy(images.labels).ravel()]
        images = images.images
    imgs = to_numpy(images)
    if imgs.ndim == 3:
        imgs = imgs[None]
    B, _, H, W = imgs.shape
    ids = list(maps)
    arrs = {k: to_numpy(v).reshape(-1, to_numpy(v).shape[-1]) for k, v in maps.items()}
    if indices is not None:
        rows_sel = to_numpy(indices).astype(int).ravel()
        arrs = {k: a[rows_sel] for k, a in arrs.items()}
    for k, a in arrs.items():
        if a.shape[0] < B:
            raise ValueError(f"map {k!r} has {a.shape[0]} rows for {B} images")
    rows, cols = _grid_of(grid, arrs[ids[0]].shape[1])
    parts = None if part_mask is None else to_numpy(part_mask).astype(bool).reshape(-1, rows * cols)
    if row_labels is None:
        row_labels = ([textwrap.fill(_short_name(class_names[lbl], 60), 20) for lbl in labels]
                      if class_names is not None and labels
                      else [f"image {b}" for b in range(B)])
    n_panels = len(ids) + 1
    fig_cols = min(ncols, n_panels)
    per_image = -(-n_panels // fig_cols)
    fig, grid_axes = plt.subplots(B * per_image, fig_cols, squeeze=False,
                                  figsize=(panel_size * fig_cols + 0.9, (panel_size + 0.25) * B * per_image + 0.8))
    im = None
    for b in range(B):
        rgb = image_to_rgb(imgs[b], normalization)
        panels = grid_axes[b * per_image:(b + 1) * per_image].ravel()
        for ax in panels[n_panels:]:
            ax.set_visible(False)
        panels[0].imshow(rgb, extent=(0, W, H, 0))
        panels[0].set_title("photo", fontsize=FONT["annot"])
        panels[0].set_ylabel(row_labels[b], fontsize=FONT["label"], fontweight="bold")
        for ax, k in zip(panels[1:], ids):
            m = _normalise_map(arrs[k][b].astype(np.float64), normalize).reshape(rows, cols)
            ax.imshow(rgb, extent=(0, W, H, 0))
            im = ax.imshow(m, extent=(0, W, H, 0), cmap="inferno", vmin=0, vmax=1, alpha=alpha,
                           interpolation="nearest")
            ax.set_title((titles or {}).get(k, k), fontsize=FONT["annot"])
        for ax in panels[:n_panels]:
            ax.set_xticks([])
            ax.set_yticks([])
            if parts is not None and parts[b].any():
                _part_outline(ax, parts[b], rows, cols, H, W)
    label = ("rank percentile within the image (1 = highest, kept first)" if normalize == "rank"
             else "min–max normalised score per image")
    fig.tight_layout(rect=(0, 0, 1 - 0.9 / (panel_size * fig_cols + 0.9), 0.97))
    cax = fig.add_axes((1 - 0.7 / (panel_size * fig_cols + 0.9), 0.15, 0.015, 0.7))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label(label, fontsize=FONT["annot"])
    cb.ax.tick_params(labelsize=FONT["tick"])
    outlined = " (gold outline: part patches)" if parts is not None and parts[:B].any() else ""
    fig.suptitle((title or f"Target maps on the {rows}×{cols} patch grid") + outlined, fontsize=FONT["title"])
    return finish_figure(fig, save)


def _part_outline(ax, mask: np.ndarray, rows: int, cols: int, H: int, W: int) -> None:
    """Outline the region of the ``True`` patches of ``mask [rows*cols]`` (one LineCollection,
    ``gid="part outline"``): the patch edges between a part patch and a non-part patch or the border."""
    m = np.asarray(mask, dtype=bool).reshape(rows, cols)
    ph, pw = H / rows, W / cols
    padded = np.pad(m, 1)
    segs = []
    for r, c in zip(*np.nonzero(m)):
        x0, y0, x1, y1 = c * pw, r * ph, (c + 1) * pw, (r + 1) * ph
        if not padded[r, c + 1]:      # above
            segs.append([(x0, y0), (x1, y0)])
        if not padded[r + 2, c + 1]:  # below
            segs.append([(x0, y1), (x1, y1)])
        if not padded[r + 1, c]:      # left
            segs.append([(x0, y0), (x0, y1)])
        if not padded[r + 1, c + 2]:  # right
            segs.append([(x1, y0), (x1, y1)])
    ax.add_collection(LineCollection(segs, colors=PART_COLOR, linewidths=1.1, gid="part outline"))


# ---------------------------------------------------------------------------------------------
# pruning
# ---------------------------------------------------------------------------------------------
def kept_tokens_overlay(image: Any, keep_mask: Any, grid: Sequence[int] | int | None = None, *,
                        part_mask: Any | None = None, titles: Sequence[str] | None = None,
                        normalization: Normalization = None, ncols: int = 4, dim: float = 0.75,
                        suptitle: str | None = None, save: str | None = None) -> Figure:
    """The kept patch tokens over the photo: dropped patches are dimmed.

    Args:
        image: ``[3,H,W]`` or ``[B,3,H,W]`` images (normalised for the backbone).
        keep_mask: ``[N]`` or ``[B,N]`` bool, kept patch tokens (row-major).
        grid: patch grid ``(rows, cols)``; ``None`` → square from ``N``.
        part_mask: optional ``[B,N]`` part patches, outlined in gold.
        titles: one title per panel.
        normalization: ``(mean, std)`` to undo for display.
        ncols: panels per row. dim: darkness of dropped patches (0 = none, 1 = black).
        suptitle: figure title. save: figure name for :func:`save_figure`.
    """
    imgs = to_numpy(image)
    keep = to_numpy(keep_mask).astype(bool)
    if imgs.ndim == 3:
        imgs = imgs[None]
    if keep.ndim == 1:
        keep = keep[None]
    if keep.shape[0] != imgs.shape[0]:
        raise ValueError(f"keep_mask has {keep.shape[0]} rows for {imgs.shape[0]} images")
    parts = None if part_mask is None else to_numpy(part_mask).astype(bool).reshape(keep.shape)
    B, _, H, W = imgs.shape
    rows, cols = _grid_of(grid, keep.shape[1])
    fig, axes = _panels(B, ncols, size=3.0)
    for b, ax in enumerate(axes):
        ax.imshow(image_to_rgb(imgs[b], normalization), extent=(0, W, H, 0))
        shade = np.zeros((rows, cols, 4))
        shade[..., 3] = np.where(keep[b].reshape(rows, cols), 0.0, dim)
        ax.imshow(shade, extent=(0, W, H, 0), interpolation="nearest")
        patch_rects(ax, keep[b], rows, cols, H / rows, W / cols, fill=False, edgecolor="white", lw=0.6)
        if parts is not None:
            patch_rects(ax, parts[b], rows, cols, H / rows, W / cols, fill=False, edgecolor=PART_COLOR, lw=1.4,
                        ls="--")
        ax.set_xticks([])
        ax.set_yticks([])
        t = titles[b] if titles is not None and b < len(titles) else f"image {b}"
        ax.set_title(f"{t}\nkept {int(keep[b].sum())}/{rows * cols} tokens", fontsize=FONT["annot"])
    handles = [Patch(facecolor="white", edgecolor="0.3", label="kept patch token"),
               Patch(facecolor=(0, 0, 0, dim), label="dropped patch token")]
    if parts is not None:
        handles.append(Patch(fill=False, edgecolor=PART_COLOR, ls="--", lw=1.4, label="part patch"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=FONT["legend"], frameon=False)
    top = 1.0
    if suptitle:
        fig.suptitle(suptitle, fontsize=FONT["title"])
        top = 1.0 - 0.45 / fig.get_figheight()
    fig.tight_layout(rect=(0, 0.07, 1, top))
    return finish_figure(fig, save)
