"""Co-movement of coverage and faithfulness across conditions (half (c) of :func:`midas_nb.analysis.claim_verdict`).

Pearson ``r`` of the per-condition mean mIoU against mean IDAUC (DESIGN.md §6), with a bootstrap
interval that resamples the images (one draw shared by every condition, mIoU and IDAUC images
drawn independently) **and** each condition's seeds (decision 0073): two seeds that disagree widen
the interval as they widen ``D``'s. ``r`` is computed a second time without the control points
(:data:`CONTROL_POINTS`): a correlation that is resolved with them and not without them rests on
the controls, not on the targets.
"""
from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

__all__ = ["CONTROL_POINTS", "comovement"]

#: conditions without a supervision target's content: the falsifier and the random-map control
CONTROL_POINTS: tuple[str, ...] = ("unsupervised", "random_map")

_READING = {"positive": "move together", "negative": "trade off", "not resolved": "not resolved",
            "undefined": "undefined"}


def _seed_matrix(per_seed: Mapping[int, Mapping[str, float]], ids: Sequence[str]) -> np.ndarray:
    """``[S, n]`` values of each seed on ``ids`` (NaN where a seed did not measure an image)."""
    return np.array([[v.get(i, math.nan) for i in ids] for _, v in sorted(per_seed.items())], dtype=float)


def _boot_means(seeds: Mapping[str, Mapping[int, Mapping[str, float]]], conds: Sequence[str], ids: Sequence[str],
                n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(point [C], boot [B, C])``: each condition's mean over its seeds of its per-seed image mean,
    and the same with the images (one draw for all conditions) and each condition's seeds resampled."""
    n = len(ids)
    wm = rng.multinomial(n, np.full(n, 1 / n), size=n_boot).astype(float)          # [B, n]
    point, boot = [], []
    for c in conds:
        m = _seed_matrix(seeds[c], ids)                                            # [S, n]
        ok = np.isfinite(m)
        point.append(float(np.mean([np.nanmean(r) for r in m])))
        with np.errstate(invalid="ignore", divide="ignore"):
            per_seed = (wm @ np.where(ok, m, 0.0).T) / (wm @ ok.T.astype(float))    # [B, S]
        s = m.shape[0]
        ws = rng.multinomial(s, np.full(s, 1 / s), size=n_boot) / s                 # [B, S]
        boot.append(np.nansum(per_seed * ws, axis=1))
    return np.array(point), np.stack(boot, axis=1)


def _r(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """Pearson r along the last axis (rows: resamples)."""
    xc, yc = x - x.mean(-1, keepdims=True), y - y.mean(-1, keepdims=True)
    with np.errstate(invalid="ignore", divide="ignore"):
        return (xc * yc).sum(-1) / np.sqrt((xc ** 2).sum(-1) * (yc ** 2).sum(-1))


def _interval(r: float, boot: np.ndarray, alpha: float) -> dict[str, Any]:
    boot = boot[np.isfinite(boot)]
    lo, hi = (float(q) for q in np.quantile(boot, [alpha / 2, 1 - alpha / 2])) if boot.size else (math.nan, math.nan)
    sign = ("undefined" if not (np.isfinite(lo) and np.isfinite(hi)) else
            "positive" if lo > 0 else "negative" if hi < 0 else "not resolved")
    return {"r": r, "r_lo": lo, "r_hi": hi, "reading": _READING[sign]}


def comovement(miou: Mapping[str, Mapping[int, Mapping[str, float]]], idauc: Mapping[str, Mapping[int, Mapping[str, float]]],
               *, exclude: Sequence[str] = ("random",), n_boot: int = 1000, alpha: float = 0.05,
               rng: np.random.Generator | None = None) -> dict[str, Any]:
    """Correlation of coverage and faithfulness across conditions, with and without the control points.

    Args:
        miou, idauc: ``{condition: {seed: {image_id: value}}}``
            (:func:`midas_nb.analysis.per_seed_values`).
        exclude: conditions never counted (the random ranking: a lower bound, not a condition).
        n_boot, alpha, rng: bootstrap resamples, level, generator.

    Returns:
        ``r`` (of the means over seeds of the per-seed image means, on the images every condition
        measured), ``r_lo`` / ``r_hi``, ``reading`` (``"move together"``, ``"trade off"``,
        ``"not resolved"``, ``"undefined"``, with ``reason``), ``n_conditions``, ``conditions``,
        ``n_miou_images``, ``n_idauc_images``; ``without_controls``: the same four for the
        conditions other than :data:`CONTROL_POINTS` (``{}`` when fewer than 3 remain or none
        was left out), ``rests_on_controls``: resolved with them, not resolved without them, and
        ``excluded``: the conditions of ``exclude`` that had values (named beside the count).
    """
    rng = np.random.default_rng(0) if rng is None else rng
    conds = sorted((set(miou) & set(idauc)) - set(exclude))
    out: dict[str, Any] = {"n_conditions": len(conds), "conditions": conds, "r": math.nan, "r_lo": math.nan,
                           "r_hi": math.nan, "n_miou_images": 0, "n_idauc_images": 0, "reading": "undefined",
                           "without_controls": {}, "rests_on_controls": False,
                           "excluded": sorted((set(miou) & set(idauc)) & set(exclude))}
    if len(conds) < 3:
        out["reason"] = f"needs ≥ 3 conditions with per-image mIoU and IDAUC, found {len(conds)}"
        return out
    shared = [sorted(set.intersection(*(set().union(*map(set, m[c].values())) for c in conds))) for m in (miou, idauc)]
    out.update(n_miou_images=len(shared[0]), n_idauc_images=len(shared[1]))
    if not shared[0] or not shared[1]:
        out["reason"] = "no image shared by every condition"
        return out
    (pm, bm), (pf, bf) = (_boot_means(m, conds, ids, n_boot, rng) for m, ids in zip((miou, idauc), shared))
    out.update(_interval(float(_r(pm, pf)), _r(bm, bf), alpha))
    keep = [i for i, c in enumerate(conds) if c not in CONTROL_POINTS]
    if 3 <= len(keep) < len(conds):
        w = _interval(float(_r(pm[keep], pf[keep])), _r(bm[:, keep], bf[:, keep]), alpha)
        out["without_controls"] = {**w, "n_conditions": len(keep), "left_out": [c for c in conds if c in CONTROL_POINTS]}
        out["rests_on_controls"] = out["reading"] in ("move together", "trade off") and w["reading"] != out["reading"]
    return out
