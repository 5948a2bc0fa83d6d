"""The worker body of every executor: claim a cell, compute it, write its record (:func:`run_cell`),
and a Slurm job's chunk of cells (:func:`run_chunk`). Part of the generic sweep engine."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

from ..identity import jsonable
from .cells import CellState, SweepCell
from .store import ResultStore, _rows_of

__all__ = ["run_cell", "run_chunk"]


def run_cell(cell: SweepCell, cell_fn: Callable[[SweepCell], Any], store_root: str | Path) -> CellState:
    """Claim one cell, compute it and write its record; the worker body of every executor.

    The cell is first claimed (:meth:`ResultStore.claim`: exclusive create with a heartbeat);
    while another worker holds a live claim, or once the cell has a ``done`` record, nothing is
    computed. The claim is held until the record is written, so two sweeps over one store never
    compute one cell twice. Catches every ``Exception`` from ``cell_fn`` (and from turning its
    output into rows) and records it as a failure with the traceback; never raises for a
    failing cell.

    Returns:
        ``"done"`` or ``"failed"`` (computed here, or already done), ``"running"`` (another
        worker holds the claim).
    """
    store = ResultStore(store_root)
    claim = store.claim(cell)
    if claim is None:
        return "running"
    try:
        prev = store.read(cell.key)
        if prev is not None and prev["status"] == "done":  # finished by another sweep meanwhile
            return "done"
        started = time.time()
        try:
            rows = _rows_of(cell_fn(cell))
            json.dumps(rows, default=jsonable, allow_nan=True)  # fail here, as this cell's error
            store.record_done(cell, rows, started=started)
            state: CellState = "done"
        except Exception as e:  # noqa: BLE001 - a failing cell must not stop the sweep
            store.record_failed(cell, f"{type(e).__name__}: {e}", traceback.format_exc(), started=started)
            state = "failed"
    finally:
        claim.release()
    return state


def run_chunk(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store_root: str) -> list[CellState]:
    """A cell job's body: :func:`run_cell` for each of its cells (claims included: a cell claimed
    by a live worker elsewhere is left to it)."""
    return [run_cell(c, cell_fn, store_root) for c in cells]
