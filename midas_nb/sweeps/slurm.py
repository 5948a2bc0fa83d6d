"""Submitting a sweep to Slurm through submitit: one preparation job per (dataset, backbone,
checkpoint), then the cells in chunked job arrays under ``MaxArraySize`` that depend on them
(docs/decisions/0037-slurm-submission.md); the jobs' state from ``squeue``; submitting again sends only the
cells that no process or queued job holds (docs/decisions/0078-slim-sweep-engine.md)."""
from __future__ import annotations

import contextlib
import io
import re
import shutil
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from .store import ResultStore, SweepCell
from .worker import run_chunk

__all__ = ["DEFAULT_MAX_ARRAY_SIZE", "SlurmNotFound", "Submission", "chunk_arrays", "max_array_size", "plan_jobs",
           "prepare_group", "scheduler_states", "submit", "slurm_executor", "cell_states", "wait"]

#: Slurm's default ``MaxArraySize`` (used when ``scontrol show config`` cannot be read)
DEFAULT_MAX_ARRAY_SIZE = 1001
#: the job id ``jobs.json`` gives a cell whose submission sbatch refused (``unsubmitted`` until submitted again)
_REFUSED = "refused"
#: submissions of this process, one at a time (each holds sys.stderr while sbatch runs)
_SUBMITTING = threading.Lock()


class SlurmNotFound(RuntimeError):
    """``executor="slurm"`` on a machine without a working Slurm: no ``sbatch``, or an ``sbatch``
    that refuses the submission (no controller reachable, a partition that does not exist)."""


@dataclass
class Submission:
    """What one submission sent to the scheduler: the ``store``'s directory, the ``cells`` submitted, how many
    cells of the grid were ``skipped`` (done, or held by a process or a queued job), the cell ``jobs`` (``{job id:
    [cell keys]}``, array tasks ``123_4``, in submission order: ``job_ids``) and the ``preparation`` jobs' ids (one
    per dataset, backbone, checkpoint)."""

    store: Path
    cells: list[SweepCell]
    skipped: int = 0
    jobs: dict[str, list[str]] = field(default_factory=dict)
    preparation: list[str] = field(default_factory=list)

    job_ids = property(lambda self: list(self.jobs))

    def wait(self, **kw: Any):
        """:func:`wait` on the store: the status table once nothing of it is queued."""
        return wait(ResultStore(self.store), **kw)

    def __str__(self) -> str:
        return (f"submitted {len(self.cells)} cells ({self.skipped} done or held) to {self.store}: "
                f"{len(self.jobs)} cell jobs in arrays {', '.join(_array_ids(self.jobs)) or '-'} after "
                f"{len(self.preparation)} preparation jobs {', '.join(self.preparation) or '-'}")


def _stdout(*cmd: str) -> str | None:
    """``cmd``'s standard output; ``None`` where it is not on the ``PATH``, fails or runs over a minute."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def max_array_size(default: int = DEFAULT_MAX_ARRAY_SIZE) -> int:
    """The cluster's ``MaxArraySize`` (``scontrol show config``: an array's task indices stay below it);
    ``default`` when unreadable."""
    m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)", _stdout("scontrol", "show", "config") or "", re.MULTILINE)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else default


def scheduler_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """Slurm's state of each queued or running job (``squeue``: ``PENDING``, ``RUNNING``, ...) by job id (``123``
    or array task ``123_4``); jobs that left the queue are absent; ``None`` without Slurm (``squeue`` missing or
    failing). Not submitit's ``Job.state``: that reads ``sacct``, which a cluster without accounting storage
    lacks (the job then reads ``UNKNOWN`` for ever; docs/decisions/0078-slim-sweep-engine.md)."""
    if (out := _stdout("squeue", "-h", "-r", "-o", "%i|%T")) is None:
        return None
    wanted = set(job_ids)
    states = dict(line.strip().partition("|")[::2] for line in out.splitlines())
    return {j: s for j, s in states.items() if j in wanted or j.split("_")[0] in wanted}


def plan_jobs(cells: Sequence[SweepCell], cells_per_job: int) -> tuple[list[SweepCell], list[list[SweepCell]]]:
    """``(prepare, chunks)``: one representative cell per group (dataset, backbone, checkpoint) for its preparation
    job, and the cells cut into jobs of at most ``cells_per_job`` cells that never mix groups (a job loads one
    backbone). Raises ``ValueError``: ``cells_per_job < 1``."""
    if (n := int(cells_per_job)) < 1:
        raise ValueError(f"cells_per_job must be >= 1, got {cells_per_job!r}")
    groups: dict[tuple[str, str, str], list[SweepCell]] = {}
    for c in cells:
        groups.setdefault((c.dataset, c.backbone, c.checkpoint_id), []).append(c)
    return [g[0] for g in groups.values()], [g[i:i + n] for g in groups.values() for i in range(0, len(g), n)]


def chunk_arrays(n_jobs: int, max_array: int) -> list[range]:
    """Job indices ``0..n_jobs-1`` cut into arrays of at most ``max_array`` tasks (task indices
    ``0..max_array-1``, all below ``MaxArraySize = max_array``)."""
    if max_array < 1:
        raise ValueError(f"MaxArraySize must be >= 1, got {max_array}")
    return [range(i, min(i + max_array, n_jobs)) for i in range(0, n_jobs, max_array)]


def prepare_group(cell: SweepCell, cell_fn: Any) -> Any:
    """The preparation job's body: ``cell_fn.prepare(cell)`` (fine-tune, hash the data)."""
    return cell_fn.prepare(cell)


