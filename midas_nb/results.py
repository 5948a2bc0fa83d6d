"""The results table: one row per (dataset, backbone, condition, depth, budget, seed).

Every evaluation in midas_nb ends as rows of this table; analyses (D, seed spread,
deployment advice) and figures read it. Rows are built with :class:`ResultRow` (or plain
dicts) and :func:`make_table`, which validates the schema below, fills optional columns and
orders them. Columns outside the schema are allowed and kept after the schema columns.

Schema (``req`` = required in every row; others default as shown):

==================  =======  ====  =============================================================
column              dtype    req   meaning (unit)
==================  =======  ====  =============================================================
dataset             str      req   ``cub``, ``aircraft``, ``cars``, ``synthetic``
backbone            str      req   timm name or midas_nb backbone id
checkpoint_id       str      req   the fine-tuned, frozen backbone checkpoint (hash or file stem)
condition           str      req   ``reference``, ``unsupervised``, ``T1``..``T5``, scorer family
target              str            supervision target id (``T0`` for reference); ``""`` if none
relaxation          str            differentiable selection used in training; ``""`` if none
depth               int      req   ``L`` (1-based): the scorer reads block ``L``'s output
budget              float    req   ``b ∈ (0,1]``: keep ``ceil(b·N)`` patch tokens
seed                int      req   scorer-training seed
n_images            int      req   evaluation images (all of them, skipped ones included)
n_skipped_parts     int            images without a visible part (box), left out of ``miou``; 0
coverage_kind       str            ``"part mIoU"`` or ``"box coverage"``; ``"part mIoU"``
miou                float          mean part IoU (fraction in [0,1]); NaN
miou_lo, miou_hi    float          bootstrap 95% CI over images of ``miou``; NaN
idauc               float          insertion − deletion AUC of ``p_c``; NaN
idauc_lo, idauc_hi  float          bootstrap 95% CI over images of ``idauc``; NaN
ins_auc, del_auc    float          insertion / deletion AUC (``del_auc``: lower is better); NaN
accuracy            float          top-1 accuracy of the pruned model (fraction); NaN
accuracy_lo/_hi     float          bootstrap 95% CI of ``accuracy``; NaN
pib                 float          Point-in-Box rate (fraction), LaSt-ViT probe; NaN
throughput          float          pruned forward, images/s (device-synchronised); NaN
idauc_steps         int            ``S`` of the insertion/deletion curves; 0 when not measured
idauc_space         str            ``"token"`` or ``"pixel"``; ``"token"``
device              str            where metrics (throughput!) were measured; ``""``
versions            str            ``torch=…;timm=…;midas_nb=…``; filled by :func:`make_table`
==================  =======  ====  =============================================================

Files: :func:`save_table` writes ``<runs_dir>/<name>.csv`` (and ``.parquet`` when pyarrow is
importable) under :func:`midas_nb.config.runs_dir`; :func:`load_table` reads them back with
the schema's dtypes.
"""
from __future__ import annotations

import math
import re
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence

import numpy as np
import pandas as pd
from torch import Tensor

from . import config
from .metrics import COVERAGE_KINDS, InsDel, PartIoU, bootstrap_ci, decoupling_D

__all__ = [
    "side_by_side",
    "Column",
    "SCHEMA",
    "SCHEMA_COLUMNS",
    "REQUIRED_COLUMNS",
    "METRIC_COLUMNS",
    "ID_COLUMNS",
    "ResultRow",
    "current_versions",
    "summarise_metrics",
    "make_table",
    "validate_table",
    "aggregate_seeds",
    "PER_IMAGE_COLUMNS",
    "save_table",
    "load_table",
    "recommend_deployment",
    "GOALS",
]


@dataclass(frozen=True)
class Column:
    """One column of the results schema."""

    name: str
    dtype: Literal["str", "int", "float"]
    required: bool
    default: Any
    description: str


