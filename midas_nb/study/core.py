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
from ..sweeps import Submission
from .base import StudyBase
from ..analysis.control import decoupling_with_controls
from ..analysis.findings import backbone_fitness
from .grid import CATALOGUE, cached_study, catalogue_value, run_cells, sweep_cells

__all__ = ["Study", "with_builds"]


def with_builds(table: pd.DataFrame) -> pd.DataFrame:
    """``table`` with an integer ``build`` column: a row stored without one is build 0 (decision 0072)."""
    return table.assign(build=table.reindex(columns=["build"])["build"].fillna(0).astype(int))


class Study(StudyBase):
    """A :class:`StudyBase` with the three-condition protocol, the regime sweeps and the scale readout."""

    def protocol(self, sweep: str = "protocol", depth: int | None = None, budget: float | None = None,
                 conditions: list[str] | None = None, seeds: list[int] | None = None,
                 relaxation: str | None = None, builds: int | None = None, **kwargs: Any) -> pd.DataFrame:
        """The protocol table at ``(depth, budget)`` of the catalogue's ``sweep`` (02's ``"protocol"``, ``"soft"``,
        ``"random"``, 06's ``"related"``), a row per condition × seed × build (0072), cells of the profile's store
        (given lists override the catalogue's; ``**kwargs`` of :func:`~midas_nb.analysis.protocol.run_protocol`
        enter their keys); also ``runs/tables/protocol_<name>.csv``. ``RuntimeError``: a cell failed."""
        s = self.settings
        self.own_threads()
        pt = Point(s.point.depth if depth is None else depth, s.point.budget if budget is None else budget)
        depth, budget = pt.depth, pt.budget
        cells = sweep_cells(dict(self.params, depth=depth, budget=budget), sweep, conditions=conditions,
                            seeds=seeds, relaxation=relaxation, builds=builds, params=kwargs,
                            checkpoint_ids={(s.data.dataset, s.backbone.name): self.checkpoint_id})
        table, status = run_cells(self.params, cells, study=self, progress=self.progress)
        what = f"protocol at L={depth}, b={budget}"
        if not status.complete:
            raise RuntimeError(f"{what}: not every cell is done\n{status}")
        table = with_builds(table)
        for col in [c for c in ("checkpoint_id", "weights_digest") if c in table.columns]:   # decision 0072
            for b, g in table.groupby("build"):
                if g[col].dropna().nunique() > 1:
                    found = sorted(g[col].dropna().astype(str).unique())
                    raise RuntimeError(f"{what}: the rows of build {b} come from {len(found)} checkpoints ({col} "
                                       f"{found}); one build is one frozen backbone — rebuild the cells with one "
                                       "profile")
        named = catalogue_value(self.params, "seeds", CATALOGUE.get(sweep, ({},))[0].get("seeds"))
        key = dict(dataset=self.dataset_name, depth=depth, budget=budget,
                   conditions=list(conditions or dict.fromkeys(c.condition for c in cells)),
                   seeds=[int(x) for x in seeds or named or dict.fromkeys(c.seed for c in cells)],
                   cells=[c.key for c in cells])
        # readable first (dataset, backbone, point), the content hash last (conditions, seeds, cells)
        readable = re.sub(r"[^A-Za-z0-9._-]+", "-", f"{self.dataset_name}_{s.backbone.name}").strip("-")
        save_table(table, f"protocol_{readable}_L{depth}_b{budget:g}_{hash_json(key, 12)}",
                   config.runs_dir() / "tables")
        return table

    def fitness(self) -> dict[int, tuple[bool, str]]:
        """``{build: (fit, text)}``: each build's :func:`~midas_nb.analysis.backbone_fitness` (decisions 0070, 0082)."""
        b = self.settings.backbone
        out = {}
        for k in range(b.build, b.build + b.builds):
            st = self if k == b.build else cached_study(self.params, self.dataset_name, b.name, None, self.progress, k)
            teacher, ts = (st.meta.get("distillation") or {}).get("teacher_test_accuracy"), st.test_set
            out[k] = backbone_fitness(st.meta["test_accuracy"], len(ts), ts.chance_accuracy, ts.majority_fraction,
                                      teacher)
        return out

    def decoupling(self, table: pd.DataFrame, controls: list[str] | None = None, **kwargs: Any) -> pd.DataFrame:
        """:func:`~midas_nb.analysis.control.decoupling_with_controls` (``random_map`` where present; own bootstrap)."""
        if controls is None:
            controls = ["random_map"] if (table["condition"] == "random_map").any() else []
        kwargs.setdefault("n_boot", self.settings.statistics.bootstrap)
        return decoupling_with_controls(table, controls, **kwargs)

    def sweep(self, name: str = "regime", executor: str = "local", run: bool = True, *,
              wait: bool = True, device: str | None = None, **slurm: Any) -> tuple[pd.DataFrame, Any] | Submission:
        """:func:`~midas_nb.study.run_cells` of the catalogue's sweep ``name`` (04's ``"regime"``, 05's ``"scale"``;
        else a :func:`~midas_nb.study.make_grid` kind); Slurm settings in ``**slurm``; ``device``: default the
        study's, on Slurm the profile's (0038). ``ValueError``: ``wait=False`` without ``executor="slurm"`` and
        ``run=True``; :class:`midas_nb.config.ProfileError`: a bad ``device``, or one this machine lacks."""
        if not wait and (executor != "slurm" or not run):
            raise ValueError(f"sweep(wait=False) submits to Slurm and returns; it needs executor='slurm' and "
                             f"run=True, got executor={executor!r}, run={run!r}")
        if device is None:
            device = config.get_profile(self.settings.profile)["device"] if executor == "slurm" else None
        params = self.params if device is None else dict(self.params, device=device)
        if problems := config.check_device(params["device"], here=executor != "slurm"):
            raise config.ProfileError(problems)
        return run_cells(params, sweep_cells(params, name), run=run, wait=wait, executor=executor, slurm=slurm,
                         progress=self.progress, study=self if device is None else None)
