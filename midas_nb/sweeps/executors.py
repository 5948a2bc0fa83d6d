"""Sweep executors: compute the cells a store lacks here (``local``) or on Slurm (preparation jobs, then job arrays
that depend on them; decisions 0037, 0078, 0093); every worker claims its cells, computes them (together where it
can: 0069) and writes their records (:func:`run_group`)."""
from __future__ import annotations

import contextlib
import io
import json
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import pandas as pd

from ..identity import jsonable
from .slurm import (DEFAULT_MAX_ARRAY_SIZE, REFUSED, SlurmNotFound, cell_states, chunk_arrays, max_array_size,
                    plan_jobs, slurm_executor, wait as wait_for_jobs)
from .store import CellState, ExecutorKind, ResultStore, StoreStatus, SweepCell, open_store

__all__ = ["run_sweep", "submit_sweep", "Submission", "cell_groups", "run_chunk", "run_group"]

#: :func:`run_sweep`'s ``slurm`` settings → submitit ``AutoExecutor`` parameters (others pass as they are)
_SLURM_ALIASES = dict(partition="slurm_partition", time="timeout_min", mem="mem_gb", gpus="gpus_per_node",
                      array_parallelism="slurm_array_parallelism", account="slurm_account", qos="slurm_qos",
                      constraint="slurm_constraint")
#: submissions of this process, one at a time (each holds sys.stderr while sbatch runs)
_SUBMITTING = threading.Lock()


def _rows_of(out: Any) -> list[dict[str, Any]]:
    if isinstance(out, pd.DataFrame):   # Python's JSON keeps every bit of a float (pandas' to_json rounds)
        return json.loads(json.dumps(out.to_dict(orient="records"), default=jsonable, allow_nan=True))
    is_list = isinstance(out, Iterable) and not isinstance(out, (str, bytes, Mapping))
    rows = [out] if isinstance(out, Mapping) else list(out) if is_list else []
    if not rows and not is_list or not all(isinstance(r, Mapping) for r in rows):
        got = f"a list with {sorted({type(r).__name__ for r in rows})}" if is_list else type(out).__name__
        raise TypeError(f"cell_fn must return a DataFrame, a dict or a list of dicts; got {got}")
    return [dict(r) for r in rows]


def cell_groups(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any]) -> list[list[SweepCell]]:
    """``cells`` by ``cell_fn.group_key`` where ``cell_fn`` has ``run_group``, else one cell each (decision 0069)."""
    if not hasattr(cell_fn, "run_group"):
        return [[c] for c in cells]
    groups: dict[Any, list[SweepCell]] = {}
    for c in cells:
        groups.setdefault(cell_fn.group_key(c), []).append(c)
    return list(groups.values())


def _compute(store: ResultStore, cells: list[SweepCell], cell_fn: Callable[[SweepCell], Any]) -> list[CellState]:
    """Compute and record claimed ``cells``: by ``cell_fn.run_group``, else (or where it raises) each with its error."""
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
    """Claim the cells (:meth:`ResultStore.hold`), compute and record those without a ``done`` record or one another
    worker wrote meanwhile (a failing cell: its record, no raise); a cell another process holds is left to it
    (``"running"``) or, with ``wait``, waited for, then read or computed. Returns each cell's state."""
    store = ResultStore(store_root)
    before = {c: (store.read(c.key) or {}).get("finished") for c in cells}

    def finished(c: SweepCell) -> CellState | None:   # a done record, or one another worker wrote meanwhile
        rec = store.read(c.key) or {}
        return rec.get("status") if rec.get("status") == "done" or rec.get("finished") != before[c] else None
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
    """A cell job's body and the local executor's: :func:`run_group` (never waiting: a job must not sit idle on its
    allocation) for each of the :func:`cell_groups`, then ``progress(n)``; the states in the order of ``cells``."""
    states = {}
    for group in cell_groups(cells, cell_fn):
        states.update(zip(group, run_group(group, cell_fn, store_root)))
        progress and progress(len(group))
    return [states[c] for c in cells]


