"""A profile's sweep cells (DESIGN.md §5; decision 0015), every notebook sweep declared once (:data:`CATALOGUE`), the
protocol's cell function (:class:`ProtocolCellRunner`) and the one sequence running them (:func:`run_cells`)."""
from __future__ import annotations

import functools
import os
import socket
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from torch.utils.data import Subset

from ..config import cache_dir, check_device, data_root_for, dataset_label, dataset_of_label
from ..identity import (annotation_stamp, canonical_json, dataset_identity, hash_json, load_file_digests,
                        save_file_digests)
from ..data import evaluation_subset
from ..analysis.protocol import (condition_target, list_conditions, protocol_cells, SEEDLESS_CONDITIONS,
                                 with_band_check)
from ..analysis.related import RELATED_CONDITIONS
from ..backbones import comparison_backbones
from ..scorers import list_scorer_conditions
from ..point import Point
from ..sweeps import ExecutorKind, ResultStore, run_sweep, StoreStatus, submit_sweep, SweepCell
from .base import StudyBase
from .settings import grid_spans, protocol_settings, SweepSettings

__all__ = ["make_grid", "grid_spans", "checkpoint_spec_id", "eval_data_id", "cached_study", "study_overrides",
           "ProtocolCellRunner", "prefetch_targets", "run_cells", "CATALOGUE", "catalogue_value", "sweep_cells"]


def _data_root_for(profile: Mapping[str, Any], dataset: str) -> str | None:
    """:func:`midas_nb.config.data_root_for`, resolved, as a string."""
    root = data_root_for(dict(profile), dataset)
    return None if root is None else str(root.resolve())


def study_overrides(profile: Mapping[str, Any], dataset: str, backbone: str) -> dict[str, Any]:
    """The overrides of one cell's study (``dataset``: a name or label) with its root; ``ValueError``: no root."""
    dataset = dataset_of_label(dataset)
    overrides = {k: v for k, v in profile.items() if k not in ("profile", "data_root", "data_roots")}
    overrides.update(dataset=dataset, backbone=backbone, data_root=_data_root_for(profile, dataset), data_roots={})
    return overrides


_PROCESS_CACHE: dict[str, Any] = {}


def cached_study(profile: Mapping[str, Any], dataset: str, backbone: str, device: str | None = None,
                 progress: bool = False, build: int | None = None):
    """The (per-process cached) :class:`StudyBase` for one dataset (name or label), backbone and build."""
    overrides = study_overrides(profile, dataset, backbone)
    overrides.update({k: v for k, v in dict(device=device, build=build).items() if v is not None})
    name = str(profile.get("profile", "quick"))
    key = "study:" + canonical_json([name, overrides])
    if (cached := _PROCESS_CACHE.get(key)) is None or cached[1] != annotation_stamp(cached[0].data_root):
        st = StudyBase(name, progress=progress, **overrides)
        cached = _PROCESS_CACHE[key] = (st, annotation_stamp(st.data_root))
    return cached[0]


def _digest_memo(profile: Mapping[str, Any], dataset: str) -> Path:
    """Where the sweep jobs of ``dataset`` share its image digests."""
    return cache_dir() / "file_digests" / f"{dataset}-{hash_json([dataset, _data_root_for(profile, dataset)], 12)}.json"


def checkpoint_spec_id(profile: Mapping[str, Any], dataset: str, backbone: str, build: int | None = None) -> str:
    """Id of the checkpoint a profile implies for ``(dataset, backbone, build)``, nothing trained (decisions 0051,
    0072): numerics of the profile's ``device``. Raises ``ValueError``/``FileNotFoundError``: no readable data root."""
    study = cached_study(profile, dataset, backbone, device="cpu", build=build)
    device = str(profile.get("device") or "cpu")
    return study.checkpoint_id if device == "cpu" else study.checkpoint_key(device=device)[0]


