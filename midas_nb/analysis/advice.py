"""Deployment advice from a results table (:func:`recommend_deployment`): coverage-first and faithfulness-first picks
with their band status and evidence (beside :func:`midas_nb.metrics.decoupling_D`, which it reads)."""
from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd

from ..metrics import CHECKPOINT_COLUMNS, decoupling_D, parity_band
from ..metrics.stats import LEAD_DIGITS, interval_sign as _sign
from ..results import aggregate_seeds, format_ci
from .verdict import lead_resolved, paired_gap


_NaN = math.nan


# ---------------------------------------------------------------------------------------------
# deployment advice
# ---------------------------------------------------------------------------------------------
GOALS = ("coverage-first", "faithfulness-first")

#: conditions that are baselines or controls, never advised: the random ranking and the
#: supervised control that distils a random map
NOT_DEPLOYABLE: tuple[str, ...] = ("random", "random_map")


def _label(row: pd.Series) -> str:
    cond = str(row["condition"])
    tgt, rel = (str(row.get(c, "") or "") for c in ("target", "relaxation"))
    s = cond if not tgt or tgt in ("nan", cond) else f"{cond} ({tgt})"
    return s if not rel or rel == "nan" else f"{s}, {rel}"


def recommend_deployment(table: pd.DataFrame, reference: str = "reference", band: float | None = None,
                         by: Sequence[str] | None = None, tie_tol: float = 1e-3,
                         miou_unit: Literal["fraction", "percent"] = "fraction",
                         n_boot: int = 1000) -> tuple[pd.DataFrame, str]:
    """Which scorer to deploy, per cell, for a coverage-first and a faithfulness-first goal.

    Rules (per cell = dataset × backbone × depth × budget; seeds averaged as in
    :func:`~midas_nb.metrics.decoupling_D`; the candidates are every condition but the baselines
    and controls of :data:`NOT_DEPLOYABLE`):

    - **coverage-first**: the condition with the highest ``D_pp`` among those **in band** by the band
      status of :func:`~midas_nb.metrics.decoupling_D` (read by :func:`~midas_nb.metrics.band_rule`; the
      reference, ``D = 0``, is a candidate, so a scorer is only advised over it when it gains coverage at
      parity). A higher mean ``D`` whose band is ``"not resolved"`` is passed over and named in the reason;
      only where no candidate is in band does the mean ΔIDAUC decide (``delta_idauc ≥ −band``), and the reason
      says the band is NOT RESOLVED, with the interval. Ties → higher IDAUC.
      Fallback, when the cell has no reference row: the highest mIoU, ``fallback=True``.
    - **faithfulness-first**: the highest mean IDAUC; conditions within ``tie_tol`` of it
      (default 0.001, the precision IDAUC is reported to) are ties, broken by higher mIoU.

    When a goal has no candidate with defined values — every IDAUC is NaN (e.g. measured with
    ``idauc_steps=0``), or every mIoU is NaN — the row says **no recommendation** with the
    reason (``recommended=False``, empty condition) instead of picking from undefined numbers.

    Args:
        table: results rows (per seed); needs ``condition``, ``miou``, ``idauc``.
        reference, band, by, miou_unit: as in :func:`~midas_nb.metrics.decoupling_D` (``band=None``:
            :data:`~midas_nb.metrics.PARITY_BAND`).
        tie_tol: IDAUC tie tolerance of the faithfulness-first rule.
        n_boot: bootstrap resamples of every interval and of ``status`` (pass the profile's
            ``bootstrap``; the bootstrap seed is fixed).

    Returns:
        ``(advice, text)``: ``advice`` has one row per (cell, goal) with the evidence —
        ``goal``, cell and condition columns, ``recommended``, ``D_pp``, ``D_pp_lo``,
        ``D_pp_hi``, ``delta_idauc``, ``delta_idauc_lo``, ``delta_idauc_hi``, ``status``, ``miou``, ``miou_lo``,
        ``miou_hi``, ``idauc``, ``idauc_lo``, ``idauc_hi``
        (intervals: :func:`aggregate_seeds`, seeds × images), ``n_seeds``, ``accuracy_vs_random``
        (+ ``_lo`` / ``_hi``: pruned accuracy minus the random top-k's of the cell, paired over seeds and
        images; NaN without ``random`` rows), ``speedup`` (pruned over unpruned throughput), ``fallback``,
        ``reason``; ``text`` joins the one-line reasons.

    Raises:
        ValueError: for missing columns or an unknown ``miou_unit``.
    """
    band = parity_band(band)
    by = [c for c in ("dataset", "backbone", "depth", "budget") if c in table.columns] if by is None else list(by)
    key = [c for c in ("condition", "target", "relaxation") if c in table.columns]
    missing = [c for c in ["condition", "miou", "idauc"] + by if c not in table.columns]
    if missing:
        raise ValueError(f"recommend_deployment: table is missing column(s) {missing}")
    table, by = _by_checkpoint(table, by)
    has_ref = bool((table["condition"] == reference).any())
    if has_ref:
        agg = decoupling_D(table, reference=reference, band=band, by=by, miou_unit=miou_unit, n_boot=n_boot)
    else:  # no reference anywhere: means only, D undefined (coverage-first falls back)
        agg = (table.groupby(by + key, dropna=False, sort=False)
               .agg(miou=("miou", "mean"), idauc=("idauc", "mean"), n_seeds=("miou", "size")).reset_index())
        agg["D_pp"], agg["delta_idauc"] = _NaN, _NaN
        agg["in_band"] = pd.array([pd.NA] * len(agg), dtype="boolean")
        agg["status"] = "no reference"
    bounds = aggregate_seeds(table, by=by + key, metrics=("miou", "idauc"), n_boot=n_boot)
    cis = [c for c in ("miou_lo", "miou_hi", "idauc_lo", "idauc_hi") if c in bounds.columns]
    agg = agg.merge(bounds[by + key + cis], on=by + key, how="left")
    agg = agg.assign(**{c: agg.get(c, _NaN) for c in ("miou_lo", "miou_hi", "idauc_lo", "idauc_hi", "D_pp_lo",
                                                      "D_pp_hi", "delta_idauc_lo", "delta_idauc_hi")})

    rows: list[dict[str, Any]] = []
    agg = agg[~agg["condition"].isin(NOT_DEPLOYABLE)]          # baselines and controls are never advised
    groups = agg.groupby(by, dropna=False, sort=False) if by else [((), agg)]
    for cell_key, cell in groups:
        cell_key = cell_key if isinstance(cell_key, tuple) else (cell_key,)
        # the cell in words, without the checkpoint's identity strings (the advice table keeps those columns)
        where = ", ".join(f"{c}={v}" for c, v in zip(by, cell_key) if c not in CHECKPOINT_COLUMNS)
        where = f" ({where})" if where else ""
        ident = dict(zip(by, cell_key))
        # coverage-first
        cell_has_ref = bool((cell["status"] != "no reference").any())
        if cell_has_ref:
            if (row := _coverage_first(table, cell, ident, key, where, band, n_boot)) is None:
                undefined = sorted(set(cell.loc[cell["status"] == "undefined", key[0]].astype(str)))
                row = _no_advice("coverage-first", ident, key, where,
                                 "the parity band is undefined for every condition (D or ΔIDAUC "
                                 f"is NaN: {', '.join(undefined) or 'all'}); measure IDAUC "
                                 "(idauc_steps ≥ 1) and part mIoU on images with visible parts")
            rows.append(row)
        else:
            ok = cell[cell["miou"].notna()]
            if len(ok):
                pick = ok.sort_values(["miou", "idauc"], ascending=False, kind="stable").iloc[0]
                why = (f"FALLBACK (no reference in this cell, D undefined): highest mIoU "
                       f"{format_ci(pick['miou'], pick.get('miou_lo'), pick.get('miou_hi'))}")
                rows.append(_advice_row("coverage-first", ident, key, pick, True, where, why))
            else:
                rows.append(_no_advice("coverage-first", ident, key, where, "no reference and every mIoU is NaN"))
        # faithfulness-first
        ok = cell[cell["idauc"].notna()]
        if len(ok):
            pick, why = _most_faithful(ok, tie_tol)
            ties = _ties(table, ident, key, pick, ok, "idauc", n_boot)
            rows.append(_advice_row("faithfulness-first", ident, key, pick, False, where,
                                    why + _tie_note(ties, "IDAUC"), ties, _cost(table, ident, key, pick, n_boot)))
        else:
            rows.append(_no_advice("faithfulness-first", ident, key, where,
                                   "IDAUC is NaN for every condition (not measured: idauc_steps=0 or "
                                   "max_idauc_images=0?)"))

    cols = ["goal"] + by + key + ["recommended"] + list(_EVIDENCE) + list(_COST) + ["ties", "fallback", "reason"]
    advice = pd.DataFrame(rows)[cols]
    return advice, "\n".join(advice["reason"])


