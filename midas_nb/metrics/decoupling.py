"""Decoupling ``D`` (MIDAS, DESIGN.md §6): part-coverage gain over the reference at faithfulness parity, with paired intervals and the band status."""
from __future__ import annotations

import json
import math
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd

from .stats import is_finite_number, seed_image_interval
from .registry import register_metric


DEFAULT_CELL = ("dataset", "backbone", "depth", "budget")
DEFAULT_CONDITION_KEY = ("condition", "target", "relaxation")
#: identity of the fine-tuned backbone: always part of a cell where present (never compare across checkpoints)
CHECKPOINT_COLUMNS = ("checkpoint_id", "weights_digest")
#: the backbone build of a row (its fine-tuning seed's offset, decision 0072); rows lacking it are build 0
BUILD_COLUMN = "build"

#: the IDAUC parity band (DESIGN.md §6): ``D`` counts where ``ΔIDAUC ≥ −PARITY_BAND``; every ``band=None`` means it
PARITY_BAND = 0.01


def parity_band(band: float | None = None) -> float:
    """``band``, or :data:`PARITY_BAND` (read when called) where it is ``None``: every ``band=None`` default."""
    return PARITY_BAND if band is None else float(band)


_BAND_EPS = 1e-12   # so that ΔIDAUC = −band computed in floating point counts as inside
#: the statuses :func:`decoupling_D` gives a (cell, condition)
D_STATUSES = ("in band", "outside band", "not resolved", "uninformative", "undefined", "no reference")
#: ``reference_check``: is the reference's IDAUC clearly above the random ranking's in the cell?
REFERENCE_CHECKS = ("above random", "not above random", "untested")


def _as_float_list(v: Any) -> list[float] | None:
    """A per-image list (JSON ``null`` → NaN), or ``None`` when the row has none."""
    if v is None or isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, str):          # a table read back from CSV (results.load_table parses these)
        v = json.loads(v)
    try:
        return [math.nan if x is None else float(x) for x in v]
    except TypeError:
        return None


def per_image_values(row: Mapping[str, Any], ids_col: str, val_col: str) -> dict[str, float] | None:
    """``{image_id: value}`` of one results row: the ids of column ``ids_col`` (a list, or its
    JSON text as read back from CSV) paired with the values of ``val_col`` (JSON ``null`` →
    NaN); ``None`` when the row has none, or the two lists differ in length or are empty."""
    ids, vals = row.get(ids_col), _as_float_list(row.get(val_col))
    if ids is None or vals is None or (isinstance(ids, float) and math.isnan(ids)):
        return None
    if isinstance(ids, str):
        ids = json.loads(ids)
    ids = [str(i) for i in ids]
    if len(ids) != len(vals) or not ids:
        return None
    return dict(zip(ids, vals))


def _paired_matrix(rows: list[Mapping[str, Any]], refs: list[Mapping[str, Any] | None],
                   ids_col: str, val_col: str) -> tuple[np.ndarray | None, str]:
    """``([S, n] per-image differences condition − reference over the images every row and
    reference shares, "")``, or ``(None, why)``: ``why == "no per-image values"`` when no row
    and no reference has them (the caller then uses the rows' own means), else the reason the
    pairing is impossible. ``refs[s] is None``: no reference (the values themselves)."""
    cond = [per_image_values(r, ids_col, val_col) for r in rows]
    ref = [None if r is None else per_image_values(r, ids_col, val_col) for r in refs]
    given = [r is not None for r in refs]
    if all(c is None for c in cond) and all(rf is None for rf, g in zip(ref, given) if g):
        return None, "no per-image values"
    if any(c is None for c in cond) or any(rf is None and g for rf, g in zip(ref, given)):
        return None, f"{val_col} is stored for only some of the rows and their reference: cannot pair"
    ids = sorted(set(cond[0]).intersection(*cond[1:], *(rf for rf in ref if rf is not None)))
    if not ids:
        return None, f"no image of {ids_col} in common with the reference"
    return np.array([[c[i] - (rf[i] if rf is not None else 0.0) for i in ids] for c, rf in zip(cond, ref)]), ""
