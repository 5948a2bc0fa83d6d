"""Co-movement of coverage and faithfulness across conditions (half (c) of :func:`midas_nb.analysis.claim_verdict`).

Pearson ``r`` of the per-condition mean mIoU against mean IDAUC (DESIGN.md §6), with a bootstrap
interval that resamples the images (one draw shared by every condition, mIoU and IDAUC images
drawn independently), the backbone builds (one draw shared by every condition: each build is one
backbone all conditions are measured on; decision 0072) **and** each condition's seeds within a build
(decision 0073): two seeds that disagree widen the interval as they widen ``D``'s. ``r`` is computed a
second time without the control points (:data:`CONTROL_POINTS`): a correlation that is resolved with them
and not without them rests on the controls, not on the targets.
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


def _build(key: Any) -> Any:
    """The backbone build of a seed key (``(build, seed)``, :func:`midas_nb.analysis.per_seed_values`; a plain
    seed: 0)."""
    return key[0] if isinstance(key, tuple) else 0


def _boot_means(seeds: Mapping[str, Mapping[Any, Mapping[str, float]]], conds: Sequence[str], ids: Sequence[str],
                n_boot: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``(point [C], boot [B, C])``: each condition's mean over its seeds of its per-seed image mean, and the same
    with the images and the backbone builds (each one draw for all conditions: every condition is measured on the
    same images and builds) and each condition's seeds within a build resampled (decisions 0072, 0073)."""
    n = len(ids)
    wm = rng.multinomial(n, np.full(n, 1 / n), size=n_boot).astype(float)          # [B, n]
    builds = sorted({_build(k) for c in conds for k in seeds[c]})
    K = len(builds)     # one build: no draw (the intervals of one-build runs are as they were)
    wb = rng.multinomial(K, np.full(K, 1 / K), size=n_boot).astype(float) if K > 1 else np.ones((n_boot, 1))
    point, boot = [], []
    for c in conds:
        keys = sorted(seeds[c])
        m = _seed_matrix(seeds[c], ids)                                            # [S, n]
        ok = np.isfinite(m)
        point.append(float(np.mean([np.nanmean(r) for r in m])))
        with np.errstate(invalid="ignore", divide="ignore"):
            per_seed = (wm @ np.where(ok, m, 0.0).T) / (wm @ ok.T.astype(float))    # [B, S]
        num, den = np.zeros(n_boot), np.zeros(n_boot)
        for j, b in enumerate(builds):
            if cols := [i for i, k in enumerate(keys) if _build(k) == b]:
                s = len(cols)
                ws = rng.multinomial(s, np.full(s, 1 / s), size=n_boot) / s         # [B, s]
                num, den = num + wb[:, j] * np.nansum(per_seed[:, cols] * ws, axis=1), den + wb[:, j]
        with np.errstate(invalid="ignore", divide="ignore"):
            boot.append(num / den)
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
        miou, idauc: ``{condition: {(build, seed): {image_id: value}}}`` (a plain seed key: build 0)
            (:func:`midas_nb.analysis.per_seed_values`).
        exclude: conditions never counted (the random ranking: a lower bound, not a condition).
        n_boot, alpha, rng: bootstrap resamples, level, generator.

    Returns:
        ``r`` (of the means over seeds of the per-seed image means, on the images every condition
        measured), ``r_lo`` / ``r_hi``, ``n_builds`` (the builds resampled), ``resampled`` (what the
        interval resamples, in words), ``reading`` (``"move together"``, ``"trade off"``,
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
                           "excluded": sorted((set(miou) & set(idauc)) & set(exclude)),
                           "n_builds": (B := len({_build(k) for c in conds for k in miou[c]})),
                           "resampled": f"images{f', {B} builds' if B > 1 else ''} and seeds resampled"}
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
