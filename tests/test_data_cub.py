"""CUB-200-2011 reader on the real subset in ../shared/data (Wah et al. 2011)."""

from pathlib import Path

import pytest
import torch

from midas_nb.data import (CUB_PART_NAMES, CUBDataset, EvalTransform, TrainTransform, collate_samples,
                           load_dataset)

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
CUB = SHARED / "cub200_subset"
pytestmark = [
    pytest.mark.real_data,
    pytest.mark.skipif(not (CUB / "images.txt").is_file(),
                       reason=f"real CUB subset not found at {CUB} (../shared/data is absent on this machine)"),
]


def test_subset_counts_and_label_mapping():
    all_, train, test = (CUBDataset(CUB, s) for s in ("all", "train", "test"))
    assert (len(all_), len(train), len(test)) == (2290, 1200, 1090)
    for d in (all_, train, test):
        assert d.num_classes == 40
        assert d.part_names == list(CUB_PART_NAMES) and d.has_parts
    assert sorted(set(all_.labels)) == list(range(40))
    assert all_.label_map == {k + 1: k for k in range(40)}
    assert all_.classes[0] == "001.Black_footed_Albatross" and all_.classes[-1] == "040.Olive_sided_Flycatcher"
    # train_test_split.txt: "1 0" (test), "2 1" (train)
    assert "1" in test.image_ids and "1" not in train.image_ids and train.image_ids[0] == "2"
    assert all_.skipped["no_visible_part"] == 0  # every image of the subset has a visible part


def test_hand_checked_keypoint_lands_in_expected_patch():
    # Raw files: images.txt "1 001.Black_footed_Albatross/Black_Footed_Albatross_0046_18.jpg" (382 x 256 px),
    # part_locs.txt "1 2 238.4 139.1 1" (beak). EvalTransform(224, 256/224): shorter side 256 -> 256, so
    # scale 1, resized 382 x 256; centre crop left = round((382-224)/2) = 79, top = round((256-224)/2) = 16.
    # Beak -> (238.4-79, 139.1-16) = (159.4, 123.1) -> patch row floor(123.1/16)=7, col floor(159.4/16)=9,
    # token 7*14 + 9 = 107.
    ds = CUBDataset(CUB, "all", EvalTransform(224), ids=[1])
    s = ds[0]
    assert s.image_id == "1" and s.image.shape == (3, 224, 224)
    assert s.parts[1].tolist() == pytest.approx([159.4, 123.1, 1.0], abs=1e-4)
    assert bool(s.part_mask[107])
    # Same image at 112 px: target 128, scale 0.5 -> 191 x 128, left = round(39.5) = 40, top = 8.
    # Beak -> (119.2-40, 69.55-8) = (79.2, 61.55) -> row 3, col 4 -> token 3*7 + 4 = 25.
    s = CUBDataset(CUB, "all", EvalTransform(112), ids=[1])[0]
    assert s.parts[1].tolist() == pytest.approx([79.2, 61.55, 1.0], abs=1e-3)
    assert bool(s.part_mask[25]) and s.part_mask.shape == (49,)
    # box "1 45.9 20.6 248.4 232.3" (x y w h) -> x0 = 45.9*0.5-40 = -17.05 -> 0 (clipped),
    # y0 = 20.6*0.5-8 = 2.3, x1 = 294.3*0.5-40 = 107.15, y1 = 252.9*0.5-8 = 118.45 -> 112 (clipped)
    assert s.box.tolist() == pytest.approx([0.0, 2.3, 107.15, 112.0], abs=1e-3)


def test_flip_swaps_left_and_right_parts_on_real_image():
    # Image 2 (381 x 256): left wing (158.5, 77.7), right eye (205.7, 111.2), right wing (178.3, 147.0)
    # visible; left eye, left leg, right leg invisible. Full-image crop (scale 1, aspect 381/256) to
    # 224x224, then flip: x' = 224 - x*224/381, y' = y*224/256.
    names = list(CUB_PART_NAMES)
    r = 381 / 256
    flipped = CUBDataset(CUB, "all", TrainTransform(224, scale=(1, 1), ratio=(r, r), flip_prob=1.0, seed=0),
                         ids=[2])[0]
    plain = CUBDataset(CUB, "all", TrainTransform(224, scale=(1, 1), ratio=(r, r), flip_prob=0.0, seed=0),
                       ids=[2])[0]
    sx, sy = 224 / 381, 224 / 256
    p = flipped.parts
    assert p[names.index("left eye")].tolist() == pytest.approx([224 - 205.7 * sx, 111.2 * sy, 1], abs=1e-3)
    assert p[names.index("right eye")].tolist() == [0.0, 0.0, 0.0]
    assert p[names.index("left wing")].tolist() == pytest.approx([224 - 178.3 * sx, 147.0 * sy, 1], abs=1e-3)
    assert p[names.index("right wing")].tolist() == pytest.approx([224 - 158.5 * sx, 77.7 * sy, 1], abs=1e-3)
    assert plain.parts[names.index("right eye")].tolist() == pytest.approx([205.7 * sx, 111.2 * sy, 1], abs=1e-3)
    # the part mask of the flipped image is the column-mirrored mask of the plain one
    assert torch.equal(flipped.part_mask.reshape(14, 14), plain.part_mask.reshape(14, 14).flip(1))
    # and the pixels are mirrored too
    assert torch.allclose(flipped.image, plain.image.flip(-1), atol=1e-5)


def test_grayscale_images_are_converted():
    # 448 (Brewer_Blackbird_0028_2682.jpg) and 1401 (Pelagic_Cormorant_0022_23802.jpg) are mode "L"
    ds = CUBDataset(CUB, "all", EvalTransform(64), patch_size=16, ids=[448, 1401])
    for s in ds:
        assert s.image.shape == (3, 64, 64)
        assert torch.allclose(s.image[0], s.image[1]) and torch.allclose(s.image[1], s.image[2])


def test_small_deterministic_subset_and_batch():
    ds = load_dataset("cub", CUB, "train", image_size=64, patch_size=16, max_images_per_class=2)
    assert len(ds) == 80 and ds.num_classes == 40
    assert all(v == 2 for v in ds.class_counts().values())
    assert ds.image_ids == load_dataset("cub", CUB, "train", image_size=64, max_images_per_class=2).image_ids
    ids = [int(i) for i in ds.image_ids]
    assert ids[:2] == sorted(ids[:2])
    b = collate_samples([ds[i] for i in range(3)])
    assert b.images.shape == (3, 3, 64, 64) and b.parts.shape == (3, 15, 3)
    assert b.part_mask.shape == (3, 16) and b.box_mask.shape == (3, 16)
    assert b.labels.tolist() == [0, 0, 1] and b.indices.tolist() == [0, 1, 2]
    assert b.to("cpu").image_ids == b.image_ids
