"""The :class:`Study` of the notebooks: a :class:`~midas_nb.study.base.StudyBase` whose protocol,
regime sweeps and scale readout are cells of the profile's result store (``runs/sweeps/<profile>``)."""
from __future__ import annotations

import re
from typing import Any

import pandas as pd

from .. import config
from ..identity import hash_json
from ..point import Point
from ..results import save_table
from ..sweeps import ResultStore, run_sweep, StoreStatus, Submission, submit_sweep
from .base import StudyBase
from ..analysis.control import decoupling_with_controls
from .grid import make_grid, ProtocolCellRunner

__all__ = ["Study"]


def _one_checkpoint(table: pd.DataFrame, what: str) -> None:
    """Raises ``RuntimeError`` where the rows of one build come from more than one checkpoint (decision 0072)."""
    for col in ("checkpoint_id", "weights_digest"):
        for b, g in table.groupby(table.get("build", pd.Series(0, index=table.index))):
            if col in g.columns and g[col].dropna().nunique() > 1:
                found = sorted(g[col].dropna().astype(str).unique())
                raise RuntimeError(f"{what}: the rows of build {b} come from {len(found)} checkpoints ({col} "
                                   f"{found}); one build is one frozen backbone — rebuild the cells with one profile")


class Study(StudyBase):
    """A :class:`StudyBase` with the three-condition protocol, the regime sweeps and the scale readout."""

    # ------------------------------------------------------------------------- protocol
    def protocol(self, depth: int | None = None, budget: float | None = None,
                 conditions: list[str] | None = None, seeds: list[int] | None = None,
                 relaxation: str = "st", builds: int | None = None, **kwargs: Any) -> pd.DataFrame:
        """The three-condition protocol table at ``(depth, budget)``, one row per condition × seed × backbone
        build (``reference``: the first seed only; ``builds``: default the profile's, decision 0072), each a
        cell of the profile's result store; ``relaxation``
        and ``**kwargs`` (of :func:`midas_nb.analysis.protocol.run_protocol`) enter the cells' keys.
        Also written to ``runs/tables/protocol_<name>.csv``. Raises ``RuntimeError``: a cell failed."""
        s = self.settings
        self.own_threads()
        point = Point(s.point.depth if depth is None else depth, s.point.budget if budget is None else budget)
        depth, budget = point.depth, point.budget
        conditions = list(s.protocol.conditions if conditions is None else conditions)
        seeds = [int(x) for x in (s.protocol.seeds if seeds is None else seeds)]
        at_point = dict(self.params, depth=depth, budget=budget, depths=[depth], budgets=[budget],
                        builds=self.params.get("builds", 1) if builds is None else int(builds))
        key = (s.data.dataset, s.backbone.name)
        cells = make_grid(at_point, "scale", datasets=[key[0]], backbones=[key[1]], conditions=conditions,
                          seeds=seeds, params=dict(relaxation=relaxation, **kwargs),
                          checkpoint_ids={key: self.checkpoint_id})
        store = ResultStore(name=s.profile)
        status = run_sweep(cells, ProtocolCellRunner(self.settings, study=self, progress=self.progress), store,
                           progress=self.progress)
        if not status.complete:
            raise RuntimeError(f"protocol at L={depth}, b={budget}: not every cell is done\n{status}")
        table = store.results(cells)
        table.attrs.clear()
        _one_checkpoint(table, f"protocol at L={depth}, b={budget}")
        key = dict(dataset=self.dataset_name, depth=depth, budget=budget,
                   conditions=conditions, seeds=seeds, cells=[c.key for c in cells])
        # readable first (dataset, backbone, point), the content hash last (conditions, seeds, cells)
        readable = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.dataset_name}_{s.backbone.name}").strip("-")
        name = f"protocol_{readable}_L{depth}_b{budget:g}_{hash_json(key, 12)}"
        save_table(table, name, config.runs_dir() / "tables")
        return table

    def decoupling(self, table: pd.DataFrame, controls: list[str] | None = None, **kwargs: Any) -> pd.DataFrame:
        """:func:`midas_nb.analysis.control.decoupling_with_controls` with ``controls`` default
        ``["random_map"]`` where the table has it and the profile's ``bootstrap``."""
        if controls is None:
            controls = ["random_map"] if (table["condition"] == "random_map").any() else []
        kwargs.setdefault("n_boot", self.settings.statistics.bootstrap)
        return decoupling_with_controls(table, controls, **kwargs)

    # --------------------------------------------------------------------------- sweeps
    def sweep(self, kind: str = "regime", executor: str = "local", max_workers: int = 2,
              run: bool = True, *, wait: bool = True, device: str | None = None,
              **slurm: Any) -> tuple[pd.DataFrame, Any] | Submission:
        """``(rows of the done cells, StoreStatus)`` of the sweep :func:`midas_nb.study.make_grid` ``kind``
        through the profile's store, computing missing cells unless ``run=False``. ``wait=False`` (Slurm;
        submitit settings in ``**slurm``) returns the :class:`midas_nb.sweeps.Submission` at once.
        ``device``: the cells'; default the study's, for ``slurm`` the profile's (decision 0038).

        Raises:
            ValueError: ``wait=False`` without ``executor="slurm"`` and ``run=True``.
            midas_nb.config.ProfileError: a bad ``device``, or one this machine lacks (not ``slurm``).
        """
        if not wait and (executor != "slurm" or not run):
            raise ValueError(f"sweep(wait=False) submits to Slurm and returns; it needs executor='slurm' and "
                             f"run=True, got executor={executor!r}, run={run!r}")
        if device is None:
            device = config.get_profile(self.settings.profile)["device"] if executor == "slurm" else None
        params = self.params if device is None else dict(self.params, device=device)
        problems = config.check_device(params["device"], here=executor != "slurm")
        if problems:
            raise config.ProfileError(problems)
        cells = make_grid(params, kind)
        store = ResultStore(name=self.settings.profile)
        # another device (and always on Slurm): the study is not reused
        runner = ProtocolCellRunner(params, study=self if device is None else None, progress=self.progress)
        if not run:
            status = StoreStatus(store.status(cells))
        elif not wait:
            return submit_sweep(cells, runner, store, slurm=slurm or None)
        else:
            status = run_sweep(cells, runner, store, executor=executor, max_workers=max_workers,
                               slurm=slurm or None, progress=self.progress)
        rows = store.results(cells)
        rows.attrs.clear()
        return rows, status

    def scale(self, executor: str = "local", max_workers: int = 2, run: bool = True) -> tuple[pd.DataFrame, Any]:
        """``(rows, status)`` of the scale readout (:func:`midas_nb.study.scale_readout`) on the study's device."""
        device = self.settings.device if executor == "slurm" else None   # (sweep's default there: the profile's)
        return self.sweep("scale", executor, max_workers, run, device=device)
