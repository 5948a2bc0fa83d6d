"""Reader tables of notebook 05's side-by-side backbone comparison (midas_nb.report.scale)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from midas_nb.report.scale import BackboneComparison


def _pair(backbones=("b1", "b2", "b3")) -> BackboneComparison:
    D, rows = [], []
    for k, b in enumerate(backbones):
        for cond, d in (("reference", 0.0), ("T5", 2.0 + k)):
            D.append(dict(backbone=b, condition=cond, D_pp=d, D_pp_lo=d - 1, D_pp_hi=d + 1,
                          delta_idauc=-0.004 * (cond == "T5"), delta_idauc_lo=-0.02, delta_idauc_hi=0.01,
                          status="in band" if cond == "reference" else "not resolved"))
            for L, bud in ((2, 0.25), (3, 0.5)):
                rows.append(dict(backbone=b, checkpoint_id=f"ck{k}", condition=cond, depth=L, budget=bud, seed=0,
                                 n_images=12 if L == 2 else 99, coverage_kind="part mIoU"))
    acc = pd.DataFrame([dict(backbone=b, checkpoint_id=f"ck{k}", test_accuracy=0.41666, n_test_images=24,
                             teacher_test_accuracy=0.625 if b == "b2" else math.nan)
                        for k, b in enumerate(backbones)]).set_index("backbone")
    # D rows in an order other than the display order: the table sorts them
    return BackboneComparison(backbones=list(backbones), rows=pd.DataFrame(rows), probes=pd.DataFrame(),
                              D=pd.DataFrame(D[::-1]), findings=pd.DataFrame(), accuracy=acc, status=None,
                              depth=2, budget=0.25)


def test_table_is_long_with_three_columns_whatever_the_backbones():
    t = _pair().table()
    assert list(t.columns) == ["D_pp", "delta_idauc", "status"]
    assert list(t.index) == [("T5", "b1"), ("T5", "b2"), ("T5", "b3"),
                             ("reference", "b1"), ("reference", "b2"), ("reference", "b3")]
    assert t.loc[("T5", "b2"), "D_pp"] == "+3.000 [+2.000, +4.000]"
    assert t.loc[("T5", "b2"), "delta_idauc"] == "-0.004 [-0.020, +0.010]"
    assert t.loc[("reference", "b1"), "status"] == "in band"


def test_accuracy_table_and_sample_note():
    p = _pair(("b1", "b2"))
    a = p.accuracy_table()
    assert a.loc["b1"].tolist() == ["0.417", "n/a", "ck0", 24] and a.loc["b2", "teacher_test_accuracy"] == "0.625"
    assert p.sample_note() == "part mIoU: 12 test images; seed 0; L = 2, b = 25%; backbone b1, b2 (ck0, ck1)"
    with pytest.raises(ValueError, match="no rows"):
        BackboneComparison(**{**p.__dict__, "depth": 9}).sample_note()
