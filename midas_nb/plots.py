"""Figures of the MIDAS notebooks (matplotlib only), one function per figure.

Every function returns a :class:`matplotlib.figure.Figure` with labelled axes (units in the
labels), a legend or colour bar where colours carry meaning, and font sizes readable at
notebook width. With ``save="name"`` the figure is also written to
``<output dir>/<notebook>_<name>.png`` (DESIGN.md §1: figures are named after the notebook);
the notebook and the output directory are set once per notebook with :func:`set_output`
(default directory: :func:`midas_nb.config.figures_dir`).

Figures are made with ``pyplot`` so that Jupyter's inline backend shows each one exactly once
at the end of its cell (notebook cells assign ``fig = plots.x(...)``, which prints no repr).
Under a non-interactive backend (``Agg``: scripts, tests, nbval with ``MPLBACKEND=Agg``) the
figure is closed as soon as it is drawn and saved, so long runs never accumulate open figures.

Figures:

- :func:`show_parts_on_grid` — photos with part keypoints, the part-mask patches of the patch
  grid and the object box (how part mIoU sees an image, DESIGN.md §6).
- :func:`target_heatmaps` — target maps ``[B,N]`` over the photos: rows = images, columns =
  targets (DESIGN.md §4).
- :func:`taxonomy_table` — the T0–T5 taxonomy (source × operator) as a DataFrame.
- :func:`coverage_vs_faithfulness` — part mIoU vs IDAUC per condition with CIs and the
  IDAUC parity band around the reference (DESIGN.md §6).
- :func:`cosine_heatmap` — the cosine matrix of target rankings with one pair called out;
  :func:`cosine_depth_lines` — chosen pairs across depths.
- :func:`regime_heatmap`, :func:`regime_lines` — D over depth × budget, in-band cells marked.
- :func:`scale_plot` — D per backbone.
- :func:`kept_tokens_overlay` — the kept patch tokens over the photo.
- :func:`insertion_deletion_curves` — the curves behind IDAUC (Petsiuk et al., 2018, RISE,
  https://arxiv.org/abs/1806.07421).
- :func:`perturbation_curves` — TokenTM's positive / negative perturbation tests (Wu et al.,
  2024, https://arxiv.org/abs/2403.14552).
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.lines import Line2D

from . import config

__all__ = [
    "set_output",
    "figure_path",
    "save_figure",
    "save_table",
    "image_to_rgb",
    "show_parts_on_grid",
    "target_heatmaps",
    "taxonomy_table",
    "coverage_vs_faithfulness",
    "cosine_heatmap",
    "cosine_depth_lines",
    "regime_heatmap",
    "regime_lines",
    "scale_plot",
    "kept_tokens_overlay",
    "insertion_deletion_curves",
    "perturbation_curves",
]

#: font sizes used by every figure (points)
FONT = dict(title=12, label=11, tick=9, annot=9, legend=9)

_STATE: dict[str, Any] = {"notebook": None, "directory": None}

Normalization = tuple[Sequence[float], Sequence[float]] | None


# ---------------------------------------------------------------------------------------------
# output
# ---------------------------------------------------------------------------------------------
def set_output(notebook: str | None, directory: str | Path | None = None) -> Path:
    """Name the notebook whose figures follow and where they go; returns the directory.

    Args:
        notebook: the notebook's stem (``"02_three_condition_protocol"``); it prefixes every
            saved figure and table. ``None`` → no prefix.
        directory: output directory; ``None`` → :func:`midas_nb.config.figures_dir`.
    """
    _STATE["notebook"] = notebook
    _STATE["directory"] = Path(directory).expanduser() if directory is not None else None
    return output_dir()


def output_dir() -> Path:
    """The directory :func:`set_output` chose (created), else ``config.figures_dir()``."""
    d = _STATE["directory"]
    if d is None:
        return config.figures_dir()
    d.mkdir(parents=True, exist_ok=True)
    return d


def figure_path(name: str, suffix: str = ".png") -> Path:
    """``<output dir>/<notebook>_<name><suffix>`` (no notebook prefix when none is set)."""
    if not name or any(c in name for c in "/\\"):
        raise ValueError(f"figure name must be a plain file stem, got {name!r}")
    stem = f"{_STATE['notebook']}_{name}" if _STATE["notebook"] else name
    return output_dir() / f"{stem}{suffix}"


def save_figure(fig: Figure, name: str, dpi: int = 130) -> Path:
    """Write ``fig`` as PNG to :func:`figure_path` ``(name)``; returns the path."""
    path = figure_path(name)
    fig.savefig(path, dpi=dpi, bbox_inches="tight", facecolor="white")
    return path


def save_table(table: pd.DataFrame, name: str) -> Path:
    """Write ``table`` as CSV beside the figures (``<output dir>/<notebook>_<name>.csv``), atomically
    (:func:`midas_nb.identity.atomic_write_text`); list columns (per-image values) as JSON."""
    from .identity import atomic_write_text
    from .results import _encode_lists

    path = figure_path(name, ".csv")
    atomic_write_text(path, _encode_lists(table).to_csv(index=False))
    return path


def _interactive_backend() -> bool:
    backend = matplotlib.get_backend().lower()
    return "inline" in backend or "ipympl" in backend or "widget" in backend or backend in {
        "qtagg", "tkagg", "macosx", "gtk3agg", "gtk4agg", "wxagg", "nbagg", "webagg", "qt5agg"}


def _finish(fig: Figure, save: str | None) -> Figure:
    if save:
        save_figure(fig, save)
    if not _interactive_backend():
        plt.close(fig)          # the Figure object stays usable (savefig, axes) after closing
    return fig


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
        _patch_rects(ax, masks[i], rows, cols, H / rows, W / cols,
                     facecolor="gold", edgecolor="darkorange", alpha=0.45, lw=0.8)
        x0, y0, x1, y1 = f["boxes"][i]
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor="cyan", lw=1.8))
        parts = f["parts"][i]
        vis = parts[:, 2] > 0 if parts.size else np.zeros(0, bool)
        if vis.any():
            ax.scatter(parts[vis, 0], parts[vis, 1], s=22, c="red", edgecolors="white", linewidths=0.7,
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
               [Line2D([], [], marker="o", ls="", color="red", markeredgecolor="white", label="visible part keypoint")])
    handles += [Patch(facecolor="gold", edgecolor="darkorange", alpha=0.6,
                      label=f"{kind} patch ({patch_size}×{patch_size} px)"),
                Patch(fill=False, edgecolor="cyan", lw=1.8, label="object box")]
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=FONT["legend"], frameon=False,
               bbox_to_anchor=(0.5, -0.02))
    fig.suptitle(f"Object boxes on the {rows}×{cols} patch grid (no part keypoints: box coverage)" if boxes_only
                 else f"Part keypoints on the {rows}×{cols} patch grid", fontsize=FONT["title"])
    fig.tight_layout(rect=(0, 0.05, 1, 1))
    return _finish(fig, save)


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------
def _normalise_map(m: np.ndarray, how: str) -> np.ndarray:
    if how == "rank":
        order = np.argsort(np.argsort(m, kind="stable"), kind="stable")
        return order / max(1, m.size - 1)
    lo, hi = np.nanmin(m), np.nanmax(m)
    return (m - lo) / (hi - lo) if hi > lo else np.zeros_like(m)


def target_heatmaps(images: Any, maps: Mapping[str, Any], grid: Sequence[int] | int | None = None, *,
                    normalization: Normalization = None, normalize: Literal["rank", "minmax"] = "rank",
                    indices: Sequence[int] | Any | None = None, titles: Mapping[str, str] | None = None,
                    row_labels: Sequence[str] | None = None, alpha: float = 0.6, title: str | None = None,
                    save: str | None = None) -> Figure:
    """Target maps over the photos: rows = images, columns = targets.

    Each map is normalised per image — by rank (``"rank"``, the percentile of each token in
    that image's ranking: what top-k pruning uses) or min–max — so that targets with
    different units (probabilities, signed input×gradient, votes) share one colour bar.

    Args:
        images: ``[B,3,H,W]`` images (normalised for the backbone).
        maps: ``{target id: [B,N]}`` maps on the same images, in column order; or maps over a
            whole split (``[M,N]``) with ``indices`` naming the rows of ``images``.
        grid: patch grid ``(rows, cols)``; ``None`` → square from ``N``.
        normalization: ``(mean, std)`` to undo for display.
        normalize: ``"rank"`` or ``"minmax"`` (per image and target).
        indices: ``[B]`` rows of the maps that belong to ``images`` (e.g. ``batch.indices``).
        titles: column titles per target id (default: the id).
        row_labels: one label per image row.
        alpha: opacity of the heat map over the photo.
        title: figure title (default "Target maps on the R×C patch grid").
        save: figure name for :func:`save_figure`.
    """
    if normalize not in ("rank", "minmax"):
        raise ValueError(f"normalize must be 'rank' or 'minmax', got {normalize!r}")
    if not maps:
        raise ValueError("maps is empty; expected {target id: [B,N]}")
    imgs = _np(images)
    if imgs.ndim == 3:
        imgs = imgs[None]
    B, _, H, W = imgs.shape
    ids = list(maps)
    arrs = {k: _np(v).reshape(-1, _np(v).shape[-1]) for k, v in maps.items()}
    if indices is not None:
        rows_sel = _np(indices).astype(int).ravel()
        arrs = {k: a[rows_sel] for k, a in arrs.items()}
    for k, a in arrs.items():
        if a.shape[0] < B:
            raise ValueError(f"map {k!r} has {a.shape[0]} rows for {B} images")
    rows, cols = _grid_of(grid, arrs[ids[0]].shape[1])
    size = 2.1
    fig, axes = plt.subplots(B, len(ids) + 1, figsize=(size * (len(ids) + 1) + 0.8, size * B + 0.7),
                             squeeze=False)
    im = None
    for b in range(B):
        rgb = image_to_rgb(imgs[b], normalization)
        axes[b, 0].imshow(rgb, extent=(0, W, H, 0))
        axes[b, 0].set_ylabel(row_labels[b] if row_labels else f"image {b}", fontsize=FONT["annot"])
        for j, k in enumerate(ids, start=1):
            ax = axes[b, j]
            m = _normalise_map(arrs[k][b].astype(np.float64), normalize).reshape(rows, cols)
            ax.imshow(rgb, extent=(0, W, H, 0))
            im = ax.imshow(m, extent=(0, W, H, 0), cmap="inferno", vmin=0, vmax=1, alpha=alpha,
                           interpolation="nearest")
        for ax in axes[b]:
            ax.set_xticks([])
            ax.set_yticks([])
    axes[0, 0].set_title("photo", fontsize=FONT["label"])
    for j, k in enumerate(ids, start=1):
        axes[0, j].set_title((titles or {}).get(k, k), fontsize=FONT["label"])
    label = ("rank percentile within the image (1 = highest, kept first)" if normalize == "rank"
             else "min–max normalised score per image")
    fig.tight_layout(rect=(0, 0, 0.93, 0.96))
    cax = fig.add_axes((0.94, 0.15, 0.015, 0.7))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label(label, fontsize=FONT["annot"])
    cb.ax.tick_params(labelsize=FONT["tick"])
    fig.suptitle(title or f"Target maps on the {rows}×{cols} patch grid", fontsize=FONT["title"])
    return _finish(fig, save)


_TAXONOMY = [
    # id, name, source, operator, gradient of, definition
    ("T0", "CLS-attention", "attention", "CLS row (raw)", "—", "E_h A_h[cls, j]"),
    ("T1", "attention magnitude", "attention", "column sum (raw)", "—", "E_h Σ_i A_h[i, j]"),
    ("T2", "loss-gradient-modulated attention", "attention", "gradient ⊙ attention, positive part",
     "loss ℓ", "E_h [A_h ⊙ (−∂ℓ/∂A_h)]⁺[cls, j]"),
    ("T3", "Chefer attention-gradient product (GAE)", "attention (all blocks)",
     "gradient ⊙ attention, propagated", "logit y_c",
     "R = I; R += E_h[(∂y_c/∂A_b) ⊙ A_b]⁺ · R over blocks; R[cls, j]"),
    ("T4", "hidden-state attention-weighted gradient", "hidden state (+ attention)",
     "gradient norm × CLS attention", "logit y_c", "E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂"),
    ("T5", "hidden-state input × gradient", "hidden state", "input × gradient (signed)", "logit y_c",
     "Σ_d h_{j,d} · ∂y_c/∂h_{j,d}"),
]

_RELATED = [
    ("rollout", "attention rollout (Abnar & Zuidema, 2020)", "attention (blocks 1..L)",
     "identity-added, row-normalised product", "—", "Π_b (0.5·I + 0.5·E_h A_b) row-normalised; [cls, j]"),
    ("tokentm", "TokenTM (Wu et al., 2024)", "attention + token transformations",
     "gradient ⊙ attention with length/direction weights", "logit y_c",
     "C^l = U^l C^{l-1}, U = I + E_h[(∂y_c/∂A)⁺ ⊙ A]·W (MHSA), I + W (FFN)"),
    ("last_votes", "LaSt-ViT stability votes (Shi et al.)", "hidden state",
     "channel low-pass stability, top-K votes", "—", "votes of channels for their K≈N/2 most stable tokens"),
    ("random", "random ranking (lower bound)", "—", "seeded uniform", "—", "u_j ~ U(0, 1)"),
]


def taxonomy_table(related: bool = False) -> pd.DataFrame:
    """The MIDAS supervision-target taxonomy T0–T5 (source × operator, DESIGN.md §4).

    Args:
        related: also list the related-method targets (rollout, TokenTM, LaSt-ViT votes,
            random).

    Returns:
        DataFrame indexed by target id with columns ``name``, ``source``, ``operator``,
        ``gradient of`` and ``definition (patch token j)``.
    """
    rows = _TAXONOMY + (_RELATED if related else [])
    df = pd.DataFrame(rows, columns=["id", "name", "source", "operator", "gradient of",
                                     "definition (patch token j)"])
    return df.set_index("id")


# ---------------------------------------------------------------------------------------------
# protocol
# ---------------------------------------------------------------------------------------------
_AXIS_LABELS = {"budget": "budget b (kept patch tokens, %)", "depth": "depth L (pruning after block L)",
                "backbone": "backbone"}

_MARKERS = ["o", "s", "D", "^", "v", "P", "X", "*", "<", ">", "h", "p"]


def _condition_colors(conditions: Sequence[str]) -> dict[str, Any]:
    cmap = plt.get_cmap("tab10")
    out, i = {}, 0
    for c in conditions:
        if c == "reference":
            out[c] = "black"
        elif c == "unsupervised":
            out[c] = "grey"
        else:
            out[c] = cmap(i % 10)
            i += 1
    return out


def _aggregate_conditions(table: pd.DataFrame, cols: Sequence[str]) -> pd.DataFrame:
    """One row per condition: means of ``cols`` over seeds (or any repeated rows)."""
    present = [c for c in cols if c in table.columns]
    order = list(dict.fromkeys(table["condition"].astype(str)))
    agg = table.assign(condition=table["condition"].astype(str)).groupby("condition", sort=False)[present].mean()
    return agg.loc[order].reset_index()


def _mixed_groups(table: pd.DataFrame, average_over: Sequence[str], what: str,
                  cols: Sequence[str] = ("dataset", "backbone")) -> str:
    """Guard against silent averaging: ``table`` may hold several datasets / backbones only when
    the caller lists them in ``average_over``; returns the title note that says so.

    Raises:
        ValueError: several values of a column in ``cols`` that ``average_over`` does not name.
    """
    mixed = {c: [str(v) for v in dict.fromkeys(table[c])] for c in cols
             if c in table.columns and table[c].nunique(dropna=False) > 1}
    silent = {c: v for c, v in mixed.items() if c not in set(average_over)}
    if silent:
        detail = "; ".join(f"{c}: {', '.join(v)}" for c, v in silent.items())
        raise ValueError(f"{what}: the table holds several {' and '.join(f'{c}s' for c in silent)} ({detail}); "
                         f"select one, or pass average_over={tuple(silent)!r} to average over them "
                         "(the title then says so)")
    return "".join(f" — mean over {c}s {', '.join(v)}" for c, v in mixed.items())


def _condition_summary(table: pd.DataFrame) -> pd.DataFrame:
    """One row per condition: mean ``miou`` / ``idauc`` over rows (seeds) and their 95 % intervals
    (:func:`midas_nb.results.aggregate_seeds`: seeds × images bootstrap from the per-image
    values; a single row without per-image values keeps its own bootstrap bounds; otherwise no
    interval, never the mean of per-seed bounds)."""
    from .results import aggregate_seeds

    t = table.assign(condition=table["condition"].astype(str))
    agg = aggregate_seeds(t, by=["condition"], metrics=[m for m in ("miou", "idauc") if m in t.columns])
    agg = agg.rename(columns={"miou_mean": "miou", "idauc_mean": "idauc"})
    for m in ("miou", "idauc"):
        for b in ("lo", "hi"):
            col = f"{m}_{b}"
            if col not in agg.columns:
                agg[col] = np.nan
            if col in t.columns:
                single = t.groupby("condition", sort=False)[col].agg(lambda v: v.iloc[0] if len(v) == 1 else np.nan)
                agg[col] = agg[col].fillna(agg["condition"].map(single))
    return agg


def coverage_vs_faithfulness(table: pd.DataFrame, *, reference: str = "reference", band: float = 0.01,
                             coverage_label: str | None = None, title: str | None = None,
                             save: str | None = None, average_over: Sequence[str] = ()) -> Figure:
    """Part coverage (mIoU, %) against faithfulness (IDAUC) per condition, with the parity band.

    The shaded band is the DESIGN.md §6 parity region ``IDAUC ≥ IDAUC_ref − band``
    (asymmetric: faithfulness gains always count); the dashed vertical line is the reference
    mIoU, so a point in the band and right of the line has ``D > 0`` at parity.

    Args:
        table: protocol rows (``midas_nb.protocol`` schema): ``condition``, ``miou``, ``idauc``
            and, when present, the per-image values (``miou_per_image``, ``idauc_per_image``
            with their image ids) or ``miou_lo/miou_hi`` and ``idauc_lo/idauc_hi``, and
            ``coverage_kind``. Several rows per condition (seeds) are averaged; the error bars
            are 95 % intervals of that mean over seeds and images
            (:func:`midas_nb.results.aggregate_seeds`), or the row's own bootstrap interval for
            a single seed.
        reference: the reference condition.
        band: the parity band in IDAUC units.
        coverage_label: x-axis quantity (default from ``coverage_kind``: part mIoU or box
            coverage).
        title: figure title.
        save: figure name for :func:`save_figure`.
        average_over: ``("dataset",)`` / ``("backbone",)`` to allow rows of several datasets /
            backbones, averaged per condition (the title says so); by default they are an error.

    Raises:
        ValueError: when ``condition``, ``miou`` or ``idauc`` is missing, or the table mixes
            datasets / backbones not named in ``average_over``.
    """
    missing = [c for c in ("condition", "miou", "idauc") if c not in table.columns]
    if missing:
        raise ValueError(f"table is missing column(s) {missing}; has {list(table.columns)}")
    note = _mixed_groups(table, average_over, "coverage_vs_faithfulness")
    if coverage_label is None:
        kind = str(table["coverage_kind"].iloc[0]) if "coverage_kind" in table.columns else "part mIoU"
        coverage_label = "box coverage mIoU" if "box" in kind.lower() else "part mIoU"
    agg = _condition_summary(table)
    colors = _condition_colors(agg["condition"].tolist())
    fig, ax = plt.subplots(figsize=(8.2, 4.6))
    ref = agg[agg["condition"] == reference]
    if len(ref):
        r_m, r_i = float(ref["miou"].iloc[0]) * 100, float(ref["idauc"].iloc[0])
        ax.axhspan(r_i - band, max(r_i - band, agg["idauc_hi"].max() if "idauc_hi" in agg else agg["idauc"].max()) + 1.0,
                   color="tab:green", alpha=0.10, lw=0, label=f"parity band: IDAUC ≥ ref − {band:g}")
        ax.axhline(r_i - band, color="tab:green", lw=1, ls=":")
        ax.axvline(r_m, color="black", lw=1, ls="--", alpha=0.6, label="reference mIoU")
    for i, row in agg.iterrows():
        c = row["condition"]
        x, y = row["miou"] * 100, row["idauc"]
        xerr = yerr = None
        if {"miou_lo", "miou_hi"} <= set(agg.columns) and pd.notna(row["miou_lo"]):
            xerr = [[max(0.0, x - row["miou_lo"] * 100)], [max(0.0, row["miou_hi"] * 100 - x)]]
        if {"idauc_lo", "idauc_hi"} <= set(agg.columns) and pd.notna(row["idauc_lo"]):
            yerr = [[max(0.0, y - row["idauc_lo"])], [max(0.0, row["idauc_hi"] - y)]]
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=_MARKERS[i % len(_MARKERS)], color=colors[c],
                    ms=8, capsize=3, lw=1.2, label=c, zorder=3)
        if len(agg) <= 6:       # beyond that, labels collide; the legend names the markers
            ax.annotate(c, (x, y), textcoords="offset points", xytext=(6, 5), fontsize=FONT["annot"])
    # keep the band from stretching the y range
    ys = np.concatenate([agg["idauc"].to_numpy(),
                         agg["idauc_lo"].dropna().to_numpy() if "idauc_lo" in agg else [],
                         agg["idauc_hi"].dropna().to_numpy() if "idauc_hi" in agg else []])
    lo, hi = float(np.nanmin(ys)), float(np.nanmax(ys))
    if len(ref):
        lo = min(lo, r_i - band)
    pad = max(0.01, 0.08 * (hi - lo))
    ax.set_ylim(lo - pad, hi + pad)
    ax.set_xlabel(f"{coverage_label} (%)", fontsize=FONT["label"])
    ax.set_ylabel("insertion − deletion AUC", fontsize=FONT["label"])
    ax.tick_params(labelsize=FONT["tick"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=FONT["legend"], loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0,
              frameon=False)
    ax.set_title((title or "Coverage vs faithfulness (error bars: 95 % bootstrap CI over seeds and images)") + note,
                 fontsize=FONT["title"] - 1)
    fig.tight_layout()
    return _finish(fig, save)


# ---------------------------------------------------------------------------------------------
# probes
# ---------------------------------------------------------------------------------------------
def cosine_heatmap(mean: pd.DataFrame, highlight: tuple[str, str] | None = ("T5", "T3"), *,
                   lo: pd.DataFrame | None = None, hi: pd.DataFrame | None = None,
                   title: str | None = None, save: str | None = None) -> Figure:
    """Mean per-image cosine similarity between target rankings, as an annotated matrix.

    Args:
        mean: square DataFrame (index = columns = target ids) of mean cosines in ``[−1, 1]``.
        highlight: a pair of ids whose cell is framed and called out in the title
            (default: hidden-gradient T5 vs attention-gradient T3); ``None`` or a pair not in
            the matrix → nothing highlighted.
        lo, hi: CI bounds in the same layout, shown in the call-out.
        title: figure title.
        save: figure name for :func:`save_figure`.

    Raises:
        ValueError: when ``mean`` is not square with matching index and columns.
    """
    if list(mean.index) != list(mean.columns):
        raise ValueError("mean must be a square DataFrame with the same ids as index and columns")
    ids = [str(i) for i in mean.index]
    M = mean.to_numpy(dtype=float)
    n = len(ids)
    side = max(4.5, 0.62 * n + 2.2)
    fig, ax = plt.subplots(figsize=(side + 1.0, side))
    im = ax.imshow(M, cmap="RdBu_r", vmin=-1, vmax=1)
    for i in range(n):
        for j in range(n):
            v = M[i, j]
            if np.isfinite(v):
                ax.text(j, i, f"{v:.2f}", ha="center", va="center", fontsize=FONT["annot"] - (1 if n > 8 else 0),
                        color="white" if abs(v) > 0.6 else "black")
    ax.set_xticks(range(n), ids, rotation=45, ha="right", fontsize=FONT["tick"])
    ax.set_yticks(range(n), ids, fontsize=FONT["tick"])
    ax.set_xlabel("target", fontsize=FONT["label"])
    ax.set_ylabel("target", fontsize=FONT["label"])
    cb = fig.colorbar(im, ax=ax, fraction=0.046, pad=0.04)
    cb.set_label("mean per-image cosine similarity", fontsize=FONT["annot"])
    cb.ax.tick_params(labelsize=FONT["tick"])
    callout = ""
    if highlight is not None and all(h in ids for h in highlight):
        a, b = ids.index(highlight[0]), ids.index(highlight[1])
        for (r, c) in {(a, b), (b, a)}:
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="lime", lw=3))
        callout = f"\ncos({highlight[0]}, {highlight[1]}) = {M[a, b]:.3f}"
        if lo is not None and hi is not None:
            callout += f" [{float(lo.iloc[a, b]):.3f}, {float(hi.iloc[a, b]):.3f}]"
    ax.set_title((title or "Cosine similarity of target maps") + callout, fontsize=FONT["title"] - 1)
    fig.tight_layout()
    return _finish(fig, save)


def cosine_depth_lines(table: pd.DataFrame, *, title: str | None = None, save: str | None = None) -> Figure:
    """Cosine of target pairs against depth, with CIs (:func:`midas_nb.probes.cosine_across_depths`).

    Args:
        table: long table with ``depth``, ``cosine``, ``lo``, ``hi`` and the pair as
            ``a``/``b`` or ``hidden``/``attention`` columns.
        title: figure title. save: figure name for :func:`save_figure`.
    """
    a, b = ("hidden", "attention") if "hidden" in table.columns else ("a", "b")
    missing = [c for c in ("depth", "cosine", a, b) if c not in table.columns]
    if missing:
        raise ValueError(f"table is missing column(s) {missing}; has {list(table.columns)}")
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    cmap = plt.get_cmap("tab10")
    for i, ((x, y), g) in enumerate(table.groupby([a, b], sort=False)):
        g = g.sort_values("depth")
        d = g["depth"].to_numpy(dtype=float)
        ax.plot(d, g["cosine"], marker="o", color=cmap(i % 10), label=f"{x} vs {y}")
        if {"lo", "hi"} <= set(g.columns) and g["lo"].notna().any():
            ax.fill_between(d, g["lo"].to_numpy(dtype=float), g["hi"].to_numpy(dtype=float),
                            color=cmap(i % 10), alpha=0.15, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(sorted(table["depth"].dropna().unique()))
    ax.set_xlabel("depth L (targets read at block L)", fontsize=FONT["label"])
    ax.set_ylabel("mean per-image cosine similarity", fontsize=FONT["label"])
    ax.tick_params(labelsize=FONT["tick"])
    ax.grid(alpha=0.3)
    ax.legend(fontsize=FONT["legend"], loc="best", framealpha=0.85)
    ax.set_title(title or "Cosine of target rankings across depths (bands: 95 % CI)", fontsize=FONT["title"] - 1)
    fig.tight_layout()
    return _finish(fig, save)


# ---------------------------------------------------------------------------------------------
# regimes and scale
# ---------------------------------------------------------------------------------------------
def _d_table_check(table: pd.DataFrame, needed: Sequence[str]) -> None:
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"D table is missing column(s) {missing}; has {list(table.columns)} "
                         "(expected the output of midas_nb.metrics.decoupling_D)")


def _group_status(g: pd.DataFrame) -> str:
    """One parity-band status for the rows of a plotted cell (``decoupling_D``'s ``status``
    when present, else the point decision ``in_band``): any undefined → "undefined", all in
    band → "in band", any outside → "outside band", else "not resolved"."""
    if "status" in g.columns:
        st = set(g["status"].astype(str))
    else:
        st = {"undefined" if pd.isna(v) else "in band" if bool(v) else "outside band" for v in g["in_band"]}
    if "undefined" in st or "no reference" in st:
        return "undefined"
    if st == {"in band"}:
        return "in band"
    if "outside band" in st:
        return "outside band"
    return "not resolved"


def _d_errors(g: pd.DataFrame, value: str) -> tuple[float, float, str]:
    """(lower, upper) error-bar lengths of the mean D of ``g`` and what they are: the paired
    95 % interval (``D_pp_lo``/``D_pp_hi``) of a single row, else the seed std, else none."""
    d = float(g[value].mean())
    if len(g) == 1 and {f"{value}_lo", f"{value}_hi"} <= set(g.columns):
        lo, hi = float(g[f"{value}_lo"].iloc[0]), float(g[f"{value}_hi"].iloc[0])
        if np.isfinite(lo) and np.isfinite(hi):
            return max(0.0, d - lo), max(0.0, hi - d), "95 % paired CI"
    if f"{value}_std" in g.columns:
        sd = float(g[f"{value}_std"].mean())
        if np.isfinite(sd):
            return sd, sd, "seed std"
    return math.nan, math.nan, ""


def _fmt_axis_value(name: str, v: Any) -> str:
    if name == "budget":
        return f"{float(v) * 100:g}%"
    return f"{v:g}" if isinstance(v, (int, float, np.integer, np.floating)) else str(v)



def regime_heatmap(table: pd.DataFrame, x: str = "budget", y: str = "depth", *, value: str = "D_pp",
                   conditions: Sequence[str] | None = None, reference: str = "reference",
                   vmax: float | None = None, title: str | None = None,
                   save: str | None = None, average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp) over a ``y × x`` grid (default depth × budget), one panel per condition.

    In-band cells (``status`` "in band": the paired ΔIDAUC interval lies above ``−band``) are
    coloured by D and annotated ``+2.1 ✓``; cells whose interval straddles the band edge
    ("not resolved") are coloured by D and annotated ``+2.1 ?``; cells outside the band are
    grey, hatched and annotated ``✗`` with their D in brackets (DESIGN.md §6: marked, never
    dropped); undefined cells (NaN IDAUC or mIoU) say "undefined"; cells the sweep did not run
    say "not run". Without a ``status`` column the point decision ``in_band`` is used.

    Args:
        table: :func:`midas_nb.metrics.decoupling_D` output with ``condition``, ``x``, ``y``,
            ``value`` and ``in_band`` (and ``status``) columns. Several datasets or backbones
            are an error unless named in ``average_over`` (then averaged, and the title says so).
        x, y: grid columns. value: the D column (percentage points).
        conditions: panels (default: every condition except the reference).
        vmax: half-range of the diverging colour scale (default: largest |D|).
        title: figure title. save: figure name for :func:`save_figure`.
    """
    _d_table_check(table, ["condition", x, y, value, "in_band"])
    note = _mixed_groups(table, average_over, "regime_heatmap", [c for c in ("dataset", "backbone") if c not in (x, y)])
    conds = list(conditions) if conditions is not None else [
        c for c in dict.fromkeys(table["condition"].astype(str)) if c != reference]
    if not conds:
        raise ValueError("no condition to plot besides the reference")
    xs = sorted(table[x].dropna().unique())
    ys = sorted(table[y].dropna().unique())
    vals = table[value].to_numpy(dtype=float)
    lim = vmax or max(1e-6, float(np.nanmax(np.abs(vals))) if np.isfinite(vals).any() else 1.0)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)
    ncols = min(3, len(conds))
    nrows = math.ceil(len(conds) / ncols)
    w = max(3.4, 0.95 * len(xs) + 1.6)
    h = max(2.8, 0.7 * len(ys) + 1.5)
    fig, axes = plt.subplots(nrows, ncols, figsize=(w * ncols + 1.2, h * nrows + 0.6), squeeze=False)
    im = None
    for k, ax in enumerate(axes.ravel()):
        if k >= len(conds):
            ax.set_visible(False)
            continue
        cond = conds[k]
        sub = table[table["condition"].astype(str) == cond]
        grid = np.full((len(ys), len(xs)), np.nan)
        status = np.full((len(ys), len(xs)), "not run", dtype=object)
        for (yv, xv), g in sub.groupby([y, x]):
            i, j = ys.index(yv), xs.index(xv)
            grid[i, j] = g[value].astype(float).mean()
            status[i, j] = _group_status(g)
        shown = np.where((status == "in band") | (status == "not resolved"), grid, np.nan)
        im = ax.imshow(shown, cmap="RdBu_r", norm=norm, aspect="auto", origin="lower")
        for i in range(len(ys)):
            for j in range(len(xs)):
                if status[i, j] in ("not run", "undefined"):   # not in the grid / NaN values
                    ax.text(j, i, status[i, j], ha="center", va="center", fontsize=FONT["annot"] - 1,
                            color="0.55", style="italic")
                    continue
                if status[i, j] in ("in band", "not resolved"):
                    v = grid[i, j]
                    mark = "✓" if status[i, j] == "in band" else "?"
                    ax.text(j, i, f"{v:+.1f} {mark}", ha="center", va="center", fontsize=FONT["annot"],
                            color="white" if abs(v) > 0.6 * lim else "black")
                else:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, facecolor="0.85", edgecolor="0.45",
                                           hatch="///", lw=0.5))
                    ax.text(j, i, f"✗ ({grid[i, j]:+.1f})" if np.isfinite(grid[i, j]) else "✗",
                            ha="center", va="center", fontsize=FONT["annot"], color="0.15",
                            bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85))
        ax.set_xticks(range(len(xs)), [_fmt_axis_value(x, v) for v in xs], fontsize=FONT["tick"])
        ax.set_yticks(range(len(ys)), [_fmt_axis_value(y, v) for v in ys], fontsize=FONT["tick"])
        ax.set_xlabel(_AXIS_LABELS.get(x, x), fontsize=FONT["label"] - 1)
        ax.set_ylabel(_AXIS_LABELS.get(y, y), fontsize=FONT["label"] - 1)
        ax.set_title(cond, fontsize=FONT["label"])
    fig.tight_layout(rect=(0, 0.06, 0.9, 0.95))
    cax = fig.add_axes((0.91, 0.2, 0.018, 0.6))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label("D = mIoU − mIoU_ref (pp)", fontsize=FONT["annot"])
    cb.ax.tick_params(labelsize=FONT["tick"])
    fig.legend(handles=[Patch(facecolor="white", edgecolor="0.4", label="✓ in parity band (coloured by D)"),
                        Patch(facecolor="white", edgecolor="0.4",
                              label="? band not resolved: ΔIDAUC CI straddles −band"),
                        Patch(facecolor="0.85", edgecolor="0.45", hatch="///",
                              label="✗ outside band: ΔIDAUC < −band (D in brackets)")],
               loc="lower center", ncol=3, fontsize=FONT["legend"], frameon=False)
    fig.suptitle((title or f"Decoupling D over {y} × {x}") + note, fontsize=FONT["title"])
    return _finish(fig, save)


