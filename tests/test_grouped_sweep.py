"""The grouped sweep engine (docs/decisions/0069): the cells of one (dataset, backbone, checkpoint)
computed together give the rows a cell-by-cell sweep gives, and a group that fails leaves each cell its
own record."""
from __future__ import annotations

import math

import pytest

from midas_nb.sweeps import ResultStore, run_sweep, SweepCell
from midas_nb.sweeps.executors import cell_groups

#: columns that time something: they differ between any two runs
TIMINGS = {"throughput", "throughput_full", "speedup", "train_seconds"}


def _same(x, y) -> bool:
    if isinstance(x, float) and isinstance(y, float):
        return x == y or (math.isnan(x) and math.isnan(y))
    if isinstance(x, list) and isinstance(y, list):
        return len(x) == len(y) and all(_same(a, b) for a, b in zip(x, y))
    return x == y


@pytest.mark.slow
def test_grouped_regime_sweep_gives_the_cell_by_cell_rows(tmp_path):
    from midas_nb.config import get_profile
    from midas_nb.study import make_grid, ProtocolCellRunner

    prof = get_profile("smoke")
    cells = make_grid(prof, "regime")       # L ∈ {1, 2} at b = 0.25, b = 0.5 at L = 2; six conditions
    grouped = ProtocolCellRunner(prof, cache_dir=tmp_path / "grouped")
    groups = cell_groups(cells, grouped)
    assert [len(g) for g in groups] == [18]          # one group: both depths, their budgets together
    assert {(c.depth, c.budget) for c in groups[0]} == {(1, 0.25), (2, 0.25), (2, 0.5)}
    # a bound method has no run_group: the cells are computed one by one (caches of their own)
    one_by_one = ProtocolCellRunner(prof, cache_dir=tmp_path / "cells").__call__
    assert [len(g) for g in cell_groups(cells, one_by_one)] == [1] * len(cells)
    rows = {}
    for name, fn in (("cells", one_by_one), ("grouped", grouped)):
        status = run_sweep(cells, fn, tmp_path / name)
        assert status.complete, str(status)
        rows[name] = ResultStore(tmp_path / name).results(cells)
    a, b = rows["cells"], rows["grouped"]
    assert list(a.columns) == list(b.columns) and len(a) == len(b) == len(cells)
    assert set(a["condition"]) == {"reference", "unsupervised", "T1", "T5", "random", "random_map"}
    assert not a["from_cache"].any() and not b["from_cache"].any()   # both trained their scorers
    for col in sorted(set(a.columns) - TIMINGS):
        for i, (x, y) in enumerate(zip(a[col], b[col])):
            assert _same(x, y), (col, cells[i].label, x, y)


class _GroupFails:
    """A cell function whose group computation raises; cell by cell, the ``fail`` cells raise."""

    def __init__(self) -> None:
        self.groups = 0

    def group_key(self, cell: SweepCell) -> int:
        return cell.depth

    def run_group(self, cells):
        self.groups += 1
        raise RuntimeError("the group failed")

    def __call__(self, cell: SweepCell) -> dict:
        if cell.condition == "fail":
            raise ValueError(f"bad cell {cell.label}")
        return dict(dataset=cell.dataset, condition=cell.condition, seed=cell.seed)


def test_a_failing_group_is_computed_again_cell_by_cell(tmp_path):
    cells = [SweepCell("synthetic", "vit_smoke", 1, 0.25, cond, 0) for cond in ("reference", "fail", "T5")]
    cells.append(SweepCell("synthetic", "vit_smoke", 2, 0.25, "reference", 0))
    fn = _GroupFails()
    assert [len(g) for g in cell_groups(cells, fn)] == [3, 1]
    status = run_sweep(cells, fn, tmp_path / "store")
    store = ResultStore(tmp_path / "store")
    states = [store.read(c.key)["status"] for c in cells]
    assert states == ["done", "failed", "done", "done"], status
    assert "bad cell" in store.read(cells[1].key)["error"]          # the cell's own error, not the group's
    assert fn.groups == 1                                          # the one-cell group ran as a cell
    assert not list((tmp_path / "store").rglob("*.running"))      # every claim released