def eval_data_id(study: Any, settings: Mapping[str, Any]) -> str:
    """:attr:`SweepCell.data_id`: the identity of the test images a run of ``study`` with ``settings`` evaluates."""
    test = study.test_set
    idx = evaluation_subset(len(test), settings.get("max_eval_images"), settings.get("eval_subset_seed", 0))
    return dataset_identity(test if len(idx) == len(test) else Subset(test, idx)).full


def make_grid(profile: Mapping[str, Any], kind: str = "regime", *, datasets: Sequence[str] | None = None,
              backbones: Sequence[str] | None = None, conditions: Sequence[str] | None = None,
              seeds: Sequence[int] | None = None, checkpoint_ids: Mapping[tuple, str] | None = None,
              params: Mapping[str, Any] | None = None, seedless_conditions: Sequence[str] = SEEDLESS_CONDITIONS,
              data_ids: Mapping[tuple[str, str], str] | None = None, planned: bool = False) -> list[SweepCell]:
    """A sweep's cells, ordered dataset, backbone, point, condition, seed. Points by ``kind``: ``"depth"``
    (``depths`` at ``budget``), ``"budget"``, ``"cross"`` (both), ``"full"`` (``depths × budgets``), ``"regime"``
    (the profile's ``regime_grid``), ``"scale"`` (its point, :func:`grid_spans`' backbones). ``seeds`` at the
    profile's point, ``sweep_seeds`` elsewhere (``seedless_conditions``: the first); ``builds`` of its backbone at
    its point (decision 0072). Given lists override the profile's; ``checkpoint_ids``/``data_ids``: ``{(dataset,
    backbone[, build]): id}`` (default :func:`checkpoint_spec_id`, :func:`eval_data_id`); ``params`` enter every
    cell's; ``planned``: no data read, placeholder ids. ``ValueError``: unknown ``kind``, an empty or duplicated
    list, a dataset without a data root."""
    prof = dict(profile)
    sweep = SweepSettings.of(prof)
    kind = sweep.regime_grid if kind == "regime" else kind
    L0, b0 = (own := Point(prof["depth"], prof["budget"])).depth, own.budget.keyed()
    depths, budgets = list(sweep.depths), [b.keyed() for b in sweep.budgets]
    shapes = {"depth": [(L, b0) for L in depths], "budget": [(L0, b) for b in budgets],
              "full": [(L, b) for L in depths for b in budgets], "scale": [(L0, b0)]}
    shapes["cross"] = shapes["depth"] + shapes["budget"]
    if kind not in shapes:
        raise ValueError(f"unknown grid kind {kind!r}; expected one of {[*shapes, 'regime']}")
    points = list(dict.fromkeys(Point(L, b) for L, b in shapes[kind]))  # drop the shared point
    spans = grid_spans(prof, kind)
    datasets, backbones = spans[0] if datasets is None else datasets, spans[1] if backbones is None else backbones
    # with the random ranking where the protocol has it (the band's check)
    conditions = list(with_band_check(sweep.conditions, prof["conditions"]) if conditions is None else conditions)
    off_seeds = list(sweep.seeds) if seeds is None else [int(s) for s in seeds]
    seeds = [int(s) for s in (prof["seeds"] if seeds is None else seeds)]
    for name, values in dict(datasets=datasets, backbones=backbones, conditions=conditions,
                             seeds=seeds, sweep_seeds=off_seeds, depths=depths, budgets=budgets).items():
        if len(values) == 0:
            raise ValueError(f"make_grid: {name} is empty; expected at least one entry")
        if len(set(values)) != len(values):
            raise ValueError(f"make_grid: {name} has duplicates: {list(values)}")
    checkpoint_ids, data_ids = checkpoint_ids or {}, data_ids or {}
    base, own_build, cells = dict(protocol_settings(prof), **dict(params or {})), int(prof.get("build", 0)), []
    for ds in datasets:
        label = dataset_label(dict(prof), ds)
        for bb in backbones:
            data_id = "planned" if planned else data_ids.get((ds, bb)) or eval_data_id(
                cached_study(prof, ds, bb, device="cpu"), base)
            for pt in points:
                at = seeds if pt == Point(L0, b0) else off_seeds
                main = pt == Point(L0, b0) and bb == prof["backbone"]
                for k in range(own_build, own_build + int(prof.get("builds", 1))) if main else [own_build]:
                    ckpt = f"planned-{k}" if planned else checkpoint_ids.get((ds, bb, k)) or (
                        checkpoint_ids.get((ds, bb)) if k == own_build else None) or checkpoint_spec_id(prof, ds, bb, k)
                    cells += [SweepCell(label, bb, pt.depth, pt.budget, cond, s, checkpoint_id=ckpt,
                                        params=dict(base, build=k) if k else base, data_id=data_id)
                              for cond in conditions for s in (at[:1] if cond in seedless_conditions else at)]
    return cells


