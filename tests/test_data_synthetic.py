"""Synthetic CUB-layout generator: layout, determinism, round trip through CUBDataset."""

import hashlib
import json
import time
from pathlib import Path

import pytest
import torch

from midas_nb.data import (CUB_PART_NAMES, CUBDataset, DatasetError, EvalTransform, collate_samples,
                           load_dataset, make_synthetic_cub, synthetic_class_attributes)
from midas_nb.data.cub import CUB_FILES


def _digest(root: Path) -> dict:
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_layout_and_speed(tmp_path):
    t = time.perf_counter()
    root = make_synthetic_cub(tmp_path / "s", num_classes=4, images_per_class=8, image_size=96, seed=0)
    assert time.perf_counter() - t < 3.0
    for f in CUB_FILES:
        assert (root / f).is_file(), f
    assert (root / "parts" / "parts.txt").read_text().splitlines() == \
        [f"{k + 1} {n}" for k, n in enumerate(CUB_PART_NAMES)]
    jpgs = sorted((root / "images").rglob("*.jpg"))
    assert len(jpgs) == 32 and len({p.parent for p in jpgs}) == 4
    assert len((root / "parts" / "part_locs.txt").read_text().splitlines()) == 32 * 15
    meta = json.loads((root / "synthetic.json").read_text())
    assert meta["num_classes"] == 4 and len(meta["class_attributes"]) == 4


def test_deterministic_by_seed(tmp_path):
    a = _digest(make_synthetic_cub(tmp_path / "a", num_classes=3, images_per_class=3, image_size=48, seed=5))
    b = _digest(make_synthetic_cub(tmp_path / "b", num_classes=3, images_per_class=3, image_size=48, seed=5))
    c = _digest(make_synthetic_cub(tmp_path / "c", num_classes=3, images_per_class=3, image_size=48, seed=6))
    assert a == b
    assert a != c


def test_classes_differ_only_in_part_attributes():
    attrs = synthetic_class_attributes(10, seed=0)
    assert len({tuple(sorted(a.items())) for a in attrs}) == 10
    assert set(attrs[0]) == {"beak_colour", "beak_length", "crown_colour", "wing_pattern", "wing_colour",
                             "tail_colour"}
    # farthest-point choice: the first classes differ in several attributes
    a, b = attrs[0], attrs[1]
    assert sum(a[k] != b[k] for k in a) >= 4


def test_round_trip_through_cub_loader(tmp_path):
    root = make_synthetic_cub(tmp_path / "s", num_classes=4, images_per_class=6, image_size=64, seed=2)
    tr, te = CUBDataset(root, "train", EvalTransform(64, 1.0)), CUBDataset(root, "test", EvalTransform(64, 1.0))
    assert (len(tr), len(te)) == (12, 12) and tr.num_classes == 4 and tr.classes == te.classes
    assert tr.part_names == list(CUB_PART_NAMES)
    # with resize_ratio 1 on a 64-px image the transform is the identity: keypoints come back unchanged
    rows = {}
    for line in (root / "parts" / "part_locs.txt").read_text().splitlines():
        i, p, x, y, v = line.split()
        rows.setdefault(i, []).append([float(x), float(y), float(v)])
    visible = 0
    for s in tr:
        raw = torch.tensor(rows[s.image_id])
        assert torch.allclose(s.parts, raw, atol=1e-4)
        visible += int(s.part_mask.any())
        assert s.box_mask.any()
    assert visible == len(tr)
    assert set(tr.labels) == {0, 1, 2, 3}


def test_load_dataset_generates_once_and_reuses(tmp_path):
    root = tmp_path / "auto"
    ds = load_dataset("synthetic", root, "train", image_size=32, patch_size=8, num_classes=3,
                      images_per_class=4, synthetic_image_size=40)
    assert len(ds) == 6 and ds[0].image.shape == (3, 32, 32) and ds[0].part_mask.shape == (16,)
    stamp = (root / "images.txt").stat().st_mtime_ns
    ds2 = load_dataset("synthetic", root, "test", image_size=32, patch_size=8, train=True, seed=0,
                       num_classes=3, images_per_class=4, synthetic_image_size=40)
    assert (root / "images.txt").stat().st_mtime_ns == stamp and len(ds2) == 6
    b = collate_samples([ds2[i] for i in range(4)])
    assert b.images.shape == (4, 3, 32, 32)
    # other arguments regenerate in place
    ds3 = load_dataset("synthetic", root, "all", image_size=32, patch_size=8, num_classes=2,
                       images_per_class=2, synthetic_image_size=40)
    assert len(ds3) == 4


def test_refuses_to_overwrite_foreign_directory(tmp_path):
    d = tmp_path / "mine"
    d.mkdir()
    (d / "notes.txt").write_text("keep me")
    with pytest.raises(DatasetError, match="refusing to overwrite"):
        make_synthetic_cub(d)
    assert (d / "notes.txt").read_text() == "keep me"


def test_load_dataset_unknown_name(tmp_path):
    with pytest.raises(ValueError, match="unknown dataset"):
        load_dataset("imagenet", tmp_path, "train")
    with pytest.raises(DatasetError, match="no data root"):
        load_dataset("cub", None, "train")


def test_data_note_names_the_synthetic_set_and_its_caveat(tmp_path):
    """Notebook 00 prints this line: a quick run without a data root reads the synthetic set, and a reader must
    learn it there (classes, split sizes, the part evidence built in); a CUB-format root without
    ``synthetic.json`` (a real set) gets no note."""
    import shutil
    from midas_nb.data import data_note
    root = make_synthetic_cub(tmp_path / "s", num_classes=4, images_per_class=6, image_size=64, seed=2)
    tr, te = CUBDataset(root, "train", EvalTransform(64, 1.0)), CUBDataset(root, "test", EvalTransform(64, 1.0))
    note = data_note(tr, te)
    assert note.startswith("Data: the embedded synthetic CUB-format set (no data root given): 4 cartoon bird classes")
    assert "12 training / 12 test images" in note and "says nothing about real photos" in note
    real = shutil.copytree(root, tmp_path / "real")
    (real / "synthetic.json").unlink()
    assert data_note(tr, CUBDataset(real, "test", EvalTransform(64, 1.0))) == ""