@register_metric("decoupling_D", higher_is_better=True, category="decoupling",
                 reference="MIDAS (DESIGN.md §6): D(t) = mIoU_t − mIoU_ref where "
                           f"IDAUC_t − IDAUC_ref ≥ −{PARITY_BAND:g}, the reference clearly above a random ranking",
                 summary="part-coverage gain over the reference scorer at faithfulness parity")
def decoupling_D(table: pd.DataFrame, reference: str = "reference", band: float | None = None, miou_col: str = "miou",
                 idauc_col: str = "idauc", by: Sequence[str] | None = None, *,
                 condition_cols: Sequence[str] = DEFAULT_CONDITION_KEY, seed_col: str = "seed",
                 miou_unit: Literal["fraction", "percent"] = "fraction", per_seed: bool = False, random: str = "random",
                 n_boot: int = 1000, alpha: float = 0.05, ci_seed: int = 0) -> pd.DataFrame:
    """Decoupling ``D(t) = mIoU_t − mIoU_ref`` with the IDAUC parity band (MIDAS, DESIGN.md §6).

    **Cells.** Within each cell — ``by`` (dataset, backbone, depth, budget) *plus* the backbone's
    identity :data:`CHECKPOINT_COLUMNS` (``checkpoint_id``, ``weights_digest``) wherever the
    table has them, even when ``by`` omits them — every condition is compared with the reference
    condition (``condition == reference``; default the training-free T0 scorer, any condition
    such as ``"random_map"`` works). Rows of two checkpoints are never compared: a condition whose
    checkpoint has no reference row gets status ``"no reference"``. **Builds.** Where the table
    has a :data:`BUILD_COLUMN` (NaN: build 0), the checkpoints of the builds of one recipe (one
    per build, else ``ValueError``) are pooled: each row is paired within its own checkpoint and
    the condition's point and interval are taken over builds → seeds → images (decision 0072);
    the checkpoint columns shown are the lowest build's.

    **Pairing.** Each row is paired with the reference row of its seed when there is one, else
    the only reference row, else the per-image mean of the cell's reference rows
    (``ref_paired`` says which); a condition with one row (seedless, e.g. the T0 reference)
    against a reference with several seeds is paired with each of them, so that
    ``D(a vs b) = −D(b vs a)``, point and interval. With per-image values (``image_ids``/``<miou>_per_image``,
    ``idauc_image_ids``/``<idauc>_per_image``) the per-image differences ``x[s, i] = x_t − x_ref``
    over the images *every* seed and its reference share give both the point and the interval:

    - point ``D̄ = mean_s d_s``, ``d_s = nanmean_i x[s, i]`` (×100 for ``D_pp`` when
      ``miou_unit="fraction"``; ``delta_idauc`` in IDAUC units); ``D_pp_by_seed`` lists the ``d_s``;
    - interval (:func:`midas_nb.metrics.stats.seed_image_interval`): one seed — the paired percentile
      bootstrap over images; ``S ≥ 2`` seeds — ``D̄ ± t_{ν, 1−alpha/2}·√(s²_seeds/S + v_img)``,
      ``s²_seeds`` the sample variance of the ``d_s``, ``v_img`` the image-bootstrap variance of
      the seed-mean (same images for every seed), ``ν`` the Welch–Satterthwaite degrees of
      freedom (``S − 1`` when the images add nothing); ``B ≥ 2`` builds — the same with the build
      means (each the mean of its seeds' ``d_s``) in place of the ``d_s`` (``D̄`` their mean);
      cut at the difference's range (±100 pp for ``D``, ±2 for ``ΔIDAUC``). ``ci_method`` names
      the construction.

    Rows with per-image values but no image in common with their reference (or values for only
    one side) get ``"undefined"`` and the reason — never a point from other images. A table
    without any per-image values (hand-built) uses the rows' own means: a point decision with
    NaN intervals (``band_resolved`` NA, ``ci_method`` says so).

    **Reference faithfulness.** In each cell with a ``random`` condition (the protocol's seeded
    random ranking), ``ref_minus_random`` = IDAUC_ref − IDAUC_random with its paired interval
    (the same construction). ``reference_check``: ``"above random"`` when the lower bound is
    ``> 0`` (the point without an interval), ``"not above random"`` otherwise, ``"untested"``
    where the cell has no random row, no pairs with it, or the reference *is* the random ranking.

    ``status`` (one of :data:`D_STATUSES`), with ``band_reason`` saying why:
    ``"no reference"`` — the cell (checkpoint) has no reference row; ``"undefined"`` — ``D`` or
    ``ΔIDAUC`` is NaN or has no pairs; ``"uninformative"`` — the reference is not above random
    (the band cannot speak about faithfulness parity); else ``"in band"`` when the whole ΔIDAUC
    interval is ``≥ −band``, ``"outside band"`` when entirely below, ``"not resolved"`` when it
    straddles ``−band`` (without an interval: the point decision). ``in_band`` is always the
    point decision ``ΔIDAUC ≥ −band`` (NA when undefined). Rows are never dropped.

    Args:
        table: results rows (``midas_nb.results`` schema or any frame with these columns).
        reference: the reference condition's name in ``condition_cols[0]``.
        band: the parity band (IDAUC units); ``None``: :data:`PARITY_BAND`.
        miou_col, idauc_col: metric columns.
        by: cell columns; ``None`` → those of ``("dataset","backbone","depth","budget")``
            present in ``table``; the checkpoint columns are added either way.
        condition_cols: columns identifying a condition inside a cell; the first must exist,
            the others are used where present.
        seed_col: the seed column (optional in ``table``).
        miou_unit: ``"fraction"`` (mIoU in [0,1]) or ``"percent"``.
        per_seed: one row per results row (each seed alone: images-only intervals).
        random: the random-ranking condition of the reference check.
        n_boot, alpha, ci_seed: bootstrap resamples, level and RNG seed of the intervals.

    Returns:
        One row per (cell, condition) (per row with ``per_seed``): ``by``, the checkpoint
        columns present (a missing ``weights_digest`` is ``""``), the condition columns,
        ``D_pp``, ``D_pp_lo``, ``D_pp_hi``, ``D_pp_std`` (over the ``d_s``), ``D_pp_by_seed``,
        ``delta_idauc`` (+ ``_lo``, ``_hi``, ``_std``), ``n_seeds``, ``in_band`` (nullable
        boolean), ``band_resolved``, ``in_band_frac`` (seeds whose ``ΔIDAUC ≥ −band``),
        ``status``, ``band_reason``, ``n_builds``, ``D_pp_by_build`` (each build's D), ``D_pp_build_std``,
        ``reference_check``, ``ref_minus_random`` (+ ``_lo``,
        ``_hi``), ``D_cell`` (display string), ``miou``, ``idauc``, ``miou_ref``, ``idauc_ref``
        (the rows' own means), ``ref_paired``, ``n_paired_images`` (images of ΔIDAUC; 0 without
        pairs), ``ci_method``.

    Raises:
        ValueError: for missing columns, an unknown ``miou_unit``, no reference row at all or two
        checkpoints of one build.
    """
    band = parity_band(band)
    by, key, ident = _check_columns(table, reference, miou_col, idauc_col, by, condition_cols, miou_unit)
    has_seed = seed_col in table.columns
    pool = by + ([] if BUILD_COLUMN in table.columns else ident)
    pairing = _Pairing(table, by + ident, pool, key, condition_cols[0], reference, seed_col if has_seed else None,
                       (miou_col, idauc_col), 100.0 if miou_unit == "fraction" else 1.0, (n_boot, alpha, ci_seed),
                       per_seed)
    if per_seed:
        groups = [[k] for k in range(len(pairing.recs))]
    else:
        groups = list(pairing.src.groupby(pool + key, dropna=False, sort=False).indices.values())
        groups = [sorted(map(int, g), key=lambda k: pairing.builds[k]) for g in groups]
    out = pd.DataFrame([pairing.group(g, band) for g in groups])
    checks = {c: pairing.reference_check(c, random, band) for c in dict.fromkeys(out["_pool"])}
    _band_status(out, band, checks, pairing)
    cols = by + ident + key + ([seed_col] if per_seed and has_seed else []) + [
        "D_pp", "D_pp_lo", "D_pp_hi", "D_pp_std", "D_pp_by_seed", "delta_idauc", "delta_idauc_lo",
        "delta_idauc_hi", "delta_idauc_std", "n_seeds", "n_builds", "D_pp_by_build", "D_pp_build_std",
        "in_band", "band_resolved", "in_band_frac", "status", "band_reason", "reference_check", "ref_minus_random",
        "ref_minus_random_lo", "ref_minus_random_hi", "D_cell", "miou", "idauc", "miou_ref", "idauc_ref", "ref_paired", "n_paired_images", "ci_method"]
    result = out[cols].reset_index(drop=True)
    result.attrs["interval"] = (f"{100 * (1 - alpha):g} % paired intervals over the images each condition shares "
                                f"with its reference: bootstrap over images ({n_boot} resamples) for one seed; "
                                "t with Welch–Satterthwaite df over seeds (over builds where there are several) "
                                "plus the image-bootstrap variance for several")
    return result


