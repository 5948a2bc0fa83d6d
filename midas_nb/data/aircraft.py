"""FGVC-Aircraft reader (Maji, Kannala, Rahtu, Blaschko, Vedaldi: *Fine-Grained
Visual Classification of Aircraft*, arXiv:1306.5151, 2013).

Reads the ``fgvc-aircraft-2013b/data`` layout (``root`` may be that ``data``
directory or its parent)::

    images_box.txt                         <id> <xmin> <ymin> <xmax> <ymax>
    images_{variant,family,manufacturer}_{train,val,trainval,test}.txt
                                           <id> <class name, may contain spaces>
    variants.txt / families.txt / manufacturers.txt   (optional class lists)
    images/<id>.jpg

Ids are kept as the strings of the files (7 digits with leading zeros, e.g.
``"0056978"``). Boxes are 1-based inclusive pixel coordinates in the original
(the top-left pixel is ``(1, 1)``); they become continuous coordinates
``(xmin - 1, ymin - 1, xmax, ymax)``. Every photo carries a 20-px copyright banner
at the bottom; ``crop_banner=True`` (default) removes it and clips the boxes.

The dataset has no part annotations: ``part_names`` is empty, ``parts`` is
``[0, 3]``, ``part_mask`` all False; downstream part metrics use the box
("box coverage", DESIGN.md §6).
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Sequence

import numpy as np
from PIL import Image

from ._common import AnnotatedDataset, DatasetError, PathLike, read_lines, require_root, select_items

__all__ = ["AircraftDataset", "AIRCRAFT_LEVELS", "AIRCRAFT_SPLITS", "AIRCRAFT_CLASS_LISTS"]

AIRCRAFT_LEVELS: tuple[str, ...] = ("variant", "family", "manufacturer")
AIRCRAFT_SPLITS: tuple[str, ...] = ("train", "val", "trainval", "test")
AIRCRAFT_CLASS_LISTS = {"variant": "variants.txt", "family": "families.txt", "manufacturer": "manufacturers.txt"}
_LAYOUT = ("an FGVC-Aircraft 'data' directory with images_box.txt, images_<level>_<split>.txt and images/<id>.jpg")


def _read_labels(path: Path) -> list[tuple[str, str]]:
    out: dict[str, str] = {}
    for lineno, line in read_lines(path, _LAYOUT):
        toks = line.split(maxsplit=1)
        if len(toks) != 2:
            raise DatasetError(f"{path}:{lineno}: expected '<image id> <class name>', got {line!r}")
        if toks[0] in out:
            raise DatasetError(f"{path}:{lineno}: image id {toks[0]} listed twice")
        out[toks[0]] = toks[1].strip()
    return list(out.items())


def _read_boxes(path: Path) -> dict[str, tuple[float, float, float, float]]:
    out = {}
    for lineno, line in read_lines(path, _LAYOUT):
        toks = line.split()
        if len(toks) != 5:
            raise DatasetError(f"{path}:{lineno}: expected 5 fields (id xmin ymin xmax ymax), got {line!r}")
        try:
            x0, y0, x1, y1 = (float(t) for t in toks[1:])
        except ValueError:
            raise DatasetError(f"{path}:{lineno}: box coordinates should be numbers, got {line!r}") from None
        if not (x1 >= x0 and y1 >= y0):
            raise DatasetError(f"{path}:{lineno}: expected xmin <= xmax and ymin <= ymax, got {line!r}")
        out[toks[0]] = (x0 - 1.0, y0 - 1.0, x1, y1)
    return out


class AircraftDataset(AnnotatedDataset):
    """FGVC-Aircraft (Maji et al. 2013).

    Args:
        root: the ``data`` directory (or ``fgvc-aircraft-2013b`` above it).
        split: ``"train"``, ``"val"``, ``"trainval"`` or ``"test"``.
        transform: joint transform (default :class:`EvalTransform` at 224 px).
        annotation_level: ``"variant"`` (100 classes in 2013b), ``"family"`` (70) or
            ``"manufacturer"`` (30); the profile key ``aircraft_level`` chooses it for a study.
            The head keeps the listed classes; ``classes_present`` names those with images.
        crop_banner: remove the bottom ``banner_height`` pixels (the copyright banner).
        banner_height: banner height in pixels (20 in the original photos).
        patch_size: patch side in pixels for ``box_mask``.
        images_dir: image folder (default ``root/images``).
        max_images_per_class: keep the first ``k`` images of each class (file order).
        ids: keep only these image ids (strings, leading zeros included).
        check_files: check at construction that every selected image exists.

    Classes: the order of ``variants.txt``/``families.txt``/``manufacturers.txt``
    when present, else the sorted union of the names in every
    ``images_<level>_<split>.txt`` of the root (so all splits share the mapping).
    ``label_map`` maps class name -> contiguous index.

    Raises:
        DatasetError: missing root or annotation file, malformed row, an image
            without a box, an image listed but absent, an empty selection, an image
            not taller than the banner (at load time), a corrupt image (at load time).
        ValueError: unknown ``split`` or ``annotation_level``.
    """

    dataset_name = "aircraft"

    def __init__(self, root: PathLike, split: str = "trainval", transform: Callable | None = None, *,
                 annotation_level: str = "variant", crop_banner: bool = True, banner_height: int = 20,
                 patch_size: int = 16, images_dir: PathLike | None = None, max_images_per_class: int | None = None,
                 ids: Sequence[str] | None = None, check_files: bool = True) -> None:
        super().__init__(transform, patch_size)
        if split not in AIRCRAFT_SPLITS:
            raise ValueError(f"split must be one of {AIRCRAFT_SPLITS}, got {split!r}")
        if annotation_level not in AIRCRAFT_LEVELS:
            raise ValueError(f"annotation_level must be one of {AIRCRAFT_LEVELS}, got {annotation_level!r}")
        root_p = require_root(root, _LAYOUT)
        if not (root_p / "images_box.txt").is_file() and (root_p / "data" / "images_box.txt").is_file():
            root_p = root_p / "data"
        self.root = root_p
        self.split = split
        self.annotation_level = annotation_level
        self.crop_banner = bool(crop_banner)
        self.banner_height = int(banner_height)
        self.images_dir = Path(images_dir) if images_dir is not None else root_p / "images"

        label_path = root_p / f"images_{annotation_level}_{split}.txt"
        rows = _read_labels(label_path)
        boxes = _read_boxes(root_p / "images_box.txt")

        list_path = root_p / AIRCRAFT_CLASS_LISTS[annotation_level]
        if list_path.is_file():
            names = [ln for _, ln in read_lines(list_path, _LAYOUT)]
        else:
            union = {n for _, n in rows}
            for s in AIRCRAFT_SPLITS:
                p = root_p / f"images_{annotation_level}_{s}.txt"
                if s != split and p.is_file():
                    union.update(n for _, n in _read_labels(p))
            names = sorted(union)
        self.classes = list(dict.fromkeys(names))
        self.label_map = {n: k for k, n in enumerate(self.classes)}
        if unknown := sorted({n for _, n in rows} - set(self.label_map)):
            raise DatasetError(f"{label_path}: class name(s) {unknown[:5]} are not listed in {list_path}")

        keep = select_items(range(len(rows)), [self.label_map[n] for _, n in rows], max_images_per_class,
                            keys=[i for i, _ in rows], ids=ids, listing=label_path)
        rows = [rows[i] for i in keep]
        if not rows:
            raise DatasetError(f"{label_path}: split {split!r} selects no images; expected at least one "
                               "'<image id> <class name>' row")
        no_box = [i for i, _ in rows if i not in boxes]
        if no_box:
            raise DatasetError(f"{root_p / 'images_box.txt'}: no box for {len(no_box)} image(s) listed in "
                               f"{label_path}, e.g. {no_box[:5]}; expected one box per image")

        self.listing = label_path
        self.image_ids = [i for i, _ in rows]
        self.class_name_of_item = [n for _, n in rows]
        self.labels = [self.label_map[n] for _, n in rows]
        self.paths = [self.images_dir / f"{i}.jpg" for i in self.image_ids]
        self.raw_boxes = np.array([boxes[i] for i in self.image_ids], np.float32).reshape(-1, 4)
        self.raw_parts = np.zeros((len(rows), 0, 3), np.float32)
        self.part_names = []
        self._finish(check_files)

    def identity_options(self) -> dict:
        """The banner crop changes every image a sample holds, the label level every label,
        a known-wrong box its box mask (dataset identity)."""
        return dict(super().identity_options(), crop_banner=self.crop_banner, banner_height=self.banner_height,
                    annotation_level=self.annotation_level)

    def _preprocess(self, index: int, image: Image.Image, parts: np.ndarray, box: np.ndarray
                    ) -> tuple[Image.Image, np.ndarray, np.ndarray]:
        if self.crop_banner and self.banner_height > 0:
            w, h = image.size
            if h <= self.banner_height:
                raise DatasetError(f"image {self.paths[index]} is "
                                   f"{h} px high; expected more than the {self.banner_height}-px banner")
            image = image.crop((0, 0, w, h - self.banner_height))
        return image, parts, box
