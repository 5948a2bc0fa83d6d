"""Every bad-input case of the data layer gives one clear error or a counted skip.

Runs on a small synthetic CUB-layout set (no real data needed)."""

import shutil

import numpy as np
import pytest
import torch
from PIL import Image

from midas_nb.data import CUBDataset, DatasetError, EvalTransform, collate_samples, make_synthetic_cub

TF = EvalTransform(64, resize_ratio=1.0)


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return make_synthetic_cub(tmp_path_factory.mktemp("syn") / "cub", num_classes=3, images_per_class=4,
                              image_size=64, seed=1)


@pytest.fixture
def root(base, tmp_path):
    dst = tmp_path / "cub"
    shutil.copytree(base, dst)
    return dst


def _first_image(root):
    line = (root / "images.txt").read_text().splitlines()[0]
    img_id, rel = line.split()
    return img_id, root / "images" / rel


def test_missing_root(tmp_path):
    with pytest.raises(DatasetError, match=r"nowhere.*does not exist.*images\.txt"):
        CUBDataset(tmp_path / "nowhere", "train")


@pytest.mark.parametrize("name", ["images.txt", "bounding_boxes.txt", "parts/part_locs.txt", "classes.txt",
                                  "train_test_split.txt"])
def test_missing_annotation_file(root, name):
    (root / name).unlink()
    with pytest.raises(DatasetError, match=r"missing annotation file .*" + name.split("/")[-1].replace(".", r"\.")):
        CUBDataset(root, "train")


def test_malformed_rows_name_file_and_line(root):
    p = root / "bounding_boxes.txt"
    lines = p.read_text().splitlines()
    lines[2] = "3 1.0 2.0"
    p.write_text("\n".join(lines) + "\n")
    with pytest.raises(DatasetError, match=r"bounding_boxes\.txt:3: expected 5 fields"):
        CUBDataset(root, "train")


def test_bad_part_row(root):
    p = root / "parts" / "part_locs.txt"
    p.write_text(p.read_text() + "1 16 5.0 5.0 1\n")
    with pytest.raises(DatasetError, match=r"part_locs\.txt.*part_id in 1\.\.15"):
        CUBDataset(root, "train")


def test_image_without_rows(root):
    p = root / "image_class_labels.txt"
    p.write_text("\n".join(p.read_text().splitlines()[1:]) + "\n")
    with pytest.raises(DatasetError, match=r"image_class_labels\.txt: no row for 1 image"):
        CUBDataset(root, "all")


def test_listed_image_absent(root):
    _, path = _first_image(root)
    path.unlink()
    with pytest.raises(DatasetError, match=r"1 image\(s\) listed in .*images\.txt are missing: .*" + path.name) as e:
        CUBDataset(root, "all")
    assert "check_files" not in str(e.value)   # a Python argument, no advice for a command-line user
    ds = CUBDataset(root, "all", TF, check_files=False)   # deferred: error when read, naming the file
    with pytest.raises(DatasetError, match=path.name):
        ds[0]


def test_corrupt_image(root):
    _, path = _first_image(root)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 3])   # truncated JPEG
    ds = CUBDataset(root, "all", TF)
    with pytest.raises(DatasetError, match=r"cannot read image .*" + path.name):
        ds[0]
    path.write_bytes(b"this is not an image")
    with pytest.raises(DatasetError, match=r"cannot read image .*" + path.name):
        ds[0]


def test_cmyk_and_grayscale_converted(root):
    ds = CUBDataset(root, "all", TF)
    rgb = Image.open(ds.paths[0]).convert("RGB")
    rgb.convert("CMYK").save(ds.paths[0], format="JPEG", quality=95)
    rgb.convert("L").save(ds.paths[1], format="JPEG", quality=95)
    Image.open(ds.paths[2]).convert("RGB").convert("P").save(ds.paths[2].with_suffix(".jpg"), format="PNG")
    assert Image.open(ds.paths[0]).mode == "CMYK" and Image.open(ds.paths[1]).mode == "L"
    for i in range(3):
        s = ds[i]
        assert s.image.shape == (3, 64, 64) and torch.isfinite(s.image).all()
    g = ds[1].image
    assert torch.allclose(g[0], g[1]) and torch.allclose(g[1], g[2])


def test_keypoints_out_of_frame_become_invisible(root):
    p = root / "parts" / "part_locs.txt"
    rows = [r.split() for r in p.read_text().splitlines()]
    for r in rows:
        if r[0] == "1" and r[1] == "1":
            r[2:] = ["500.0", "10.0", "1"]     # right of a 64-px image
        if r[0] == "1" and r[1] == "2":
            r[2:] = ["-4.0", "10.0", "1"]      # left of it
    p.write_text("\n".join(" ".join(r) for r in rows) + "\n")
    s = CUBDataset(root, "all", TF, ids=[1])[0]
    assert s.parts[0].tolist() == [0.0, 0.0, 0.0] and s.parts[1].tolist() == [0.0, 0.0, 0.0]


def test_no_visible_part_is_kept_and_counted(root):
    p = root / "parts" / "part_locs.txt"
    rows = [r.split() for r in p.read_text().splitlines()]
    for r in rows:
        if r[0] in ("1", "2"):
            r[2:] = ["0.0", "0.0", "0"]
    p.write_text("\n".join(" ".join(r) for r in rows) + "\n")
    ds = CUBDataset(root, "all", TF)
    assert len(ds) == 12 and ds.skipped["no_visible_part"] == 2
    assert ds.has_visible_part[:3] == [False, False, True]
    b = collate_samples([ds[i] for i in range(3)])
    assert b.has_visible_part.tolist() == [False, False, True]
    assert not b.part_mask[:2].any() and b.box_mask[:2].any(dim=1).all()


def test_zero_image_split(tmp_path):
    root = make_synthetic_cub(tmp_path / "all_train", num_classes=2, images_per_class=2, image_size=32,
                              train_fraction=1.0)
    assert len(CUBDataset(root, "train", EvalTransform(32, 1.0))) == 4
    with pytest.raises(DatasetError, match=r"train_test_split\.txt: split 'test' selects no images"):
        CUBDataset(root, "test")


def test_bad_split_name_and_patch_size(root):
    with pytest.raises(ValueError, match="split"):
        CUBDataset(root, "val")
    with pytest.raises(ValueError, match="multiples of patch_size"):
        CUBDataset(root, "train", EvalTransform(60), patch_size=16)


def test_labels_subset_noncontiguous_ids(root):
    # keep classes 2 and 3 only, drop some ids: labels remap to 0..1, ids stay as in the files
    keep = {}
    for line in (root / "image_class_labels.txt").read_text().splitlines():
        i, c = line.split()
        if c != "1" and i not in ("6", "11"):
            keep[i] = c
    for name in ("images.txt", "image_class_labels.txt", "train_test_split.txt", "bounding_boxes.txt"):
        p = root / name
        p.write_text("\n".join(r for r in p.read_text().splitlines() if r.split()[0] in keep) + "\n")
    ds = CUBDataset(root, "all", TF)
    assert len(ds) == 6 and ds.num_classes == 2
    assert ds.label_map == {2: 0, 3: 1} and sorted(set(ds.labels)) == [0, 1]
    assert ds.classes[0].startswith("002.") and "6" not in ds.image_ids and ds.image_ids[0] == "5"
    assert ds.original_labels[0] == 2
    # images with ids not listed in images.txt are ignored in part_locs.txt (rows kept there)
    assert np.isfinite(ds.raw_parts).all()
