"""The MIDAS readout on several backbones side by side (notebook 05): the report's ``backbones`` table
(:func:`midas_nb.report.build.backbones_table`, rendered by :func:`midas_nb.report.markdown.backbones_section`)
of a study's store rows, so the notebook and ``midas-nb report`` draw it by one code path."""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from ..metrics.probes import hidden_vs_attention_gradient
from ..analysis.findings import BOOTSTRAP_SEED, backbone_fitness, count_fitness
from .build import backbones_table
from .store import load_probes, save_probes
from ..study import ReportSettings, cached_study, run_cells, sweep_cells

__all__ = ["compare_backbones"]


def compare_backbones(study, backbones: Sequence[str] | None = None, *, run: bool = True,
                      executor: str = "local") -> tuple[pd.DataFrame, Any]:
    """``(table, status)``: the report's ``backbones`` table (:data:`~midas_nb.report.tables.BACKBONE_COLUMNS`) of
    ``backbones`` (default: the profile's comparison backbones; those the profile does not train marked ``not run``)
    from ``study``'s regime sweep in the run's result store and the cosine probes at the profile's ``L`` (kept with
    :func:`save_probes`, ``bootstrap`` resamples, seed :data:`BOOTSTRAP_SEED`), every finding of a backbone that has
    not learned its task ``not counted`` (decision 0070), and the cells' :class:`~midas_nb.sweeps.StoreStatus`.
    ``run=False`` only reads the store; ``executor``: as :func:`midas_nb.sweeps.run_sweep`.
    Raises ValueError: an empty or duplicated backbone list."""
    s = study.settings
    n_boot = s.statistics.bootstrap
    cells = sweep_cells(s.values, "backbones", backbones=backbones)
    rows, status = run_cells(s.values, cells, run=run, executor=executor, progress=study.progress)
    ts, fit = study.test_set, {}
    for b in dict.fromkeys(c.backbone for c in cells):
        st = cached_study(s.values, s.data.dataset, b, progress=study.progress)
        teacher = (st.meta.get("distillation") or {}).get("teacher_test_accuracy")
        fit[(study.dataset_name, b)] = backbone_fitness(st.meta["test_accuracy"], len(ts), ts.chance_accuracy,
                                                         ts.majority_fraction, teacher)
        if run:
            save_probes(st, hidden_vs_attention_gradient(st.target_maps(depth=s.point.depth, ids=["T2", "T3", "T4", "T5"]),
                                                         bootstrap=n_boot, seed=BOOTSTRAP_SEED))
    rs = ReportSettings.of(dict(s.values, **({"compare_backbones": list(backbones)} if backbones else {})))
    bt = backbones_table(rows, load_probes(s.profile), rs, None, n_boot)
    m = bt["kind"] == "finding"
    return pd.concat([bt[~m], count_fitness(bt[m], fit, verdict="verdict")]).sort_index(), status
