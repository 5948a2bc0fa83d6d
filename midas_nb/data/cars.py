"""Stanford Cars reader (Krause, Stark, Deng, Fei-Fei: *3D Object Representations
for Fine-Grained Categorization*, 3dRR workshop at ICCV 2013).

Reads the devkit ``.mat`` files with ``scipy.io.loadmat``::

    cars_meta.mat              class_names [1, 196]
    cars_train_annos.mat       annotations [1, 8144]: bbox_x1 bbox_y1 bbox_x2 bbox_y2 class fname
    cars_test_annos.mat        annotations [1, 8041]: bbox_x1 bbox_y1 bbox_x2 bbox_y2 fname (no class)
    cars_test_annos_withlabels.mat   (optional, released later) same fields with class
    ../cars_train/<fname>, ../cars_test/<fname>

Classes are 1-based in the files; the contiguous index is ``class - 1`` over all
196 names of ``cars_meta.mat`` (``label_map`` original -> contiguous). Boxes are
1-based inclusive pixel coordinates (MATLAB); they become continuous coordinates
``(x1 - 1, y1 - 1, x2, y2)``. The test split without a labelled file has labels
``-1`` (``has_labels`` False): usable for part/box metrics and predictions only.
Stanford Cars has no part annotations (``part_names`` empty, box coverage used).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np

from ._common import AnnotatedDataset, DatasetError, PathLike, require_root, select_items

__all__ = ["CarsDataset", "read_cars_meta", "read_cars_annotations"]

_LAYOUT = ("a Stanford Cars root with devkit/cars_meta.mat, devkit/cars_{train,test}_annos.mat "
           "and cars_train/, cars_test/ (or the devkit files directly in the root)")
_BOX_FIELDS = ("bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2")


def _loadmat(path: Path) -> dict[str, Any]:
    if not Path(path).is_file():
        raise DatasetError(f"missing annotation file {path}; expected {_LAYOUT}")
    try:
        from scipy.io import loadmat
    except ImportError as e:  # pragma: no cover
        raise DatasetError(f"reading {path} needs scipy (pip install scipy): {e}") from None
    try:
        return loadmat(str(path), squeeze_me=True)
    except Exception as e:  # scipy raises ValueError / MatReadError / OSError on bad files
        raise DatasetError(f"cannot read {path} as a MATLAB .mat file ({type(e).__name__}: {e})") from None


def read_cars_meta(path: PathLike) -> list[str]:
    """Class names (196 in the devkit) from ``cars_meta.mat``'s ``class_names``."""
    m = _loadmat(Path(path))
    if "class_names" not in m:
        raise DatasetError(f"{path}: no 'class_names' variable; expected the devkit's cars_meta.mat")
    return [str(n) for n in np.atleast_1d(m["class_names"]).tolist()]


def read_cars_annotations(path: PathLike) -> dict[str, Any]:
    """Parse ``cars_{train,test}_annos[_withlabels].mat``.

    Returns:
        ``{"fname": list[str], "boxes": float32 [M, 4] (x1, y1, x2, y2 as in the
        file, 1-based pixels), "classes": int64 [M] (1-based) or None when the file
        has no ``class`` field}``.

    Raises:
        DatasetError: file missing/unreadable, no ``annotations`` variable, or a
            missing field (named).
    """
    path = Path(path)
    m = _loadmat(path)
    if "annotations" not in m:
        raise DatasetError(f"{path}: no 'annotations' variable; expected a Stanford Cars annotation .mat")
    ann = np.atleast_1d(m["annotations"])
    names = ann.dtype.names or ()
    for f in (*_BOX_FIELDS, "fname"):
        if f not in names:
            raise DatasetError(f"{path}: annotations lack the field '{f}'; expected fields "
                               f"{', '.join(_BOX_FIELDS)}, [class,] fname")
    try:
        boxes = np.stack([np.asarray(ann[f], dtype=np.float64) for f in _BOX_FIELDS], axis=1)
        classes = np.asarray(ann["class"], dtype=np.int64) if "class" in names else None
    except (TypeError, ValueError) as e:
        raise DatasetError(f"{path}: non-numeric box/class values ({e})") from None
    fnames = [str(f) for f in ann["fname"].tolist()]
    return {"fname": fnames, "boxes": boxes.astype(np.float32), "classes": classes}


