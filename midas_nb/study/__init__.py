"""One study = one (profile, dataset, backbone): the object every notebook starts from, with a
cached call for each stage of the pipeline (DESIGN.md §2).

Example::

    >>> study = Study("smoke")                 # embedded synthetic data, tiny ViT
    >>> table = study.protocol()               # one row per condition x seed
    >>> maps = study.target_maps()             # {"T0": [M, N], ...} on the test split
"""
from __future__ import annotations

from .base import check_layout, StudyBase
from ..analysis.control import decoupling_with_controls
from .core import Study
from .grid import (cached_study, checkpoint_spec_id, eval_data_id, grid_spans, GridKind, make_grid, PAPER_DATASETS,
                   placeholder_ids, ProtocolCellRunner, run_cells, SEEDLESS_CONDITIONS, study_overrides,
                   sweep_cells)
from .settings import (BackboneSettings, check_data, check_schedule, DataSettings, protocol_settings,
                       ProtocolSettings, ReportSettings, RunSettings, StatisticsSettings, SweepSettings)

__all__ = ["Study", "StudyBase", "RunSettings", "DataSettings", "BackboneSettings", "ProtocolSettings",
           "StatisticsSettings", "SweepSettings", "ReportSettings", "check_data", "check_layout", "check_schedule",
           "cached_study", "study_overrides", "make_grid", "grid_spans", "checkpoint_spec_id", "eval_data_id",
           "protocol_settings", "placeholder_ids", "ProtocolCellRunner", "run_cells", "sweep_cells",
           "decoupling_with_controls", "PAPER_DATASETS", "SEEDLESS_CONDITIONS", "GridKind"]
