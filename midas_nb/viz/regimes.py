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

from .common import (AXIS_CMAPS, colorbar, condition_color, finish_figure, FONT, label_axes, legend_below,
                    panel_grid, require_columns)
from .protocol import AXIS_LABELS, mixed_groups

D_LABEL = "D = mIoU − mIoU_ref (pp)"
#: each parity-band status: its mark, its cell pattern in :func:`regime_heatmap` (a face colour only
#: where D does not colour the cell), its legend line
_STATUS: dict[str, tuple[str, dict[str, Any], str]] = {
    "in band": ("✓", dict(edgecolor="0.4"), "in parity band (coloured by D)"),
    "not resolved": ("?", dict(edgecolor="0.35", hatch="...."),
                     "band not resolved: ΔIDAUC CI straddles −band (coloured by D)"),
    "uninformative": ("○", dict(edgecolor="0.1", hatch="xx"),
                      "uninformative: the reference is not faithful (coloured by D)"),
    "outside band": ("✗", dict(facecolor="0.85", edgecolor="0.45", hatch="///"),
                     "outside band: ΔIDAUC < −band (D in brackets)")}
_COLOURED = ("in band", "not resolved", "uninformative")   # the statuses drawn in D's colour
#: :func:`regime_lines`' marker of each status: (marker, area in pt², hollow, legend label)
_MARKS = {"in band": ("o", 36, False, "in parity band"), "not resolved": ("o", 36, True, "band not resolved"),
          "outside band": ("x", 60, False, "outside band"),
          "uninformative": ("D", 30, True, "uninformative (reference not faithful)")}


def _d_conditions(table: pd.DataFrame, what: str, axes: Sequence[str], value: str,
                  conditions: Sequence[str] | None, reference: str, average_over: Sequence[str]) -> tuple[str, list]:
    """Check a ``decoupling_D`` table; returns the title's note on what it averages over and the
    conditions to draw (``conditions``, default every one but ``reference``)."""
    require_columns(table, ["condition", *axes, value, "in_band"], "D table",
                    " (expected the output of midas_nb.metrics.decoupling_D)")
    note = mixed_groups(table, average_over, what, [c for c in ("dataset", "backbone") if c not in axes])
    conds = list(conditions) if conditions is not None else [
        c for c in dict.fromkeys(table["condition"].astype(str)) if c != reference]
    if not conds:
        raise ValueError("no condition to plot besides the reference")
    return note, conds


def _group_status(g: pd.DataFrame) -> str:
    """One parity-band status for the rows of a plotted cell (``decoupling_D``'s ``status``
    when present, else the point decision ``in_band``): any undefined → "undefined", any
    "uninformative" (the reference is not faithful, so the band says nothing) →
    "uninformative", all in band → "in band", any outside → "outside band", else "not resolved"."""
    st = set(g["status"].astype(str)) if "status" in g.columns else {
        "undefined" if pd.isna(v) else "in band" if bool(v) else "outside band" for v in g["in_band"]}
    if st & {"undefined", "no reference"}:
        return "undefined"
    if st == {"in band"}:
        return "in band"
    return next((s for s in ("uninformative", "outside band") if s in st), "not resolved")


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
    """A tick label: a budget in %, a number with ``g``, anything else as text."""
    if name == "budget":
        return f"{float(v) * 100:g}%"
    return f"{v:g}" if isinstance(v, (int, float, np.integer, np.floating)) else str(v)


