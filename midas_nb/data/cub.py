"""CUB-200-2011 reader (Wah, Branson, Welinder, Perona, Belongie: *The Caltech-UCSD
Birds-200-2011 Dataset*, CNS-TR-2011-001, 2011).

Reads the original on-disk layout::

    root/images.txt               <image_id> <relative path>
    root/image_class_labels.txt   <image_id> <class_id 1..200>
    root/train_test_split.txt     <image_id> <1 = train, 0 = test>
    root/classes.txt              <class_id> <name>
    root/bounding_boxes.txt       <image_id> <x> <y> <width> <height>     (pixels)
    root/parts/parts.txt          <part_id> <name with spaces>
    root/parts/part_locs.txt      <image_id> <part_id> <x> <y> <visible>  (pixels)
    root/images/<relative path>

Copies holding only some images are accepted: image ids need not be contiguous
and the labels present may be any subset of 1..200. Labels are remapped to
contiguous indices in sorted original-label order over *all* images listed in
``images.txt`` (so every split of one root shares the mapping); ``label_map``
keeps original -> contiguous and ``classes`` the names from ``classes.txt``.

Boxes ``x y w h`` become ``(x, y, x + w, y + h)``; keypoints are taken as given
(continuous pixel coordinates). Rows with ``visible = 0`` become ``(0, 0, 0)``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable, Sequence

import numpy as np

from ._common import AnnotatedDataset, DatasetError, PathLike, read_lines, require_root, select_items

__all__ = ["CUBDataset", "CUB_PART_NAMES", "CUB_FILES"]

#: The 15 CUB part names in CUB's order (``parts/parts.txt``).
CUB_PART_NAMES: tuple[str, ...] = ("back", "beak", "belly", "breast", "crown", "forehead", "left eye", "left leg",
                                   "left wing", "nape", "right eye", "right leg", "right wing", "tail", "throat")

#: Annotation files of the CUB layout, relative to the root.
CUB_FILES: tuple[str, ...] = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "classes.txt",
                              "bounding_boxes.txt", "parts/parts.txt", "parts/part_locs.txt")

_LAYOUT = ("a CUB-200-2011 directory with " + ", ".join(CUB_FILES) + " and images/")


@dataclass(frozen=True)
class _CubAnnotations:
    ids: np.ndarray                 # [M] int64, sorted
    rel_paths: tuple[str, ...]      # [M]
    labels: np.ndarray              # [M] original class ids
    is_train: np.ndarray            # [M] bool
    boxes: np.ndarray               # [M, 4] x0 y0 x1 y1
    parts: np.ndarray               # [M, P, 3]
    part_names: tuple[str, ...]
    class_names: dict               # original id -> name


def _int(tok: str, where: str, field: str) -> int:
    try:
        return int(tok)
    except ValueError:
        raise DatasetError(f"{where}: field '{field}' should be an integer, got {tok!r}") from None


def _float(tok: str, where: str, field: str) -> float:
    try:
        v = float(tok)
    except ValueError:
        v = float("nan")
    if not np.isfinite(v):
        raise DatasetError(f"{where}: field '{field}' should be a finite number, got {tok!r}")
    return v


def _id_table(path: Path, fields: Sequence[str], what: str) -> dict[int, list[str]]:
    """``<id> <f1> ... <fn>`` (the last field may contain spaces) -> {id: [fields]}."""
    out: dict[int, list[str]] = {}
    n = len(fields)
    for lineno, line in read_lines(path, what):
        toks = line.split(maxsplit=n)
        if len(toks) != n + 1:
            raise DatasetError(f"{path}:{lineno}: expected {n + 1} fields (id {' '.join(fields)}), got {line!r}")
        key = _int(toks[0], f"{path}:{lineno}", "id")
        if key in out:
            raise DatasetError(f"{path}:{lineno}: id {key} listed twice")
        out[key] = toks[1:]
    return out


def _missing(path: Path, ids: np.ndarray, table: dict) -> None:
    miss = [int(i) for i in ids if int(i) not in table]
    if miss:
        raise DatasetError(f"{path}: no row for {len(miss)} image id(s) listed in images.txt, "
                           f"e.g. {miss[:5]}; expected one row per image")


def _parse_part_locs(path: Path, num_parts: int, index_of: dict[int, int], m: int) -> np.ndarray:
    if not path.is_file():
        raise DatasetError(f"missing annotation file {path}; expected {_LAYOUT}")
    text = path.read_text(encoding="utf-8")
    try:
        arr = np.array(text.split(), dtype=np.float64)
        ok = arr.size % 5 == 0
    except ValueError:
        ok = False
    if not ok:  # find the offending line for the message
        for lineno, line in enumerate(text.splitlines(), 1):
            toks = line.split()
            if not toks:
                continue
            if len(toks) != 5:
                raise DatasetError(f"{path}:{lineno}: expected 5 fields (image_id part_id x y visible), "
                                   f"got {line.strip()!r}")
            for t, f in zip(toks, ("image_id", "part_id", "x", "y", "visible")):
                _float(t, f"{path}:{lineno}", f)
        raise DatasetError(f"{path}: malformed (expected rows of 5 numbers)")
    arr = arr.reshape(-1, 5)
    parts = np.zeros((m, num_parts, 3), np.float32)
    if arr.size == 0:
        return parts
    bad = ~np.isfinite(arr).all(axis=1)
    pid = arr[:, 1]
    bad |= (pid != np.round(pid)) | (pid < 1) | (pid > num_parts)
    bad |= ~np.isin(arr[:, 4], (0, 1))
    if bad.any():
        r = int(np.nonzero(bad)[0][0])
        raise DatasetError(f"{path}: row {r + 1} {arr[r].tolist()} is invalid; expected part_id in "
                           f"1..{num_parts} (parts/parts.txt) and visible in {{0, 1}}")
    img = arr[:, 0].astype(np.int64)
    rows = np.array([index_of.get(int(i), -1) for i in img], dtype=np.int64)
    keep = rows >= 0  # rows for images not listed in images.txt are ignored
    rows, arr = rows[keep], arr[keep]
    vis = arr[:, 4] > 0
    vals = np.stack([arr[:, 2] * vis, arr[:, 3] * vis, vis.astype(np.float64)], axis=1)
    parts[rows, arr[:, 1].astype(np.int64) - 1] = vals.astype(np.float32)
    return parts


def _stamp(root: Path) -> tuple:
    out = []
    for f in CUB_FILES:
        try:
            st = os.stat(root / f)
            out.append((st.st_mtime_ns, st.st_size))
        except OSError:
            out.append(None)
    return tuple(out)


@lru_cache(maxsize=8)
def _read_cub_cached(root: str, stamp: tuple) -> _CubAnnotations:
    return _read_cub(Path(root))


def _read_cub(root: Path) -> _CubAnnotations:
    images = _id_table(root / "images.txt", ["path"], _LAYOUT)
    if not images:
        raise DatasetError(f"{root / 'images.txt'} lists no images; expected '<image_id> <path>' rows")
    ids = np.array(sorted(images), dtype=np.int64)
    index_of = {int(i): k for k, i in enumerate(ids)}

    lab_path = root / "image_class_labels.txt"
    lab = _id_table(lab_path, ["class_id"], _LAYOUT)
    _missing(lab_path, ids, lab)
    labels = np.array([_int(lab[int(i)][0], f"{lab_path}: image {int(i)}", "class_id") for i in ids], np.int64)

    split_path = root / "train_test_split.txt"
    spl = _id_table(split_path, ["is_training_image"], _LAYOUT)
    _missing(split_path, ids, spl)
    is_train = []
    for i in ids:
        v = spl[int(i)][0]
        if v not in ("0", "1"):
            raise DatasetError(f"{split_path}: image {int(i)} has is_training_image={v!r}; expected 0 or 1")
        is_train.append(v == "1")

    cls_path = root / "classes.txt"
    cls = _id_table(cls_path, ["name"], _LAYOUT)
    class_names = {k: v[0] for k, v in cls.items()}
    if unknown := sorted(set(labels.tolist()) - set(class_names)):
        raise DatasetError(f"{lab_path}: class id(s) {unknown[:5]} are not listed in {cls_path}; "
                           "expected every label to have a name")

    box_path = root / "bounding_boxes.txt"
    bb = _id_table(box_path, ["x", "y", "width", "height"], _LAYOUT)
    _missing(box_path, ids, bb)
    boxes = np.zeros((len(ids), 4), np.float32)
    for k, i in enumerate(ids):
        x, y, w, h = (_float(t, f"{box_path}: image {int(i)}", f)
                      for t, f in zip(bb[int(i)], ("x", "y", "width", "height")))
        if w < 0 or h < 0:
            raise DatasetError(f"{box_path}: image {int(i)} has a negative box size (w={w}, h={h}); "
                               "expected x y width height with width, height >= 0")
        boxes[k] = (x, y, x + w, y + h)

    pn_path = root / "parts" / "parts.txt"
    pn = _id_table(pn_path, ["name"], _LAYOUT)
    if sorted(pn) != list(range(1, len(pn) + 1)):
        raise DatasetError(f"{pn_path}: part ids {sorted(pn)} are not 1..{len(pn)}")
    part_names = tuple(pn[k][0] for k in range(1, len(pn) + 1))
    parts = _parse_part_locs(root / "parts" / "part_locs.txt", len(part_names), index_of, len(ids))
    return _CubAnnotations(ids=ids, rel_paths=tuple(images[int(i)][0] for i in ids), labels=labels,
                           is_train=np.array(is_train, bool), boxes=boxes, parts=parts,
                           part_names=part_names, class_names=class_names)


def read_cub_annotations(root: PathLike) -> _CubAnnotations:
    """Parse (and cache, keyed by the files' mtimes and sizes) the annotation files
    of a CUB-layout root. Raises :class:`DatasetError` on missing/malformed files."""
    r = require_root(root, _LAYOUT).resolve()
    return _read_cub_cached(str(r), _stamp(r))


class CUBDataset(AnnotatedDataset):
    """CUB-200-2011 (Wah et al. 2011), or any directory in its layout (e.g. the one
    :func:`~midas_nb.data.make_synthetic_cub` writes).

    Args:
        root: directory holding ``images.txt`` ... and ``images/``.
        split: ``"train"``, ``"test"`` or ``"all"`` (``train_test_split.txt``).
        transform: joint transform (default :class:`EvalTransform` at 224 px).
        patch_size: patch side in pixels for ``part_mask`` / ``box_mask``.
        max_images_per_class: keep only the first ``k`` images of each class (by
            image id) of the split — a small deterministic subset.
        ids: keep only these image ids (``int`` or ``str``).
        check_files: check at construction that every selected image file exists
            (one directory listing per class folder, cheap).

    Attributes (besides :class:`AnnotatedDataset`'s): ``root``, ``split``,
    ``original_labels`` (per item, 1..200), ``label_map`` (original -> contiguous),
    ``skipped["no_visible_part"]`` (images of the selection whose annotation has no
    visible part: kept, their ``part_mask`` is all False).

    Raises:
        DatasetError: missing root or annotation file, malformed row (file and line
            named), an image listed but absent, an empty selection. Reading a
            corrupt image raises it from ``__getitem__``, naming the file.
        ValueError: ``split`` not one of the three names.
    """

    dataset_name = "cub"

    def __init__(self, root: PathLike, split: str = "train", transform: Callable | None = None, *,
                 patch_size: int = 16, max_images_per_class: int | None = None,
                 ids: Sequence[int | str] | None = None, check_files: bool = True) -> None:
        super().__init__(transform, patch_size)
        if split not in ("train", "test", "all"):
            raise ValueError(f"split must be 'train', 'test' or 'all', got {split!r}")
        self.root = require_root(root, _LAYOUT)
        self.split = split
        ann = read_cub_annotations(self.root)

        present = sorted(set(ann.labels.tolist()))
        self.label_map = {int(o): k for k, o in enumerate(present)}
        self.classes = [ann.class_names[o] for o in present]
        self.part_names = list(ann.part_names)

        pos = np.arange(len(ann.ids)) if split == "all" else np.nonzero(ann.is_train == (split == "train"))[0]
        n_split, self.listing = len(pos), self.root / "images.txt"
        pos = np.array(select_items(pos.tolist(), ann.labels.tolist(), max_images_per_class, keys=ann.ids.tolist(),
                                    ids=ids, listing=self.listing), np.int64)
        if len(pos) == 0:
            n_tr = int(ann.is_train.sum())
            raise DatasetError(f"{self.root / 'train_test_split.txt'}: split {split!r} selects no images "
                               f"({n_tr} train / {len(ann.ids) - n_tr} test listed; {n_split} in the split before "
                               f"the ids/max_images_per_class filters); expected at least one image")

        self.paths = [self.root / "images" / ann.rel_paths[p] for p in pos]
        self.image_ids = [str(int(ann.ids[p])) for p in pos]
        self.original_labels = [int(ann.labels[p]) for p in pos]
        self.labels = [self.label_map[o] for o in self.original_labels]
        self.raw_boxes = ann.boxes[pos].copy()
        self.raw_parts = ann.parts[pos].copy()
        if no_vis := int((~(self.raw_parts[:, :, 2] > 0).any(axis=1)).sum()):
            self.skipped["no_visible_part"] = no_vis
        self._finish(check_files)