_NaN = math.nan
SCHEMA: tuple[Column, ...] = (
    Column("dataset", "str", True, None, "dataset name"),
    Column("backbone", "str", True, None, "backbone id"),
    Column("checkpoint_id", "str", True, None, "fine-tuned backbone checkpoint"),
    Column("condition", "str", True, None, "protocol condition"),
    Column("target", "str", False, "", "supervision target id"),
    Column("relaxation", "str", False, "", "differentiable selection"),
    Column("depth", "int", True, None, "scorer depth L (1-based)"),
    Column("budget", "float", True, None, "kept fraction b of patch tokens"),
    Column("seed", "int", True, None, "scorer-training seed"),
    Column("n_images", "int", True, None, "evaluation images"),
    Column("n_skipped_parts", "int", False, 0, "images without a visible part"),
    Column("coverage_kind", "str", False, "part mIoU", "part mIoU or box coverage"),
    Column("miou", "float", False, _NaN, "mean part IoU (fraction)"),
    Column("miou_lo", "float", False, _NaN, "bootstrap CI low of miou"),
    Column("miou_hi", "float", False, _NaN, "bootstrap CI high of miou"),
    Column("idauc", "float", False, _NaN, "insertion − deletion AUC"),
    Column("idauc_lo", "float", False, _NaN, "bootstrap CI low of idauc"),
    Column("idauc_hi", "float", False, _NaN, "bootstrap CI high of idauc"),
    Column("ins_auc", "float", False, _NaN, "insertion AUC"),
    Column("del_auc", "float", False, _NaN, "deletion AUC (lower is better)"),
    Column("accuracy", "float", False, _NaN, "pruned top-1 accuracy (fraction)"),
    Column("accuracy_lo", "float", False, _NaN, "bootstrap CI low of accuracy"),
    Column("accuracy_hi", "float", False, _NaN, "bootstrap CI high of accuracy"),
    Column("pib", "float", False, _NaN, "Point-in-Box rate (fraction)"),
    Column("throughput", "float", False, _NaN, "images/s of the pruned forward"),
    Column("idauc_steps", "int", False, 0, "insertion/deletion steps S"),
    Column("idauc_space", "str", False, "token", "token or pixel"),
    Column("device", "str", False, "", "measurement device"),
    Column("versions", "str", False, None, "torch/timm/midas_nb versions"),
)
SCHEMA_COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA)
REQUIRED_COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA if c.required)
#: identity of a row apart from the seed (the default ``by`` of :func:`aggregate_seeds`)
ID_COLUMNS: tuple[str, ...] = ("dataset", "backbone", "checkpoint_id", "condition", "target",
                               "relaxation", "depth", "budget", "coverage_kind", "idauc_space")
#: point metrics aggregated over seeds
METRIC_COLUMNS: tuple[str, ...] = ("miou", "idauc", "ins_auc", "del_auc", "accuracy", "pib",
                                   "throughput")
_CI_METRICS = ("miou", "idauc", "accuracy")
#: per-image values stored in every protocol row (lists; ``image_ids`` for mIoU and accuracy,
#: ``idauc_image_ids`` for IDAUC): what the paired and seed × image intervals resample
PER_IMAGE_COLUMNS: tuple[str, ...] = ("image_ids", "miou_per_image", "accuracy_per_image",
                                      "idauc_image_ids", "idauc_per_image")
#: per-image value column → its image-id column
_PER_IMAGE_IDS = {"miou": "image_ids", "accuracy": "image_ids", "idauc": "idauc_image_ids"}
_BY_NAME = {c.name: c for c in SCHEMA}


def current_versions() -> str:
    """``"torch=<v>;timm=<v>;midas_nb=<v>"`` of the running environment."""
    import importlib.metadata as md

    import timm
    import torch

    try:
        own = md.version("midas_nb")
    except md.PackageNotFoundError:
        own = "unknown"
    return f"torch={torch.__version__};timm={timm.__version__};midas_nb={own}"