# ----------------------------------------------------------------------------------------------
# the steps of decoupling_D


def _check_columns(table: pd.DataFrame, reference: str, miou_col: str, idauc_col: str, by: Sequence[str] | None,
                   condition_cols: Sequence[str], miou_unit: str) -> tuple[list[str], list[str], list[str]]:
    """``(cell columns, condition columns present, checkpoint columns present)``; raises the
    errors of :func:`decoupling_D`."""
    if miou_unit not in ("fraction", "percent"):
        raise ValueError(f"miou_unit must be 'fraction' or 'percent', got {miou_unit!r}")
    cond_col = condition_cols[0]
    missing = [c for c in (cond_col, miou_col, idauc_col) if c not in table.columns]
    if by is None:
        by = [c for c in DEFAULT_CELL if c in table.columns]
    else:
        missing += [c for c in by if c not in table.columns]
    if missing:
        raise ValueError(f"decoupling_D: table is missing column(s) {missing}; has {list(table.columns)}")
    if not (table[cond_col] == reference).any():
        raise ValueError(f"decoupling_D: no reference row ({cond_col} == {reference!r}); "
                         f"conditions present: {sorted(table[cond_col].astype(str).unique())}")
    ident = [c for c in CHECKPOINT_COLUMNS if c in table.columns and c not in by]
    return list(by), [c for c in condition_cols if c in table.columns], ident


