"""Figures of the three-condition protocol: coverage against faithfulness with the parity band, the
insertion/deletion and perturbation curves, D over the regime grid (depth × budget) and backbones, and the cosine
probes between target rankings."""
from __future__ import annotations

import json
import math
from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.colors import TwoSlopeNorm
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch, Rectangle

from ..metrics import parity_band
from ..results import aggregate_seeds, coverage_name
from .common import (AXIS_CMAPS, BAND_COLOR, colorbar, condition_color, finish_figure, FONT, label_axes, legend_below,
                     panel_grid, place_point_labels, require_columns, to_numpy)

#: Axis label of each sweep dimension (budget, depth) and of the backbone axis.
AXIS_LABELS = {"budget": "budget b (kept patch tokens, %)", "depth": "depth L (pruning after block L)",
               "backbone": "backbone"}
_MARKERS = ["o", "s", "D", "^", "v", "P", "X", "*", "<", ">", "h", "p"]


def mixed_groups(table: pd.DataFrame, average_over: Sequence[str], what: str,
                 cols: Sequence[str] = ("dataset", "backbone")) -> str:
    """The title note on what ``table`` averages over; ValueError: several values of a column in ``cols`` (datasets,
    backbones) that ``average_over`` does not name (no silent averaging)."""
    mixed = {c: [str(v) for v in dict.fromkeys(table[c])] for c in cols
             if c in table.columns and table[c].nunique(dropna=False) > 1}
    silent = {c: v for c, v in mixed.items() if c not in set(average_over)}
    if silent:
        detail = "; ".join(f"{c}: {', '.join(v)}" for c, v in silent.items())
        raise ValueError(f"{what}: the table holds several {' and '.join(f'{c}s' for c in silent)} ({detail}); "
                         f"select one, or pass average_over={tuple(silent)!r} to average over them "
                         "(the title then says so)")
    return "".join(f" — mean over {c}s {', '.join(v)}" for c, v in mixed.items())


