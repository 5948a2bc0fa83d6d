"""Decoupling ``D`` (MIDAS, DESIGN.md §6): part-coverage gain over the reference at faithfulness parity, with paired intervals and the band status."""
from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd

from ..stats import hierarchical_bootstrap
from .registry import register_metric


DEFAULT_CELL = ("dataset", "backbone", "depth", "budget")
DEFAULT_CONDITION_KEY = ("condition", "target", "relaxation")
_BAND_EPS = 1e-12   # so that ΔIDAUC = −band computed in floating point counts as inside
#: the statuses :func:`decoupling_D` gives a (cell, condition)
D_STATUSES = ("in band", "outside band", "not resolved", "undefined", "no reference")


def _as_float_list(v: Any) -> list[float] | None:
    """A per-image list (JSON ``null`` → NaN), or ``None`` when the row has none."""
    if v is None or isinstance(v, float) and math.isnan(v):
        return None
    if isinstance(v, str):          # a table read back from CSV (results.load_table parses these)
        import json
        v = json.loads(v)
    try:
        return [math.nan if x is None else float(x) for x in v]
    except TypeError:
        return None


def _per_image(row: Mapping[str, Any], ids_col: str, val_col: str) -> dict[str, float] | None:
    """``{image_id: value}`` of one results row, or ``None`` when it has no per-image values."""
    ids, vals = row.get(ids_col), _as_float_list(row.get(val_col))
    if ids is None or vals is None or (isinstance(ids, float) and math.isnan(ids)):
        return None
    if isinstance(ids, str):
        import json
        ids = json.loads(ids)
    ids = [str(i) for i in ids]
    if len(ids) != len(vals) or not ids:
        return None
    return dict(zip(ids, vals))


def _paired_matrix(rows: list[Mapping[str, Any]], refs: list[Mapping[str, Any] | None],
                   ids_col: str, val_col: str) -> np.ndarray | None:
    """``[S, n]`` per-image differences condition − reference over the images every row shares;
    ``None`` when a row lacks per-image values or no image is shared. ``refs[s] is None``: no
    reference (values themselves)."""
    cond = [_per_image(r, ids_col, val_col) for r in rows]
    ref = [None if r is None else _per_image(r, ids_col, val_col) for r in refs]
    if any(c is None for c in cond) or any(rf is None and r is not None for rf, r in zip(ref, refs)):
        return None
    common = set(cond[0])
    for d in cond[1:] + [rf for rf in ref if rf is not None]:
        common &= set(d)
    ids = sorted(common)
    if not ids:
        return None
    out = np.array([[c[i] - (rf[i] if rf is not None else 0.0) for i in ids] for c, rf in zip(cond, ref)])
    return out


@register_metric("decoupling_D", higher_is_better=True, category="decoupling",
                 reference="MIDAS (DESIGN.md §6): D(t) = mIoU_t − mIoU_ref where "
                           "IDAUC_t − IDAUC_ref ≥ −0.01",
                 summary="part-coverage gain over the reference scorer at faithfulness parity")
