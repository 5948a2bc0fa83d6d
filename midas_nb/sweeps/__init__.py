"""The generic sweep engine (imports no domain module): :func:`run_sweep` computes the :class:`SweepCell` s its
:class:`ResultStore` lacks (DESIGN.md §5, §7–8; decision 0025); the protocol's: :func:`midas_nb.study.run_cells`."""
from __future__ import annotations

from .executors import Submission, run_sweep, submit_sweep
from .store import ExecutorKind, ResultStore, StoreStatus, SweepCell, format_status, open_store

__all__ = ["ExecutorKind", "SweepCell", "ResultStore", "StoreStatus", "run_sweep", "submit_sweep", "Submission",
           "format_status", "open_store"]
