"""Datasets, joint transforms and patch-grid masks for midas_nb.

Contract (``docs/architecture.md``): every dataset is a
``torch.utils.data.Dataset`` of :class:`Sample`; :func:`collate_samples` stacks
them into a :class:`Batch`; :func:`load_dataset` builds a dataset with the right
transform. Coordinates are continuous pixels of the transformed image (pixel
``(r, c)`` covers ``[c, c+1) x [r, r+1)``); patch grids are row-major.

Sources: CUB-200-2011 (Wah et al. 2011), FGVC-Aircraft (Maji et al. 2013),
Stanford Cars (Krause et al. 2013); the synthetic set is drawn here in CUB's layout.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Sequence

from ..config import DATASET_NAMES
from ._common import KNOWN_BAD_BOXES, AnnotatedDataset, DatasetError
from .aircraft import AircraftDataset
from .builders import make_aircraft_from_cub, make_cars_from_cub
from .cars import CarsDataset, read_cars_annotations, read_cars_meta
from .cub import CUB_PART_NAMES, CUBDataset, read_cub_annotations
from .grid import box_mask_from_box, grid_shape, num_patches, part_mask_from_keypoints, patch_centres
from .sample import Batch, Sample, collate_samples, evaluation_subset
from .synthetic import data_note, ensure_synthetic_cub, make_synthetic_cub, synthetic_class_attributes
from .transforms import (DEFAULT_MEAN, DEFAULT_STD, EvalTransform, JointTransform, TrainTransform,
                         crop_resize, denormalize, flip_permutation, to_normalised_tensor)

__all__ = ["Sample", "Batch", "collate_samples", "evaluation_subset", "DatasetError", "AnnotatedDataset",
    "KNOWN_BAD_BOXES", "CUBDataset", "AircraftDataset", "CarsDataset", "load_dataset", "DATASET_NAMES",
    "make_synthetic_cub", "ensure_synthetic_cub", "synthetic_class_attributes", "data_note", "make_aircraft_from_cub",
    "make_cars_from_cub", "read_cub_annotations", "read_cars_meta", "read_cars_annotations", "CUB_PART_NAMES",
    "EvalTransform", "TrainTransform", "JointTransform", "flip_permutation", "crop_resize", "to_normalised_tensor",
    "denormalize", "DEFAULT_MEAN", "DEFAULT_STD", "grid_shape", "num_patches", "patch_centres",
    "part_mask_from_keypoints", "box_mask_from_box", "default_synthetic_root", "check_layout",
    "unlabelled_test_message", "TRAIN_SPLIT"]

_ALIASES = {"cub200": "cub", "cub-200-2011": "cub", "cub_200_2011": "cub", "fgvc_aircraft": "aircraft",
            "fgvc-aircraft": "aircraft", "stanford_cars": "cars", "stanford-cars": "cars", "synthetic_cub": "synthetic"}
_SYNTHETIC_KEYS = ("num_classes", "images_per_class", "train_fraction")


def default_synthetic_root(num_classes: int = 4, images_per_class: int = 8, image_size: int = 96,
                           seed: int = 0) -> Path:
    """Where :func:`load_dataset` puts the synthetic set when ``root`` is None:
    ``$MIDAS_NB_CACHE`` (default ``~/.cache/midas_nb``) ``/synthetic_c{C}_n{n}_px{size}_seed{seed}``."""
    base = Path(os.environ.get("MIDAS_NB_CACHE", "~/.cache/midas_nb")).expanduser()
    return base / f"synthetic_c{num_classes}_n{images_per_class}_px{image_size}_seed{seed}"


def load_dataset(name: str, root: str | os.PathLike | None, split: str, *, image_size: int | Sequence[int] = 224,
                 patch_size: int = 16, train: bool = False, mean: Sequence[float] = DEFAULT_MEAN,
                 std: Sequence[float] = DEFAULT_STD, **kwargs: Any) -> AnnotatedDataset:
    """Build a dataset with the transform for ``train`` (random resized crop + flip)
    or evaluation (resize shorter side + centre crop).

    Args:
        name: ``"cub"``, ``"aircraft"``, ``"cars"`` or ``"synthetic"`` (a few aliases
            such as ``"cub200"``, ``"fgvc_aircraft"``, ``"stanford_cars"`` accepted).
        root: dataset directory. For ``"synthetic"`` the directory where the set is
            generated when missing (``None``: :func:`default_synthetic_root`), then
            read with :class:`CUBDataset`.
        split: the dataset's split name (``train``/``test``/``all`` for CUB and
            synthetic, ``train``/``val``/``trainval``/``test`` for Aircraft,
            ``train``/``test`` for Cars).
        image_size: output ``int`` or ``(H, W)`` pixels, multiples of ``patch_size``.
        patch_size: patch side (pixels) of the masks.
        train: training transform instead of the evaluation one.
        mean, std: normalisation of the backbone.
        **kwargs: transform options ``seed`` (TrainTransform's RNG), ``scale``,
            ``ratio``, ``flip``, ``flip_prob``, ``resize_ratio``; synthetic options ``num_classes``,
            ``images_per_class``, ``train_fraction``, ``synthetic_image_size``
            (default ``round(image_size * 256 / 224)``), ``synthetic_seed``
            (default 0); every other keyword goes to the dataset class
            (e.g. ``max_images_per_class``, ``annotation_level``, ``crop_banner``).

    Raises:
        ValueError: unknown ``name``; :class:`DatasetError` for bad input files.
    """
    key = _ALIASES.get(name.lower(), name.lower())
    if key not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; expected one of {DATASET_NAMES}")
    opts = {k: kwargs.pop(k) for k in ("seed", "scale", "flip", "flip_prob", "ratio", "resize_ratio") if k in kwargs}
    eval_opts = {k: opts.pop(k) for k in ("resize_ratio",) if k in opts}   # the rest are TrainTransform's
    transform: JointTransform = (TrainTransform(image_size, mean=mean, std=std, **opts) if train
                                 else EvalTransform(image_size, mean=mean, std=std, **eval_opts))

    if key == "synthetic":
        gen = {k: kwargs.pop(k) for k in _SYNTHETIC_KEYS if k in kwargs}
        gen["image_size"] = int(kwargs.pop("synthetic_image_size", round(max(transform.image_size) * 256 / 224)))
        gen["seed"] = int(kwargs.pop("synthetic_seed", 0))
        if root is None:
            root = default_synthetic_root(gen.get("num_classes", 4), gen.get("images_per_class", 8),
                                          gen["image_size"], gen["seed"])
        root = ensure_synthetic_cub(root, **gen)
        return CUBDataset(root, split, transform, patch_size=patch_size, **kwargs)
    if root is None:
        raise DatasetError(f"no data root given for dataset {name!r}; pass the directory that holds it "
                           "(or use 'synthetic', generated on demand)")
    cls = {"cub": CUBDataset, "aircraft": AircraftDataset, "cars": CarsDataset}[key]
    return cls(root, split, transform, patch_size=patch_size, **kwargs)


def check_layout(dataset: str, root: str | os.PathLike, *, max_images_per_class: int | None = None) -> list[str]:
    """Problems (one line each) of reading ``root`` as ``dataset`` (both splits built, no image decoded;
    Stanford Cars needs test labels); ``[]`` when it has the layout. A root in another dataset's layout (its
    loader reads both splits) is said to be that dataset's, e.g. a plain ``--data-root`` of Stanford Cars read
    as CUB, the default dataset."""
    root = Path(root).expanduser()
    if not root.is_dir():
        return [f"data root {str(root)!r} of dataset {dataset!r} does not exist or is not a directory"]
    extra = {} if max_images_per_class is None else dict(max_images_per_class=int(max_images_per_class))
    errors, sets = _read_splits(dataset, root, extra)   # errors: split -> error; one line for a root no split reads
    problems = [unlabelled_test_message(dataset, root, ds) for ds in sets if not getattr(ds, "has_labels", True)]
    if not errors:
        return problems
    if other := next((o for o in TRAIN_SPLIT if o != dataset and not _read_splits(o, root, {})[0]), None):
        return [f"data root {str(root)!r} is read as {dataset} but has the {other} layout; expected "
                f"--data-root {other}={root} (or --dataset {other})"]
    (_, text), *rest = errors.items()
    tail = os.path.commonprefix([m[::-1] for m in errors.values()])[::-1]
    tail = tail[tail.find("; "):] if "; " in tail else ""  # the shared "; expected ..." part
    more = "".join(f"; {split} split: {m[:len(m) - len(tail)]}" for split, m in rest if m != text)
    return [f"data root {str(root)!r} does not have the {dataset} layout ({' and '.join(errors)} "
            f"split{'s' if len(errors) > 1 else ''}): {text[:len(text) - len(tail)] + more + tail}"] + problems


def _read_splits(dataset: str, root: Path, extra: dict) -> tuple[dict[str, str], list]:
    """``({split: error}, datasets read)`` of ``dataset``'s train and test splits at ``root``."""
    errors, sets = {}, []
    for split in (TRAIN_SPLIT.get(dataset, "train"), "test"):
        try:
            sets.append(load_dataset(dataset, root, split, **extra))
        except (DatasetError, ValueError, OSError) as e:
            errors[split] = str(e)
    return errors, sets


def unlabelled_test_message(dataset: str, root: str | os.PathLike, ds: Any) -> str:
    """The one line refusing a Stanford Cars ``ds`` (:class:`CarsDataset`) whose test annotations have no labels."""
    return (f"data root {str(root)!r} ({dataset}): the test split {ds.annotation_file} has no class field (labels "
            f"-1); the protocol's accuracies and the backbone's test accuracy need the labelled test file "
            f"cars_test_annos_withlabels.mat — put it in {getattr(ds, 'devkit', root)}")


#: the split each dataset's backbone and scorers train on (FGVC-Aircraft's standard protocol: trainval)
TRAIN_SPLIT: dict[str, str] = {"cub": "train", "aircraft": "trainval", "cars": "train"}
