"""The results table: its schema (one row per dataset, backbone, condition, depth, budget, seed), validation, means
over builds and seeds (:func:`aggregate_seeds`), and CSV files (per-image lists as JSON)."""
from __future__ import annotations

import contextlib
import json
import math
import re
from dataclasses import asdict, dataclass, field, fields, MISSING
from pathlib import Path
from typing import Any, Iterable, Literal, Mapping, Sequence, TYPE_CHECKING

import numpy as np
import pandas as pd

from .. import config
from ..identity import atomic_write_text
from ..metrics import bootstrap_ci, BUILD_COLUMN, CHECKPOINT_COLUMNS, per_image_values
from ..metrics.stats import is_finite_number, seed_image_interval

if TYPE_CHECKING:                       # no torch at import: the report reads its tables without it
    from torch import Tensor

    from ..metrics import InsDel, PartIoU


@dataclass(frozen=True)
class Column:
    """One column of the results schema (:data:`SCHEMA`)."""

    name: str
    dtype: Literal["str", "int", "float"]
    required: bool
    default: Any
    description: str


def _col(description: str, default: Any = MISSING) -> Any:
    return field(default=default, metadata={"description": description})


@dataclass(kw_only=True)
class ResultRow:
    """One row of the results table, :data:`SCHEMA` made from its fields (required: no default); ``extras``: more
    columns (``lambda_ga``, ``scorer``) that ``to_dict()`` flattens in after the schema's."""

    dataset: str = _col("``cub``, ``aircraft``, ``cars``, ``synthetic``")
    backbone: str = _col("timm name or midas_nb backbone id")
    checkpoint_id: str = _col("the fine-tuned, frozen backbone checkpoint (hash or file stem)")
    build: int = _col("the backbone's build: its fine-tuning seed, 0 the recipe's (decision 0072)", 0)
    condition: str = _col("``reference``, ``unsupervised``, ``T1``..``T5``, scorer family")
    target: str = _col('supervision target id (``T0`` for reference); ``""`` if none', "")
    relaxation: str = _col('differentiable selection used in training; ``""`` if none', "")
    depth: int = _col("``L`` (1-based): the scorer reads block ``L``'s output")
    budget: float = _col("``b ∈ (0,1]``: keep ``ceil(b·N)`` patch tokens")
    seed: int = _col("scorer-training seed")
    n_images: int = _col("evaluation images (all of them, skipped ones included)")
    n_skipped_parts: int = _col("images without a visible part (box), left out of ``miou``", 0)
    coverage_kind: str = _col('``"part mIoU"`` or ``"box coverage"``', "part mIoU")
    miou: float = _col("mean part IoU (fraction in [0,1])", math.nan)
    miou_lo: float = _col("bootstrap 95% CI over images of ``miou``, low end", math.nan)
    miou_hi: float = _col("bootstrap 95% CI over images of ``miou``, high end", math.nan)
    idauc: float = _col("insertion − deletion AUC of ``p_c``", math.nan)
    idauc_lo: float = _col("bootstrap 95% CI over images of ``idauc``, low end", math.nan)
    idauc_hi: float = _col("bootstrap 95% CI over images of ``idauc``, high end", math.nan)
    ins_auc: float = _col("insertion AUC", math.nan)
    del_auc: float = _col("deletion AUC (lower is better)", math.nan)
    accuracy: float = _col("top-1 accuracy of the pruned model (fraction)", math.nan)
    accuracy_lo: float = _col("bootstrap 95% CI of ``accuracy``, low end", math.nan)
    accuracy_hi: float = _col("bootstrap 95% CI of ``accuracy``, high end", math.nan)
    pib: float = _col("Point-in-Box rate (fraction), LaSt-ViT probe", math.nan)
    throughput: float = _col("pruned forward, images/s (device-synchronised)", math.nan)
    idauc_steps: int = _col("``S`` of the insertion/deletion curves; 0 when not measured", 0)
    idauc_space: str = _col("token or pixel", "token")
    device: str = _col("where metrics (throughput!) were measured", "")
    versions: str | None = _col("``torch=…;timm=…;midas_nb=…``; filled by :func:`make_table`", None)
    extras: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if clash := set(extras := d.pop("extras")) & set(d):
            raise ValueError(f"ResultRow.extras repeats schema column(s) {sorted(clash)}")
        return {**d, **extras}