def rule_splits(advice: pd.DataFrame, point: tuple[int, float] | None = None) -> str:
    """Where the coverage-first and faithfulness-first picks of :func:`recommend_deployment` differ, and
    whether the run tells them apart: a pick in the other pick's ``ties`` (its paired lead not resolved)
    serves both goals there; a split is resolved only where neither pick ties with the other.

    Args:
        advice: the first return of :func:`recommend_deployment` (one row per cell and goal).
        point: the main point ``(depth, budget)``, where the claims box reads the paper's "two different winners":
            a resolved split at another cell is said to be a regime off it, not counted there (decision 0090).

    Returns:
        one line per cell where the two picks differ, or a line saying they agree in every cell.
    """
    by = [c for c in ("dataset", "backbone", "depth", "budget") if c in advice.columns]
    several = [c for c in ("dataset", "backbone") if c in by and advice[c].nunique() > 1]
    main = "" if point is None else f"L = {int(point[0])}, b = {float(point[1]):.0%}"
    lines = []
    for ident, cell in advice[advice["recommended"].astype(bool)].groupby(by, sort=False):
        pick = dict(zip(cell["goal"], cell["condition"].astype(str)))
        ties = dict(zip(cell["goal"], cell["ties"].fillna("").astype(str).str.split(", ")))
        cov, fai = pick.get(GOALS[0]), pick.get(GOALS[1])
        if cov is None or fai is None or cov == fai:
            continue
        at = dict(zip(by, ident if isinstance(ident, tuple) else (ident,)))
        where = ", ".join([str(at[c]) for c in several] + [f"L = {at[c]}" for c in ("depth",) if c in at]
                          + [f"b = {float(at[c]):.0%}" for c in ("budget",) if c in at])
        status = dict(zip(cell["goal"], cell["status"].astype(str)))
        candidate = status[GOALS[1]] == status[GOALS[0]]  # else never compared with the coverage pick on mIoU
        ties_said = ([f"{fai} covers as much as {cov} within noise (paired mIoU)"]
                     if candidate and fai in ties[GOALS[0]] else []) + (
            [f"{cov} is as faithful as {fai} within noise (paired IDAUC)"] if cov in ties[GOALS[1]] else [])
        off = main and not np.isclose([float(at.get("depth", -1)), float(at.get("budget", -1))], point).all()
        part = ("the two goals part here" if not off else
                f"the two goals part in this regime, off the main point {main} where the box reads the paper's "
                "two winners: not counted there")
        reading = ("; ".join(ties_said) + ": a split of the means, not of the data" if ties_said else
                   f"both leads are resolved: {part}" if candidate else
                   f"{fai} is not a coverage-first candidate (band {status[GOALS[1]]}) and {cov} is resolvably "
                   f"less faithful: {part}")
        lines.append(f"{where}: coverage-first {cov}, faithfulness-first {fai} — {reading}")
    return "\n".join(lines) or "The two rules pick the same condition in every cell."