@dataclass
class ResultRow:
    """One row of the results table (see the module docstring for units).

    ``extras`` holds additional columns (e.g. ``lambda_ga``, ``scorer``); they are written
    after the schema columns. ``to_dict()`` flattens them in.
    """

    dataset: str
    backbone: str
    checkpoint_id: str
    condition: str
    depth: int
    budget: float
    seed: int
    n_images: int
    target: str = ""
    relaxation: str = ""
    n_skipped_parts: int = 0
    coverage_kind: str = "part mIoU"
    miou: float = _NaN
    miou_lo: float = _NaN
    miou_hi: float = _NaN
    idauc: float = _NaN
    idauc_lo: float = _NaN
    idauc_hi: float = _NaN
    ins_auc: float = _NaN
    del_auc: float = _NaN
    accuracy: float = _NaN
    accuracy_lo: float = _NaN
    accuracy_hi: float = _NaN
    pib: float = _NaN
    throughput: float = _NaN
    idauc_steps: int = 0
    idauc_space: str = "token"
    device: str = ""
    versions: str | None = None
    extras: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        extras = d.pop("extras")
        clash = set(extras) & set(d)
        if clash:
            raise ValueError(f"ResultRow.extras repeats schema column(s) {sorted(clash)}")
        d.update(extras)
        return d


def summarise_metrics(
    coverage: PartIoU | None = None,
    insdel: InsDel | None = None,
    correct: Tensor | np.ndarray | None = None,
    in_box: Tensor | np.ndarray | None = None,
    *,
    n_boot: int = 1000,
    alpha: float = 0.05,
    seed: int = 0,
) -> dict[str, Any]:
    """The metric columns of a row from per-image results, with seeded bootstrap CIs.

    Args:
        coverage: :func:`~midas_nb.metrics.part_miou` / ``box_coverage`` output → ``miou``,
            CI, ``n_skipped_parts``, ``coverage_kind``, ``n_images``.
        insdel: :func:`~midas_nb.metrics.insertion_deletion_auc` output → ``idauc`` with CI,
            ``ins_auc``, ``del_auc``, ``idauc_steps``, ``idauc_space``.
        correct: ``[B]`` per-image correctness of the pruned model → ``accuracy`` with CI.
        in_box: ``[B]`` :func:`~midas_nb.metrics.point_in_box` → ``pib``.
        n_boot, alpha, seed: :func:`~midas_nb.metrics.bootstrap_ci` settings.

    Returns:
        A dict to merge into a :class:`ResultRow` / row dict.
    """
    out: dict[str, Any] = {}

    def ci(name: str, values: Any) -> None:
        m, lo, hi = bootstrap_ci(values, n_boot=n_boot, alpha=alpha, seed=seed)
        out[name], out[f"{name}_lo"], out[f"{name}_hi"] = m, lo, hi

    if coverage is not None:
        ci("miou", coverage.per_image)
        out.update(n_images=coverage.n_images, n_skipped_parts=coverage.n_skipped,
                   coverage_kind=coverage.name)
    if insdel is not None:
        ci("idauc", insdel.idauc)
        out.update(ins_auc=float(insdel.ins_auc.float().mean()),
                   del_auc=float(insdel.del_auc.float().mean()),
                   idauc_steps=insdel.steps, idauc_space=insdel.space)
        out.setdefault("n_images", int(insdel.idauc.numel()))
    if correct is not None:
        c = correct.float() if isinstance(correct, Tensor) else np.asarray(correct, dtype=float)
        ci("accuracy", c)
        out.setdefault("n_images", int(len(c)))
    if in_box is not None:
        b = in_box.float() if isinstance(in_box, Tensor) else np.asarray(in_box, dtype=float)
        out["pib"] = float(b.mean())
    return out


def _cast(df: pd.DataFrame) -> pd.DataFrame:
    for c in SCHEMA:
        if c.dtype == "str":
            df[c.name] = df[c.name].fillna("").astype(str)
        elif c.dtype == "int":
            df[c.name] = pd.to_numeric(df[c.name]).astype("int64")
        else:
            df[c.name] = pd.to_numeric(df[c.name]).astype("float64")
    return df


