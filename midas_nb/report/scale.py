"""Notebook 05's backbones side by side: the report's ``backbones`` table of a study's store rows (one code path)."""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from ..metrics.probes import hidden_vs_attention_gradient
from ..analysis.findings import BOOTSTRAP_SEED, backbone_fitness, count_fitness
from .build import backbones_table, load_probes, save_probes
from ..study import ReportSettings, cached_study, run_cells, sweep_cells

__all__ = ["compare_backbones"]


def compare_backbones(study, backbones: Sequence[str] | None = None, *, run: bool = True,
                      executor: str = "local") -> tuple[pd.DataFrame, Any]:
    """``(table, status)``: the report's ``backbones`` table of ``backbones`` (default: the profile's) from ``study``'s
    store and cosine probes at its ``L`` (kept: :func:`save_probes`; an unfit backbone's findings ``not counted``),
    and the cells' StoreStatus; ``run=False`` only reads the store. ValueError: an empty or duplicated list."""
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
            maps = st.target_maps(depth=s.point.depth, ids=["T2", "T3", "T4", "T5"])
            save_probes(st, hidden_vs_attention_gradient(maps, bootstrap=n_boot, seed=BOOTSTRAP_SEED))
    rs = ReportSettings.of(dict(s.values, **({"compare_backbones": list(backbones)} if backbones else {})))
    bt = backbones_table(rows, load_probes(s.profile), rs, None, n_boot)
    m = bt["kind"] == "finding"
    return pd.concat([bt[~m], count_fitness(bt[m], fit, verdict="verdict")]).sort_index(), status
