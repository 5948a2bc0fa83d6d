"""What every figure shares: where figures and tables go, how a figure is shown (:func:`finish_figure`), one
colour per meaning (:func:`condition_color`), axes, colour bars, panel grids, legends and point labels."""
from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Sequence

import matplotlib
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import torch
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from .. import config
from ..identity import atomic_write_text
from ..results import encode_lists

#: font sizes used by every figure (points)
FONT = dict(title=12, label=11, tick=9, annot=9, legend=9)
_STATE: dict[str, Any] = {"notebook": None, "directory": None}
Normalization = tuple[Sequence[float], Sequence[float]] | None


def set_output(notebook: str | None, directory: str | Path | None = None, *, profile: str | None = None) -> Path:
    """Name the notebook whose figures follow (its stem prefixes every saved file; ``None``: no prefix) and the
    ``directory`` they go to (``None``: :func:`midas_nb.config.figures_dir` of ``profile``); returns the directory.
    ValueError: a blank ``directory`` (it would be the working directory, beside the committed notebooks)."""
    if isinstance(directory, str) and not directory.strip():
        raise ValueError(f"output_dir: expected a directory path or None (figures/<profile>/), got {directory!r}")
    _STATE["notebook"] = notebook
    _STATE["directory"] = (Path(directory).expanduser() if directory is not None
                           else config.figures_dir(profile) if profile else None)
    return output_dir()


def output_dir() -> Path:
    """The directory :func:`set_output` chose (created), else ``config.figures_dir()``."""
    if (d := _STATE["directory"]) is None:
        return config.figures_dir()
    d.mkdir(parents=True, exist_ok=True)
    return d


def figure_path(name: str, suffix: str = ".png") -> Path:
    """``<output dir>/<notebook>_<name><suffix>`` (no notebook prefix when none is set)."""
    if not name or any(c in name for c in "/\\"):
        raise ValueError(f"figure name must be a plain file stem, got {name!r}")
    stem = f"{_STATE['notebook']}_{name}" if _STATE["notebook"] else name
    return output_dir() / f"{stem}{suffix}"


def save_csv(table: pd.DataFrame, name: str) -> Path:
    """Write ``table`` atomically as ``<output dir>/<notebook>_<name>.csv``, list columns as JSON."""
    atomic_write_text(path := figure_path(name, ".csv"), encode_lists(table).to_csv(index=False))
    return path


def finish_figure(fig: Figure, save: str | None, tight: bool = False) -> Figure:
    """The last step of every figure function: lay ``fig`` out (``tight``), save it as ``save`` when given; in a
    notebook (inline backend) show it now, its suptitle (else its axes' titles) as the image's ``alt`` text (the
    HTML edition's); close it unless a widget or window shows it. Returns ``fig``."""
    if tight:
        fig.tight_layout()
    if save:
        fig.savefig(figure_path(save), dpi=130, bbox_inches="tight", facecolor="white")
    backend = matplotlib.get_backend().lower()
    if "inline" in backend:
        from IPython.display import display
        sup = fig._suptitle.get_text() if getattr(fig, "_suptitle", None) is not None else ""
        alt = " ".join((sup or "; ".join(t for ax in fig.axes if (t := ax.get_title())) or "figure").split())
        display(fig, metadata={"image/png": {"alt": alt}})
    if "inline" in backend or backend in ("agg", "cairo", "pdf", "pgf", "ps", "svg", "template"):
        plt.close(fig)          # shown once; the Figure object stays usable (savefig, axes) after closing
    return fig


PART_COLOR, BOX_COLOR, KEYPOINT_COLOR = "gold", "cyan", "red"
BAND_COLOR = "#1f77b4"    # the parity band's: a blue no condition or target has
AXIS_CMAPS: dict[str, str] = {"budget": "viridis", "depth": "magma"}

#: fixed colours of the known conditions and targets: controls in neutrals, T1–T5 in tab10's first hues; all
#: distinct but T0's (the reference's own ranking), which shares the reference's black
CONDITION_COLORS: dict[str, str] = {"reference": "#000000", "unsupervised": "#7f7f7f", "random": "#c7c7c7",
    "random_map": "#e7ba52", "T0": "#000000", "T1": "#ff7f0e", "T2": "#2ca02c", "T3": "#d62728", "T4": "#9467bd",
    "T5": "#8c564b", "rollout": "#e377c2", "rollout_full": "#f7b6d2", "tokentm": "#17becf", "last_votes": "#bcbd22",
    "cropr": "#393b79", "iared": "#637939"}
_FOLDED = {k.lower(): v for k, v in CONDITION_COLORS.items()} | {
    "last": "#bcbd22", "lastvit": "#bcbd22", "last-vit": "#bcbd22"}   # the LaSt-ViT votes' other spellings

#: an unknown name's colours (tab20b / tab20c hues no known name uses)
FALLBACK_PALETTE: tuple[str, ...] = ("#5254a3", "#8ca252", "#bd9e39", "#ad494a", "#a55194", "#6b6ecf", "#b5cf6b",
    "#e7969c", "#ce6dbd", "#3182bd", "#e6550d", "#31a354", "#756bb1", "#636363", "#9c9ede", "#843c39")


