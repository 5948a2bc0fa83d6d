"""What a reader sees of a results table: lines that state the sample (:func:`sample_note`), cells that read
``0.153 [0.148, 0.158]`` (:func:`compact`), long text shown whole (:func:`full_text`); decision 0043."""
from __future__ import annotations

import math
import re
from typing import Any, Mapping, Sequence

import pandas as pd

from .table import coverage_name

def format_ci(m: Any, lo: Any = math.nan, hi: Any = math.nan, fmt: str = ".3f", unit: str = "",
              edges: Sequence[float] = (0.0,)) -> str:
    """``"0.153 [0.148, 0.158]"``: ``m`` in ``fmt`` with ``unit``, then its interval where both bounds are numbers;
    ``"n/a"`` for ``None`` or NaN, ``str(m)`` for a non-number. A bound that would print onto one of ``edges``
    without lying on it gets up to three more decimals, then a strict mark (``>0.0``; decision 0090)."""
    try:
        if m is None or math.isnan(float(m)):
            return "n/a"
    except (TypeError, ValueError):
        return str(m)
    try:
        ci = "" if math.isnan(float(lo)) or math.isnan(float(hi)) else \
            f" [{_bound(float(lo), fmt, edges)}, {_bound(float(hi), fmt, edges)}]"
    except (TypeError, ValueError):
        ci = ""
    return f"{float(m):{fmt}}{unit}{ci}"


def _bound(v: float, fmt: str, edges: Sequence[float]) -> str:
    """``v`` in ``fmt``, on the same side of every edge as printed as it is (:func:`format_ci`)."""
    side = lambda x, e: (x > e) - (x < e)  # noqa: E731
    p = re.fullmatch(r"(.*\.)(\d+)f", fmt)
    for extra in range(4 if p else 1):
        text = f"{v:{p[1]}{int(p[2]) + extra}f}" if p else f"{v:{fmt}}"
        if not (bad := [e for e in edges if side(float(text), e) != side(v, e)]):
            return text
    return f"{'>' if v > bad[0] else '<'}{text}"


def _plain(v: Any) -> Any:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "—"
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _values(table: pd.DataFrame, col: str) -> list:
    return sorted({v for v in table[col].dropna().tolist()}) if col in table.columns else []


def _one(table: pd.DataFrame, col: str, fmt: Any = str) -> str | None:
    """The distinct values of ``col`` as ``fmt`` gives them, joined with ``", "``; ``None`` for none."""
    return ", ".join(str(fmt(x)) for x in v) if (v := _values(table, col)) else None


def _bootstrap(bootstrap: int | None) -> list[str]:
    return [] if bootstrap is None else [f"95 % CI: bootstrap over images, {int(bootstrap)} resamples"]


def _backbone(table: pd.DataFrame) -> list[str]:
    """``["backbone <name> (<checkpoint id, 12 digits>)"]``; ``[]`` without a backbone column."""
    if (bb := _one(table, "backbone")) is None:
        return []
    ck = _one(table, "checkpoint_id", lambda x: str(x)[:12])
    return [f"backbone {bb}" + (f" ({ck})" if ck else "")]


def _seeds_text(table: pd.DataFrame) -> str:
    """``seeds 0, 1``, or each seed set with its points (``seeds 0, 1 at (L=6, b=25%); seed 0 at 4 points``)."""
    named = lambda seeds: f"seed{'s' if len(seeds) > 1 else ''} " + ", ".join(str(s) for s in seeds)  # noqa: E731
    if not {"depth", "budget"} <= set(table.columns):
        return named([int(s) for s in _values(table, "seed")])
    groups: dict[tuple[int, ...], list[tuple[Any, Any]]] = {}
    for point, g in table.groupby(["depth", "budget"], sort=True):
        groups.setdefault(tuple(sorted({int(x) for x in g["seed"].dropna()})), []).append(point)
    if len(groups) == 1:
        return named(next(iter(groups)))
    where = {v: (", ".join(f"(L={int(L)}, b={float(b):.0%})" for L, b in ps) if len(ps) <= 2 else f"{len(ps)} points")
             for v, ps in groups.items()}
    return "; ".join(f"{named(v)} at {where[v]}" for v in sorted(groups, key=len, reverse=True))


