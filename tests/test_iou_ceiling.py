"""The IoU ceiling of a budget (metrics.iou_ceiling) against brute force over every keep mask."""
from __future__ import annotations

import itertools
import math

import pytest
import torch

from midas_nb.metrics import iou_ceiling, part_miou


def test_ceiling_by_hand():
    ref = torch.tensor([[1, 1, 0, 0, 0, 0, 0, 0], [1, 1, 1, 1, 1, 0, 0, 0], [0] * 8], dtype=torch.bool)
    c = iou_ceiling(ref, 4)
    assert c[0].item() == pytest.approx(2 / 4) and c[1].item() == pytest.approx(4 / 5) and math.isnan(c[2].item())


def test_ceiling_is_the_best_iou_over_every_keep_mask():
    g = torch.Generator().manual_seed(0)
    n = 7
    ref = torch.rand(6, n, generator=g) < 0.4
    ref[0] = False
    ref[0, 3] = True
    for k in range(1, n + 1):
        best = torch.full((6,), -1.0)
        for kept in itertools.combinations(range(n), k):
            keep = torch.zeros(6, n, dtype=torch.bool)
            keep[:, list(kept)] = True
            best = torch.maximum(best, torch.nan_to_num(part_miou(keep, ref).per_image, nan=-1.0))
        c = iou_ceiling(ref, k)
        has = ref.any(1)
        assert torch.allclose(c[has], best[has])


def test_ceiling_refuses_bad_input():
    with pytest.raises(ValueError, match=r"k must be in 1..4"):
        iou_ceiling(torch.ones(2, 4, dtype=torch.bool), 5)
    with pytest.raises(ValueError, match=r"\[B,N\]"):
        iou_ceiling(torch.ones(4, dtype=torch.bool), 2)


def test_study_ceiling_is_the_mean_over_evaluated_images_with_parts():
    from midas_nb.data import evaluation_subset
    from midas_nb.study import Study

    s = Study("smoke")
    ds = s.test_set
    subset = evaluation_subset(len(ds), s.params.get("max_eval_images"), int(s.params.get("eval_subset_seed", 0)))
    table = s.iou_ceiling([0.25, 0.5])
    for _, r in table.iterrows():
        vals = []
        for i in subset:
            p, n = int(ds[i].part_mask.sum()), ds[i].part_mask.numel()
            k = math.ceil(r["budget"] * n)
            if p:
                vals.append(min(p, k) / max(p, k))
        assert r["ceiling"] == pytest.approx(sum(vals) / len(vals)) and r["n_images"] == len(vals)
