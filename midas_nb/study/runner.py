"""The protocol's cell function (:class:`ProtocolCellRunner`) and the scale readout
(:func:`scale_readout`): one run of :func:`midas_nb.analysis.protocol.run_protocol` per sweep cell, through
the profile's result store (:mod:`midas_nb.sweeps`)."""
from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import pandas as pd

from ..config import check_device
from ..analysis.protocol import run_protocol
from ..sweeps import ExecutorKind, open_store, ResultStore, run_sweep, StoreStatus, SweepCell
from .cache import cached_study, digest_memo_path, load_digest_memo, save_digest_memo
from .grid import DATA_PARAMS, eval_identity, make_grid
from .settings import profile_values, protocol_settings, RunSettings

__all__ = ["ProtocolCellRunner", "prefetch_targets", "scale_readout"]

#: digest memos this process has read (each once)
_MEMOS_READ: set[Path] = set()


class ProtocolCellRunner:
    """The real ``cell_fn``: one protocol run per cell (picklable; heavy objects cached per process).

    For a cell it takes the dataset splits and the fine-tuned backbone from a cached study
    (:func:`midas_nb.study.cached_study`, one per process and (dataset, backbone)), then calls
    :func:`midas_nb.analysis.protocol.run_protocol` at the cell's depth, budget, condition and
    seed with the protocol settings stored in ``cell.params``, so a cell is computed exactly as
    its key says; the capture pass computes the train-split maps of :func:`prefetch_targets`.

    Args:
        profile: a study's :class:`RunSettings`, a profile dict or name; supplies data roots,
            fine-tuning settings and device.
        device: overrides ``profile["device"]``. Resolved where a cell runs, not where the
            runner is built: a Slurm submission from a login node without a GPU carries
            ``"cuda"`` to the compute node, and a worker without CUDA raises ``RuntimeError``
            naming its host and job (recorded as the cell's error).
        cache_dir: target/scorer cache passed to ``run_protocol``; default the package cache.
        progress: show progress bars.
        study: an existing :class:`midas_nb.study.Study` to reuse, in this process only, for
            the cells of its dataset and backbone (saves loading them twice in a notebook).

    Raises (per cell, recorded by :func:`run_sweep`):
        ValueError: the cell was keyed by a real checkpoint id that differs from the
            checkpoint the profile now yields (the grid is stale; rebuild it).
    """

    def __init__(self, profile: RunSettings | str | Mapping[str, Any], *, device: str | None = None,
                 cache_dir: str | Path | None = None, progress: bool = False, study: Any = None) -> None:
        self.profile = profile_values(profile)
        self.device = device
        self.cache_dir = str(cache_dir) if cache_dir is not None else None
        self.progress = progress
        # a caller's Study (e.g. the notebook's) is reused in-process; it is not pickled
        self._local_study = study

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        state["_local_study"] = None
        return state

    def __repr__(self) -> str:
        return (f"ProtocolCellRunner(profile={self.profile.get('profile', '?')!r}, "
                f"device={self.device or self.profile.get('device')!r})")

    def study(self, cell: SweepCell):
        """The Study holding the cell's data and backbone (its image digests read from the
        dataset's shared memo, :func:`midas_nb.study.cache.load_digest_memo`, where a
        preparation job wrote one)."""
        st = self._local_study
        if st is not None and st.dataset_name == cell.dataset and st.settings.backbone.name == cell.backbone:
            return st
        device = self.device or str(self.profile.get("device") or "cpu")
        problems = check_device(device)
        if problems:  # on a compute node: say which node and job, and what to ask the scheduler for
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
        """A sweep's preparation job for the cells of one (dataset, backbone): fine-tune (or load)
        the backbone once and save the dataset's image digests for the cell jobs
        (:mod:`midas_nb.sweeps.slurm`). The device is resolved here, on the compute node.

        Returns:
            ``checkpoint_id`` and ``loaded_from_cache`` of the backbone.
        """
        study = self.study(cell)
        meta = study.meta
        save_digest_memo(digest_memo_path(self.profile, cell.dataset))
        return dict(checkpoint_id=meta.get("checkpoint_id"), loaded_from_cache=bool(meta.get("loaded_from_cache")))

    def __call__(self, cell: SweepCell) -> pd.DataFrame:
        study = self.study(cell)
        # the grid must describe the data and recipe this process sees: a cell keyed by other
        # data (edited keypoints, replaced images) or another recipe is never filled with rows
        # computed from the current ones
        if cell.checkpoint_id and cell.checkpoint_id != study.checkpoint_id:
            raise ValueError(f"cell {cell.label} was keyed by checkpoint {cell.checkpoint_id!r} but the data, "
                             f"recipe and training numerics (precision, CPU threads) here give "
                             f"{study.checkpoint_id!r}; rebuild the grid")
        settings = dict(protocol_settings(self.profile), **cell.params)
        if cell.data_id and cell.data_id != eval_identity(study, settings):
            raise ValueError(f"cell {cell.label} was keyed by evaluation data {cell.data_id!r} but the "
                             f"evaluated test images now are {eval_identity(study, settings)!r} (images, "
                             "labels, keypoints or boxes changed); rebuild the grid")
        model, meta = study.model, study.meta
        ckpt = str(meta.get("checkpoint_id", ""))
        if cell.checkpoint_id and cell.checkpoint_id != ckpt:
            raise ValueError(f"cell {cell.label} was keyed by checkpoint {cell.checkpoint_id!r} but the "
                             f"profile now yields checkpoint {ckpt!r}; rebuild the grid")
        for k in DATA_PARAMS:
            settings.pop(k, None)
        if self.cache_dir is not None:
            settings["cache_dir"] = self.cache_dir
        return run_protocol(
            study.train_set, study.test_set, model, depth=cell.depth, budget=cell.budget,
            conditions=[cell.condition], seeds=[cell.seed], dataset_name=study.dataset_name,
            backbone_name=cell.backbone, checkpoint_id=ckpt, device=study.device,
            progress=self.progress, prefetch_targets=prefetch_targets(self.profile, cell.backbone, cell.depth),
            **settings)


