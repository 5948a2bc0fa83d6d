"""One study = one (profile, dataset, backbone): the object every notebook starts from, with a cached call for each
stage of the pipeline (DESIGN.md §2): ``Study("smoke").protocol()``, a row per condition × seed of synthetic data."""
from __future__ import annotations

from .base import StudyBase
from .core import Study
from .grid import (cached_study, checkpoint_spec_id, eval_data_id, grid_spans, make_grid, ProtocolCellRunner,
                   run_cells, study_overrides, sweep_cells)
from .settings import protocol_settings, ReportSettings, RunSettings

__all__ = ["Study", "StudyBase", "RunSettings", "ReportSettings", "cached_study", "study_overrides", "make_grid",
           "grid_spans", "checkpoint_spec_id", "eval_data_id", "protocol_settings", "ProtocolCellRunner", "run_cells",
           "sweep_cells"]