def _coverage_first(table: pd.DataFrame, cell: pd.DataFrame, ident: dict, key: list[str], where: str, band: float,
                    n_boot: int) -> dict[str, Any] | None:
    """The coverage-first row of one cell with a reference (``None``: no candidate has a defined band)."""
    inside = cell[cell["in_band"].fillna(False).astype(bool) & cell["D_pp"].notna()]
    # one notion of "in band", the band status: a candidate whose interval resolves the band comes
    # before a higher mean whose band is not resolved; the mean ΔIDAUC decides only where none is
    resolved = inside[inside["status"] == "in band"]
    cands = resolved if len(resolved) else inside
    if not len(cands):
        return None
    pick = cands.sort_values(["D_pp", "idauc"], ascending=False, kind="stable").iloc[0]
    unresolved = ""
    if pick.get("status") == "not resolved":
        unresolved = (f"; band NOT RESOLVED (no candidate's band is): ΔIDAUC (95 % CI) "
                      f"{format_ci(*pick[list(_DI)], '+.3f', edges=(0, -band))}")
    elif pick.get("status") == "uninformative":
        unresolved = f"; band UNINFORMATIVE: {pick.get('band_reason', 'reference not above random')}"
    passed = inside[(inside["D_pp"] > pick["D_pp"]) & (inside["status"] != "in band")]
    unresolved += "".join(f"; passed over {_label(r)} (higher mean D {r['D_pp']:+.2f} pp, band {r['status']}: "
                          f"ΔIDAUC {format_ci(*r[list(_DI)], '+.3f', edges=(0, -band))})" for _, r in passed.iterrows())
    ties = _ties(table, ident, key, pick, cands, "miou", n_boot)
    why = ((f"highest mean D of the {_among(cands)}" if len(cands) > 1 else "the only condition")
           + (" with status in band (metrics.band_rule()): " if len(resolved) else " at parity by the mean ΔIDAUC: ")
           + f"D={format_ci(pick['D_pp'], pick['D_pp_lo'], pick['D_pp_hi'], '+.2f', ' pp')}, "
           f"ΔIDAUC={pick['delta_idauc']:+.3f} >= -{band:g}{unresolved}; "
           f"mIoU {format_ci(pick['miou'], pick['miou_lo'], pick['miou_hi'])}{_tie_note(ties, 'mIoU')}")
    return _advice_row("coverage-first", ident, key, pick, False, where, why, ties,
                       _cost(table, ident, key, pick, n_boot))