def condition_color(name: str) -> str:
    """The colour ``"#rrggbb"`` of a condition or target id in every figure (case and spaces ignored); any other
    name gets one of :data:`FALLBACK_PALETTE` by its MD5 digest (the same in every process, unlike ``hash``)."""
    key = str(name).strip()
    if key.lower() in _FOLDED:
        return CONDITION_COLORS.get(key, _FOLDED[key.lower()])
    digest = hashlib.md5(key.encode("utf-8")).digest()
    return FALLBACK_PALETTE[int.from_bytes(digest[:4], "big") % len(FALLBACK_PALETTE)]


def to_numpy(x: Any) -> np.ndarray:
    """A tensor (detached, as float32, on the CPU) or anything ``np.asarray`` takes, as a numpy array."""
    return x.detach().float().cpu().numpy() if isinstance(x, torch.Tensor) else np.asarray(x)


def image_to_rgb(image: Any, normalization: Normalization = None) -> np.ndarray:
    """``[3,H,W]`` (tensor or array) → ``[H,W,3]`` float in ``[0,1]``: the backbone's ``normalization = (mean,
    std)`` undone (``x·std + mean``), else min–max rescaled. ValueError: another shape."""
    x = to_numpy(image).astype(np.float64)
    if x.ndim != 3 or x.shape[0] not in (1, 3):
        raise ValueError(f"image must be [3,H,W] (or [1,H,W]), got shape {x.shape}")
    if normalization is not None:
        mean, std = (np.asarray(v, dtype=np.float64).reshape(-1, 1, 1) for v in normalization)
    x = np.clip(x * std + mean if normalization is not None else unit_range(x), 0.0, 1.0).transpose(1, 2, 0)
    return np.repeat(x, 3, axis=2) if x.shape[2] == 1 else x


def unit_range(x: np.ndarray) -> np.ndarray:
    """``x`` min–max rescaled to ``[0, 1]`` (NaNs ignored; all zeros where ``x`` is constant)."""
    lo, hi = np.nanmin(x), np.nanmax(x)
    return (x - lo) / (hi - lo) if hi > lo else np.zeros_like(x)


def class_name(classes: Sequence[str] | None, label: int, limit: int = 26) -> str:
    """Class ``label``'s name for a title: CUB's ``"017.Cardinal"`` → ``"Cardinal"``, cut to ``limit``
    characters; ``"class 3"`` where ``classes`` does not name it."""
    if not classes or not 0 <= label < len(classes):
        return f"class {label}"
    name = str(classes[label]).split(".", 1)[-1].replace("_", " ")
    return name if len(name) <= limit else name[: limit - 1] + "…"


def require_columns(table: pd.DataFrame, columns: Sequence[str], what: str = "table", hint: str = "") -> None:
    """Raises ValueError naming the ``columns`` that ``table`` lacks, the ones it has, and ``hint``."""
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise ValueError(f"{what} is missing column(s) {missing}; has {list(table.columns)}{hint}")


def label_axes(ax, xlabel: str | None = None, ylabel: str | None = None, title: str | None = None, *,
               size: float = FONT["label"], title_size: float = FONT["title"] - 1, grid: str | None = "both",
               legend: dict | None = None) -> None:
    """Every figure's axes: labels (``size`` pt), title, ticks, a light grid on ``grid`` and a ``legend``."""
    ax.set_xlabel(xlabel or "", fontsize=size)
    ax.set_ylabel(ylabel or "", fontsize=size)
    ax.set_title(title or "", fontsize=title_size)
    ax.tick_params(labelsize=FONT["tick"])
    if grid:
        ax.grid(axis=grid, alpha=0.3)
    if legend is not None:
        ax.legend(**{"fontsize": FONT["legend"], "loc": "best", **legend})


def colorbar(fig: Figure, mappable, label: str, **kw):
    """A colour bar of ``mappable`` labelled ``label`` (``kw``: :meth:`Figure.colorbar`'s)."""
    cb = fig.colorbar(mappable, **kw)
    cb.set_label(label, fontsize=FONT["annot"])
    cb.ax.tick_params(labelsize=FONT["tick"])
    return cb


