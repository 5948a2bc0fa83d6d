"""Patch-grid rasterisation of keypoints and boxes (midas_nb.data.grid)."""

import pytest
import torch

from midas_nb.data import box_mask_from_box, grid_shape, num_patches, part_mask_from_keypoints, patch_centres


def test_grid_shape_and_errors():
    assert grid_shape(224, 16) == (14, 14)
    assert grid_shape((64, 96), 32) == (2, 3)
    assert num_patches((48, 80), 8) == 60
    for bad in [((100, 96), 16), (224, 0), ((0, 32), 16)]:
        with pytest.raises(ValueError):
            grid_shape(*bad)
    with pytest.raises(ValueError, match="multiples"):
        part_mask_from_keypoints(torch.zeros(1, 3), (30, 32), 16)


def test_patch_centres_row_major():
    c = patch_centres((32, 48), 16)  # 2 rows x 3 cols
    assert c.shape == (6, 2)
    assert c[1].tolist() == [24.0, 8.0]   # row 0, col 1
    assert c[3].tolist() == [8.0, 24.0]   # row 1, col 0


def test_part_mask_row_major_and_visibility():
    parts = torch.tensor([[40.0, 5.0, 1.0],     # row 0, col 2 -> token 2
                          [1.0, 17.0, 1.0],     # row 1, col 0 -> token 3
                          [20.0, 20.0, 0.0],    # invisible: ignored
                          [-3.0, 5.0, 1.0],     # outside: ignored
                          [48.0, 32.0, 1.0]])   # far border: last row / col -> token 5
    m = part_mask_from_keypoints(parts, (32, 48), 16)
    assert m.dtype == torch.bool and m.shape == (6,)
    assert torch.nonzero(m).flatten().tolist() == [2, 3, 5]


def test_part_mask_invisible_point_does_not_clear_patch_zero():
    parts = torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]])
    assert part_mask_from_keypoints(parts, 32, 16).tolist() == [True, False, False, False]


def test_part_mask_batched_and_empty():
    parts = torch.zeros(2, 4, 15, 3)
    parts[1, 2, 0] = torch.tensor([100.0, 200.0, 1.0])
    m = part_mask_from_keypoints(parts, 224, 16)
    assert m.shape == (2, 4, 196)
    assert m.sum() == 1 and m[1, 2, 12 * 14 + 6]
    assert part_mask_from_keypoints(torch.zeros(0, 3), 224, 16).sum() == 0


def test_box_mask_centre_rule_and_fallback():
    # box covering exactly the left 2x2 patches of a 4x4 grid (64 px, p=16)
    m = box_mask_from_box(torch.tensor([0.0, 0.0, 32.0, 32.0]), 64, 16).reshape(4, 4)
    assert m[:2, :2].all() and m.sum() == 4
    # a box that crosses a centre only partially: x in [10, 30] holds centre 24 only
    m = box_mask_from_box(torch.tensor([10.0, 10.0, 30.0, 30.0]), 64, 16).reshape(4, 4)
    assert m.sum() == 1 and m[1, 1]
    # tiny box containing no patch centre -> the patch containing the box centre
    m = box_mask_from_box(torch.tensor([33.0, 2.0, 35.0, 4.0]), 64, 16)
    assert torch.nonzero(m).flatten().tolist() == [2]
    # empty (zero-area) box -> no patch
    assert box_mask_from_box(torch.tensor([5.0, 5.0, 5.0, 40.0]), 64, 16).sum() == 0
    # box outside the image -> clipped to zero area -> no patch
    assert box_mask_from_box(torch.tensor([70.0, 0.0, 90.0, 10.0]), 64, 16).sum() == 0


def test_box_mask_batched_non_square():
    boxes = torch.tensor([[0.0, 0.0, 96.0, 64.0], [0.0, 0.0, 1.0, 1.0]])
    m = box_mask_from_box(boxes, (64, 96), 32)
    assert m.shape == (2, 6)
    assert m[0].all() and m[1].tolist() == [True, False, False, False, False, False]