def _most_faithful(ok: pd.DataFrame, tie_tol: float) -> tuple[pd.Series, str]:
    """The condition with the highest IDAUC; among those within ``tie_tol`` of it, the one with
    the highest mIoU — and the reason, naming the highest IDAUC where the pick is not it."""
    best = ok["idauc"].max()
    ties = ok[ok["idauc"] >= best - tie_tol]
    pick = ties.sort_values(["miou", "idauc"], ascending=False, kind="stable").iloc[0]
    if len(ties) == 1:
        return pick, f"highest mean IDAUC {format_ci(*pick[list(_IDAUC)])} of the {_among(ok)}"
    top = ok.loc[ok["idauc"].idxmax()]
    if pick.name == top.name:           # the highest IDAUC also has the highest mIoU of its ties
        return pick, (f"highest mean IDAUC {format_ci(*pick[list(_IDAUC)])} of the {_among(ok)}; {len(ties) - 1} other "
                      f"{'condition ties' if len(ties) == 2 else 'conditions tie'} within {tie_tol:g} of it, its mIoU "
                      f"{pick['miou']:.3f} the highest among them")
    return pick, (f"IDAUC {format_ci(*pick[list(_IDAUC)])}, within {tie_tol:g} of the highest mean "
                  f"({_label(top)} {best:.3f}) of the {_among(ok)}; {len(ties)} conditions tie there, highest mIoU "
                  f"{pick['miou']:.3f} breaks the tie")


def _by_checkpoint(table: pd.DataFrame, by: list[str]) -> tuple[pd.DataFrame, list[str]]:
    """Never pick across checkpoints: ``by`` plus the checkpoint columns present (a missing
    digest becomes "", as :func:`decoupling_D` writes it), none where rows carry a build (its builds pooled)."""
    by = by + [c for c in CHECKPOINT_COLUMNS if c in table.columns and c not in by and "build" not in table.columns]
    if "weights_digest" in by:
        table = table.assign(weights_digest=table["weights_digest"].astype(object)
                             .where(table["weights_digest"].notna(), "").astype(str))
    return table, by


#: a value and its interval's columns, in :func:`~midas_nb.results.format_ci`'s order
_DI, _IDAUC = ("delta_idauc", "delta_idauc_lo", "delta_idauc_hi"), ("idauc", "idauc_lo", "idauc_hi")
_EVIDENCE = ("D_pp", "D_pp_lo", "D_pp_hi", *_DI, "status", "miou", "miou_lo", "miou_hi", *_IDAUC, "n_seeds")