def sample_note(table: pd.DataFrame) -> str:
    """One line stating a protocol table's sample and settings from its rows (images, IDAUC, seeds, scorers' training,
    relaxation, ``(L, b)``, backbone and checkpoint); ``ValueError`` for an empty table."""
    if table.empty:
        raise ValueError("sample_note: the table has no rows")
    parts = []
    if (n := _one(table, "n_images", int)) is not None:
        skipped = _values(table, "n_skipped_parts") or _values(table, "n_skipped")
        sk = "" if not skipped else f", {int(max(skipped))} skipped" if max(skipped) > 0 else ", none skipped"
        parts.append(f"{coverage_name(table)}: {n} test images{sk}")
    ni, steps = _one(table, "n_idauc_images", int), _one(table, "idauc_steps", int)
    if ni is not None:
        parts.append(f"IDAUC: {ni} images, {steps} steps" if steps else f"IDAUC: {ni} images")
    if _values(table, "seed"):
        parts.append(_seeds_text(table))
    trained = table[table["epochs"].fillna(0) > 0] if "epochs" in table.columns else table.iloc[0:0]
    if len(trained):
        parts.append(f"{_one(trained, 'scorer') or 'scorer'} scorers trained {_one(trained, 'epochs', int)} epochs")
        sup = trained[trained["lambda_ga"].fillna(0) > 0] if "lambda_ga" in trained.columns else trained.iloc[0:0]
        if len(sup):
            parts.append("λ = " + (_one(sup, "lambda_ga", lambda x: f"{float(x):g}") or "?"))
        if rel := [r for r in _values(trained, "relaxation") if r]:
            parts.append("relaxation " + "/".join(rel))
    d, b = _one(table, "depth", int), _one(table, "budget", lambda x: f"{float(x):.0%}")
    if d is not None or b is not None:
        parts.append(", ".join(x for x in (d and f"L = {d}", b and f"b = {b}") if x))
    return "; ".join(parts + _backbone(table))


def compact(table: pd.DataFrame, metrics: Sequence[str], *, index: str | Sequence[str] = "condition",
            digits: int = 3, signed: Sequence[str] = (), keep: Sequence[str] = (),
            bounds: Mapping[str, tuple[str, str]] | None = None) -> pd.DataFrame:
    """A reader's table indexed by ``index``: one column per metric, cells ``m [lo, hi]`` (value column ``m`` or
    ``m_mean``, bounds ``m_lo``/``m_hi`` or ``bounds[m]``; ``signed``: with a sign), then the ``keep`` columns
    present (NaN shows ``—``, whole floats as integers); all-NaN columns dropped. ``ValueError``: no value column."""
    index = [index] if isinstance(index, str) else list(index)
    out = table[index].copy()
    for m in metrics:
        if (col := m if m in table.columns else f"{m}_mean" if f"{m}_mean" in table.columns else None) is None:
            raise ValueError(f"compact: no column {m!r} or {m + '_mean'!r} in the table")
        if table[col].isna().all():
            continue
        nan = pd.Series(math.nan, index=table.index)
        lo, hi = (table.get(c, nan) for c in (bounds or {}).get(m, (f"{m}_lo", f"{m}_hi")))
        fmt = f"{'+' * (m in signed)}.{digits}f"
        out[m] = [format_ci(v, a, b, fmt) for v, a, b in zip(table[col].tolist(), lo, hi)]
    for k in keep:
        if k in table.columns and k not in out.columns and not table[k].isna().all():
            out[k] = table[k].to_numpy() if not table[k].isna().any() else [_plain(v) for v in table[k].tolist()]
    return out.set_index(index)


def probe_note(table: pd.DataFrame, *, bootstrap: int | None = None, depth: int | None = None) -> str:
    """One line stating the sample of :func:`midas_nb.metrics.probes.hidden_vs_attention_gradient` rows
    (``bootstrap=None``: no interval stated; ``depth``: where the rows lack it); ``ValueError`` for no rows."""
    if table.empty:
        raise ValueError("probe_note: the table has no rows")
    n = _one(table, "n_images", int)
    parts = [] if n is None else [f"{n} test images"]
    mode = _one(table, "mode") or "rank"
    what = f"{mode} cosine (Spearman ρ)" if mode == "rank" else f"{mode} cosine"
    d = _one(table, "depth", int) or (None if depth is None else f"{int(depth)}")
    parts.append(what + (f" of the targets at block L = {d}" if d else ""))
    return "; ".join(parts + _bootstrap(bootstrap) + _backbone(table))


class FullText:
    """``full_text(table)``: a table shown whole, as HTML and text (pandas' display cuts a cell at 50 characters)."""

    def __init__(self, table: pd.DataFrame):
        self.table = table

    def _repr_html_(self) -> str:
        return self.table.to_html()

    def __repr__(self) -> str:
        return self.table.to_string()


full_text = FullText


