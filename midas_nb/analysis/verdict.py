"""Whether the MIDAS claim holds on one run, both halves tested (:func:`claim_verdict`).

The claim (DESIGN.md §1, §6, §8) has two halves, and a run can show either, both or neither:

(a) **parity** — a supervised scorer raises part coverage over the reference (``D > 0``) while
    its faithfulness stays inside the IDAUC parity band (:func:`midas_nb.metrics.decoupling_D`);
(b) **different winners** — the condition with the best coverage is not the one with the best
    faithfulness: each lead resolved by a paired interval over the seeds and the images both were
    measured on, and no third condition tying with both winners (it could be the best on both);

and one reading that decides whether the word *decoupling* fits at all:

(c) **co-movement** — whether coverage and faithfulness rise together across the conditions
    (Pearson correlation of the per-condition means, its interval resampling images and seeds, and
    again without the control points: :mod:`midas_nb.analysis.comovement`).
    Where they rise together, the run shows "both rose", not a decoupling.

A paired difference of two conditions (the winners' leads, a scorer against the random-map
control, :func:`paired_gap`) carries the seed spread as ``decoupling_D`` does
(:func:`midas_nb.metrics.stats.seed_image_interval`, DESIGN.md §6; decision 0007).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ..metrics import band_resolution, bootstrap_ci, decoupling_D, parity_band, per_image_values
from ..metrics.stats import LEAD_DIGITS, interval_sign as _sign, seed_image_interval
from ..results import coverage_name, format_ci
from .comovement import comovement

__all__ = ["paired_gap", "ClaimVerdict", "claim_verdict", "targets_vs_scorers", "CONTROL_CONDITION",
           "condition_reading", "per_image_means", "per_seed_values", "CELL_COLUMNS", "BASELINE_CONDITIONS",
           "interval_levels", "lead_resolved"]

#: columns that identify one comparable cell: a verdict never mixes two of them
CELL_COLUMNS: tuple[str, ...] = ("dataset", "backbone", "checkpoint_id", "depth", "budget")

#: conditions that are lower bounds, never candidates for a "winner" (a random ranking)
BASELINE_CONDITIONS: tuple[str, ...] = ("random",)

#: the supervised control that distils a seeded random map (same loss, λ and scorer as supervised(Tk))
CONTROL_CONDITION = "random_map"

_LEADS_IN_NOISE = ("the {} lead is within noise", "both leads are within noise")    # paired interval reaches 0
_METRIC_IDS = {"miou": ("image_ids", "miou_per_image"), "idauc": ("idauc_image_ids", "idauc_per_image"),
               "accuracy": ("image_ids", "accuracy_per_image")}


def lead_resolved(lo: float, hi: float) -> bool:
    """Whether a paired difference ``[lo, hi]`` of two conditions (fractions: mIoU, IDAUC, accuracy) is a resolved
    lead: its whole interval above 0 as printed, at :data:`~midas_nb.metrics.stats.LEAD_DIGITS` decimals; an interval
    that reads ``[+0.000, +0.003]`` touches 0, a tie. The one rule of every lead and tie: the winners, the
    deployment advice and the content test (decision 0085)."""
    return _sign(lo, hi, LEAD_DIGITS) == "positive"


def per_image_means(table: pd.DataFrame, metric: str) -> dict[str, dict[str, float]]:
    """``{condition: {image_id: mean over seeds}}`` of one metric's per-image values.

    A condition's value for an image is the mean over the seeds that measured the image
    (NaN values, e.g. an image without a visible part, are skipped). Conditions whose rows carry
    no per-image values are left out.

    Args:
        table: results rows of one cell (:data:`CELL_COLUMNS`).
        metric: ``"miou"``, ``"idauc"`` or ``"accuracy"``.

    Raises:
        ValueError: unknown metric.
    """
    out: dict[str, dict[str, float]] = {}
    for cond, seeds in per_seed_values(table, metric).items():
        vals: dict[str, list[float]] = {}
        for by_image in seeds.values():
            for i, v in by_image.items():
                vals.setdefault(i, []).append(v)
        out[cond] = {i: float(np.mean(v)) for i, v in vals.items()}
    return out


def per_seed_values(table: pd.DataFrame, metric: str) -> dict[str, dict[tuple[int, int], dict[str, float]]]:
    """``{condition: {(build, seed): {image_id: value}}}`` of one metric's per-image values (NaN values, e.g. an
    image without a visible part, are left out; a missing ``build`` or ``seed`` is 0: decision 0072).

    Raises:
        ValueError: unknown metric.
    """
    if metric not in _METRIC_IDS:
        raise ValueError(f"metric must be one of {sorted(_METRIC_IDS)}, got {metric!r}")
    ids_col, val_col = _METRIC_IDS[metric]
    out: dict[str, dict[tuple[int, int], dict[str, float]]] = {}
    for _, r in table.iterrows():
        seed = tuple(int(r[c]) if c in r and pd.notna(r[c]) else 0 for c in ("build", "seed"))
        if got := {i: v for i, v in (per_image_values(r, ids_col, val_col) or {}).items() if not math.isnan(v)}:
            out.setdefault(str(r["condition"]), {}).setdefault(seed, {}).update(got)
    return out


def _seed_pairs(a: Mapping[tuple, Any], b: Mapping[tuple, Any]) -> list[tuple[tuple, tuple]]:
    """Within each build both sides have (keys ``(build, seed)``): seed ``s`` with seed ``s``; a side with one
    seed (the seedless reference) with every seed of the other; none where two multi-seed sides share no seed."""
    pairs = []
    for build in sorted({k[0] for k in a} & {k[0] for k in b}):
        sa, sb = sorted(k for k in a if k[0] == build), sorted(k for k in b if k[0] == build)
        pairs += [(x, y) for x in sa for y in sb] if len(sa) == 1 or len(sb) == 1 else [(k, k) for k in sa if k in sb]
    return pairs


def _paired_diff(a: Mapping[tuple, Mapping[str, float]], b: Mapping[tuple, Mapping[str, float]], n_boot: int,
                 alpha: float, rng: np.random.Generator, bound: float = 1.0) -> tuple[float, float, float, int]:
    """Mean of ``a − b`` over the images every paired seed measured (``{(build, seed): {image_id: value}}``
    each side; pairs: :func:`_seed_pairs`) with :func:`midas_nb.metrics.stats.seed_image_interval` (builds → seeds)
    (seeded from ``rng``), the interval cut at ``±bound`` (the difference's range):
    ``(mean, lo, hi, n_images)``; NaNs when no image or seed is shared."""
    pairs = _seed_pairs(a, b)
    ids = sorted(set.intersection(*(set(a[sa]) & set(b[sb]) for sa, sb in pairs))) if pairs else []
    if not ids:
        return math.nan, math.nan, math.nan, 0
    x = np.array([[a[sa][i] - b[sb][i] for i in ids] for sa, sb in pairs], dtype=float)
    r = seed_image_interval(x, n_boot, alpha, int(rng.integers(2 ** 32)), builds=[sa[0] for sa, _ in pairs])
    return r.mean, max(r.lo, -bound), min(r.hi, bound), len(ids)


def condition_reading(D_lo: float, D_hi: float, d_idauc_lo: float, d_idauc_hi: float, status: str) -> str:
    """What one condition's coverage and faithfulness changes against the reference show.

    Args:
        D_lo, D_hi: paired interval of ``D`` (pp).
        d_idauc_lo, d_idauc_hi: paired interval of ``ΔIDAUC``.
        status: the band status of :func:`midas_nb.metrics.decoupling_D`.

    Returns:
        ``"both rose"`` (coverage and faithfulness both up, resolved), ``"coverage up at parity"``
        (coverage up, band held, no resolved faithfulness gain: the paper's decoupling shape),
        ``"coverage up, faithfulness down"``, ``"coverage up, parity not resolved"``,
        ``"coverage down"``, ``"coverage change not resolved"`` or ``"undefined"``; with
        ``" (band uninformative)"`` appended where the reference is not faithful enough for the
        band to decide.
    """
    d, f = _sign(D_lo, D_hi), _sign(d_idauc_lo, d_idauc_hi)
    text = ({"undefined": "undefined", "negative": "coverage down"}.get(d, "coverage change not resolved")
            if d != "positive" else "both rose" if f == "positive" else
            {"in band": "coverage up at parity", "outside band": "coverage up, faithfulness down"}.get(
                status, "coverage up, parity not resolved"))
    return text + (" (band uninformative)" if status == "uninformative" else "")


def _lead(w: Mapping[str, Any], key: str) -> str:
    """A paired lead ``w[key]`` with its interval, as :func:`lead_resolved` decides it: at three decimals as printed."""
    return format_ci(w[key], w.get(f"{key}_lo"), w.get(f"{key}_hi"), "+.3f", edges=())


def _means(per_image: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    return {c: float(np.mean(list(v.values()))) for c, v in per_image.items() if v}


def _winners(miou: Mapping[str, Mapping[str, float]], idauc: Mapping[str, Mapping[str, float]],
             seeds: tuple[Mapping[str, Any], Mapping[str, Any]], n_boot: int, alpha: float,
             rng: np.random.Generator) -> dict[str, Any]:
    """Best-coverage and best-faithfulness conditions (by their means over seeds and images) and
    their paired differences on both metrics (the coverage winner minus the faithfulness winner
    on mIoU, the reverse on IDAUC; ``seeds``: :func:`per_seed_values` of mIoU and IDAUC)."""
    mm = {c: v for c, v in _means(miou).items() if c not in BASELINE_CONDITIONS}
    fm = {c: v for c, v in _means(idauc).items() if c not in BASELINE_CONDITIONS}
    out: dict[str, Any] = {"coverage_winner": None, "faithfulness_winner": None, "reading": "undefined"}
    if not mm or not fm:
        return out
    cov, fai = max(mm, key=mm.get), max(fm, key=fm.get)
    out.update(coverage_winner=cov, faithfulness_winner=fai)
    # the ties are drawn from a child generator: the other intervals keep their draws
    tie_rng = rng.spawn(1)[0]
    miou_s, idauc_s = seeds
    per_metric = (("miou", mm, miou_s, cov, 1.0), ("idauc", fm, idauc_s, fai, 2.0))
    if cov == fai:
        _leads(out, per_metric, n_boot, alpha, rng, tie_rng)
        out["reading"] = "one condition leads both"
        # the highest means are one winner only where both leads are resolved; else the
        # runner-up ties with it on that metric within this sample
        open_ = [name for metric, name in (("miou", "coverage"), ("idauc", "faithfulness"))
                 if f"{metric}_runner_up" in out
                 and not lead_resolved(out[f"{metric}_lead_lo"], out[f"{metric}_lead_hi"])]
        if open_:
            out["reading"] = "highest means on both; " + _LEADS_IN_NOISE[len(open_) == 2].format(*open_)
        return out
    dm = _paired_diff(miou_s[cov], miou_s.get(fai, {}), n_boot, alpha, rng, 1.0)
    df = _paired_diff(idauc_s[fai], idauc_s.get(cov, {}), n_boot, alpha, rng, 2.0)
    out.update(miou_diff=dm[0], miou_diff_lo=dm[1], miou_diff_hi=dm[2], n_miou_images=dm[3],
               idauc_diff=df[0], idauc_diff_lo=df[1], idauc_diff_hi=df[2], n_idauc_images=df[3])
    resolved = [lead_resolved(dm[1], dm[2]), lead_resolved(df[1], df[2])]
    # each winner's lead over the runner-up on its own metric, and every condition it ties with
    # (from the child generator: the co-movement interval keeps its draws); a lead over the other
    # winner is the difference just drawn, not a second interval of the same quantity
    _leads(out, per_metric, n_boot, alpha, tie_rng, tie_rng, known={"miou": {fai: dm}, "idauc": {cov: df}})
    # a condition tying with both winners (each on its own metric) could be the best on both
    shared = out["shared_ties"] = [c for c in out.get("miou_ties", []) if c in out.get("idauc_ties", [])]
    open_ = [name for name, ok in zip(("coverage", "faithfulness"), resolved) if not ok]
    out["reading"] = (("not resolved: " + _LEADS_IN_NOISE[len(open_) == 2].format(*open_)) if open_ else
                      f"not resolved: {', '.join(shared)} tie{'s' if len(shared) == 1 else ''} with both winners"
                      if shared else "different winners")
    return out


def _leads(out: dict[str, Any], per_metric, n_boot: int, alpha: float, rng: np.random.Generator,
           tie_rng: np.random.Generator, known: Mapping[str, Mapping[str, tuple]] | None = None) -> None:
    """``<metric>_runner_up`` and ``<metric>_lead`` (+ interval) of each metric's winner, and
    ``<metric>_ties``: every other condition whose paired difference with the winner is not
    resolved (``[]`` when the lead is resolved over all); ``known[metric][c]``: a difference
    winner − ``c`` already drawn, reused."""
    for metric, means, per, win, bound in per_metric:
        others = {c: v for c, v in means.items() if c != win}
        if not others:
            continue
        runner = max(others, key=others.get)
        memo = (known or {}).get(metric, {})
        d = memo.get(runner) or _paired_diff(per[win], per[runner], n_boot, alpha, rng, bound)
        out.update({f"{metric}_runner_up": runner, f"{metric}_lead": d[0], f"{metric}_lead_lo": d[1],
                    f"{metric}_lead_hi": d[2]})
        ties = [] if lead_resolved(d[1], d[2]) else [runner]
        for c in sorted(others, key=others.get, reverse=True)[1:]:
            e = memo.get(c) or _paired_diff(per[win], per[c], n_boot, alpha, tie_rng, bound)
            ties += [] if lead_resolved(e[1], e[2]) else [c]
        out[f"{metric}_ties"] = ties


@dataclass(frozen=True)
class ClaimVerdict:
    """The computed verdict of one cell (see :func:`claim_verdict`).

    Attributes:
        conditions: one row per non-reference condition: ``D_pp`` / ``delta_idauc`` with their
            paired intervals and band ``status`` (:func:`~midas_nb.metrics.decoupling_D`), and
            ``reading`` (:func:`condition_reading`).
        winners: best-coverage / best-faithfulness conditions and their paired differences;
            ``reading``: ``"different winners"`` (both leads resolved, no ``shared_ties``), ``"not resolved: …"``,
            ``"one condition leads both"`` (its leads over each runner-up resolved) or
            ``"highest means on both; not resolved: …"`` (a runner-up ties with it), ``"undefined"``.
        comovement: correlation of coverage and faithfulness across conditions, with and without the
            control points (:func:`midas_nb.analysis.comovement.comovement`).
        decoupling_shown: the run shows the paper's claim — the focus condition's coverage up at
            parity *and* the two winners differ, resolved; else False.
        text: the sentences a notebook prints, (a)–(c) then one short line: shown, or which halves are not.
    """

    conditions: pd.DataFrame
    winners: dict[str, Any]
    comovement: dict[str, Any]
    decoupling_shown: bool
    text: str

    def __str__(self) -> str:
        return self.text


def _one_cell(table: pd.DataFrame) -> None:
    cols = [c for c in CELL_COLUMNS if c in table.columns and not (c == "checkpoint_id" and "build" in table.columns)]
    cells = table[cols].drop_duplicates()
    if len(cells) > 1:
        raise ValueError(f"claim_verdict needs the rows of one cell ({', '.join(cols)}); got {len(cells)}: "
                         f"{cells.to_dict('records')}; filter the table or call it per cell")


def _one_winner_text(cov: str, winners: Mapping[str, Any]) -> str:
    """(b) where one condition has the highest mean on both metrics: each lead, each tie named."""
    leads, ties = [], []
    for m, name in (("miou", "coverage"), ("idauc", "faithfulness")):
        if f"{m}_runner_up" not in winners:
            continue
        runner, lo, hi = winners[f"{m}_runner_up"], winners[f"{m}_lead_lo"], winners[f"{m}_lead_hi"]
        ok = lead_resolved(lo, hi)
        leads.append(f"{name} lead over {runner} {_lead(winners, f'{m}_lead')}" + ("" if ok else ", not resolved"))
        if not ok:
            ties.append(f"{cov} and {', '.join(winners.get(f'{m}_ties') or [runner])} tie on {name} within this sample")
    if not ties:
        return (f"(b) winners: {cov} leads on both coverage and faithfulness — no different winners"
                + (f" ({'; '.join(leads)})" if leads else "") + ".")
    return (f"(b) winners: {cov} has the highest mean coverage and the highest mean faithfulness, but "
            f"{'; '.join(ties)} — this sample cannot tell one winner from two ({'; '.join(leads)}).")


def _tie_text(cov: str, fai: str, winners: Mapping[str, Any]) -> str:
    """Where two winners differ, each one that ties with other conditions on its own metric."""
    out = [f"{win} ties with {', '.join(ties)} on {name} within this sample (lead over "
           f"{winners[f'{m}_runner_up']} {_lead(winners, f'{m}_lead')})"
           for m, name, win in (("miou", "coverage", cov), ("idauc", "faithfulness", fai))
           if (ties := winners.get(f"{m}_ties"))]
    return ("; " + "; ".join(out)) if out else ""


def _comovement_text(co: Mapping[str, Any], coverage: str) -> str:
    """(c) in words: ``r`` with its interval over images, builds and seeds, and ``r`` without the control points."""
    if not np.isfinite(co["r"]):
        return f"(c) co-movement: undefined ({co.get('reason', 'no values')})."
    ex = f" ({', '.join(co['excluded'])} left out: a lower bound, not a scorer)" if co.get("excluded") else ""
    text = (f"(c) across {co['n_conditions']} conditions{ex}, mean {coverage} and mean IDAUC correlate r = "
            f"{format_ci(co['r'], co['r_lo'], co['r_hi'], '+.2f')} "
            f"({co.get('resampled', 'images and seeds resampled')}) → {co['reading']}")
    w = co.get("without_controls") or {}
    if w:
        text += (f"; without {', '.join(w['left_out'])} ({w['n_conditions']} conditions): "
                 f"r = {format_ci(w['r'], w['r_lo'], w['r_hi'], '+.2f')} → {w['reading']}")
    return text + (" — the co-movement rests on the control points." if co.get("rests_on_controls") else ".")


def interval_levels(table: pd.DataFrame, skip: Sequence[str] = ("reference", *BASELINE_CONDITIONS)) -> str:
    """How every paired interval of a cell (``D``, the winners' leads, the ties) is built, in words, from the rows
    of its trained conditions (``skip`` left out): ``"3 builds × 2 seeds × the shared test images (t over the
    3 build means, …)"`` (decisions 0007, 0072; a missing ``build`` is 0)."""
    t = table[~table["condition"].isin(list(skip))]
    B = int(t["build"].fillna(0).nunique()) if "build" in t.columns else 1
    S = int(t["seed"].nunique()) if "seed" in t.columns else 1
    top = (f"t over the {B} build means" if B > 1 else f"t over the {S} seeds" if S > 1 else "one seed: no t")
    return (f"{B} build{'s' * (B > 1)} × {S} seed{'s' * (S > 1)} × the shared test images ({top}, "
            "Welch–Satterthwaite df, plus a bootstrap over the images; decisions 0007, 0072)")


def _text(cond: pd.DataFrame, focus: str, winners: Mapping[str, Any], co: Mapping[str, Any],
          shown: bool, coverage: str = "part mIoU", levels: str = "", band: float | None = None) -> str:
    lines, band = [], parity_band(band)
    if focus in set(cond["condition"]):
        r = cond.set_index("condition").loc[focus]
        di, lo, hi = r[["delta_idauc", "delta_idauc_lo", "delta_idauc_hi"]]
        h = band_resolution(lo, hi)
        lines.append(f"(a) parity: D({focus}) = {format_ci(r['D_pp'], r['D_pp_lo'], r['D_pp_hi'], '+.2f')} pp, "
                     f"ΔIDAUC = {format_ci(di, lo, hi, '+.3f', edges=(0, -band))}, "
                     f"band: {r['status']}{f' ({h})' if h else ''} → {r['reading']}.")
    else:
        lines.append(f"(a) parity: {focus} is not in this table.")
    cov, fai = winners.get("coverage_winner"), winners.get("faithfulness_winner")
    if winners["reading"] == "one condition leads both" or winners["reading"].startswith("highest means"):
        lines.append(_one_winner_text(cov, winners))
    elif cov is not None:
        lines.append(f"(b) winners: best coverage {cov}, best faithfulness {fai}; {cov} − {fai}: {coverage} "
                     f"{_lead(winners, 'miou_diff')} ({winners['n_miou_images']} images), {fai} − {cov}: IDAUC "
                     f"{_lead(winners, 'idauc_diff')} ({winners['n_idauc_images']} images) → {winners['reading']}"
                     + _tie_text(cov, fai, winners) + ".")
    else:
        lines.append("(b) winners: undefined (no per-image values).")
    if levels and cov is not None:
        lines.append(f"    a lead is resolved, and a tie declared, by the paired interval of D's hierarchy: {levels}.")
    lines.append(_comovement_text(co, coverage))
    if shown:
        lines.append(f"This run shows the decoupling: {focus} gains coverage at faithfulness parity and the "
                     "best-coverage and best-faithfulness conditions differ.")
    else:                       # one short line (the HTML index's headline); the claims table says the rest
        reading = cond.set_index("condition")["reading"].get(focus, "not in this table")
        why = [] if reading == "coverage up at parity" else [f"(a) {focus}: {reading}"]
        why += [] if winners["reading"].startswith("different") else ["(b) no two resolved winners"]
        why += (["(c) coverage and faithfulness rose together" + (" (only with the control points)" if
                                                                  co.get("rests_on_controls") else "")]
                if co["reading"] == "move together" else [])
        lines.append("This run does not show a decoupling: " + "; ".join(why) + ".")
    return "\n".join(lines)


def claim_verdict(table: pd.DataFrame, *, focus: str = "T5", reference: str = "reference",
                  band: float | None = None, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> ClaimVerdict:
    """Test both halves of the MIDAS claim on one cell of a results table.

    Args:
        table: protocol rows of one cell (:data:`CELL_COLUMNS`; any number of seeds) with the
            per-image columns the protocol stores; must contain the ``reference`` condition.
        focus: the condition whose parity is the claim's first half (the paper's T5).
        reference: the reference condition (T0).
        band: the IDAUC parity band (``None``: :data:`~midas_nb.metrics.PARITY_BAND`).
        n_boot, alpha, seed: bootstrap resamples, level, RNG seed (reproducible).

    Returns:
        :class:`ClaimVerdict`.

    Raises:
        ValueError: rows of several cells; no reference condition.
    """
    _one_cell(table)
    if reference not in set(table["condition"]):
        raise ValueError(f"claim_verdict: the table has no {reference!r} condition "
                         f"(conditions: {sorted(set(table['condition']))})")
    D = decoupling_D(table, reference=reference, band=band, condition_cols=("condition",), n_boot=n_boot,
                     alpha=alpha, ci_seed=seed)
    D = D[D["condition"] != reference].copy()
    D["reading"] = [condition_reading(r["D_pp_lo"], r["D_pp_hi"], r["delta_idauc_lo"], r["delta_idauc_hi"],
                                      str(r["status"])) for _, r in D.iterrows()]
    keep = [c for c in ("condition", "D_pp", "D_pp_lo", "D_pp_hi", "delta_idauc", "delta_idauc_lo",
                        "delta_idauc_hi", "status", "reading") if c in D.columns]
    cond = D[keep].reset_index(drop=True)
    rng = np.random.default_rng(seed)
    miou, idauc = per_image_means(table, "miou"), per_image_means(table, "idauc")
    seeds = (per_seed_values(table, "miou"), per_seed_values(table, "idauc"))
    winners = _winners(miou, idauc, seeds, n_boot, alpha, rng)
    co = comovement(*seeds, exclude=BASELINE_CONDITIONS, n_boot=n_boot, alpha=alpha, rng=rng)
    focus_reading = (cond.set_index("condition").loc[focus, "reading"] if focus in set(cond["condition"])
                     else "undefined")
    shown = focus_reading == "coverage up at parity" and winners["reading"] == "different winners"
    return ClaimVerdict(cond, winners, co, bool(shown),
                        _text(cond, focus, winners, co, bool(shown), coverage_name(table),
                              interval_levels(table, (reference, *BASELINE_CONDITIONS)), band))


def _ci_of(values: Sequence[float], n_boot: int, alpha: float, rng: np.random.Generator) -> tuple[float, float, float]:
    """:func:`midas_nb.metrics.stats.bootstrap_ci` of ``values`` with a seed drawn from ``rng``."""
    return bootstrap_ci(np.asarray(values, dtype=float), n_boot=n_boot, alpha=alpha, seed=int(rng.integers(2 ** 32)))


def targets_vs_scorers(coverage: pd.DataFrame, table: pd.DataFrame, *, control: str = CONTROL_CONDITION,
                       n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> tuple[pd.DataFrame, str]:
    """Each target's own top-k coverage beside the coverage of the scorer distilled from it and
    of the random-map control, on the same images.

    A scorer trained with ``L_cls + λ·L_ga(Tk)`` can cover more or less than ``Tk``'s own top-k
    (it also learns from ``L_cls``); whether ``Tk``'s *content* explains the scorer's coverage is
    decided against the control that distils a seeded random map with the same loss and λ:
    ``gain = mIoU(scorer Tk) − mIoU(control)``, paired over the images both were evaluated on
    and seed with seed, its interval over seeds and images as ``D``'s (module docstring).

    Args:
        coverage: :meth:`midas_nb.study.Study.target_coverage` (``target``, ``miou`` and the
            per-image ``image_ids`` / ``miou_per_image``).
        table: protocol rows of one cell (conditions named after the targets, plus ``control``).
        control: the control condition's name.
        n_boot, alpha, seed: bootstrap resamples, level, RNG seed.

    Returns:
        ``(frame, text)``: one row per target that has a scorer in ``table`` — ``target``,
        ``target_miou`` / ``_lo`` / ``_hi`` (its own top-k, on the scorer's images),
        ``scorer_miou`` / ``_lo`` / ``_hi``, ``control_miou``, ``gain_over_control`` / ``_lo`` /
        ``_hi``, ``n_images``, ``reading`` (``"above the control"``: the target's content adds
        coverage; ``"not separated from the control"``: this run cannot attribute the scorer's
        coverage to it; ``"below the control"``); and the computed sentences.

    Raises:
        ValueError: ``coverage`` lacks the per-image columns; rows of several cells.
    """
    if not {"image_ids", "miou_per_image"} <= set(coverage.columns):
        raise ValueError("targets_vs_scorers needs the per-image columns image_ids / miou_per_image of "
                         "Study.target_coverage()")
    _one_cell(table)
    rng = np.random.default_rng(seed)
    scorers, by_seed = per_image_means(table, "miou"), per_seed_values(table, "miou")
    ctrl = scorers.get(control)
    rows = []
    for _, c in coverage.iterrows():
        tgt = str(c["target"])
        if tgt not in scorers or tgt == control or tgt in BASELINE_CONDITIONS:
            continue
        own = per_image_values(c, "image_ids", "miou_per_image") or {}
        sc = scorers[tgt]
        ids = [i for i in sc if i in own and np.isfinite(own[i])]
        t_m = _ci_of([own[i] for i in ids], n_boot, alpha, rng)
        s_m = _ci_of([sc[i] for i in ids], n_boot, alpha, rng)
        row = dict(target=tgt, target_miou=t_m[0], target_miou_lo=t_m[1], target_miou_hi=t_m[2],
                   scorer_miou=s_m[0], scorer_miou_lo=s_m[1], scorer_miou_hi=s_m[2], n_images=len(ids))
        if ctrl is not None:
            g = _paired_diff(by_seed[tgt], by_seed[control], n_boot, alpha, rng)
            row.update(control_miou=float(np.mean([ctrl[i] for i in sc if i in ctrl])) if g[3] else math.nan,
                       gain_over_control=g[0], gain_over_control_lo=g[1], gain_over_control_hi=g[2])
            row["reading"] = {"positive": "above the control", "negative": "below the control",
                              "not resolved": "not separated from the control", "undefined": "undefined"}[_sign(g[1], g[2])]
        else:
            row.update(control_miou=math.nan, gain_over_control=math.nan, gain_over_control_lo=math.nan,
                       gain_over_control_hi=math.nan, reading=f"no {control} control in this table")
        rows.append(row)
    out = pd.DataFrame(rows)
    if out.empty:
        return out, "no target has a distilled scorer in this table."
    lines = [follows_targets(out["target_miou"], out["scorer_miou"])]
    if ctrl is not None:
        groups = {r: list(out.loc[out["reading"] == r, "target"])
                  for r in ("above the control", "not separated from the control", "below the control", "undefined")}
        said = [f"{', '.join(ts)} {'covers' if len(ts) == 1 else 'cover'} more than it (resolved)"
                if r == "above the control" else f"{', '.join(ts)}: {r}" for r, ts in groups.items() if ts]
        lines.append(f"Against the {control} control (mIoU {out['control_miou'].mean():.3f}): " + "; ".join(said)
                     + ("." if not groups["not separated from the control"] and not groups["below the control"] else
                        " — for a scorer that does not cover resolvably more than the control, this run cannot "
                        "credit what it gains over the reference to its target's content."))
    else:
        lines.append(f"Without the {control} control the gain cannot be credited to the targets' content.")
    return out, "\n".join(lines)


def follows_targets(target: Sequence[float], scorer: Sequence[float]) -> str:
    """How the scorers' coverage follows their targets' own top-k coverage (mIoU fractions, one value per
    target, in the same order), in one computed sentence: both spans in pp, the scorers' as a share of the
    targets', and in how many pairs of targets the scorers are ordered as the targets are (a tie breaks the
    order). The words follow the numbers: "follow their order" (every pair), "mostly" (≥ 70 % of the pairs),
    "mostly reverse" (≤ 30 %), "do not follow" (between); "compressed" where the scorers span less than half
    the targets' span, "widened" where more than twice. Point values only: no interval backs the order."""
    t, s = np.asarray(target, float), np.asarray(scorer, float)
    t_span, s_span = float(np.ptp(t)) if len(t) else 0.0, float(np.ptp(s)) if len(s) else 0.0
    text = (f"The targets' own top-k coverage spans {100 * t_span:.1f} pp across {len(t)} targets; the scorers "
            f"distilled from them span {100 * s_span:.1f} pp")
    pairs = [(i, j) for i in range(len(t)) for j in range(i + 1, len(t))]
    if not pairs or t_span <= 0:
        return text + "."
    alike = sum(bool((t[i] - t[j]) * (s[i] - s[j]) > 0) for i, j in pairs)
    share, ratio = alike / len(pairs), s_span / t_span
    order = ("follow their targets' order" if alike == len(pairs) else "mostly follow their targets' order"
             if share >= 0.7 else "mostly reverse their targets' order" if share <= 0.3 else
             "do not follow their targets' order")
    size = (f", their differences compressed to {ratio:.0%} of the targets' span" if ratio < 0.5 else
            f", their differences widened to {ratio:.1f}× the targets' span" if ratio > 2 else "")
    return (f"{text} and order {alike} of the {len(pairs)} pairs of targets as the targets' own coverage does "
            f"— the scorers {order}{size} (from the means).")


def paired_gap(a: pd.DataFrame, b: pd.DataFrame, metric: str, *, n_boot: int = 1000, alpha: float = 0.05,
               seed: int = 0) -> tuple[float, float, float, int]:
    """Mean of ``a − b`` over the images both were evaluated on, paired seed with seed (a one-seed
    side with every seed of the other), with the interval over seeds and images of
    :func:`midas_nb.metrics.stats.seed_image_interval`: ``(mean, lo, hi, n_images)``.

    Each side's rows are taken whatever their condition, so ``a`` and ``b`` may each hold one
    condition's rows (e.g. a trained scorer against the random ranking on pruned accuracy).

    Raises:
        ValueError: unknown metric.
    """
    pa = per_seed_values(a.assign(condition="a"), metric).get("a", {})
    pb = per_seed_values(b.assign(condition="b"), metric).get("b", {})
    return _paired_diff(pa, pb, n_boot, alpha, np.random.default_rng(seed))
