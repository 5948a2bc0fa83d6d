"""The worker body of every executor: claim cells, compute them (together where the cell function can,
docs/decisions/0069), write their records (:func:`run_group`; a Slurm job's chunk: :func:`run_chunk`).
Part of the generic sweep engine."""
from __future__ import annotations

import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from ..identity import jsonable
from .store import CellState, ResultStore, SweepCell

__all__ = ["cell_groups", "run_chunk", "run_group"]


def _rows_of(out: Any) -> list[dict[str, Any]]:
    """A cell function's output as a list of row dicts."""
    if isinstance(out, pd.DataFrame):
        # through Python's own JSON (shortest repr that round-trips): floats keep every bit, so a row read back
        # from the store equals the row computed (pandas' to_json rounds to 15 digits); NaN stays NaN
        return json.loads(json.dumps(out.to_dict(orient="records"), default=jsonable, allow_nan=True))
    is_list = isinstance(out, Iterable) and not isinstance(out, (str, bytes, Mapping))
    rows = [out] if isinstance(out, Mapping) else list(out) if is_list else []
    if not rows and not is_list or not all(isinstance(r, Mapping) for r in rows):
        got = f"a list with {sorted({type(r).__name__ for r in rows})}" if is_list else type(out).__name__
        raise TypeError(f"cell_fn must return a DataFrame, a dict or a list of dicts; got {got}")
    return [dict(r) for r in rows]


def cell_groups(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any]) -> list[list[SweepCell]]:
    """``cells`` in the groups :func:`run_group` computes together: by ``cell_fn.group_key(cell)`` where
    ``cell_fn`` has ``run_group`` (in order of first appearance), else one cell each (docs/decisions/0069)."""
    if not hasattr(cell_fn, "run_group"):
        return [[c] for c in cells]
    groups: dict[Any, list[SweepCell]] = {}
    for c in cells:
        groups.setdefault(cell_fn.group_key(c), []).append(c)
    return list(groups.values())


def _compute(store: ResultStore, cells: list[SweepCell], cell_fn: Callable[[SweepCell], Any]) -> list[CellState]:
    """Compute ``cells`` (claimed) and write their records: together by ``cell_fn.run_group`` (each cell's output,
    in order) where it has one; where that raises, one by one, so each cell records its own error."""
    if len(cells) > 1 and hasattr(cell_fn, "run_group"):
        started = time.time()
        try:
            rows = [_rows_of(out) for out in cell_fn.run_group(cells)]
            if len(rows) != len(cells):
                raise ValueError(f"run_group gave {len(rows)} outputs for {len(cells)} cells")
            for c, r in zip(cells, rows):
                store.record_done(c, r, started=started)
            return ["done"] * len(cells)
        except Exception:  # noqa: BLE001 - computed again cell by cell below
            pass
    states: list[CellState] = []
    for c in cells:
        started = time.time()
        try:    # the record's JSON is written here too: an output that is no JSON is this cell's error
            store.record_done(c, _rows_of(cell_fn(c)), started=started)
            states.append("done")
        except Exception as e:  # noqa: BLE001 - a failing cell must not stop the sweep
            store.record_failed(c, f"{type(e).__name__}: {e}", traceback.format_exc(), started=started)
            states.append("failed")
    return states


def run_group(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store_root: str | Path,
              wait: bool = False) -> list[CellState]:
    """Claim the cells (:meth:`ResultStore.hold`), compute those without a record (:func:`_compute`) and write
    their records; never raises for a failing cell. A cell that has a ``done`` record, or got one from another
    worker meanwhile, is not computed again; a cell another process holds is left to it (``"running"``), or with
    ``wait`` waited for once the others are done (then read, or computed where its holder left no record).

    Returns:
        each cell's state: ``"done"``, ``"failed"`` (here or by another worker), ``"running"`` (never with ``wait``).
    """
    store = ResultStore(store_root)
    before = {c: (store.read(c.key) or {}).get("finished") for c in cells}

    def finished(c: SweepCell) -> CellState | None:   # a done record, or one another worker wrote meanwhile
        rec = store.read(c.key)
        return rec["status"] if rec is not None and (rec["status"] == "done" or rec.get("finished") != before[c]) \
            else None
    states: dict[SweepCell, CellState] = {}
    held: dict[SweepCell, int] = {}
    try:
        for c in cells:
            if (fd := store.hold(c.key)) is None:
                states[c] = "running"
            elif st := finished(c):
                states[c] = st
                store.release(c.key, fd)
            else:
                held[c] = fd
        states.update(zip(held, _compute(store, list(held), cell_fn)))
    finally:
        for c, fd in held.items():
            store.release(c.key, fd)
    for c in [c for c in cells if wait and states[c] == "running"]:
        fd = store.hold(c.key, wait=True)
        try:
            states[c] = finished(c) or _compute(store, [c], cell_fn)[0]
        finally:
            store.release(c.key, fd)
    return [states[c] for c in cells]


def run_chunk(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store_root: str,
              progress: Callable[[int], Any] | None = None) -> list[CellState]:
    """A cell job's body and the local executor's: :func:`run_group` for each of its groups (:func:`cell_groups`;
    a cell another process holds is left to it: a job must not sit idle on its allocation), ``progress(n)`` after
    each group of ``n`` cells; the states in the order of ``cells``."""
    states = {}
    for group in cell_groups(cells, cell_fn):
        states.update(zip(group, run_group(group, cell_fn, store_root)))
        progress and progress(len(group))
    return [states[c] for c in cells]
