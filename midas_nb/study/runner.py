"""The protocol's cell function (:class:`ProtocolCellRunner`) and the scale readout (:func:`scale_readout`)."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from ..config import check_device
from ..analysis.protocol import condition_target, run_protocol
from ..sweeps import ExecutorKind, open_store, ResultStore, run_sweep, StoreStatus, SweepCell
from .grid import (cached_study, DATA_PARAMS, digest_memo_path, eval_identity, load_digest_memo, make_grid,
                   save_digest_memo)
from .settings import profile_values, protocol_settings, RunSettings

__all__ = ["ProtocolCellRunner", "prefetch_targets", "scale_readout"]

#: digest memos this process has read (each once)
_MEMOS_READ: set[Path] = set()


class ProtocolCellRunner:
    """The real ``cell_fn`` (picklable): ``run_protocol`` at the cell's point, condition, seed and
    ``cell.params`` on the cell's :func:`cached_study` (or ``study``, reused in this process only).
    ``device`` overrides the profile's where a cell runs (decision 0038). Raises per cell (recorded):
    ``ValueError`` (checkpoint or data id differ from the data here), ``RuntimeError`` (no such device).
    """

    def __init__(self, profile: RunSettings | str | Mapping[str, Any], *, device: str | None = None,
                 cache_dir: str | Path | None = None, progress: bool = False, study: Any = None) -> None:
        self.profile = profile_values(profile)
        self.device = device
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.progress = progress
        self._local_study = study  # not pickled

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _local_study=None)

    def __repr__(self) -> str:
        return (f"ProtocolCellRunner(profile={self.profile.get('profile', '?')!r}, "
                f"device={self.device or self.profile.get('device')!r})")

    def study(self, cell: SweepCell):
        """The study of the cell's data and backbone (image digests from the shared memo, once)."""
        st = self._local_study
        if st is not None and st.dataset_name == cell.dataset and st.settings.backbone.name == cell.backbone:
            return st
        device = self.device or str(self.profile.get("device") or "cpu")
        problems = check_device(device)
        if problems:
            job = os.environ.get("SLURM_JOB_ID")
            raise RuntimeError(f"this worker ({socket.gethostname()}{f', Slurm job {job}' if job else ''}) cannot run "
                               f"the sweep's device {device!r}: {problems[0].split('; use')[0]}; submit the cells to "
                               "GPU nodes (midas-nb sweep submit --gpus 1 --partition <a GPU partition>) or "
                               "with --device cpu")
        memo = digest_memo_path(self.profile, cell.dataset)
        if memo not in _MEMOS_READ:
            load_digest_memo(memo)
            _MEMOS_READ.add(memo)
        return cached_study(self.profile, cell.dataset, cell.backbone, self.device, self.progress)

    def prepare(self, cell: SweepCell) -> dict[str, Any]:
        """A sweep's preparation job for one (dataset, backbone): fine-tune (or load) the backbone, save
        the image digests for the cell jobs; ``checkpoint_id`` and ``loaded_from_cache``."""
        meta = self.study(cell).meta
        save_digest_memo(digest_memo_path(self.profile, cell.dataset))
        return dict(checkpoint_id=meta.get("checkpoint_id"), loaded_from_cache=bool(meta.get("loaded_from_cache")))

    def __call__(self, cell: SweepCell) -> pd.DataFrame:
        study = self.study(cell)  # a cell keyed by other data or another recipe is never filled
        if cell.checkpoint_id and cell.checkpoint_id != study.checkpoint_id:
            raise ValueError(f"cell {cell.label} was keyed by checkpoint {cell.checkpoint_id!r} but the data, "
                             f"recipe and training numerics (precision, CPU threads) here give "
                             f"{study.checkpoint_id!r}; rebuild the grid")
        settings = dict(protocol_settings(self.profile), **cell.params)
        if cell.data_id and cell.data_id != eval_identity(study, settings):
            raise ValueError(f"cell {cell.label} was keyed by evaluation data {cell.data_id!r} but the "
                             f"evaluated test images now are {eval_identity(study, settings)!r} (images, "
                             "labels, keypoints or boxes changed); rebuild the grid")
        for k in DATA_PARAMS:
            settings.pop(k, None)
        if self.cache_dir is not None:
            settings["cache_dir"] = self.cache_dir
        # the loaded checkpoint's id is the key's (load_or_finetune names and checks it by the key)
        return run_protocol(
            study.train_set, study.test_set, study.model, depth=cell.depth, budget=cell.budget,
            conditions=[cell.condition], seeds=[cell.seed], dataset_name=study.dataset_name,
            backbone_name=cell.backbone, checkpoint_id=str(study.meta.get("checkpoint_id", "")), device=study.device,
            progress=self.progress, prefetch_targets=prefetch_targets(self.profile, cell.backbone, cell.depth),
            **settings)


def prefetch_targets(profile: Mapping[str, Any], backbone: str, depth: int) -> list[str]:
    """Target ids whose train-split maps a cell of ``(backbone, depth)`` computes in its capture pass:
    all the profile's ``targets`` at its own backbone and depth, elsewhere those the swept conditions distil."""
    targets = list(profile.get("targets") or ())
    if backbone == profile.get("backbone") and int(depth) == int(profile.get("depth", -1)):
        return targets
    swept = {condition_target(c) for c in profile.get("sweep_conditions") or profile.get("conditions") or ()
             if c != "reference"}                                # the reference reads attention, no map
    return [t for t in targets if t in swept]


def scale_readout(
    profile: RunSettings | str | Mapping[str, Any],
    backbones: Sequence[str] | None = None,
    *,
    store: ResultStore | str | Path | None = None,
    datasets: Sequence[str] | None = None,
    conditions: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    executor: ExecutorKind = "local",
    max_workers: int = 2,
    slurm: Mapping[str, Any] | None = None,
    run: bool = True,
    cell_fn: Callable[[SweepCell], Any] | None = None,
    progress: bool = False,
) -> pd.DataFrame:
    """The protocol at the profile's ``(depth, budget)`` for each ``scale_backbones`` (or ``backbones``)
    through the profile's store (or ``store``; ``run=False`` only reads): the rows of the done cells,
    ``attrs["status"]`` their :class:`StoreStatus`."""
    prof = profile_values(profile)
    store = open_store(store if store is not None else prof.get("profile", "default"))
    cells = make_grid(prof, "scale", backbones=backbones, datasets=datasets, conditions=conditions, seeds=seeds)
    if run:
        st = run_sweep(cells, cell_fn or ProtocolCellRunner(prof, progress=progress), store, executor=executor,
                       max_workers=max_workers, slurm=slurm, progress=progress)
    else:
        st = StoreStatus(store.status(cells))
    out = store.results(cells)
    out.attrs["status"] = st
    return out