def run_sweep(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store: ResultStore | str | Path,
              executor: ExecutorKind = "local", slurm: Mapping[str, Any] | None = None, retry_failed: bool = True, *,
              wait: bool = True, progress: bool = False) -> StoreStatus:
    """Compute the cells without a ``done`` record (``retry_failed=False``: nor a ``failed`` one), resuming a stopped
    sweep; returns their status (a dead job: its cells pending, an ``executor_errors`` line). ``cell_fn``: ``cell ->
    DataFrame | list[dict] | dict``, picklable for ``slurm`` (submitit; ``wait=False`` returns once submitted; no
    Slurm: ``SlurmNotFound``); ``slurm``: ``partition``, ``time`` (min; 120), ``gpus_per_node``, ``cpus_per_task``,
    ``mem`` (GB or ``"32G"``), ``array_parallelism``, ``cells_per_job`` (8), ``max_array_size``, other
    ``AutoExecutor`` parameters, ``cluster`` (``None``: Slurm; ``"local"``/``"debug"``: submitit's stand-ins here);
    job logs in ``<store>/submitit``. ``ValueError``: duplicated cells, an unknown executor."""
    if executor not in ("local", "slurm"):
        raise ValueError(f"unknown executor {executor!r}; expected 'local' or 'slurm'")
    store, cells, todo = _todo(store, cells, retry_failed, slurm=executor == "slurm")
    errors, root = [], str(store.root)
    from ..progress import tqdm
    bar = tqdm(total=len(todo), desc=f"sweep {store.root.name}", unit="cell", disable=not (progress and todo))
    if todo and executor == "local":   # grouped cells together (decision 0069), then those another sweep held
        for c in [c for c, st in zip(todo, run_chunk(todo, cell_fn, root, bar.update)) if st == "running"]:
            run_group([c], cell_fn, root, wait=True)
    elif todo:
        jobs = _submit(store, todo, cell_fn, slurm or {})
        for j in jobs if wait else []:
            try:
                j.result()
            except Exception as e:  # noqa: BLE001 - job killed, timed out, node failure
                errors.append(f"job {j.job_id} ({len(j.cells)} cells): {type(e).__name__}: {e}")
            bar.update(len(j.cells))
    bar.close()
    return StoreStatus(store.status(cells), executor_errors=errors)


def _todo(store: ResultStore | str | Path, cells: Sequence[SweepCell], retry_failed: bool,
          slurm: bool = False) -> tuple[ResultStore, list[SweepCell], list[SweepCell]]:
    """``(store, cells, todo)``: the grid registered, the cells to compute (``slurm``: none held or queued; 0078)."""
    store, cells = open_store(store), list(cells)
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        dup = sorted({c.label for c in cells if keys.count(c.key) > 1})
        raise ValueError(f"run_sweep: duplicated cells {dup[:5]}; every cell must be unique")
    store.register(cells)
    skip = {"done", "failed"} if not retry_failed else {"done"}
    if not slurm:
        return store, cells, [c for c in cells if store.state(c.key) not in skip]
    table = cell_states(store, cells)   # job_state: Slurm's while queued, else "", lost, unsubmitted or unknown
    free = ~table["status"].isin(skip | {"running"}) & table["job_state"].isin(["", "lost", "unsubmitted", "unknown"])
    return store, cells, [c for c, f in zip(cells, free) if f]


def _array_ids(job_ids: Iterable[Any]) -> list[str]:
    """The arrays (``123``) of job ids (``123`` or array task ``123_4``), sorted."""
    return sorted({str(j).split("_")[0] for j in job_ids})


def _submit_batches(ex: Any, fn: Any, args: Sequence[tuple], max_array: int) -> list[Any]:
    """``fn(*a)`` for each of ``args`` as jobs, in arrays of at most ``max_array`` tasks."""
    jobs: list[Any] = []
    for idx in chunk_arrays(len(args), max_array):
        with ex.batch():
            jobs += [ex.submit(fn, *args[i]) for i in idx]
    return jobs


def prepare_group(cell: SweepCell, cell_fn: Any) -> Any:
    """The preparation job's body: ``cell_fn.prepare(cell)`` (fine-tune, hash the data)."""
    return cell_fn.prepare(cell)