#: the columns of the results table: :class:`ResultRow`'s fields, in order
SCHEMA: tuple[Column, ...] = tuple(
    Column(f.name, f.type.split(" |")[0], f.default is MISSING, None if f.default is MISSING else f.default,
           f.metadata["description"]) for f in fields(ResultRow) if f.name != "extras")

SCHEMA_COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA)
REQUIRED_COLUMNS: tuple[str, ...] = tuple(c.name for c in SCHEMA if c.required)

#: identity of a row apart from the seed (the default ``by`` of :func:`aggregate_seeds`)
ID_COLUMNS: tuple[str, ...] = ("dataset", "backbone", "checkpoint_id", "condition", "target",
                               "relaxation", "depth", "budget", "coverage_kind", "idauc_space")

#: point metrics aggregated over seeds
METRIC_COLUMNS: tuple[str, ...] = ("miou", "idauc", "ins_auc", "del_auc", "accuracy", "pib", "throughput")

#: per-image values stored in every protocol row (lists; ``image_ids`` for mIoU and accuracy,
#: ``idauc_image_ids`` for IDAUC): what the paired and seed × image intervals resample
PER_IMAGE_COLUMNS: tuple[str, ...] = ("image_ids", "miou_per_image", "accuracy_per_image",
                                      "idauc_image_ids", "idauc_per_image")


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


