"""The MIDAS readout on several backbones side by side (notebook 05, issue 18): the label-trained offline
backbone and its distilled student read out with the same protocol, data, seeds and sample sizes, every
paper finding evaluated on each by :func:`midas_nb.report.paper_findings`. Every interval uses the profile's
``bootstrap`` resamples and seed :data:`midas_nb.report.BOOTSTRAP_SEED`, as ``midas-nb report`` does.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import pandas as pd

from ..metrics import decoupling_D
from ..metrics.probes import hidden_vs_attention_gradient
from ..analysis.findings import BOOTSTRAP_SEED, paper_findings
from .probes import load_probes, save_probes
from ..results import compact, sample_note
from ..study import ProtocolCellRunner, cached_study, make_grid
from ..sweeps import ResultStore, StoreStatus, run_sweep

__all__ = ["BackboneComparison", "compare_backbones"]

_PROBE_TARGETS = ["T2", "T3", "T4", "T5"]


@dataclass
class BackboneComparison:
    """The readout of :func:`compare_backbones`.

    Attributes:
        backbones: in display order.
        rows: protocol result rows of the regime sweep, every backbone (``backbone`` column).
        probes: hidden- vs attention-gradient cosines at ``depth`` (``dataset``, ``backbone``,
            ``checkpoint_id``, ``depth``, ``hidden``, ``attention``, ``cosine``, ``lo``, ``hi``).
        D: :func:`midas_nb.metrics.decoupling_D` at ``(depth, budget)``, one row per backbone ×
            condition, with paired 95 % intervals and band status.
        findings: :func:`midas_nb.report.paper_findings` of ``rows`` and ``probes``.
        accuracy: per backbone, the checkpoint id, its test top-1 (fraction; and the teacher's,
            for a distilled backbone) and ``n_test_images`` it was measured on.
        status: :class:`midas_nb.sweeps.StoreStatus` of the cells (``complete`` False while a
            cell failed or is pending).
        depth, budget: the point ``(L, b)``.
    """

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
        """``D`` per condition and backbone, in the reader's format
        (:func:`midas_nb.results.compact`): ``D_pp`` (percentage points) and ``delta_idauc``
        as ``m [lo, hi]`` with their paired 95 % intervals (``n/a`` where undefined), then the
        band ``status``.

        Returns:
            Index ``(condition, backbone)`` — conditions in the order of :attr:`D`, backbones in
            :attr:`backbones` order, so the backbones of one condition stand on adjacent rows;
            three columns whatever the number of backbones.
        """
        order = {b: i for i, b in enumerate(self.backbones)}
        conds = {c: i for i, c in enumerate(dict.fromkeys(self.D["condition"]))}
        d = self.D[self.D["backbone"].isin(order)]
        d = d.iloc[sorted(range(len(d)), key=lambda i: (conds[d["condition"].iloc[i]],
                                                         order[d["backbone"].iloc[i]]))]
        return compact(d, ["D_pp", "delta_idauc"], index=["condition", "backbone"],
                       signed=["D_pp", "delta_idauc"], keep=["status"])

    def accuracy_table(self) -> pd.DataFrame:
        """Top-1 test accuracy (fraction) of each unpruned backbone and, for a distilled one, of
        its teacher (``n/a`` otherwise), as :func:`midas_nb.results.compact` prints them; then
        ``checkpoint_id`` and ``n_test_images`` (the images the accuracy was measured on).
        Index = backbone."""
        return compact(self.accuracy.reset_index(), ["test_accuracy", "teacher_test_accuracy"], index="backbone",
                       keep=["checkpoint_id", "n_test_images"])

    def sample_note(self) -> str:
        """The sample and settings line of :meth:`table` and :meth:`findings_table`: the rows at
        ``(depth, budget)`` read by :func:`midas_nb.results.sample_note` (images, seeds,
        training, ``(L, b)``, the backbones and their checkpoints).

        Raises:
            ValueError: no rows at ``(depth, budget)``.
        """
        r = self.rows
        at = r[(r["depth"] == self.depth) & np.isclose(r["budget"].astype(float), self.budget)] if len(r) else r
        return sample_note(at)

    def findings_table(self) -> pd.DataFrame:
        """Does each paper finding hold? Index = finding, one column per backbone (``True`` /
        ``False`` / ``"not resolved"`` / ``"undefined"``), then the paper's statement; the
        cross-backbone ``scale`` finding is left out (notebook 05's scale readout shows it)."""
        f = self.findings[self.findings["finding"] != "scale"]
        holds = f.pivot(index="finding", columns="backbone", values="holds")
        holds = holds[[b for b in self.backbones if b in holds.columns]]
        statement = f.drop_duplicates("finding").set_index("finding")["statement"]
        order = list(dict.fromkeys(f["finding"]))
        return holds.join(statement).loc[order]

    def changed(self) -> list[str]:
        """Findings whose verdict differs between the first two backbones (both decided)."""
        t = self.findings_table()
        if len(self.backbones) < 2:
            return []
        a, b = self.backbones[:2]
        return [fid for fid, r in t.iterrows()
                if isinstance(r[a], (bool, np.bool_)) and isinstance(r[b], (bool, np.bool_)) and r[a] != r[b]]


def compare_backbones(study, backbones: Sequence[str] | None = None, *, run: bool = True,
                      executor: str = "local", max_workers: int = 2) -> BackboneComparison:
    """The MIDAS readout of ``study``'s profile on each backbone of ``backbones``: its regime sweep in the run's
    result store, and the cosine probes at ``L`` (kept with :func:`save_probes`, so ``midas-nb report`` shows them).

    Args:
        study: a :class:`midas_nb.study.Study` (its profile, data, ``(L, b)``, seeds and sweep
            settings are used; its own backbone need not be among ``backbones``).
        backbones: default :func:`midas_nb.backbones.comparison_backbones` of the study's settings.
        run: compute missing sweep cells and probes; ``False`` only reads the store (probes
            then come from :func:`midas_nb.report.load_probes`).
        executor, max_workers: as :func:`midas_nb.sweeps.run_sweep`.

    Returns:
        A :class:`BackboneComparison`.

    Raises:
        ValueError: an empty or duplicated backbone list.
    """
    s = study.settings   # the typed parts; the sweep layer takes them whole (make_grid, ProtocolCellRunner)
    if backbones is None:
        backbones = list(s.sweep.compare_backbones) if s.sweep.other_backbones else [s.backbone.name]
    backbones = list(backbones)
    if not backbones or len(set(backbones)) != len(backbones):
        raise ValueError(f"compare_backbones needs distinct backbones, got {backbones}")
    L0, b0 = s.point.depth, float(s.point.budget)
    n_boot = s.statistics.bootstrap   # the profile's resamples, seed BOOTSTRAP_SEED: the report's intervals
    # the study's dataset only: a profile whose grid spans several datasets (paper, rehearsal)
    # must not mix them in one side-by-side table
    dataset = s.data.dataset
    cells = make_grid(s, "regime", datasets=[dataset], backbones=backbones)
    store = ResultStore(name=s.profile)
    if run:
        status = run_sweep(cells, ProtocolCellRunner(s, progress=study.progress), store, executor=executor,
                           max_workers=max_workers, progress=study.progress)
    else:
        table = store.status(cells)
        status = StoreStatus(table=table, problems=table.attrs.get("problems", []))
    rows = store.results(cells)
    rows.attrs.clear()

    acc = []
    for b in backbones:
        st = cached_study(s, dataset, b, progress=study.progress)
        m = st.meta
        d = m.get("distillation") or {}
        acc.append(dict(backbone=b, checkpoint_id=m["checkpoint_id"], test_accuracy=m["test_accuracy"],
                        teacher_test_accuracy=d.get("teacher_test_accuracy", np.nan),
                        n_test_images=(m.get("test_set") or {}).get("num_images", np.nan)))
        if run:
            hv = hidden_vs_attention_gradient(st.target_maps(depth=L0, ids=_PROBE_TARGETS),
                                                     bootstrap=n_boot, seed=BOOTSTRAP_SEED)
            save_probes(st, hv)
    pr = load_probes(s.profile)
    if pr is not None:
        pr = pr[pr["backbone"].isin(backbones) & (pr["depth"] == L0)]
        ckpts = {a["checkpoint_id"] for a in acc}
        probe_table = pr[pr["checkpoint_id"].astype(str).isin(ckpts)].reset_index(drop=True)
    else:
        probe_table = pd.DataFrame(columns=["dataset", "backbone", "checkpoint_id", "depth", "hidden", "attention",
                                            "cosine", "lo", "hi"])

    at = rows[(rows["depth"] == L0) & np.isclose(rows["budget"].astype(float), b0)] if len(rows) else rows
    D = decoupling_D(at, n_boot=n_boot, ci_seed=BOOTSTRAP_SEED) if len(at) else pd.DataFrame(
        columns=["backbone", "condition", "D_pp", "D_pp_lo", "D_pp_hi", "delta_idauc", "delta_idauc_lo",
                 "delta_idauc_hi", "status"])
    findings = (paper_findings(rows, probe_table if len(probe_table) else None, depth=L0, budget=b0,
                                      n_boot=n_boot)
                if len(rows) else pd.DataFrame(columns=["dataset", "backbone", "finding", "statement", "holds",
                                                        "evidence"]))
    return BackboneComparison(backbones=backbones, rows=rows, probes=probe_table, D=D, findings=findings,
                              accuracy=pd.DataFrame(acc).set_index("backbone"), status=status, depth=L0, budget=b0)
