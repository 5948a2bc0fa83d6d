"""The results table, one row per (dataset, backbone, condition, depth, budget, seed) (:data:`SCHEMA`)."""
from __future__ import annotations

from .present import (band_checks, compact, format_ci, full_text, images_note, leader_line, leaders, probe_note,
                      sample_note)
from .table import (aggregate_seeds, coverage_name, encode_lists, load_table, make_table, METRIC_COLUMNS,
                    PER_IMAGE_COLUMNS, ResultRow, save_table, SCHEMA, SCHEMA_COLUMNS, side_by_side, summarise_metrics,
                    validate_table)

__all__ = ["side_by_side", "SCHEMA", "SCHEMA_COLUMNS", "METRIC_COLUMNS", "ResultRow", "summarise_metrics", "make_table",
           "validate_table", "aggregate_seeds", "PER_IMAGE_COLUMNS", "save_table", "load_table", "encode_lists",
           "compact", "format_ci", "sample_note", "probe_note", "full_text", "images_note", "leader_line", "leaders",
           "band_checks", "coverage_name"]
