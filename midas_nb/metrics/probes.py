"""Cosine probes: how similar are the token rankings of two supervision targets?

MIDAS (DESIGN.md §8) reports that the hidden-gradient and attention-gradient rankings are
nearly unrelated ("cosine ≤ 0.082"): the targets that move part coverage (T4, T5: gradients
at the hidden states) and the ones that track faithfulness (T2, T3: gradients at the
attention) rank tokens differently. This module measures that, for every pair of target maps,
at one depth or across depths.

The similarity of two maps ``a, b ∈ R^N`` of one image is a cosine *after centring* — the
choice is ``mode``:

- ``"rank"`` (default) — cosine of the centred ranks (ties get their average rank), i.e.
  Spearman's ρ (Spearman, 1904). A ranking is what top-k pruning consumes, and ranks make the
  probe invariant to monotone rescaling and robust to the heavy tails of gradient maps (one
  outlier token would otherwise dominate). It is the literal reading of "cosine between
  rankings".
- ``"centered"`` — cosine of the per-image centred maps = Pearson's r (z-scoring first gives
  the same number: cosine is scale-invariant).
- ``"raw"`` — plain cosine of the maps. Not recommended for rankings: two non-negative maps
  (T0, T1, T3, rollout, …) always have a raw cosine ≥ 0 and usually well above 0.5, so a value
  near 0 — as the paper reports — cannot arise; it is kept for comparison with the literature.

Centring is what makes unrelated rankings score ≈ 0 and reversed ones −1. The per-image value
is undefined (NaN) when either centred map is constant (e.g. a map of zeros); such images are
left out of that pair's mean and counted (``n_images``). The reported value is the mean over
images of the per-image cosines, with a percentile-bootstrap CI over images
(:func:`midas_nb.metrics.bootstrap_ci`).

Example::

    >>> maps = study.target_maps(ids=["T0", "T2", "T3", "T4", "T5"])   # {id: [M, N]}
    >>> mean, lo, hi = cosine_matrix(maps)                              # ids × ids DataFrames
    >>> hidden_vs_attention_gradient(maps)                              # T5·T3, T4·T2, ...
"""
from __future__ import annotations

import itertools
import math
from typing import Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from scipy.stats import rankdata
from torch import Tensor

from . import bootstrap_ci

__all__ = ["CosineMode", "HIDDEN_GRADIENT_TARGETS", "ATTENTION_GRADIENT_TARGETS", "per_image_cosine", "cosine_matrix",
           "cosine_across_depths", "hidden_vs_attention_gradient"]

CosineMode = Literal["rank", "centered", "raw"]

#: targets whose signal is the gradient at the hidden states (DESIGN.md §4)
HIDDEN_GRADIENT_TARGETS: tuple[str, ...] = ("T5", "T4")
#: targets whose signal is the gradient at the attention probabilities (DESIGN.md §4)
ATTENTION_GRADIENT_TARGETS: tuple[str, ...] = ("T3", "T2")

_MODES = ("rank", "centered", "raw")


def _as_matrix(x: Tensor | np.ndarray, name: str) -> np.ndarray:
    """``[M, N]`` float64 numpy copy of a map (on any device)."""
    if isinstance(x, Tensor):
        x = x.detach().to("cpu").double().numpy()
    a = np.asarray(x, dtype=np.float64)
    if a.ndim != 2:
        raise ValueError(f"map {name!r} must be [M, N] (images × patch tokens), got shape {a.shape}")
    if not np.isfinite(a).all():
        raise ValueError(f"map {name!r} has {int((~np.isfinite(a)).sum())} non-finite values")
    return a


def _prepare(a: np.ndarray, mode: CosineMode) -> np.ndarray:
    """Rows transformed for the cosine: ranks and/or centring, per image."""
    if mode not in _MODES:
        raise ValueError(f"unknown cosine mode {mode!r}; expected one of {_MODES}")
    if mode == "raw":
        return a
    constant = np.ptp(a, axis=1) == 0
    if mode == "rank":
        a = rankdata(a, method="average", axis=1)
    a = a - a.mean(axis=1, keepdims=True)
    a[constant] = 0.0  # exactly zero, not rounding noise, so the cosine is flagged undefined
    return a