def slurm_executor(folder: Path, cluster: str | None, params: Mapping[str, Any]):
    """``(submitit executor, cluster)`` for ``cluster`` (``None``/``"slurm"``: Slurm, which must exist;
    ``"local"``/``"debug"``: submitit's stand-ins, only by name).

    Raises:
        SlurmNotFound: Slurm asked for and ``sbatch`` is not on the ``PATH``. ValueError: an unknown ``cluster``.
    """
    import submitit

    if cluster not in (None, "slurm", "local", "debug"):
        raise ValueError(f"slurm cluster {cluster!r} is not known; expected None or 'slurm' (a Slurm cluster), "
                         "'local' or 'debug' (submitit's stand-ins on this machine)")
    if cluster in (None, "slurm") and shutil.which("sbatch") is None:
        raise SlurmNotFound("executor='slurm' needs a Slurm cluster, but no 'sbatch' is on the PATH of this machine; "
                            "submit from a Slurm login node, or run here with executor='local' (one cell after "
                            "another) or executor='processes' (one worker per CPU/GPU)")
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster or "slurm")
    ex.update_parameters(**params)
    return ex, cluster or "slurm"


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


def submit(store: ResultStore, cells: Sequence[SweepCell], cell_fn: Any, *, cluster: str | None,
           params: Mapping[str, Any], cells_per_job: int = 8, max_array: int | None = None) -> list[Any]:
    """Submit ``cells`` (see the module docstring); returns the cell jobs (submitit ``Job``s, one per chunk, each
    with ``.cells`` and ``.after``: the ids of the preparation jobs it waits for); ``jobs.json`` maps every cell
    to its job id.

    Raises:
        SlurmNotFound: no ``sbatch``, or ``sbatch`` refused the submission (its last error line).
    """
    from submitit.core.utils import FailedJobError

    held = io.StringIO()        # submitit prints a refusing sbatch's stderr: said once, below
    try:
        with _SUBMITTING, contextlib.redirect_stderr(held):    # one redirect at a time (threads)
            ex, cluster = slurm_executor(store.root / "submitit", cluster, params)
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
        store.record_jobs({c.key: _REFUSED for c in cells if c.key not in known})
        lines = [ln.strip() for ln in str(e).splitlines() if ln.strip()]
        raise SlurmNotFound(f"sbatch refused the submission: {lines[-1] if lines else e}; check that this machine "
                            "reaches a Slurm controller (scontrol ping) and the partition exists, or run the sweep "
                            "here: midas-nb sweep submit --executor local or processes (executor='local' or "
                            "'processes' in Python)") from None


def cell_states(store: ResultStore, cells: Sequence[SweepCell] | None = None):
    """The store's status table (:meth:`ResultStore.status`) with ``job_state`` of each cell without a record:
    Slurm's state of its job while queued or running (``PENDING``, ``RUNNING``, ...), ``lost`` when its job left
    the queue (cancelled, timed out, node failure: submit it again), ``unsubmitted`` when sbatch refused its
    submission, ``unknown`` without Slurm; empty for cells with a record or never submitted."""
    table = store.status(cells)
    ids = [j for j in table["job_id"].dropna() if j != _REFUSED]
    queued = scheduler_states(ids) if ids else {}       # no job to ask squeue about: a first submission
    table["job_state"] = [
        "" if s in ("done", "failed") or not isinstance(j, str) else "unsubmitted" if j == _REFUSED else
        "unknown" if queued is None else queued.get(j) or queued.get(j.split("_")[0]) or "lost"
        for s, j in zip(table["status"], table["job_id"])]
    return table


def wait(store: ResultStore, *, poll_s: float = 5.0, progress: bool = True, timeout_s: float | None = None):
    """Block until no registered cell has a queued or running job; a progress bar counts the cells
    that are done or failed. Returns :func:`cell_states` at the end.

    Raises:
        TimeoutError: ``timeout_s`` passed first.
    """
    from ..progress import tqdm
    cells, start = store.registered_cells(), time.monotonic()
    with tqdm(total=len(cells), desc=f"sweep {store.root.name}", unit="cell", disable=not progress) as bar:
        while True:
            table = cell_states(store, cells)
            bar.update(int(table["status"].isin(["done", "failed"]).sum()) - bar.n)
            active = ~table["job_state"].isin(["", "lost", "unknown", "unsubmitted"])
            if not active.any():
                return table
            if timeout_s is not None and time.monotonic() - start > timeout_s:
                raise TimeoutError(f"sweep {store.root}: {int(active.sum())} cells still queued or running "
                                   f"after {timeout_s:g} s")
            time.sleep(poll_s)
