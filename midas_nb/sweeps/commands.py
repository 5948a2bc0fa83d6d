"""``midas-nb sweep status | wait | resubmit``: the generic sweep commands (no domain import).

Each returns an exit status: ``status`` is non-zero while failed, lost or never-submitted cells or
invalid store files remain (so a script can gate on it), ``wait`` likewise once nothing is queued,
``resubmit`` 0 after submitting (or when nothing needed it).
"""
from __future__ import annotations

import sys

from .slurm import SUBMISSION, SlurmNotFound, cell_states, resubmit, wait
from .store import all_stores, format_status, n_unusable, open_store

__all__ = ["cmd_status", "cmd_wait", "cmd_resubmit"]


def _print_table(table) -> int:
    print(format_status(table))
    for state in ("PENDING", "RUNNING", "lost"):
        rows = table[table["job_state"] == state]
        if len(rows):
            jobs = ", ".join(sorted(set(rows["job_id"].astype(str))))
            print(f"  {len(rows)} cells {state.lower()}: jobs {jobs}")
    unsent = int(table["job_state"].eq("unsubmitted").sum())
    if unsent:
        print(f"  {unsent} cells never submitted (sbatch refused): midas-nb sweep resubmit sends them")
    return 1 if n_unusable(table) or table["job_state"].isin(["lost", "unsubmitted"]).any() else 0


def _each_store(action: str, names: list[str], fn, none: str = "no sweeps found") -> int:
    """``fn(store)`` for each named store, exit statuses OR-ed; a store that cannot be opened or
    a refused submission is one line on stderr, exit status 2."""
    if not names:
        print(none)
    rc = 0
    for n in names:
        try:
            rc |= fn(open_store(n, must_exist=True))
        except (FileNotFoundError, ValueError, SlurmNotFound) as e:
            print(f"midas-nb sweep {action}: {e}", file=sys.stderr)
            return 2
    return rc


def cmd_status(name: str | None) -> int:
    """Print done / failed / running / pending cells with their jobs of the store (``None``: of every store); 1 while
    failures, lost jobs or invalid files remain."""
    return _each_store("status", [name] if name is not None else all_stores(),
                       lambda store: _print_table(cell_states(store)))


def cmd_wait(name: str | None, poll_s: float = 10.0) -> int:
    """Wait (a progress bar) until nothing of the sweep (``None``: of every store) is queued;
    then as :func:`cmd_status`."""
    return _each_store("wait", [name] if name is not None else all_stores(),
                       lambda store: _print_table(wait(store, poll_s=poll_s, progress=True)))


def _resubmit_one(store) -> int:
    jobs = resubmit(store)
    print(f"{store.root.name}: resubmitted {sum(len(j.cells) for j in jobs)} cells in {len(jobs)} jobs: "
          f"{', '.join(str(j.job_id) for j in jobs) or 'none needed'}")
    return 0


def cmd_resubmit(name: str | None) -> int:
    """Resubmit the failed, lost (cancelled, timed-out) and never-submitted cells of the sweep
    (``None``: of every submitted store) with its last submission's settings."""
    names = [name] if name is not None else [n for n in all_stores() if (open_store(n).root / SUBMISSION).is_file()]
    return _each_store("resubmit", names, _resubmit_one, "no submitted sweeps found")