def _row_cosine(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Cosine of matching rows of two prepared ``[M, N]`` arrays; NaN where a row is zero."""
    na = np.linalg.norm(a, axis=1)
    nb = np.linalg.norm(b, axis=1)
    dot = (a * b).sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = dot / (na * nb)
    bad = (na == 0) | (nb == 0)
    cos = np.clip(cos, -1.0, 1.0)
    cos[bad] = np.nan
    return cos


def per_image_cosine(a: Tensor | np.ndarray, b: Tensor | np.ndarray, mode: CosineMode = "rank") -> np.ndarray:
    """Per-image cosine similarity of two target maps.

    Args:
        a, b: ``[M, N]`` maps (M images, N patch tokens), same shape, any device.
        mode: ``"rank"`` (Spearman ρ), ``"centered"`` (Pearson r) or ``"raw"`` (module docstring).

    Returns:
        ``[M]`` float64 array in ``[-1, 1]``; NaN for images where either map is constant
        (``"rank"``/``"centered"``) or zero (``"raw"``).

    Raises:
        ValueError: shapes differ or are not 2-D, non-finite values, unknown ``mode``.
    """
    a, b = _as_matrix(a, "a"), _as_matrix(b, "b")
    if a.shape != b.shape:
        raise ValueError(f"maps must have the same [M, N] shape, got {a.shape} and {b.shape}")
    return _row_cosine(_prepare(a, mode), _prepare(b, mode))


def _summary(values: np.ndarray, bootstrap: int, alpha: float, seed: int) -> tuple[float, float, float, int]:
    n = int((~np.isnan(values)).sum())
    if bootstrap > 0:
        mean, lo, hi = bootstrap_ci(values, n_boot=bootstrap, alpha=alpha, seed=seed)
    else:
        v = values[~np.isnan(values)]
        mean, lo, hi = (float(v.mean()) if v.size else math.nan), math.nan, math.nan
    return mean, lo, hi, n


def cosine_matrix(maps: Mapping[str, Tensor | np.ndarray], *, ids: Sequence[str] | None = None,
                  mode: CosineMode = "rank", bootstrap: int = 1000, alpha: float = 0.05,
                  seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame]:
    """Mean per-image cosine between every pair of target maps, with bootstrap CIs over images.

    Args:
        maps: ``{target id: [M, N]}`` at one depth, all over the same images in the same order
            (e.g. :func:`midas_nb.targets.target_cache`).
        ids: which maps and their order; default all, in ``maps``' order.
        mode: per-image similarity (module docstring); default ``"rank"`` (Spearman ρ).
        bootstrap: bootstrap resamples for the CI; ``0`` gives NaN bounds.
        alpha: CI level ``1 − alpha``.
        seed: bootstrap seed (the same for every pair).

    Returns:
        ``(mean, lo, hi)``: symmetric ``ids × ids`` DataFrames. ``mean.attrs`` holds
        ``n_images`` (an ``ids × ids`` DataFrame of images with a defined cosine), ``mode`` and
        ``num_images`` (M).

    Raises:
        ValueError: fewer than one map, unknown ids, maps of different shapes.
    """
    ids = list(maps) if ids is None else list(ids)
    if not ids:
        raise ValueError("cosine_matrix needs at least one map")
    missing = [i for i in ids if i not in maps]
    if missing:
        raise ValueError(f"ids {missing} not in maps (have {list(maps)})")
    arrays = {i: _as_matrix(maps[i], i) for i in ids}
    shapes = {i: a.shape for i, a in arrays.items()}
    if len(set(shapes.values())) != 1:
        raise ValueError(f"all maps must share one [M, N] shape, got {shapes}")
    prepared = {i: _prepare(a, mode) for i, a in arrays.items()}
    k = len(ids)
    mean, lo, hi = (np.full((k, k), np.nan) for _ in range(3))
    count = np.zeros((k, k), dtype=int)
    for x, y in itertools.combinations_with_replacement(range(k), 2):
        cos = _row_cosine(prepared[ids[x]], prepared[ids[y]])
        m, l, h, n = _summary(cos, bootstrap, alpha, seed)
        mean[x, y] = mean[y, x] = m
        lo[x, y] = lo[y, x] = l
        hi[x, y] = hi[y, x] = h
        count[x, y] = count[y, x] = n
    frames = [pd.DataFrame(v, index=ids, columns=ids) for v in (mean, lo, hi)]
    frames[0].attrs.update(n_images=pd.DataFrame(count, index=ids, columns=ids), mode=mode,
                           num_images=int(next(iter(shapes.values()))[0]))
    return frames[0], frames[1], frames[2]


def cosine_across_depths(maps_by_depth: Mapping[int, Mapping[str, Tensor | np.ndarray]],
                         pairs: Sequence[tuple[str, str]] | None = None, *, mode: CosineMode = "rank",
                         bootstrap: int = 1000, alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """The pairwise cosine probe at each depth ``L``.

    Args:
        maps_by_depth: ``{L: {target id: [M, N]}}``.
        pairs: ``(a, b)`` id pairs; default every pair (``a`` before ``b``) of the ids present at
            all depths, in the first depth's order.
        mode, bootstrap, alpha, seed: as :func:`cosine_matrix`.

    Returns:
        Long DataFrame, one row per (depth, pair): ``depth, a, b, cosine, lo, hi, n_images,
        mode``, sorted by depth then pair order.

    Raises:
        ValueError: no depths, a pair naming a map missing at some depth, bad shapes.
    """
    if not maps_by_depth:
        raise ValueError("cosine_across_depths needs at least one depth")
    depths = sorted(maps_by_depth)
    if pairs is None:
        first = list(maps_by_depth[depths[0]])
        common = [i for i in first if all(i in maps_by_depth[L] for L in depths)]
        pairs = list(itertools.combinations(common, 2))
    rows = []
    for L in depths:
        maps = maps_by_depth[L]
        for a, b in pairs:
            if a not in maps or b not in maps:
                raise ValueError(f"pair ({a!r}, {b!r}) not available at depth {L} (have {list(maps)})")
            cos = per_image_cosine(maps[a], maps[b], mode)
            m, l, h, n = _summary(cos, bootstrap, alpha, seed)
            rows.append(dict(depth=int(L), a=a, b=b, cosine=m, lo=l, hi=h, n_images=n, mode=mode))
    return pd.DataFrame(rows, columns=["depth", "a", "b", "cosine", "lo", "hi", "n_images", "mode"])


def hidden_vs_attention_gradient(
    maps: Mapping[str, Tensor | np.ndarray] | Mapping[int, Mapping[str, Tensor | np.ndarray]], *,
    hidden: Sequence[str] = HIDDEN_GRADIENT_TARGETS, attention: Sequence[str] = ATTENTION_GRADIENT_TARGETS,
    mode: CosineMode = "rank", bootstrap: int = 1000, alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Cosine between hidden-gradient and attention-gradient target rankings (MIDAS: ≤ 0.082).

    Every ``hidden × attention`` pair — by default T5·T3 (input×gradient vs Chefer GAE, the pair
    the notebooks call out), T5·T2, T4·T3, T4·T2 — at one depth or at each depth.

    Args:
        maps: ``{id: [M, N]}`` at one depth, or ``{L: {id: [M, N]}}``.
        hidden, attention: the two groups of target ids.
        mode, bootstrap, alpha, seed: as :func:`cosine_matrix`.

    Returns:
        ``depth`` (NaN for a single depth), ``hidden``, ``attention``, ``cosine``, ``lo``, ``hi``,
        ``n_images``, ``mode``; ``attrs["max_abs"]`` = the largest ``|cosine|`` (the number the
        paper bounds).
    """
    by_depth = all(isinstance(v, Mapping) for v in maps.values()) and len(maps) > 0
    data = maps if by_depth else {-1: maps}
    pairs = [(h, a) for h in hidden for a in attention]
    df = cosine_across_depths(data, pairs, mode=mode, bootstrap=bootstrap, alpha=alpha, seed=seed)
    df = df.rename(columns={"a": "hidden", "b": "attention"})
    if not by_depth:
        df["depth"] = math.nan
    df.attrs["max_abs"] = float(df["cosine"].abs().max()) if len(df) else math.nan
    return df