def panel_grid(n: int, ncols: int, panel: tuple[float, float], extra: tuple[float, float] = (0, 0),
               **kw) -> tuple[Figure, list]:
    """A figure of ``n`` panels, at most ``ncols`` a row, each ``panel`` (w, h) inches plus ``extra``
    inches in all; returns it and its ``n`` axes (the rest of the last row hidden)."""
    ncols, nrows = min(ncols, n), -(-n // min(ncols, n))
    fig, axes = plt.subplots(nrows, ncols, squeeze=False, **kw,
                             figsize=(panel[0] * ncols + extra[0], panel[1] * nrows + extra[1]))
    for ax in axes.ravel()[n:]:
        ax.set_visible(False)
    return fig, list(axes.ravel()[:n])


def legend_below(fig: Figure, handles: list, *, ncol: int, note: str | None = None, x: float = 0.5,
                 loc: str = "lower center", right: float = 1.0, top: float = 0.95) -> float:
    """``note`` (italic) on the bottom line, a legend of ``handles`` above it, the panels above both (measured; the
    figure widens to hold the legend). Returns the bottom of the panels' area (figure fraction)."""
    renderer, to_fig, y = fig.canvas.get_renderer(), fig.transFigure.inverted(), 0.005
    if note:
        text = fig.text(0.99, 0.012, note, ha="right", va="bottom", fontsize=FONT["annot"], style="italic",
                        color="0.25")
        y = text.get_window_extent(renderer).transformed(to_fig).y1 + 0.008
    legend = fig.legend(handles=handles, loc=loc, bbox_to_anchor=(x, y), ncol=ncol, fontsize=FONT["legend"],
                        frameon=False, borderaxespad=0)
    width_in = legend.get_window_extent(renderer).width / fig.dpi
    if width_in > 0.96 * fig.get_figwidth():
        fig.set_figwidth(width_in / 0.96)
    bottom = legend.get_window_extent(renderer).transformed(to_fig).y1 + 0.01
    fig.tight_layout(rect=(0, bottom, right, top))
    return bottom


def patch_rects(ax, mask: np.ndarray, rows: int, cols: int, patch_h: float, patch_w: float, **style) -> None:
    """One ``Rectangle`` (``style``) per true entry of ``mask [rows*cols]`` (row-major), ``patch_w × patch_h`` px."""
    for t in np.flatnonzero(mask):
        r, c = divmod(int(t), cols)
        ax.add_patch(Rectangle((c * patch_w, r * patch_h), patch_w, patch_h, **style))


def draw_parts_or_box(ax, parts: Any = None, box: Any = None, *, s: float = 22, lw: float = 1.8) -> None:
    """The visible keypoints of ``parts [K,3]`` (x, y, visible; px) as dots, the ``box (x0, y0, x1, y1)`` (px)."""
    parts = np.zeros((0, 3)) if parts is None else to_numpy(parts).reshape(-1, 3)
    vis = parts[:, 2] > 0
    if vis.any():
        ax.scatter(parts[vis, 0], parts[vis, 1], s=s, c=KEYPOINT_COLOR, edgecolors="white",
                   linewidths=0.7 if s > 16 else 0.5, zorder=3)
    if box is not None:
        x0, y0, x1, y1 = (float(v) for v in to_numpy(box))
        ax.add_patch(Rectangle((x0, y0), x1 - x0, y1 - y0, fill=False, edgecolor=BOX_COLOR, lw=lw))


KEYPOINT_HANDLE = Line2D([], [], ls="", marker="o", ms=5, mfc=KEYPOINT_COLOR, mec="white",
                         label="visible part keypoint")
BOX_HANDLE = Patch(fill=False, edgecolor=BOX_COLOR, lw=1.8, label="object box")


def place_point_labels(ax, points: Sequence[tuple[float, float]], labels: Sequence[str], *,
                       fontsize: float | None = None, pad: float = 2.0) -> list:
    """Label each point, no two labels overlapping, none over a marker, inside the axes (call it once limits and
    layout are final); greedy: each label takes the nearest offset whose box clears the others, else the least
    overlapping one. Returns the annotations."""
    renderer = ax.figure.canvas.get_renderer()
    r = 6.0 * ax.figure.dpi / 72  # half a marker (ms 8) plus a little, in pixels
    taken = [np.r_[p - r, p + r] for p in ax.transData.transform(np.asarray(points, dtype=float).reshape(-1, 2))]
    frame = np.array(ax.get_window_extent(renderer).extents)  # [x0, y0, x1, y1]
    offsets = [(dx * k, dy * k) for k in (7, 14, 24) for dx, dy in
               ((1, 0.7), (1, -1.2), (-1, 0.7), (-1, -1.2), (0, 1.3), (0, -1.8), (1.2, 0), (-1.2, 0))]

    def note(xy, label: str, dx: float, dy: float):
        return ax.annotate(label, xy, textcoords="offset points", xytext=(dx, dy),
                           fontsize=FONT["annot"] if fontsize is None else fontsize,
                           ha="left" if dx > 0 else "right" if dx < 0 else "center",
                           va="bottom" if dy > 0 else "top" if dy < 0 else "center")

    texts = []
    for xy, label in zip(points, labels):
        best = None
        for dx, dy in offsets:
            t = note(xy, label, dx, dy)
            box = np.array(t.get_window_extent(renderer).extents) + [-pad, -pad, pad, pad]
            t.remove()
            cost = sum(_overlap(box, o) for o in taken) + _overlap(box, box) - _overlap(box, frame)  # + outside
            if best is None or cost < best[0]:
                best = (cost, dx, dy, box)
            if cost == 0:
                break
        taken.append(best[3])
        texts.append(note(xy, label, *best[1:3]))
    return texts


def _overlap(a: np.ndarray, b: np.ndarray) -> float:
    w, h = min(a[2], b[2]) - max(a[0], b[0]), min(a[3], b[3]) - max(a[1], b[1])
    return float(w * h) if w > 0 and h > 0 else 0.0
