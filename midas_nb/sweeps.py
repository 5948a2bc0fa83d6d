"""Regime sweeps and scale sensitivity that resume after interruption and scale out to Slurm.

A *sweep* is a grid of cells over dataset × backbone × depth ``L`` × budget ``b`` ×
condition × seed (DESIGN.md §5, §7–8); each cell is one run of the three-condition protocol
(:func:`midas_nb.protocol.run_protocol` for one condition and one seed) and yields result
rows. The MIDAS paper grid is ``L ∈ {3,6,9,11}`` × ``b ∈ {0.10,0.25,0.50,0.75}`` × all
conditions × 3 seeds × {CUB, Aircraft, Cars} × {DeiT-Ti/16, DeiT-S/16, AugReg ViT-B/16};
profiles pick smaller grids (:func:`make_grid`).

Three pieces, each usable alone:

- :class:`SweepCell` — one cell; its :attr:`SweepCell.key` is a hash of every parameter that
  changes the result (including the backbone checkpoint id and the protocol settings), so
  a changed setting is a new cell and never reads a stale record.
- :class:`ResultStore` — one JSON record per finished (or failed) cell under
  ``runs/sweeps/<name>/cells/<key>.json``, written atomically (temporary file in the same
  directory, ``fsync``, ``os.replace``). A killed writer leaves at most a temporary file,
  which is reported and never read as a result.
- :func:`run_sweep` — skips finished cells, (re)computes missing or failed ones, records a
  failing cell's error and traceback without stopping the others. The worker that computes a
  cell writes its record itself, so a killed parent loses nothing finished. Executors:
  ``local`` (in-process loop), ``processes`` (:class:`concurrent.futures.ProcessPoolExecutor`)
  and ``slurm`` (submitit's ``AutoExecutor``; ``slurm={"cluster": "debug"}`` or ``"local"``
  runs the same code path without a cluster).

:class:`ProtocolCellRunner` is the real ``cell_fn``: it loads the dataset and the fine-tuned
backbone through the cached loaders (once per process) and runs the protocol for one cell.
:func:`scale_readout` runs the same readout (protocol at the profile's ``L`` and ``b``) for a
list of backbones through the same store.

Example::

    >>> prof = get_profile("quick")
    >>> cells = make_grid(prof, "regime")            # L sweep at b=25% + b sweep at L=6
    >>> status = run_sweep(cells, ProtocolCellRunner(prof), ResultStore(name="quick"))
    >>> print(status)                                # done / failed / pending, with errors
    >>> table = ResultStore(name="quick").results()  # one row per condition × seed × cell
"""
from __future__ import annotations

import concurrent.futures as cf
import json
import math
import multiprocessing
import os
import socket
import sys
import time
import traceback
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Literal, Mapping, Sequence

import pandas as pd

from .config import data_root_for, dataset_label, get_profile, grid_datasets, runs_dir
from .identity import RESULT_FORMAT_VERSION, annotation_stamp, atomic_write_text, canonical_json, hash_json
from .identity import _jsonable  # noqa: F401 - the records' JSON fallback, shared with the hashes

__all__ = [
    "GridKind",
    "ExecutorKind",
    "CellState",
    "PAPER_DATASETS",
    "SEEDLESS_CONDITIONS",
    "SweepCell",
    "make_grid",
    "grid_spans",
    "checkpoint_spec_id",
    "resolve_checkpoint_ids",
    "ResultStore",
    "StoreStatus",
    "atomic_write_text",
    "run_sweep",
    "run_cell",
    "ProtocolCellRunner",
    "scale_readout",
    "sweep_status",
    "sweep_status_report",
    "format_status",
    "main_status",
]

GridKind = Literal["depth", "budget", "cross", "full", "regime", "scale"]
ExecutorKind = Literal["local", "processes", "slurm"]
CellState = Literal["done", "failed", "running", "pending"]

#: datasets of the paper grid (DESIGN.md §7), used when a ``paper`` profile names no ``datasets``
PAPER_DATASETS: tuple[str, ...] = ("cub", "aircraft", "cars")

#: conditions without trainable parameters: their result does not depend on the seed
SEEDLESS_CONDITIONS: tuple[str, ...] = ("reference",)

RECORD_FORMAT = "midas_nb.sweep_record/1"
_TMP_SUFFIX = ".tmp"
_RUNNING_SUFFIX = ".running"

# protocol settings that enter every cell's key (and are read back by ProtocolCellRunner)
_PROTOCOL_DEFAULTS: dict[str, Any] = dict(relaxation="st", lam=1.0, temperature=1.0)


# ----------------------------------------------------------------------------------------------
# cells and grids
# ----------------------------------------------------------------------------------------------

def _canonical_json(obj: Any) -> str:
    """Deterministic JSON (sorted keys, no whitespace) used for hashing
    (:func:`midas_nb.identity.canonical_json`)."""
    return canonical_json(obj)


def _short_hash(obj: Any, n: int = 16) -> str:
    return hash_json(obj, n)