def regime_heatmap(table: pd.DataFrame, x: str = "budget", y: str = "depth", *, value: str = "D_pp",
                   conditions: Sequence[str] | None = None, reference: str = "reference",
                   vmax: float | None = None, title: str | None = None,
                   save: str | None = None, average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp) over a ``y × x`` grid (default depth × budget), one panel per condition.

    Cells in the band (``status`` "in band": the paired ΔIDAUC interval lies above ``−band``) are
    coloured by D and annotated ``+2.1 ✓``; "not resolved" (the interval straddles the band edge)
    coloured under dots, ``+2.1 ?``; "uninformative" (the reference is not faithful) coloured under a
    cross-hatch, ``○``; outside the band grey, hatched, ``✗`` with D in brackets (DESIGN.md §6:
    marked, never dropped); "undefined" (NaN IDAUC or mIoU) and "not run" cells say so. Without a
    ``status`` column the point decision ``in_band`` is used.

    Args:
        table: :func:`midas_nb.metrics.decoupling_D` output with ``condition``, ``x``, ``y``,
            ``value`` and ``in_band`` (and ``status``) columns. Several datasets or backbones
            are an error unless named in ``average_over`` (then averaged, and the title says so).
        x, y: grid columns. value: the D column (percentage points).
        conditions: panels (default: every condition except the reference).
        vmax: half-range of the diverging colour scale (default: largest |D|).
        title: figure title. save: figure name for :func:`save_figure`.
    """
    note, conds = _d_conditions(table, "regime_heatmap", (x, y), value, conditions, reference, average_over)
    xs, ys = sorted(table[x].dropna().unique()), sorted(table[y].dropna().unique())
    vals = table[value].to_numpy(dtype=float)
    lim = vmax or max(1e-6, float(np.nanmax(np.abs(vals))) if np.isfinite(vals).any() else 1.0)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)
    fig, axes = panel_grid(len(conds), 3, (max(3.4, 0.95 * len(xs) + 1.6), max(2.8, 0.7 * len(ys) + 1.5)), (1.2, 0.6))
    for cond, ax in zip(conds, axes):
        grid = np.full((len(ys), len(xs)), np.nan)
        status = np.full((len(ys), len(xs)), "not run", dtype=object)
        for (yv, xv), g in table[table["condition"].astype(str) == cond].groupby([y, x]):
            grid[ys.index(yv), xs.index(xv)] = g[value].astype(float).mean()
            status[ys.index(yv), xs.index(xv)] = _group_status(g)
        im = ax.imshow(np.where(np.isin(status, _COLOURED), grid, np.nan), cmap="RdBu_r", norm=norm, aspect="auto",
                       origin="lower")
        for (i, j), st in np.ndenumerate(status):
            v = grid[i, j]
            if st in ("not run", "undefined"):   # not in the grid / NaN values
                ax.text(j, i, st, ha="center", va="center", fontsize=FONT["annot"] - 1, color="0.55", style="italic")
                continue
            if st != "in band":   # the status's own pattern (over D's colour, or grey outside the band)
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, **{"fill": False, "lw": 0, **_STATUS[st][1]}
                                       if st in _COLOURED else dict(lw=0.5, **_STATUS[st][1])))
            text = (f"{v:+.1f} {_STATUS[st][0]}" if st in _COLOURED
                    else f"✗ ({v:+.1f})" if np.isfinite(v) else "✗")
            ax.text(j, i, text, ha="center", va="center", fontsize=FONT["annot"],
                    color="white" if abs(v) > 0.6 * lim and st == "in band" else "black" if st in _COLOURED else "0.15",
                    bbox=None if st == "in band" else dict(boxstyle=f"round,pad={0.15 if st in _COLOURED else 0.2}",
                                                           facecolor="white", edgecolor="none",
                                                           alpha=0.7 if st in _COLOURED else 0.85))
        ax.set_xticks(range(len(xs)), [_fmt_axis_value(x, v) for v in xs])
        ax.set_yticks(range(len(ys)), [_fmt_axis_value(y, v) for v in ys])
        label_axes(ax, AXIS_LABELS.get(x, x), AXIS_LABELS.get(y, y), cond, size=FONT["label"] - 1,
                   title_size=FONT["label"], grid=None)
    # the status legend under the panels (a swatch per status: D's colour under its pattern, or the grey
    # hatch outside the band), the colour bar right of them
    handles = [Patch(label=f"{mark} {label}", lw=0.8, **{"facecolor": plt.get_cmap("RdBu_r")(0.78), **style})
               for mark, style, label in _STATUS.values()]
    bottom = legend_below(fig, handles, ncol=2 if fig.get_figwidth() >= 9 else 1, right=0.9)
    colorbar(fig, im, D_LABEL, cax=fig.add_axes((0.91, bottom + 0.1 * (0.95 - bottom), 0.018, 0.75 * (0.95 - bottom))))
    fig.suptitle((title or f"D = mIoU_t − mIoU_ref (pp) over {y} × {x}") + note, fontsize=FONT["title"])
    return finish_figure(fig, save)


def regime_lines(table: pd.DataFrame, x: str = "depth", hue: str = "budget", *, value: str = "D_pp",
                 conditions: Sequence[str] | None = None, reference: str = "reference",
                 title: str | None = None, save: str | None = None,
                 average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp) against ``x`` (default depth), one line per ``hue`` value, one panel per condition.

    Filled markers: in the parity band; open circles: not resolved (the paired ΔIDAUC interval
    straddles ``−band``); ``×``: outside (D still drawn); open diamonds: uninformative. Error bars:
    the 95 % paired intervals ``D_pp_lo``/``D_pp_hi`` where present, else the seed std (the title says).

    Args:
        table: :func:`midas_nb.metrics.decoupling_D` output (``condition``, ``x``, ``hue``, ``value``,
            ``in_band``; ``status`` and intervals where present). x: x-axis column. hue: a line per value.
        value: the D column (pp). conditions: panels (default: all but the reference).
        title, save: title, figure name. average_over: datasets / backbones to average over (else an error).
    """
    note, conds = _d_conditions(table, "regime_lines", (x, hue), value, conditions, reference, average_over)
    kinds: set[str] = set()
    hues = sorted(table[hue].dropna().unique())
    cmap = plt.get_cmap(AXIS_CMAPS.get(hue, "viridis"))   # budget and depth: never one colormap for both
    colors = {hv: cmap(i / max(1, len(hues) - 1) * 0.85) for i, hv in enumerate(hues)}
    fig, axes = panel_grid(len(conds), 3, (4.2, 3.3), (0, 0.7), sharey=True)
    xt = sorted(table[x].dropna().unique())
    for cond, ax in zip(conds, axes):
        sub = table[table["condition"].astype(str) == cond]
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
            for status, (marker, size, hollow, _) in _MARKS.items():
                ax.scatter(xv[st == status], d[st == status], marker=marker, s=size, zorder=3, gid=status,
                           **(dict(facecolors="white", edgecolors=colors[hv]) if hollow else dict(color=colors[hv])))
        ax.axhline(0, color="black", lw=0.8)
        ax.set_xticks(xt, [_fmt_axis_value(x, v) for v in xt])
        label_axes(ax, AXIS_LABELS.get(x, x), D_LABEL if ax.get_subplotspec().is_first_col() else None, cond,
                   size=FONT["label"] - 1, title_size=FONT["label"])
    handles = [Line2D([], [], color=colors[hv], lw=1.5, label=f"{hue} = {_fmt_axis_value(hue, hv)}") for hv in hues]
    handles += [Line2D([], [], color="0.3", marker=marker, ls="", ms=math.sqrt(size), mfc="white" if hollow else None,
                       label=label) for marker, size, hollow, label in _MARKS.values()]
    legend_below(fig, handles, ncol=min(len(handles), 6))
    bars = f"; error bars: {' / '.join(sorted(kinds))}" if kinds else ""
    fig.suptitle((title or f"D = mIoU_t − mIoU_ref (pp) against {x}") + note + bars, fontsize=FONT["title"])
    return finish_figure(fig, save)


