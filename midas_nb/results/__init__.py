"""The results table: one row per (dataset, backbone, condition, depth, budget, seed).

Every evaluation in midas_nb ends as rows of this table; the analyses (D, seed spread, the
claim's verdict, deployment advice: :mod:`midas_nb.analysis`) and the figures read it. Rows are
built with :class:`ResultRow` (or plain dicts) and :func:`make_table`, which validates the
schema, fills optional columns and orders them. Columns outside the schema are allowed and kept after the schema columns.

The schema is :data:`SCHEMA` (:mod:`midas_nb.results.table`): each :class:`Column` gives the
name, dtype, whether every row must have it, the default that fills it, and its meaning (unit).

Files: :func:`save_table` writes ``<runs_dir>/<name>.csv`` (and ``.parquet`` when pyarrow is
importable) under :func:`midas_nb.config.runs_dir`; :func:`load_table` reads them back with
the schema's dtypes.
"""
from __future__ import annotations

from .aggregate import (aggregate_seeds)  # noqa: F401
from .files import (decode_lists, encode_lists, load_table, save_table)  # noqa: F401
from .table import (Column, ID_COLUMNS, METRIC_COLUMNS, PER_IMAGE_COLUMNS, REQUIRED_COLUMNS, ResultRow, SCHEMA,
                    SCHEMA_COLUMNS, coverage_name, current_versions, make_table, side_by_side, summarise_metrics,
                    validate_table)  # noqa: F401
from .present import (FullText, band_checks, compact, format_ci, full_text, images_note, leader_line, probe_note, sample_note,  # noqa: F401
                      wrap_text)

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
