"""Format-true FGVC-Aircraft and Stanford Cars directories built from CUB-200-2011 photos.

The paper's datasets are large downloads; a rehearsal of the paper run (and the tests of the
readers) needs directories in *their exact on-disk layouts* that a loader cannot tell apart
from the originals. These builders take a CUB-200-2011 copy (``../shared/data/cub200_subset``
or the original) and write:

- :func:`make_aircraft_from_cub` — the ``fgvc-aircraft-2013b`` layout (Maji et al. 2013,
  arXiv:1306.5151): ``data/images/<7-digit id>.jpg`` with a 20-px copyright banner added at
  the bottom, ``data/images_box.txt`` (``<id> xmin ymin xmax ymax``, 1-based inclusive pixel
  coordinates of the photo without the banner), ``data/images_{variant,family,manufacturer}_
  {train,val,trainval,test}.txt`` (``<id> <class name with spaces>``), ``data/variants.txt``,
  ``families.txt``, ``manufacturers.txt``.
- :func:`make_cars_from_cub` — the Stanford Cars layout (Krause et al. 2013):
  ``devkit/cars_meta.mat`` (``class_names`` ``[1, C]``), ``devkit/cars_train_annos.mat`` and
  ``devkit/cars_test_annos.mat`` (``annotations`` ``[1, M]`` structs with ``bbox_x1``,
  ``bbox_y1``, ``bbox_x2``, ``bbox_y2`` [, ``class``], ``fname``; MATLAB scalars stored as
  ``uint8``/``uint16`` ``[1, 1]`` arrays, file names as strings, exactly the field layout of
  the real devkit), ``devkit/cars_test_annos_withlabels.mat`` (the labelled test file released
  later), ``cars_train/<5-digit>.jpg`` and ``cars_test/<5-digit>.jpg``.

Each CUB class becomes one class (its name replaced by a real aircraft variant / car model
name), each CUB object box the aircraft / car box (rounded outwards to whole pixels, 1-based
inclusive). Deterministic: the same arguments write byte-identical annotation files.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Sequence

import numpy as np
from PIL import Image

from ._common import DatasetError, PathLike
from .aircraft import AIRCRAFT_CLASS_LISTS, AIRCRAFT_SPLITS
from .cub import read_cub_annotations

__all__ = ["make_aircraft_from_cub", "make_cars_from_cub", "AIRCRAFT_NAMES", "CARS_NAMES"]

#: (variant, family, manufacturer) of real FGVC-Aircraft classes, multi-word names first
AIRCRAFT_NAMES: tuple[tuple[str, str, str], ...] = (("Cessna 172", "Cessna 172", "Cessna"),
    ("Falcon 2000", "Falcon 2000", "Dassault Aviation"), ("Gulfstream IV", "Gulfstream", "Gulfstream Aerospace"),
    ("Boeing 717", "Boeing 717", "Boeing"), ("707-320", "Boeing 707", "Boeing"), ("A320", "A320", "Airbus"),
    ("Saab 340", "Saab 340", "Saab"), ("Model B200", "King Air", "Beechcraft"),
    ("DC-9-30", "DC-9", "McDonnell Douglas"), ("Global Express", "Global Express", "Bombardier Aerospace"),
    ("Hawk T1", "Hawk T1", "British Aerospace"), ("Yak-42", "Yak-42", "Yakovlev"))

#: real Stanford Cars class names (cars_meta.mat order)
CARS_NAMES: tuple[str, ...] = ("AM General Hummer SUV 2000", "Acura RL Sedan 2012", "Acura TL Sedan 2012",
    "Acura TL Type-S 2008", "Acura TSX Sedan 2012", "Acura Integra Type R 2001", "Acura ZDX Hatchback 2012",
    "Aston Martin V8 Vantage Convertible 2012", "Aston Martin V8 Vantage Coupe 2012",
    "Aston Martin Virage Convertible 2012", "Aston Martin Virage Coupe 2012", "Audi RS 4 Convertible 2008")

_BANNER_PX = 20


def _pick(cub_root: PathLike, num_classes: int, per_split: dict[str, int], max_classes: int
          ) -> list[list[tuple[str, Path, np.ndarray]]]:
    """Per class, ``(split, image path, box x0 y0 x1 y1)`` of the first ``sum(per_split)`` images (id order)
    of each of the first ``num_classes`` classes of a CUB copy, ``per_split[s]`` of them in split ``s``."""
    if num_classes > max_classes:
        raise ValueError(f"num_classes must be <= {max_classes}, got {num_classes}")
    per_class = list(per_split.values())
    if num_classes < 1:
        raise ValueError(f"num_classes must be >= 1, got {num_classes}")
    if any(int(k) < 1 for k in per_class):
        raise ValueError(f"every split needs at least one image per class, got {list(per_class)}")
    ann = read_cub_annotations(cub_root)
    root = Path(cub_root)
    need = int(sum(per_class))
    classes = sorted(set(int(c) for c in ann.labels))
    if len(classes) < num_classes:
        raise DatasetError(f"{root}: {len(classes)} classes, {num_classes} requested")
    order = [s for s, k in per_split.items() for _ in range(k)]
    picked = []
    for c in classes[:num_classes]:
        rows = np.nonzero(ann.labels == c)[0][:need]
        if len(rows) < need:
            raise DatasetError(f"{root}: class {c} has {len(rows)} images, {need} requested")
        picked.append([(s, root / "images" / ann.rel_paths[r], ann.boxes[r]) for s, r in zip(order, rows)])
    return picked


def _inclusive_box(box: np.ndarray, w: int, h: int) -> tuple[int, int, int, int]:
    """Continuous (x0, y0, x1, y1) → 1-based inclusive integer pixels covering it, inside w × h."""
    x0, y0, x1, y1 = (float(v) for v in box)
    xmin = min(max(1, math.floor(x0) + 1), w)
    ymin = min(max(1, math.floor(y0) + 1), h)
    xmax = max(xmin, min(w, math.ceil(x1)))
    ymax = max(ymin, min(h, math.ceil(y1)))
    return xmin, ymin, xmax, ymax


def _write_lines(path: Path, lines: Sequence[str]) -> None:
    path.write_text("".join(f"{ln}\n" for ln in lines), encoding="utf-8")


def make_aircraft_from_cub(cub_root: PathLike, out: PathLike, *, num_classes: int = 4,
                           per_split: tuple[int, int, int] = (2, 1, 2), banner_height: int = _BANNER_PX) -> Path:
    """Write an FGVC-Aircraft 2013b directory (``out/data/...``) from CUB photos; returns ``out``.

    Args:
        cub_root: a CUB-200-2011 directory (original layout).
        out: the ``fgvc-aircraft-2013b`` directory to create (its ``data/`` holds the files).
        num_classes: variants (one per CUB class, at most ``len(AIRCRAFT_NAMES)``).
        per_split: images per class in ``train``, ``val``, ``test`` (``trainval`` = both first).
        banner_height: the bottom banner in pixels (20 in the real photos), drawn below the photo.

    Raises:
        ValueError: ``num_classes`` beyond the name list, or a split with no image.
        DatasetError: the CUB copy has too few classes or images.
    """
    picked = _pick(cub_root, num_classes, dict(zip(("train", "val", "test"), per_split)), len(AIRCRAFT_NAMES))
    data = Path(out) / "data"
    (data / "images").mkdir(parents=True, exist_ok=True)
    names = AIRCRAFT_NAMES[:num_classes]
    splits: dict[str, list[tuple[str, int]]] = {"train": [], "val": [], "test": []}
    box_lines = []
    serial = 0
    for c, items in enumerate(picked):
        for split, src, box in items:
            # 7-digit ids with leading zeros, as in the release (e.g. 0056978), plus some >= 1000000
            image_id = f"{(56978 + 7919 * serial) if serial % 3 else (1025794 + 131 * serial):07d}"
            serial += 1
            with Image.open(src) as im:
                photo = im.convert("RGB")
            w, h = photo.size
            canvas = Image.new("RGB", (w, h + banner_height), (24, 24, 24))
            canvas.paste(photo, (0, 0))
            # the banner carries light "text" strokes, as the copyright line of the real photos
            stroke = Image.new("RGB", (max(1, w // 3), max(1, banner_height // 4)), (220, 220, 220))
            canvas.paste(stroke, (4, h + banner_height // 3))
            canvas.save(data / "images" / f"{image_id}.jpg", format="JPEG", quality=90)
            xmin, ymin, xmax, ymax = _inclusive_box(box, w, h)
            box_lines.append(f"{image_id} {xmin} {ymin} {xmax} {ymax}")
            splits[split].append((image_id, c))
    splits["trainval"] = sorted(splits["train"] + splits["val"], key=lambda r: r[0])
    _write_lines(data / "images_box.txt", sorted(box_lines))
    for col, (level, listing) in enumerate(AIRCRAFT_CLASS_LISTS.items()):
        for split in AIRCRAFT_SPLITS:
            _write_lines(data / f"images_{level}_{split}.txt",
                         [f"{i} {names[c][col]}" for i, c in sorted(splits[split])])
        _write_lines(data / listing, list(dict.fromkeys(n[col] for n in names)))
    return Path(out)


def _mat_scalar(v: int) -> np.ndarray:
    """A MATLAB scalar as the devkit stores it: the smallest unsigned type, shape [1, 1]."""
    return np.array([[v]], dtype=np.uint8 if 0 <= v < 256 else np.uint16)


def _annotations(rows: list[tuple[tuple[int, int, int, int], int, str]], with_class: bool) -> np.ndarray:
    fields = ["bbox_x1", "bbox_y1", "bbox_x2", "bbox_y2"] + (["class"] if with_class else []) + ["fname"]
    ann = np.empty((1, len(rows)), dtype=[(f, "O") for f in fields])
    for j, ((x1, y1, x2, y2), cls, fname) in enumerate(rows):
        for f, v in zip(fields[:4], (x1, y1, x2, y2)):
            ann[f][0, j] = _mat_scalar(v)
        if with_class:
            ann["class"][0, j] = _mat_scalar(cls)
        ann["fname"][0, j] = np.array([fname])
    return ann


def make_cars_from_cub(cub_root: PathLike, out: PathLike, *, num_classes: int = 4,
                       per_split: tuple[int, int] = (3, 2)) -> Path:
    """Write a Stanford Cars directory (``devkit/*.mat``, ``cars_train/``, ``cars_test/``) from CUB
    photos; returns ``out``.

    Args:
        cub_root: a CUB-200-2011 directory (original layout).
        out: the directory to create.
        num_classes: car models (one per CUB class, at most ``len(CARS_NAMES)``).
        per_split: images per class in ``train`` and ``test``.

    Raises:
        ValueError: ``num_classes`` beyond the name list, or a split with no image.
        DatasetError: the CUB copy has too few classes or images.
    """
    import scipy.io

    picked = _pick(cub_root, num_classes, dict(zip(("train", "test"), per_split)), len(CARS_NAMES))
    out = Path(out)
    devkit = out / "devkit"
    devkit.mkdir(parents=True, exist_ok=True)
    rows: dict[str, list] = {"train": [], "test": []}
    for c, items in enumerate(picked):
        for split, src, box in items:
            rows[split].append((src, box, c + 1))
    for split in ("train", "test"):
        folder = out / f"cars_{split}"
        folder.mkdir(exist_ok=True)
        ann_rows = []
        # the devkit interleaves classes: sort by a fixed shuffle, then number 00001, 00002, ...
        order = np.random.default_rng(0 if split == "train" else 1).permutation(len(rows[split]))
        for k, j in enumerate(order, 1):
            src, box, cls = rows[split][j]
            fname = f"{k:05d}.jpg"
            with Image.open(src) as im:
                photo = im.convert("RGB")
            photo.save(folder / fname, format="JPEG", quality=90)
            ann_rows.append((_inclusive_box(box, *photo.size), cls, fname))
        scipy.io.savemat(devkit / f"cars_{split}_annos.mat", {"annotations": _annotations(ann_rows, split == "train")})
        if split == "test":
            scipy.io.savemat(devkit / "cars_test_annos_withlabels.mat", {"annotations": _annotations(ann_rows, True)})
    names = np.empty((1, num_classes), dtype=object)
    for c in range(num_classes):
        names[0, c] = np.array([CARS_NAMES[c]])
    scipy.io.savemat(devkit / "cars_meta.mat", {"class_names": names})
    return out
