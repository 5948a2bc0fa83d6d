"""Figures of D over the regime grid (depth × budget) and over backbones."""
from __future__ import annotations

import math
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.patches import Patch, Rectangle
from matplotlib.lines import Line2D

from .output import finish_figure, FONT
from .colors import AXIS_CMAPS, condition_colors as _condition_colors
from .protocol import AXIS_LABELS, mixed_groups


# ---------------------------------------------------------------------------------------------
# regimes and scale
# ---------------------------------------------------------------------------------------------
def _d_table_check(table: pd.DataFrame, needed: Sequence[str]) -> None:
    missing = [c for c in needed if c not in table.columns]
    if missing:
        raise ValueError(f"D table is missing column(s) {missing}; has {list(table.columns)} "
                         "(expected the output of midas_nb.metrics.decoupling_D)")


#: the statuses drawn in D's colour, with the mark after the value
_COLOURED = {"in band": "✓", "not resolved": "?", "uninformative": "○"}
#: each status's cell pattern (facecolor only where the cell is not coloured by D)
_STATUS_STYLE: dict[str, dict[str, Any]] = {
    "in band": dict(edgecolor="0.4"),
    "not resolved": dict(edgecolor="0.35", hatch="...."),
    "uninformative": dict(edgecolor="0.1", hatch="xx"),
    "outside band": dict(facecolor="0.85", edgecolor="0.45", hatch="///"),
}
_STATUS_LABELS = {
    "in band": "✓ in parity band (coloured by D)",
    "not resolved": "? band not resolved: ΔIDAUC CI straddles −band (coloured by D)",
    "uninformative": "○ uninformative: the reference is not faithful (coloured by D)",
    "outside band": "✗ outside band: ΔIDAUC < −band (D in brackets)",
}


def status_legend_handles() -> list:
    """One legend swatch per parity-band status of :func:`regime_heatmap`, each distinct in
    (face colour, hatch, edge colour): coloured statuses show a sample of D's colour map
    under their pattern, "outside band" its grey hatch."""
    sample = plt.get_cmap("RdBu_r")(0.78)
    handles = []
    for st, label in _STATUS_LABELS.items():
        style = dict(_STATUS_STYLE[st])
        style.setdefault("facecolor", sample)
        handles.append(Patch(label=label, lw=0.8, **style))
    return handles