def regime_lines(table: pd.DataFrame, x: str = "depth", hue: str = "budget", *, value: str = "D_pp",
                 conditions: Sequence[str] | None = None, reference: str = "reference",
                 title: str | None = None, save: str | None = None,
                 average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp) against ``x`` (default depth), one line per ``hue`` value, one panel per condition.

    Filled markers: in the parity band; open circles: band not resolved (the paired ΔIDAUC
    interval straddles ``−band``); ``×`` markers: outside (D still drawn). Error bars are the
    95 % paired intervals ``D_pp_lo``/``D_pp_hi`` where present (else the seed std); the
    legend says which.

    Args:
        table: :func:`midas_nb.metrics.decoupling_D` output (``condition``, ``x``, ``hue``,
            ``value``, ``in_band``; ``status`` and intervals where present).
        x: x-axis column. hue: one line per value of this column.
        value: the D column (pp). conditions: panels (default: all but the reference).
        title: figure title. save: figure name for :func:`save_figure`.
        average_over: datasets / backbones to average over (default: several are an error).
    """
    _d_table_check(table, ["condition", x, hue, value, "in_band"])
    note = _mixed_groups(table, average_over, "regime_lines", [c for c in ("dataset", "backbone") if c not in (x, hue)])
    kinds: set[str] = set()
    conds = list(conditions) if conditions is not None else [
        c for c in dict.fromkeys(table["condition"].astype(str)) if c != reference]
    if not conds:
        raise ValueError("no condition to plot besides the reference")
    hues = sorted(table[hue].dropna().unique())
    cmap = plt.get_cmap("viridis")
    colors = {hv: cmap(i / max(1, len(hues) - 1) * 0.85) for i, hv in enumerate(hues)}
    ncols = min(3, len(conds))
    nrows = math.ceil(len(conds) / ncols)
    fig, axes = plt.subplots(nrows, ncols, figsize=(4.2 * ncols, 3.3 * nrows + 0.7), squeeze=False,
                             sharey=True)
    for k, ax in enumerate(axes.ravel()):
        if k >= len(conds):
            ax.set_visible(False)
            continue
        sub = table[table["condition"].astype(str) == conds[k]]
        for hv in hues:
            groups = sorted(sub[sub[hue] == hv].groupby(x), key=lambda kv: kv[0])
            if not groups:
                continue
            xv = np.array([float(xk) for xk, _ in groups])
            d = np.array([float(g[value].mean()) for _, g in groups])
            errs = [_d_errors(g, value) for _, g in groups]
            kinds.update(e[2] for e in errs if e[2])
            yerr = np.array([[e[0] for e in errs], [e[1] for e in errs]])
            ax.errorbar(xv, d, yerr=None if np.isnan(yerr).all() else np.nan_to_num(yerr),
                        color=colors[hv], lw=1.5, capsize=2, label=f"{hue} = {_fmt_axis_value(hue, hv)}")
            st = np.array([_group_status(g) for _, g in groups])
            ax.scatter(xv[st == "in band"], d[st == "in band"], color=colors[hv], s=36, zorder=3, gid="in band")
            ax.scatter(xv[st == "not resolved"], d[st == "not resolved"], facecolors="white",
                       edgecolors=colors[hv], s=36, zorder=3, gid="not resolved")
            ax.scatter(xv[st == "outside band"], d[st == "outside band"], color=colors[hv], marker="x", s=60,
                       zorder=3, gid="outside band")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(conds[k], fontsize=FONT["label"])
        ax.set_xlabel(_AXIS_LABELS.get(x, x), fontsize=FONT["label"] - 1)
        if k % ncols == 0:
            ax.set_ylabel("D = mIoU − mIoU_ref (pp)", fontsize=FONT["label"] - 1)
        ax.tick_params(labelsize=FONT["tick"])
        xt = sorted(table[x].dropna().unique())
        ax.set_xticks(xt, [_fmt_axis_value(x, v) for v in xt])
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colors[hv], lw=1.5, label=f"{hue} = {_fmt_axis_value(hue, hv)}") for hv in hues]
    handles += [Line2D([], [], color="0.3", marker="o", ls="", label="in parity band"),
                Line2D([], [], color="0.3", marker="o", markerfacecolor="white", ls="", label="band not resolved"),
                Line2D([], [], color="0.3", marker="x", ls="", ms=8, label="outside band")]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=FONT["legend"],
               frameon=False)
    bars = f"; error bars: {' / '.join(sorted(kinds))}" if kinds else ""
    fig.suptitle((title or f"Decoupling D against {x}") + note + bars, fontsize=FONT["title"])
    fig.tight_layout(rect=(0, 0.09, 1, 0.95))
    return _finish(fig, save)


def scale_plot(table: pd.DataFrame, x: str = "backbone", *, value: str = "D_pp",
               conditions: Sequence[str] | None = None, reference: str = "reference",
               order: Sequence[str] | None = None, title: str | None = None,
               save: str | None = None, average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp) per backbone (or any categorical ``x``), one group of bars per backbone.

    Solid bars are in the parity band; dotted bars: band not resolved (the paired ΔIDAUC
    interval straddles ``−band``); hatched, pale bars are outside it; undefined values are not
    drawn and labelled "undefined". Error bars: the 95 % paired interval (``D_pp_lo`` /
    ``D_pp_hi``) where present, else the seed std; the title says which. Several datasets (or,
    with another ``x``, backbones) are an error unless named in ``average_over``.

    Args:
        table: :func:`midas_nb.metrics.decoupling_D` output with ``condition``, ``x``,
            ``value``, ``in_band``.
        x: the categorical column (default ``backbone``). order: its order (default: as it
            appears). conditions: bars (default: all but the reference).
        title: figure title. save: figure name for :func:`save_figure`.
    """
    _d_table_check(table, ["condition", x, value, "in_band"])
    note = _mixed_groups(table, average_over, "scale_plot", [c for c in ("dataset", "backbone") if c != x])
    kinds: set[str] = set()
    conds = list(conditions) if conditions is not None else [
        c for c in dict.fromkeys(table["condition"].astype(str)) if c != reference]
    cats = list(order) if order is not None else list(dict.fromkeys(table[x].astype(str)))
    colors = _condition_colors(conds)
    width = 0.8 / max(1, len(conds))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(cats) * max(1, len(conds)) ** 0.5 + 2), 4.2))
    for k, cond in enumerate(conds):
        sub = table[table["condition"].astype(str) == cond]
        for i, cat in enumerate(cats):
            g = sub[sub[x].astype(str) == cat]
            if g.empty:
                continue
            d = float(g[value].mean())
            st = _group_status(g)
            pos = i - 0.4 + width * (k + 0.5)
            if st == "undefined" or not np.isfinite(d):
                ax.text(pos, 0, "undefined", rotation=90, ha="center", va="bottom", fontsize=FONT["annot"] - 1,
                        color="0.4")
                continue
            inb = st == "in band"
            lo, hi, kind = _d_errors(g, value)
            if kind:
                kinds.add(kind)
            ax.bar(pos, d, width=width * 0.92, color=colors[cond], alpha=1.0 if inb else 0.35,
                   hatch=None if inb else ("..." if st == "not resolved" else "///"),
                   edgecolor="black" if not inb else colors[cond],
                   yerr=None if not np.isfinite(lo) else [[lo], [hi]], capsize=2,
                   label=cond if i == 0 or cat == cats[0] else None)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(cats)), cats, rotation=15 if max(map(len, cats)) > 14 else 0,
                  ha="right" if max(map(len, cats)) > 14 else "center", fontsize=FONT["tick"])
    ax.set_xlabel(_AXIS_LABELS.get(x, x), fontsize=FONT["label"])
    ax.set_ylabel("D = mIoU − mIoU_ref (pp)", fontsize=FONT["label"])
    ax.tick_params(labelsize=FONT["tick"])
    ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=colors[c], label=c) for c in conds]
    handles.append(Patch(facecolor="0.85", edgecolor="black", hatch="...", label="band not resolved"))
    handles.append(Patch(facecolor="0.85", edgecolor="black", hatch="///", label="outside parity band"))
    ax.legend(handles=handles, fontsize=FONT["legend"], loc="best", framealpha=0.85)
    bars = f" (error bars: {' / '.join(sorted(kinds))})" if kinds else ""
    ax.set_title((title or f"Decoupling D across {x}s") + note + bars, fontsize=FONT["title"])
    fig.tight_layout()
    return _finish(fig, save)


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
    imgs = _np(image)
    keep = _np(keep_mask).astype(bool)
    if imgs.ndim == 3:
        imgs = imgs[None]
    if keep.ndim == 1:
        keep = keep[None]
    if keep.shape[0] != imgs.shape[0]:
        raise ValueError(f"keep_mask has {keep.shape[0]} rows for {imgs.shape[0]} images")
    parts = None if part_mask is None else _np(part_mask).astype(bool).reshape(keep.shape)
    B, _, H, W = imgs.shape
    rows, cols = _grid_of(grid, keep.shape[1])
    fig, axes = _panels(B, ncols, size=3.0)
    for b, ax in enumerate(axes):
        ax.imshow(image_to_rgb(imgs[b], normalization), extent=(0, W, H, 0))
        shade = np.zeros((rows, cols, 4))
        shade[..., 3] = np.where(keep[b].reshape(rows, cols), 0.0, dim)
        ax.imshow(shade, extent=(0, W, H, 0), interpolation="nearest")
        _patch_rects(ax, keep[b], rows, cols, H / rows, W / cols, fill=False, edgecolor="white", lw=0.6)
        if parts is not None:
            _patch_rects(ax, parts[b], rows, cols, H / rows, W / cols, fill=False, edgecolor="gold", lw=1.4,
                         ls="--")
        ax.set_xticks([])
        ax.set_yticks([])
        t = titles[b] if titles is not None and b < len(titles) else f"image {b}"
        ax.set_title(f"{t}\nkept {int(keep[b].sum())}/{rows * cols} tokens", fontsize=FONT["annot"])
    handles = [Patch(facecolor="white", edgecolor="0.3", label="kept patch token"),
               Patch(facecolor=(0, 0, 0, dim), label="dropped patch token")]
    if parts is not None:
        handles.append(Patch(fill=False, edgecolor="gold", ls="--", lw=1.4, label="part patch"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=FONT["legend"], frameon=False)
    top = 1.0
    if suptitle:
        fig.suptitle(suptitle, fontsize=FONT["title"])
        top = 1.0 - 0.45 / fig.get_figheight()
    fig.tight_layout(rect=(0, 0.07, 1, top))
    return _finish(fig, save)


def insertion_deletion_curves(results: Any, *, title: str | None = None, save: str | None = None) -> Figure:
    """Mean insertion and deletion curves of ``p_c`` (the curves behind IDAUC).

    Args:
        results: one :class:`midas_nb.metrics.InsDel` or ``{label: InsDel}`` (e.g. one per
            condition); anything with ``fractions [S+1]``, ``ins_curve [B,S+1]``,
            ``del_curve [B,S+1]`` and ``ins_auc``/``del_auc [B]`` works.
        title: figure title. save: figure name for :func:`save_figure`.
    """
    if not isinstance(results, Mapping):
        results = {"ranking": results}
    if not results:
        raise ValueError("results is empty")
    colors = _condition_colors(list(results))
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    for label, r in results.items():
        frac = _np(r.fractions) * 100
        for ax, curve, auc, what in ((axes[0], r.ins_curve, r.ins_auc, "ins"),
                                     (axes[1], r.del_curve, r.del_auc, "del")):
            c = _np(curve)
            c = c[None] if c.ndim == 1 else c
            ax.plot(frac, c.mean(0), marker=".", color=colors[label],
                    label=f"{label} (AUC {float(_np(auc).mean()):.3f})")
    axes[0].set_xlabel("patch tokens inserted, most important first (%)", fontsize=FONT["label"])
    axes[1].set_xlabel("patch tokens deleted, most important first (%)", fontsize=FONT["label"])
    axes[0].set_ylabel("p_c (softmax prob. of predicted class)", fontsize=FONT["label"])
    axes[0].set_title("insertion (higher = more faithful)", fontsize=FONT["label"])
    axes[1].set_title("deletion (lower = more faithful)", fontsize=FONT["label"])
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=FONT["tick"])
        ax.legend(fontsize=FONT["legend"] - 1, loc="best")
        ax.set_xlim(0, 100)
    if title:
        fig.suptitle(title, fontsize=FONT["title"])
    fig.tight_layout()
    return _finish(fig, save)