@dataclass(frozen=True)
class SweepCell:
    """One cell of a sweep: one protocol run for one (dataset, backbone, L, b, condition, seed).

    Attributes:
        dataset: dataset name (``"cub"``, ``"aircraft"``, ``"cars"``, ``"synthetic"``).
        backbone: backbone name as understood by :func:`midas_nb.backbones.load_or_finetune`.
        depth: scorer depth ``L`` (1-based; the scorer reads the output of block ``L``).
        budget: kept fraction ``b ∈ (0, 1]`` of patch tokens.
        condition: protocol condition (``"reference"``, ``"unsupervised"`` or a target id).
        seed: scorer seed.
        checkpoint_id: id of the fine-tuned backbone checkpoint the cell's result depends on
            (see :func:`checkpoint_spec_id`); part of :attr:`key`.
        params: further JSON-serialisable settings that change the result (protocol
            hyper-parameters, image size, ...); part of :attr:`key`. Not part of ``hash()``.
        data_id: content identity of the evaluated test images — their bytes, labels, part
            keypoints and boxes, transform (:func:`eval_data_id`); part of :attr:`key`, so
            editing one keypoint of an evaluated test image makes the cells of that dataset
            new cells, while the checkpoint (and the target and scorer caches) stay valid.
    """

    dataset: str
    backbone: str
    depth: int
    budget: float
    condition: str
    seed: int
    checkpoint_id: str = ""
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    data_id: str = ""

    def __post_init__(self) -> None:
        # normalise types so that equal cells hash equally (e.g. numpy ints, 0.25 vs 0.2500000001)
        object.__setattr__(self, "depth", int(self.depth))
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "budget", round(float(self.budget), 6))
        object.__setattr__(self, "params", json.loads(_canonical_json(dict(self.params))))
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1 (1-based block index), got {self.depth}")
        if not (0.0 < self.budget <= 1.0):
            raise ValueError(f"budget must be in (0, 1], got {self.budget}")

    def to_dict(self) -> dict[str, Any]:
        """Plain dict of all fields (JSON-serialisable)."""
        d = asdict(self)
        d["params"] = dict(self.params)
        return d

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SweepCell":
        """Inverse of :meth:`to_dict`."""
        return cls(**{k: d[k] for k in ("dataset", "backbone", "depth", "budget", "condition", "seed")},
                   checkpoint_id=d.get("checkpoint_id", ""), params=d.get("params", {}),
                   data_id=d.get("data_id", ""))

    @property
    def key(self) -> str:
        """Stable 16-hex-digit key: SHA-256 of the canonical JSON of every field and of
        :data:`midas_nb.identity.RESULT_FORMAT_VERSION` (a changed metric definition makes
        every cell new)."""
        return _short_hash(dict(self.to_dict(), result_format=RESULT_FORMAT_VERSION))

    @property
    def label(self) -> str:
        """Readable short name, e.g. ``cub/hybrid_lite0_vit L6 b0.25 T5 s0``."""
        return (f"{self.dataset}/{self.backbone} L{self.depth} b{self.budget:g} "
                f"{self.condition} s{self.seed}")


def _spec_of(study: Any) -> str:
    """``"spec-"`` + the hash of a study's checkpoint key without the training numerics."""
    _, key = study.checkpoint_key()
    return "spec-" + _short_hash({k: v for k, v in key.items() if k != "numerics"}, 12)


def checkpoint_spec_id(profile: Mapping[str, Any], dataset: str, backbone: str) -> str:
    """Id of the fine-tuned checkpoint a profile implies for ``(dataset, backbone)``, by content.

    ``"spec-"`` + the hash of :func:`midas_nb.backbones.checkpoint_key` (model, initial
    weights, recipe, and the content of both splits: image bytes, labels, split, transform —
    :func:`midas_nb.identity.dataset_identity`) without the training numerics (precision,
    thread count), so the id is the same on a login node and on the worker that trains. Nothing
    is trained; the datasets' annotations are parsed and their image files hashed (memoised per
    process). Moving the data keeps the id; replacing an image or a label changes it; part
    keypoints do not enter it (training never reads them; they enter the cell's ``data_id``).
    The real checkpoint id and the weights digest are stored in every result row
    (``checkpoint_id``, ``weights_digest``).

    Raises:
        ValueError, FileNotFoundError: the dataset has no data root, or it cannot be read.
    """
    return _spec_of(_study(dict(profile), dataset, backbone))


def _eval_identity(study: Any, settings: Mapping[str, Any]) -> str:
    """:attr:`~midas_nb.identity.DatasetIdentity.full` of the test images a protocol run with
    ``settings`` evaluates (:func:`midas_nb.protocol.evaluation_subset`)."""
    from torch.utils.data import Subset

    from .identity import dataset_identity
    from .protocol import evaluation_subset

    test = study.test_set
    idx = evaluation_subset(len(test), settings.get("max_eval_images"), settings.get("eval_subset_seed", 0))
    return dataset_identity(test if len(idx) == len(test) else Subset(test, idx)).full


def eval_data_id(profile: Mapping[str, Any], dataset: str, backbone: str,
                 settings: Mapping[str, Any] | None = None) -> str:
    """Content identity of the test images a cell evaluates (the test split with the backbone's
    transform, restricted to the evaluated subset of ``settings``' ``max_eval_images`` /
    ``eval_subset_seed``; default the profile's protocol settings):
    :attr:`midas_nb.identity.DatasetIdentity.full` — images, labels, part keypoints, boxes,
    transform. Enters :attr:`SweepCell.data_id`: a keypoint of an evaluated image changes it,
    one of an image outside the subset does not."""
    prof = dict(profile)
    return _eval_identity(_study(prof, dataset, backbone), _protocol_params(prof) if settings is None else settings)


def resolve_checkpoint_ids(profile: str | Mapping[str, Any], datasets: Sequence[str],
                           backbones: Sequence[str]) -> dict[tuple[str, str], str]:
    """Real checkpoint ids ``{(dataset, backbone): id}`` without training anything.

    Parses each dataset and hashes its content, then the fine-tuning key exactly as
    :func:`midas_nb.backbones.load_or_finetune` does (:meth:`midas_nb.study.Study.checkpoint_key`).
    """
    prof = get_profile(profile) if isinstance(profile, str) else dict(profile)
    return {(ds, bb): _study(prof, ds, bb).checkpoint_key()[0] for ds in datasets for bb in backbones}


# cell params that describe the data, not run_protocol arguments
_DATA_PARAMS = ("image_size", "patch_size")


