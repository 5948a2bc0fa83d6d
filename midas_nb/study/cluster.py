"""A profile's sweeps on a cluster: every notebook's grid (:func:`profile_sweeps`, the cells the
notebooks compute, keyed as they key them), ``midas-nb sweep plan`` (:func:`cmd_plan`: jobs,
arrays, cells, projected GPU-hours, nothing submitted) and ``midas-nb sweep submit``
(:func:`submit_profile`, :func:`cmd_submit`: returns after submission; ``status``, ``wait``,
``resubmit`` follow the store ``runs/sweeps/<profile>``).
"""
from __future__ import annotations

import sys
from typing import Any, Mapping, Sequence

from .. import config
from ..backbones import comparison_backbones
from ..analysis.protocol import list_conditions
from ..analysis.related import RELATED_CONDITIONS
from ..sweeps import ResultStore, SweepCell, open_store, run_sweep, submit_sweep
from ..sweeps.plan import load_cost_table, plan_text
from ..sweeps.slurm import DEFAULT_MAX_ARRAY_SIZE, max_array_size
from .grid import grid_spans, make_grid
from .runner import ProtocolCellRunner
from .settings import profile_values

__all__ = ["SWEEPS", "profile_sweeps", "submit_profile", "cmd_plan", "cmd_submit", "cmd_from_args"]

#: the sweeps of a profile, by name, with the notebook that reads them
SWEEPS: dict[str, str] = {"protocol": "02", "soft": "02", "random": "02", "regime": "04", "scale": "05",
                          "backbones": "05", "related": "06"}


class _Planned(dict):
    """Ids for a plan: the same placeholder for every (dataset, backbone); nothing is read."""

    def get(self, key: Any, default: Any = None) -> str:
        return "planned"

    def __bool__(self) -> bool:  # make_grid reads ``data_ids or {}``
        return True


def _specs(prof: Mapping[str, Any]) -> dict[str, list[tuple[dict, str, dict]]]:
    """``{name: [(profile, kind, make_grid keywords), ...]}`` as the notebooks call them."""
    L0, b0 = int(prof["depth"]), float(prof["budget"])
    point = dict(prof, depths=[L0], budgets=[b0])
    own = dict(datasets=[prof["dataset"]], backbones=[prof["backbone"]])
    seeds = [int(s) for s in prof["seeds"]]
    known = set(list_conditions())
    related = [c for c in RELATED_CONDITIONS if c in known]
    shared = [c for c in related if c in prof["conditions"]]
    other = [c for c in related if c not in shared]
    rel_seeds = [int(s) for s in (prof.get("related_seeds") or seeds)]
    return {
        "protocol": [(point, "scale", dict(own, conditions=list(prof["conditions"]), seeds=seeds,
                                           params=dict(relaxation="st")))],
        "soft": [(point, "scale", dict(own, conditions=["reference", "unsupervised", "T5"], seeds=seeds[:1],
                                       params=dict(relaxation="soft")))],
        "random": [(point, "scale", dict(own, conditions=["random"], seeds=seeds, params=dict(relaxation="st")))],
        "regime": [(dict(prof), "regime", {})],
        "scale": [(dict(prof), "scale", {})],
        "backbones": [(dict(prof), "regime", dict(datasets=[prof["dataset"]], backbones=comparison_backbones(dict(prof))))],
        "related": [(point, "scale", dict(own, conditions=conds, seeds=s, params=dict(relaxation="st")))
                    for conds, s in ((shared, seeds), (other, rel_seeds)) if conds],
    }


def profile_sweeps(profile: str | Mapping[str, Any], names: Sequence[str] | None = None, *,
                   planned: bool = False) -> dict[str, list[SweepCell]]:
    """The cells of each notebook sweep of a profile, ``{"04 regime": cells, ...}`` (see the module
    docstring; :data:`SWEEPS` names them). ``planned=True`` reads no data: every checkpoint and
    data id is a placeholder (counts and layout are exact, keys are not the store's).

    Raises:
        ValueError: an unknown sweep name; a dataset without a data root (``planned=False``).
    """
    prof = profile_values(profile)
    names = list(SWEEPS) if names is None else list(names)
    bad = [n for n in names if n not in SWEEPS]
    if bad:
        raise ValueError(f"unknown sweep(s) {bad}; expected some of {list(SWEEPS)} (or 'all')")
    specs = _specs(prof)
    out: dict[str, list[SweepCell]] = {}
    for name in names:
        cells: list[SweepCell] = []
        for p, kind, kw in specs[name]:
            if planned:
                datasets = set(grid_spans(p, kind)[0]) | {p["dataset"]}
                p = dict(p, data_root=None, data_roots={d: "." for d in datasets if d != "synthetic"})
                kw = dict(kw, checkpoint_ids=_Planned(), data_ids=_Planned())
            cells += make_grid(p, kind, **kw)
        out[f"{SWEEPS[name]} {name}"] = cells
    return out


def _union(sweeps: Mapping[str, Sequence[SweepCell]]) -> list[SweepCell]:
    return list({c.key: c for cells in sweeps.values() for c in cells}.values())