def summarise_metrics(coverage: PartIoU | None = None, insdel: InsDel | None = None,
                      correct: Tensor | np.ndarray | None = None, in_box: Tensor | np.ndarray | None = None, *,
                      n_boot: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict[str, Any]:
    """A row's metric columns (a dict) from per-image results, :func:`~midas_nb.metrics.bootstrap_ci` intervals:
    ``coverage`` (``part_miou`` / ``box_coverage``) → ``miou``, ``n_skipped_parts``, ``coverage_kind``, ``n_images``;
    ``insdel`` (``insertion_deletion_auc``) → ``idauc``, ``ins_auc``, ``del_auc``, ``idauc_steps``, ``idauc_space``;
    ``correct`` (``[B]`` per-image correctness) → ``accuracy``; ``in_box`` (``[B]`` ``point_in_box``) → ``pib``."""
    out: dict[str, Any] = {}
    floats = lambda x: x.float() if hasattr(x, "detach") else np.asarray(x, dtype=float)  # noqa: E731 (tensor/array)

    def ci(name: str, values: Any) -> None:
        out[name], out[f"{name}_lo"], out[f"{name}_hi"] = bootstrap_ci(values, n_boot=n_boot, alpha=alpha, seed=seed)

    if coverage is not None:
        ci("miou", coverage.per_image)
        out.update(n_images=coverage.n_images, n_skipped_parts=coverage.n_skipped, coverage_kind=coverage.name)
    if insdel is not None:
        ci("idauc", insdel.idauc)
        out.update(ins_auc=float(insdel.ins_auc.float().mean()), del_auc=float(insdel.del_auc.float().mean()),
                   idauc_steps=insdel.steps, idauc_space=insdel.space)
        out.setdefault("n_images", int(insdel.idauc.numel()))
    if correct is not None:
        ci("accuracy", c := floats(correct))
        out.setdefault("n_images", int(len(c)))
    if in_box is not None:
        out["pib"] = float(floats(in_box).mean())
    return out


def cast_columns(df: pd.DataFrame) -> pd.DataFrame:
    """Cast every :data:`SCHEMA` column of ``df`` to its dtype (``str``: ``""`` for missing), in place; ``KeyError``:
    a schema column missing, ``ValueError``: a non-number (or a missing ``int``)."""
    for c in SCHEMA:
        if c.dtype == "str":
            df[c.name] = df[c.name].fillna("").astype(str)
        else:
            df[c.name] = pd.to_numeric(df[c.name]).astype("int64" if c.dtype == "int" else "float64")
    return df


def coverage_name(table: pd.DataFrame) -> str:
    """What the ``miou`` column holds: the table's ``coverage_kind`` s (``"part mIoU"`` on CUB, ``"box coverage"`` on
    Aircraft and Cars) joined with ``", "``; ``"part mIoU"`` where it records none."""
    kinds = sorted({str(k) for k in table.get("coverage_kind", pd.Series(dtype=object)).dropna() if str(k).strip()})
    return ", ".join(kinds) or "part mIoU"


def validate_table(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``table`` checked against the schema, in its dtypes and order, absent optional columns at their
    defaults (``versions``: this environment's). ``ValueError``: a required column missing or empty, a bad value."""
    from ..metrics import COVERAGE_KINDS      # its module imports torch; the report reads tables without it

    df = table.copy()
    if missing := [c for c in REQUIRED_COLUMNS if c not in df.columns]:
        raise ValueError(f"results table is missing required column(s) {missing}; required: {list(REQUIRED_COLUMNS)}")
    for c in REQUIRED_COLUMNS:
        if (empty := df[c].isna() | (df[c].astype(str) == "")).any():
            raise ValueError(f"results table: required column {c!r} is empty in row(s) {list(df.index[empty][:5])}")
    for c in SCHEMA:
        if c.name not in df.columns:
            df[c.name] = current_versions() if c.name == "versions" else c.default
        elif c.name == "versions":
            df[c.name] = df[c.name].where(df[c.name].notna() & (df[c.name] != ""), current_versions())
        elif not c.required and c.dtype != "float":      # NaN is the float default anyway
            df[c.name] = df[c.name].where(df[c.name].notna(), c.default)
    df = cast_columns(df)
    if len(bad := df[~((df["budget"] > 0) & (df["budget"] <= 1))]):
        raise ValueError(f"budget must be in (0, 1], got {bad['budget'].tolist()[:5]}")
    if (df["depth"] < 1).any():
        raise ValueError(f"depth must be ≥ 1 (1-based block index), got {df['depth'].min()}")
    if (df["n_images"] < 0).any() or (df["n_skipped_parts"] < 0).any():
        raise ValueError("n_images and n_skipped_parts must be ≥ 0")
    if kinds := set(df["coverage_kind"]) - set(COVERAGE_KINDS):
        raise ValueError(f"coverage_kind must be one of {list(COVERAGE_KINDS)}, got {sorted(kinds)}")
    return df[list(SCHEMA_COLUMNS) + [c for c in df.columns if c not in SCHEMA_COLUMNS]].reset_index(drop=True)


def make_table(rows: Iterable[ResultRow | Mapping[str, Any]]) -> pd.DataFrame:
    """The validated results table of :class:`ResultRow` s or dicts; ``ValueError``: no rows, or as
    :func:`validate_table` (a row without a required column: that column empty in that row)."""
    if not (dicts := [r.to_dict() if isinstance(r, ResultRow) else dict(r) for r in rows]):
        raise ValueError("make_table: no rows")
    return validate_table(pd.DataFrame(dicts))


def side_by_side(rows: Mapping[str, pd.DataFrame], columns: Sequence[str]) -> pd.DataFrame:
    """Unweighted mean of ``columns`` per named set of result rows; ``ValueError``: a set empty or lacking one."""
    out = {}
    for name, df in rows.items():
        if (missing := [c for c in columns if c not in df.columns]) or len(df) == 0:
            raise ValueError(f"side_by_side: rows {name!r} are empty or lack columns {missing}; "
                             f"expected at least one row with {list(columns)}")
        out[name] = df[list(columns)].astype(float).mean()
    return pd.DataFrame(out).T


#: the metrics with an interval over seeds and images (the others get none) → their image-id column
_PER_IMAGE_IDS = {"miou": "image_ids", "accuracy": "image_ids", "idauc": "idauc_image_ids"}
#: each such metric's range, where its interval is cut (a t interval over two seeds can pass it)
_RANGE = {"miou": (0.0, 1.0), "accuracy": (0.0, 1.0), "idauc": (-1.0, 1.0)}


def aggregate_seeds(table: pd.DataFrame, by: Sequence[str] | None = None,
                    metrics: Sequence[str] = METRIC_COLUMNS, *, n_boot: int = 1000,
                    alpha: float = 0.05, seed: int = 0) -> pd.DataFrame:
    """Mean, sample std and count over seeds of each metric present per group of ``by`` (``None``: the
    :data:`ID_COLUMNS` present), checkpoint columns added, or pooled where a ``build`` column is not in ``by`` (one
    checkpoint per build, else ``ValueError``; decision 0072); for ``miou``, ``idauc``, ``accuracy``, ``m_lo``/``m_hi``
    is the ``(1−alpha)`` interval of the mean over seeds (decision 0007) on the images every seed measured, cut at the
    metric's range. Columns: ``by``, ``n_seeds``, ``seeds``, ``n_images``, ``m_mean``/``_std``/``_n``/``_lo``/``_hi``,
    ``ci_method``; ``ValueError`` for a grouping column the table lacks."""
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
                # one seed: its row's own images bootstrap (summarise_metrics), not a second draw of it
                lo, hi, method = max(float(own[0]), _RANGE[m][0]), min(float(own[1]), _RANGE[m][1]), \
                    "images bootstrap (one seed)"
            elif maps and all(x is not None for x in maps):
                if ids := sorted(set.intersection(*(set(x) for x in maps))):
                    builds = [int(b) if is_finite_number(b := x.get(BUILD_COLUMN)) else 0 for x in recs]
                    r = seed_image_interval(np.array([[x[i] for i in ids] for x in maps]), n_boot, alpha, seed,
                                            builds if pooled else None)
                    lo, hi, method = max(r.lo, _RANGE[m][0]), min(r.hi, _RANGE[m][1]), r.method
            out.loc[k, f"{m}_lo"], out.loc[k, f"{m}_hi"] = lo, hi
        methods.append(method)
    if ci_metrics:
        out["ci_method"] = methods
    return out.drop(columns=["_rows"])


_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")


def _path(name: str, runs_dir: str | Path | None) -> Path:
    if not _NAME_RE.match(name):
        raise ValueError(f"table name must be a plain file stem (letters, digits, . _ -), got {name!r}")
    return (Path(runs_dir) if runs_dir is not None else config.runs_dir()) / f"{name}.csv"   # atomic_write makes it


def save_table(table: pd.DataFrame, name: str, runs_dir: str | Path | None = None) -> Path:
    """Write ``table`` to ``<runs_dir>/<name>.csv`` (default ``config.runs_dir()``), its path; ValueError: bad name."""
    return atomic_write_text(_path(name, runs_dir), encode_lists(table).to_csv(index=False))


def encode_lists(table: pd.DataFrame) -> pd.DataFrame:
    """A copy of ``table`` with its list-valued columns (per-image values) as JSON text (``[0.5, NaN]``)."""
    out = table.copy()
    for c in out.columns:
        if out[c].dtype == object and out[c].map(lambda v: isinstance(v, (list, tuple))).any():
            out[c] = out[c].map(lambda v: json.dumps(list(v), allow_nan=True) if isinstance(v, (list, tuple)) else v)
    return out


def load_table(name: str, runs_dir: str | Path | None = None) -> pd.DataFrame:
    """A table :func:`save_table` wrote, with the schema's dtypes, the :data:`PER_IMAGE_COLUMNS` decoded;
    ``FileNotFoundError``: none; ``json.JSONDecodeError``: a per-image cell starting with ``[`` that is not JSON."""
    if not (path := _path(name, runs_dir)).exists():
        raise FileNotFoundError(f"no results table at {path}")
    # every cell read as text so that "None" or "" survive, then the other columns parsed ("" → NaN; "True" → bool)
    df = pd.read_csv(path, dtype=str, keep_default_na=False)
    text_cols = {c.name for c in SCHEMA if c.dtype == "str"}
    for c in [c for c in df.columns if c not in text_cols]:
        col = df[c].replace({"": np.nan})
        if set(col.dropna()) <= {"True", "False"} and col.notna().any():
            df[c] = col.map({"True": True, "False": False})
        else:
            with contextlib.suppress(ValueError, TypeError):
                df[c] = pd.to_numeric(col)
    if all(c in df.columns for c in SCHEMA_COLUMNS):
        df = cast_columns(df)
    for c in set(PER_IMAGE_COLUMNS) & set(df.columns):
        df[c] = df[c].map(lambda v: json.loads(v) if isinstance(v, str) and v.startswith("[") else v)
    return df