def _protocol_params(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's settings that change a protocol run's result; they enter every cell's key
    and :class:`ProtocolCellRunner` passes them (less ``image_size``/``patch_size``) to
    :func:`midas_nb.protocol.run_protocol`: ``relaxation``, ``lam``, ``temperature`` (profile
    keys, default ``"st"``, 1, 1), every ``scorer_train`` key (``epochs``, ``batch_size``,
    ``lr``, ...), ``idauc_steps``, ``max_eval_images``, ``max_idauc_images``, ``bootstrap``."""
    out = {k: profile.get(k, v) for k, v in _PROTOCOL_DEFAULTS.items()}
    out.update(dict(profile.get("scorer_train") or {}))
    for k in ("idauc_steps", "max_eval_images", "max_idauc_images", "bootstrap") + _DATA_PARAMS:
        if k in profile:
            out[k] = profile[k]
    return out


def _is_paper(profile: Mapping[str, Any]) -> bool:
    return profile.get("profile") == "paper"


def grid_spans(profile: str | Mapping[str, Any], kind: GridKind = "regime") -> tuple[list[str], list[str]]:
    """``(datasets, backbones)`` a sweep of ``kind`` spans for a profile (see :func:`make_grid`):
    datasets = the profile's ``datasets`` key (:data:`PAPER_DATASETS` for ``paper`` without
    one), else ``[dataset]``; backbones = ``scale_backbones`` for ``kind="scale"``, else the
    profile's ``backbones`` key, else ``scale_backbones`` for ``paper``, else ``[backbone]``.
    Nothing is read; data roots are not resolved."""
    prof = get_profile(profile) if isinstance(profile, str) else dict(profile)
    datasets = list(PAPER_DATASETS) if _is_paper(prof) and not prof.get("datasets") else grid_datasets(prof)
    if kind == "scale":
        backbones = list(prof.get("scale_backbones") or [prof["backbone"]])
    else:
        backbones = list(prof.get("backbones") or (
            prof["scale_backbones"] if _is_paper(prof) and prof.get("scale_backbones") else [prof["backbone"]]))
    return datasets, backbones


def make_grid(
    profile: str | Mapping[str, Any],
    kind: GridKind = "regime",
    *,
    datasets: Sequence[str] | None = None,
    backbones: Sequence[str] | None = None,
    conditions: Sequence[str] | None = None,
    seeds: Sequence[int] | None = None,
    checkpoint_ids: Mapping[tuple[str, str], str] | Literal["spec", "resolve"] = "spec",
    params: Mapping[str, Any] | None = None,
    seedless_conditions: Sequence[str] = SEEDLESS_CONDITIONS,
    data_ids: Mapping[tuple[str, str], str] | None = None,
) -> list[SweepCell]:
    """The cells of a sweep for a profile.

    Points ``(L, b)`` by ``kind`` (profile keys ``depth``, ``budget``, ``depths``, ``budgets``):

    - ``"depth"``  — ``L ∈ depths`` at ``b = budget``;
    - ``"budget"`` — ``b ∈ budgets`` at ``L = depth``;
    - ``"cross"``  — the union of the two (the shared point ``(depth, budget)`` once):
      ``len(depths) + len(budgets) − 1`` points when ``depth ∈ depths`` and ``budget ∈ budgets``;
    - ``"full"``   — ``depths × budgets``;
    - ``"regime"`` — the profile's default: ``"full"`` for ``paper``, ``"cross"`` otherwise;
    - ``"scale"``  — the single point ``(depth, budget)`` for every backbone in
      ``scale_backbones``.

    Each point is crossed with conditions (default: the profile's ``sweep_conditions``, else
    its ``conditions``) × seeds × datasets × backbones, except that a
    condition without trainable parameters (``seedless_conditions``, default ``reference``:
    the T0 scorer, whose evaluation does not depend on the seed) gets only the first seed —
    :func:`midas_nb.metrics.decoupling_D` compares other seeds with its mean, which is then
    the same value. Per point that is ``(C − R)·S + R`` cells for ``C`` conditions of which
    ``R`` are seedless and ``S`` seeds. Datasets default to
    the profile's ``datasets`` key, else :data:`PAPER_DATASETS` for the ``paper`` profile,
    else ``[dataset]``; backbones to ``scale_backbones`` for ``kind="scale"``, else the
    profile's ``backbones`` key, else ``scale_backbones`` for ``paper``, else ``[backbone]``.
    Each dataset's root is ``data_roots[name]`` (or ``data_root`` for the profile's own
    dataset); a dataset without one is an error (:func:`midas_nb.config.data_root_for`), except
    the embedded synthetic set where it applies (named ``"synthetic"``, or CUB in smoke/quick
    without any data root), whose cells are labelled ``"synthetic"`` as
    :func:`midas_nb.study.resolve_data` labels it.

    Args:
        profile: a profile name or dict (:func:`midas_nb.config.get_profile`).
        kind: grid shape (above).
        datasets, backbones, conditions, seeds: override the profile's lists.
        checkpoint_ids: ``"spec"`` (default, :func:`checkpoint_spec_id`: content-based, nothing
            is trained), ``"resolve"`` (:func:`resolve_checkpoint_ids`: the real ids) or an
            explicit ``{(dataset, backbone): checkpoint_id}``.
        data_ids: explicit ``{(dataset, backbone): data_id}``; default :func:`eval_data_id`
            (the evaluated split's content). With explicit ``checkpoint_ids`` and ``data_ids``
            no dataset is read.
        params: extra settings merged into every cell's ``params`` (they enter the key).
        seedless_conditions: conditions computed for the first seed only (``()``: every seed).

    Returns:
        Cells ordered dataset, backbone, point, condition, seed (no duplicates).

    Raises:
        ValueError: unknown ``kind``; empty lists; duplicated entries; a dataset without a
            data root (see above).
    """
    prof = get_profile(profile) if isinstance(profile, str) else dict(profile)
    if kind == "regime":
        kind = "full" if _is_paper(prof) else "cross"
    L0, b0 = int(prof["depth"]), float(prof["budget"])
    depths = [int(x) for x in prof.get("depths", [L0])]
    budgets = [float(x) for x in prof.get("budgets", [b0])]
    if kind == "depth":
        points = [(L, b0) for L in depths]
    elif kind == "budget":
        points = [(L0, b) for b in budgets]
    elif kind == "cross":
        points = [(L, b0) for L in depths] + [(L0, b) for b in budgets]
    elif kind == "full":
        points = [(L, b) for L in depths for b in budgets]
    elif kind == "scale":
        points = [(L0, b0)]
    else:
        raise ValueError(f"unknown grid kind {kind!r}; expected one of "
                         "'depth', 'budget', 'cross', 'full', 'regime', 'scale'")
    points = list(dict.fromkeys((L, round(b, 6)) for L, b in points))  # drop the shared point

    span_datasets, span_backbones = grid_spans(prof, kind)
    datasets = span_datasets if datasets is None else datasets
    backbones = span_backbones if backbones is None else backbones
    if conditions is None:  # a profile may sweep fewer conditions than its protocol table shows
        conditions = prof.get("sweep_conditions") or prof["conditions"]
    conditions = list(conditions)
    seeds = [int(s) for s in (prof["seeds"] if seeds is None else seeds)]
    for name, values in dict(datasets=datasets, backbones=backbones, conditions=conditions,
                             seeds=seeds, depths=depths, budgets=budgets).items():
        if len(values) == 0:
            raise ValueError(f"make_grid: {name} is empty; expected at least one entry")
        if len(set(values)) != len(values):
            raise ValueError(f"make_grid: {name} has duplicates: {list(values)}")

    if checkpoint_ids == "resolve":
        checkpoint_ids = resolve_checkpoint_ids(prof, datasets, backbones)
    elif checkpoint_ids == "spec":
        checkpoint_ids = {}
    elif not isinstance(checkpoint_ids, Mapping):
        raise ValueError(f"checkpoint_ids must be 'spec', 'resolve' or a dict, got {checkpoint_ids!r}")
    if data_ids is not None and not isinstance(data_ids, Mapping):
        raise ValueError(f"data_ids must be None or a dict {{(dataset, backbone): id}}, got {data_ids!r}")
    base = dict(_protocol_params(prof), **dict(params or {}))
    cells = []
    for ds in datasets:
        label = _dataset_label(prof, ds)
        for bb in backbones:
            ckpt = checkpoint_ids.get((ds, bb)) or checkpoint_spec_id(prof, ds, bb)
            data_id = (data_ids or {}).get((ds, bb)) or eval_data_id(prof, ds, bb, base)
            for L, b in points:
                for cond in conditions:
                    for s in (seeds[:1] if cond in seedless_conditions else seeds):
                        cells.append(SweepCell(label, bb, L, b, cond, s, checkpoint_id=ckpt, params=base,
                                               data_id=data_id))
    return cells


# ----------------------------------------------------------------------------------------------
# the result store
# ----------------------------------------------------------------------------------------------

def _rows_of(out: Any) -> list[dict[str, Any]]:
    """A cell function's output as a list of row dicts."""
    if isinstance(out, pd.DataFrame):
        # through Python's own JSON (shortest repr that round-trips): floats keep every bit, so
        # a row read back from the store equals the row computed (pandas' to_json rounds to 15
        # digits); NaN stays NaN
        return json.loads(json.dumps(out.to_dict(orient="records"), default=_jsonable, allow_nan=True))
    if isinstance(out, Mapping):
        return [dict(out)]
    if isinstance(out, Iterable) and not isinstance(out, (str, bytes)):
        rows = list(out)
        if not all(isinstance(r, Mapping) for r in rows):
            raise TypeError("cell_fn must return a DataFrame, a dict or a list of dicts; "
                            f"got a list with {sorted({type(r).__name__ for r in rows})}")
        return [dict(r) for r in rows]
    raise TypeError(f"cell_fn must return a DataFrame, a dict or a list of dicts; got {type(out).__name__}")


class ResultStore:
    """A directory of per-cell JSON records: ``<root>/cells/<key>.json``.

    A record holds ``format``, ``key``, ``label``, ``cell`` (:meth:`SweepCell.to_dict`),
    ``status`` (``"done"`` or ``"failed"``), ``rows`` (the cell's result rows; empty for
    failures), ``error`` and ``traceback`` (failures), ``attempt`` (1 on the first run),
    ``started``/``finished`` (Unix seconds), ``duration_s``, ``host`` and ``pid``.
    While a worker computes a cell it keeps a ``<key>.running`` marker (host, pid, start);
    a marker without a record means "running" or, if no sweep is running, "killed".
    ``<root>/grid.json`` lists the cells ever registered by :func:`run_sweep`, so
    :func:`sweep_status` can show pending cells without the profile.

    Files that are not complete, valid records (leftover ``*.tmp`` files of a killed writer,
    truncated or foreign JSON) are ignored and listed by :meth:`problems`; a cell whose record
    is invalid counts as pending and is recomputed.

    Args:
        root: the store directory; default ``runs_dir()/"sweeps"/name``.
        name: sweep name used when ``root`` is not given.
    """

    def __init__(self, root: str | Path | None = None, *, name: str = "default") -> None:
        self.root = Path(root) if root is not None else runs_dir() / "sweeps" / name
        self.cells_dir = self.root / "cells"
        self.cells_dir.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"ResultStore({str(self.root)!r})"

    def __reduce__(self):  # pickle as the path only (workers re-open the store)
        return (ResultStore, (str(self.root),))

    # -- paths --------------------------------------------------------------------------------
    def path(self, key: str) -> Path:
        """Record path of cell ``key``."""
        return self.cells_dir / f"{key}.json"

    def running_path(self, key: str) -> Path:
        return self.cells_dir / f"{key}{_RUNNING_SUFFIX}"

    @property
    def manifest_path(self) -> Path:
        return self.root / "grid.json"

    # -- writing ------------------------------------------------------------------------------
    def write_record(self, record: Mapping[str, Any]) -> Path:
        """Write a record atomically (see :func:`atomic_write_text`); returns its path."""
        key = record["key"]
        text = json.dumps(record, default=_jsonable, allow_nan=True, indent=1)
        p = self.path(key)
        atomic_write_text(p, text)
        return p

    def _base_record(self, cell: SweepCell, started: float) -> dict[str, Any]:
        prev = self.read(cell.key)
        now = time.time()
        return dict(format=RECORD_FORMAT, key=cell.key, label=cell.label, cell=cell.to_dict(),
                    attempt=int(prev.get("attempt", 0)) + 1 if prev else 1,
                    started=started, finished=now, duration_s=now - started,
                    host=socket.gethostname(), pid=os.getpid())

    def record_done(self, cell: SweepCell, rows: list[dict[str, Any]], *, started: float) -> Path:
        """Record a finished cell with its result rows."""
        rec = self._base_record(cell, started)
        rec.update(status="done", rows=rows, error=None, traceback=None)
        return self.write_record(rec)

    def record_failed(self, cell: SweepCell, error: str, tb: str = "", *, started: float) -> Path:
        """Record a failed cell with its error text and traceback."""
        rec = self._base_record(cell, started)
        rec.update(status="failed", rows=[], error=error, traceback=tb)
        return self.write_record(rec)

    def mark_running(self, cell: SweepCell) -> None:
        """Write the ``<key>.running`` marker (host, pid, start time)."""
        atomic_write_text(self.running_path(cell.key), json.dumps(
            dict(key=cell.key, host=socket.gethostname(), pid=os.getpid(), started=time.time())))

    def clear_running(self, key: str) -> None:
        try:
            os.unlink(self.running_path(key))
        except FileNotFoundError:
            pass

    def register(self, cells: Sequence[SweepCell]) -> None:
        """Add ``cells`` to the store's ``grid.json`` (merged with the cells already listed)."""
        grid = self._read_manifest()
        grid.update({c.key: c.to_dict() for c in cells})
        atomic_write_text(self.manifest_path, json.dumps(grid, default=_jsonable, indent=1))

    # -- reading ------------------------------------------------------------------------------
    def _read_manifest(self) -> dict[str, dict]:
        try:
            grid = json.loads(self.manifest_path.read_text(encoding="utf-8"))
            return grid if isinstance(grid, dict) else {}
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return {}

    def registered_cells(self) -> list[SweepCell]:
        """The cells listed in ``grid.json`` (empty if none were registered)."""
        out = []
        for d in self._read_manifest().values():
            try:
                out.append(SweepCell.from_dict(d))
            except (KeyError, TypeError, ValueError):
                continue
        return out

    @staticmethod
    def _validate(rec: Any, key: str) -> str | None:
        """``None`` if ``rec`` is a valid record for ``key``, else the reason it is not."""
        if not isinstance(rec, dict):
            return "not a JSON object"
        if rec.get("format") != RECORD_FORMAT:
            return f"format {rec.get('format')!r} is not {RECORD_FORMAT!r}"
        if rec.get("key") != key:
            return f"key {rec.get('key')!r} does not match the file name {key!r}"
        if rec.get("status") not in ("done", "failed"):
            return f"status {rec.get('status')!r} is not 'done' or 'failed'"
        if not isinstance(rec.get("rows"), list):
            return "rows is not a list"
        if not isinstance(rec.get("cell"), dict):
            return "cell is not an object"
        return None

    def _load(self, path: Path) -> tuple[dict | None, str | None]:
        try:
            rec = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return None, None
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            return None, f"unreadable JSON ({e})"
        why = self._validate(rec, path.stem)
        return (None, why) if why else (rec, None)

    def read(self, key: str) -> dict[str, Any] | None:
        """The valid record of cell ``key``, or ``None`` (missing or invalid)."""
        rec, _ = self._load(self.path(key))
        return rec

    def scan(self) -> tuple[dict[str, dict], list[dict[str, str]]]:
        """All valid records by key, and the problems found (``path``, ``reason``)."""
        records: dict[str, dict] = {}
        problems: list[dict[str, str]] = []
        for p in sorted(self.cells_dir.iterdir()):
            if p.name.endswith(_TMP_SUFFIX):
                problems.append(dict(path=str(p), reason="leftover temporary file (a writer was "
                                     "interrupted, or one is writing now); ignored"))
            elif p.suffix == ".json":
                rec, why = self._load(p)
                if rec is None:
                    if why:
                        problems.append(dict(path=str(p), reason=f"invalid record ignored: {why}"))
                else:
                    records[p.stem] = rec
            elif p.name.endswith(_RUNNING_SUFFIX):
                continue
            else:
                problems.append(dict(path=str(p), reason="unexpected file; ignored"))
        return records, problems

    def problems(self) -> list[dict[str, str]]:
        """Files in the store that are not valid records (temporary, truncated, foreign)."""
        return self.scan()[1]

    def state(self, key: str) -> CellState:
        """``done``, ``failed``, ``running`` (marker, no record) or ``pending``."""
        rec = self.read(key)
        if rec is not None:
            return rec["status"]
        return "running" if self.running_path(key).exists() else "pending"

    def status(self, cells: Sequence[SweepCell] | None = None) -> pd.DataFrame:
        """One row per cell: its parameters, ``status`` (done/failed/running/pending),
        ``error``, ``attempt``, ``duration_s``, ``n_rows``.

        Args:
            cells: the cells to report; default the registered cells plus every cell with a
                record. ``attrs["problems"]`` holds :meth:`problems`.
        """
        records, problems = self.scan()
        if cells is None:
            by_key = {c.key: c for c in self.registered_cells()}
            for k, rec in records.items():
                if k not in by_key:
                    try:
                        by_key[k] = SweepCell.from_dict(rec["cell"])
                    except (KeyError, TypeError, ValueError):
                        continue
            cells = list(by_key.values())
        rows = []
        for c in cells:
            rec = records.get(c.key)
            if rec is not None:
                st = rec["status"]
            else:
                st = "running" if self.running_path(c.key).exists() else "pending"
            rows.append(dict(
                key=c.key, label=c.label, dataset=c.dataset, backbone=c.backbone, depth=c.depth,
                budget=c.budget, condition=c.condition, seed=c.seed, checkpoint_id=c.checkpoint_id,
                status=st,
                error=(rec or {}).get("error"),
                attempt=(rec or {}).get("attempt", 0),
                duration_s=(rec or {}).get("duration_s", math.nan),
                n_rows=len((rec or {}).get("rows", [])),
            ))
        cols = ["key", "label", "dataset", "backbone", "depth", "budget", "condition", "seed",
                "checkpoint_id", "status", "error", "attempt", "duration_s", "n_rows"]
        df = pd.DataFrame(rows, columns=cols)
        df.attrs["problems"] = problems
        df.attrs["root"] = str(self.root)
        return df

    def results(self, cells: Sequence[SweepCell] | None = None) -> pd.DataFrame:
        """Concatenated result rows of the done cells (all, or only those of ``cells``).

        Every row gets ``cell_key``; the cell's parameters (``dataset``, ``backbone``,
        ``depth``, ``budget``, ``condition``, ``seed``, ``checkpoint_id``) fill columns the rows
        lack, never overwrite those they have.
        """
        records, _ = self.scan()
        if cells is None:  # grid order first, then records of cells never registered
            keys = [c.key for c in self.registered_cells() if c.key in records]
            keys += [k for k in records if k not in set(keys)]
        else:
            keys = [c.key for c in cells]
        frames = []
        for k in keys:
            rec = records.get(k)
            if rec is None or rec["status"] != "done" or not rec["rows"]:
                continue
            df = pd.DataFrame(rec["rows"])
            cell = rec["cell"]
            for col in ("dataset", "backbone", "depth", "budget", "condition", "seed", "checkpoint_id"):
                if col not in df.columns:
                    df[col] = cell.get(col)
            df["cell_key"] = k
            frames.append(df)
        if not frames:
            return pd.DataFrame()
        return pd.concat(frames, ignore_index=True)

    def summary(self, cells: Sequence[SweepCell] | None = None) -> str:
        """Printable summary of :meth:`status` (see :func:`format_status`)."""
        return format_status(self.status(cells))


@dataclass
class StoreStatus:
    """What :func:`run_sweep` returns: the status table of its cells and the store's problems.

    Attributes:
        table: :meth:`ResultStore.status` of the sweep's cells.
        problems: invalid files found in the store.
        executor_errors: errors the executor itself raised (e.g. a worker process died).
    """

    table: pd.DataFrame
    problems: list[dict[str, str]] = field(default_factory=list)
    executor_errors: list[str] = field(default_factory=list)

    def count(self, state: CellState) -> int:
        return int((self.table["status"] == state).sum()) if len(self.table) else 0

    @property
    def done(self) -> int:
        return self.count("done")

    @property
    def failed(self) -> int:
        return self.count("failed")

    @property
    def pending(self) -> int:
        return self.count("pending") + self.count("running")

    @property
    def complete(self) -> bool:
        """All cells done."""
        return len(self.table) > 0 and self.done == len(self.table)

    def __str__(self) -> str:
        s = format_status(self.table)
        if self.executor_errors:
            s += "\nexecutor errors:\n" + "\n".join(f"  {e}" for e in self.executor_errors)
        return s


def format_status(table: pd.DataFrame, max_errors: int = 20) -> str:
    """Printable summary of a status table: counts, then one line per failed cell with its
    error, then the store's problems (from ``table.attrs``)."""
    n = len(table)
    counts = table["status"].value_counts().to_dict() if n else {}
    head = (f"{n} cells: {counts.get('done', 0)} done, {counts.get('failed', 0)} failed, "
            f"{counts.get('running', 0)} running, {counts.get('pending', 0)} pending")
    if "root" in table.attrs:
        head += f"  [{table.attrs['root']}]"
    lines = [head]
    failed = table[table["status"] == "failed"] if n else table
    for _, r in failed.head(max_errors).iterrows():
        err = str(r["error"]).strip().splitlines()
        lines.append(f"  FAILED {r['label']} (key {r['key']}, attempt {r['attempt']}): "
                     f"{err[-1] if err else ''}")
    if len(failed) > max_errors:
        lines.append(f"  ... and {len(failed) - max_errors} more failures")
    if counts.get("running", 0):
        lines.append("  note: 'running' cells have a worker marker but no record; if no sweep is "
                     "running they were killed and will be recomputed")
    for p in table.attrs.get("problems", []):
        lines.append(f"  ignored {Path(p['path']).name}: {p['reason']}")
    return "\n".join(lines)


def sweep_status(name_or_store: str | Path | ResultStore) -> pd.DataFrame:
    """Status table of a sweep (see :meth:`ResultStore.status`).

    Args:
        name_or_store: a :class:`ResultStore`, a store directory, or a sweep name under
            ``runs_dir()/"sweeps"``.

    Raises:
        FileNotFoundError: when no such store exists.
    """
    return _open_store(name_or_store, must_exist=True).status()


def _open_store(name_or_store: str | Path | ResultStore, must_exist: bool = False) -> ResultStore:
    if isinstance(name_or_store, ResultStore):
        return name_or_store
    p = Path(name_or_store)
    named = runs_dir() / "sweeps" / str(name_or_store)
    if len(p.parts) == 1 and (named.is_dir() or not p.is_dir()):  # a bare name is a sweep name
        p = named
    if must_exist and not p.is_dir():
        known = sorted(q.name for q in (runs_dir() / "sweeps").glob("*") if q.is_dir()) \
            if (runs_dir() / "sweeps").is_dir() else []
        raise FileNotFoundError(f"no sweep store at {p}; known sweeps: {known}")
    return ResultStore(p)


def _all_stores() -> list[str]:
    base = runs_dir() / "sweeps"
    return sorted(str(q) for q in base.glob("*") if (q / "cells").is_dir()) if base.is_dir() else []


def sweep_status_report(name: str | Path | ResultStore | None = None) -> str:
    """Printable status of one sweep, or of every sweep under ``runs_dir()/"sweeps"`` (``None``):
    done / failed / running / pending counts, one line per failure with its error, ignored files.
    This is what ``midas-nb sweep status [NAME]`` prints."""
    names = [name] if name is not None else _all_stores()
    if not names:
        return f"no sweeps under {runs_dir() / 'sweeps'}"
    return "\n".join(format_status(sweep_status(n)) for n in names)


def main_status(argv: Sequence[str] | None = None) -> int:
    """``python -m midas_nb.sweeps [NAME|PATH ...]``: print each sweep's summary.

    Without arguments, every store under ``runs_dir()/"sweeps"``. Returns 0 when no cell
    failed, 1 otherwise (so scripts can gate on it).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    names = argv or _all_stores()
    if not names:
        print(f"no sweeps under {runs_dir() / 'sweeps'}")
        return 0
    rc = 0
    for name in names:
        table = sweep_status(name)
        print(format_status(table))
        rc |= int((table["status"] == "failed").any())
    return rc


# ----------------------------------------------------------------------------------------------
# running
# ----------------------------------------------------------------------------------------------

def run_cell(cell: SweepCell, cell_fn: Callable[[SweepCell], Any], store_root: str | Path) -> CellState:
    """Compute one cell and write its record; the worker body of every executor.

    Catches every ``Exception`` from ``cell_fn`` (and from turning its output into rows) and
    records it as a failure with the traceback; never raises for a failing cell.

    Returns:
        ``"done"`` or ``"failed"``.
    """
    store = ResultStore(store_root)
    started = time.time()
    store.mark_running(cell)
    try:
        rows = _rows_of(cell_fn(cell))
        json.dumps(rows, default=_jsonable, allow_nan=True)  # fail here, as this cell's error
        store.record_done(cell, rows, started=started)
        state: CellState = "done"
    except Exception as e:  # noqa: BLE001 - a failing cell must not stop the sweep
        store.record_failed(cell, f"{type(e).__name__}: {e}", traceback.format_exc(), started=started)
        state = "failed"
    finally:
        store.clear_running(cell.key)
    return state


def _slurm_parameters(slurm: Mapping[str, Any]) -> tuple[str | None, dict[str, Any]]:
    """Map the ``slurm`` dict of :func:`run_sweep` to submitit ``AutoExecutor`` parameters."""
    s = dict(slurm)
    cluster = s.pop("cluster", None)
    alias = dict(partition="slurm_partition", time="timeout_min", mem="mem_gb",
                 array_parallelism="slurm_array_parallelism", account="slurm_account",
                 qos="slurm_qos", constraint="slurm_constraint")
    params: dict[str, Any] = {}
    for k, v in s.items():
        if v is None:
            continue
        if k == "mem" and isinstance(v, str):
            params["slurm_mem"] = v  # e.g. "32G"
            continue
        params[alias.get(k, k)] = v
    params.setdefault("name", "midas_sweep")
    return cluster, params


def run_sweep(
    cells: Sequence[SweepCell],
    cell_fn: Callable[[SweepCell], Any],
    store: ResultStore | str | Path,
    executor: ExecutorKind = "local",
    max_workers: int = 2,
    slurm: Mapping[str, Any] | None = None,
    retry_failed: bool = True,
    *,
    mp_context: Literal["spawn", "forkserver", "fork"] = "spawn",
    wait: bool = True,
    progress: bool = False,
) -> StoreStatus:
    """Run the cells that are not finished; return the sweep's status.

    Finished cells (a valid ``done`` record) are skipped; missing cells, cells whose record is
    invalid, and (with ``retry_failed``) failed cells are computed. A failing cell records its
    error and traceback and the others go on. Workers write their own records
    (:func:`run_cell`), so stopping the parent at any moment loses no finished cell and
    running the same call again resumes.

    Args:
        cells: the grid (:func:`make_grid`); keys must be unique.
        cell_fn: ``cell -> DataFrame | list[dict] | dict``; must be picklable (a top-level
            function, ``functools.partial`` of one, or an instance of a top-level class such as
            :class:`ProtocolCellRunner`) for ``processes`` and ``slurm``.
        store: a :class:`ResultStore`, its directory, or a sweep name.
        executor: ``"local"`` (in-process loop), ``"processes"`` (``ProcessPoolExecutor`` with
            ``max_workers`` workers started by ``mp_context``; "spawn" is safe with CUDA and
            threads) or ``"slurm"`` (one submitit job per cell, submitted as a job array).
        max_workers: process-pool size.
        slurm: submitit settings: ``partition``, ``time`` (minutes), ``gpus_per_node``,
            ``cpus_per_task``, ``mem`` (GB number, or a Slurm string such as ``"32G"``),
            ``array_parallelism``, any other ``AutoExecutor`` parameter by its own name, and
            ``cluster`` (``None`` = auto-detect Slurm; ``"local"`` or ``"debug"`` run the same
            path on this machine). Job logs go to ``<store>/submitit``.
        retry_failed: recompute cells whose record says ``failed``.
        wait: for ``slurm``, wait for the jobs (default); ``False`` returns after submission.
        progress: show a tqdm bar over finished cells.

    Returns:
        :class:`StoreStatus` of ``cells``.

    Raises:
        ValueError: duplicated cells, unknown executor, ``max_workers < 1``.
    """
    store = _open_store(store)
    cells = list(cells)
    keys = [c.key for c in cells]
    if len(set(keys)) != len(keys):
        dup = sorted({c.label for c in cells if keys.count(c.key) > 1})
        raise ValueError(f"run_sweep: duplicated cells {dup[:5]}; every cell must be unique")
    if executor not in ("local", "processes", "slurm"):
        raise ValueError(f"unknown executor {executor!r}; expected 'local', 'processes' or 'slurm'")
    if max_workers < 1:
        raise ValueError(f"max_workers must be >= 1, got {max_workers}")
    store.register(cells)
    skip = {"done", "failed"} if not retry_failed else {"done"}
    todo = [c for c in cells if store.state(c.key) not in skip]
    errors: list[str] = []
    root = str(store.root)

    bar = None
    if progress and todo:
        from tqdm.auto import tqdm
        bar = tqdm(total=len(todo), desc=f"sweep {store.root.name}", unit="cell")

    if not todo:
        pass
    elif executor == "local":
        for c in todo:
            run_cell(c, cell_fn, root)
            if bar is not None:
                bar.update(1)
    elif executor == "processes":
        ctx = multiprocessing.get_context(mp_context)
        with cf.ProcessPoolExecutor(max_workers=max_workers, mp_context=ctx) as pool:
            futures = {pool.submit(run_cell, c, cell_fn, root): c for c in todo}
            for fut in cf.as_completed(futures):
                c = futures[fut]
                try:
                    fut.result()
                except Exception as e:  # noqa: BLE001 - the worker died or could not start
                    errors.append(f"{c.label}: {type(e).__name__}: {e}")
                    _record_lost(store, c, e)
                if bar is not None:
                    bar.update(1)
    else:
        import submitit

        cluster, params = _slurm_parameters(slurm or {})
        ex = submitit.AutoExecutor(folder=store.root / "submitit", cluster=cluster)
        ex.update_parameters(**params)
        jobs = ex.map_array(run_cell, todo, [cell_fn] * len(todo), [root] * len(todo))
        atomic_write_text(store.root / "jobs.json", json.dumps(
            {c.key: str(j.job_id) for c, j in zip(todo, jobs)}, indent=1))
        if wait:
            for c, j in zip(todo, jobs):
                try:
                    j.result()
                except Exception as e:  # noqa: BLE001 - job killed, timed out, node failure
                    errors.append(f"{c.label} (job {j.job_id}): {type(e).__name__}: {e}")
                    _record_lost(store, c, e)
                if bar is not None:
                    bar.update(1)
    if bar is not None:
        bar.close()
    table = store.status(cells)
    return StoreStatus(table=table, problems=table.attrs.get("problems", []), executor_errors=errors)


def _record_lost(store: ResultStore, cell: SweepCell, exc: BaseException) -> None:
    """After an executor-level failure, record ``cell`` as failed if its worker had started it
    (``.running`` marker) but wrote no record; cells never started stay pending."""
    if store.read(cell.key) is not None or not store.running_path(cell.key).exists():
        return
    store.record_failed(cell, f"worker lost: {type(exc).__name__}: {exc}",
                        "".join(traceback.format_exception(exc)), started=time.time())
    store.clear_running(cell.key)


# ----------------------------------------------------------------------------------------------
# the real cell function: one protocol run
# ----------------------------------------------------------------------------------------------

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


# per-process cache of heavy objects (datasets and fine-tuned backbones, held by Study objects):
# a worker that runs many cells loads each once. It lives at module level so that a pickled
# runner (process pools, submitit) finds it too.
_PROCESS_CACHE: dict[str, Any] = {}


def _study(profile: Mapping[str, Any], dataset: str, backbone: str, device: str | None = None,
           progress: bool = False):
    """The (per-process cached) :class:`midas_nb.study.Study` for one dataset and backbone."""
    from .study import Study

    overrides = {k: v for k, v in profile.items() if k not in ("profile", "data_root", "data_roots")}
    # the cell's dataset gets its own root (data_roots / data_root resolved for it): a root given
    # for the profile's own dataset must not follow the study to another dataset
    overrides.update(dataset=dataset, backbone=backbone, data_root=_data_root_for(profile, dataset),
                     data_roots={})
    if device is not None:
        overrides["device"] = device
    name = str(profile.get("profile", "quick"))
    key = "study:" + _canonical_json([name, overrides])
    cached = _PROCESS_CACHE.get(key)
    # a Study parses the annotation files once; if they were edited since (or the synthetic set
    # regenerated), a fresh Study reads them again, so identities and results follow the files
    if cached is None or cached[1] != annotation_stamp(cached[0].data_root):
        st = Study(name, progress=progress, **overrides)
        cached = _PROCESS_CACHE[key] = (st, annotation_stamp(st.data_root))
    return cached[0]


class ProtocolCellRunner:
    """The real ``cell_fn``: one protocol run per cell (picklable; heavy objects cached per process).

    For a cell it takes the dataset splits and the fine-tuned backbone from a
    :class:`midas_nb.study.Study` (so checkpoints, target caches and dataset labels are shared
    with the notebooks; one Study per process and (dataset, backbone)), then calls
    :func:`midas_nb.protocol.run_protocol` with ``depth=cell.depth``, ``budget=cell.budget``,
    ``conditions=[cell.condition]``, ``seeds=[cell.seed]`` and the protocol settings stored in
    ``cell.params``, so a cell is computed exactly as its key says. The first supervised cell
    at a depth computes the train-split maps of all the profile's ``targets`` in one pass
    (``prefetch_targets``), so the cells of the other targets find them cached.

    Args:
        profile: a profile dict or name; supplies data roots, fine-tuning settings and device.
        device: overrides ``profile["device"]`` (a CUDA device on a machine without CUDA is an
            error, as in Study).
        cache_dir: target/scorer cache passed to ``run_protocol``; default the package cache.
        progress: show progress bars.
        study: an existing :class:`midas_nb.study.Study` to reuse, in this process only, for
            the cells of its dataset and backbone (saves loading them twice in a notebook).

    Raises (per cell, recorded by :func:`run_sweep`):
        ValueError: the cell was keyed by a real checkpoint id that differs from the
            checkpoint the profile now yields (the grid is stale; rebuild it).
    """

    def __init__(self, profile: str | Mapping[str, Any], *, device: str | None = None,
                 cache_dir: str | Path | None = None, progress: bool = False, study: Any = None) -> None:
        self.profile = get_profile(profile) if isinstance(profile, str) else dict(profile)
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
        """The Study holding the cell's data and backbone."""
        st = self._local_study
        if st is not None and st.dataset_name == cell.dataset and st.params.get("backbone") == cell.backbone:
            return st
        return _study(self.profile, cell.dataset, cell.backbone, self.device, self.progress)

    def __call__(self, cell: SweepCell) -> pd.DataFrame:
        from .protocol import run_protocol

        study = self.study(cell)
        # the grid must describe the data and recipe this process sees: a cell keyed by other
        # data (edited keypoints, replaced images) or another recipe is never filled with rows
        # computed from the current ones
        if cell.checkpoint_id.startswith("spec-") and cell.checkpoint_id != _spec_of(study):
            raise ValueError(f"cell {cell.label} was keyed by checkpoint spec {cell.checkpoint_id!r} but the "
                             f"data and recipe now give {_spec_of(study)!r}; rebuild the grid")
        settings = dict(_protocol_params(self.profile), **cell.params)
        if cell.data_id and cell.data_id != _eval_identity(study, settings):
            raise ValueError(f"cell {cell.label} was keyed by evaluation data {cell.data_id!r} but the "
                             f"evaluated test images now are {_eval_identity(study, settings)!r} (images, "
                             "labels, keypoints or boxes changed); rebuild the grid")
        model, meta = study.model, study.meta
        ckpt = str(meta.get("checkpoint_id", ""))
        if cell.checkpoint_id and not cell.checkpoint_id.startswith("spec-") and cell.checkpoint_id != ckpt:
            raise ValueError(f"cell {cell.label} was keyed by checkpoint {cell.checkpoint_id!r} but the "
                             f"profile now yields checkpoint {ckpt!r}; rebuild the grid")
        for k in _DATA_PARAMS:
            settings.pop(k, None)
        if self.cache_dir is not None:
            settings["cache_dir"] = self.cache_dir
        return run_protocol(
            study.train_set, study.test_set, model, depth=cell.depth, budget=cell.budget,
            conditions=[cell.condition], seeds=[cell.seed], dataset_name=study.dataset_name,
            backbone_name=cell.backbone, checkpoint_id=ckpt, device=study.device,
            progress=self.progress, prefetch_targets=list(self.profile.get("targets") or ()), **settings)


def scale_readout(
    profile: str | Mapping[str, Any],
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
) -> pd.DataFrame:
    """Scale sensitivity: the protocol at the profile's ``(depth, budget)`` for each backbone.

    Quick profile: the hybrid backbone in two widths (``hybrid_lite0_vit_w128``,
    ``hybrid_lite0_vit``); paper profile: DeiT-Ti/16, DeiT-S/16, AugReg ViT-B/16 (the
    profile's ``scale_backbones``). Cells go through the same store as the regime sweeps
    (default: the one named after the profile), so cells shared with them are computed once.

    Args:
        profile: profile name or dict.
        backbones: override ``scale_backbones``.
        store: result store; default ``ResultStore(name=<profile name>)``.
        datasets, conditions, seeds: override the profile's lists.
        executor, max_workers, slurm: as in :func:`run_sweep`.
        run: compute missing cells first; ``False`` only reads what the store has.
        cell_fn: default :class:`ProtocolCellRunner` of ``profile``.

    Returns:
        The result rows of the scale cells that are done (column ``backbone`` tells them apart;
        ``midas_nb.metrics.decoupling_D`` groups by it, giving D per backbone);
        ``attrs["status"]`` is the :class:`StoreStatus` of the cells (``complete`` is False
        while any cell failed or is pending: their rows are absent).
    """
    prof = get_profile(profile) if isinstance(profile, str) else dict(profile)
    store = _open_store(store if store is not None else prof.get("profile", "default"))
    cells = make_grid(prof, "scale", backbones=backbones, datasets=datasets, conditions=conditions, seeds=seeds)
    if run:
        st = run_sweep(cells, cell_fn or ProtocolCellRunner(prof), store, executor=executor,
                       max_workers=max_workers, slurm=slurm)
    else:
        table = store.status(cells)
        st = StoreStatus(table=table, problems=table.attrs.get("problems", []))
    out = store.results(cells)
    out.attrs["status"] = st
    return out


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main_status())
