"""The real FGVC-Aircraft and Stanford Cars subsets of ../shared/data through the readers: every split
and label level loads, every image decodes, every box lies inside its image after the banner crop, and
every test image has a non-empty box mask (box coverage is defined on every test image)."""
from __future__ import annotations

from pathlib import Path

import pytest
from PIL import Image

from midas_nb.data import AircraftDataset, EvalTransform
from midas_nb.data.aircraft import AIRCRAFT_LEVELS
from midas_nb.data.cars import CarsDataset

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
AIR = SHARED / "fgvc_aircraft_subset" / "fgvc-aircraft-2013b"
CARS = SHARED / "stanford_cars_subset"

pytestmark = pytest.mark.real_data
need_air = pytest.mark.skipif(not (AIR / "data" / "images_box.txt").is_file(),
                              reason=f"real FGVC-Aircraft subset not found at {AIR} (../shared/data absent)")
need_cars = pytest.mark.skipif(not (CARS / "devkit" / "cars_meta.mat").is_file(),
                               reason=f"real Stanford Cars subset not found at {CARS} (../shared/data absent)")


def _box_inside(ds, i) -> None:
    img, _, box = ds.load_raw(i)
    w, h = img.size
    x0, y0, x1, y1 = (float(v) for v in box)
    assert 0 <= x0 < x1 <= w and 0 <= y0 < y1 <= h, (ds.image_ids[i], (x0, y0, x1, y1), (w, h))


@need_air
@pytest.mark.parametrize("level", AIRCRAFT_LEVELS)
def test_aircraft_every_split_and_level(level):
    sizes = {s: len(AircraftDataset(AIR, s, annotation_level=level)) for s in ("train", "trainval", "test")}
    assert sizes == {"train": 198, "trainval": 198, "test": 99}
    tr, te = (AircraftDataset(AIR, s, annotation_level=level) for s in ("trainval", "test"))
    assert tr.label_map == te.label_map          # one class mapping for every split
    assert set(te.labels) <= set(tr.labels)      # every test class is seen in training


@need_air
def test_aircraft_images_decode_and_boxes_lie_inside_after_the_banner_crop():
    for split in ("trainval", "test"):
        ds = AircraftDataset(AIR, split, EvalTransform(224), annotation_level="manufacturer")
        for i in range(len(ds)):
            _box_inside(ds, i)
            with Image.open(ds.paths[i]) as im:
                full_h = im.size[1]
            assert ds.load_raw(i)[0].size[1] == full_h - 20      # the 20-px banner, exactly
    te = AircraftDataset(AIR, "test", EvalTransform(224), annotation_level="manufacturer")
    assert all(te[i].box_mask.any() for i in range(len(te)))


@need_cars
def test_cars_splits_decode_and_test_boxes():
    tr, te = CarsDataset(CARS, "train"), CarsDataset(CARS, "test", EvalTransform(224))
    assert (len(tr), len(te)) == (3948, 144)
    assert len(set(te.labels)) == 94 and min(te.labels) >= 0 and set(te.labels) <= set(tr.labels)
    for ds in (tr, te):
        for i in range(len(ds)):
            with Image.open(ds.paths[i]) as im:
                im.load()
    for i in range(len(te)):
        _box_inside(te, i)
        assert te[i].box_mask.any()
