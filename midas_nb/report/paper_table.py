"""The paper-shaped table: one row block per dataset × backbone, the paper's numbers
(:mod:`midas_nb.analysis.paper_reference`) beside ours (docs/decisions/0036-paper-shaped-table.md).
"""
from __future__ import annotations

import textwrap
from collections import Counter
from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from ..config import DATASET_NAMES, dataset_label
from ..metrics import decoupling_D
from ..results import coverage_name
from ..analysis.paper_reference import PAPER_SETTING, paper_status, paper_value
from ..study import grid_spans, ReportSettings, sweep_cells
from ..sweeps import ResultStore
from .tables import number_text

__all__ = ["paper_table", "paper_table_for", "format_paper_table", "CONDITION_ORDER"]

CONDITION_ORDER: tuple[str, ...] = ("reference", "unsupervised", "T1", "T2", "T3", "T4", "T5")
COLUMNS: list[str] = ["dataset", "backbone", "checkpoint_id", "coverage_kind", "condition", "miou", "idauc", "D_pp",
                      "D_pp_std", "delta_idauc", "status", "band_reason", "n_seeds", "paper_D_pp",
                      "paper_delta_idauc", "paper_status"]


def order_first(values: Sequence[str], first: Sequence[str]) -> list[str]:
    """The distinct ``values``: those in ``first`` in its order, then the others as they come."""
    values = list(dict.fromkeys(values))
    return [v for v in first if v in values] + [v for v in values if v not in first]


def paper_table(rows: pd.DataFrame, *, depth: int | None = None, budget: float | None = None,
                expected: Sequence[tuple[str, str]] | None = None,
                backbone_order: Sequence[str] | None = None, n_boot: int = 1000) -> pd.DataFrame:
    """Our rows at ``(depth, budget)`` (default the paper's point) in the paper's layout, the paper's values
    beside them: one row per dataset × backbone × condition (:data:`COLUMNS`), D and its band from
    :func:`midas_nb.metrics.decoupling_D` with ``n_boot`` resamples. An ``expected`` ``(dataset, backbone)`` block
    without rows gets one row with ``status = "no result"``; ``backbone_order`` orders the blocks; the paper's
    values stand beside DeiT-S/16 rows only, never at another ``(L, b)``. ValueError: rows lacking a needed column."""
    depth = int(PAPER_SETTING["depth"] if depth is None else depth)
    budget = float(PAPER_SETTING["budget"] if budget is None else budget)
    need = ["dataset", "backbone", "depth", "budget", "condition", "miou", "idauc"]
    if len(rows):
        if missing := [c for c in need if c not in rows.columns]:
            raise ValueError(f"paper_table: rows lack column(s) {missing}; have {list(rows.columns)}")
        at = rows[(rows["depth"].astype(int) == depth) & np.isclose(rows["budget"].astype(float), budget)]
    else:
        at = pd.DataFrame(columns=need)
    have = pd.DataFrame(columns=COLUMNS)
    if len(at) and (at["condition"] == "reference").any():
        have = decoupling_D(at, by=["dataset", "backbone", "depth", "budget"], n_boot=n_boot).reset_index(drop=True)
        kinds = at.groupby(["dataset", "backbone"])["coverage_kind"].first() if "coverage_kind" in at else {}
        have["coverage_kind"] = [kinds.get((d, b)) for d, b in zip(have["dataset"], have["backbone"])]
    present, n_at = set(zip(have["dataset"], have["backbone"])), Counter(zip(at["dataset"], at["backbone"]))
    extra = [dict(dataset=d, backbone=b, condition=None, status="no reference row" if n_at[d, b] else "no result")
             for d, b in expected or [] if (d, b) not in present]
    if extra:
        have = pd.concat([have, pd.DataFrame(extra)], ignore_index=True)
    if not len(have):
        return pd.DataFrame(columns=COLUMNS)
    on_paper = ((have["backbone"] == PAPER_SETTING["backbone"]) & (depth == PAPER_SETTING["depth"])
                & bool(np.isclose(budget, PAPER_SETTING["budget"])))
    for c in ("D_pp", "delta_idauc"):
        have[f"paper_{c}"] = pd.to_numeric([paper_value(str(k), str(d), c) if ok else None
                                            for k, d, ok in zip(have["condition"], have["dataset"], on_paper)],
                                           errors="coerce")
    have["paper_status"] = [paper_status(str(c), str(d)) if ok else None
                            for c, d, ok in zip(have["condition"], have["dataset"], on_paper)]
    have = have.assign(**{c: None for c in COLUMNS if c not in have.columns})
    rank = {"dataset": order_first(have["dataset"], DATASET_NAMES),
            "backbone": order_first(have["backbone"], list(backbone_order or [])),
            "condition": order_first([c for c in have["condition"] if c is not None], CONDITION_ORDER)}
    have = have.sort_values(list(rank), kind="stable",
                            key=lambda col: col.map(lambda v: rank[col.name].index(v) if v in rank[col.name] else -1))
    return have[COLUMNS].reset_index(drop=True)


def paper_table_for(profile: Mapping[str, Any]) -> pd.DataFrame:
    """:func:`paper_table` of the scale readout's cells of a profile's result store (a profile), each block expected."""
    s = ReportSettings.of(profile)
    prof = dict(s.values)
    rows = ResultStore(name=s.profile).results(sweep_cells(prof, "scale"))
    datasets, backbones = grid_spans(prof, "scale")
    return paper_table(rows, depth=s.point.depth, budget=float(s.point.budget), backbone_order=backbones,
                       expected=[(dataset_label(prof, d), b) for d in datasets for b in backbones], n_boot=s.bootstrap)


def format_paper_table(table: pd.DataFrame) -> str:
    """Plain text: one block per dataset × backbone (its coverage kind in the heading), a line per condition
    (pandas' ``to_string``), or the block's status where it has no rows."""
    if not len(table):
        return "paper table: no rows"
    fmt = {c: lambda x, f=f: number_text(x, f, "—") for c, f in (("miou", ".3f"), ("idauc", "+.3f"), ("D_pp", "+.2f"),
           ("delta_idauc", "+.3f"), ("paper_D_pp", "+.2f"), ("paper_delta_idauc", "+.3f"))}
    cols = ["condition", *fmt, "status"]
    blocks = []
    for (d, b), g in table.groupby(["dataset", "backbone"], sort=False):
        body = (str(g["status"].iloc[0]) if g["condition"].isna().all()
                else g[cols].to_string(index=False, formatters=fmt, na_rep="—"))
        blocks.append(f"{d} × {b}  ({coverage_name(g)})\n" + textwrap.indent(body, "    "))
    return "\n".join(blocks)