class CarsDataset(AnnotatedDataset):
    """Stanford Cars (Krause et al. 2013).

    Args:
        root: directory with ``devkit/`` (or the devkit files) and ``cars_train/``,
            ``cars_test/``.
        split: ``"train"`` or ``"test"``.
        transform: joint transform (default :class:`EvalTransform` at 224 px).
        patch_size: patch side in pixels for ``box_mask``.
        devkit: directory holding the ``.mat`` files (default ``root/devkit`` when it
            exists, else ``root``).
        images_dir: image folder (default ``root/cars_<split>``).
        test_annotations: a labelled test file; default
            ``cars_test_annos_withlabels.mat`` in the devkit or root when present,
            else the unlabelled ``cars_test_annos.mat`` (labels ``-1``).
        max_images_per_class: keep the first ``k`` images of each class (file order).
        ids: keep only these image ids (file name stems, e.g. ``"00001"``).
        check_files: check at construction that every selected image exists.

    Attributes: ``has_labels`` (False for the unlabelled test file),
    ``annotation_file``, ``label_map`` (1-based class -> contiguous).

    Raises:
        DatasetError: missing root/devkit file, malformed .mat, class out of range,
            image listed but absent, empty selection, corrupt image (at load time).
        ValueError: unknown ``split``.
    """

    dataset_name = "cars"

    def __init__(self, root: PathLike, split: str = "train", transform: Callable | None = None, *, patch_size: int = 16,
                 devkit: PathLike | None = None, images_dir: PathLike | None = None,
                 test_annotations: PathLike | None = None, max_images_per_class: int | None = None,
                 ids: Sequence[str] | None = None, check_files: bool = True) -> None:
        super().__init__(transform, patch_size)
        if split not in ("train", "test"):
            raise ValueError(f"split must be 'train' or 'test', got {split!r}")
        self.root = require_root(root, _LAYOUT)
        self.split = split
        if devkit is not None:
            dk = require_root(devkit, _LAYOUT)
        elif (self.root / "devkit" / "cars_meta.mat").is_file():
            dk = self.root / "devkit"
        else:
            dk = self.root
        self.devkit = dk
        self.images_dir = Path(images_dir) if images_dir is not None else self.root / f"cars_{split}"

        self.classes = read_cars_meta(dk / "cars_meta.mat")
        self.label_map = {k + 1: k for k in range(len(self.classes))}
        if split == "train":
            ann_path = dk / "cars_train_annos.mat"
        elif test_annotations is not None:
            ann_path = Path(test_annotations)
        else:
            cands = [dk / "cars_test_annos_withlabels.mat", self.root / "cars_test_annos_withlabels.mat"]
            ann_path = next((c for c in cands if c.is_file()), dk / "cars_test_annos.mat")
        self.annotation_file = ann_path
        ann = read_cars_annotations(ann_path)
        m = len(ann["fname"])
        self.has_labels = ann["classes"] is not None
        if self.has_labels:
            cls = ann["classes"]
            bad = np.nonzero((cls < 1) | (cls > len(self.classes)))[0]
            if len(bad):
                raise DatasetError(f"{ann_path}: annotation {int(bad[0]) + 1} has class {int(cls[bad[0]])}; "
                                   f"expected 1..{len(self.classes)} (cars_meta.mat)")
            labels_all = [int(c) - 1 for c in cls]
        else:
            labels_all = [-1] * m
        stems = [Path(f).stem for f in ann["fname"]]

        order = select_items(range(m), labels_all, max_images_per_class, keys=stems, ids=ids, listing=ann_path)
        if not order:
            raise DatasetError(f"{ann_path}: split {split!r} selects no images; expected at least one annotation")

        b = ann["boxes"][order]
        self.listing = ann_path
        self.raw_boxes = np.stack([b[:, 0] - 1, b[:, 1] - 1, b[:, 2], b[:, 3]], axis=1).astype(np.float32)
        self.raw_parts = np.zeros((len(order), 0, 3), np.float32)
        self.part_names = []
        self.image_ids = [stems[i] for i in order]
        self.labels = [labels_all[i] for i in order]
        self.paths = [self.images_dir / ann["fname"][i] for i in order]
        self._finish(check_files)
