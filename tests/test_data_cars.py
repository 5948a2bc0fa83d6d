"""Stanford Cars reader (Krause et al. 2013) on the real devkit .mat files in ../shared/data,
with stand-in images written to tmp_path (the shared copy has no images)."""

import shutil
from pathlib import Path

import numpy as np
import pytest
import scipy.io
from PIL import Image

from midas_nb.data import CarsDataset, DatasetError, EvalTransform, read_cars_annotations, read_cars_meta

SHARED = Path(__file__).resolve().parents[2] / "shared" / "data"
DEVKIT = SHARED / "real_annotations" / "stanford_cars_devkit"
pytestmark = [pytest.mark.real_data,
              pytest.mark.skipif(not (DEVKIT / "cars_meta.mat").is_file(),
                                 reason=f"real Stanford Cars devkit not found at {DEVKIT} (../shared/data absent)")]


def _stand_in(path, w, h):
    Image.new("RGB", (w, h), (90, 120, 150)).save(path, format="JPEG")


def test_mat_parsing_real_values():
    names = read_cars_meta(DEVKIT / "cars_meta.mat")
    assert len(names) == 196 and names[0] == "AM General Hummer SUV 2000" and names[1] == "Acura RL Sedan 2012"
    tr = read_cars_annotations(DEVKIT / "cars_train_annos.mat")
    assert len(tr["fname"]) == 8144 and tr["boxes"].shape == (8144, 4)
    assert tr["fname"][0] == "00001.jpg" and tr["boxes"][0].tolist() == [39, 116, 569, 375]
    assert tr["classes"][:2].tolist() == [14, 3] and tr["classes"].min() == 1 and tr["classes"].max() == 196
    # uint8/uint16 fields in the file must not overflow: some x2 exceed 255
    assert tr["boxes"][:, 2].max() > 255
    te = read_cars_annotations(DEVKIT / "cars_test_annos.mat")
    assert len(te["fname"]) == 8041 and te["classes"] is None


@pytest.fixture
def cars_root(tmp_path):
    root = tmp_path / "cars"
    (root / "devkit").mkdir(parents=True)
    for f in ("cars_meta.mat", "cars_train_annos.mat", "cars_test_annos.mat"):
        shutil.copy(DEVKIT / f, root / "devkit" / f)
    (root / "cars_train").mkdir()
    (root / "cars_test").mkdir()
    _stand_in(root / "cars_train" / "00001.jpg", 600, 400)    # box 39 116 569 375
    _stand_in(root / "cars_train" / "00002.jpg", 900, 600)    # box 36 116 868 587
    _stand_in(root / "cars_test" / "00001.jpg", 260, 160)     # box 30 52 246 147
    return root


def test_dataset_with_stand_in_images(cars_root):
    ds = CarsDataset(cars_root, "train", EvalTransform(64), ids=["00001", "00002"])
    assert len(ds) == 2 and ds.num_classes == 196 and not ds.has_parts and ds.has_labels
    assert ds.labels == [13, 2] and ds.label_map[14] == 13
    assert ds.raw_boxes[0].tolist() == [38.0, 115.0, 569.0, 375.0]   # 1-based inclusive -> continuous
    s = ds[0]
    assert s.image_id == "00001" and s.parts.shape == (0, 3) and not s.part_mask.any() and s.box_mask.any()


def test_test_split_without_and_with_labels(cars_root, tmp_path):
    ds = CarsDataset(cars_root, "test", EvalTransform(32), ids=["00001"])
    assert not ds.has_labels and ds.labels == [-1] and ds[0].label == -1
    # a labelled test file (as released later): same fields plus class
    a = scipy.io.loadmat(DEVKIT / "cars_test_annos.mat")["annotations"][:, :5]   # first 5 rows suffice
    dt = a.dtype.descr + [("class", "O")]
    lab = np.empty(a.shape, dtype=[(n, "O") for n, _ in dt])
    for n in a.dtype.names:
        lab[n] = a[n]
    for j in range(a.shape[1]):
        lab["class"][0, j] = np.array([[1 + j % 196]], dtype=np.uint8)
    scipy.io.savemat(cars_root / "devkit" / "cars_test_annos_withlabels.mat", {"annotations": lab})
    ds = CarsDataset(cars_root, "test", EvalTransform(32), ids=["00001"])
    assert ds.has_labels and ds.labels == [0] and ds.annotation_file.name == "cars_test_annos_withlabels.mat"


def test_devkit_files_directly_in_root(tmp_path):
    # the shared layout: .mat files in the root, images elsewhere
    imgs = tmp_path / "imgs"
    imgs.mkdir()
    _stand_in(imgs / "00001.jpg", 600, 400)
    ds = CarsDataset(DEVKIT, "train", EvalTransform(32), images_dir=imgs, ids=["00001"])
    assert len(ds) == 1 and ds.devkit == DEVKIT


def test_bad_inputs(cars_root, tmp_path):
    with pytest.raises(DatasetError, match="missing: .*00003.jpg"):
        CarsDataset(cars_root, "train", ids=["00001", "00003"])
    with pytest.raises(DatasetError, match="are missing"):
        CarsDataset(cars_root, "train")   # 8,144 listed, 2 present
    bad = tmp_path / "bad.mat"
    bad.write_bytes(b"not a mat file at all")
    with pytest.raises(DatasetError, match=r"cannot read .*bad\.mat"):
        read_cars_annotations(bad)
    scipy.io.savemat(tmp_path / "nofields.mat", {"annotations": np.zeros((1, 3))})
    with pytest.raises(DatasetError, match="lack the field 'bbox_x1'"):
        read_cars_annotations(tmp_path / "nofields.mat")
    (cars_root / "devkit" / "cars_meta.mat").unlink()
    with pytest.raises(DatasetError, match=r"missing annotation file .*cars_meta\.mat"):
        CarsDataset(cars_root, "train")
    with pytest.raises(ValueError, match="split"):
        CarsDataset(cars_root, "val")
