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


def test_target_coverage_and_ceiling_tables_by_hand_on_boxes():
    """analysis.target_maps on a set without part keypoints (box coverage): 3 images of N = 4 patch tokens."""
    from types import SimpleNamespace

    from midas_nb.analysis.target_maps import iou_ceiling_table, target_coverage

    boxes = torch.tensor([[1, 1, 0, 0], [0, 0, 0, 0], [0, 1, 1, 1]], dtype=torch.bool)   # image b: empty box
    ds = type("Boxes", (), dict(has_parts=False, image_ids=["a", "b", "c"], __len__=lambda self: 3,
                                __getitem__=lambda self, i: SimpleNamespace(box_mask=boxes[i])))()
    maps = {"T": torch.tensor([[4.0, 3, 2, 1], [1, 2, 3, 4], [1, 2, 3, 4]])}
    cov = target_coverage(maps, ds, 0.5, n_boot=10).iloc[0]          # k = 2: keeps {0,1}, -, {2,3}
    assert cov["miou"] == pytest.approx((1 + 2 / 3) / 2) and (cov["n_images"], cov["n_skipped"]) == (3, 1)
    assert cov["coverage_kind"] == "box coverage" and cov["image_ids"] == ["a", "b", "c"]
    assert math.isnan(cov["miou_per_image"][1]) and cov["miou_per_image"][2] == pytest.approx(2 / 3)
    table = iou_ceiling_table(ds, [0.25, 0.5])                       # k = 1: 1/2, 1/3; k = 2: 1, 2/3
    assert table["k"].tolist() == [1, 2] and table["n_images"].tolist() == [2, 2]
    assert table["ceiling"].tolist() == pytest.approx([(1 / 2 + 1 / 3) / 2, (1 + 2 / 3) / 2])
    with pytest.raises(ValueError, match="budget"):
        iou_ceiling_table(ds, [0.0])