def scale_plot(table: pd.DataFrame, x: str = "backbone", *, value: str = "D_pp",
               conditions: Sequence[str] | None = None, reference: str = "reference",
               order: Sequence[str] | None = None, title: str | None = None,
               save: str | None = None, average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp) per backbone (or any categorical ``x``), one group of bars per backbone.

    Solid bars are in the parity band; pale dotted: not resolved; pale hatched: outside it; pale
    cross-hatched: uninformative; undefined values are labelled "undefined". Error bars as in
    :func:`regime_lines`. Several datasets (or, with another ``x``, backbones) are an error unless
    named in ``average_over``.

    Args:
        table: :func:`midas_nb.metrics.decoupling_D` output with ``condition``, ``x``,
            ``value``, ``in_band``.
        x: the categorical column (default ``backbone``). order: its order (default: as it
            appears). conditions: bars (default: all but the reference).
        title: figure title. save: figure name for :func:`save_figure`.
    """
    note, conds = _d_conditions(table, "scale_plot", (x,), value, conditions, reference, average_over)
    kinds: set[str] = set()
    cats = list(order) if order is not None else list(dict.fromkeys(table[x].astype(str)))
    width = 0.8 / max(1, len(conds))
    fig, ax = plt.subplots(figsize=(max(5.0, 1.6 * len(cats) * max(1, len(conds)) ** 0.5 + 2), 4.2))
    for k, cond in enumerate(conds):
        sub, color = table[table["condition"].astype(str) == cond], condition_color(cond)
        for i, cat in enumerate(cats):
            g = sub[sub[x].astype(str) == cat]
            if g.empty:
                continue
            d, st, pos = float(g[value].mean()), _group_status(g), i - 0.4 + width * (k + 0.5)
            if st == "undefined" or not np.isfinite(d):
                ax.text(pos, 0, "undefined", rotation=90, ha="center", va="bottom", fontsize=FONT["annot"] - 1,
                        color="0.4")
                continue
            inb = st == "in band"
            lo, hi, kind = _d_errors(g, value)
            kinds.update([kind] if kind else [])
            ax.bar(pos, d, width=width * 0.92, color=color, alpha=1.0 if inb else 0.35,
                   hatch=None if inb else {"not resolved": "...", "uninformative": "xx"}.get(st, "///"),
                   edgecolor=color if inb else "black", yerr=None if not np.isfinite(lo) else [[lo], [hi]], capsize=2,
                   label=cond if i == 0 or cat == cats[0] else None)
    ax.axhline(0, color="black", lw=0.8)
    long = max(map(len, cats)) > 14
    ax.set_xticks(range(len(cats)), cats, rotation=15 if long else 0, ha="right" if long else "center")
    bars = f" (error bars: {' / '.join(sorted(kinds))})" if kinds else ""
    handles = [Patch(color=condition_color(c), label=c) for c in conds] + [
        Patch(facecolor="0.85", edgecolor="black", hatch=h, label=lbl) for h, lbl in (("...", "band not resolved"),
            ("///", "outside parity band"), ("xx", "uninformative (reference not faithful)"))]
    label_axes(ax, AXIS_LABELS.get(x, x), D_LABEL, (title or f"D = mIoU_t − mIoU_ref (pp) across {x}s") + note + bars,
               title_size=FONT["title"], grid="y", legend=dict(     # beside the axes: never over a bar
                   handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), borderaxespad=0, frameon=False))
    fig.tight_layout()
    return finish_figure(fig, save)