def _nanless_mean(v: Sequence[float]) -> float:
    """Mean, NaN when any value is NaN (a mean over seeds is never a silent subset)."""
    a = np.asarray(v, dtype=float)
    return float(a.mean()) if a.size and np.isfinite(a).all() else math.nan


def _seed_mean(v: Sequence[float]) -> float:
    """Mean over the seeds that have a value for one image; NaN where none has (no warning)."""
    a = np.asarray(v, dtype=float)
    return float(np.nanmean(a)) if np.isfinite(a).any() else math.nan


class _Pairing:
    """The rows of a table, their cells (``by`` + checkpoint columns) and reference rows, and the
    paired point and interval of a group of rows (one condition of one cell, or one row)."""

    def __init__(self, table: pd.DataFrame, cell: list[str], pool: list[str], key: list[str], cond_col: str,
                 reference: str, seed_col: str | None, metric_cols: tuple[str, str], scale: float,
                 boot: tuple[int, float, int], per_seed: bool = False) -> None:
        src = table.reset_index(drop=True).copy()
        for c in CHECKPOINT_COLUMNS:                 # a missing digest is a key of its own, not NaN ≠ NaN
            if c in cell:
                src[c] = src[c].astype(object).where(src[c].notna(), "").astype(str)
        self.src, self.recs = src, src.to_dict("records")
        self.cell, self.key, self.cond_col, self.reference, self.seed_col = cell, key, cond_col, reference, seed_col
        self.scale, self.boot, self.per_seed = scale, boot, per_seed
        m, i = metric_cols
        # per-image columns follow the metric columns' names (miou → miou_per_image, image_ids)
        self.metric = {"m": (m, "image_ids", f"{m}_per_image"), "i": (i, "idauc_image_ids", f"{i}_per_image")}
        self.cells = [tuple(r[c] for c in cell) for r in self.recs]
        self.pools = [tuple(r[c] for c in pool) for r in self.recs]     # a cell with all its builds
        self.builds = [int(b) if is_finite_number(b) else 0 for b in
                       (src[BUILD_COLUMN] if BUILD_COLUMN in src.columns else [0] * len(src))]
        ckpts: dict[tuple, set] = {}
        for k in range(len(self.recs)):
            ckpts.setdefault((self.pools[k], self.builds[k]), set()).add(self.cells[k])
        if two := next((k for k, v in ckpts.items() if len(v) > 1), None):
            raise ValueError(f"decoupling_D: build {two[1]} of cell {two[0]} has rows of {len(ckpts[two])} "
                             f"checkpoints {sorted(ckpts[two])}; expected one checkpoint per build")
        self.ref_rows: dict[tuple, list[int]] = {}
        for k, r in enumerate(self.recs):
            if r[cond_col] == reference:
                self.ref_rows.setdefault(self.cells[k], []).append(k)

    def reference_for(self, k: int) -> tuple[Mapping[str, Any] | None, bool]:
        """``(reference record, paired by seed)`` of row ``k``: the same seed's, else the only
        one, else the per-image (and own-value) mean of the cell's reference rows."""
        cands = self.ref_rows.get(self.cells[k], [])
        if not cands:
            return None, False
        if self.seed_col is not None:
            same = [i for i in cands if self.recs[i][self.seed_col] == self.recs[k][self.seed_col]]
            if same:
                return self.recs[same[0]], True
        if len(cands) == 1:
            return self.recs[cands[0]], False
        rows = [self.recs[i] for i in cands]
        out = dict(rows[0])
        for own, idc, vc in self.metric.values():
            out[own] = _nanless_mean([r[own] for r in rows])
            maps = [per_image_values(x, idc, vc) for x in rows]
            if any(mp is None for mp in maps):
                out[vc] = None
                continue
            ids = sorted(set.intersection(*(set(mp) for mp in maps)))
            out[idc], out[vc] = ids, [_seed_mean([mp[i] for mp in maps]) for i in ids]
        return out, False

    def _paired(self, rows: list[Mapping[str, Any]], refs: list[Mapping[str, Any]], tag: str,
                builds: list[int]) -> dict[str, Any]:
        """Point, per-seed and per-build values, interval, paired images, method and (if undefined) why."""
        own, idc, vc = self.metric[tag]
        mat, why = _paired_matrix(rows, refs, idc, vc)
        nan = math.nan
        if mat is None and why == "no per-image values":
            per = [float(r[own]) - float(rf[own]) for r, rf in zip(rows, refs)]
            return dict(point=_nanless_mean(per), per=per, by_build=[], lo=nan, hi=nan, n=0,
                        method="point only (no per-image values)", why="")
        if mat is None:
            return dict(point=nan, per=[], by_build=[], lo=nan, hi=nan, n=0, method="none", why=why)
        si = seed_image_interval(mat, *self.boot, builds=builds)
        why = "" if np.isfinite(si.mean) else f"{own} is NaN on every paired image of a seed"
        # a t-interval over few seeds can reach past what a difference can be: it is cut at the
        # range (mIoU in [0, 1] or [0, 100] %, IDAUC in [−1, 1])
        bound = 100.0 / self.scale if tag == "m" else 2.0
        return dict(point=si.mean, per=list(si.per_seed), by_build=list(si.per_build), lo=max(si.lo, -bound),
                    hi=min(si.hi, bound), n=si.n_images, method=si.method, why=why)

    def group(self, idx: list[int], band: float) -> dict[str, Any]:
        """One output row for the results rows ``idx`` (internal columns start with ``_``)."""
        rows, refs_p, builds = [], [], []
        for k in idx:
            cands = self.ref_rows.get(self.cells[k], [])
            if not self.per_seed and len(cands) > 1 and [self.cells[j] for j in idx].count(self.cells[k]) == 1:
                # a seedless condition (one row per build, e.g. the T0 reference) against a reference
                # with several seeds: the row is paired with each of them (its value is the same under
                # every seed), so D(a vs b) = −D(b vs a), point and interval (one row per results
                # row keeps the same-seed pairing)
                pairs = [(self.recs[i], False) for i in cands]
            else:
                pairs = [self.reference_for(k)]
            rows, refs_p = rows + [self.recs[k]] * len(pairs), refs_p + pairs
            builds += [self.builds[k]] * len(pairs)
        refs = [r for r, _ in refs_p]
        res: dict[str, Any] = {c: rows[0][c] for c in self.cell + self.key}
        if self.seed_col is not None:
            res[self.seed_col] = rows[0][self.seed_col]
        res["_cell"], res["_pool"], res["n_seeds"] = self.cells[idx[0]], self.pools[idx[0]], len(idx)
        res["n_builds"] = len(set(builds))
        has_ref = all(r is not None for r in refs)
        res.update(has_reference=has_ref, ref_paired=all(p for _, p in refs_p))
        for tag, name in (("m", "miou"), ("i", "idauc")):
            own = self.metric[tag][0]
            res[name] = _nanless_mean([r[own] for r in rows])
            res[f"{name}_ref"] = _nanless_mean([r[own] for r in refs]) if has_ref else math.nan
        whys = []
        for tag, name, sc in (("m", "D_pp", self.scale), ("i", "delta_idauc", 1.0)):
            p = self._paired(rows, refs, tag, builds) if has_ref else dict(
                point=math.nan, per=[], by_build=[], lo=math.nan, hi=math.nan, n=0, method="none", why="")
            res[name], res[f"{name}_lo"], res[f"{name}_hi"] = p["point"] * sc, p["lo"] * sc, p["hi"] * sc
            per = np.asarray(p["per"], dtype=float) * sc
            res[f"{name}_std"] = float(per.std(ddof=1)) if per.size > 1 else math.nan
            res[f"_{name}_per"] = per
            whys += [p["why"]] if p["why"] else []
            if tag == "i":
                res["n_paired_images"], res["ci_method"] = p["n"], p["method"]
            else:
                res["D_pp_by_build"] = ", ".join(f"build {b}: {v * sc:+.2f}" for b, v in
                                                 zip(sorted(set(builds)), p["by_build"]))
                res["D_pp_build_std"] = float(np.std(p["by_build"], ddof=1)) * sc if len(p["by_build"]) > 1 \
                    else math.nan
        res["_why"] = "; ".join(whys)
        di = res["_delta_idauc_per"]
        res["in_band_frac"] = float(np.mean(di >= -band - _BAND_EPS)) if di.size and np.isfinite(di).all() else math.nan
        seeds = [r[self.seed_col] for r in rows] if self.seed_col is not None else list(range(len(rows)))
        if res["n_builds"] > 1:
            seeds = [f"{s} (build {b})" for s, b in zip(seeds, builds)]
        dp = res["_D_pp_per"]
        res["D_pp_by_seed"] = ", ".join(f"seed {s}: {v:+.2f}" for s, v in zip(seeds, dp)) if dp.size == len(rows) else ""
        return res

    def reference_check(self, cell: tuple, random: str, band: float) -> dict[str, Any]:
        """``reference_check``, its text and ``ref_minus_random`` (+ interval) of one cell."""
        nan = math.nan
        res = dict(reference_check="untested", text="", ref_minus_random=nan, ref_minus_random_lo=nan,
                   ref_minus_random_hi=nan)
        if self.reference == random:
            res["text"] = f"the reference {self.reference!r} is the random ranking itself"
            return res
        ridx = [k for k, c in enumerate(self.pools) if c == cell and self.recs[k][self.cond_col] == random]
        if not ridx:
            res["text"] = f"{self.reference} faithfulness untested: no {random!r} row in this cell"
            return res
        ref_rows = [self.recs[i] for c in dict.fromkeys(self.cells[k] for k in ridx) for i in self.ref_rows.get(c, [])]
        if not ref_rows:
            return res
        g = self.group(sorted(ridx, key=lambda k: self.builds[k]), band)
        d, lo, hi = g["delta_idauc"], g["delta_idauc_lo"], g["delta_idauc_hi"]
        if not np.isfinite(d):
            res["text"] = (f"{self.reference} faithfulness untested: its IDAUC vs the random ranking is undefined "
                           f"({g['_why'] or 'IDAUC is NaN'})")
            return res
        diff, dlo, dhi = -d, -hi, -lo
        has_ci = bool(np.isfinite(dlo) and np.isfinite(dhi))
        above = bool(dlo > 0) if has_ci else bool(diff > 0)
        ref_ci = ""
        if len(ref_rows) == 1 and all(is_finite_number(ref_rows[0].get(c)) for c in ("idauc_lo", "idauc_hi")):
            ref_ci = f" [{float(ref_rows[0]['idauc_lo']):.3f}, {float(ref_rows[0]['idauc_hi']):.3f}]"
        delta = f"Δ {diff:+.3f} [{dlo:+.3f}, {dhi:+.3f}], {g['n_paired_images']} paired images" if has_ci else \
            f"Δ {diff:+.3f}, point decision: no per-image values"
        res.update(reference_check="above random" if above else "not above random",
                   text=(f"{self.reference} IDAUC {g['idauc_ref']:.3f}{ref_ci} {'above' if above else 'not above'} "
                         f"{random} {g['idauc']:.3f} ({delta})"),
                   ref_minus_random=diff, ref_minus_random_lo=dlo, ref_minus_random_hi=dhi)
        return res

    def no_reference_text(self, cell: tuple) -> str:
        """Why a cell has no reference: none at all, or only of another checkpoint."""
        n_by = len(self.cell) - len([c for c in self.cell if c in CHECKPOINT_COLUMNS])
        ident = [c for c in self.cell if c in CHECKPOINT_COLUMNS]
        others = sorted({c[n_by:] for c in self.ref_rows if c[:n_by] == cell[:n_by]})
        if not ident or not others:
            return f"no {self.reference!r} row in this cell"
        fmt = lambda t: ", ".join(f"{c}={v or '(not recorded)'}" for c, v in zip(ident, t))  # noqa: E731
        return (f"no {self.reference!r} row of {fmt(cell[n_by:])}; the reference rows of this cell are of "
                f"{' | '.join(fmt(o) for o in others)} (never compared across checkpoints)")