def images_note(table: pd.DataFrame, what: str, *, bootstrap: int | None = None) -> str:
    """``"12 test images; <what>; 95 % CI: ..."``; ``ValueError`` without rows or ``n_images``."""
    if table.empty or "n_images" not in table.columns:
        raise ValueError("images_note: the table has no rows or no n_images column")
    return "; ".join(p for p in [f"{_one(table, 'n_images', int)} test images", what, *_bootstrap(bootstrap)] if p)


def leaders(table: pd.DataFrame, value: str, *, name: str, lowest: bool = False) -> list[str]:
    """The ``name`` of the row with the highest ``value`` (``lowest``: the lowest), then of every row whose interval
    ``[<value>_lo, <value>_hi]`` overlaps the leader's. ``ValueError``: no such columns, or no row has a value."""
    for c in (value, name):
        if c not in table.columns:
            raise ValueError(f"leader_line: no column {c!r}; expected one of {list(table.columns)}")
    if (t := table[table[value].notna()].sort_values(value, ascending=lowest)).empty:
        raise ValueError(f"leader_line: no row has a value in {value!r}")
    lo, hi = (f"{value}_lo", f"{value}_hi") if {f"{value}_lo", f"{value}_hi"} <= set(t.columns) else (value, value)
    top = t.iloc[0]
    return [str(top[name])] + [str(r[name]) for _, r in t.iloc[1:].iterrows()
                               if not (float(r[lo]) > float(top[hi]) if lowest else float(r[hi]) < float(top[lo]))]


def leader_line(table: pd.DataFrame, value: str, *, name: str, what: str, digits: int = 3,
                signed: bool = False, lowest: bool = False) -> str:
    """:func:`leaders` in words: ``"<what>: T5 (0.037 [−0.004, 0.088]); not separated from T3; T2 (their intervals
    overlap T5's)"``; without interval columns only the leader. ``ValueError`` as :func:`leaders`."""
    first, *ties = leaders(table, value, name=name, lowest=lowest)
    top = table[table[name].astype(str) == first].iloc[0]
    lo, hi = f"{value}_lo", f"{value}_hi"
    ci = format_ci(top[value], top.get(lo, math.nan), top.get(hi, math.nan), f"{'+' * signed}.{digits}f")
    head = f"{what}: {first} ({ci})"
    if lo not in table.columns or hi not in table.columns or table[value].notna().sum() == 1:
        return head
    if not ties:
        return head + f"; its interval lies {'below' if lowest else 'above'} every other's"
    overlap = "its interval overlaps" if len(ties) == 1 else "their intervals overlap"
    return head + f"; not separated from {'; '.join(ties)} ({overlap} {first}'s)"


def band_checks(D: pd.DataFrame, reference: str = "reference") -> str:
    """The faithfulness check behind each parity band of a :func:`midas_nb.metrics.decoupling_D` table: a ``"band
    against <baseline>: ..."`` line per ``band_reason``/``band_reason_vs_<control>`` column, then "this sample
    resolves |ΔIDAUC| ≥ h" of the decided verdicts against ``reference`` (decision 0071); ``""``: neither."""
    cell = [c for c in ("dataset", "backbone", "depth", "budget") if c in D.columns]
    many = len(D[cell].drop_duplicates()) > 1 if cell else False
    cols = [("band_reason", reference)] + [(c, c[len("band_reason_vs_"):]) for c in D.columns
                                            if str(c).startswith("band_reason_vs_")]
    lines = []
    for col, name in cols:
        if col not in D.columns:
            continue
        status = D.get("status" if col == "band_reason" else f"status_vs_{name}", pd.Series("", index=D.index))
        texts: dict[str, None] = {}
        for k, (r, c, st) in enumerate(zip(D[col], D["condition"], status)):
            if c in (name, reference) or st in ("undefined", "no reference") or not (isinstance(r, str) and r):
                continue
            where = ", ".join(f"{n}={_plain(D[n].iat[k])}" for n in cell)
            texts[f"{where}: {r}" if many else r] = None
        if texts:
            lines.append(f"band against {name}: {' | '.join(texts)}")
    decided = D[(D["condition"] != reference) & D.get("status", pd.Series("", index=D.index)).isin(
        ["in band", "outside band", "not resolved"])] if "delta_idauc_lo" in D.columns else D.iloc[:0]
    h = ((decided["delta_idauc_hi"] - decided["delta_idauc_lo"]) / 2).dropna()
    if len(h):   # decision 0071
        lines.append("this sample resolves |ΔIDAUC| ≥ " + (f"{h.min():.3f}–{h.max():.3f} (by cell)" if many else
                     ", ".join(f"{v:.3f} ({c})" for c, v in zip(decided.loc[h.index, "condition"], h))))
    return "\n".join(lines)
