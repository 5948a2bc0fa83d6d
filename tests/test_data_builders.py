"""Format-true FGVC-Aircraft and Stanford Cars directories built from the CUB photos
(``midas_nb.data.make_aircraft_from_cub`` / ``make_cars_from_cub``): the files have the real
layouts, and the package's readers recover the CUB boxes from them."""
from __future__ import annotations

import re

import numpy as np
import pytest
import scipy.io
from PIL import Image

from midas_nb.data import (AircraftDataset, CarsDataset, EvalTransform, make_aircraft_from_cub,
                           make_cars_from_cub, read_cub_annotations)

pytestmark = pytest.mark.real_data


@pytest.fixture(scope="module")
def cub(shared_data):
    return shared_data / "cub200_subset"


def _cub_rows(cub, num_classes, need):
    ann = read_cub_annotations(cub)
    out = []
    for c in sorted(set(ann.labels.tolist()))[:num_classes]:
        rows = np.nonzero(ann.labels == c)[0][:need]
        out.append([(cub / "images" / ann.rel_paths[r], ann.boxes[r]) for r in rows])
    return out


def test_aircraft_layout_ids_names_boxes_and_banner(cub, tmp_path):
    root = make_aircraft_from_cub(cub, tmp_path / "fgvc-aircraft-2013b", num_classes=3, per_split=(2, 1, 2))
    data = root / "data"
    names = {f.name for f in data.iterdir()}
    for level in ("variant", "family", "manufacturer"):
        for split in ("train", "val", "trainval", "test"):
            assert f"images_{level}_{split}.txt" in names
    assert {"images_box.txt", "variants.txt", "families.txt", "manufacturers.txt", "images"} <= names
    boxes = {}
    for line in (data / "images_box.txt").read_text().splitlines():
        i, *v = line.split()
        assert re.fullmatch(r"\d{7}", i) and all(re.fullmatch(r"\d+", t) for t in v)   # integer pixels
        boxes[i] = [int(t) for t in v]
    assert any(i.startswith("0") for i in boxes) and any(not i.startswith("0") for i in boxes)
    rows = [ln.split(" ", 1) for ln in (data / "images_variant_train.txt").read_text().splitlines()]
    assert all(" " in name for _, name in rows)                                # class names with spaces
    tv = (data / "images_variant_trainval.txt").read_text().splitlines()
    tr = (data / "images_variant_train.txt").read_text().splitlines()
    va = (data / "images_variant_val.txt").read_text().splitlines()
    assert sorted(tv) == sorted(tr + va) and len(tv) == 3 * 3
    # each class: its first 2 CUB photos are train, the 3rd val, the 4th and 5th test (id order)
    src = _cub_rows(cub, 3, 5)
    test_ds = AircraftDataset(root, "test", EvalTransform(64), check_files=True)
    assert len(test_ds) == 6 and test_ds.classes == ["Cessna 172", "Falcon 2000", "Gulfstream IV"]
    for k, image_id in enumerate(test_ds.image_ids):
        with Image.open(data / "images" / f"{image_id}.jpg") as a:
            pix = np.asarray(a.convert("RGB")).astype(float)
        # the photo it was made from: one of the class's 4th/5th CUB photos, same pixels above the banner
        found = []
        for photo_path, cub_box in src[test_ds.labels[k]][3:5]:
            with Image.open(photo_path) as p:
                ref = np.asarray(p.convert("RGB")).astype(float)
            if pix.shape == (ref.shape[0] + 20, ref.shape[1], 3) and np.abs(pix[:-20] - ref).mean() < 8:
                found.append((ref.shape[1], ref.shape[0], cub_box))
        assert len(found) == 1, image_id
        w, h, cub_box = found[0]
        assert pix[-20:].mean() < 90                                         # the dark banner strip below
        xmin, ymin, xmax, ymax = boxes[image_id]
        assert 1 <= xmin <= xmax <= w and 1 <= ymin <= ymax <= h            # 1-based inclusive, inside the photo
        img, _, box = test_ds.load_raw(k)
        assert img.size == (w, h)                                            # the reader crops the banner
        # 1-based inclusive -> continuous: the CUB box rounded outwards to whole pixels
        assert box.tolist() == pytest.approx([xmin - 1, ymin - 1, xmax, ymax])
        assert np.all(np.abs(box - cub_box) < 1.0 + 1e-4)