def decoupling_D(
    table: pd.DataFrame,
    reference: str = "reference",
    band: float = 0.01,
    miou_col: str = "miou",
    idauc_col: str = "idauc",
    by: Sequence[str] | None = None,
    *,
    condition_cols: Sequence[str] = DEFAULT_CONDITION_KEY,
    seed_col: str = "seed",
    miou_unit: Literal["fraction", "percent"] = "fraction",
    per_seed: bool = False,
    n_boot: int = 1000,
    alpha: float = 0.05,
    ci_seed: int = 0,
) -> pd.DataFrame:
    """Decoupling ``D(t) = mIoU_t − mIoU_ref`` with the IDAUC parity band (MIDAS, DESIGN.md §6).

    Within each cell (``by``: dataset, backbone, depth, budget) every condition is compared with
    the reference condition (``condition == reference``, the training-free T0 scorer):

    - ``D_pp = mIoU_t − mIoU_ref`` in percentage points (×100 when ``miou_unit="fraction"``);
    - ``delta_idauc = IDAUC_t − IDAUC_ref`` (IDAUC units);
    - ``in_band = delta_idauc ≥ −band`` (asymmetric: faithfulness gains always count): the
      point decision; ``NA`` when ``delta_idauc`` is undefined (NaN).

    Differences are taken per seed when the reference has a row with the same seed in that
    cell (``ref_paired``), otherwise against the reference's mean over its seeds (the
    reference has no parameters, so one seed usually suffices). They are then aggregated
    over seeds: mean, sample std (``ddof=1``; NaN for one seed) and ``n_seeds``; ``in_band``
    of the aggregate uses the mean ``delta_idauc`` and ``in_band_frac`` is the fraction of
    seeds in the band. The reference itself appears with ``D_pp = 0``.

    **Intervals** (95 % for ``alpha=0.05``): ``D_pp_lo``/``D_pp_hi`` and
    ``delta_idauc_lo``/``delta_idauc_hi`` are *paired* percentile-bootstrap intervals of the
    aggregated differences: each resample draws the test images (the same images for the
    condition and its reference, matched by image id — so the image-to-image variation both
    share cancels) and, with several seeds, the seeds too (:func:`hierarchical_bootstrap`); the
    interval therefore covers image sampling and, over seeds, seed variation. They need the
    per-image columns the protocol stores (``image_ids``/``miou_per_image``,
    ``idauc_image_ids``/``idauc_per_image``); rows without them get NaN intervals.

    ``status`` — ``"undefined"`` when ``D_pp`` or ``delta_idauc`` is NaN (e.g. no IDAUC was
    measured, ``idauc_steps=0``, or no image had a visible part): never in or out of the band;
    ``"no reference"`` when the cell has no reference row; otherwise, with an interval,
    ``"in band"`` when the whole ΔIDAUC interval is ``≥ −band``, ``"outside band"`` when it is
    entirely below, ``"not resolved"`` when it straddles ``−band`` (``band_resolved`` False);
    without an interval the point decision (``band_resolved`` NA). Rows are never dropped.

    Args:
        table: results rows (``midas_nb.results`` schema or any frame with these columns).
        reference: the reference condition's name in ``condition_cols[0]``.
        band: the parity band (IDAUC units), default 0.01.
        miou_col, idauc_col: metric columns.
        by: cell columns; ``None`` → those of ``("dataset","backbone","depth","budget")``
            present in ``table``.
        condition_cols: columns identifying a condition inside a cell; the first must exist,
            the others are used where present.
        seed_col: the seed column (optional in ``table``).
        miou_unit: ``"fraction"`` (mIoU in [0,1]) or ``"percent"``.
        per_seed: return the per-row differences instead of the aggregate (intervals over
            images only).
        n_boot, alpha, ci_seed: bootstrap resamples, level and RNG seed of the intervals.

    Returns:
        One row per (cell, condition) with ``by``, the condition columns, ``D_pp``,
        ``D_pp_lo``, ``D_pp_hi``, ``D_pp_std``, ``delta_idauc``, ``delta_idauc_lo``,
        ``delta_idauc_hi``, ``delta_idauc_std``, ``n_seeds``, ``in_band`` (nullable boolean),
        ``band_resolved`` (nullable boolean), ``in_band_frac``, ``status`` (one of
        :data:`D_STATUSES`), ``D_cell`` (display string, e.g. ``"+2.11"``, ``"+1.49 (outside
        band)"``, ``"+0.40 (band not resolved)"``, ``"undefined (IDAUC is NaN)"``), ``miou``,
        ``idauc``, ``miou_ref``, ``idauc_ref``, ``ref_paired``, ``n_paired_images`` (images
        of the ΔIDAUC interval; 0 without one); metric columns keep the names
        ``miou``/``idauc`` whatever ``miou_col``/``idauc_col`` were.

    Raises:
        ValueError: for missing columns, an unknown ``miou_unit`` or no reference row at all.
    """
    by, key = _check_columns(table, reference, miou_col, idauc_col, by, condition_cols, miou_unit)
    cond_col = condition_cols[0]
    scale = 100.0 if miou_unit == "fraction" else 1.0
    has_seed = seed_col in table.columns
    cell = by + ["_cell"]
    df = _differences(table, cell, cond_col, reference, miou_col, idauc_col, seed_col if has_seed else None, scale)
    intervals = _PairedIntervals(table, df, cell, cond_col, reference, seed_col if has_seed else None,
                                 miou_col, idauc_col, scale, n_boot, alpha, ci_seed)
    if per_seed:
        out = df.copy()
        ci = pd.DataFrame([intervals(df.iloc[[k]]) for k in range(len(df))], index=df.index)
        out = pd.concat([out, ci], axis=1)
        out["n_seeds"] = 1
    else:
        out = _over_seeds(df, cell + key, band, intervals)
    _band_status(out, band)
    cols = by + key + [c for c in ("D_pp", "D_pp_lo", "D_pp_hi", "D_pp_std", "delta_idauc",
                                   "delta_idauc_lo", "delta_idauc_hi", "delta_idauc_std",
                                   "n_seeds", "in_band", "band_resolved", "in_band_frac", "status",
                                   "D_cell", "miou", "idauc", "miou_ref", "idauc_ref", "ref_paired",
                                   "n_paired_images")
                       if c in out.columns]
    if per_seed:
        cols = by + key + ([seed_col] if has_seed else []) + cols[len(by) + len(key):]
    result = out[cols].reset_index(drop=True)
    result.attrs["interval"] = (f"{100 * (1 - alpha):g} % paired percentile bootstrap over test images "
                                f"(and seeds when there are several), {n_boot} resamples")
    return result


