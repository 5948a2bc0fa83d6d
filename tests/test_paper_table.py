"""The paper-shaped table (``midas_nb.report.build.paper_table``): hand-made rows, hand-computed D."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from midas_nb import config
from midas_nb.report.build import format_paper_table, paper_table
from midas_nb.study import ReportSettings

DS = "deit_small_patch16_224.fb_in1k"
TI = "deit_tiny_patch16_224.fb_in1k"


def _rows():
    rows = []
    # (dataset, backbone, condition, seed, miou, idauc)
    spec = [("aircraft", DS, "reference", 0, 0.30, 0.10), ("aircraft", DS, "T5", 0, 0.36, 0.105),
            ("aircraft", DS, "T5", 1, 0.40, 0.095), ("aircraft", DS, "T1", 0, 0.20, 0.08),
            ("cub", DS, "reference", 0, 0.10, 0.20), ("cub", DS, "T5", 0, 0.13, 0.17),
            ("cub", TI, "reference", 0, 0.10, 0.20), ("cub", TI, "T5", 0, 0.12, 0.21),
            ("cub", DS, "T5", 0, 0.99, 0.99), ("cub", DS, "reference", 0, 0.09, 0.5)]  # L = 3: ignored at L = 6
    for i, (d, b, c, s, m, a) in enumerate(spec):
        rows.append(dict(dataset=d, backbone=b, condition=c, seed=s, miou=m, idauc=a, accuracy=0.5, n_images=10,
                         depth=6 if i < 8 else 3, budget=0.25,
                         coverage_kind="part mIoU" if d == "cub" else "box coverage"))
    return pd.DataFrame(rows)


def _settings(**point):
    return ReportSettings.of(config.get_profile("paper", **point))


def test_blocks_values_and_paper_columns():
    t = paper_table(_rows(), _settings(), expected=[("cub", DS), ("cub", TI), ("aircraft", DS), ("cars", DS)],
                    backbone_order=[TI, DS])
    blocks = list(dict.fromkeys(zip(t["dataset"], t["backbone"])))
    assert blocks == [("cub", TI), ("cub", DS), ("aircraft", DS), ("cars", DS)]   # CUB, Aircraft, Cars
    a = t[(t["dataset"] == "aircraft")].set_index("condition")
    assert list(a.index) == ["reference", "T1", "T5"]
    # D per seed against the reference (seed 0 paired, seed 1 against the reference mean), mean over seeds
    assert a.loc["T5", "D_pp"] == pytest.approx(100 * ((0.36 - 0.30) + (0.40 - 0.30)) / 2)
    assert a.loc["T5", "delta_idauc"] == pytest.approx(((0.105 - 0.10) + (0.095 - 0.10)) / 2)
    assert a.loc["T1", "D_pp"] == pytest.approx(-10.0)
    assert a.loc["T5", "coverage_kind"] == "box coverage"
    assert a.loc["T5", "paper_D_pp"] == pytest.approx(6.22) and a.loc["T5", "paper_delta_idauc"] == pytest.approx(0.003)
    assert a.loc["T1", "paper_D_pp"] == pytest.approx(-9.15) and math.isnan(a.loc["T1", "paper_delta_idauc"])
    assert math.isnan(a.loc["reference", "paper_D_pp"])
    c = t[(t["dataset"] == "cub") & (t["backbone"] == DS)].set_index("condition")
    assert c.loc["T5", "D_pp"] == pytest.approx(3.0) and c.loc["T5", "paper_D_pp"] == pytest.approx(2.11)
    ti = t[(t["dataset"] == "cub") & (t["backbone"] == TI)].set_index("condition")
    assert ti.loc["T5", "D_pp"] == pytest.approx(2.0) and math.isnan(ti.loc["T5", "paper_D_pp"])  # not DeiT-S
    cars = t[t["dataset"] == "cars"]
    assert len(cars) == 1 and cars["status"].iloc[0] == "no result"              # never silently dropped
    text = format_paper_table(t)
    assert "aircraft × deit_small_patch16_224.fb_in1k  (box coverage)" in text and "no result" in text


def test_other_point_has_no_paper_values():
    t = paper_table(_rows(), _settings(depth=3)).set_index("condition")
    assert list(t.index) == ["reference", "T5"] and t.loc["T5", "D_pp"] == pytest.approx(90.0)
    assert t["paper_D_pp"].isna().all()                 # the paper's numbers are for L = 6, b = 25 % only
