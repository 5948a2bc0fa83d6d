"""The generic sweep engine: cells, the JSON result store, executors (imports no domain module).

A *sweep* is a grid of cells over dataset × backbone × depth ``L`` × budget ``b`` ×
condition × seed (DESIGN.md §5, §7–8); each cell yields result rows. Three pieces, each usable
alone:

- :mod:`midas_nb.sweeps.cells` — :class:`SweepCell`; its :attr:`SweepCell.key` is a hash of
  every parameter that changes the result, so a changed setting is a new cell and never reads
  a stale record.
- :mod:`midas_nb.sweeps.store` — :class:`ResultStore`: one JSON record per finished (or
  failed) cell under ``runs/sweeps/<name>/cells/<key>.json``, written atomically.
- :mod:`midas_nb.sweeps.executors` — :func:`run_sweep`: skips finished cells, (re)computes
  missing or failed ones (``local``, ``processes``, ``slurm``), records a failing cell's error
  and traceback without stopping the others.

The grids of a profile (:func:`midas_nb.study.make_grid`), the protocol's cell function
(:class:`midas_nb.study.ProtocolCellRunner`) and the scale readout
(:func:`midas_nb.study.scale_readout`) live beside :class:`midas_nb.study.Study`.

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
from .store import (RECORD_FORMAT, ResultStore, StoreStatus, format_status, main_status, open_store,
                    sweep_status, sweep_status_report)

__all__ = [
    "ExecutorKind",
    "CellState",
    "SweepCell",
    "ResultStore",
    "StoreStatus",
    "RECORD_FORMAT",
    "atomic_write_text",
    "run_sweep",
    "submit_sweep",
    "Submission",
    "run_cell",
    "sweep_status",
    "sweep_status_report",
    "format_status",
    "main_status",
    "open_store",
]