# ----------------------------------------------------------------------------------------------
# the steps of decoupling_D


def _check_columns(table: pd.DataFrame, reference: str, miou_col: str, idauc_col: str, by: Sequence[str] | None,
                   condition_cols: Sequence[str], miou_unit: str) -> tuple[list[str], list[str]]:
    """``(cell columns, condition columns present)``; raises the errors of :func:`decoupling_D`."""
    if miou_unit not in ("fraction", "percent"):
        raise ValueError(f"miou_unit must be 'fraction' or 'percent', got {miou_unit!r}")
    cond_col = condition_cols[0]
    missing = [c for c in (cond_col, miou_col, idauc_col) if c not in table.columns]
    if by is None:
        by = [c for c in DEFAULT_CELL if c in table.columns]
    else:
        missing += [c for c in by if c not in table.columns]
    if missing:
        raise ValueError(f"decoupling_D: table is missing column(s) {missing}; has "
                         f"{list(table.columns)}")
    if not (table[cond_col] == reference).any():
        raise ValueError(f"decoupling_D: no reference row ({cond_col} == {reference!r}); "
                         f"conditions present: {sorted(table[cond_col].astype(str).unique())}")
    return list(by), [c for c in condition_cols if c in table.columns]


def _differences(table: pd.DataFrame, cell: list[str], cond_col: str, reference: str, miou_col: str,
                 idauc_col: str, seed_col: str | None, scale: float) -> pd.DataFrame:
    """Every row with its reference values (same seed when the reference has it, else the
    reference's mean) and ``D_pp``, ``delta_idauc``, ``ref_paired``, ``has_reference``;
    ``_row`` is the position in ``table``, ``_cell`` a constant key (for an empty ``by``)."""
    df = table.reset_index(drop=True).copy()
    df["_row"] = np.arange(len(df))
    df["_cell"] = 0                                      # a constant key when ``by`` is empty
    df = df.rename(columns={miou_col: "_m", idauc_col: "_i"})
    ref = df[df[cond_col] == reference]
    ref_mean = ref.groupby(cell, dropna=False)[["_m", "_i"]].mean().add_suffix("_refmean").reset_index()
    df = df.merge(ref_mean, on=cell, how="left")
    if seed_col is not None:
        ref_seed = (ref.groupby(cell + [seed_col], dropna=False)[["_m", "_i"]].mean()
                    .add_suffix("_refseed").reset_index())
        df = df.merge(ref_seed, on=cell + [seed_col], how="left")
        paired = df["_m_refseed"].notna() | df["_i_refseed"].notna()
        df["miou_ref"] = df["_m_refseed"].where(paired, df["_m_refmean"])
        df["idauc_ref"] = df["_i_refseed"].where(paired, df["_i_refmean"])
    else:
        paired = pd.Series(False, index=df.index)
        df["miou_ref"], df["idauc_ref"] = df["_m_refmean"], df["_i_refmean"]
    df["ref_paired"] = paired.astype(bool)
    df["miou"], df["idauc"] = df["_m"], df["_i"]
    df["D_pp"] = (df["miou"] - df["miou_ref"]) * scale
    df["delta_idauc"] = df["idauc"] - df["idauc_ref"]
    # a cell "has a reference" when it has a reference row, even if that row's values are NaN
    df = df.merge(ref[cell].drop_duplicates().assign(has_reference=True), on=cell, how="left")
    df["has_reference"] = df["has_reference"].fillna(False).astype(bool)
    return df.sort_values("_row").reset_index(drop=True)