_POINT = dict(kind="scale", datasets="own", backbones="own", conditions="profile", seeds="profile", relaxation="st")

#: Every notebook sweep, declared once (decision 0077; notebooks: :data:`midas_nb.config.SWEEPS`): its parts, each a
#: :func:`make_grid` ``kind`` with symbolic lists (:func:`catalogue_value`; "related others": 06's systems the
#: protocol lacks), ``builds`` and ``relaxation``; absent: the grid's, :func:`make_grid`'s or the profile's.
CATALOGUE: dict[str, tuple[dict[str, Any], ...]] = {
    "protocol": (_POINT,),
    "soft": (dict(_POINT, conditions=("reference", "unsupervised", "T5", "random"), seeds="first", builds=1,
                  relaxation="soft"),),
    "random": (dict(_POINT, conditions=("random",)),),
    "regime": (dict(kind="regime"),),
    "scale": (dict(kind="scale"),),
    "backbones": (dict(kind="regime", datasets="own", backbones="compare"),),
    "related": (dict(_POINT, conditions="related"),
                dict(_POINT, conditions="related others", seeds="related", builds=1)),
}


def catalogue_value(prof: Mapping[str, Any], what: str, value: Any, given: Sequence[str] | None = None) -> Any:
    """A catalogue entry's symbolic ``value`` of ``what`` as :func:`make_grid` takes it; a "related" rule splits
    ``given`` conditions (default :data:`~midas_nb.analysis.related.RELATED_CONDITIONS`; unknown ones dropped)."""
    if not isinstance(value, str):
        return None if value is None else list(value)
    if value.startswith("related") and what == "conditions":
        known = with_band_check([c for c in given or RELATED_CONDITIONS if c in list_conditions()], prof["conditions"])
        return [c for c in known if (c in prof["conditions"]) == (value == "related")]
    return dict(own=[prof.get("dataset" if what == "datasets" else "backbone")], profile=prof.get(what),
                first=list(prof["seeds"])[:1], related=list(SweepSettings.of(prof).related_seeds),
                compare=comparison_backbones(dict(prof)))[value]


