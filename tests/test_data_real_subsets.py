"""The real FGVC-Aircraft and Stanford Cars subsets of ../shared/data through the readers: every split
and label level loads, every image decodes, every box lies inside its image after the banner crop, and
every test image has a non-empty box mask (box coverage is defined on every test image). What the real
photos expose (issue 28): the label level travels from the profile to the reader, its identity and its
label; classes present and the chance level per level; informative boxes counted on the test splits
against an independent count; the known-wrong box of 0422859 left out of box metrics; tiny Cars crops
through the train transform."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from midas_nb import config
from midas_nb.data import KNOWN_BAD_BOXES, AircraftDataset, EvalTransform, TrainTransform, collate_samples
from midas_nb.data.aircraft import AIRCRAFT_LEVELS
from midas_nb.data.cars import CarsDataset
from midas_nb.identity import dataset_identity
from midas_nb.metrics import INFORMATIVE_BOX_MAX_FRACTION, box_coverage, informative_box

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


# ------------------------------------------------------------------------------------------------
# issue 28: label level, classes present, informative boxes, the known-wrong box, tiny crops
# ------------------------------------------------------------------------------------------------
def test_aircraft_levels_agree_between_config_and_reader():
    assert config.AIRCRAFT_LEVELS == AIRCRAFT_LEVELS
    assert config.get_profile("quick")["aircraft_level"] == "variant"
    assert config.get_profile("paper")["aircraft_level"] == "variant"        # the paper's level
    assert config.get_profile("smoke")["aircraft_level"] == "variant"
    bad = config.RunProfile.problems(config.get_profile("quick", aircraft_level="model"))
    assert bad == ["aircraft_level: expected one of ['variant', 'family', 'manufacturer'], got 'model'"]
    prof = config.get_profile("quick", data_roots={"aircraft": "/d/air"}, aircraft_level="manufacturer")
    assert config.dataset_label(prof, "aircraft") == "aircraft (manufacturer)"
    assert config.dataset_label(dict(prof, aircraft_level="variant"), "aircraft") == "aircraft"
    assert config.dataset_of_label("aircraft (family)") == "aircraft"
    assert [config.dataset_of_label(x) for x in ("aircraft", "cars", "synthetic")] == ["aircraft", "cars", "synthetic"]


@need_air
@pytest.mark.parametrize("level, listed, present", [("variant", 100, 99), ("family", 70, 70),
                                                    ("manufacturer", 30, 30)])
def test_aircraft_classes_present_and_chance_per_level(level, listed, present):
    for split in ("trainval", "test"):
        ds = AircraftDataset(AIR, split, annotation_level=level)
        assert (ds.num_classes, ds.num_classes_present) == (listed, present)
        assert ds.classes_present == [c for c in ds.classes if c in set(ds.class_name_of_item)]
        assert ds.chance_accuracy == pytest.approx(1 / present)
    assert len(AircraftDataset(AIR, "trainval", annotation_level=level)) / present == \
        pytest.approx({"variant": 2, "family": 198 / 70, "manufacturer": 6.6}[level])


@need_cars
def test_cars_classes_present_and_chance():
    for split in ("train", "test"):
        ds = CarsDataset(CARS, split)
        assert (ds.num_classes, ds.num_classes_present) == (196, 94)
        assert ds.chance_accuracy == pytest.approx(1 / 94)


@need_air
def test_aircraft_level_reaches_the_dataset_through_the_study_and_its_cells():
    from midas_nb.study import StudyBase, cached_study, make_grid

    roots = {"aircraft": str(AIR)}
    st = StudyBase("quick", dataset="aircraft", data_roots=roots, aircraft_level="manufacturer", progress=False)
    assert StudyBase("quick", dataset="aircraft", data_roots=roots, progress=False).dataset_name == "aircraft"
    assert st.dataset_name == "aircraft (manufacturer)"
    assert st.train_set.annotation_level == st.test_set.annotation_level == "manufacturer"
    assert (st.train_set.num_classes_present, st.test_set.chance_accuracy) == (30, pytest.approx(1 / 30))
    fam = StudyBase("quick", dataset="aircraft", data_roots=roots, aircraft_level="family", progress=False)
    assert fam.dataset_name == "aircraft (family)" and fam.test_set.num_classes_present == 70
    # the level is part of the data's identity (caches, checkpoints, result cells never mix levels)
    assert st.test_set.identity_options()["annotation_level"] == "manufacturer"
    assert dataset_identity(st.test_set).full != dataset_identity(fam.test_set).full
    # the IoU ceiling is read over the images box coverage evaluates (informative boxes only)
    ceiling = st.iou_ceiling([0.25])
    assert ceiling["n_images"].tolist() == [95] and ceiling["coverage_kind"].tolist() == ["box coverage"]
    # sweep cells carry the label; a worker maps it back to the dataset at the same level
    prof = config.get_profile("quick", dataset="aircraft", data_roots=roots, aircraft_level="manufacturer")
    bb = prof["backbone"]
    cells = make_grid(prof, "scale", backbones=[bb], checkpoint_ids={("aircraft", bb): "c"},
                      data_ids={("aircraft", bb): "d"})
    assert {c.dataset for c in cells} == {"aircraft (manufacturer)"}
    worker = cached_study(prof, cells[0].dataset, bb)
    assert worker.dataset_name == cells[0].dataset and worker.test_set.annotation_level == "manufacturer"


def _independent_box_patches(box: torch.Tensor, size: int = 224, patch: int = 16) -> int:
    """Patches whose centre lies in the closed box (docs/architecture.md, Data), counted with numpy;
    a non-empty box that holds no centre gets one patch."""
    x0, y0, x1, y1 = (float(v) for v in box)
    c = (np.arange(size // patch) + 0.5) * patch
    n = int(((c >= x0) & (c <= x1)).sum() * ((c >= y0) & (c <= y1)).sum())
    return 1 if n == 0 and x1 > x0 and y1 > y0 else n


def _informative_counts(ds) -> tuple[int, int, int]:
    samples = [ds[i] for i in range(len(ds))]
    b = collate_samples(samples)
    keep = torch.zeros_like(b.box_mask)
    keep[:, :49] = True                                        # any ranking; b = 25 %
    r = box_coverage(keep, b.box_mask)
    counts = [_independent_box_patches(s.box) for s in samples]
    n = b.box_mask.shape[1]
    independent = sum(0 < k <= INFORMATIVE_BOX_MAX_FRACTION * n for k in counts)
    assert [int(m.sum()) for m in b.box_mask] == counts
    assert r.n_used == independent == int(informative_box(b.box_mask).sum())
    assert r.n_skipped == len(ds) - independent == sum(r.skip_reasons.values())
    return r.n_used, sum(k >= 0.97 * n for k in counts), len(ds)


@need_air
def test_aircraft_informative_boxes_on_the_test_split():
    used, near_full, n = _informative_counts(AircraftDataset(AIR, "test", EvalTransform(224)))
    assert (used, near_full, n) == (95, 2, 99)


@need_cars
def test_cars_informative_boxes_on_the_test_split():
    used, near_full, n = _informative_counts(CarsDataset(CARS, "test", EvalTransform(224)))
    assert (used, near_full, n) == (108, 20, 144)


@need_air
def test_the_known_wrong_aircraft_box_is_left_out_of_box_metrics_not_of_training():
    reason = KNOWN_BAD_BOXES["aircraft"]["0422859"]
    tr = AircraftDataset(AIR, "trainval", EvalTransform(224), annotation_level="manufacturer")
    assert len(tr) == 198 and tr.bad_boxes == {"0422859": reason} and tr.skipped["known_bad_box"] == 1
    i = tr.image_ids.index("0422859")
    s = tr[i]
    assert s.label == tr.labels[i] >= 0                        # kept for classification
    x0, y0, x1, y1 = (float(v) for v in s.box)
    assert x1 > x0 and y1 > y0 and _independent_box_patches(s.box) > 0   # the annotated box is still there
    assert not s.box_mask.any()                                # but no box metric reads it
    r = box_coverage(torch.ones(1, s.box_mask.numel(), dtype=torch.bool), s.box_mask[None])
    assert r.n_used == 0 and r.skip_reasons == {"empty box mask": 1}
    assert tr.identity_options()["excluded_boxes"] == ["0422859"]
    te = AircraftDataset(AIR, "test")
    assert te.bad_boxes == {} and "known_bad_box" not in te.skipped and "excluded_boxes" not in te.identity_options()


@need_cars
def test_tiny_cars_crops_through_the_train_transform():
    tr = CarsDataset(CARS, "train")
    sides = []
    for i, p in enumerate(tr.paths):
        with Image.open(p) as im:
            sides.append((min(im.size), i))
    tiny = [i for side, i in sorted(sides) if side < 64]
    assert len(tiny) == 42 and sorted(sides)[0][0] == 35       # the smallest crop is 88 x 35 px
    for seed in (0, 1, 2):
        tr.transform = TrainTransform(224, seed=seed)
        batch = collate_samples([tr[i] for i in tiny])
        assert batch.images.shape == (42, 3, 224, 224) and bool(torch.isfinite(batch.images).all())
        assert bool(((batch.boxes >= 0) & (batch.boxes <= 224)).all()) and bool(batch.box_mask.any(1).all())
        # box crops: the box is the whole crop, so box coverage skips every one (no division by zero)
        r = box_coverage(batch.box_mask.clone(), batch.box_mask)
        assert r.n_used == 0 and math.isnan(r.mean) and r.n_skipped == 42


@need_cars
def test_quick_caps_cars_training_photos_per_class_and_leaves_the_test_split_whole():
    """quick's ``max_images_per_class = {"cars": 12}``: the first 12 training photos of each class
    in file order (counted here from the unfiltered reader), the whole test split, and a data
    identity of its own (so no cache or cell of the full split is reused)."""
    from midas_nb.study import StudyBase

    full = CarsDataset(CARS, "train")
    st = StudyBase("quick", dataset="cars", data_roots={"cars": str(CARS)}, progress=False)
    seen: dict[int, int] = {}
    expected = []
    for i, label in enumerate(int(v) for v in full.labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] <= 12:
            expected.append(full.image_ids[i])
    assert len(expected) == 94 * 12 == len(st.train_set)
    assert list(st.train_set.image_ids) == expected
    assert len(st.test_set) == len(CarsDataset(CARS, "test")) == 144
    uncapped = StudyBase("quick", dataset="cars", data_roots={"cars": str(CARS)}, max_images_per_class={},
                         progress=False)
    assert len(uncapped.train_set) == len(full) == 3948
    assert dataset_identity(st.train_set).full != dataset_identity(uncapped.train_set).full
    assert dataset_identity(st.test_set).full == dataset_identity(uncapped.test_set).full
