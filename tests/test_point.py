"""The typed pruning point: a budget is checked once, where it is made, and passes every layer
below unchecked (issue 29)."""

import json
import math
import pickle

import numpy as np
import pandas as pd
import pytest
import torch

from midas_nb import config, point
from midas_nb.point import Budget, Point
from midas_nb.backbones.vit import keep_count


@pytest.mark.parametrize("value, message", [
    (0, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 0 (int)"),
    (1.5, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 1.5 (float)"),
    (True, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got True (bool)"),
    ("0.25", "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got '0.25' (str)"),
    (math.nan, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got nan (float)"),
    (1e-9, "budget: 1e-09 is below 1e-06, the resolution at which result cells key b (6 decimals; "
           "it would round to 0); expected b in [1e-06, 1]"),
])
def test_budget_refuses_what_is_not_a_kept_fraction(value, message):
    with pytest.raises(ValueError) as e:
        Budget(value)
    assert str(e.value) == message


def test_budget_is_the_float_it_holds():
    b = Budget(np.float32(0.5))
    assert type(b) is Budget and b == 0.5 and hash(b) == hash(0.5) and repr(b) == "0.5"
    assert Budget(b) is b                                   # a Budget is taken as it is
    assert json.dumps({"b": Budget(0.1)}) == '{"b": 0.1}'
    assert type(pickle.loads(pickle.dumps(b))) is Budget    # sweeps pickle cells to workers
    assert pd.Series([Budget(0.25)]).dtype == np.float64
    assert Budget(0.1234567).keyed() == 0.123457 and type(Budget(0.3).keyed()) is Budget
    assert Budget(1) == 1.0 and Budget(1e-6) == 1e-6


def test_point_reports_depth_and_budget_together():
    with pytest.raises(ValueError) as e:
        Point(0, 1.5)
    assert str(e.value).splitlines() == [
        "depth: expected an integer L >= 1 (the scorer reads block L), got 0 (int)",
        "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 1.5 (float)"]
    p = Point(np.int64(6), 0.25)
    assert type(p.depth) is int and type(p.budget) is Budget and p == Point(6, Budget(0.25))


def test_keep_count_is_ceil_of_b_times_n():
    # k = ceil(b·N) (DESIGN.md §3), 0.29·100 = 28.999999999999996 in floating point still keeps 29
    assert [keep_count(b, 196) for b in (0.1, 0.25, 0.5, 1.0)] == [20, 49, 98, 196]
    assert keep_count(0.29, 100) == 29 and keep_count(1e-6, 196) == 1


def test_a_budget_from_the_profile_is_checked_once(monkeypatch):
    """Trace of ``-p budget 0.1``: ``get_profile`` types it (one check) while the run description
    is built (:meth:`midas_nb.study.RunSettings.build`: the profile's checks, the typed point);
    the sweep cell, the pruned model and ``keep_count`` take that value without checking it again."""
    from midas_nb.pruning import PrunedViT, prune_tokens
    from midas_nb.scorers import ReferenceScorer
    from midas_nb.sweeps import SweepCell
    from midas_nb.backbones import create_backbone

    calls = []
    real = point.is_number
    monkeypatch.setattr(point, "is_number", lambda v: calls.append(v) or real(v))
    from midas_nb.study import RunSettings

    settings = RunSettings.build("smoke", budget=0.1)    # get_profile, check_profile, the typed parts
    assert calls.count(0.1) == 1 and type(settings.point.budget) is Budget
    b, prof = settings.point.budget, settings.values
    calls.clear()
    cell = SweepCell("synthetic", "vit_smoke", 2, b, "T1", 0)
    model = create_backbone(prof["backbone"], num_classes=3, img_size=prof["image_size"],
                            patch_size=prof["patch_size"]).eval()
    pruned = PrunedViT(model, ReferenceScorer(), 2, cell.budget)
    n = (prof["image_size"] // prof["patch_size"]) ** 2
    hidden = torch.randn(2, n + 1, model.embed_dim)
    out = prune_tokens(model, hidden, torch.randn(2, n), 2, pruned.budget)
    assert out.keep_mask.sum(1).tolist() == [keep_count(b, n)] * 2 == [math.ceil(0.1 * n)] * 2
    assert [c for c in calls if c == 0.1] == []             # never checked again