def perturbation_curves(table: pd.DataFrame, *, title: str | None = None, save: str | None = None) -> Figure:
    """Accuracy as tokens are removed: most relevant first (positive) and least relevant first
    (negative), one line per relevance map — the evaluation of TokenTM (Wu et al., 2024,
    https://arxiv.org/abs/2403.14552).

    Args:
        table: one row per map with ``target``, ``fractions`` (removed fraction, ``[S+1]``),
            ``pos_curve`` and ``neg_curve`` (accuracy, ``[S+1]``) and ``pos_auc``/``neg_auc``
            (:func:`midas_nb.related.perturbation_table`); list columns may be JSON strings (CSV).
        title: figure title. save: figure name for :func:`save_figure`.
    """
    import json

    missing = [c for c in ("target", "fractions", "pos_curve", "neg_curve") if c not in table.columns]
    if missing:
        raise ValueError(f"table is missing column(s) {missing}; has {list(table.columns)}")

    def arr(v: Any) -> np.ndarray:
        return np.asarray(json.loads(v) if isinstance(v, str) else v, dtype=float)

    colors = _condition_colors([str(t) for t in table["target"]])
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    for _, r in table.iterrows():
        x = arr(r["fractions"]) * 100
        for ax, col in ((axes[0], "pos"), (axes[1], "neg")):
            auc = f" (AUC {float(r[f'{col}_auc']):.3f})" if f"{col}_auc" in r and pd.notna(r[f"{col}_auc"]) else ""
            ax.plot(x, arr(r[f"{col}_curve"]) * 100, marker=".", color=colors[str(r["target"])],
                    label=f"{r['target']}{auc}")
    axes[0].set_title("positive: most relevant removed first (lower AUC = better)", fontsize=FONT["label"] - 1)
    axes[1].set_title("negative: least relevant removed first (higher AUC = better)", fontsize=FONT["label"] - 1)
    for ax in axes:
        ax.set_xlabel("patch tokens removed (%)", fontsize=FONT["label"])
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=FONT["tick"])
        ax.legend(fontsize=FONT["legend"] - 1, loc="best")
        ax.set_xlim(0, 100)
    axes[0].set_ylabel("top-1 accuracy (%)", fontsize=FONT["label"])
    if title:
        fig.suptitle(title, fontsize=FONT["title"])
    fig.tight_layout()
    return _finish(fig, save)
