"""Slurm as the sweep engine sees it: ``MaxArraySize``, the jobs a sweep is cut into (:func:`plan_jobs`), submitit's
executor, the jobs' state from ``squeue`` (:func:`cell_states`, :func:`wait`; decision 0078)."""
from __future__ import annotations

import re
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from .store import ResultStore, SweepCell

__all__ = ["DEFAULT_MAX_ARRAY_SIZE", "REFUSED", "SlurmNotFound", "chunk_arrays", "max_array_size", "plan_jobs",
           "scheduler_states", "slurm_executor", "cell_states", "wait"]

#: Slurm's default ``MaxArraySize`` (used when ``scontrol show config`` cannot be read)
DEFAULT_MAX_ARRAY_SIZE = 1001
#: the job id ``jobs.json`` gives a cell whose submission sbatch refused (``unsubmitted`` until submitted again)
REFUSED = "refused"


class SlurmNotFound(RuntimeError):
    """``executor="slurm"`` without a working Slurm: no ``sbatch``, or one that refuses the submission."""


def _stdout(*cmd: str) -> str | None:
    """``cmd``'s standard output; ``None`` where it is missing, fails or runs over a minute."""
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout if out.returncode == 0 else None


def max_array_size(default: int = DEFAULT_MAX_ARRAY_SIZE) -> int:
    """The cluster's ``MaxArraySize`` (``scontrol show config``); ``default`` when unreadable."""
    m = re.search(r"^\s*MaxArraySize\s*=\s*(\d+)", _stdout("scontrol", "show", "config") or "", re.MULTILINE)
    return int(m.group(1)) if m and int(m.group(1)) > 0 else default


def scheduler_states(job_ids: Sequence[str]) -> dict[str, str] | None:
    """``squeue``'s state of each queued or running job (``PENDING``, ...) by job id (``123`` or array task
    ``123_4``); ``None`` without a working ``squeue``. Not submitit's ``Job.state``, which needs ``sacct`` (0078)."""
    if (out := _stdout("squeue", "-h", "-r", "-o", "%i|%T")) is None:
        return None
    wanted = set(job_ids)
    states = dict(line.strip().partition("|")[::2] for line in out.splitlines())
    return {j: s for j, s in states.items() if j in wanted or j.split("_")[0] in wanted}


def plan_jobs(cells: Sequence[SweepCell], cells_per_job: int) -> tuple[list[SweepCell], list[list[SweepCell]]]:
    """``(prepare, chunks)``: one cell per (dataset, backbone, checkpoint) for its preparation job, and the cells in
    jobs of at most ``cells_per_job`` that never mix those groups. Raises ``ValueError``: ``cells_per_job < 1``."""
    if (n := int(cells_per_job)) < 1:
        raise ValueError(f"cells_per_job must be >= 1, got {cells_per_job!r}")
    groups: dict[tuple[str, str, str], list[SweepCell]] = {}
    for c in cells:
        groups.setdefault((c.dataset, c.backbone, c.checkpoint_id), []).append(c)
    return [g[0] for g in groups.values()], [g[i:i + n] for g in groups.values() for i in range(0, len(g), n)]


def chunk_arrays(n_jobs: int, max_array: int) -> list[range]:
    """Job indices ``0..n_jobs-1`` cut into arrays of at most ``max_array`` tasks."""
    if max_array < 1:
        raise ValueError(f"MaxArraySize must be >= 1, got {max_array}")
    return [range(i, min(i + max_array, n_jobs)) for i in range(0, n_jobs, max_array)]


def slurm_executor(folder: Path, cluster: str | None, params: Mapping[str, Any]):
    """``(submitit executor, cluster)`` for ``cluster`` (``None``/``"slurm"``, ``"local"``, ``"debug"``). Raises
    :class:`SlurmNotFound`: Slurm and no ``sbatch`` on the ``PATH``; ``ValueError``: an unknown ``cluster``."""
    import submitit

    if cluster not in (None, "slurm", "local", "debug"):
        raise ValueError(f"slurm cluster {cluster!r} is not known; expected None or 'slurm' (a Slurm cluster), "
                         "'local' or 'debug' (submitit's stand-ins on this machine)")
    if cluster in (None, "slurm") and shutil.which("sbatch") is None:
        raise SlurmNotFound("the Slurm executor needs a Slurm cluster, but no 'sbatch' is on this machine's PATH; "
                            "submit from a Slurm login node or run here (--executor local, or executor='local')")
    ex = submitit.AutoExecutor(folder=folder, cluster=cluster or "slurm")
    ex.update_parameters(**params)
    return ex, cluster or "slurm"


def cell_states(store: ResultStore, cells: Sequence[SweepCell] | None = None):
    """:meth:`ResultStore.status` with ``job_state`` of each cell without a record: its job's Slurm state, ``lost``
    (left the queue), ``unsubmitted`` (sbatch refused it), ``unknown`` (no Slurm); empty: a record, or never sent."""
    table = store.status(cells)
    ids = [j for j in table["job_id"].dropna() if j != REFUSED]
    queued = scheduler_states(ids) if ids else {}       # no job to ask squeue about: a first submission
    table["job_state"] = [
        "" if s in ("done", "failed") or not isinstance(j, str) else "unsubmitted" if j == REFUSED else
        "unknown" if queued is None else queued.get(j) or queued.get(j.split("_")[0]) or "lost"
        for s, j in zip(table["status"], table["job_id"])]
    return table


def wait(store: ResultStore, *, poll_s: float = 5.0, progress: bool = True, timeout_s: float | None = None):
    """Block until no registered cell's job is queued or running; returns :func:`cell_states` (``TimeoutError``)."""
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
