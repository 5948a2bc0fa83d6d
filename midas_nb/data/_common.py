"""Shared machinery of the dataset readers: errors, annotation parsing, image
loading, the common ``Dataset`` base class."""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch
from PIL import Image
from torch.utils.data import Dataset

from .grid import box_mask_from_box, grid_shape, part_mask_from_keypoints
from .sample import Sample
from .transforms import EvalTransform

__all__ = ["DatasetError", "AnnotatedDataset", "read_lines", "require_root", "check_files_exist",
           "open_rgb", "select_items", "KNOWN_BAD_BOXES"]

PathLike = str | os.PathLike

#: Real boxes known to be wrong, ``{dataset_name: {image id: what is wrong}}``. These images stay in
#: their split for classification, but their ``box_mask`` is empty, so every box metric leaves them
#: out (box coverage counts them as skipped; ``AnnotatedDataset.bad_boxes`` and
#: ``skipped["known_bad_box"]`` report them). Checked by eye on the photo (docs/architecture.md, Data).
KNOWN_BAD_BOXES: dict[str, dict[str, str]] = {
    # FGVC-Aircraft 2013b (official train split): three C-47s in formation; the box lies in the
    # sky between them and covers none of the three
    "aircraft": {"0422859": "box lies between the three aircraft"},
}


class DatasetError(ValueError):
    """Bad dataset input. The message names the file (and line or field) and what
    was expected."""


def require_root(root: PathLike, what: str) -> Path:
    """Return ``root`` as a ``Path``; raise :class:`DatasetError` when it is not a
    directory."""
    p = Path(root).expanduser()
    if not p.is_dir():
        raise DatasetError(f"dataset root {p} does not exist or is not a directory; expected {what}")
    return p


def read_lines(path: Path, what: str) -> list[tuple[int, str]]:
    """Non-empty lines of an annotation file as ``(line_number, text)``.

    Raises:
        DatasetError: the file is missing or not UTF-8 text.
    """
    if not path.is_file():
        raise DatasetError(f"missing annotation file {path}; expected {what}")
    try:
        text = path.read_text(encoding="utf-8")
    except UnicodeDecodeError as e:
        raise DatasetError(f"{path}: not UTF-8 text ({e}); expected {what}") from None
    return [(i + 1, ln.strip()) for i, ln in enumerate(text.splitlines()) if ln.strip()]


def check_files_exist(paths: Sequence[Path], listing: Path | str, show: int = 5) -> None:
    """Raise :class:`DatasetError` naming the first ``show`` paths that do not exist.

    One ``os.listdir`` per directory, so checking thousands of files is cheap.
    """
    by_dir: dict[Path, set[str]] = {}
    for d in dict.fromkeys(p.parent for p in paths):
        try:
            by_dir[d] = set(os.listdir(d))
        except OSError:
            by_dir[d] = set()
    missing = [p for p in paths if p.name not in by_dir[p.parent]]
    if missing:
        shown = ", ".join(str(m) for m in missing[:show])
        more = f" (and {len(missing) - show} more)" if len(missing) > show else ""
        raise DatasetError(f"{len(missing)} image(s) listed in {listing} are missing: {shown}{more}; "
                           "expected every listed image file to exist (copy the missing files, or "
                           "point the dataset's root at a complete copy)")


def open_rgb(path: Path, listing: Path | str | None = None) -> Image.Image:
    """Open an image fully decoded and converted to RGB (grayscale, CMYK, palette,
    RGBA ... are converted).

    Raises:
        DatasetError: file missing, unreadable or corrupt (message names the file).
    """
    try:
        with Image.open(path) as im:
            im.load()
            return im.convert("RGB")
    except FileNotFoundError:
        where = f" listed in {listing}" if listing else ""
        raise DatasetError(f"image {path}{where} is missing; expected an image file there") from None
    except (OSError, SyntaxError, ValueError, Image.DecompressionBombError) as e:
        raise DatasetError(f"cannot read image {path} ({type(e).__name__}: {e}); "
                           "expected a readable image file (JPEG/PNG)") from None


