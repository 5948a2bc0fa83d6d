"""Joint transforms: keypoints and boxes follow the pixels (midas_nb.data.transforms)."""

import numpy as np
import pytest
import torch
from PIL import Image, ImageDraw

from midas_nb.data import (CUB_PART_NAMES, DEFAULT_MEAN, EvalTransform, TrainTransform, collate_samples,
                           denormalize, flip_permutation)


def _marker_image(w, h, x, y, r=3):
    """Grey image with a red disc centred on the continuous point (x, y)."""
    im = Image.new("RGB", (w, h), (128, 128, 128))
    ImageDraw.Draw(im).ellipse([x - r, y - r, x + r, y + r], fill=(255, 0, 0))
    return im


def _red_centroid(t):
    img = denormalize(t)  # [3,H,W] in [0,1]
    red = (img[0] > 0.8) & (img[1] < 0.3)
    ys, xs = torch.nonzero(red, as_tuple=True)
    assert len(xs) > 0, "marker vanished"
    # continuous coordinates of pixel centres
    return float(xs.float().mean() + 0.5), float(ys.float().mean() + 0.5)


def test_default_normalisation_is_half():
    assert DEFAULT_MEAN == (0.5, 0.5, 0.5)
    t, _, _ = EvalTransform(32, resize_ratio=1.0)(Image.new("RGB", (32, 32), (255, 255, 255)),
                                                  torch.zeros(0, 3), torch.zeros(4))
    assert t.shape == (3, 32, 32) and torch.allclose(t, torch.ones_like(t))
    t, _, _ = EvalTransform(32, 1.0, mean=(0.0,) * 3, std=(1.0,) * 3)(
        Image.new("L", (40, 32), 0), torch.zeros(0, 3), torch.zeros(4))
    assert t.abs().max() == 0


def test_eval_geometry_hand_computed():
    # 400x300 image, out 224, ratio 256/224: shorter side 300 -> 256 (s = 256/300),
    # resized 341x256 (round(400*0.8533)=341), crop offsets left=round(58.5)=58 (banker's -> 58), top=16
    tf = EvalTransform(224)
    (x0, y0, x1, y1), flip = tf.region(400, 300)
    assert not flip
    fx = 400 / 341
    assert x0 == pytest.approx(58 * fx) and x1 == pytest.approx((58 + 224) * fx)
    assert y0 == pytest.approx(16 * 300 / 256) and y1 == pytest.approx(240 * 300 / 256)
    parts = torch.tensor([[200.0, 150.0, 1.0], [5.0, 150.0, 1.0], [0.0, 0.0, 0.0]])
    box = torch.tensor([10.0, 20.0, 390.0, 280.0])
    _, p, b = tf(Image.new("RGB", (400, 300)), parts, box)
    assert p[0].tolist() == pytest.approx([200 * 341 / 400 - 58, 150 * 256 / 300 - 16, 1.0], abs=1e-3)
    assert p[1].tolist() == [0.0, 0.0, 0.0]  # left the crop -> invisible
    assert p[2].tolist() == [0.0, 0.0, 0.0]
    assert b.tolist() == pytest.approx([0.0, 20 * 256 / 300 - 16, 224.0, 280 * 256 / 300 - 16], abs=1e-3)


@pytest.mark.parametrize("size,wh,xy", [(64, (120, 80), (70.3, 41.7)), ((48, 80), (90, 140), (30.2, 77.9))])
def test_eval_keypoint_follows_pixels(size, wh, xy):
    tf = EvalTransform(size)
    t, p, _ = tf(_marker_image(*wh, *xy), torch.tensor([[*xy, 1.0]]), torch.zeros(4))
    assert p[0, 2] == 1
    cx, cy = _red_centroid(t)
    assert abs(cx - p[0, 0]) < 1.0 and abs(cy - p[0, 1]) < 1.0


def test_train_keypoint_follows_pixels_with_flip():
    xy = (90.0, 60.0)
    parts = torch.tensor([[*xy, 1.0]])
    for seed in range(6):
        for fp in (0.0, 1.0):
            tf = TrainTransform(64, scale=(0.6, 1.0), flip_prob=fp, seed=seed)
            t, p, _ = tf(_marker_image(160, 120, *xy, r=4), parts, torch.zeros(4))
            if p[0, 2] == 0:
                continue
            cx, cy = _red_centroid(t)
            assert abs(cx - p[0, 0]) < 1.0 and abs(cy - p[0, 1]) < 1.0


