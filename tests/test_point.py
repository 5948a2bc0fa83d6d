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
    (0, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 0"),
    (1.5, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 1.5"),
    (True, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got True"),
    ("0.25", "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got '0.25'"),
    (math.nan, "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got nan"),
    # a builtin's repr says its type; another type is named beside its repr
    (np.float32(2), f"budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got {np.float32(2)!r} (float32)"),
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
        "depth: expected an integer L >= 1 (the scorer reads block L), got 0",
        "budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got 1.5"]
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

    settings = RunSettings.build("smoke", budget=0.1)    # the profile model (RunProfile): the typed parts
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


def test_a_budget_given_as_p_budget_reaches_keep_count_as_one_typed_value(monkeypatch, capsys, tmp_path):
    """Issue 54 (move 1): ``-p budget 0.1`` is read as the float 0.1 by the command line, made a
    :class:`Budget` once by the run description's model (:class:`midas_nb.config.RunProfile`), and that
    very object is the point's and the one ``keep_count`` takes; a bad budget is one line, exit 2."""
    import midas_nb.pruning as pruning
    from midas_nb import cli
    from midas_nb.cli.runspec import spec_from_args
    from midas_nb.study import RunSettings
    from midas_nb.backbones import create_backbone

    spec, problems = spec_from_args(cli.build_parser().parse_args(["run", "--profile", "smoke", "-p", "budget", "0.1"]))
    assert problems == [] and type(spec.params["budget"]) is float and spec.params["budget"] == 0.1
    made, new = [], Budget.__new__
    monkeypatch.setattr(Budget, "__new__", staticmethod(lambda cls, v: made.append(v) or new(cls, v)))
    run, lines = config.RunProfile.check(config.get_profile(spec.profile, **spec.params))
    assert lines == [] and type(run.budget) is Budget and run.budget == 0.1 and run.point.budget is run.budget
    made.clear()
    settings = RunSettings.build(spec.profile, **spec.params)   # what a notebook given these parameters builds
    b = settings.point.budget
    assert type(b) is Budget and b == 0.1
    assert [v for v in made if v == 0.1 and type(v) is not Budget] == [0.1]   # typed once, by the model
    seen, real = [], pruning.keep_count
    monkeypatch.setattr(pruning, "keep_count", lambda budget, n: seen.append(budget) or real(budget, n))
    made.clear()
    s = settings.data
    model = create_backbone(settings.backbone.name, num_classes=3, img_size=s.image_size, patch_size=s.patch_size)
    n = (s.image_size // s.patch_size) ** 2
    out = pruning.prune_tokens(model.eval(), torch.randn(2, n + 1, model.embed_dim), torch.randn(2, n), 2, b)
    assert len(seen) == 1 and seen[0] is b and out.keep_mask.sum(1).tolist() == [math.ceil(0.1 * n)] * 2
    assert [v for v in made if type(v) is not Budget] == []                  # nothing re-parsed on the way
    monkeypatch.setattr("papermill.execute_notebook", lambda *a, **k: pytest.fail("a notebook was executed"))
    for text, got in (("1.5", "1.5"), ("abc", "'abc'")):
        assert cli.main(["run", "--no-progress", "--profile", "smoke", "--notebooks", "02", "-p", "budget", text,
                         "--output", str(tmp_path / "o")]) == 2
        err = [ln for ln in capsys.readouterr().err.splitlines() if ln.strip()]
        assert err == [f"midas-nb run: budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got {got}",
                       "midas-nb run: 1 problem; no notebook was started"]
