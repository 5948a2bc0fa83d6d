"""Percentile bootstrap intervals: over images (:func:`bootstrap_ci`) and over seeds × images
(:func:`hierarchical_bootstrap`; Efron & Tibshirani, 1993, *An Introduction to the Bootstrap*,
ch. 13; Davison & Hinkley, 1997, §3.8), and the mean over a few seeds with a t-based seed
component (:func:`seed_image_interval`; Welch, 1947; Satterthwaite, 1946).

The only source of the package's confidence intervals: metrics rows (:mod:`midas_nb.results`),
the paired ΔIDAUC / D intervals (:func:`midas_nb.metrics.decoupling_D`), the probes and the
report use these two functions with a seeded numpy generator, so an interval is reproducible.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Sequence, TYPE_CHECKING

import numpy as np

if TYPE_CHECKING:                       # no torch at import: the report reads its tables without it
    from torch import Tensor

__all__ = ["bootstrap_ci", "hierarchical_bootstrap", "seed_image_interval", "SeedImageInterval", "is_finite_number",
           "interval_sign", "LEAD_DIGITS"]


def is_finite_number(v: Any) -> bool:
    """Whether ``v`` reads as a finite float (``None``, NaN, ±inf and non-numbers: ``False``)."""
    try:
        return v is not None and math.isfinite(float(v))
    except (TypeError, ValueError):
        return False


#: the decimals a difference of two fractions (mIoU, IDAUC, accuracy) is printed with, so the precision at which a
#: lead of one condition over another is decided: a bound that prints as ±0.000 touches 0 (decision 0085)
LEAD_DIGITS = 3


def interval_sign(lo: Any, hi: Any, digits: int | None = None) -> str:
    """``"positive"`` (whole interval above 0), ``"negative"``, ``"not resolved"`` (it holds 0) or
    ``"undefined"`` (a bound that is not a finite number). ``digits``: the bounds as printed with that many
    decimals, so an interval that reads ``[+0.000, +0.003]`` holds 0 (a lead or a tie: :data:`LEAD_DIGITS`)."""
    if not (is_finite_number(lo) and is_finite_number(hi)):
        return "undefined"
    lo, hi = (float(f"{float(v):.{digits}f}") if digits is not None else v for v in (lo, hi))
    return "positive" if lo > 0 else "negative" if hi < 0 else "not resolved"


def bootstrap_ci(values: Tensor | np.ndarray | Sequence[float], n_boot: int = 1000, alpha: float = 0.05,
                 seed: int = 0) -> tuple[float, float, float]:
    """Mean and percentile-bootstrap ``(1−alpha)`` CI over images, ignoring NaNs.

    Resamples the non-NaN values with replacement ``n_boot`` times (``numpy`` generator seeded
    by ``seed``) and takes the ``alpha/2`` and ``1−alpha/2`` quantiles of the resampled means
    (Efron & Tibshirani, 1993, ch. 13). A constant gives a zero-width interval; one value gives
    ``(v, v, v)``; no value gives ``(nan, nan, nan)``.

    Returns:
        ``(mean, lo, hi)`` as floats.
    """
    if not (0.0 < alpha < 1.0) or n_boot < 1:
        raise ValueError(f"need 0 < alpha < 1 and n_boot ≥ 1, got alpha={alpha}, n_boot={n_boot}")
    if hasattr(values, "detach"):       # a torch Tensor
        values = values.detach().float().cpu().numpy()
    v = np.asarray(values, dtype=np.float64).ravel()
    v = v[~np.isnan(v)]
    if v.size == 0:
        return math.nan, math.nan, math.nan
    mean = float(v.mean())
    rng = np.random.default_rng(seed)
    boot = np.empty(n_boot)
    step = max(1, 2_000_000 // v.size)                   # bound memory to ~16 MB of indices
    for i in range(0, n_boot, step):
        m = min(step, n_boot - i)
        boot[i:i + m] = v[rng.integers(0, v.size, size=(m, v.size))].mean(axis=1)
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2])
    return mean, float(lo), float(hi)


def hierarchical_bootstrap(values: np.ndarray, n_boot: int = 1000, alpha: float = 0.05, seed: int = 0,
                           resample_seeds: bool = True) -> tuple[float, float]:
    """Percentile bootstrap ``(1−alpha)`` interval of ``mean_s nanmean_i values[s, i]``.

    Each resample draws the seeds (rows) with replacement — when ``resample_seeds`` and there
    is more than one — and, independently, the images (columns) with replacement, *the same
    images for every seed* (the test images are one sample shared by all seeds), then takes the
    mean over the drawn seeds of the NaN-skipping mean over the drawn images. With one seed it
    is the ordinary bootstrap over images; passing paired differences ``x_t − x_ref`` of the
    same images makes it the paired bootstrap (Efron & Tibshirani, 1993, ch. 13; the two-stage
    resampling of Davison & Hinkley, 1997, §3.8). Counts are drawn as multinomial weights, so
    one resample costs two small matrix products.

    Args:
        values: ``[S, n]`` per-seed, per-image values (``NaN`` = image not counted for that seed).
        n_boot, alpha, seed: resamples, level, RNG seed (numpy ``default_rng``).
        resample_seeds: also resample the seeds (the interval then covers seed variation).

    Returns:
        ``(lo, hi)``; ``(nan, nan)`` when no value is finite.
    """
    stats = _resampled_means(values, n_boot, seed, resample_seeds)
    if stats is None or stats.size == 0:
        return math.nan, math.nan
    lo, hi = np.quantile(stats, [alpha / 2, 1 - alpha / 2])
    return float(lo), float(hi)


@dataclass(frozen=True)
class SeedImageInterval:
    """A ``(1−alpha)`` interval of the mean over builds of the mean over seeds of per-image means, and its parts."""

    mean: float
    lo: float
    hi: float
    per_seed: tuple[float, ...]     # d_s = nanmean_i values[s, i]
    var_seeds: float                # s²_units / U: the top level's component, builds' or seeds' (NaN for one unit)
    var_images: float               # image-bootstrap variance of the mean
    df: float                       # Welch–Satterthwaite degrees of freedom (NaN for one seed)
    n_images: int                   # images with at least one finite value
    method: str
    per_build: tuple[float, ...] = ()   # m_b = mean of the d_s of build b (sorted build labels)


def seed_image_interval(values: np.ndarray, n_boot: int = 1000, alpha: float = 0.05,
                        seed: int = 0, builds: Sequence[Any] | None = None) -> SeedImageInterval:
    """Mean over builds of the mean over seeds of per-image means, with a t-based top-level component.

    With ``d_s = nanmean_i values[s, i]`` (``S`` seeds, ``n`` images) and ``builds[s]`` the backbone
    build of row ``s`` (``None``: one build), the top-level units are the builds when there are
    ``B ≥ 2`` of them (``m_b = mean_{s ∈ b} d_s``, ``D̄ = mean_b m_b``: every build weighs the same),
    else the seeds (``m_s = d_s``, ``D̄ = mean_s d_s``). With ``U`` units:

    - ``U = 1`` (one build, one seed): the percentile bootstrap over images (:func:`hierarchical_bootstrap`);
    - ``U ≥ 2``: ``D̄ ± t_{ν, 1−alpha/2} · √(a + b)`` with ``a = s²_units / U`` (sample variance of
      the unit means, ``ddof = 1``) and ``b`` the variance over ``n_boot`` image resamples of ``D̄``
      (the same images for every row, rows fixed: the image component),
      ``ν = (a + b)² / (a²/(U−1) + b²/(n−1))`` (Welch–Satterthwaite; Satterthwaite, 1946; Welch,
      1947). Over builds, ``a`` is the ultimate-cluster estimator of a two-stage sample (Cochran,
      1977, *Sampling Techniques*, Theorem 10.2 with the first-stage fraction → 0): the spread of
      the build means already holds their seeds' spread, so the seed level adds no separate term;
      the images are shared by every build, so their component is not in that spread and is added
      (decision 0072). A percentile bootstrap that resamples 2 units covers the mean only about
      half the time (the range of two values); the t quantile with ``U − 1`` degrees of freedom
      accounts for estimating the unit variance from ``U`` values (decision 0007).

    Args:
        values: ``[S, n]`` per-seed, per-image values (``NaN`` = not counted); rows of all builds.
        n_boot, alpha, seed: image resamples, level, RNG seed.
        builds: ``S`` build labels, one per row (``None`` or one label: today's seeds × images interval).

    Returns:
        :class:`SeedImageInterval`; ``mean``/``lo``/``hi`` NaN when a seed has no finite value.

    Raises:
        ValueError: ``values`` not 2-D, ``builds`` not one label per row, ``alpha`` outside (0, 1)
        or ``n_boot < 2``.
    """
    from scipy.stats import t as student_t

    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"values must be [S, n] (seeds × images), got shape {x.shape}")
    if not (0.0 < alpha < 1.0) or n_boot < 2:
        raise ValueError(f"need 0 < alpha < 1 and n_boot ≥ 2, got alpha={alpha}, n_boot={n_boot}")
    S = x.shape[0]
    labels = [0] * S if builds is None else list(builds)
    if len(labels) != S:
        raise ValueError(f"builds must give one build per row: {len(labels)} labels for {S} rows")
    valid = np.isfinite(x)
    n = int(valid.any(axis=0).sum())
    cnt = valid.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        d = np.where(cnt > 0, np.where(valid, x, 0.0).sum(axis=1) / np.maximum(cnt, 1), np.nan)
    nan = math.nan
    if S == 0 or not np.isfinite(d).all():
        return SeedImageInterval(nan, nan, nan, tuple(map(float, d)), nan, nan, nan, n, "undefined")
    groups = [np.array([lb == b for lb in labels]) for b in sorted(set(labels))]
    B = len(groups)
    m = np.array([d[g].mean() for g in groups])          # build means (one build: its seed mean)
    units, U = (m, B) if B > 1 else (d, S)
    mean = float(m.mean())
    per_build = tuple(map(float, m))
    if U == 1:
        lo, hi = hierarchical_bootstrap(x, n_boot, alpha, seed)
        return SeedImageInterval(mean, lo, hi, (mean,), nan, nan, nan, n, "images bootstrap (one seed)", per_build)
    weights = sum(g / (B * g.sum()) for g in groups) if B > 1 else None    # D̄ = Σ_s w_s d_s
    boot = _resampled_means(x, n_boot, seed, resample_seeds=False, weights=weights)
    a = float(units.var(ddof=1)) / U
    b = float(boot.var(ddof=1)) if boot is not None and boot.size > 1 else 0.0
    num = a * a / (U - 1) + (b * b / (n - 1) if n > 1 and b > 0 else 0.0)
    df = (a + b) ** 2 / num if num > 0 else float(U - 1)
    half = float(student_t.ppf(1 - alpha / 2, df)) * math.sqrt(a + b) if a + b > 0 else 0.0
    top = f"{B} builds × seeds" if B > 1 else f"{S} seeds"
    return SeedImageInterval(mean, mean - half, mean + half, tuple(map(float, d)), a, b, df, n,
                             f"t over {top} (Welch–Satterthwaite df) + images bootstrap", per_build)

def _resampled_means(values: np.ndarray, n_boot: int, seed: int, resample_seeds: bool,
                     weights: np.ndarray | None = None) -> np.ndarray | None:
    """The finite resampled statistics of :func:`hierarchical_bootstrap` (``None``: no finite value);
    ``weights``: the seeds' fixed weights when they are not resampled (default equal)."""
    x = np.asarray(values, dtype=np.float64)
    if x.ndim != 2:
        raise ValueError(f"values must be [S, n] (seeds × images), got shape {x.shape}")
    valid = np.isfinite(x)
    if not valid.any():
        return None
    S, n = x.shape
    xv = np.where(valid, x, 0.0)
    rng = np.random.default_rng(seed)
    stats = np.empty(n_boot)
    chunk = max(1, min(n_boot, 4_000_000 // max(1, n)))
    for start in range(0, n_boot, chunk):
        m = min(chunk, n_boot - start)
        w = rng.multinomial(n, np.full(n, 1.0 / n), size=m).astype(np.float64)          # [m, n]
        if resample_seeds and S > 1:
            v = rng.multinomial(S, np.full(S, 1.0 / S), size=m).astype(np.float64)      # [m, S]
        else:
            v = np.tile(np.ones(S) if weights is None else np.asarray(weights, dtype=np.float64), (m, 1))
        num, den = w @ xv.T, w @ valid.T.astype(np.float64)                              # [m, S]
        with np.errstate(invalid="ignore", divide="ignore"):
            per_seed = num / den
        ok = den > 0
        v = np.where(ok, v, 0.0)
        with np.errstate(invalid="ignore", divide="ignore"):
            stats[start:start + m] = (v * np.where(ok, per_seed, 0.0)).sum(1) / v.sum(1)
    return stats[np.isfinite(stats)]
