"""Cosine probes (midas_nb.metrics.probes): known values, an independent implementation (scipy's
Spearman/Pearson), CI behaviour."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.stats import pearsonr, spearmanr

from midas_nb.metrics.probes import (cosine_across_depths, cosine_matrix, hidden_vs_attention_gradient,
                             per_image_cosine)

MODES = ["rank", "centered", "raw"]


@pytest.fixture
def maps() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    a = torch.rand(12, 16, generator=g)
    return {"T0": a, "T3": torch.rand(12, 16, generator=g), "T5": torch.randn(12, 16, generator=g)}


@pytest.mark.parametrize("mode", MODES)
def test_identical_maps_give_one(maps, mode):
    cos = per_image_cosine(maps["T5"], maps["T5"].clone(), mode)
    np.testing.assert_allclose(cos, 1.0, atol=1e-12)


@pytest.mark.parametrize("mode", MODES)
def test_negated_maps_give_minus_one(maps, mode):
    cos = per_image_cosine(maps["T5"], -maps["T5"], mode)
    np.testing.assert_allclose(cos, -1.0, atol=1e-12)


def test_hand_computed_three_token_examples():
    # a = [1,2,3], b = [1,3,2]:
    #   centred a = [-1,0,1], b = [-1,1,0] -> dot 1 / (√2·√2) = 0.5; ranks equal values -> 0.5
    #   raw: dot 1+6+6 = 13, |a|=|b|=√14 -> 13/14
    a = torch.tensor([[1.0, 2.0, 3.0]])
    b = torch.tensor([[1.0, 3.0, 2.0]])
    assert per_image_cosine(a, b, "centered")[0] == pytest.approx(0.5)
    assert per_image_cosine(a, b, "rank")[0] == pytest.approx(0.5)
    assert per_image_cosine(a, b, "raw")[0] == pytest.approx(13 / 14)
    # an outlier changes Pearson but not Spearman: a = [1,2,10] centred = [-10,-7,17]/3,
    # dot with [-1,1,0] = 1, |a_c| = √438/3 -> 3/√876
    a2 = torch.tensor([[1.0, 2.0, 10.0]])
    assert per_image_cosine(a2, b, "centered")[0] == pytest.approx(3 / math.sqrt(876))
    assert per_image_cosine(a2, b, "rank")[0] == pytest.approx(0.5)
    # ties get the average rank: [1,1,2] -> ranks [1.5,1.5,3], centred [-.5,-.5,1];
    # with [-1,0,1]: dot 1.5 / (√1.5·√2) = √3/2
    a3 = torch.tensor([[1.0, 1.0, 2.0]])
    assert per_image_cosine(a3, a, "rank")[0] == pytest.approx(math.sqrt(3) / 2)


def test_matches_scipy_spearman_and_pearson(maps):
    a, b = maps["T0"].double().numpy(), maps["T5"].double().numpy()
    rank = per_image_cosine(maps["T0"], maps["T5"], "rank")
    cent = per_image_cosine(maps["T0"], maps["T5"], "centered")
    for i in range(a.shape[0]):
        assert rank[i] == pytest.approx(spearmanr(a[i], b[i]).statistic, abs=1e-10)
        assert cent[i] == pytest.approx(pearsonr(a[i], b[i]).statistic, abs=1e-10)


def test_constant_map_is_undefined_and_skipped():
    a = torch.tensor([[1.0, 2.0, 3.0], [5.0, 5.0, 5.0], [3.0, 1.0, 2.0]])
    b = torch.tensor([[1.0, 3.0, 2.0], [1.0, 3.0, 2.0], [3.0, 1.0, 2.0]])
    cos = per_image_cosine(a, b, "centered")
    assert math.isnan(cos[1])
    mean, lo, hi = cosine_matrix({"a": a, "b": b}, mode="centered", bootstrap=50)
    assert mean.loc["a", "b"] == pytest.approx((0.5 + 1.0) / 2)
    assert mean.attrs["n_images"].loc["a", "b"] == 2
    assert mean.attrs["n_images"].loc["b", "b"] == 3


def test_cosine_matrix_values_symmetry_and_zero_width_ci():
    # every image has the same pair up to scale -> per-image cosine is 0.5 everywhere
    scale = torch.arange(1, 9, dtype=torch.float32)[:, None]
    a = torch.tensor([[1.0, 2.0, 3.0]]) * scale
    b = torch.tensor([[1.0, 3.0, 2.0]]) * scale + scale
    mean, lo, hi = cosine_matrix({"a": a, "b": b, "c": -a}, bootstrap=200, mode="centered")
    assert list(mean.index) == ["a", "b", "c"] and list(mean.columns) == ["a", "b", "c"]
    assert mean.loc["a", "b"] == pytest.approx(0.5) and mean.loc["b", "a"] == pytest.approx(0.5)
    assert lo.loc["a", "b"] == pytest.approx(0.5) and hi.loc["a", "b"] == pytest.approx(0.5)
    assert mean.loc["a", "c"] == pytest.approx(-1.0)
    assert mean.loc["b", "c"] == pytest.approx(-0.5)
    np.testing.assert_allclose(np.diag(mean.values), 1.0)
    np.testing.assert_allclose(mean.values, mean.values.T)


def test_ci_brackets_mean_and_unrelated_rankings_are_near_zero():
    g = np.random.default_rng(1)
    maps = {"x": g.random((400, 49)), "y": g.random((400, 49))}
    mean, lo, hi = cosine_matrix(maps, bootstrap=500)
    m, l, h = mean.loc["x", "y"], lo.loc["x", "y"], hi.loc["x", "y"]
    # per-image Spearman of independent 49-token maps has sd ≈ 1/√48 ≈ 0.14; mean of 400 ≈ ±0.007
    assert abs(m) < 0.03 and l < m < h and l < 0 < h
    assert h - l < 0.06
    # whereas the raw cosine of the same non-negative maps is far from 0 (≈ 0.75)
    raw, _, _ = cosine_matrix(maps, bootstrap=0, mode="raw")
    assert raw.loc["x", "y"] > 0.6


def test_cosine_across_depths_and_hidden_vs_attention(maps):
    by_depth = {3: maps, 6: {k: v.flip(1) if k == "T5" else v for k, v in maps.items()}}
    df = cosine_across_depths(by_depth, bootstrap=0)
    assert len(df) == 2 * 3 and set(df["depth"]) == {3, 6}
    row3 = df[(df.depth == 3) & (df.a == "T0") & (df.b == "T5")].iloc[0]
    assert row3.cosine == pytest.approx(np.mean(per_image_cosine(maps["T0"], maps["T5"])))
    row6 = df[(df.depth == 6) & (df.a == "T0") & (df.b == "T5")].iloc[0]
    assert row6.cosine == pytest.approx(np.mean(per_image_cosine(maps["T0"], maps["T5"].flip(1))))
    hv = hidden_vs_attention_gradient({"T5": maps["T5"], "T3": maps["T3"], "T4": maps["T0"],
                                       "T2": -maps["T3"]}, bootstrap=0)
    assert list(zip(hv.hidden, hv.attention)) == [("T5", "T3"), ("T5", "T2"), ("T4", "T3"), ("T4", "T2")]
    # T2 = −T3 here, so the two T5 rows are negatives of each other
    assert hv.cosine.iloc[1] == pytest.approx(-hv.cosine.iloc[0])
    assert hv.attrs["max_abs"] == pytest.approx(hv.cosine.abs().max())
    hv_d = hidden_vs_attention_gradient({6: {"T5": maps["T5"], "T3": maps["T3"], "T4": maps["T0"],
                                             "T2": maps["T3"]}}, bootstrap=0)
    assert set(hv_d.depth) == {6}


def test_bad_inputs_raise():
    with pytest.raises(ValueError, match="same"):
        per_image_cosine(torch.zeros(2, 3), torch.zeros(2, 4))
    with pytest.raises(ValueError, match=r"\[M, N\]"):
        per_image_cosine(torch.zeros(3), torch.zeros(3))
    with pytest.raises(ValueError, match="mode"):
        per_image_cosine(torch.rand(2, 3), torch.rand(2, 3), "spearman")
    with pytest.raises(ValueError, match="not in maps"):
        cosine_matrix({"a": torch.rand(2, 3)}, ids=["a", "b"])
    with pytest.raises(ValueError, match="depth 6"):
        cosine_across_depths({3: {"a": torch.rand(2, 3), "b": torch.rand(2, 3)}, 6: {"a": torch.rand(2, 3)}},
                             [("a", "b")])