def _band_status(out: pd.DataFrame, band: float, checks: Mapping[tuple, Mapping[str, Any]], pairing: _Pairing) -> None:
    """Add ``in_band``, ``band_resolved``, ``status``, ``band_reason``, the reference check and
    ``D_cell`` to ``out`` (in place)."""
    has_d = out["D_pp"].notna() & out["delta_idauc"].notna()
    point = (out["delta_idauc"] >= -band - _BAND_EPS)
    out["in_band"] = pd.array([bool(p) if h else pd.NA for p, h in zip(point, has_d)], dtype="boolean")
    lo, hi = out["delta_idauc_lo"], out["delta_idauc_hi"]
    has_ci = has_d & lo.notna() & hi.notna()
    inside, outside = lo >= -band - _BAND_EPS, hi < -band - _BAND_EPS
    out["band_resolved"] = pd.array([bool(a or b) if c else pd.NA for a, b, c in zip(inside, outside, has_ci)],
                                    dtype="boolean")
    status, reason = [], []
    for k in range(len(out)):
        chk = checks[out["_pool"].iat[k]]
        text = chk["text"]
        if not out["has_reference"].iat[k]:
            st, text = "no reference", pairing.no_reference_text(out["_cell"].iat[k])
        elif not has_d.iat[k]:
            what = " and ".join(n for n, c in (("mIoU", "D_pp"), ("IDAUC", "delta_idauc"))
                                if not np.isfinite(out[c].iat[k]))
            st, text = "undefined", out["_why"].iat[k] or f"{what} is NaN"
        elif chk["reference_check"] == "not above random":
            st = "uninformative"
        else:
            st = (("in band" if inside.iat[k] else "outside band" if outside.iat[k] else "not resolved")
                  if has_ci.iat[k] else ("in band" if point.iat[k] else "outside band"))
        status.append(st)
        reason.append(text)
    out["status"], out["band_reason"] = status, reason
    for c in ("reference_check", "ref_minus_random", "ref_minus_random_lo", "ref_minus_random_hi"):
        out[c] = [checks[cell][c] for cell in out["_pool"]]
    out["D_cell"] = [_cell_text(d, s, r, band_resolution(a, b))
                     for d, s, r, a, b in zip(out["D_pp"], out["status"], out["band_reason"], lo, hi)]