def sweep_cells(profile: Mapping[str, Any], name: str, *, planned: bool = False,
                params: Mapping[str, Any] | None = None, **given: Any) -> list[SweepCell]:
    """The cells of the :data:`CATALOGUE`'s sweep ``name`` (else the :func:`make_grid` kind) of a profile; ``given``
    (``builds``, ``relaxation``, :func:`make_grid` keywords; ``None`` ignored) overrides the catalogue's (a "related"
    part's ``conditions`` split by its rule; an empty part dropped). ``ValueError`` as :func:`make_grid`."""
    prof = dict(profile)
    cells: list[SweepCell] = []
    for part in CATALOGUE.get(name, (dict(kind=name),)):
        kw = dict(part, **{k: v for k, v in given.items() if v is not None})
        if str(part.get("conditions")).startswith("related"):   # 06: the given conditions split as the catalogue's
            kw["conditions"] = catalogue_value(prof, "conditions", part["conditions"], given.get("conditions"))
            if not kw["conditions"]:
                continue
        kind, builds, relaxation = kw.pop("kind"), kw.pop("builds", None), kw.pop("relaxation", None)
        p = dict(prof, builds=int(prof.get("builds", 1) if builds is None else builds))
        if kind == "scale":
            p.update(depths=[p["depth"]], budgets=[p["budget"]])
        kw.update({k: catalogue_value(p, k, kw.get(k)) for k in ("datasets", "backbones", "conditions", "seeds")})
        kw["params"] = dict(params or {}, **({} if relaxation is None else dict(relaxation=relaxation))) or None
        if planned:  # every dataset a root that is never read: labels without data
            names = {*grid_spans(p, kind)[0], *(kw["datasets"] or ()), p["dataset"]} - {"synthetic"}
            p.update(data_root=None, data_roots=dict.fromkeys(names, "."))
        cells += make_grid(p, kind, planned=planned, **kw)
    return cells


_load_memo = functools.cache(load_file_digests)


class ProtocolCellRunner:
    """The protocol's ``cell_fn`` (picklable): ``run_protocol`` at the cell's point, condition, seed and ``params``
    on the cell's :func:`cached_study` (or ``study``, reused in this process only)."""

    def __init__(self, profile: Mapping[str, Any], *, cache_dir: str | Path | None = None, progress: bool = False,
                 study: Any = None) -> None:
        self.profile, self.progress, self._local_study = dict(profile), progress, study  # the study is not pickled
        self.cache_dir = str(cache_dir) if cache_dir is not None else None

    def __getstate__(self) -> dict[str, Any]:
        return dict(self.__dict__, _local_study=None)

    def study(self, cell: SweepCell):
        """The study of the cell's data and backbone (image digests from the shared memo, once)."""
        st, build = self._local_study, int(cell.params.get("build", 0))
        if st is not None and (st.dataset_name, st.settings.backbone.name, st.settings.backbone.build) == \
                (cell.dataset, cell.backbone, build):
            return st
        device = str(self.profile.get("device") or "cpu")
        if problems := check_device(device):
            job = os.environ.get("SLURM_JOB_ID")
            raise RuntimeError(f"this worker ({socket.gethostname()}{f', Slurm job {job}' if job else ''}) cannot run "
                               f"the sweep's device {device!r}: {problems[0].split('; use')[0]}; submit the cells to "
                               "GPU nodes (midas-nb sweep submit --gpus 1 --partition <a GPU partition>) or "
                               "with --device cpu")
        _load_memo(_digest_memo(self.profile, cell.dataset))
        return cached_study(self.profile, cell.dataset, cell.backbone, None, self.progress, build)

    def prepare(self, cell: SweepCell) -> dict[str, Any]:
        """A preparation job: fine-tune (or load) the backbone, save the image digests for the cell jobs."""
        meta = self.study(cell).meta
        save_file_digests(_digest_memo(self.profile, cell.dataset))
        return dict(checkpoint_id=meta.get("checkpoint_id"), loaded_from_cache=bool(meta.get("loaded_from_cache")))

    def __call__(self, cell: SweepCell) -> dict[str, Any]:
        return self.run_group([cell])[0]

    def group_key(self, cell: SweepCell) -> str:
        """Cells of one key are computed together: same data, checkpoint and settings (a scorer family's: alone)."""
        return cell.key if cell.condition in list_scorer_conditions() else canonical_json(
            [cell.dataset, cell.backbone, cell.checkpoint_id, cell.data_id, cell.params])

    def run_group(self, cells: Sequence[SweepCell]) -> list[dict[str, Any]]:
        """The row of each cell (of one :meth:`group_key`) from one ``protocol_cells`` call (decision 0069); ValueError
        (several groups; a checkpoint or data id other than the data's here), RuntimeError (no device)."""
        cell = cells[0]
        if len({self.group_key(c) for c in cells}) > 1:
            raise ValueError(f"run_group: the cells {[c.label for c in cells][:3]}... are not of one group")
        study = self.study(cell)  # a cell keyed by other data or another recipe is never filled
        if cell.checkpoint_id and cell.checkpoint_id != study.checkpoint_id:
            raise ValueError(f"cell {cell.label} was keyed by checkpoint {cell.checkpoint_id!r} but the data, "
                             f"recipe and training numerics (precision, CPU threads) here give "
                             f"{study.checkpoint_id!r}; rebuild the grid")
        settings = dict(protocol_settings(self.profile), **cell.params)
        if cell.data_id and cell.data_id != (now := eval_data_id(study, settings)):
            raise ValueError(f"cell {cell.label} was keyed by evaluation data {cell.data_id!r} but the evaluated test "
                             f"images now are {now!r} (images, labels, keypoints or boxes changed); rebuild the grid")
        settings = {k: v for k, v in settings.items() if k not in ("image_size", "patch_size", "build")}  # keyed only
        settings |= {} if self.cache_dir is None else dict(cache_dir=self.cache_dir)
        table = protocol_cells(
            study.train_set, study.test_set, study.model,
            cells=[(c.depth, c.budget, c.condition, c.seed) for c in cells], dataset_name=study.dataset_name,
            backbone_name=cell.backbone, checkpoint_id=str(study.meta.get("checkpoint_id", "")), device=study.device,
            progress=self.progress, **settings,
            prefetch_targets={c.depth: prefetch_targets(self.profile, cell.backbone, c.depth) for c in cells}
        ).assign(build=study.settings.backbone.build)
        return table.to_dict(orient="records")


