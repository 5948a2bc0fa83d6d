"""The MIDAS readout on several backbones side by side (notebook 05): the same protocol, data, seeds and
sample sizes on each, every paper finding evaluated on each; intervals as ``midas-nb report`` draws them."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..metrics import decoupling_D
from ..metrics.probes import hidden_vs_attention_gradient
from ..analysis.findings import BOOTSTRAP_SEED, backbone_fitness, count_fitness, paper_findings
from .store import load_probes, save_probes
from ..results import compact, sample_note
from ..study import cached_study, run_cells, sweep_cells

__all__ = ["BackboneComparison", "compare_backbones"]

_PROBE_TARGETS = ["T2", "T3", "T4", "T5"]


@dataclass
class BackboneComparison:
    """The readout of :func:`compare_backbones`: the regime sweep's ``rows`` of every backbone, the cosine
    ``probes`` at ``depth``, ``D`` (:func:`~midas_nb.metrics.decoupling_D` at the point), the ``findings``,
    the ``accuracy`` per backbone (index ``backbone``) and the cells' :class:`~midas_nb.sweeps.StoreStatus`."""

    backbones: list[str]
    rows: pd.DataFrame
    probes: pd.DataFrame
    D: pd.DataFrame
    findings: pd.DataFrame
    accuracy: pd.DataFrame
    status: Any
    depth: int
    budget: float

    def table(self) -> pd.DataFrame:
        """``D_pp``, ``delta_idauc`` (``m [lo, hi]``, :func:`~midas_nb.results.compact`) and ``status``;
        index ``(condition, backbone)``, the backbones of one condition on adjacent rows."""
        rank = {"condition": list(dict.fromkeys(self.D["condition"])), "backbone": self.backbones}
        d = self.D[self.D["backbone"].isin(self.backbones)].sort_values(
            list(rank), key=lambda c: c.map(rank[c.name].index), kind="stable")
        return compact(d, ["D_pp", "delta_idauc"], index=["condition", "backbone"],
                       signed=["D_pp", "delta_idauc"], keep=["status"])

    def accuracy_table(self) -> pd.DataFrame:
        """Test top-1 of each backbone and its teacher's (``n/a`` for none), ``checkpoint_id``,
        ``n_test_images``; index ``backbone``."""
        return compact(self.accuracy.reset_index(), ["test_accuracy", "teacher_test_accuracy"], index="backbone",
                       keep=["checkpoint_id", "n_test_images"])

    def sample_note(self) -> str:
        """:func:`midas_nb.results.sample_note` of the rows at ``(depth, budget)``; ValueError: none."""
        r = self.rows
        return sample_note(r[(r["depth"] == self.depth) & np.isclose(r["budget"].astype(float), self.budget)]
                           if len(r) else r)

    def findings_table(self) -> pd.DataFrame:
        """Each paper finding's verdict per backbone (columns), then its ``statement``; ``scale`` left out."""
        f = self.findings[self.findings["finding"] != "scale"]
        holds = f.pivot(index="finding", columns="backbone", values="holds")
        statement = f.drop_duplicates("finding").set_index("finding")["statement"]
        holds = holds[[b for b in self.backbones if b in holds.columns]]
        return holds.join(statement).loc[list(dict.fromkeys(f["finding"]))]

    def changed(self) -> list[str]:
        """Findings whose verdict differs between the first two backbones (both decided)."""
        t = self.findings_table()
        if len(self.backbones) < 2:
            return []
        a, b = self.backbones[:2]
        decided = (bool, np.bool_)
        return [fid for fid, r in t.iterrows()
                if isinstance(r[a], decided) and isinstance(r[b], decided) and r[a] != r[b]]


def compare_backbones(study, backbones: Sequence[str] | None = None, *, run: bool = True,
                      executor: str = "local", max_workers: int = 2) -> BackboneComparison:
    """The MIDAS readout of ``study``'s profile on each of ``backbones`` (default: the profile's comparison
    backbones): its regime sweep in the run's result store and the cosine probes at ``L`` (kept with
    :func:`save_probes`). ``run=False`` only reads the store; ``executor``, ``max_workers``: as
    :func:`midas_nb.sweeps.run_sweep`. Raises ValueError: an empty or duplicated backbone list."""
    s = study.settings
    L0, b0 = s.point.depth, float(s.point.budget)
    n_boot = s.statistics.bootstrap   # the profile's resamples, seed BOOTSTRAP_SEED: the report's intervals
    dataset = s.data.dataset    # the study's only: a grid over several datasets must not mix them in one table
    cells = sweep_cells(s.values, "backbones", backbones=backbones)
    backbones = list(dict.fromkeys(c.backbone for c in cells))
    rows, status = run_cells(s.values, cells, run=run, executor=executor, max_workers=max_workers, progress=study.progress)

    acc = []
    for b in backbones:
        st = cached_study(s.values, dataset, b, progress=study.progress)
        m = st.meta
        acc.append(dict(backbone=b, checkpoint_id=m["checkpoint_id"], test_accuracy=m["test_accuracy"],
                        teacher_test_accuracy=(m.get("distillation") or {}).get("teacher_test_accuracy", np.nan),
                        n_test_images=(m.get("test_set") or {}).get("num_images", np.nan)))
        if run:
            save_probes(st, hidden_vs_attention_gradient(st.target_maps(depth=L0, ids=_PROBE_TARGETS),
                                                         bootstrap=n_boot, seed=BOOTSTRAP_SEED))
    pr = load_probes(s.profile)
    pr = pd.DataFrame(columns=["dataset", "backbone", "checkpoint_id", "depth", "hidden", "attention", "cosine", "lo",
                               "hi"]) if pr is None else pr
    probe_table = pr[pr["backbone"].isin(backbones) & (pr["depth"] == L0) & pr["checkpoint_id"].astype(str).isin(
        {a["checkpoint_id"] for a in acc})].reset_index(drop=True)

    at = rows[(rows["depth"] == L0) & np.isclose(rows["budget"].astype(float), b0)] if len(rows) else rows
    D = decoupling_D(at, n_boot=n_boot, ci_seed=BOOTSTRAP_SEED) if len(at) else pd.DataFrame(
        columns=["backbone", "condition", "D_pp", "D_pp_lo", "D_pp_hi", "delta_idauc", "delta_idauc_lo",
                 "delta_idauc_hi", "status"])
    findings = (paper_findings(rows, probe_table if len(probe_table) else None, depth=L0, budget=b0, n_boot=n_boot)
                if len(rows) else pd.DataFrame(columns=["dataset", "backbone", "finding", "statement", "holds",
                                                        "evidence"]))
    ts = study.test_set          # no finding counts on a backbone that has not learned its task (decision 0070)
    findings = count_fitness(findings, {(study.dataset_name, a["backbone"]): backbone_fitness(
        a["test_accuracy"], len(ts), ts.chance_accuracy, ts.majority_fraction,
        a["teacher_test_accuracy"] if a["teacher_test_accuracy"] == a["teacher_test_accuracy"] else None) for a in acc})
    return BackboneComparison(backbones=backbones, rows=rows, probes=probe_table, D=D, findings=findings,
                              accuracy=pd.DataFrame(acc).set_index("backbone"), status=status, depth=L0, budget=b0)