def select_items(order: Sequence[int], labels: Sequence[int], k: int | None, keys: Sequence[Any] = (),
                 ids: Sequence[Any] | None = None, listing: Path | str = "") -> list[int]:
    """Positions of ``order`` whose key (``keys[i]``) is one of ``ids`` (all when ``ids`` is None; each id converted
    to the keys' type), then the first ``k`` items of each label, following ``order`` (all when ``k`` is None).

    Raises:
        DatasetError: an id of ``ids`` that ``keys`` does not hold (``listing`` named).
    """
    if ids is not None:
        wanted = {type(keys[0])(i) for i in ids} if len(keys) else set(ids)
        if unknown := sorted(wanted - set(keys)):
            raise DatasetError(f"{listing}: requested image id(s) {unknown[:5]} are not listed")
        order = [i for i in order if keys[i] in wanted]
    if k is None:
        return list(order)
    if k < 1:
        raise ValueError(f"max_images_per_class must be >= 1, got {k}")
    seen: Counter = Counter()
    keep = []
    for i in order:
        if seen[labels[i]] < k:
            seen[labels[i]] += 1
            keep.append(i)
    return keep


class AnnotatedDataset(Dataset):
    """Base class of :class:`CUBDataset`, :class:`AircraftDataset` and
    :class:`CarsDataset`: a ``torch.utils.data.Dataset`` of :class:`Sample`.

    Subclasses fill ``paths``, ``labels``, ``image_ids``, ``raw_parts`` ``[M, P, 3]``,
    ``raw_boxes`` ``[M, 4]`` (source pixels, ``x0 y0 x1 y1``), ``classes``,
    ``part_names``, ``label_map`` and ``listing`` (the file that lists the images).

    Attributes common to every dataset:
        classes / class_names: class names in contiguous-index order.
        num_classes: ``len(classes)``.
        part_names: part names (empty when the dataset has no parts).
        has_parts: ``len(part_names) > 0``.
        labels: contiguous class index per item (``-1`` when unknown).
        image_ids: dataset identifier per item (``str``).
        skipped: ``collections.Counter`` of counted skips, e.g. ``"no_visible_part"``
            (images kept for classification whose raw annotation has no visible part;
            their ``part_mask`` is all False and part metrics exclude them) and
            ``"known_bad_box"`` (images of :data:`KNOWN_BAD_BOXES`).
        bad_boxes: ``{image id: reason}`` of the selected images whose real box is known to be
            wrong (:data:`KNOWN_BAD_BOXES`); kept for classification, their ``box_mask`` is all
            False (``box`` stays as annotated), so box metrics skip them.
        classes_present / num_classes_present: the classes with at least one labelled item in
            this selection (the class list may name more: FGVC-Aircraft's ``variants.txt`` lists
            100, Stanford Cars' ``cars_meta.mat`` 196); ``chance_accuracy`` is
            ``1 / num_classes_present`` (uniform guess), ``majority_fraction`` the share of the
            most frequent class.
        transform: the joint transform (default ``EvalTransform(224)``).
        patch_size: patch side used for ``part_mask`` / ``box_mask``.
    """

    dataset_name = "dataset"

    def __init__(self, transform: Callable | None, patch_size: int) -> None:
        self.transform = transform if transform is not None else EvalTransform(224)
        self.patch_size = int(patch_size)
        size = getattr(self.transform, "image_size", None)
        if size is not None:
            grid_shape(size, self.patch_size)  # fail early on a bad image/patch size
        self.skipped: Counter = Counter()
        self.paths: list[Path] = []
        self.labels: list[int] = []
        self.image_ids: list[str] = []
        self.raw_parts = np.zeros((0, 0, 3), np.float32)
        self.raw_boxes = np.zeros((0, 4), np.float32)
        self.classes: list[str] = []
        self.part_names: list[str] = []
        self.label_map: dict[Any, int] = {}
        self.listing: Path | str = ""
        self.bad_boxes: dict[str, str] = {}

    # ------------------------------------------------------------------ API
    @property
    def class_names(self) -> list[str]:
        return self.classes

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def has_parts(self) -> bool:
        return len(self.part_names) > 0

    @property
    def has_visible_part(self) -> list[bool]:
        """Per item: the raw annotation has at least one visible part."""
        if self.raw_parts.shape[1] == 0:
            return [False] * len(self)
        return [bool(v) for v in (self.raw_parts[:, :, 2] > 0).any(axis=1)]

    @property
    def classes_present(self) -> list[str]:
        """Names of the classes with at least one labelled item here, in contiguous-index order
        (labels ``-1``, unknown, count for none)."""
        present = {int(v) for v in self.labels if int(v) >= 0}
        return [c for k, c in enumerate(self.classes) if k in present]

    @property
    def num_classes_present(self) -> int:
        """``len(classes_present)`` (0 when no item is labelled)."""
        return len(self.classes_present)

    @property
    def chance_accuracy(self) -> float:
        """Top-1 accuracy of a uniform guess over the classes present: ``1 / num_classes_present``
        (a fraction in ``(0, 1]``; ``NaN`` when no item is labelled)."""
        n = self.num_classes_present
        return 1.0 / n if n else float("nan")

    @property
    def majority_fraction(self) -> float:
        """Share of the labelled items in the most frequent class (the accuracy of always
        guessing it; ``NaN`` when no item is labelled)."""
        counts = Counter(int(v) for v in self.labels if int(v) >= 0)
        return max(counts.values()) / sum(counts.values()) if counts else float("nan")

    def _finish(self, check_files: bool) -> None:
        """Fill :attr:`bad_boxes` and ``skipped["known_bad_box"]`` from :data:`KNOWN_BAD_BOXES`; with
        ``check_files``, check that every listed image exists (readers call it once their items are set)."""
        table = KNOWN_BAD_BOXES.get(self.dataset_name, {})
        self.bad_boxes = {i: table[i] for i in self.image_ids if i in table}
        if self.bad_boxes:
            self.skipped["known_bad_box"] = len(self.bad_boxes)
        if check_files:
            check_files_exist(self.paths, self.listing)

    def __len__(self) -> int:
        return len(self.paths)

    def _preprocess(self, index: int, image: Image.Image, parts: np.ndarray, box: np.ndarray
                    ) -> tuple[Image.Image, np.ndarray, np.ndarray]:
        """Hook applied to the raw image before the transform (e.g. banner crop)."""
        return image, parts, box

    def load_raw(self, index: int) -> tuple[Image.Image, np.ndarray, np.ndarray]:
        """Raw RGB image, parts ``[P, 3]`` and box ``[4]`` in the image's pixels, after
        ``_preprocess``; visible keypoints outside the frame are made invisible."""
        image = open_rgb(self.paths[index], self.listing)
        parts, box = self.raw_parts[index].copy(), self.raw_boxes[index].copy()
        image, parts, box = self._preprocess(index, image, parts, box)
        w, h = image.size
        if parts.shape[0]:
            out = (parts[:, 0] < 0) | (parts[:, 0] >= w) | (parts[:, 1] < 0) | (parts[:, 1] >= h)
            parts[out | (parts[:, 2] <= 0)] = 0.0
        box = np.clip(box, 0, [w, h, w, h]).astype(np.float32)
        return image, parts, box

    def __getitem__(self, index: int) -> Sample:
        if index < 0:
            index += len(self)
        if not 0 <= index < len(self):
            raise IndexError(f"index {index} out of range for {len(self)} images")
        image, parts, box = self.load_raw(index)
        img_t, parts_t, box_t = self.transform(image, torch.from_numpy(parts), torch.from_numpy(box),
                                               part_names=self.part_names)
        hw = (int(img_t.shape[-2]), int(img_t.shape[-1]))
        box_mask = box_mask_from_box(box_t, hw, self.patch_size)
        if self.image_ids[index] in self.bad_boxes:  # a known-wrong box: no box metric reads it
            box_mask = torch.zeros_like(box_mask)
        return Sample(image=img_t, label=int(self.labels[index]), parts=parts_t.to(torch.float32),
                      box=box_t.to(torch.float32), part_mask=part_mask_from_keypoints(parts_t, hw, self.patch_size),
                      box_mask=box_mask, image_id=self.image_ids[index], index=index)

    def identity_options(self) -> dict[str, Any]:
        """Settings of the dataset itself (not of its transform) that change what a sample
        holds, for :func:`midas_nb.identity.dataset_identity`: the images whose box mask is
        blanked (:attr:`bad_boxes`) where there are any, else none."""
        return dict(excluded_boxes=sorted(self.bad_boxes)) if self.bad_boxes else {}

    def class_counts(self) -> dict[int, int]:
        """Number of items per contiguous label."""
        return dict(sorted(Counter(self.labels).items()))

    def __repr__(self) -> str:
        return (f"{type(self).__name__}(root={getattr(self, 'root', None)}, split={getattr(self, 'split', None)!r}, "
                f"images={len(self)}, classes={self.num_classes}, parts={len(self.part_names)}, "
                f"skipped={dict(self.skipped)})")
