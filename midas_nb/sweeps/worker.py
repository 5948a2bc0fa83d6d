"""The worker body of every executor: claim a cell, compute it, write its record (:func:`run_cell`), the
same for cells computed together (:func:`run_group`, :func:`cell_groups`) and a Slurm job's chunk of cells
(:func:`run_chunk`). Part of the generic sweep engine."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from ..identity import jsonable
from .cells import CellState, SweepCell
from .store import ResultStore

__all__ = ["cell_groups", "run_cell", "run_chunk", "run_group"]


def _rows_of(out: Any) -> list[dict[str, Any]]:
    """A cell function's output as a list of row dicts."""
    if isinstance(out, pd.DataFrame):
        # through Python's own JSON (shortest repr that round-trips): floats keep every bit, so
        # a row read back from the store equals the row computed (pandas' to_json rounds to 15
        # digits); NaN stays NaN
        return json.loads(json.dumps(out.to_dict(orient="records"), default=jsonable, allow_nan=True))
    if isinstance(out, Mapping):
        return [dict(out)]
    if isinstance(out, Iterable) and not isinstance(out, (str, bytes)):
        rows = list(out)
        if not all(isinstance(r, Mapping) for r in rows):
            raise TypeError("cell_fn must return a DataFrame, a dict or a list of dicts; "
                            f"got a list with {sorted({type(r).__name__ for r in rows})}")
        return [dict(r) for r in rows]
    raise TypeError(f"cell_fn must return a DataFrame, a dict or a list of dicts; got {type(out).__name__}")


#: seconds between two tries of a waiting worker to claim a cell another worker holds
WAIT_POLL_S = 0.5


def run_cell(cell: SweepCell, cell_fn: Callable[[SweepCell], Any], store_root: str | Path,
             wait: bool = False) -> CellState:
    """Claim one cell, compute it and write its record; the worker body of every executor.

    The cell is first claimed (:meth:`ResultStore.claim`: exclusive create with a heartbeat);
    while another worker holds a live claim, nothing is computed: ``wait`` retries every
    :data:`WAIT_POLL_S` s until that worker releases it or its claim expires (then taken over),
    else the cell is left to it. A cell that has a ``done`` record, or got a record from another
    worker meanwhile, is not computed again. The claim is held until the record is written, so
    two sweeps over one store never compute one cell twice. Catches every ``Exception`` from
    ``cell_fn`` (and from turning its output into rows) and records it as a failure with the
    traceback; never raises for a failing cell.

    Returns:
        ``"done"`` or ``"failed"`` (computed here, or by another worker), ``"running"`` (another
        worker holds the claim; never with ``wait``).
    """
    store = ResultStore(store_root)
    before = (store.read(cell.key) or {}).get("finished")
    while (claim := store.claim(cell)) is None:
        if not wait:
            return "running"
        time.sleep(WAIT_POLL_S)
    try:
        prev = store.read(cell.key)
        if prev is not None and (prev["status"] == "done" or prev.get("finished") != before):
            return prev["status"]  # finished by another sweep meanwhile
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


def cell_groups(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any]) -> list[list[SweepCell]]:
    """``cells`` in the groups :func:`run_group` computes together: by ``cell_fn.group_key(cell)`` where
    ``cell_fn`` has ``run_group`` (in order of first appearance), else one cell each (docs/decisions/0069)."""
    if not hasattr(cell_fn, "run_group"):
        return [[c] for c in cells]
    groups: dict[Any, list[SweepCell]] = {}
    for c in cells:
        groups.setdefault(cell_fn.group_key(c), []).append(c)
    return list(groups.values())


def run_group(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store_root: str | Path,
              wait: bool = False) -> list[CellState]:
    """:func:`run_cell` for cells of one group, computed together by ``cell_fn.run_group(cells)`` (each
    cell's output, in order): each cell claimed, skipped and recorded as :func:`run_cell` does. Where the
    group's computation raises, its cells are computed again one by one, so each records its own error;
    ``wait``: cells another worker holds are waited for after the others (:func:`run_cell`)."""
    if len(cells) < 2 or not hasattr(cell_fn, "run_group"):
        return [run_cell(c, cell_fn, store_root, wait) for c in cells]
    store = ResultStore(store_root)
    claims, states, failed = {}, {}, False
    try:
        for c in cells:
            claim = store.claim(c)
            prev = None if claim is None else store.read(c.key)
            if claim is None or (prev is not None and prev["status"] == "done"):  # another worker's, or done meanwhile
                states[c] = "running" if claim is None else "done"
                if claim is not None:
                    claim.release()
            else:
                claims[c] = claim
        if claims:
            started = time.time()
            try:
                rows = [_rows_of(out) for out in cell_fn.run_group(list(claims))]
                json.dumps(rows, default=jsonable, allow_nan=True)
                if len(rows) != len(claims):
                    raise ValueError(f"run_group gave {len(rows)} outputs for {len(claims)} cells")
            except Exception:  # noqa: BLE001 - retried cell by cell below, each cell records its own error
                failed = True
            else:
                for c, r in zip(claims, rows):
                    store.record_done(c, r, started=started)
                    states[c] = "done"
    finally:
        for claim in claims.values():
            claim.release()
    if failed:
        states.update({c: run_cell(c, cell_fn, store_root) for c in claims})
    states.update({c: run_cell(c, cell_fn, store_root, True) for c in cells if wait and states[c] == "running"})
    return [states[c] for c in cells]


def run_chunk(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store_root: str) -> list[CellState]:
    """A cell job's body: :func:`run_group` for each of its groups (:func:`cell_groups`; claims included: a
    cell claimed by a live worker elsewhere is left to it); the states in the order of ``cells``."""
    states = {}
    for group in cell_groups(cells, cell_fn):
        states.update(zip(group, run_group(group, cell_fn, store_root)))
    return [states[c] for c in cells]