def _submit(store: ResultStore, cells: Sequence[SweepCell], cell_fn: Any, slurm: Mapping[str, Any]) -> list[Any]:
    """Submit ``cells`` with :func:`run_sweep`'s ``slurm`` settings, recorded in ``jobs.json``; the cell jobs (with
    ``.cells`` and ``.after``: the preparation jobs' ids). :class:`SlurmNotFound`: no ``sbatch``, or it refused."""
    from submitit.core.utils import FailedJobError

    params = {"name": "midas_sweep", "timeout_min": 120} | {   # not submitit's 5 min: a ViT-B job takes 17 on an H200
        "slurm_mem" if k == "mem" and isinstance(v, str) else _SLURM_ALIASES.get(k, k): v  # mem "32G"
        for k, v in slurm.items() if k != "cluster" and v is not None}
    cells_per_job, max_array = int(params.pop("cells_per_job", 8)), params.pop("max_array_size", None)
    held = io.StringIO()        # submitit prints a refusing sbatch's stderr: said once, below
    try:
        with _SUBMITTING, contextlib.redirect_stderr(held):    # one redirect at a time (threads)
            ex, cluster = slurm_executor(store.root / "submitit", slurm.get("cluster"), params)
            if max_array is None:
                max_array = max_array_size() if cluster == "slurm" else DEFAULT_MAX_ARRAY_SIZE
            prepare, chunks = plan_jobs(cells, cells_per_job)
            (store.root / "submitit").mkdir(parents=True, exist_ok=True)
            prep = (_submit_batches(ex, prepare_group, [(c, cell_fn) for c in prepare], max_array)
                    if callable(getattr(cell_fn, "prepare", None)) else [])
            for j in prep if cluster != "slurm" else []:    # submitit's stand-ins have no dependencies: prepare first
                j.exception()
            if prep and cluster == "slurm":
                ex.update_parameters(slurm_additional_parameters=dict(
                    params.get("slurm_additional_parameters") or {},
                    dependency="afterany:" + ":".join(_array_ids(j.job_id for j in prep))))
            jobs = _submit_batches(ex, run_chunk, [(c, cell_fn, str(store.root)) for c in chunks], max_array)
            for j, chunk in zip(jobs, chunks):
                j.cells, j.after = chunk, [str(p.job_id) for p in prep]  # the dependency names every preparation job
            store.record_jobs({c.key: str(j.job_id) for j in jobs for c in j.cells})
        sys.stderr.write(held.getvalue())
        return jobs
    except FailedJobError as e:
        known = store.jobs()      # a cell that never had a job is marked refused (a lost job's id stays)
        store.record_jobs({c.key: REFUSED for c in cells if c.key not in known})
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise SlurmNotFound(f"sbatch refused the submission: {lines[-1] if lines else e}; check that this machine "
                            "reaches a Slurm controller (scontrol ping) and the partition exists, or run the sweep "
                            "here (--executor local, or executor='local')") from None


@dataclass
class Submission:
    """What one submission sent: the ``cells``, how many of the grid were ``skipped`` (done, or held by a process or
    a queued job), the cell ``jobs`` (``{job id: [cell keys]}`` in submission order) and the ``preparation`` jobs."""

    store: Path
    cells: list[SweepCell]
    skipped: int = 0
    jobs: dict[str, list[str]] = field(default_factory=dict)
    preparation: list[str] = field(default_factory=list)

    job_ids = property(lambda self: list(self.jobs))

    def wait(self, **kw: Any):
        """:func:`midas_nb.sweeps.slurm.wait` on the store: the status table once nothing of it is queued."""
        return wait_for_jobs(ResultStore(self.store), **kw)

    def __str__(self) -> str:
        return (f"submitted {len(self.cells)} cells ({self.skipped} done or held) to {self.store}: "
                f"{len(self.jobs)} cell jobs in arrays {', '.join(_array_ids(self.jobs)) or '-'} after "
                f"{len(self.preparation)} preparation jobs {', '.join(self.preparation) or '-'}")


def submit_sweep(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store: ResultStore | str | Path,
                 slurm: Mapping[str, Any] | None = None, retry_failed: bool = True) -> Submission:
    """:func:`run_sweep` with ``executor="slurm"``, ``wait=False``: the :class:`Submission` (no jobs when every cell
    is done or held). Raises ``ValueError`` (duplicated cells), :class:`midas_nb.sweeps.slurm.SlurmNotFound`."""
    store, cells, todo = _todo(store, cells, retry_failed, slurm=True)
    jobs = _submit(store, todo, cell_fn, slurm or {}) if todo else []
    return Submission(store.root, todo, len(cells) - len(todo), {str(j.job_id): [c.key for c in j.cells] for j in jobs},
                      sorted({str(i) for j in jobs for i in j.after}))