def _advice_row(goal: str, ident: dict, key: list[str], pick: pd.Series, fallback: bool, where: str,
                why: str, ties: Sequence[str] = (), cost: Mapping[str, Any] | None = None) -> dict[str, Any]:
    cost = dict(cost or {})
    note = cost.pop("note", "")
    return dict(goal=goal, **ident, **{k: pick[k] for k in key}, recommended=True,
                **{c: pick.get(c, _NaN) for c in _EVIDENCE}, **{c: cost.get(c, _NaN) for c in _COST},
                ties=", ".join(ties), fallback=fallback, reason=f"{goal}{where}: {_label(pick)} — {why}{note}")


#: what a pick costs or saves: its pruned accuracy minus random top-k's (paired, seeds × images) and its speed-up
_COST = ("accuracy_vs_random", "accuracy_vs_random_lo", "accuracy_vs_random_hi", "speedup")


def _cost(table: pd.DataFrame, ident: dict, key: list[str], pick: pd.Series, n_boot: int) -> dict[str, Any]:
    """:data:`_COST` of a pick and its note: is its pruned accuracy resolved against the random top-k of the
    same cell (``random`` rows with per-image accuracy), and how much faster is its pruned forward."""
    mine, out, said = _rows_of(table, ident, key, pick), {}, []
    rand = _rows_of(table, ident, [], pd.Series(dtype=object))
    rand = rand[rand["condition"] == "random"]
    if len(rand) and "accuracy_per_image" in table.columns:
        m, lo, hi, n = paired_gap(mine, rand, "accuracy", n_boot=n_boot)
        if n:
            out.update(accuracy_vs_random=m, accuracy_vs_random_lo=lo, accuracy_vs_random_hi=hi)
            said.append(f"pruned accuracy vs random top-k {format_ci(m, lo, hi, '+.3f', edges=())} "   # as printed
                        + {"positive": "(beats it)", "negative": "(below it)"}.get(_sign(lo, hi, LEAD_DIGITS),
                                                                                   "(not resolved)"))
    if "speedup" in mine.columns and mine["speedup"].notna().any():
        out["speedup"] = float(mine["speedup"].mean())
        said.append(f"speed-up {out['speedup']:.2f}×")
    out["note"] = ("; " + "; ".join(said)) if said else ""
    return out


def _no_advice(goal: str, ident: dict, key: list[str], where: str, why: str) -> dict[str, Any]:
    return dict(goal=goal, **ident, **{k: "" for k in key}, recommended=False, **{c: _NaN for c in _EVIDENCE + _COST},
                ties="", fallback=False, reason=f"{goal}{where}: no recommendation — {why}")


def _among(cands: pd.DataFrame) -> str:
    """The candidate set a pick is the highest of, named (a sweep cell may hold fewer conditions
    than the full table, so two picks of one ``(L, b)`` can differ)."""
    names = ", ".join(dict.fromkeys(str(c) for c in cands["condition"]))
    return f"{len(cands)} candidate{'s' if len(cands) != 1 else ''} ({names})"


def _ties(table: pd.DataFrame, ident: dict, key: list[str], pick: pd.Series, cands: pd.DataFrame, metric: str,
          n_boot: int) -> list[str]:
    """The candidates whose paired difference from the pick on ``metric`` is not resolved: the
    pick's paired interval (seeds × images, :func:`~midas_nb.analysis.paired_gap`) of pick − other
    reaches 0 as printed (:func:`~midas_nb.analysis.verdict.lead_resolved`, the winners' rule). Rows without
    per-image values are not compared."""
    mine, out = _rows_of(table, ident, key, pick), []
    for _, other in cands.iterrows():
        if other.name == pick.name:
            continue
        _, lo, hi, n = paired_gap(mine, _rows_of(table, ident, key, other), metric, n_boot=n_boot)
        if n and not lead_resolved(lo, hi):
            out.append(str(other["condition"]))
    return out


def _rows_of(table: pd.DataFrame, ident: Mapping[str, Any], key: Sequence[str], r: pd.Series) -> pd.DataFrame:
    """The rows of the cell ``ident`` and of ``r``'s condition (the ``key`` columns)."""
    sel = table
    for c, v in {**ident, **{k: r[k] for k in key}}.items():
        sel = sel[sel[c].isna()] if pd.isna(v) else sel[sel[c] == v]
    return sel


def _tie_note(ties: Sequence[str], metric: str) -> str:
    return (f"; ties within noise with {', '.join(ties)} (paired {metric} interval of the difference reaches 0: "
            "the pick is the highest mean, not a resolved lead)") if ties else ""
