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

from .advice import (GOALS, recommend_deployment)  # noqa: F401
from .aggregate import (aggregate_seeds)  # noqa: F401
from .files import (decode_lists, encode_lists, load_table, save_table)  # noqa: F401
from .table import (Column, ID_COLUMNS, METRIC_COLUMNS, PER_IMAGE_COLUMNS, REQUIRED_COLUMNS, ResultRow, SCHEMA,
                    SCHEMA_COLUMNS, coverage_name, current_versions, make_table, side_by_side, summarise_metrics,
                    validate_table)  # noqa: F401
from .present import (FullText, band_checks, compact, format_ci, full_text, images_note, leader_line, probe_note, sample_note,  # noqa: F401
                      wrap_text)
from .verdict import (BASELINE_CONDITIONS, CONTROL_CONDITION, ClaimVerdict, claim_verdict, condition_reading,
                      axis_trend, paired_gap, per_image_means, per_seed_values, targets_vs_scorers)  # noqa: F401

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
    "ClaimVerdict",
    "claim_verdict",
    "condition_reading",
    "per_image_means",
    "per_seed_values",
    "BASELINE_CONDITIONS",
    "CONTROL_CONDITION",
    "targets_vs_scorers",
    "paired_gap",
    "axis_trend",
    "compact",
    "format_ci",
    "sample_note",
    "probe_note",
    "wrap_text",
    "full_text",
    "FullText",
    "images_note",
    "leader_line",
    "band_checks",
    "coverage_name",
]