def prefetch_targets(profile: Mapping[str, Any], backbone: str, depth: int) -> list[str]:
    """Target ids whose train-split maps a cell of ``(backbone, depth)`` computes in its capture pass:
    all the profile's ``targets`` at its own backbone and depth, elsewhere those the swept conditions distil."""
    targets = list(profile.get("targets") or ())
    if backbone == profile.get("backbone") and int(depth) == int(profile.get("depth", -1)):
        return targets
    swept = {condition_target(c) for c in profile.get("sweep_conditions") or profile.get("conditions") or ()
             if c != "reference"}                                # the reference reads attention, no map
    return [t for t in targets if t in swept]


def run_cells(profile: Mapping[str, Any], cells: Sequence[SweepCell], *, run: bool = True, wait: bool = True,
              executor: ExecutorKind = "local", slurm: Mapping[str, Any] | None = None, progress: bool = False,
              study: Any = None, store: ResultStore | None = None, runner: Callable | None = None) -> Any:
    """The one sequence of every sweep: ``(rows of the done cells, StoreStatus)`` of ``cells`` in the profile's store
    (or ``store``), computed by ``runner`` (default a :class:`ProtocolCellRunner` reusing ``study``) unless
    ``run=False``; ``wait=False`` (Slurm) returns the :class:`midas_nb.sweeps.Submission` at once."""
    prof = dict(profile)
    slurm = {k: v for k, v in (slurm or {}).items() if v is not None}    # None: a setting not given
    if str(prof.get("device")).startswith("cuda") and not {"gpus", "gpus_per_node", "slurm_gres"} & set(slurm):
        slurm["gpus_per_node"] = 1      # a Slurm job of cuda cells asks for one GPU unless told otherwise
    store = store or ResultStore(name=prof["profile"])
    runner = runner or ProtocolCellRunner(prof, study=study, progress=progress)
    if run and not wait:
        return submit_sweep(cells, runner, store, slurm=slurm)
    status = (run_sweep(cells, runner, store, executor=executor, slurm=slurm, progress=progress) if run
              else StoreStatus(store.status(cells)))
    rows = store.results(cells)
    rows.attrs.clear()
    return rows, status
