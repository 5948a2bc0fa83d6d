"""Box coverage skips uninformative boxes (|box| / N above INFORMATIVE_BOX_MAX_FRACTION) and empty
box masks, with the reason counted; part mIoU is unchanged. Masks and IoUs are computed by hand."""
from __future__ import annotations

import math

import pytest
import torch

from midas_nb.data import AnnotatedDataset
from midas_nb.metrics import INFORMATIVE_BOX_MAX_FRACTION, box_coverage, informative_box, part_miou


def _mask(n: int, on: list[int]) -> list[bool]:
    return [i in on for i in range(n)]


# N = 10 patches; four images
BOX = torch.tensor([
    _mask(10, [0, 1, 2, 3, 4]),             # 5/10 = 0.5: informative
    _mask(10, list(range(10))),             # 10/10: a box crop, uninformative
    _mask(10, list(range(9))),              # 9/10 = 0.9: informative (the threshold is inclusive)
    _mask(10, []),                          # empty: the box left the crop or was blanked
])
KEEP = torch.tensor([
    _mask(10, [0, 1, 2, 8, 9]),             # ∩ 3, ∪ 7
    _mask(10, [0, 1, 2, 3, 4]),             # ∩ 5, ∪ 10
    _mask(10, [0, 1, 2, 3, 9]),             # ∩ 4, ∪ 10
    _mask(10, [0, 1]),
])


def test_box_coverage_skips_uninformative_and_empty_boxes():
    assert INFORMATIVE_BOX_MAX_FRACTION == 0.9
    r = box_coverage(KEEP, BOX)
    assert r.name == "box coverage" and r.n_images == 4 and r.n_skipped == 2 and r.n_used == 2
    assert r.per_image[0].item() == pytest.approx(3 / 7)
    assert math.isnan(r.per_image[1].item()) and math.isnan(r.per_image[3].item())
    assert r.per_image[2].item() == pytest.approx(4 / 10)
    assert r.mean == pytest.approx((3 / 7 + 4 / 10) / 2)
    assert r.skip_reasons == {"empty box mask": 1, "uninformative box (> 90% of the patches)": 1}
    assert sum(r.skip_reasons.values()) == r.n_skipped
    assert informative_box(BOX).tolist() == [True, False, True, False]


def test_box_coverage_threshold_is_a_parameter():
    every = box_coverage(KEEP, BOX, max_box_fraction=1.0)     # the old rule: every non-empty box
    assert every.n_skipped == 1 and every.per_image[1].item() == pytest.approx(5 / 10)
    strict = box_coverage(KEEP, BOX, max_box_fraction=0.5)
    assert strict.n_used == 1 and strict.mean == pytest.approx(3 / 7)
    assert strict.skip_reasons["uninformative box (> 50% of the patches)"] == 2
    for bad in (0, 1.5, -0.1, "0.9", None, True, math.nan):
        with pytest.raises(ValueError, match="max_box_fraction"):
            box_coverage(KEEP, BOX, max_box_fraction=bad)
    with pytest.raises(ValueError, match="same shape"):
        box_coverage(KEEP[:, :5], BOX)


def test_every_box_uninformative_gives_nan_not_an_error():
    full = torch.ones(3, 4, dtype=torch.bool)
    r = box_coverage(torch.zeros(3, 4, dtype=torch.bool), full)
    assert math.isnan(r.mean) and r.n_used == 0 and r.n_skipped == 3


def test_part_miou_is_unchanged():
    r = part_miou(KEEP, BOX)                 # a part mask covering every patch is not skipped
    assert r.name == "part mIoU" and r.n_skipped == 1 and r.skip_reasons == {"no visible part": 1}
    assert r.per_image[:3].tolist() == pytest.approx([3 / 7, 5 / 10, 4 / 10])
    assert r.mean == pytest.approx((3 / 7 + 5 / 10 + 4 / 10) / 3)


def test_classes_present_and_chance_level():
    ds = AnnotatedDataset(None, 16)
    ds.classes = ["a", "b", "c", "d"]
    ds.labels = [0, 0, 0, 2]
    assert ds.classes_present == ["a", "c"] and ds.num_classes_present == 2 and ds.num_classes == 4
    assert ds.chance_accuracy == 0.5 and ds.majority_fraction == 0.75
    ds.labels = [-1, -1]                     # unlabelled: no class present, no division by zero
    assert ds.classes_present == [] and math.isnan(ds.chance_accuracy) and math.isnan(ds.majority_fraction)
