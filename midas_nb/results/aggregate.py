"""Means over builds and seeds with builds × seeds × images intervals (:func:`aggregate_seeds`)."""
from __future__ import annotations

import math
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..metrics import BUILD_COLUMN, CHECKPOINT_COLUMNS, per_image_values
from ..metrics.stats import is_finite_number, seed_image_interval
from .table import ID_COLUMNS, METRIC_COLUMNS

#: the metrics with an interval over seeds and images (the others get none) → their image-id column
_PER_IMAGE_IDS = {"miou": "image_ids", "accuracy": "image_ids", "idauc": "idauc_image_ids"}
#: each such metric's range, where its interval is cut (a t interval over two seeds can pass it)
_RANGE = {"miou": (0.0, 1.0), "accuracy": (0.0, 1.0), "idauc": (-1.0, 1.0)}


def aggregate_seeds(table: pd.DataFrame, by: Sequence[str] | None = None,
                    metrics: Sequence[str] = METRIC_COLUMNS, *, n_boot: int = 1000,
                    alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Mean, sample std and count over seeds of each metric present, per group of ``by`` (``None``: the
    :data:`ID_COLUMNS` present), the checkpoint columns added, or pooled where a ``build`` column is not in ``by``
    (one checkpoint per build, else ``ValueError``; decision 0072). For ``miou``, ``idauc`` and ``accuracy``,
    ``m_lo``/``m_hi`` is the ``(1−alpha)`` interval of the mean over seeds (``seed_image_interval``, decision 0007)
    on the images every seed measured, cut at the metric's range (one row: its own). Returns per group ``by``,
    ``n_seeds``, ``seeds``, ``n_images``, ``m_mean``, ``m_std``, ``m_n``, ``m_lo``, ``m_hi``, ``ci_method``;
    ``ValueError`` for a grouping column the table lacks."""
    # seeds of two checkpoints (or of one checkpoint id with other weights) are averaged only as two builds
    pooled, ident = BUILD_COLUMN in table.columns, [c for c in CHECKPOINT_COLUMNS if c in table.columns]
    by = [c for c in ID_COLUMNS if c in table.columns and not (pooled and c in ident)] if by is None else list(by)
    if missing := [c for c in by if c not in table.columns]:
        raise ValueError(f"aggregate_seeds: table is missing grouping column(s) {missing}")
    ident = [c for c in ident if c not in by]
    by += [] if pooled else ident
    metrics = [m for m in metrics if m in table.columns]
    src = table.assign(**{BUILD_COLUMN: table.get(BUILD_COLUMN, 0)}).fillna({BUILD_COLUMN: 0}).sort_values(
        BUILD_COLUMN, kind="stable").reset_index(drop=True)
    if pooled and ident and (src.astype({c: str for c in ident}).groupby(by + [BUILD_COLUMN], dropna=False)[ident]
                             .nunique().max(axis=1) > 1).any():
        raise ValueError("aggregate_seeds: a build of a group has rows of two checkpoints; expected one per build")
    g = src.assign(_row=np.arange(len(src))).groupby(by, dropna=False, sort=False)
    spec: dict[str, tuple[str, Any]] = {"n_seeds": (metrics[0] if metrics else by[0], "size")}
    spec.update({c: (c, "first") for c in ident if pooled})        # the lowest build's, as decoupling_D shows
    if "seed" in src.columns:
        spec["seeds"] = ("seed", lambda s: ",".join(str(x) for x in sorted(set(s))))
    if "n_images" in src.columns:
        spec["n_images"] = ("n_images", "mean")
    for m in metrics:
        spec.update({f"{m}_mean": (m, "mean"), f"{m}_std": (m, "std"), f"{m}_n": (m, "count")})
    spec["_rows"] = ("_row", list)
    out = g.agg(**spec).reset_index()
    ci_metrics = [m for m in metrics if m in _PER_IMAGE_IDS]
    methods = []
    for k, rows in enumerate(out["_rows"]):
        recs = [src.iloc[i].to_dict() for i in rows]
        method = "unavailable: no per-image values"
        for m in ci_metrics:
            maps = [per_image_values(r, _PER_IMAGE_IDS[m], f"{m}_per_image") for r in recs]
            lo, hi, own = math.nan, math.nan, [recs[0].get(f"{m}_lo"), recs[0].get(f"{m}_hi")]
            if len(recs) == 1 and maps[0] is not None and all(is_finite_number(v) for v in own):
                # one seed: the row's own bootstrap over its images (summarise_metrics), so the
                # condition's interval is the one its row shows, not a second draw of the same bootstrap
                lo, hi, method = max(float(own[0]), _RANGE[m][0]), min(float(own[1]), _RANGE[m][1]), \
                    "images bootstrap (one seed)"
            elif maps and all(x is not None for x in maps):
                ids = sorted(set.intersection(*(set(x) for x in maps)))
                if ids:
                    builds = [int(b) if is_finite_number(b := x.get(BUILD_COLUMN)) else 0 for x in recs]
                    r = seed_image_interval(np.array([[x[i] for i in ids] for x in maps]), n_boot, alpha, seed,
                                            builds if pooled else None)
                    lo, hi, method = max(r.lo, _RANGE[m][0]), min(r.hi, _RANGE[m][1]), r.method
            out.loc[k, f"{m}_lo"], out.loc[k, f"{m}_hi"] = lo, hi
        methods.append(method)
    if ci_metrics:
        out["ci_method"] = methods
    return out.drop(columns=["_rows"])