def _condition_summary(table: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    """Per condition: mean ``miou`` / ``idauc`` and 95 % intervals (a single row's own; never mean bounds)."""
    t = table.assign(condition=table["condition"].astype(str))
    agg = aggregate_seeds(t, by=["condition"], metrics=[m for m in ("miou", "idauc") if m in t.columns],
                          n_boot=n_boot).rename(columns={"miou_mean": "miou", "idauc_mean": "idauc"})
    for col in ("miou_lo", "miou_hi", "idauc_lo", "idauc_hi"):
        agg[col] = agg[col] if col in agg.columns else np.nan
        if col in t.columns:
            single = t.groupby("condition", sort=False)[col].agg(lambda v: v.iloc[0] if len(v) == 1 else np.nan)
            agg[col] = agg[col].fillna(agg["condition"].map(single))
    return agg


def coverage_vs_faithfulness(table: pd.DataFrame, *, reference: str = "reference", band: float | None = None,
                             coverage_label: str | None = None, title: str | None = None, save: str | None = None,
                             average_over: Sequence[str] = (), n_boot: int = 1000) -> Figure:
    """Part coverage (mIoU, a fraction) against faithfulness (IDAUC) per condition, the parity band ``IDAUC ≥
    IDAUC_ref − band`` shaded (DESIGN.md §6; ``None``: ``metrics.PARITY_BAND``), the reference's mIoU dashed.
    ``table``: protocol rows (``condition``, ``miou``, ``idauc``), averaged per condition; error bars: the 95 %
    interval over seeds and images (``n_boot`` resamples) or a single row's own. ``average_over``: ``("dataset",)``
    / ``("backbone",)`` averages rows of several. ValueError: missing column, or mixed rows not in ``average_over``."""
    require_columns(table, ("condition", "miou", "idauc"))
    band = parity_band(band)
    note = mixed_groups(table, average_over, "coverage_vs_faithfulness")
    coverage_label = coverage_name(table) if coverage_label is None else coverage_label
    agg = _condition_summary(table, n_boot)
    fig, ax = plt.subplots(figsize=(8.2, 4.6))
    ys = agg[["idauc", "idauc_lo", "idauc_hi"]].to_numpy(dtype=float)
    lo, hi = float(np.nanmin(ys)), float(np.nanmax(ys))
    ref = agg[agg["condition"] == reference]
    if len(ref):
        r_m, r_i = float(ref["miou"].iloc[0]), float(ref["idauc"].iloc[0])
        lo = min(lo, r_i - band)
        ax.axhspan(r_i - band, max(r_i - band, hi) + 1.0, color=BAND_COLOR, alpha=0.10, lw=0,
                   label=f"parity band: IDAUC ≥ ref − {band:g}")
        ax.axhline(r_i - band, color=BAND_COLOR, lw=1, ls=":")
        ax.axvline(r_m, color="black", lw=1, ls="--", alpha=0.6, label=f"reference {coverage_label}")
    for i, row in agg.iterrows():
        x, y = row["miou"], row["idauc"]
        xerr, yerr = ([[max(0.0, v - row[f"{m}_lo"])], [max(0.0, row[f"{m}_hi"] - v)]]
                      if pd.notna(row[f"{m}_lo"]) else None for m, v in (("miou", x), ("idauc", y)))
        ax.errorbar(x, y, xerr=xerr, yerr=yerr, fmt=_MARKERS[i % len(_MARKERS)],
                    color=condition_color(row["condition"]), mfc="none", mew=1.6, ms=8, capsize=3, lw=1.2,
                    label=row["condition"], zorder=3)
    pad = max(0.01, 0.08 * (hi - lo))      # the band does not stretch the y range
    ax.set_ylim(lo - pad, hi + pad)
    label_axes(ax, f"{coverage_label} (fraction)", "insertion − deletion AUC", (title or "Coverage vs faithfulness "
               "(error bars: 95 % interval of the mean over builds and seeds)") + note,
               legend=dict(loc="upper left", bbox_to_anchor=(1.02, 1.0), borderaxespad=0, frameon=False))
    fig.tight_layout()
    if len(agg) <= 10:  # beyond that the legend names the markers; labels placed without overlap
        place_point_labels(ax, list(zip(agg["miou"], agg["idauc"])), agg["condition"].tolist())
    return finish_figure(fig, save)


def _curve_pair(curves: list, xlabels: Sequence[str], titles: Sequence[str], ylabel: str, title: str | None,
                save: str | None) -> Figure:
    """Two panels (shared y) of ``curves``: ``(label, x %, (y_left, auc_left), (y_right, auc_right))`` each."""
    fig, axes = plt.subplots(1, 2, figsize=(10, 3.9), sharey=True)
    for label, x, *sides in curves:
        for ax, (y, auc) in zip(axes, sides):
            ax.plot(x, y, marker=".", color=condition_color(label),
                    label=f"{label}" + ("" if auc is None or pd.isna(auc) else f" (AUC {float(auc):.3f})"))
    for ax, xlabel, panel_title in zip(axes, xlabels, titles):
        label_axes(ax, xlabel, ylabel if ax is axes[0] else None, panel_title, title_size=FONT["label"] - 1,
                   legend=dict(fontsize=FONT["legend"] - 1))
        ax.set_xlim(0, 100)
    if title:
        fig.suptitle(title, fontsize=FONT["title"])
    return finish_figure(fig, save, tight=True)


def insertion_deletion_curves(results: Any, *, title: str | None = None, save: str | None = None) -> Figure:
    """Mean insertion and deletion curves of ``p_c`` (the curves behind IDAUC) of ``results``: one
    :class:`midas_nb.metrics.InsDel` or ``{label: InsDel}`` (e.g. one per condition); anything with
    ``fractions [S+1]``, ``ins_curve``/``del_curve [B,S+1]`` and ``ins_auc``/``del_auc [B]`` works."""
    results = results if isinstance(results, Mapping) else {"ranking": results}
    if not results:
        raise ValueError("results is empty")
    curves = [(label, to_numpy(r.fractions) * 100, *((np.atleast_2d(to_numpy(c)).mean(0), to_numpy(a).mean())
                                                     for c, a in ((r.ins_curve, r.ins_auc), (r.del_curve, r.del_auc))))
              for label, r in results.items()]
    return _curve_pair(curves, [f"patch tokens {w}, most important first (%)" for w in ("inserted", "deleted")],
                       ["insertion (higher = more faithful)", "deletion (lower = more faithful)"],
                       "p_c (softmax prob. of predicted class)", title, save)


def perturbation_plot(table: pd.DataFrame, *, title: str | None = None, save: str | None = None) -> Figure:
    """Accuracy as tokens are removed, most relevant first (positive) and least relevant first (negative), one line
    per map — TokenTM's evaluation (https://arxiv.org/abs/2403.14552). ``table``: a row per map with ``target``,
    ``fractions``, ``pos_curve``/``neg_curve`` (``[S+1]``, JSON strings allowed) and ``pos_auc``/``neg_auc``
    (:func:`midas_nb.metrics.perturbation.perturbation_table`)."""
    require_columns(table, ("target", "fractions", "pos_curve", "neg_curve"))

    def arr(v: Any) -> np.ndarray:
        return np.asarray(json.loads(v) if isinstance(v, str) else v, dtype=float)

    curves = [(str(r["target"]), arr(r["fractions"]) * 100,
               *((arr(r[f"{s}_curve"]) * 100, r.get(f"{s}_auc")) for s in ("pos", "neg"))) for _, r in table.iterrows()]
    return _curve_pair(curves, ["patch tokens removed (%)"] * 2,
                       ["positive: most relevant removed first (lower AUC = better)",
                        "negative: least relevant removed first (higher AUC = better)"],
                       "top-1 accuracy (%)", title, save)


D_LABEL = "D = mIoU − mIoU_ref (pp)"
#: each band status: its mark, its cell pattern in :func:`regime_heatmap`, its legend line
_STATUS: dict[str, tuple[str, dict[str, Any], str]] = {
    "in band": ("✓", dict(edgecolor="0.4"), "in band (coloured by D)"),
    "not resolved": ("?", dict(edgecolor="0.35", hatch="...."), "not resolved (coloured by D)"),
    "uninformative": ("○", dict(edgecolor="0.1", hatch="xx"),
                      "uninformative: the reference is not faithful (coloured by D)"),
    "outside band": ("✗", dict(facecolor="0.85", edgecolor="0.45", hatch="///"), "outside band (D in brackets)")}
_COLOURED = ("in band", "not resolved", "uninformative")   # the statuses drawn in D's colour
#: :func:`regime_lines`' marker of each status: (marker, area in pt², hollow, legend label)
_MARKS = {"in band": ("o", 36, False, "in parity band"), "not resolved": ("o", 36, True, "band not resolved"),
          "outside band": ("x", 60, False, "outside band"),
          "uninformative": ("D", 30, True, "uninformative (reference not faithful)")}


def _d_conditions(table: pd.DataFrame, what: str, axes: Sequence[str], value: str,
                  conditions: Sequence[str] | None, reference: str, average_over: Sequence[str]) -> tuple[str, list]:
    """Check a ``decoupling_D`` table; returns the title's note and the conditions to draw."""
    require_columns(table, ["condition", *axes, value, "in_band"], "D table",
                    " (expected the output of midas_nb.metrics.decoupling_D)")
    note = mixed_groups(table, average_over, what, [c for c in ("dataset", "backbone") if c not in axes])
    conds = list(conditions) if conditions is not None else [
        c for c in dict.fromkeys(table["condition"].astype(str)) if c != reference]
    if not conds:
        raise ValueError("no condition to plot besides the reference")
    return note, conds


def _group_status(g: pd.DataFrame) -> str:
    """A cell's band status: any undefined, any uninformative, all in band, any outside band, else "not resolved"."""
    st = set(g["status"].astype(str)) if "status" in g.columns else {
        "undefined" if pd.isna(v) else "in band" if bool(v) else "outside band" for v in g["in_band"]}
    if st & {"undefined", "no reference"}:
        return "undefined"
    if st == {"in band"}:
        return "in band"
    return next((s for s in ("uninformative", "outside band") if s in st), "not resolved")


def _d_errors(g: pd.DataFrame, value: str) -> tuple[float, float, str]:
    """(lower, upper) error bars of ``g``'s mean D and their kind: a single row's paired CI, else the seed std."""
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
    return (f"{float(v) * 100:g}%" if name == "budget" else
            f"{v:g}" if isinstance(v, (int, float, np.integer, np.floating)) else str(v))


def regime_heatmap(table: pd.DataFrame, x: str = "budget", y: str = "depth", *, value: str = "D_pp",
                   conditions: Sequence[str] | None = None, reference: str = "reference", vmax: float | None = None,
                   title: str | None = None, save: str | None = None, average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp, the ``value`` column of a :func:`midas_nb.metrics.decoupling_D` table) over a ``y × x`` grid, a
    panel per condition (default all but ``reference``), diverging scale of half-range ``vmax`` (default max |D|).
    Cells by band ``status``: in band ``+2.1 ✓``; not resolved ``?`` (dots); uninformative ``○`` (cross-hatch);
    outside the band grey, hatched, ``✗ (D)`` (DESIGN.md §6: marked, never dropped); "undefined", "not run".
    Several datasets or backbones: ValueError unless named in ``average_over`` (then averaged; the title says so)."""
    note, conds = _d_conditions(table, "regime_heatmap", (x, y), value, conditions, reference, average_over)
    xs, ys = sorted(table[x].dropna().unique()), sorted(table[y].dropna().unique())
    vals = table[value].to_numpy(dtype=float)
    lim = vmax or max(1e-6, float(np.nanmax(np.abs(vals))) if np.isfinite(vals).any() else 1.0)
    norm = TwoSlopeNorm(vcenter=0.0, vmin=-lim, vmax=lim)
    fig, axes = panel_grid(len(conds), 3, (max(3.4, 0.95 * len(xs) + 1.6), max(2.8, 0.7 * len(ys) + 1.5)), (1.2, 0.6))
    for cond, ax in zip(conds, axes):
        grid, status = np.full((len(ys), len(xs)), np.nan), np.full((len(ys), len(xs)), "not run", dtype=object)
        for (yv, xv), g in table[table["condition"].astype(str) == cond].groupby([y, x]):
            grid[ys.index(yv), xs.index(xv)] = g[value].astype(float).mean()
            status[ys.index(yv), xs.index(xv)] = _group_status(g)
        im = ax.imshow(np.where(np.isin(status, _COLOURED), grid, np.nan), cmap="RdBu_r", norm=norm, aspect="auto",
                       origin="lower")
        for (i, j), st in np.ndenumerate(status):
            v, coloured = grid[i, j], st in _COLOURED
            if st in ("not run", "undefined"):   # not in the grid / NaN values
                ax.text(j, i, st, ha="center", va="center", fontsize=FONT["annot"] - 1, color="0.55", style="italic")
                continue
            if st != "in band":   # the status's own pattern (over D's colour, or grey outside the band)
                ax.add_patch(Rectangle((j - 0.5, i - 0.5), 1, 1, lw=0 if coloured else 0.5, fill=not coloured,
                                       **_STATUS[st][1]))
            ax.text(j, i, f"{v:+.1f} {_STATUS[st][0]}" if coloured else f"✗ ({v:+.1f})" if np.isfinite(v) else "✗",
                    ha="center", va="center", fontsize=FONT["annot"],
                    color="white" if abs(v) > 0.6 * lim and st == "in band" else "black" if coloured else "0.15",
                    bbox=None if st == "in band" else dict(boxstyle=f"round,pad={0.15 if coloured else 0.2}",
                                                           facecolor="white", edgecolor="none",
                                                           alpha=0.7 if coloured else 0.85))
        ax.set_xticks(range(len(xs)), [_fmt_axis_value(x, v) for v in xs])
        ax.set_yticks(range(len(ys)), [_fmt_axis_value(y, v) for v in ys])
        label_axes(ax, AXIS_LABELS.get(x, x), AXIS_LABELS.get(y, y), cond, size=FONT["label"] - 1,
                   title_size=FONT["label"], grid=None)
    # a swatch per status under the panels (D's colour under its pattern, or the grey hatch), the colour bar right
    handles = [Patch(label=f"{mark} {label}", lw=0.8, **{"facecolor": plt.get_cmap("RdBu_r")(0.78), **style})
               for mark, style, label in _STATUS.values()]
    bottom = legend_below(fig, handles, ncol=2 if fig.get_figwidth() >= 9 else 1, right=0.9)
    colorbar(fig, im, D_LABEL, cax=fig.add_axes((0.91, bottom + 0.1 * (0.95 - bottom), 0.018, 0.75 * (0.95 - bottom))))
    fig.suptitle((title or f"D = mIoU_t − mIoU_ref (pp) over {y} × {x}") + note, fontsize=FONT["title"])
    return finish_figure(fig, save)


def regime_lines(table: pd.DataFrame, x: str = "depth", hue: str = "budget", *, value: str = "D_pp",
                 conditions: Sequence[str] | None = None, reference: str = "reference", title: str | None = None,
                 save: str | None = None, average_over: Sequence[str] = ()) -> Figure:
    """``D`` (pp) against ``x``, one line per ``hue`` value, one panel per condition, as :func:`regime_heatmap`.
    Markers by band status: filled: in band; open circles: not resolved; ``×``: outside; open diamonds:
    uninformative. Error bars: the paired 95 % intervals where present, else the seed std (the title says)."""
    note, conds = _d_conditions(table, "regime_lines", (x, hue), value, conditions, reference, average_over)
    kinds, hues = set(), sorted(table[hue].dropna().unique())
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
            lo, hi, kind = zip(*(_d_errors(g, value) for _, g in groups))
            kinds.update(k for k in kind if k)
            yerr = np.array([lo, hi])
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
    """``D`` (pp) per backbone (or any categorical ``x``, in ``order``; default as it appears), a bar per condition,
    as :func:`regime_heatmap`. Solid bars: in the parity band; pale dotted: not resolved; pale hatched: outside;
    pale cross-hatched: uninformative; undefined values say so. Error bars as in :func:`regime_lines`."""
    note, conds = _d_conditions(table, "scale_plot", (x,), value, conditions, reference, average_over)
    kinds, cats = set(), list(order) if order is not None else list(dict.fromkeys(table[x].astype(str)))
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
    return finish_figure(fig, save, tight=True)


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
