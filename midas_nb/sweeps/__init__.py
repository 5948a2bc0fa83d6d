"""The generic sweep engine: cells, the JSON result store, executors (imports no domain module).

A *sweep* is a grid of :class:`SweepCell` s (DESIGN.md §5, §7–8); :func:`run_sweep` computes the
cells its :class:`ResultStore` lacks (docs/decisions/0025-shared-result-store.md).

Example::

    >>> from midas_nb.study import ProtocolCellRunner, make_grid
    >>> prof = get_profile("quick")
    >>> cells = make_grid(prof, "regime")            # L sweep at b=25% + b sweep at L=6
    >>> status = run_sweep(cells, ProtocolCellRunner(prof), ResultStore(name="quick"))
    >>> print(status)                                # done / failed / pending, with errors
    >>> table = ResultStore(name="quick").results()  # one row per condition × seed × cell
"""
from __future__ import annotations

from ..identity import atomic_write_text
from .cells import CellState, ExecutorKind, SweepCell
from .executors import run_cell, run_sweep, submit_sweep
from .slurm import Submission
from .store import RECORD_FORMAT, ResultStore, StoreStatus, format_status, main_status, open_store, sweep_status

__all__ = ["ExecutorKind", "CellState", "SweepCell", "ResultStore", "StoreStatus", "RECORD_FORMAT",
           "atomic_write_text", "run_sweep", "submit_sweep", "Submission", "run_cell", "sweep_status",
           "format_status", "main_status", "open_store"]
