"""One study = one (profile, dataset, backbone): the object every notebook starts from.

A :class:`Study` resolves the data (the real dataset under ``data_root``, or the embedded
synthetic CUB-format default when no path is given), builds or loads the fine-tuned backbone
through the checkpoint cache, and gives the notebooks short calls for each stage of the
pipeline (DESIGN.md §2): target maps, the three-condition protocol, sweeps. Every stage is
cached (checkpoints and target maps under :func:`midas_nb.config.cache_dir`, tables under
``runs/``), so each notebook runs on its own and a rerun is fast.

Example::

    >>> study = Study("smoke")                 # embedded synthetic data, tiny ViT
    >>> table = study.protocol()               # one row per condition x seed
    >>> maps = study.target_maps()             # {"T0": [M, N], ...} on the test split
"""
from __future__ import annotations

import hashlib
import json
from functools import cached_property
from pathlib import Path
from typing import Any

import pandas as pd
import torch

from . import config

__all__ = ["Study", "resolve_data"]

_DATASET_NAMES = ("cub", "aircraft", "cars", "synthetic")


def _key_hash(key: dict) -> str:
    return hashlib.sha1(json.dumps(key, sort_keys=True, default=str).encode()).hexdigest()[:12]


def resolve_data(params: dict[str, Any]) -> tuple[str, Path, str]:
    """``(loader name, root, label)`` for a profile's data settings.

    With ``data_root`` set, that directory is read with the loader named by ``dataset``.
    Without it, the embedded default is generated once (deterministic by seed) under
    ``cache_dir()/data`` in CUB's layout and read with the CUB loader; its label is
    ``"synthetic"`` everywhere it appears.

    Raises:
        ValueError: for an unknown dataset name, or a real dataset other than CUB with no
            ``data_root`` (Aircraft and Cars have no embedded default).
    """
    name = params.get("dataset", "cub")
    if name not in _DATASET_NAMES:
        raise ValueError(f"unknown dataset {name!r}; expected one of {_DATASET_NAMES}")
    root = params.get("data_root")
    if root is not None and name != "synthetic":
        root = Path(root).expanduser()
        if not root.is_dir():
            raise FileNotFoundError(f"data root {str(root)!r} does not exist (dataset {name!r})")
        return name, root, name
    if name not in ("cub", "synthetic"):
        raise ValueError(f"dataset {name!r} needs --data-root (no embedded default for it)")
    from .data import make_synthetic_cub

    syn = dict(params.get("synthetic") or {})
    root = config.cache_dir() / "data" / f"synthetic_{_key_hash(syn)}"
    if not (root / "images.txt").is_file():
        make_synthetic_cub(root, **syn)
    return "cub", root, "synthetic"


class Study:
    """Data, backbone and cached pipeline stages for one profile.

    Args:
        profile: ``"smoke" | "quick" | "paper"`` (DESIGN.md §7).
        **overrides: any profile key (``data_root``, ``dataset``, ``backbone``, ``depth``,
            ``budget``, ``seeds``, ``device``, ``conditions``, ...); ``None`` values are
            ignored so notebook parameters can pass through unchanged.
    """

    def __init__(self, profile: str = "quick", progress: bool = True, **overrides: Any):
        self.params = config.get_profile(profile, **overrides)
        self.progress = progress
        self.loader_name, self.data_root, self.dataset_name = resolve_data(self.params)
        if self.params.get("device") == "cuda" and not torch.cuda.is_available():
            self.params["device"] = "cpu"
        self.device = torch.device(self.params["device"])

    def __repr__(self) -> str:
        p = self.params
        return (f"Study(profile={p['profile']!r}, dataset={self.dataset_name!r}, "
                f"backbone={p['backbone']!r}, depth={p['depth']}, budget={p['budget']}, "
                f"device={str(self.device)!r})")

    # ----------------------------------------------------------------------------- data
    @cached_property
    def normalization(self) -> tuple[tuple[float, ...], tuple[float, ...]]:
        from .backbones import backbone_normalization
        return backbone_normalization(self.params["backbone"])

    def dataset(self, split: str, train: bool = False):
        """The ``split`` of the study's dataset with the backbone's normalisation."""
        from .data import load_dataset
        mean, std = self.normalization
        return load_dataset(self.loader_name, self.data_root, split, image_size=self.params["image_size"],
                            patch_size=self.params["patch_size"], train=train, mean=mean, std=std)

    @cached_property
    def train_set(self):
        return self.dataset("train")

    @cached_property
    def test_set(self):
        return self.dataset("test")

    # ------------------------------------------------------------------------- backbone
    @cached_property
    def _backbone(self):
        from .backbones import load_or_finetune
        ft = dict(self.params["finetune"])
        return load_or_finetune(self.params["backbone"], self.train_set, self.test_set, seed=0,
                                device=self.device, progress=self.progress, **ft)

    @property
    def model(self) -> torch.nn.Module:
        """The fine-tuned, frozen backbone (eval mode)."""
        return self._backbone[0]

    @property
    def meta(self) -> dict:
        """Checkpoint metadata (``checkpoint_id``, accuracies, versions, ...)."""
        return self._backbone[1]

    # -------------------------------------------------------------------------- targets
    def target_maps(self, split: str = "test", depth: int | None = None,
                    ids: list[str] | None = None) -> dict[str, torch.Tensor]:
        """Target maps ``{id: [M, N]}`` over the split's images (cached on disk)."""
        from .targets import target_cache
        depth = depth or self.params["depth"]
        ids = list(ids or self.params["targets"])
        ds = self.train_set if split == "train" else self.test_set
        rule = "label" if split == "train" else "prediction"
        key = dict(dataset=self.dataset_name, root=str(self.data_root), split=split,
                   checkpoint=self.meta["checkpoint_id"], depth=depth, class_rule=rule)
        return target_cache(self.model, ds, ids=ids, depth=depth, class_rule=rule, key=key,
                            device=self.device, progress=self.progress)

    # ------------------------------------------------------------------------- protocol
    def protocol(self, depth: int | None = None, budget: float | None = None,
                 conditions: list[str] | None = None, seeds: list[int] | None = None,
                 relaxation: str = "st", **kwargs: Any) -> pd.DataFrame:
        """The three-condition protocol table at ``(depth, budget)``; cached under ``runs/``."""
        from .protocol import run_protocol
        p = self.params
        depth = depth or p["depth"]
        budget = budget or p["budget"]
        conditions = list(conditions or p["conditions"])
        seeds = list(seeds if seeds is not None else p["seeds"])
        st = dict(p["scorer_train"])
        st.update(kwargs)
        key = dict(dataset=self.dataset_name, root=str(self.data_root), checkpoint=self.meta["checkpoint_id"],
                   depth=depth, budget=budget, conditions=conditions, seeds=seeds, relaxation=relaxation,
                   idauc_steps=p["idauc_steps"], max_eval_images=p["max_eval_images"], **st)
        path = config.runs_dir() / "tables" / f"protocol_{_key_hash(key)}.csv"
        if path.is_file():
            return pd.read_csv(path)
        table = run_protocol(self.train_set, self.test_set, self.model, depth=depth, budget=budget,
                             conditions=conditions, seeds=seeds, dataset_name=self.dataset_name,
                             backbone_name=p["backbone"], checkpoint_id=self.meta["checkpoint_id"],
                             relaxation=relaxation, idauc_steps=p["idauc_steps"],
                             max_eval_images=p["max_eval_images"], bootstrap=p["bootstrap"],
                             device=self.device, progress=self.progress, **st)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        table.to_csv(tmp, index=False)
        tmp.replace(path)
        return table
