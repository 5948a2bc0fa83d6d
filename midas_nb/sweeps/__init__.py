"""The generic sweep engine (imports no domain module): :func:`run_sweep` computes the
:class:`SweepCell` s its :class:`ResultStore` lacks (DESIGN.md §5, §7–8;
docs/decisions/0025-shared-result-store.md)::

    >>> from midas_nb.study import ProtocolCellRunner, make_grid
    >>> prof = get_profile("quick")
    >>> status = run_sweep(make_grid(prof, "regime"), ProtocolCellRunner(prof), ResultStore(name="quick"))
    >>> table = ResultStore(name="quick").results()  # one row per condition × seed × cell
"""
from __future__ import annotations

from .executors import Submission, run_sweep, submit_sweep
from .store import ExecutorKind, ResultStore, StoreStatus, SweepCell, format_status, open_store

__all__ = ["ExecutorKind", "SweepCell", "ResultStore", "StoreStatus", "run_sweep", "submit_sweep", "Submission",
           "format_status", "open_store"]