def _group_status(g: pd.DataFrame) -> str:
    """One parity-band status for the rows of a plotted cell (``decoupling_D``'s ``status``
    when present, else the point decision ``in_band``): any undefined → "undefined", any
    "uninformative" (the reference is not faithful, so the band says nothing) →
    "uninformative", all in band → "in band", any outside → "outside band", else "not resolved"."""
    if "status" in g.columns:
        st = set(g["status"].astype(str))
    else:
        st = {"undefined" if pd.isna(v) else "in band" if bool(v) else "outside band" for v in g["in_band"]}
    if "undefined" in st or "no reference" in st:
        return "undefined"
    if "uninformative" in st:
        return "uninformative"
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
    ("not resolved") are coloured by D under a dotted pattern and annotated ``+2.1 ?``; cells whose
    band says nothing (``uninformative``: the reference is not faithful) are coloured by D under
    a cross-hatch and annotated ``○``; cells outside the band are
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
    note = mixed_groups(table, average_over, "regime_heatmap", [c for c in ("dataset", "backbone") if c not in (x, y)])
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
        shown = np.where(np.isin(status, list(_COLOURED)), grid, np.nan)
        im = ax.imshow(shown, cmap="RdBu_r", norm=norm, aspect="auto", origin="lower")
        for i in range(len(ys)):
            for j in range(len(xs)):
                if status[i, j] in ("not run", "undefined"):   # not in the grid / NaN values
                    ax.text(j, i, status[i, j], ha="center", va="center", fontsize=FONT["annot"] - 1,
                            color="0.55", style="italic")
                    continue
                if status[i, j] in _COLOURED:
                    v = grid[i, j]
                    if status[i, j] != "in band":  # the status's own pattern over the colour
                        ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=0,
                                               **_STATUS_STYLE[status[i, j]]))
                    ax.text(j, i, f"{v:+.1f} {_COLOURED[status[i, j]]}", ha="center", va="center",
                            fontsize=FONT["annot"],
                            color="white" if abs(v) > 0.6 * lim and status[i, j] == "in band" else "black",
                            bbox=None if status[i, j] == "in band" else
                            dict(boxstyle="round,pad=0.15", facecolor="white", edgecolor="none", alpha=0.7))
                else:
                    ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, lw=0.5, **_STATUS_STYLE["outside band"]))
                    ax.text(j, i, f"✗ ({grid[i, j]:+.1f})" if np.isfinite(grid[i, j]) else "✗",
                            ha="center", va="center", fontsize=FONT["annot"], color="0.15",
                            bbox=dict(boxstyle="round,pad=0.2", facecolor="white", edgecolor="none", alpha=0.85))
        ax.set_xticks(range(len(xs)), [_fmt_axis_value(x, v) for v in xs], fontsize=FONT["tick"])
        ax.set_yticks(range(len(ys)), [_fmt_axis_value(y, v) for v in ys], fontsize=FONT["tick"])
        ax.set_xlabel(AXIS_LABELS.get(x, x), fontsize=FONT["label"] - 1)
        ax.set_ylabel(AXIS_LABELS.get(y, y), fontsize=FONT["label"] - 1)
        ax.set_title(cond, fontsize=FONT["label"])
    # the status legend under the panels, measured: the figure widens to hold it and the
    # panels end above it
    legend = fig.legend(handles=status_legend_handles(), loc="lower center", bbox_to_anchor=(0.5, 0.005),
                        ncol=2 if fig.get_figwidth() >= 9 else 1, fontsize=FONT["legend"], frameon=False,
                        borderaxespad=0)
    renderer = fig.canvas.get_renderer()
    width_in = legend.get_window_extent(renderer).width / fig.dpi
    if width_in > 0.96 * fig.get_figwidth():
        fig.set_figwidth(width_in / 0.96)
    bottom = legend.get_window_extent(renderer).transformed(fig.transFigure.inverted()).y1 + 0.01
    fig.tight_layout(rect=(0, bottom, 0.9, 0.95))
    cax = fig.add_axes((0.91, bottom + 0.1 * (0.95 - bottom), 0.018, 0.75 * (0.95 - bottom)))
    cb = fig.colorbar(im, cax=cax)
    cb.set_label("D = mIoU − mIoU_ref (pp)", fontsize=FONT["annot"])
    cb.ax.tick_params(labelsize=FONT["tick"])
    fig.suptitle((title or f"D = mIoU_t − mIoU_ref (pp) over {y} × {x}") + note, fontsize=FONT["title"])
    return finish_figure(fig, save)


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
    note = mixed_groups(table, average_over, "regime_lines", [c for c in ("dataset", "backbone") if c not in (x, hue)])
    kinds: set[str] = set()
    conds = list(conditions) if conditions is not None else [
        c for c in dict.fromkeys(table["condition"].astype(str)) if c != reference]
    if not conds:
        raise ValueError("no condition to plot besides the reference")
    hues = sorted(table[hue].dropna().unique())
    cmap = plt.get_cmap(AXIS_CMAPS.get(hue, "viridis"))   # budget and depth: never one colormap for both
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
            ax.scatter(xv[st == "uninformative"], d[st == "uninformative"], facecolors="white", marker="D",
                       edgecolors=colors[hv], s=30, zorder=3, gid="uninformative")
        ax.axhline(0, color="black", lw=0.8)
        ax.set_title(conds[k], fontsize=FONT["label"])
        ax.set_xlabel(AXIS_LABELS.get(x, x), fontsize=FONT["label"] - 1)
        if k % ncols == 0:
            ax.set_ylabel("D = mIoU − mIoU_ref (pp)", fontsize=FONT["label"] - 1)
        ax.tick_params(labelsize=FONT["tick"])
        xt = sorted(table[x].dropna().unique())
        ax.set_xticks(xt, [_fmt_axis_value(x, v) for v in xt])
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colors[hv], lw=1.5, label=f"{hue} = {_fmt_axis_value(hue, hv)}") for hv in hues]
    handles += [Line2D([], [], color="0.3", marker="o", ls="", label="in parity band"),
                Line2D([], [], color="0.3", marker="o", markerfacecolor="white", ls="", label="band not resolved"),
                Line2D([], [], color="0.3", marker="x", ls="", ms=8, label="outside band"),
                Line2D([], [], color="0.3", marker="D", markerfacecolor="white", ls="", ms=5,
                       label="uninformative (reference not faithful)")]
    fig.legend(handles=handles, loc="lower center", ncol=min(len(handles), 6), fontsize=FONT["legend"],
               frameon=False)
    bars = f"; error bars: {' / '.join(sorted(kinds))}" if kinds else ""
    fig.suptitle((title or f"D = mIoU_t − mIoU_ref (pp) against {x}") + note + bars, fontsize=FONT["title"])
    fig.tight_layout(rect=(0, 0.09, 1, 0.95))
    return finish_figure(fig, save)


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
    note = mixed_groups(table, average_over, "scale_plot", [c for c in ("dataset", "backbone") if c != x])
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
                   hatch=None if inb else {"not resolved": "...", "uninformative": "xx"}.get(st, "///"),
                   edgecolor="black" if not inb else colors[cond],
                   yerr=None if not np.isfinite(lo) else [[lo], [hi]], capsize=2,
                   label=cond if i == 0 or cat == cats[0] else None)
    ax.axhline(0, color="black", lw=0.8)
    ax.set_xticks(range(len(cats)), cats, rotation=15 if max(map(len, cats)) > 14 else 0,
                  ha="right" if max(map(len, cats)) > 14 else "center", fontsize=FONT["tick"])
    ax.set_xlabel(AXIS_LABELS.get(x, x), fontsize=FONT["label"])
    ax.set_ylabel("D = mIoU − mIoU_ref (pp)", fontsize=FONT["label"])
    ax.tick_params(labelsize=FONT["tick"])
    ax.grid(axis="y", alpha=0.3)
    handles = [Patch(color=colors[c], label=c) for c in conds]
    handles.append(Patch(facecolor="0.85", edgecolor="black", hatch="...", label="band not resolved"))
    handles.append(Patch(facecolor="0.85", edgecolor="black", hatch="///", label="outside parity band"))
    handles.append(Patch(facecolor="0.85", edgecolor="black", hatch="xx", label="uninformative (reference not faithful)"))
    ax.legend(handles=handles, fontsize=FONT["legend"], loc="upper left", bbox_to_anchor=(1.01, 1.0),
              borderaxespad=0, frameon=False)      # beside the axes: never over a bar
    bars = f" (error bars: {' / '.join(sorted(kinds))})" if kinds else ""
    ax.set_title((title or f"D = mIoU_t − mIoU_ref (pp) across {x}s") + note + bars, fontsize=FONT["title"])
    fig.tight_layout()
    return finish_figure(fig, save)