def band_resolution(lo: float, hi: float) -> str:
    """``"this sample resolves |ΔIDAUC| ≥ 0.056"``: the half-width of the ΔIDAUC interval ``[lo, hi]``, the
    smallest distance from the band's edge its verdict can decide (DESIGN.md §6; decision 0071); ``""`` without
    an interval. A "not resolved" verdict then reads as what this sample cannot tell, with a number."""
    if not (is_finite_number(lo) and is_finite_number(hi)):
        return ""
    return f"this sample resolves |ΔIDAUC| ≥ {(float(hi) - float(lo)) / 2:.3f}"


def band_rule(band: float | None = None, short: bool = False) -> str:
    """The parity band and how a status reads its interval, in the one wording the notebooks, the report and the
    README print (decision 0085; DESIGN.md §6): the band ``ΔIDAUC ≥ −band`` (``None``: :data:`PARITY_BAND`), the
    four statuses of :func:`decoupling_D` and what :func:`band_resolution`'s "this sample resolves |ΔIDAUC| ≥ h"
    means; ``short``: the same statuses and h in one clause, for a table's introduction."""
    b = f"−{parity_band(band):g}"
    statuses = (f"in band — the whole interval at or above {b}; outside band — the whole interval below {b}; not "
                f"resolved — the interval straddles {b}; uninformative — the reference ranks tokens no better than "
                "random, so the band says nothing")
    h = f"h is the interval's half-width, the smallest distance from {b} this sample can decide"
    if short:
        return f"parity band ΔIDAUC ≥ {b}, by its paired 95 % interval: {statuses}; \"resolves ≥ h\": {h}"
    return (f"Parity band: ΔIDAUC = IDAUC − IDAUC(reference) ≥ {b} (a faithfulness gain always counts). The status "
            f"reads the paired 95 % interval of ΔIDAUC: {statuses}. \"This sample resolves |ΔIDAUC| ≥ h\": {h}.")


def _cell_text(d: float, s: str, reason: str, resolves: str) -> str:
    if s == "no reference":
        return "n/a (no reference)"
    if s == "undefined":
        return f"undefined ({reason})"
    unresolved = f" (band not resolved: {resolves})" if resolves else " (band not resolved)"
    return f"{d:+.2f}" + {"in band": "", "outside band": " (outside band)", "not resolved": unresolved,
                          "uninformative": " (band uninformative: reference not above random)"}[s]
