"""The results table's schema (one row per dataset, backbone, condition, depth, budget, seed) and its validation."""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, MISSING
from typing import Any, Iterable, Literal, Mapping, Sequence, TYPE_CHECKING

import numpy as np
import pandas as pd

from ..metrics import bootstrap_ci

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
        extras = d.pop("extras")
        if clash := set(extras) & set(d):
            raise ValueError(f"ResultRow.extras repeats schema column(s) {sorted(clash)}")
        d.update(extras)
        return d


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
        c = correct.float() if hasattr(correct, "detach") else np.asarray(correct, dtype=float)
        ci("accuracy", c)
        out.setdefault("n_images", int(len(c)))
    if in_box is not None:
        b = in_box.float() if hasattr(in_box, "detach") else np.asarray(in_box, dtype=float)
        out["pib"] = float(b.mean())
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
    """A copy of ``table`` checked against the schema, with its dtypes and column order, absent optional columns at
    their defaults (``versions``: the running environment's). ``ValueError``: a required column missing or empty,
    ``budget`` outside ``(0,1]``, ``depth < 1``, ``n_images < 0`` or an unknown ``coverage_kind``."""
    from ..metrics import COVERAGE_KINDS

    df = table.copy()
    if missing := [c for c in REQUIRED_COLUMNS if c not in df.columns]:
        raise ValueError(f"results table is missing required column(s) {missing}; required: "
                         f"{list(REQUIRED_COLUMNS)}")
    for c in REQUIRED_COLUMNS:
        empty = df[c].isna() | (df[c].astype(str) == "")
        if empty.any():
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
    extras = [c for c in df.columns if c not in SCHEMA_COLUMNS]
    return df[list(SCHEMA_COLUMNS) + extras].reset_index(drop=True)


def make_table(rows: Iterable[ResultRow | Mapping[str, Any]]) -> pd.DataFrame:
    """The validated results table of :class:`ResultRow` s or dicts; ``ValueError``: no rows, a row without a
    required column, or as :func:`validate_table`."""
    if not (dicts := [r.to_dict() if isinstance(r, ResultRow) else dict(r) for r in rows]):
        raise ValueError("make_table: no rows")
    for i, d in enumerate(dicts):
        if missing := [c for c in REQUIRED_COLUMNS if c not in d]:
            raise ValueError(f"results row {i} is missing required column(s) {missing}; "
                             f"required: {list(REQUIRED_COLUMNS)}")
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
