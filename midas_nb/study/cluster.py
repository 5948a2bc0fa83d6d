"""A profile's sweeps on a cluster: every notebook's grid (:func:`profile_sweeps`, keyed as the
notebooks key them) and ``midas-nb sweep plan|submit`` (:func:`cmd_from_args`; decision 0039)."""
from __future__ import annotations

import os
import sys
from typing import Any, Mapping, Sequence

from .. import config
from ..config import SWEEPS, sweep_names
from ..progress import PROGRESS_ENV, progress_mode
from ..runs import scoped_environ
from ..sweeps import ResultStore, SweepCell
from ..sweeps.plan import load_cost_table, plan_text, sweep_lines
from ..sweeps.slurm import DEFAULT_MAX_ARRAY_SIZE, max_array_size
from .grid import ProtocolCellRunner, run_cells, sweep_cells

__all__ = ["SWEEPS", "profile_sweeps", "catalogue_status", "cmd_from_args"]


def profile_sweeps(profile: Mapping[str, Any], names: Sequence[str] | None = None, *,
                   planned: bool = False) -> dict[str, list[SweepCell]]:
    """``{"04 regime": cells, ...}``: the cells of each notebook sweep of a profile (``planned``: as
    :func:`~midas_nb.study.make_grid`'s). Raises ``ValueError``: an unknown sweep name; a dataset without a root."""
    return {f"{SWEEPS[n]} {n}": sweep_cells(profile, n, planned=planned)
            for n in sweep_names(None if names is None else ",".join(names))}


def _store(profile: str) -> ResultStore | None:
    """The store of ``profile`` (``runs/sweeps/<profile>``) where it exists; never created here."""
    return ResultStore(name=profile) if (config.runs_dir() / "sweeps" / profile / "cells").is_dir() else None


def catalogue_status(profile: str) -> str:
    """``midas-nb sweep status PROFILE``'s count per notebook sweep, as ``sweep plan`` counts (:func:`sweep_lines`)."""
    lines = sweep_lines(profile_sweeps(config.get_profile(profile), planned=True), _store(profile))[0]
    return "\n".join([f"cells per notebook sweep of profile {profile} (midas_nb.study.grid.CATALOGUE):", *lines])


def _plan(args: Any, overrides: Mapping[str, Any]) -> int:
    """``midas-nb sweep plan``: print the plan; 0."""
    prof = config.get_profile(args.profile, **overrides)
    sweeps = profile_sweeps(prof, sweep_names(args.sweep), planned=True)
    max_array = max_array_size() if args.max_array_size is None else args.max_array_size
    source = ("--max-array-size" if args.max_array_size is not None else "scontrol show config"
              if max_array != DEFAULT_MAX_ARRAY_SIZE else "Slurm's default; scontrol gave no other here")
    text = plan_text(sweeps, cells_per_job=args.cells_per_job, max_array=max_array, max_array_source=source,
                     store=_store(prof["profile"]), cost_table=load_cost_table(args.cost))
    print(f"sweep plan for profile {prof['profile']} (device {prof['device']}; nothing submitted)\n{text}")
    return 0


def _submit(args: Any, overrides: Mapping[str, Any]) -> int:
    """``midas-nb sweep submit``: say what runs where, then submit or run the cells; 1 where a local run failed one."""
    here, prof = args.executor != "slurm", config.get_profile(args.profile, **overrides)
    slurm = dict(partition=args.partition, gpus_per_node=args.gpus, cpus_per_task=args.cpus, mem=args.mem,
                 time=args.time, cells_per_job=args.cells_per_job, max_array_size=args.max_array_size)
    if problems := config.RunProfile.problems(prof) or config.check_device(prof.get("device"), here=here):
        raise config.ProfileError(problems)
    sweeps = profile_sweeps(prof, sweep_names(args.sweep))
    cells = list({c.key: c for cells in sweeps.values() for c in cells}.values())
    store, name = ResultStore(name=prof["profile"]), prof["profile"]
    done = int(store.status(cells)["status"].eq("done").sum())   # one scan of the store
    where = ("computing them here (local: one cell after another; Ctrl-C stops, the same command resumes)" if here else
             "submitting them to Slurm (returns once submitted)")
    print(f"sweep submit: profile {name} (device {prof['device']}): "
          + ", ".join(f"{n} {len(c)} cells" for n, c in sweeps.items()),
          f"  {len(cells)} distinct cells, {done} already done, {len(cells) - done} to run; {where}",
          f"  store {store.root}; follow it from another shell with: midas-nb sweep status {name}",
          sep="\n", flush=True)
    # plain progress lines where stderr is no terminal, unless the environment chose a mode (TQDM_DISABLE: none)
    lines = here and not (PROGRESS_ENV in os.environ or progress_mode() == "off" or sys.stderr.isatty())
    with scoped_environ(**({PROGRESS_ENV: "lines"} if lines else {})):
        out = run_cells(prof, cells, wait=here, executor=args.executor, progress=True, slurm=slurm,
                        runner=ProtocolCellRunner(prof))
    print(out[1] if here else out)
    if not here:
        print(f"follow it with: midas-nb sweep status {name} | midas-nb sweep wait {name}")
    elif not out[1].complete:
        print(f"failed cells and their errors: midas-nb sweep status {name}; "
              f"the same command again retries them (done cells are kept)")
    return 0 if not here or out[1].complete else 1


def cmd_from_args(args: Any, overrides: Mapping[str, Any]) -> int:
    """``midas-nb sweep plan|submit`` from the parsed command line. Raises ``ValueError`` (``ProfileError`` too),
    ``FileNotFoundError`` (``--cost``) or :class:`~midas_nb.sweeps.slurm.SlurmNotFound` before submitting anything."""
    return (_plan if args.action == "plan" else _submit)(args, overrides)