def validate_table(table: pd.DataFrame) -> pd.DataFrame:
    """Check a frame against the schema; returns a copy with schema dtypes and column order.

    Optional columns that are absent are added with their defaults (``versions``: the running
    environment's).

    Raises:
        ValueError: a required column is missing, a required cell is empty, ``budget`` is
            outside ``(0,1]``, ``depth < 1``, ``n_images < 0`` or ``coverage_kind`` is not one
            of ``"part mIoU"`` / ``"box coverage"``.
    """
    df = table.copy()
    missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
    if missing:
        raise ValueError(f"results table is missing required column(s) {missing}; required: "
                         f"{list(REQUIRED_COLUMNS)}")
    for c in REQUIRED_COLUMNS:
        empty = df[c].isna() | (df[c].astype(str) == "")
        if empty.any():
            rows = list(df.index[empty][:5])
            raise ValueError(f"results table: required column {c!r} is empty in row(s) {rows}")
    for c in SCHEMA:
        if c.name not in df.columns:
            df[c.name] = current_versions() if c.name == "versions" else c.default
        elif c.name == "versions":
            df[c.name] = df[c.name].where(df[c.name].notna() & (df[c.name] != ""), current_versions())
        elif not c.required and c.default is not None:
            if c.dtype != "float":      # NaN is the float default anyway
                df[c.name] = df[c.name].where(df[c.name].notna(), c.default)
    df = _cast(df)
    bad = df[~((df["budget"] > 0) & (df["budget"] <= 1))]
    if len(bad):
        raise ValueError(f"budget must be in (0, 1], got {bad['budget'].tolist()[:5]}")
    if (df["depth"] < 1).any():
        raise ValueError(f"depth must be ≥ 1 (1-based block index), got {df['depth'].min()}")
    if (df["n_images"] < 0).any() or (df["n_skipped_parts"] < 0).any():
        raise ValueError("n_images and n_skipped_parts must be ≥ 0")
    kinds = set(df["coverage_kind"]) - set(COVERAGE_KINDS)
    if kinds:
        raise ValueError(f"coverage_kind must be one of {list(COVERAGE_KINDS)}, got {sorted(kinds)}")
    extras = [c for c in df.columns if c not in SCHEMA_COLUMNS]
    return df[list(SCHEMA_COLUMNS) + extras].reset_index(drop=True)


def make_table(rows: Iterable[ResultRow | Mapping[str, Any]]) -> pd.DataFrame:
    """Build the validated results table from :class:`ResultRow` s or dicts.

    Raises:
        ValueError: see :func:`validate_table`; also for an empty ``rows``.
    """
    dicts = [r.to_dict() if isinstance(r, ResultRow) else dict(r) for r in rows]
    if not dicts:
        raise ValueError("make_table: no rows")
    for i, d in enumerate(dicts):
        missing = [c for c in REQUIRED_COLUMNS if c not in d]
        if missing:
            raise ValueError(f"results row {i} is missing required column(s) {missing}; "
                             f"required: {list(REQUIRED_COLUMNS)}")
    return validate_table(pd.DataFrame(dicts))


def side_by_side(rows: Mapping[str, pd.DataFrame], columns: Sequence[str]) -> pd.DataFrame:
    """Mean of ``columns`` over each named set of result rows, one output row per name.

    For comparisons across tables (e.g. the ``random`` rows against the ``unsupervised`` rows
    of an ``st`` and a ``soft`` table). Means are unweighted over the rows given (seeds).

    Raises:
        ValueError: a set of rows is empty or lacks one of ``columns``.
    """
    out = {}
    for name, df in rows.items():
        missing = [c for c in columns if c not in df.columns]
        if len(df) == 0 or missing:
            raise ValueError(f"side_by_side: rows {name!r} are empty or lack columns {missing}; "
                             f"expected at least one row with {list(columns)}")
        out[name] = df[list(columns)].astype(float).mean()
    return pd.DataFrame(out).T