def test_cars_mat_files_have_the_real_field_layout(cub, shared_data, tmp_path):
    root = make_cars_from_cub(cub, tmp_path / "cars", num_classes=3, per_split=(2, 2))
    dk = root / "devkit"
    real = shared_data / "real_annotations" / "stanford_cars_devkit"
    for ours, theirs, var in (("cars_meta.mat", "cars_meta.mat", "class_names"),
                              ("cars_train_annos.mat", "cars_train_annos.mat", "annotations"),
                              ("cars_test_annos.mat", "cars_test_annos.mat", "annotations")):
        a, b = scipy.io.loadmat(dk / ours)[var], scipy.io.loadmat(real / theirs)[var]
        assert a.dtype.names == b.dtype.names and a.ndim == b.ndim == 2 and a.shape[0] == b.shape[0] == 1
        for f in (a.dtype.names or ()):
            x, y = a[f][0, 0], b[f][0, 0]
            assert x.shape == y.shape and x.dtype.kind == y.dtype.kind, f
        if var == "class_names":
            assert a[0, 0].dtype.kind == b[0, 0].dtype.kind == "U"
    lab = scipy.io.loadmat(dk / "cars_test_annos_withlabels.mat")["annotations"]
    assert lab.dtype.names == ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2", "class", "fname")
    assert sorted(p.name for p in (root / "cars_train").iterdir()) == [f"{k:05d}.jpg" for k in range(1, 7)]
    tr = CarsDataset(root, "train", EvalTransform(64))
    te = CarsDataset(root, "test", EvalTransform(64))
    assert tr.classes == ["AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012"]
    assert te.has_labels and sorted(te.labels) == [0, 0, 1, 1, 2, 2] and sorted(tr.labels) == [0, 0, 1, 1, 2, 2]
    # every train image is one of the class's first two CUB photos, with its box rounded outwards
    src = _cub_rows(cub, 3, 2)
    for k in range(len(tr)):
        img, _, box = tr.load_raw(k)
        match = [b for p, b in src[tr.labels[k]] if Image.open(p).size == img.size]
        assert match and any(np.all(np.abs(box - b) < 1.0 + 1e-4) for b in match)
    raw = scipy.io.loadmat(dk / "cars_train_annos.mat")["annotations"]
    for f in ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2"):
        assert all(raw[f][0, j].dtype in (np.uint8, np.uint16) for j in range(raw.shape[1]))


def test_builders_refuse_impossible_requests(cub, tmp_path):
    with pytest.raises(ValueError, match="num_classes must be <="):
        make_aircraft_from_cub(cub, tmp_path / "a", num_classes=99)
    with pytest.raises(ValueError, match="at least one image per class"):
        make_cars_from_cub(cub, tmp_path / "c", per_split=(2, 0))


def test_layout_check_of_the_built_directories(cub, tmp_path):
    from midas_nb.data import check_layout
    air = make_aircraft_from_cub(cub, tmp_path / "air", num_classes=2, per_split=(1, 1, 1))
    cars = make_cars_from_cub(cub, tmp_path / "cars", num_classes=2, per_split=(1, 1))
    assert check_layout("aircraft", air) == [] and check_layout("cars", cars) == []
    assert check_layout("aircraft", air / "data") == []                      # the data/ folder itself
    (cars / "devkit" / "cars_test_annos_withlabels.mat").unlink()            # the original test file only
    problems = check_layout("cars", cars)
    assert len(problems) == 1 and "has no class field" in problems[0]
    assert "cars_test_annos_withlabels.mat" in problems[0]
    next((air / "data" / "images").iterdir()).unlink()                      # a listed image is missing
    assert any("missing" in p for p in check_layout("aircraft", air))