def submit_profile(profile: str | Mapping[str, Any], names: Sequence[str] | None = None, *,
                   executor: str = "slurm", slurm: Mapping[str, Any] | None = None, max_workers: int = 2,
                   store: str | None = None, progress: bool = False):
    """Submit (``slurm``: return at once) or run (``local``, ``processes``) the cells of the named
    sweeps (default every one) into the store ``runs/sweeps/<profile>`` (or ``store``).

    Returns:
        :class:`midas_nb.sweeps.Submission` for ``slurm``; the :class:`midas_nb.sweeps.StoreStatus`
        after the run otherwise.

    Raises:
        midas_nb.config.ProfileError: a device that is no device name or (``local``,
            ``processes``) that this machine lacks ("cuda" without CUDA).
        midas_nb.sweeps.slurm.SlurmNotFound: ``slurm`` without Slurm.
    """
    prof = profile_values(profile)
    problems = config.check_device(prof.get("device"), here=executor != "slurm")
    if problems:
        raise config.ProfileError(problems)
    cells = _union(profile_sweeps(prof, names))
    st = open_store(store or prof["profile"])
    runner = ProtocolCellRunner(prof, progress=progress)
    if executor == "slurm":
        return submit_sweep(cells, runner, st, slurm=slurm)
    return run_sweep(cells, runner, st, executor=executor, max_workers=max_workers, progress=progress)


def _names(sweep: str | None) -> list[str] | None:
    return None if sweep in (None, "all") else [s.strip() for s in sweep.split(",") if s.strip()]


def cmd_plan(profile: str, sweep: str | None = None, *, cells_per_job: int = 8, max_array: int | None = None,
             cost: str | None = None, store: str | None = None, overrides: Mapping[str, Any] | None = None) -> int:
    """``midas-nb sweep plan``: print the plan (:func:`midas_nb.sweeps.plan.plan_text`); 0, or 2
    with one line on bad input."""
    try:
        prof = config.get_profile(profile, **dict(overrides or {}))
        sweeps = profile_sweeps(prof, _names(sweep), planned=True)
        if max_array is not None:
            source = "--max-array-size"
        else:
            max_array = max_array_size()
            source = "scontrol show config" if max_array != DEFAULT_MAX_ARRAY_SIZE else \
                f"Slurm's default {DEFAULT_MAX_ARRAY_SIZE} (scontrol unreadable here or the same)"
        root = open_store(store) if store else ResultStore(config.runs_dir() / "sweeps" / prof["profile"])
        text = plan_text(sweeps, cells_per_job=cells_per_job, max_array=max_array, max_array_source=source,
                         store=root, cost_table=load_cost_table(cost), by_coordinates=True)
    except (ValueError, FileNotFoundError) as e:
        print(f"midas-nb sweep plan: {e}", file=sys.stderr)
        return 2
    print(f"sweep plan for profile {prof['profile']} (device {prof['device']}; nothing submitted)")
    print(text)
    return 0


def cmd_submit(profile: str, sweep: str | None = None, *, executor: str = "slurm", slurm: Mapping[str, Any],
               max_workers: int = 2, store: str | None = None, overrides: Mapping[str, Any] | None = None) -> int:
    """``midas-nb sweep submit``: submit (or run) the sweeps; prints what was submitted. 0 on
    success, 1 when a local run left failed cells, 2 with one line on bad input."""
    from ..sweeps.slurm import SlurmNotFound

    try:
        prof = config.get_profile(profile, **dict(overrides or {}))
        problems = config.check_profile(prof, device=False)
        if problems:
            raise config.ProfileError(problems)
        out = submit_profile(prof, _names(sweep), executor=executor, slurm=slurm, max_workers=max_workers,
                             store=store)
    except (ValueError, FileNotFoundError, SlurmNotFound) as e:
        print(f"midas-nb sweep submit: {e}", file=sys.stderr)
        return 2
    print(out)
    if executor == "slurm":
        print(f"follow it with: midas-nb sweep status {store or prof['profile']} | midas-nb sweep wait "
              f"{store or prof['profile']}")
        return 0
    return 0 if out.complete else 1


def cmd_from_args(args: Any, overrides: Mapping[str, Any]) -> int:
    """``midas-nb sweep plan|submit`` from the parsed command line (:func:`midas_nb.cli.args.add_sweep_parser`)."""
    if args.action == "plan":
        return cmd_plan(args.profile, args.sweep, cells_per_job=args.cells_per_job, max_array=args.max_array_size,
                        cost=args.cost, overrides=overrides)
    slurm = dict(partition=args.partition, gpus_per_node=args.gpus, cpus_per_task=args.cpus, mem=args.mem,
                 time=args.time, cells_per_job=args.cells_per_job, max_array_size=args.max_array_size)
    return cmd_submit(args.profile, args.sweep, executor=args.executor, max_workers=args.workers,
                      slurm={k: v for k, v in slurm.items() if v is not None}, overrides=overrides)
