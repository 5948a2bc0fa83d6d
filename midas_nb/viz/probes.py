"""Figures of the cosine probes between target rankings."""
from __future__ import annotations

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.patches import Rectangle

from .common import colorbar, condition_color, finish_figure, FONT, label_axes, require_columns


#: what :func:`midas_nb.metrics.probes.cosine_matrix` computes per image in each ``mode``
MODE_LABELS = {"rank": "rank cosine (Spearman ρ)", "centered": "cosine of centred maps (Pearson r)",
               "raw": "cosine of raw maps"}


def cosine_heatmap(mean: pd.DataFrame, highlight: tuple[str, str] | None = ("T5", "T3"), *,
                   lo: pd.DataFrame | None = None, hi: pd.DataFrame | None = None,
                   title: str | None = None, save: str | None = None) -> Figure:
    """Mean per-image cosine between target rankings, ``mean`` (square, index = columns = target ids, in ``[−1,
    1]``: :func:`midas_nb.metrics.probes.cosine_matrix`; ``attrs["mode"]`` names it), as an annotated matrix;
    ``highlight``: a pair whose cells are framed and called out in the title, with the CI bounds ``lo``, ``hi``
    where given. ValueError: ``mean`` not square with matching index and columns."""
    if list(mean.index) != list(mean.columns):
        raise ValueError("mean must be a square DataFrame with the same ids as index and columns")
    ids, M = [str(i) for i in mean.index], mean.to_numpy(dtype=float)
    n, side = len(ids), max(4.5, 0.62 * len(ids) + 2.2)
    fig, ax = plt.subplots(figsize=(side + 1.0, side))
    im = ax.imshow(M, cmap="RdBu_r", vmin=-1, vmax=1)
    for (i, j), v in np.ndenumerate(M):
        if np.isfinite(v):
            ax.text(j, i, _fmt_cell(v), ha="center", va="center", fontsize=FONT["annot"] - (1 if n > 8 else 0),
                    color="white" if abs(v) > 0.6 else "black")
    ax.set_xticks(range(n), ids, rotation=45, ha="right")
    ax.set_yticks(range(n), ids)
    what = MODE_LABELS[mean.attrs.get("mode", "rank")]
    colorbar(fig, im, f"mean per-image {what}", ax=ax, fraction=0.046, pad=0.04)
    callout = ""
    if highlight is not None and all(h in ids for h in highlight):
        a, b = ids.index(highlight[0]), ids.index(highlight[1])
        for (r, c) in {(a, b), (b, a)}:
            ax.add_patch(Rectangle((c - 0.5, r - 0.5), 1, 1, fill=False, edgecolor="lime", lw=3))
        callout = f"\ncos({highlight[0]}, {highlight[1]}) = {_fmt_cell(M[a, b], 3)}"
        if lo is not None and hi is not None:
            callout += f" [{_fmt_cell(float(lo.iloc[a, b]), 3)}, {_fmt_cell(float(hi.iloc[a, b]), 3)}]"
    label_axes(ax, "target", "target", (title or f"{what[0].upper()}{what[1:]} of target maps") + callout, grid=None)
    return finish_figure(fig, save, tight=True)


def cosine_depth_lines(table: pd.DataFrame, *, title: str | None = None, save: str | None = None) -> Figure:
    """Cosine of target pairs against depth, with CIs: ``table`` (:func:`midas_nb.metrics.probes.cosine_across_depths`)
    has ``depth``, ``cosine``, ``lo``, ``hi`` and the pair as ``a``/``b`` or ``hidden``/``attention`` columns."""
    a, b = ("hidden", "attention") if "hidden" in table.columns else ("a", "b")
    require_columns(table, ("depth", "cosine", a, b))
    fig, ax = plt.subplots(figsize=(6.4, 4.0))
    # a pair in its first target's colour (the colour it has in every figure), one line style per second target
    styles = {v: ("-", "--", ":", "-.")[i % 4] for i, v in enumerate(dict.fromkeys(table[b].astype(str)))}
    for (x, y), g in table.groupby([a, b], sort=False):
        g = g.sort_values("depth")
        d = g["depth"].to_numpy(dtype=float)
        ax.plot(d, g["cosine"], marker="o", color=condition_color(x), ls=styles[str(y)], label=f"{x} vs {y}")
        if {"lo", "hi"} <= set(g.columns) and g["lo"].notna().any():
            ax.fill_between(d, g["lo"].to_numpy(dtype=float), g["hi"].to_numpy(dtype=float),
                            color=condition_color(x), alpha=0.12, lw=0)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(sorted(table["depth"].dropna().unique()))
    modes = set(table["mode"].dropna()) if "mode" in table.columns else {"rank"}
    what = MODE_LABELS[modes.pop()] if len(modes) == 1 else "cosine"
    label_axes(ax, "depth L (targets read at block L)", f"mean per-image {what}",
               title or f"{what[0].upper()}{what[1:]} of target pairs across depths (bands: 95 % CI)",
               legend=dict(framealpha=0.85))
    return finish_figure(fig, save, tight=True)


def _fmt_cell(v: float, digits: int = 2) -> str:
    """No negative zero (``-0.004`` → ``0.00``)."""
    return f"{v:.{digits}f}".replace(f"-{0:.{digits}f}", f"{0:.{digits}f}")