class _PairedIntervals:
    """The paired bootstrap intervals of a group of rows (one condition of one cell, or one
    row): ``D_pp_lo``/``_hi``, ``delta_idauc_lo``/``_hi`` and ``n_paired_images``."""

    def __init__(self, table: pd.DataFrame, df: pd.DataFrame, cell: list[str], cond_col: str, reference: str,
                 seed_col: str | None, miou_col: str, idauc_col: str, scale: float, n_boot: int, alpha: float,
                 ci_seed: int) -> None:
        self.src, self.df, self.cell, self.seed_col = table.reset_index(drop=True), df, cell, seed_col
        self.scale, self.n_boot, self.alpha, self.ci_seed = scale, n_boot, alpha, ci_seed
        # per-image columns follow the metric columns' names (miou → miou_per_image, image_ids)
        self.pim = {"m": ("image_ids", f"{miou_col}_per_image"), "i": ("idauc_image_ids", f"{idauc_col}_per_image")}
        # the reference row(s) each condition row is paired with, as original rows of ``table``
        self.ref_rows: dict[tuple, list[int]] = {}
        for _, r in df[df[cond_col] == reference].iterrows():
            self.ref_rows.setdefault(tuple(r[c] for c in cell), []).append(int(r["_row"]))

    def reference_for(self, r: pd.Series) -> Mapping[str, Any] | None:
        """The reference row paired with row ``r`` (same seed, else the only one, else the
        per-image mean of the cell's reference rows); ``None`` without one."""
        cands = self.ref_rows.get(tuple(r[c] for c in self.cell), [])
        if not cands:
            return None
        src = self.src
        if self.seed_col is not None:
            same = [i for i in cands if self.df.at[i, self.seed_col] == r[self.seed_col]]
            if same:
                return src.iloc[same[0]].to_dict()
        if len(cands) == 1:
            return src.iloc[cands[0]].to_dict()
        # several unpaired reference rows: their per-image mean
        rows = [src.iloc[i].to_dict() for i in cands]
        out = dict(rows[0])
        for idc, vc in self.pim.values():
            maps = [_per_image(x, idc, vc) for x in rows]
            if any(m is None for m in maps):
                out[vc] = None
                continue
            ids = sorted(set.intersection(*(set(m) for m in maps)))
            out[idc], out[vc] = ids, [float(np.nanmean([m[i] for m in maps])) for i in ids]
        return out

    def __call__(self, members: pd.DataFrame) -> dict[str, Any]:
        rows = [self.src.iloc[int(i)].to_dict() for i in members["_row"]]
        refs = [self.reference_for(r) for _, r in members.iterrows()]
        out: dict[str, Any] = {}
        for tag, name, sc in (("m", "D_pp", self.scale), ("i", "delta_idauc", 1.0)):
            if any(rf is None for rf in refs):
                mat = None
            else:
                mat = _paired_matrix(rows, refs, *self.pim[tag])
            lo, hi = (hierarchical_bootstrap(mat, self.n_boot, self.alpha, self.ci_seed) if mat is not None
                      else (math.nan, math.nan))
            out[f"{name}_lo"], out[f"{name}_hi"] = lo * sc, hi * sc
            if tag == "i":
                out["n_paired_images"] = 0 if mat is None else int(mat.shape[1])
        return out


