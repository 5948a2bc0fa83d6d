"""The per-process cache of studies (datasets and fine-tuned backbones) that sweep cells share.

A worker that computes many cells loads each dataset and backbone once: :func:`cached_study`
keeps one :class:`~midas_nb.study.base.StudyBase` per (profile settings, dataset, backbone),
renewed when the dataset's annotation files change. It lives at module level so that a pickled
cell runner (process pools, submitit) finds it too.
"""
from __future__ import annotations

from typing import Any, Mapping

from ..config import data_root_for, dataset_label, dataset_of_label
from ..identity import annotation_stamp, canonical_json
from .base import StudyBase

__all__ = ["cached_study"]


def _data_root_for(profile: Mapping[str, Any], dataset: str) -> str | None:
    """The resolved data root of ``dataset`` in a profile (:func:`midas_nb.config.data_root_for`:
    ``data_roots[dataset]``, else ``data_root`` for the profile's own dataset), or ``None`` for
    the embedded synthetic set (asked for by name, or CUB in smoke/quick without any root).

    Raises:
        ValueError: a dataset that has no root and no synthetic default (never substituted).
    """
    root = data_root_for(dict(profile), dataset)
    return None if root is None else str(root.resolve())


def _dataset_label(profile: Mapping[str, Any], dataset: str) -> str:
    """The name results carry for ``dataset``: ``"synthetic"`` for the embedded set, as
    :func:`midas_nb.study.resolve_data` labels it; the dataset name otherwise."""
    return dataset_label(dict(profile), dataset)


_PROCESS_CACHE: dict[str, Any] = {}


def _study(profile: Mapping[str, Any], dataset: str, backbone: str, device: str | None = None,
           progress: bool = False):
    """The (per-process cached) :class:`StudyBase` for one dataset (its name or its label, e.g. a
    cell's ``"aircraft (manufacturer)"``) and backbone."""
    dataset = dataset_of_label(dataset)
    overrides = {k: v for k, v in profile.items() if k not in ("profile", "data_root", "data_roots")}
    # the cell's dataset gets its own root (data_roots / data_root resolved for it): a root given
    # for the profile's own dataset must not follow the study to another dataset
    overrides.update(dataset=dataset, backbone=backbone, data_root=_data_root_for(profile, dataset),
                     data_roots={})
    if device is not None:
        overrides["device"] = device
    name = str(profile.get("profile", "quick"))
    key = "study:" + canonical_json([name, overrides])
    cached = _PROCESS_CACHE.get(key)
    # a Study parses the annotation files once; if they were edited since (or the synthetic set
    # regenerated), a fresh Study reads them again, so identities and results follow the files
    if cached is None or cached[1] != annotation_stamp(cached[0].data_root):
        st = StudyBase(name, progress=progress, **overrides)
        cached = _PROCESS_CACHE[key] = (st, annotation_stamp(st.data_root))
    return cached[0]


#: the public name of :func:`_study`
cached_study = _study
