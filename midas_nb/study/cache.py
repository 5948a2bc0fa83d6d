"""The per-process cache of studies that sweep cells share (one per profile settings, dataset and
backbone, renewed when the annotation files change), and the image digests that sweep jobs share.
"""
from __future__ import annotations

from typing import Any, Mapping

import json
import threading
from pathlib import Path

from .. import identity
from ..config import cache_dir, data_root_for, dataset_of_label
from ..identity import annotation_stamp, atomic_write_text, canonical_json, hash_json
from .base import StudyBase
from .settings import profile_values, RunSettings

__all__ = ["cached_study", "study_overrides", "digest_memo_path", "load_digest_memo", "save_digest_memo"]


def _data_root_for(profile: Mapping[str, Any], dataset: str) -> str | None:
    """:func:`midas_nb.config.data_root_for`, resolved, as a string (``None``: the embedded synthetic set)."""
    root = data_root_for(dict(profile), dataset)
    return None if root is None else str(root.resolve())


def study_overrides(profile: Mapping[str, Any], dataset: str, backbone: str) -> dict[str, Any]:
    """The overrides of the study of one sweep cell (``dataset``: a name or a cell's label), with that
    dataset's own root; raises ``ValueError`` for a dataset without a root or synthetic default."""
    dataset = dataset_of_label(dataset)
    overrides = {k: v for k, v in profile.items() if k not in ("profile", "data_root", "data_roots")}
    overrides.update(dataset=dataset, backbone=backbone, data_root=_data_root_for(profile, dataset), data_roots={})
    return overrides


_PROCESS_CACHE: dict[str, Any] = {}


def cached_study(profile: RunSettings | Mapping[str, Any], dataset: str, backbone: str, device: str | None = None,
                 progress: bool = False):
    """The (per-process cached) :class:`StudyBase` for one dataset (name or label) and backbone."""
    profile = profile_values(profile) if isinstance(profile, RunSettings) else profile
    overrides = study_overrides(profile, dataset, backbone)
    if device is not None:
        overrides["device"] = device
    name = str(profile.get("profile", "quick"))
    key = "study:" + canonical_json([name, overrides])
    cached = _PROCESS_CACHE.get(key)
    if cached is None or cached[1] != annotation_stamp(cached[0].data_root):
        st = StudyBase(name, progress=progress, **overrides)
        cached = _PROCESS_CACHE[key] = (st, annotation_stamp(st.data_root))
    return cached[0]


def digest_memo_path(profile: Mapping[str, Any], dataset: str) -> Path:
    """Where the sweep jobs of ``dataset`` share its image digests."""
    root = _data_root_for(profile, dataset)
    return cache_dir() / "file_digests" / f"{dataset}-{hash_json([dataset, root], 12)}.json"


_MEMO_LOCK = threading.Lock()


def save_digest_memo(path: str | Path) -> Path:
    """Merge this process's :func:`midas_nb.identity.file_digest` memo into ``path`` (atomic)."""
    p = Path(path)
    entries = {json.dumps(list(k)): v for k, v in identity.file_digest_memo().items()}
    with _MEMO_LOCK:
        try:
            old = json.loads(p.read_text(encoding="utf-8"))
            entries = dict(old if isinstance(old, dict) else {}, **entries)
        except (FileNotFoundError, ValueError):
            pass
        return atomic_write_text(p, json.dumps(entries))


def load_digest_memo(path: str | Path) -> int:
    """Add the digests :func:`save_digest_memo` wrote to this process's memo; the number read."""
    try:
        entries = json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return 0
    if not isinstance(entries, dict):
        return 0
    identity.add_file_digests({tuple(json.loads(k)): v for k, v in entries.items()})
    return len(entries)
