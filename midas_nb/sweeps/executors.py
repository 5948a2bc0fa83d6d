"""Sweep executors: compute the cells a store lacks, locally (``local``), in processes
(``processes``) or on Slurm (``slurm``, :mod:`midas_nb.sweeps.slurm`). The cell function of the
protocol is :class:`midas_nb.study.ProtocolCellRunner`."""
from __future__ import annotations

import concurrent.futures as cf
import multiprocessing
import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from .slurm import Submission, cell_states, submit
from .store import ExecutorKind, ResultStore, StoreStatus, SweepCell, open_store
from .worker import cell_groups, run_chunk, run_group

__all__ = ["run_sweep", "submit_sweep"]


#: :func:`run_sweep`'s ``slurm`` settings → submitit ``AutoExecutor`` parameters (others pass as they are)
_SLURM_ALIASES = dict(partition="slurm_partition", time="timeout_min", mem="mem_gb", gpus="gpus_per_node",
                      array_parallelism="slurm_array_parallelism", account="slurm_account", qos="slurm_qos",
                      constraint="slurm_constraint")


def run_sweep(
    cells: Sequence[SweepCell],
    cell_fn: Callable[[SweepCell], Any],
    store: ResultStore | str | Path,
    executor: ExecutorKind = "local",
    max_workers: int = 2,
    slurm: Mapping[str, Any] | None = None,
    retry_failed: bool = True,
    *,
    wait: bool = True,
    progress: bool = False,
    gpus: Sequence[str | int] | None = None,
) -> StoreStatus:
    """Compute the cells without a ``done`` record (``retry_failed``: also the failed ones) and return
    their status. Workers write their own records (:func:`run_group`; a failing cell records its error
    and the others go on), so the same call resumes a stopped sweep; ``local`` and ``processes`` wait
    for a cell another process holds (until it ends), Slurm jobs leave it. A worker or job that dies
    leaves its cells without a record (pending: the next call computes them) and an ``executor_errors`` line.

    Args:
        cells: the grid (:func:`midas_nb.study.make_grid`), unique keys. cell_fn: ``cell -> DataFrame |
            list[dict] | dict``, picklable for ``processes``/``slurm``. store: a store, its directory or name.
        executor: ``"local"``, ``"processes"`` (``max_workers`` spawned processes; ``gpus``
            shared out one per worker, default those visible) or ``"slurm"`` (submitit; ``wait=False``
            returns after submission; no Slurm: ``SlurmNotFound``).
        slurm: ``partition``, ``time`` (min), ``gpus_per_node``, ``cpus_per_task``, ``mem`` (GB, or
            ``"32G"``), ``array_parallelism``, ``cells_per_job`` (8), ``max_array_size`` (default
            ``scontrol show config``), other ``AutoExecutor`` parameters, ``cluster`` (``None``: Slurm;
            ``"local"``/``"debug"``: submitit's stand-ins). Job logs: ``<store>/submitit``.

    Raises:
        ValueError: duplicated cells, unknown executor, ``max_workers < 1``.
    """
    if executor not in ("local", "processes", "slurm"):
        raise ValueError(f"unknown executor {executor!r}; expected 'local', 'processes' or 'slurm'")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    store, cells, todo = _todo(store, cells, retry_failed, slurm=executor == "slurm")
    errors: list[str] = []
    root = str(store.root)
    from ..progress import tqdm
    bar = tqdm(total=len(todo), desc=f"sweep {store.root.name}", unit="cell", disable=not (progress and todo))
    if todo and executor == "local":   # grouped cells together (decision 0069), then those another sweep held
        for c in [c for c, st in zip(todo, run_chunk(todo, cell_fn, root, bar.update)) if st == "running"]:
            run_group([c], cell_fn, root, wait=True)
    elif todo and executor == "processes":
        ctx = multiprocessing.get_context("spawn")
        gpus = _visible_gpus() if gpus is None else [str(g) for g in gpus]
        init = dict(initializer=_worker_init, initargs=(ctx.Value("i", 0), gpus)) if gpus else {}
        with cf.ProcessPoolExecutor(max_workers=max_workers, mp_context=ctx, **init) as pool:
            futures = {pool.submit(run_group, g, cell_fn, root, True): g for g in cell_groups(todo, cell_fn)}
            for fut in cf.as_completed(futures):
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001 - the worker died or could not start
                    errors += [f"{c.label}: {type(e).__name__}: {e}" for c in futures[fut]]
                bar.update(len(futures[fut]))
    elif todo:
        jobs = _submit_slurm(store, todo, cell_fn, slurm)
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
    """``(store, cells, todo)``: the grid registered in the store and the cells to compute; ``slurm``: not those a
    process or a job in the queue holds, so submitting again sends only what is missing (decision 0078)."""
    store = open_store(store)
    cells = list(cells)
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


def _submit_slurm(store: ResultStore, todo: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any],
                  slurm: Mapping[str, Any] | None) -> list[Any]:
    """:func:`midas_nb.sweeps.slurm.submit` with :func:`run_sweep`'s ``slurm`` settings."""
    slurm = slurm or {}
    params = {"slurm_mem" if k == "mem" and isinstance(v, str) else _SLURM_ALIASES.get(k, k): v  # mem "32G"
              for k, v in slurm.items() if k != "cluster" and v is not None}
    params.setdefault("name", "midas_sweep")
    return submit(store, todo, cell_fn, cluster=slurm.get("cluster"), cells_per_job=int(params.pop("cells_per_job", 8)),
                  max_array=params.pop("max_array_size", None), params=params)


def submit_sweep(cells: Sequence[SweepCell], cell_fn: Callable[[SweepCell], Any], store: ResultStore | str | Path,
                 slurm: Mapping[str, Any] | None = None, retry_failed: bool = True):
    """:func:`run_sweep` with ``executor="slurm"``, ``wait=False``: the
    :class:`midas_nb.sweeps.slurm.Submission` (no jobs when every cell is done or held). Raises ``ValueError``
    (duplicated cells), :class:`midas_nb.sweeps.slurm.SlurmNotFound` (no Slurm here)."""
    store, cells, todo = _todo(store, cells, retry_failed, slurm=True)
    jobs = _submit_slurm(store, todo, cell_fn, slurm) if todo else []
    return Submission(store.root, todo, len(cells) - len(todo), {str(j.job_id): [c.key for c in j.cells] for j in jobs},
                      sorted({str(i) for j in jobs for i in j.after}))


def _visible_gpus() -> list[str]:
    """The GPUs this process may use: ``CUDA_VISIBLE_DEVICES`` where set, else those torch sees."""
    env = os.environ.get("CUDA_VISIBLE_DEVICES")
    if env is not None:
        return [g.strip() for g in env.split(",") if g.strip() and g.strip() != "-1"]
    import torch
    return [str(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []


def _worker_init(counter: Any, gpus: Sequence[str]) -> None:
    """Process-pool initialiser, before CUDA starts: the n-th worker sees only ``gpus[n % len(gpus)]``."""
    with counter.get_lock():
        n = counter.value
        counter.value += 1
    os.environ["CUDA_VISIBLE_DEVICES"] = gpus[n % len(gpus)]