def aggregate_seeds(table: pd.DataFrame, by: Sequence[str] | None = None,
                    metrics: Sequence[str] = METRIC_COLUMNS, *, n_boot: int = 1000,
                    alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Mean, sample std (``ddof=1``; NaN for one seed) and count over seeds, per metric, with a
    confidence interval of the mean over seeds.

    For ``miou``, ``idauc`` and ``accuracy``, ``m_lo`` / ``m_hi`` is a ``(1−alpha)``
    percentile-bootstrap interval of the mean over seeds that accounts for both sources of
    variation: each resample draws the seeds with replacement and the test images with
    replacement (the same images for every seed), from the per-image values the protocol stores
    (:data:`PER_IMAGE_COLUMNS`; :func:`midas_nb.metrics.hierarchical_bootstrap`). With one
    seed it is the bootstrap over images. It is *not* the mean of the per-seed bounds. A group
    whose rows lack per-image values gets NaN bounds (``ci_method`` says which).

    Args:
        table: results rows.
        by: grouping columns; ``None`` → :data:`ID_COLUMNS` present in ``table``.
        metrics: metric columns to aggregate (those present are used).
        n_boot, alpha, seed: bootstrap resamples, level, RNG seed.

    Returns:
        One row per group: ``by``, ``n_seeds`` (rows in the group), ``seeds`` (sorted, as a
        string), ``n_images`` (mean), and for each metric ``m``: ``m_mean``, ``m_std``,
        ``m_n`` (non-NaN values); for ``miou``, ``idauc``, ``accuracy`` also ``m_lo`` /
        ``m_hi`` (above) and one ``ci_method`` column (``"seeds × images bootstrap"``,
        ``"images bootstrap (one seed)"`` or ``"unavailable: no per-image values"``).
    """
    from .metrics import _per_image, hierarchical_bootstrap

    by = [c for c in ID_COLUMNS if c in table.columns] if by is None else list(by)
    missing = [c for c in by if c not in table.columns]
    if missing:
        raise ValueError(f"aggregate_seeds: table is missing grouping column(s) {missing}")
    metrics = [m for m in metrics if m in table.columns]
    src = table.reset_index(drop=True)
    g = src.assign(_row=np.arange(len(src))).groupby(by, dropna=False, sort=False)
    spec: dict[str, tuple[str, Any]] = {"n_seeds": (metrics[0] if metrics else by[0], "size")}
    if "seed" in src.columns:
        spec["seeds"] = ("seed", lambda s: ",".join(str(x) for x in sorted(set(s))))
    if "n_images" in src.columns:
        spec["n_images"] = ("n_images", "mean")
    for m in metrics:
        spec[f"{m}_mean"] = (m, "mean")
        spec[f"{m}_std"] = (m, "std")
        spec[f"{m}_n"] = (m, "count")
    spec["_rows"] = ("_row", list)
    out = g.agg(**spec).reset_index()
    ci_metrics = [m for m in metrics if m in _CI_METRICS]
    methods = []
    for k, rows in enumerate(out["_rows"]):
        recs = [src.iloc[i].to_dict() for i in rows]
        method = "unavailable: no per-image values"
        for m in ci_metrics:
            maps = [_per_image(r, _PER_IMAGE_IDS[m], f"{m}_per_image") for r in recs]
            lo = hi = math.nan
            if maps and all(x is not None for x in maps):
                ids = sorted(set.intersection(*(set(x) for x in maps)))
                if ids:
                    mat = np.array([[x[i] for i in ids] for x in maps])
                    lo, hi = hierarchical_bootstrap(mat, n_boot, alpha, seed)
                    method = "seeds × images bootstrap" if len(recs) > 1 else "images bootstrap (one seed)"
            out.loc[k, f"{m}_lo"], out.loc[k, f"{m}_hi"] = lo, hi
        methods.append(method)
    if ci_metrics:
        out["ci_method"] = methods
    return out.drop(columns=["_rows"])


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _paths(name: str, runs_dir: str | Path | None) -> tuple[Path, Path]:
    if not _NAME_RE.match(name):
        raise ValueError(f"table name must be a plain file stem (letters, digits, . _ -), got {name!r}")
    root = Path(runs_dir) if runs_dir is not None else config.runs_dir()
    root.mkdir(parents=True, exist_ok=True)
    return root / f"{name}.csv", root / f"{name}.parquet"


def _has_pyarrow() -> bool:
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        return False
    return True


def save_table(table: pd.DataFrame, name: str, runs_dir: str | Path | None = None) -> Path:
    """Write ``table`` to ``<runs_dir>/<name>.csv`` (and ``.parquet`` if pyarrow is importable).

    ``runs_dir=None`` → :func:`midas_nb.config.runs_dir` (``runs/`` or ``MIDAS_RUNS_DIR``).
    Returns the CSV path.
    """
    from .identity import atomic_write_text

    csv, parquet = _paths(name, runs_dir)
    atomic_write_text(csv, _encode_lists(table).to_csv(index=False))
    if _has_pyarrow():
        from .identity import atomic_write
        enc = _encode_lists(table)
        atomic_write(parquet, lambda f: enc.to_parquet(f, index=False))
    return csv


def _encode_lists(table: pd.DataFrame) -> pd.DataFrame:
    """List-valued columns (the per-image values) as JSON text, so CSV and parquet keep them."""
    import json

    out = table.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda v: isinstance(v, (list, tuple))).any():
            out[c] = out[c].map(lambda v: json.dumps(list(v), allow_nan=True) if isinstance(v, (list, tuple)) else v)
    return out


def _decode_lists(df: pd.DataFrame) -> pd.DataFrame:
    """Inverse of :func:`_encode_lists` for the :data:`PER_IMAGE_COLUMNS`."""
    import json

    for c in PER_IMAGE_COLUMNS:
        if c in df.columns:
            df[c] = df[c].map(lambda v: json.loads(v) if isinstance(v, str) and v.startswith("[") else v)
    return df


def load_table(name: str, runs_dir: str | Path | None = None,
               format: Literal["auto", "csv", "parquet"] = "auto") -> pd.DataFrame:
    """Read a table written by :func:`save_table`.

    ``format="auto"`` prefers the parquet file (exact dtypes) when it exists and pyarrow is
    importable. Schema columns get the schema's dtypes back (empty strings stay ``""``).

    Raises:
        FileNotFoundError: when the file is absent.
    """
    csv, parquet = _paths(name, runs_dir)
    use_parquet = format == "parquet" or (format == "auto" and parquet.exists() and _has_pyarrow())
    path = parquet if use_parquet else csv
    if not path.exists():
        raise FileNotFoundError(f"no results table at {path}")
    if use_parquet:
        df = pd.read_parquet(path)
    else:
        # read every cell as text so that strings such as "None" or "" survive, then parse
        # the non-text columns ("" → NaN; "True"/"False" → bool)
        df = pd.read_csv(path, dtype=str, keep_default_na=False)
        text_cols = {c.name for c in SCHEMA if c.dtype == "str"}
        for c in df.columns:
            if c in text_cols:
                continue
            col = df[c].replace({"": np.nan})
            if set(col.dropna()) <= {"True", "False"} and col.notna().any():
                df[c] = col.map({"True": True, "False": False})
                continue
            try:
                df[c] = pd.to_numeric(col)
            except (ValueError, TypeError):
                pass
    if all(c in df.columns for c in SCHEMA_COLUMNS):
        df = _cast(df)
    return _decode_lists(df)


# ---------------------------------------------------------------------------------------------
# deployment advice
# ---------------------------------------------------------------------------------------------
GOALS = ("coverage-first", "faithfulness-first")


def _label(row: pd.Series) -> str:
    cond = str(row["condition"])
    tgt = str(row.get("target", "") or "")
    rel = str(row.get("relaxation", "") or "")
    s = cond if not tgt or tgt in ("nan", cond) else f"{cond} ({tgt})"
    return s if not rel or rel == "nan" else f"{s}, {rel}"


def _ci(row: pd.Series, m: str) -> str:
    lo, hi = row.get(f"{m}_lo", _NaN), row.get(f"{m}_hi", _NaN)
    if pd.isna(lo) or pd.isna(hi):
        return ""
    return f" [{lo:.3f}, {hi:.3f}]"


def recommend_deployment(
    table: pd.DataFrame,
    reference: str = "reference",
    band: float = 0.01,
    by: Sequence[str] | None = None,
    tie_tol: float = 1e-3,
    miou_unit: Literal["fraction", "percent"] = "fraction",
) -> tuple[pd.DataFrame, str]:
    """Which scorer to deploy, per cell, for a coverage-first and a faithfulness-first goal.

    Rules (per cell = dataset × backbone × depth × budget; seeds averaged as in
    :func:`~midas_nb.metrics.decoupling_D`):

    - **coverage-first**: the condition with the highest ``D_pp`` among those inside the IDAUC
      parity band by the point decision (``in_band``: ``delta_idauc ≥ −band``; the reference,
      ``D = 0``, is a candidate, so a scorer is only advised over it when it gains coverage at
      parity). Ties → higher IDAUC. When the pick's paired ΔIDAUC interval straddles the band
      edge (status ``"not resolved"``) the reason says so, with the interval.
      Fallback, when the cell has no reference row: the highest mIoU, ``fallback=True``.
    - **faithfulness-first**: the highest mean IDAUC; conditions within ``tie_tol`` of it
      (default 0.001, the precision IDAUC is reported to) are ties, broken by higher mIoU.

    When a goal has no candidate with defined values — every IDAUC is NaN (e.g. measured with
    ``idauc_steps=0``), or every mIoU is NaN — the row says **no recommendation** with the
    reason (``recommended=False``, empty condition) instead of picking from undefined numbers.

    Args:
        table: results rows (per seed); needs ``condition``, ``miou``, ``idauc``.
        reference, band, by, miou_unit: as in :func:`~midas_nb.metrics.decoupling_D`.
        tie_tol: IDAUC tie tolerance of the faithfulness-first rule.

    Returns:
        ``(advice, text)``: ``advice`` has one row per (cell, goal) with the evidence —
        ``goal``, cell and condition columns, ``recommended``, ``D_pp``, ``D_pp_lo``,
        ``D_pp_hi``, ``delta_idauc``, ``delta_idauc_lo``, ``delta_idauc_hi``, ``in_band``,
        ``status``, ``miou``, ``miou_lo``, ``miou_hi``, ``idauc``, ``idauc_lo``, ``idauc_hi``
        (intervals: :func:`aggregate_seeds`, seeds × images), ``n_seeds``, ``fallback``,
        ``reason``; ``text`` joins the one-line reasons.

    Raises:
        ValueError: for missing columns or an unknown ``miou_unit``.
    """
    by = [c for c in ("dataset", "backbone", "depth", "budget") if c in table.columns] \
        if by is None else list(by)
    key = [c for c in ("condition", "target", "relaxation") if c in table.columns]
    missing = [c for c in ["condition", "miou", "idauc"] + by if c not in table.columns]
    if missing:
        raise ValueError(f"recommend_deployment: table is missing column(s) {missing}")
    has_ref = bool((table["condition"] == reference).any())
    if has_ref:
        agg = decoupling_D(table, reference=reference, band=band, by=by, miou_unit=miou_unit)
    else:  # no reference anywhere: means only, D undefined (coverage-first falls back)
        agg = (table.groupby(by + key, dropna=False, sort=False)
               .agg(miou=("miou", "mean"), idauc=("idauc", "mean"), n_seeds=("miou", "size"))
               .reset_index())
        agg["D_pp"], agg["delta_idauc"] = _NaN, _NaN
        agg["in_band"] = pd.array([pd.NA] * len(agg), dtype="boolean")
        agg["status"] = "no reference"
    bounds = aggregate_seeds(table, by=by + key, metrics=("miou", "idauc"))
    cis = [c for c in ("miou_lo", "miou_hi", "idauc_lo", "idauc_hi") if c in bounds.columns]
    agg = agg.merge(bounds[by + key + cis], on=by + key, how="left")
    for c in ("miou_lo", "miou_hi", "idauc_lo", "idauc_hi", "D_pp_lo", "D_pp_hi", "delta_idauc_lo",
              "delta_idauc_hi"):
        if c not in agg.columns:
            agg[c] = _NaN

    rows: list[dict[str, Any]] = []
    groups = agg.groupby(by, dropna=False, sort=False) if by else [((), agg)]
    for cell_key, cell in groups:
        cell_key = cell_key if isinstance(cell_key, tuple) else (cell_key,)
        where = ", ".join(f"{c}={v}" for c, v in zip(by, cell_key))
        where = f" ({where})" if where else ""
        ident = dict(zip(by, cell_key))
        # coverage-first
        cell_has_ref = bool((cell["status"] != "no reference").any())
        if cell_has_ref:
            inside = cell[cell["in_band"].fillna(False).astype(bool) & cell["D_pp"].notna()]
            if len(inside):
                pick = inside.sort_values(["D_pp", "idauc"], ascending=False, kind="stable").iloc[0]
                unresolved = ""
                if pick.get("status") == "not resolved":
                    unresolved = (f"; band NOT RESOLVED: ΔIDAUC 95 % CI [{pick['delta_idauc_lo']:+.3f}, "
                                  f"{pick['delta_idauc_hi']:+.3f}] straddles -{band:g}")
                why = (f"highest D among in-band conditions: D={pick['D_pp']:+.2f} pp"
                       f"{_pp_ci(pick)}, ΔIDAUC={pick['delta_idauc']:+.3f} >= -{band:g}{unresolved}; "
                       f"mIoU {pick['miou']:.3f}{_ci(pick, 'miou')}")
                rows.append(_advice_row("coverage-first", ident, key, pick, False, where, why))
            else:
                undefined = sorted(set(cell.loc[cell["status"] == "undefined", key[0]].astype(str)))
                rows.append(_no_advice("coverage-first", ident, key, where,
                                       "the parity band is undefined for every condition (D or ΔIDAUC "
                                       f"is NaN: {', '.join(undefined) or 'all'}); measure IDAUC "
                                       "(idauc_steps ≥ 1) and part mIoU on images with visible parts"))
        else:
            ok = cell[cell["miou"].notna()]
            if len(ok):
                pick = ok.sort_values(["miou", "idauc"], ascending=False, kind="stable").iloc[0]
                why = (f"FALLBACK (no reference in this cell, D undefined): highest mIoU "
                       f"{pick['miou']:.3f}{_ci(pick, 'miou')}")
                rows.append(_advice_row("coverage-first", ident, key, pick, True, where, why))
            else:
                rows.append(_no_advice("coverage-first", ident, key, where,
                                       "no reference and every mIoU is NaN"))
        # faithfulness-first
        ok = cell[cell["idauc"].notna()]
        if len(ok):
            best = ok["idauc"].max()
            ties = ok[ok["idauc"] >= best - tie_tol]
            pick = ties.sort_values(["miou", "idauc"], ascending=False, kind="stable").iloc[0]
            tie_note = (f"; {len(ties)} conditions within {tie_tol:g} of the best IDAUC, "
                        f"highest mIoU {pick['miou']:.3f} breaks the tie") if len(ties) > 1 else ""
            why = f"highest IDAUC {pick['idauc']:.3f}{_ci(pick, 'idauc')}{tie_note}"
            rows.append(_advice_row("faithfulness-first", ident, key, pick, False, where, why))
        else:
            rows.append(_no_advice("faithfulness-first", ident, key, where,
                                   "IDAUC is NaN for every condition (not measured: idauc_steps=0 or "
                                   "max_idauc_images=0?)"))

    cols = ["goal"] + by + key + ["recommended"] + list(_EVIDENCE) + ["fallback", "reason"]
    advice = pd.DataFrame(rows)[cols]
    return advice, "\n".join(advice["reason"])


_EVIDENCE = ("D_pp", "D_pp_lo", "D_pp_hi", "delta_idauc", "delta_idauc_lo", "delta_idauc_hi", "in_band",
             "status", "miou", "miou_lo", "miou_hi", "idauc", "idauc_lo", "idauc_hi", "n_seeds")


def _pp_ci(row: pd.Series) -> str:
    lo, hi = row.get("D_pp_lo", _NaN), row.get("D_pp_hi", _NaN)
    return "" if pd.isna(lo) or pd.isna(hi) else f" [{lo:+.2f}, {hi:+.2f}]"


def _advice_row(goal: str, ident: dict, key: list[str], pick: pd.Series, fallback: bool, where: str,
                why: str) -> dict[str, Any]:
    return dict(goal=goal, **ident, **{k: pick[k] for k in key}, recommended=True,
                **{c: pick.get(c, _NaN) for c in _EVIDENCE}, fallback=fallback,
                reason=f"{goal}{where}: {_label(pick)} — {why}")


def _no_advice(goal: str, ident: dict, key: list[str], where: str, why: str) -> dict[str, Any]:
    return dict(goal=goal, **ident, **{k: "" for k in key}, recommended=False,
                **{c: _NaN for c in _EVIDENCE}, fallback=False,
                reason=f"{goal}{where}: no recommendation — {why}")