def prefetch_targets(profile: Mapping[str, Any], backbone: str, depth: int) -> list[str]:
    """Target ids whose train-split maps a cell of ``(backbone, depth)`` computes in its capture
    pass: all the profile's ``targets`` at the profile's own backbone and depth (where notebooks 02
    and 06 train every condition); elsewhere those among ``sweep_conditions`` (default:
    ``conditions``), the supervised conditions the regime sweep and the scale readout run. The maps
    of a target do not depend on which others share the pass (one forward, per-target rules)."""
    targets = list(profile.get("targets") or ())
    if backbone == profile.get("backbone") and int(depth) == int(profile.get("depth", -1)):
        return targets
    from ..analysis.protocol import condition_target  # the target a condition distils (random_map → random)

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
    """Scale sensitivity: the protocol at the profile's ``(depth, budget)`` for each of its
    ``scale_backbones``. Cells go through the same store as the regime sweeps (default: the one
    named after the profile), so cells shared with them are computed once.

    Args:
        profile: a study's :class:`RunSettings`, a profile name or dict.
        backbones: override ``scale_backbones``.
        store: result store; default ``ResultStore(name=<profile name>)``.
        datasets, conditions, seeds: override the profile's lists.
        executor, max_workers, slurm: as in :func:`run_sweep`.
        run: compute missing cells first; ``False`` only reads what the store has.
        cell_fn: default :class:`ProtocolCellRunner` of ``profile``.
        progress: a bar over the cells and the default runner's bars (:mod:`midas_nb.progress`).

    Returns:
        The result rows of the scale cells that are done (column ``backbone`` tells them apart;
        ``midas_nb.metrics.decoupling_D`` groups by it, giving D per backbone);
        ``attrs["status"]`` is the :class:`StoreStatus` of the cells (``complete`` is False
        while any cell failed or is pending: their rows are absent).
    """
    prof = profile_values(profile)
    store = open_store(store if store is not None else prof.get("profile", "default"))
    cells = make_grid(prof, "scale", backbones=backbones, datasets=datasets, conditions=conditions, seeds=seeds)
    if run:
        st = run_sweep(cells, cell_fn or ProtocolCellRunner(prof, progress=progress), store, executor=executor,
                       max_workers=max_workers, slurm=slurm, progress=progress)
    else:
        table = store.status(cells)
        st = StoreStatus(table=table, problems=table.attrs.get("problems", []))
    out = store.results(cells)
    out.attrs["status"] = st
    return out
