"""The cells of a profile's sweeps: grids over dataset × backbone × ``(L, b)`` × condition × seed.

:func:`make_grid` builds :class:`midas_nb.sweeps.SweepCell` objects whose keys hold the
fine-tuned checkpoint's content id (:func:`checkpoint_spec_id`), the evaluated test images'
content id (:func:`eval_data_id`) and the protocol settings that change a result
(:func:`protocol_settings`), so a changed setting or datum is a new cell. The MIDAS paper grid is
``L ∈ {3,6,9,11}`` × ``b ∈ {0.10,0.25,0.50,0.75}`` × all conditions × 3 seeds × {CUB,
Aircraft, Cars} × {DeiT-Ti/16, DeiT-S/16, AugReg ViT-B/16} (DESIGN.md §5, §7–8); profiles pick
smaller grids.
"""
from __future__ import annotations

from typing import Any, Literal, Mapping, Sequence

from torch.utils.data import Subset

from ..config import dataset_label, PAPER_DATASETS
from ..identity import dataset_identity
from ..data import evaluation_subset
from ..analysis.protocol import SEEDLESS_CONDITIONS, with_band_check
from ..point import Point
from ..sweeps import SweepCell
from .cache import cached_study
from .settings import profile_values, protocol_settings, RunSettings, sweep_spans, SweepSettings

__all__ = ["GridKind", "PAPER_DATASETS", "SEEDLESS_CONDITIONS", "make_grid", "grid_spans", "checkpoint_spec_id",
           "eval_data_id", "resolve_checkpoint_ids", "protocol_settings"]

GridKind = Literal["depth", "budget", "cross", "full", "regime", "scale"]


def checkpoint_spec_id(profile: RunSettings | Mapping[str, Any], dataset: str, backbone: str) -> str:
    """Id of the fine-tuned checkpoint a profile implies for ``(dataset, backbone)``, by content.

    The checkpoint id itself (:func:`midas_nb.backbones.checkpoint_key`: model, initial weights,
    recipe, both splits' content, training numerics; decision 0051), keyed with the numerics of
    the profile's ``device`` even where this machine lacks it, so a login node keys the cells as
    the GPU node that computes them. Nothing is trained; the datasets' annotations are parsed and
    their image files hashed (memoised per process).

    Raises:
        ValueError, FileNotFoundError: the dataset has no data root, or it cannot be read.
    """
    # the data are read on the CPU, so a login node without the profile's GPU can key the cells;
    # the numerics are those of the profile's device, where the cells will run (a compute node)
    prof = profile_values(profile)
    study = cached_study(prof, dataset, backbone, device="cpu")
    device = str(prof.get("device") or "cpu")
    if device == "cpu":
        return study.checkpoint_id
    return study.checkpoint_key(device=device)[0]


def eval_identity(study: Any, settings: Mapping[str, Any]) -> str:
    """:attr:`~midas_nb.identity.DatasetIdentity.full` of the test images a protocol run with
    ``settings`` evaluates (:func:`midas_nb.data.evaluation_subset`)."""
    test = study.test_set
    idx = evaluation_subset(len(test), settings.get("max_eval_images"), settings.get("eval_subset_seed", 0))
    return dataset_identity(test if len(idx) == len(test) else Subset(test, idx)).full


def eval_data_id(profile: RunSettings | Mapping[str, Any], dataset: str, backbone: str,
                 settings: Mapping[str, Any] | None = None) -> str:
    """Content identity of the test images a cell evaluates (the test split with the backbone's
    transform, restricted to the evaluated subset of ``settings``' ``max_eval_images`` /
    ``eval_subset_seed``; default the profile's protocol settings):
    :attr:`midas_nb.identity.DatasetIdentity.full` — images, labels, part keypoints, boxes,
    transform. Enters :attr:`SweepCell.data_id`: a keypoint of an evaluated image changes it,
    one of an image outside the subset does not."""
    prof = profile_values(profile)
    return eval_identity(cached_study(prof, dataset, backbone, device="cpu"),
                         protocol_settings(prof) if settings is None else settings)


def resolve_checkpoint_ids(profile: RunSettings | str | Mapping[str, Any], datasets: Sequence[str],
                           backbones: Sequence[str]) -> dict[tuple[str, str], str]:
    """Real checkpoint ids ``{(dataset, backbone): id}`` without training anything.

    Parses each dataset and hashes its content, then the fine-tuning key exactly as
    :func:`midas_nb.backbones.load_or_finetune` does (:meth:`midas_nb.study.Study.checkpoint_key`).
    """
    prof = profile_values(profile)
    return {(ds, bb): cached_study(prof, ds, bb).checkpoint_key()[0] for ds in datasets for bb in backbones}


#: Settings of :func:`protocol_settings` that describe the data (input and patch size, px), not
#: ``run_protocol`` arguments: they enter the cell key, the study is built with them, and the cell
#: runner leaves them out of ``run_protocol``'s arguments.
DATA_PARAMS = ("image_size", "patch_size")


