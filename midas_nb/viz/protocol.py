"""Figures of the three-condition protocol: coverage against faithfulness, insertion/deletion and
perturbation curves."""
from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from ..metrics import parity_band
from ..results import aggregate_seeds, coverage_name
from .common import condition_color, finish_figure, FONT, label_axes, place_point_labels, require_columns, to_numpy

#: Axis label of each sweep dimension (budget, depth) and of the backbone axis.
AXIS_LABELS = {"budget": "budget b (kept patch tokens, %)", "depth": "depth L (pruning after block L)",
               "backbone": "backbone"}
_MARKERS = ["o", "s", "D", "^", "v", "P", "X", "*", "<", ">", "h", "p"]


def mixed_groups(table: pd.DataFrame, average_over: Sequence[str], what: str,
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


def _condition_summary(table: pd.DataFrame, n_boot: int = 1000) -> pd.DataFrame:
    """One row per condition: mean ``miou`` / ``idauc`` over rows (builds, seeds) and their 95 % intervals
    (:func:`midas_nb.results.aggregate_seeds` from the per-image values; a single row without them keeps
    its own bootstrap bounds; otherwise none, never the mean of per-seed bounds)."""
    t = table.assign(condition=table["condition"].astype(str))
    agg = aggregate_seeds(t, by=["condition"], metrics=[m for m in ("miou", "idauc") if m in t.columns],
                          n_boot=n_boot)
    agg = agg.rename(columns={"miou_mean": "miou", "idauc_mean": "idauc"})
    for col in ("miou_lo", "miou_hi", "idauc_lo", "idauc_hi"):
        agg[col] = agg[col] if col in agg.columns else np.nan
        if col in t.columns:
            single = t.groupby("condition", sort=False)[col].agg(lambda v: v.iloc[0] if len(v) == 1 else np.nan)
            agg[col] = agg[col].fillna(agg["condition"].map(single))
    return agg


def coverage_vs_faithfulness(table: pd.DataFrame, *, reference: str = "reference", band: float | None = None,
                             coverage_label: str | None = None, title: str | None = None,
                             save: str | None = None, average_over: Sequence[str] = (),
                             n_boot: int = 1000) -> Figure:
    """Part coverage (mIoU, a fraction as in the tables) against faithfulness (IDAUC) per condition, with
    the parity band; hollow markers and a label per point (up to 10, placed so that no two overlap).

    The shaded band is the DESIGN.md §6 parity region ``IDAUC ≥ IDAUC_ref − band`` (asymmetric:
    faithfulness gains always count); the dashed vertical line is the reference mIoU, so a point in
    the band and right of the line has ``D > 0`` at parity.

    Args:
        table: protocol rows (``midas_nb.analysis.protocol`` schema): ``condition``, ``miou``, ``idauc``
            and, where present, the per-image values or ``miou_lo/miou_hi``, ``idauc_lo/idauc_hi``, and
            ``coverage_kind``. Rows of one condition (builds, seeds) are averaged; error bars: the 95 %
            interval of that mean over seeds and images (:func:`midas_nb.results.aggregate_seeds`), or
            a single row's own bootstrap interval.
        reference: the reference condition. band: the parity band in IDAUC units (``None``:
            :data:`midas_nb.metrics.PARITY_BAND`). coverage_label: x-axis quantity (default from
            ``coverage_kind``). title: figure title. save: figure name for :func:`save_figure`.
        average_over: ``("dataset",)`` / ``("backbone",)`` to allow rows of several datasets /
            backbones, averaged per condition (the title says so); by default they are an error.
        n_boot: bootstrap resamples of the error bars (the profile's ``bootstrap``; fixed seed).

    Raises:
        ValueError: when ``condition``, ``miou`` or ``idauc`` is missing, or the table mixes
            datasets / backbones not named in ``average_over``.
    """
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
        ax.axhspan(r_i - band, max(r_i - band, hi) + 1.0, color="tab:green", alpha=0.10, lw=0,
                   label=f"parity band: IDAUC ≥ ref − {band:g}")
        ax.axhline(r_i - band, color="tab:green", lw=1, ls=":")
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
    """Two panels side by side (shared y) of ``curves``: ``(label, x %, (y_left, auc_left), (y_right,
    auc_right))`` each, in the label's :func:`condition_color`, the AUC in the legend."""
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
    fig.tight_layout()
    return finish_figure(fig, save)


def insertion_deletion_curves(results: Any, *, title: str | None = None, save: str | None = None) -> Figure:
    """Mean insertion and deletion curves of ``p_c`` (the curves behind IDAUC).

    Args:
        results: one :class:`midas_nb.metrics.InsDel` or ``{label: InsDel}`` (e.g. one per
            condition); anything with ``fractions [S+1]``, ``ins_curve [B,S+1]``,
            ``del_curve [B,S+1]`` and ``ins_auc``/``del_auc [B]`` works.
        title: figure title. save: figure name for :func:`save_figure`.
    """
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
    """Accuracy as tokens are removed: most relevant first (positive) and least relevant first
    (negative), one line per relevance map — the evaluation of TokenTM (Wu et al., 2024,
    https://arxiv.org/abs/2403.14552).

    Args:
        table: one row per map with ``target``, ``fractions`` (removed fraction, ``[S+1]``),
            ``pos_curve`` and ``neg_curve`` (accuracy, ``[S+1]``) and ``pos_auc``/``neg_auc``
            (:func:`midas_nb.metrics.perturbation.perturbation_table`); list columns may be JSON strings (CSV).
        title: figure title. save: figure name for :func:`save_figure`.
    """
    require_columns(table, ("target", "fractions", "pos_curve", "neg_curve"))

    def arr(v: Any) -> np.ndarray:
        return np.asarray(json.loads(v) if isinstance(v, str) else v, dtype=float)

    curves = [(str(r["target"]), arr(r["fractions"]) * 100,
               *((arr(r[f"{s}_curve"]) * 100, r.get(f"{s}_auc")) for s in ("pos", "neg"))) for _, r in table.iterrows()]
    return _curve_pair(curves, ["patch tokens removed (%)"] * 2,
                       ["positive: most relevant removed first (lower AUC = better)",
                        "negative: least relevant removed first (higher AUC = better)"],
                       "top-1 accuracy (%)", title, save)
