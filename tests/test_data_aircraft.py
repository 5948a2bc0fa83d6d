"""FGVC-Aircraft reader (Maji et al. 2013) on the real annotation rows in ../shared/data,
with stand-in JPEGs written to tmp_path (the shared copy has no images)."""

import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from midas_nb.data import AircraftDataset, DatasetError, EvalTransform, load_dataset

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
AIR = SHARED / "real_annotations" / "fgvc_aircraft"
real = [pytest.mark.real_data,
        pytest.mark.skipif(not (AIR / "images_box.txt").is_file(),
                           reason=f"real FGVC-Aircraft annotations not found at {AIR} (../shared/data absent)")]


def _boxes(path):
    return {ln.split()[0]: [int(v) for v in ln.split()[1:]] for ln in path.read_text().splitlines() if ln.strip()}


def _stand_in(path, w, h, seed):
    rng = np.random.default_rng(seed)
    small = rng.integers(0, 256, (h // 8 + 1, w // 8 + 1, 3), dtype=np.uint8)
    Image.fromarray(small).resize((w, h), Image.NEAREST).save(path, format="JPEG", quality=80)


@pytest.fixture
def air_root(tmp_path):
    if not (AIR / "images_box.txt").is_file():
        pytest.skip(f"real FGVC-Aircraft annotations not found at {AIR}")
    root = tmp_path / "data"
    (root / "images").mkdir(parents=True)
    for f in ("images_box.txt", "images_family_train.txt"):
        shutil.copy(AIR / f, root / f)
    for k, (i, (x0, y0, x1, y1)) in enumerate(_boxes(root / "images_box.txt").items()):
        _stand_in(root / "images" / f"{i}.jpg", x1 + 40, y1 + 60, k)   # larger than the box + banner
    return root


@pytest.mark.real_data
def test_leading_zero_ids_and_multi_word_names(air_root):
    ds = AircraftDataset(air_root, "train", EvalTransform(64), annotation_level="family", patch_size=16)
    assert len(ds) == 16
    assert ds.classes == ["Boeing 707", "Boeing 727"] and ds.label_map == {"Boeing 707": 0, "Boeing 727": 1}
    assert ds.image_ids[2] == "0056978" and ds.paths[2].name == "0056978.jpg"
    assert "0065840" in ds.image_ids and ds.labels[ds.image_ids.index("0065840")] == 1
    assert ds.labels.count(0) == 10 and ds.labels.count(1) == 6
    assert not ds.has_parts and ds.part_names == []
    s = ds[2]
    assert s.image_id == "0056978" and s.parts.shape == (0, 3)
    assert not s.part_mask.any() and s.box_mask.any() and s.image.shape == (3, 64, 64)


@pytest.mark.real_data
def test_box_conversion_and_banner_crop(air_root):
    # "0056978 1 129 891 436": 1-based inclusive -> (0, 128, 891, 436); stand-in is 931 x 496, banner-cropped
    # to 931 x 476. EvalTransform(224, resize_ratio=1): scale 224/476, resized round(931*224/476)=438 x 224,
    # left = round((438-224)/2) = 107. x1 -> 891*438/931 - 107 = 312.2 -> clipped to 224.
    ds = AircraftDataset(air_root, "train", EvalTransform(224, 1.0), annotation_level="family", ids=["0056978"])
    img, _, box = ds.load_raw(0)
    assert img.size == (931, 476)
    assert box.tolist() == pytest.approx([0.0, 128.0, 891.0, 436.0])
    s = ds[0]
    fx, fy = 438 / 931, 224 / 476
    assert s.box.tolist() == pytest.approx([0.0, 128 * fy, 224.0, 436 * fy], abs=1e-3)
    # a box reaching into the banner is clipped at the crop
    nob = AircraftDataset(air_root, "train", annotation_level="family", ids=["0056978"], crop_banner=False)
    assert nob.load_raw(0)[0].size == (931, 496)
    # "2223757 134 15 862 759" has its box in the bottom of a 902 x 819 stand-in: still inside after the crop
    _stand_in(air_root / "images" / "2223757.jpg", 902, 770, 0)     # banner crop leaves 750 < 759
    ds2 = AircraftDataset(air_root, "train", annotation_level="family", ids=["2223757"])
    assert ds2.load_raw(0)[2].tolist() == pytest.approx([133.0, 14.0, 862.0, 750.0])


@pytest.mark.real_data
def test_load_dataset_and_subset(air_root):
    ds = load_dataset("aircraft", air_root, "train", image_size=32, annotation_level="family",
                      max_images_per_class=2)
    assert ds.image_ids == ["1025794", "1340192", "1019011", "0732456"]
    assert ds[3].image.shape == (3, 32, 32)


@pytest.mark.real_data
def test_bad_inputs(air_root, tmp_path):
    with pytest.raises(DatasetError, match="does not exist"):
        AircraftDataset(tmp_path / "none", "train")
    with pytest.raises(DatasetError, match=r"missing annotation file .*images_variant_train\.txt"):
        AircraftDataset(air_root, "train")   # only the family level is present
    (air_root / "images" / "0056978.jpg").unlink()
    with pytest.raises(DatasetError, match=r"missing: .*0056978\.jpg"):
        AircraftDataset(air_root, "train", annotation_level="family")
    (air_root / "images" / "1340192.jpg").write_bytes(b"\xff\xd8\xff garbage")
    ds = AircraftDataset(air_root, "train", annotation_level="family", ids=["1340192"])
    with pytest.raises(DatasetError, match=r"cannot read image .*1340192\.jpg"):
        ds[0]
    box = air_root / "images_box.txt"
    box.write_text("\n".join(ln for ln in box.read_text().splitlines() if not ln.startswith("1025794")))
    with pytest.raises(DatasetError, match=r"images_box\.txt: no box for 1 image.*1025794"):
        AircraftDataset(air_root, "train", annotation_level="family", check_files=False)
    (air_root / "images_family_train.txt").write_text("")
    with pytest.raises(DatasetError, match="selects no images"):
        AircraftDataset(air_root, "train", annotation_level="family")
    with pytest.raises(ValueError, match="annotation_level"):
        AircraftDataset(air_root, "train", annotation_level="model")