def grid_spans(profile: RunSettings | str | Mapping[str, Any],
               kind: GridKind = "regime") -> tuple[list[str], list[str]]:
    """``(datasets, backbones)`` a sweep of ``kind`` spans (see :func:`make_grid`), by
    :func:`sweep_spans`: the datasets; for ``kind="scale"`` the ``scale_backbones`` (the study's
    backbone alone where ``other_backbones`` is false, as in quick), else the ``backbones``.
    ``profile``: a study's :class:`RunSettings`, a profile name or mapping. Nothing is read; data
    roots are not resolved."""
    prof = profile_values(profile)
    datasets, backbones, scale_backbones = sweep_spans(prof)
    if kind != "scale":
        return datasets, backbones
    return datasets, scale_backbones if prof.get("other_backbones", True) else [prof["backbone"]]


def make_grid(
    profile: RunSettings | str | Mapping[str, Any],
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
    """The cells of a sweep for a profile, ordered dataset, backbone, point, condition, seed.

    Points ``(L, b)`` by ``kind``: ``"depth"`` — ``L ∈ depths`` at ``b = budget``; ``"budget"`` —
    ``b ∈ budgets`` at ``L = depth``; ``"cross"`` — the union of the two (the shared point once);
    ``"full"`` — ``depths × budgets``; ``"regime"`` — the profile's ``regime_grid``; ``"scale"`` —
    ``(depth, budget)`` alone, for every backbone of :func:`grid_spans`.

    Each point is crossed with conditions (default the profile's ``sweep_conditions``, else its
    ``conditions``, with ``random`` added where ``reference`` is swept and the protocol has it:
    the band's check) × seeds × datasets × backbones. Seeds: the profile's ``seeds`` at its own
    point and its ``sweep_seeds`` (default ``seeds``) elsewhere, or ``seeds`` everywhere where
    given; a condition in ``seedless_conditions`` (default ``reference``, whose evaluation does
    not depend on the seed) gets only the first. A dataset without a data root is an error
    (:func:`midas_nb.config.data_root_for`) unless the embedded synthetic set applies (cells
    labelled ``"synthetic"``).

    Args:
        profile: a study's :class:`RunSettings` (its :attr:`~RunSettings.values` key the cells),
            a profile name or mapping (:func:`midas_nb.config.get_profile`).
        kind: grid shape (above).
        datasets, backbones, conditions, seeds: override the profile's lists.
        checkpoint_ids: ``"spec"`` (default, :func:`checkpoint_spec_id`, nothing is trained),
            ``"resolve"`` (:func:`resolve_checkpoint_ids`, the same ids) or an explicit
            ``{(dataset, backbone): checkpoint_id}``.
        data_ids: explicit ``{(dataset, backbone): data_id}``; default :func:`eval_data_id`.
            With explicit ``checkpoint_ids`` and ``data_ids`` no dataset is read.
        params: extra settings merged into every cell's ``params`` (they enter the key).
        seedless_conditions: conditions computed for the first seed only (``()``: every seed).

    Raises:
        ValueError: unknown ``kind``; empty lists; duplicated entries; a dataset without a
            data root (see above).
    """
    prof = profile_values(profile)
    sweep = SweepSettings.of(prof)
    kind = sweep.regime_grid if kind == "regime" else kind
    own = Point(prof["depth"], prof["budget"])
    L0, b0 = own.depth, own.budget.keyed()
    depths, budgets = list(sweep.depths), [b.keyed() for b in sweep.budgets]
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
    points = list(dict.fromkeys(Point(L, b) for L, b in points))  # drop the shared point

    span_datasets, span_backbones = grid_spans(prof, kind)
    datasets = span_datasets if datasets is None else datasets
    backbones = span_backbones if backbones is None else backbones
    if conditions is None:  # a profile may sweep fewer conditions than its protocol table shows
        # where the protocol has the random ranking, every swept cell carries it too (the band's check)
        conditions = with_band_check(sweep.conditions, prof["conditions"])
    conditions = list(conditions)
    # the profile's point (L, b) has every seed (its cells are notebook 02's); the sweep's other
    # points the profile's sweep_seeds where it has them (quick: one seed, for its time budget)
    off_seeds = list(sweep.seeds) if seeds is None else None
    seeds = [int(s) for s in (prof["seeds"] if seeds is None else seeds)]
    off_seeds = off_seeds or seeds
    for name, values in dict(datasets=datasets, backbones=backbones, conditions=conditions,
                             seeds=seeds, sweep_seeds=off_seeds, depths=depths, budgets=budgets).items():
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
    base = dict(protocol_settings(prof), **dict(params or {}))
    cells = []
    for ds in datasets:
        label = dataset_label(dict(prof), ds)
        for bb in backbones:
            ckpt = checkpoint_ids.get((ds, bb)) or checkpoint_spec_id(prof, ds, bb)
            data_id = (data_ids or {}).get((ds, bb)) or eval_data_id(prof, ds, bb, base)
            for pt in points:
                L, b = pt.depth, pt.budget
                at = seeds if pt == Point(L0, b0) else off_seeds
                for cond in conditions:
                    for s in (at[:1] if cond in seedless_conditions else at):
                        cells.append(SweepCell(label, bb, L, b, cond, s, checkpoint_id=ckpt, params=base,
                                               data_id=data_id))
    return cells