def _over_seeds(df: pd.DataFrame, group: list[str], band: float, intervals: _PairedIntervals) -> pd.DataFrame:
    """One row per (cell, condition): means and stds over seeds, ``n_seeds``, ``in_band_frac``
    and the intervals; a mean is NaN when any seed's difference is undefined."""
    g = df.groupby(group, dropna=False, sort=False)
    df["_in_point"] = (df["delta_idauc"] >= -band - _BAND_EPS).where(df["delta_idauc"].notna())
    out = g.agg(
        D_pp=("D_pp", "mean"), D_pp_std=("D_pp", "std"),
        delta_idauc=("delta_idauc", "mean"), delta_idauc_std=("delta_idauc", "std"),
        n_seeds=("D_pp", "size"), in_band_frac=("_in_point", "mean"),
        miou=("miou", "mean"), idauc=("idauc", "mean"),
        miou_ref=("miou_ref", "mean"), idauc_ref=("idauc_ref", "mean"),
        ref_paired=("ref_paired", "all"), has_reference=("has_reference", "all"),
        _rows=("_row", list),
    ).reset_index()
    # a mean over seeds is NaN when any seed's difference is undefined (never a silent subset)
    for c in ("D_pp", "delta_idauc"):
        bad = g[c].apply(lambda s: bool(s.isna().any())).to_numpy()
        out.loc[bad, c] = np.nan
    ci = pd.DataFrame([intervals(df[df["_row"].isin(rows)]) for rows in out["_rows"]], index=out.index)
    return pd.concat([out.drop(columns=["_rows"]), ci], axis=1)


def _band_status(out: pd.DataFrame, band: float) -> None:
    """Add ``in_band``, ``band_resolved``, ``status`` and ``D_cell`` to ``out`` (in place)."""
    has_d = out["D_pp"].notna() & out["delta_idauc"].notna()
    point = (out["delta_idauc"] >= -band - _BAND_EPS)
    out["in_band"] = pd.array([bool(p) if h else pd.NA for p, h in zip(point, has_d)], dtype="boolean")
    lo, hi = out["delta_idauc_lo"], out["delta_idauc_hi"]
    has_ci = has_d & lo.notna() & hi.notna()
    inside, outside = lo >= -band - _BAND_EPS, hi < -band - _BAND_EPS
    out["band_resolved"] = pd.array([bool(a or b) if c else pd.NA for a, b, c in zip(inside, outside, has_ci)],
                                    dtype="boolean")
    status = []
    for hr, hd, hc, ins, outs, p in zip(out["has_reference"], has_d, has_ci, inside, outside, point):
        if not hr:
            status.append("no reference")
        elif not hd:
            status.append("undefined")
        elif hc:
            status.append("in band" if ins else "outside band" if outs else "not resolved")
        else:
            status.append("in band" if p else "outside band")
    out["status"] = status
    out["D_cell"] = [_cell_text(d, s, m, i) for d, s, m, i in
                     zip(out["D_pp"], out["status"], out["D_pp"], out["delta_idauc"])]


def _cell_text(d: float, s: str, m: float, i: float) -> str:
    if s == "no reference":
        return "n/a (no reference)"
    if s == "undefined":
        what = " and ".join(n for n, v in (("mIoU", m), ("IDAUC", i)) if not np.isfinite(v)) or "D"
        return f"undefined ({what} is NaN)"
    return f"{d:+.2f}" + {"in band": "", "outside band": " (outside band)",
                          "not resolved": " (band not resolved)"}[s]