def test_flip_mirrors_x_and_swaps_left_right_by_name():
    perm = flip_permutation(CUB_PART_NAMES)
    names = list(CUB_PART_NAMES)
    assert names[perm[names.index("left eye")]] == "right eye"
    assert names[perm[names.index("right wing")]] == "left wing"
    assert names[perm[names.index("left leg")]] == "right leg"
    assert names[perm[names.index("beak")]] == "beak"
    parts = torch.zeros(15, 3)
    parts[names.index("left eye")] = torch.tensor([10.0, 20.0, 1.0])
    parts[names.index("beak")] = torch.tensor([0.0, 5.0, 1.0])  # x = 0 -> x' = W (far border)
    box = torch.tensor([4.0, 8.0, 20.0, 30.0])
    tf = TrainTransform(64, scale=(1.0, 1.0), ratio=(1.0, 1.0), flip_prob=1.0, seed=0)
    _, p, b = tf(Image.new("RGB", (64, 64)), parts, box, part_names=CUB_PART_NAMES)
    assert p[names.index("right eye")].tolist() == [54.0, 20.0, 1.0]   # x' = W - x
    assert p[names.index("left eye")].tolist() == [0.0, 0.0, 0.0]
    assert p[names.index("beak")].tolist() == [64.0, 5.0, 1.0]
    assert b.tolist() == [44.0, 8.0, 60.0, 30.0]


def test_train_transform_deterministic_by_seed():
    im = Image.fromarray(np.random.default_rng(0).integers(0, 255, (90, 130, 3), dtype=np.uint8))
    parts, box = torch.tensor([[50.0, 40.0, 1.0]]), torch.tensor([10.0, 10.0, 100.0, 80.0])
    a = [TrainTransform(32, seed=3)(im, parts, box) for _ in range(2)]
    assert all(torch.equal(x, y) for x, y in zip(a[0], a[1]))
    tf = TrainTransform(32, seed=3)
    r1, r2 = tf.region(130, 90), tf.region(130, 90)
    assert r1 != r2  # the stream advances
    for _ in range(20):
        (x0, y0, x1, y1), _ = tf.region(130, 90)
        assert 0 <= x0 < x1 <= 130 and 0 <= y0 < y1 <= 90
        assert (x1 - x0) * (y1 - y0) >= 0.3 * 130 * 90


def test_bad_transform_arguments():
    with pytest.raises(ValueError):
        EvalTransform(224, resize_ratio=0.5)
    with pytest.raises(ValueError):
        TrainTransform(224, scale=(0.0, 1.0))
    with pytest.raises(ValueError):
        TrainTransform(224, flip_prob=2.0)
    with pytest.raises(ValueError):
        EvalTransform(224, std=(0.0, 1.0, 1.0))


def test_collate_rejects_mixed_sizes():
    with pytest.raises(ValueError, match="empty"):
        collate_samples([])


def test_seeded_train_transform_in_dataloader_workers(tmp_path):
    from midas_nb.data import CUBDataset, make_synthetic_cub

    root = make_synthetic_cub(tmp_path / "s", num_classes=2, images_per_class=2, image_size=48)
    ds = CUBDataset(root, "all", TrainTransform(32, seed=0), patch_size=8)
    dl = torch.utils.data.DataLoader(ds, batch_size=2, num_workers=2, collate_fn=collate_samples)
    torch.manual_seed(0)
    batches = list(dl)
    assert [len(b) for b in batches] == [2, 2]
    assert batches[0].images.shape == (2, 3, 32, 32) and batches[0].part_mask.shape == (2, 16)
    assert sorted(i for b in batches for i in b.indices.tolist()) == [0, 1, 2, 3]
    # reproducible under torch.manual_seed in the main process, different from epoch to epoch
    torch.manual_seed(0)
    again = list(dl)
    assert all(torch.equal(a.images, b.images) for a, b in zip(batches, again))
    third = list(dl)
    assert not all(torch.equal(a.images, b.images) for a, b in zip(batches, third))
