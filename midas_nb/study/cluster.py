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
    """The cells of each notebook sweep of a profile (:data:`midas_nb.study.grid.CATALOGUE`), ``{"04 regime": cells,
    ...}``; ``planned=True`` reads no data (checkpoint and data ids are placeholders: counts exact, keys not).
    Raises ``ValueError``: an unknown sweep name; a dataset without a data root (``planned=False``)."""
    return {f"{SWEEPS[n]} {n}": sweep_cells(profile, n, planned=planned)
            for n in sweep_names(None if names is None else ",".join(names))}


def catalogue_status(profile: str) -> str:
    """``midas-nb sweep status PROFILE``'s count per notebook sweep of the catalogue, as ``sweep plan`` counts: its
    cells, those shared with a sweep above, those done in ``runs/sweeps/<profile>`` (never created here)."""
    root = config.runs_dir() / "sweeps" / profile
    store = ResultStore(root) if (root / "cells").is_dir() else None
    lines = sweep_lines(profile_sweeps(config.get_profile(profile), planned=True), store, by_coordinates=True)[0]
    return "\n".join([f"cells per notebook sweep of profile {profile} (midas_nb.study.grid.CATALOGUE):", *lines])


def _plan(args: Any, overrides: Mapping[str, Any]) -> int:
    """``midas-nb sweep plan``: print the plan; 0, or 2 with one line on bad input."""
    try:
        prof = config.get_profile(args.profile, **overrides)
        sweeps = profile_sweeps(prof, sweep_names(args.sweep), planned=True)
        max_array, source = args.max_array_size, "--max-array-size"
        if max_array is None:
            max_array = max_array_size()
            source = "scontrol show config" if max_array != DEFAULT_MAX_ARRAY_SIZE else \
                "Slurm's default; scontrol gave no other here"
        root = config.runs_dir() / "sweeps" / prof["profile"]     # read where it exists, never created
        text = plan_text(sweeps, cells_per_job=args.cells_per_job, max_array=max_array, max_array_source=source,
                         store=ResultStore(root) if (root / "cells").is_dir() else None,
                         cost_table=load_cost_table(args.cost), by_coordinates=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"midas-nb sweep plan: {e}", file=sys.stderr)
        return 2
    print(f"sweep plan for profile {prof['profile']} (device {prof['device']}; nothing submitted)")
    print(text)
    return 0


def _submit(args: Any, overrides: Mapping[str, Any]) -> int:
    """``midas-nb sweep submit``: submit (``slurm``: return at once) or run the named sweeps' cells into
    ``runs/sweeps/<profile>``; 0 on success, 1 when a local run left failed cells, 2 (one line) on bad input."""
    from ..sweeps.slurm import SlurmNotFound

    slurm = dict(partition=args.partition, gpus_per_node=args.gpus, cpus_per_task=args.cpus, mem=args.mem,
                 time=args.time, cells_per_job=args.cells_per_job, max_array_size=args.max_array_size)
    slurm = {k: v for k, v in slurm.items() if v is not None}
    try:
        prof = config.get_profile(args.profile, **overrides)
        problems = (config.RunProfile.problems(prof)
                    or config.check_device(prof.get("device"), here=args.executor != "slurm"))
        if problems:
            raise config.ProfileError(problems)
        sweeps = profile_sweeps(prof, sweep_names(args.sweep))
        cells = list({c.key: c for cells in sweeps.values() for c in cells}.values())
        _announce(prof, sweeps, cells, ResultStore(name=prof["profile"]), args)
        # plain progress lines where stderr is no terminal, unless the environment chose a mode (TQDM_DISABLE: none)
        lines = not (args.executor == "slurm" or PROGRESS_ENV in os.environ or progress_mode() == "off"
                     or sys.stderr.isatty())
        with scoped_environ(**({PROGRESS_ENV: "lines"} if lines else {})):
            out = run_cells(prof, cells, wait=args.executor != "slurm", executor=args.executor, slurm=slurm,
                            max_workers=args.workers, progress=True, runner=ProtocolCellRunner(prof))
        out = out if args.executor == "slurm" else out[1]
    except (ValueError, FileNotFoundError, SlurmNotFound) as e:
        print(f"midas-nb sweep submit: {e}", file=sys.stderr)
        return 2
    print(out)
    if args.executor == "slurm":
        print(f"follow it with: midas-nb sweep status {prof['profile']} | midas-nb sweep wait {prof['profile']}")
        return 0
    if not out.complete:
        print(f"failed cells and their errors: midas-nb sweep status {prof['profile']}; "
              f"the same command again retries them (done cells are kept)")
    return 0 if out.complete else 1


def _announce(prof: Mapping[str, Any], sweeps: Mapping[str, Sequence[Any]], cells: Sequence[Any], store: Any,
              args: Any) -> None:
    """Say before anything runs: the sweeps and their cells, how many are done, the store, where they run."""
    done = int(store.status(cells)["status"].eq("done").sum())   # one scan of the store
    where = ("submitting them to Slurm (returns once submitted)" if args.executor == "slurm" else
             f"computing them here ({args.executor}: " + (f"{args.workers} workers" if args.executor == "processes"
                                                          else "one cell after another") +
             "; Ctrl-C stops, the same command resumes)")
    print(f"sweep submit: profile {prof['profile']} (device {prof['device']}): "
          + ", ".join(f"{name} {len(c)} cells" for name, c in sweeps.items()), flush=True)
    print(f"  {len(cells)} distinct cells, {done} already done, {len(cells) - done} to run; {where}", flush=True)
    print(f"  store {store.root}; follow it from another shell with: midas-nb sweep status {prof['profile']}",
          flush=True)


def cmd_from_args(args: Any, overrides: Mapping[str, Any]) -> int:
    """``midas-nb sweep plan|submit`` from the parsed command line (:func:`midas_nb.cli.args.add_sweep_parser`)."""
    return (_plan if args.action == "plan" else _submit)(args, overrides)
