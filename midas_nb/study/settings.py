"""The run description: one frozen, typed settings object per study, built and checked once.

:meth:`RunSettings.build` checks a profile (:mod:`midas_nb.config`) with its overrides — every
problem at once, one line each, as :class:`midas_nb.config.ProfileError` — and returns the typed
parts the layers read (decision 0060); :class:`ReportSettings` is what the report reads of a
finished run's profile. ``values`` keeps the profile itself, read-only: the sweep layer keys
result cells by it (:func:`midas_nb.study.make_grid`).

Example::

    >>> s = RunSettings.build("smoke", budget=0.5)
    >>> s.point, s.data.label, s.backbone.recipe.epochs, s.statistics.bootstrap
    (Point(depth=2, budget=0.5), 'synthetic', 12, 100)
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping

from .. import config
from ..analysis.protocol import PROTOCOL_DEFAULTS
from ..backbones import (backbone_kwargs, check_backbone, check_epochs, comparison_backbones, TrainingRecipe,
                         weights_for)
from ..identity import hash_json
from ..point import Budget, did_you_mean, Point

__all__ = ["RunSettings", "DataSettings", "BackboneSettings", "ProtocolSettings", "StatisticsSettings",
           "SweepSettings", "ReportSettings", "check_data", "check_schedule", "synthetic_root", "setting_names",
           "TOP_LEVEL_PROTOCOL_SETTINGS", "protocol_settings", "profile_values", "sweep_spans"]


def check_data(params: Mapping[str, Any]) -> tuple[str, Path | None]:
    """``(dataset name, data root or None for the embedded synthetic set)``, checked, no image read.

    The root comes from :func:`midas_nb.config.data_root_for` (``data_roots[dataset]``, or
    ``data_root`` for the profile's own dataset); the embedded synthetic set only where it was
    asked for by name or the profile documents it (smoke/quick without any data root).

    Raises:
        ValueError: unknown dataset name; a dataset without a root where no synthetic
            default applies (the message names ``--data-root NAME=PATH``).
        FileNotFoundError: the root is not a directory.
    """
    name = params.get("dataset", "cub")
    root = config.data_root_for(dict(params), name)
    if root is not None and not root.is_dir():
        raise FileNotFoundError(f"data root {str(root)!r} (dataset {name!r}) does not exist or is not a directory")
    return name, root


def synthetic_root(synthetic: Mapping[str, Any]) -> Path:
    """Where the embedded synthetic set of these generator settings lives:
    ``cache_dir()/data/synthetic_<hash>`` (deterministic by its settings)."""
    return config.cache_dir() / "data" / f"synthetic_{hash_json(dict(synthetic), 12)}"


def check_schedule(params: Mapping[str, Any], dataset_label: str, backbone: str) -> list[str]:
    """``[]`` when ``backbone`` can train on ``dataset_label`` with the profile's schedule
    (:func:`midas_nb.config.finetune_settings`); else one line naming the setting
    (:func:`midas_nb.config.finetune_setting_name`) and why (:func:`midas_nb.backbones.check_epochs`)."""
    params = dict(params)
    name = config.finetune_setting_name(params, dataset_label, backbone, "epochs")
    return [f"{name}: on {dataset_label}, {why}"
            for why in check_epochs(backbone, config.finetune_settings(params, dataset_label, backbone).get("epochs"))]


@dataclass(frozen=True)
class DataSettings:
    """The data one study reads.

    Attributes:
        dataset: ``cub`` | ``aircraft`` | ``cars`` | ``synthetic``.
        label: the name results carry (:func:`midas_nb.config.dataset_label`): ``"synthetic"``
            for the embedded set, ``"aircraft (family)"`` below variant level.
        root: the directory read (for the embedded set: where it is generated on first read).
        loader: the reader (:func:`midas_nb.data.load_dataset`): the embedded set is CUB's.
        embedded: the root is the embedded synthetic set's.
        image_size, patch_size: input side and patch side, px (``image_size % patch_size == 0``).
        max_images_per_class: the first ``k`` images of each class of every split, or ``None``.
        aircraft_level: FGVC-Aircraft's label level (``variant`` | ``family`` | ``manufacturer``).
        synthetic: the embedded set's generator settings.
    """

    dataset: str
    label: str
    root: Path
    loader: str
    embedded: bool
    image_size: int
    patch_size: int
    max_images_per_class: int | None
    aircraft_level: str
    synthetic: Mapping[str, Any]


@dataclass(frozen=True)
class BackboneSettings:
    """The backbone a study fine-tunes and prunes.

    Attributes:
        name: registry or timm name (:func:`midas_nb.backbones.create_backbone`).
        weights: initial weights: a file, ``"hub"`` (timm's) or ``None`` (random init; the
            local architectures).
        kwargs: timm ``VisionTransformer`` arguments (``img_size`` follows the data's
            ``image_size``: :func:`midas_nb.backbones.backbone_kwargs`).
        recipe: the fine-tuning schedule on this study's data (seed 0).
    """

    name: str
    weights: str | None
    kwargs: Mapping[str, Any]
    recipe: TrainingRecipe


@dataclass(frozen=True)
class ProtocolSettings:
    """What the three-condition protocol runs (DESIGN.md §5) and on which images.

    Attributes:
        conditions, targets: names (:func:`midas_nb.analysis.protocol.list_conditions`,
            :func:`midas_nb.targets.list_targets`).
        seeds: scorer seeds at the study's point.
        idauc_steps: steps ``S`` of the insertion/deletion curves.
        max_eval_images, max_idauc_images: evaluated test images (``None``: all) and the
            IDAUC subset of them; drawn with ``eval_subset_seed``
            (:func:`midas_nb.data.evaluation_subset`).
        scorer_train: the scorers' training recipe (``epochs``, ``batch_size``, ``lr``, ...).
        throughput_batch, throughput_repeats: test images and calls per round of the one
            interleaved speed measurement (:func:`midas_nb.metrics.measure_speed`).
    """

    conditions: tuple[str, ...]
    targets: tuple[str, ...]
    seeds: tuple[int, ...]
    idauc_steps: int
    max_eval_images: int | None
    max_idauc_images: int | None
    eval_subset_seed: int
    scorer_train: Mapping[str, Any]
    throughput_batch: int
    throughput_repeats: int


@dataclass(frozen=True)
class StatisticsSettings:
    """Attributes: bootstrap: resamples of every percentile interval (>= 1)."""

    bootstrap: int


@dataclass(frozen=True)
class SweepSettings:
    """The regime sweep (notebook 04) and the scale readout (notebook 05).

    Attributes:
        depths, budgets: the sweep's ``L`` and ``b`` values.
        regime_grid: ``cross`` (depths at the study's ``b``, budgets at its ``L``) or ``full``.
        seeds: seeds at the sweep's other points; conditions: the swept conditions.
        related_seeds: seeds of the related methods' rows (notebook 06).
        datasets, backbones: what the sweeps span; scale_backbones: the scale readout's.
        other_backbones: notebook 05 runs the backbones other than the study's.
        compare_backbones: the side-by-side readout's backbones, those a run may skip included
            (:func:`midas_nb.backbones.comparison_backbones` with ``planned=True``).
    """

    depths: tuple[int, ...]
    budgets: tuple[Budget, ...]
    regime_grid: str
    seeds: tuple[int, ...]
    conditions: tuple[str, ...]
    related_seeds: tuple[int, ...]
    datasets: tuple[str, ...]
    backbones: tuple[str, ...]
    scale_backbones: tuple[str, ...]
    other_backbones: bool
    compare_backbones: tuple[str, ...]

    @classmethod
    def of(cls, p: Mapping[str, Any]) -> "SweepSettings":
        """The sweep lists of a profile mapping, typed, not checked (:meth:`RunSettings.build` checks
        them): a list the profile leaves out is the study's own value (``depths``: ``[depth]``,
        sweep ``seeds``: ``seeds``, ``conditions``: the protocol's, ``scale_backbones``: ``[backbone]``)."""
        seeds = tuple(int(s) for s in p["seeds"])
        datasets, backbones, scale_backbones = sweep_spans(p)
        depths, budgets = p.get("depths"), p.get("budgets")   # an empty list stays empty (make_grid refuses it)
        return cls(depths=tuple(int(d) for d in ([p["depth"]] if depths is None else depths)),
                   budgets=tuple(Budget(b) for b in ([p["budget"]] if budgets is None else budgets)),
                   regime_grid=str(p.get("regime_grid", "cross")),
                   seeds=tuple(int(s) for s in p.get("sweep_seeds") or seeds),
                   conditions=tuple(p.get("sweep_conditions") or p["conditions"]),
                   related_seeds=tuple(int(s) for s in p.get("related_seeds") or seeds),
                   datasets=tuple(datasets), backbones=tuple(backbones), scale_backbones=tuple(scale_backbones),
                   other_backbones=bool(p.get("other_backbones", True)),
                   compare_backbones=tuple(comparison_backbones(dict(p), planned=True)))


def sweep_spans(p: Mapping[str, Any]) -> tuple[list[str], list[str], list[str]]:
    """``(datasets, backbones, scale_backbones)`` a profile's sweeps span, by name only (nothing
    else of the profile is read, so a bad seed or budget elsewhere does not stop it): its
    ``datasets``, ``backbones`` and ``scale_backbones``, each defaulting to the study's own."""
    own = [p["backbone"]]
    datasets = list(p.get("datasets") or [p["dataset"]])
    return datasets, list(p.get("backbones") or own), list(p.get("scale_backbones") or own)


#: protocol settings a profile may also set at its top level (they enter the cells' keys or the
#: speed measurement; :func:`midas_nb.study.protocol_settings`)
TOP_LEVEL_PROTOCOL_SETTINGS: tuple[str, ...] = ("relaxation", "lam", "temperature", "eval_subset_seed",
                                                "throughput_batch", "throughput_repeats", "precision")


#: the protocol settings of a profile's top level that enter every cell's key even where the
#: profile leaves them out (with :data:`midas_nb.analysis.protocol.PROTOCOL_DEFAULTS` as their values)
_ALWAYS_KEYED: tuple[str, ...] = ("relaxation", "lam", "temperature")


def protocol_settings(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's settings that change a protocol run's result; they enter every cell's key
    and :class:`midas_nb.study.ProtocolCellRunner` passes them (less ``image_size``/``patch_size``)
    to :func:`midas_nb.analysis.protocol.run_protocol`: ``relaxation``, ``lam``, ``temperature``
    (default ``"st"``, 1, 1), the other :data:`TOP_LEVEL_PROTOCOL_SETTINGS` the profile sets,
    every ``scorer_train`` key (``epochs``, ``batch_size``, ``lr``, ...; it wins over the top
    level), ``idauc_steps``, ``max_eval_images``, ``max_idauc_images``, ``bootstrap``."""
    out = {k: profile.get(k, PROTOCOL_DEFAULTS[k]) for k in _ALWAYS_KEYED}
    out.update({k: profile[k] for k in TOP_LEVEL_PROTOCOL_SETTINGS if k in profile and k not in _ALWAYS_KEYED})
    out.update(dict(profile.get("scorer_train") or {}))
    for k in ("idauc_steps", "max_eval_images", "max_idauc_images", "bootstrap", "image_size", "patch_size"):
        if k in profile:
            out[k] = profile[k]
    return out


def setting_names() -> frozenset[str]:
    """Every name a profile or an override may set: the keys of every profile and
    :data:`TOP_LEVEL_PROTOCOL_SETTINGS`."""
    return frozenset().union(*(config.get_profile(n) for n in config.PROFILES), TOP_LEVEL_PROTOCOL_SETTINGS)


def _unknown_line(key: str, known: frozenset[str]) -> str:
    return (f"{key}: unknown setting{did_you_mean([key], known)}; expected a key of the profiles "
            "(midas_nb.config.PROFILES)")


def _optional_int(v: Any) -> int | None:
    return None if v is None else int(v)


@dataclass(frozen=True)
class RunSettings:
    """One study's settings, typed (module docstring). Build with :meth:`build`."""

    profile: str
    point: Point
    data: DataSettings
    backbone: BackboneSettings
    protocol: ProtocolSettings
    statistics: StatisticsSettings
    sweep: SweepSettings
    device: str
    torch_threads: int | None
    values: Mapping[str, Any]

    @classmethod
    def build(cls, profile: str = "quick", **overrides: Any) -> "RunSettings":
        """Profile ``profile`` with ``overrides`` (``None`` values ignored), checked and typed.

        Every problem is reported at once, one line each: an unknown profile or setting name
        (with the closest known name), every type and range
        (:func:`midas_nb.config.check_profile`), the backbone's arguments and depths
        (:func:`midas_nb.backbones.check_backbone`, where the settings it reads are fine), the
        data root (:func:`check_data`) and the schedule (:func:`check_schedule`).

        Raises:
            midas_nb.config.ProfileError: the lines (a ``ValueError``).
        """
        if profile not in config.PROFILES:
            raise config.ProfileError([f"profile: expected one of {sorted(config.PROFILES)}, got {profile!r}"])
        p = config.get_profile(profile, **overrides)
        known = setting_names()
        problems = [_unknown_line(k, known) for k in overrides if k not in known]
        problems += config.check_profile(p)
        recipe = p.get("scorer_train") if isinstance(p.get("scorer_train"), dict) else {}
        problems += [f"{k}: {p[k]!r} at the top level and {recipe[k]!r} in scorer_train; give one (scorer_train's "
                     "would be used)" for k in TOP_LEVEL_PROTOCOL_SETTINGS if k in p and k in recipe and p[k] != recipe[k]]
        bad = {config.setting_of(line) for line in problems}
        if not bad & {"backbone", "backbone_kwargs", "image_size", "patch_size"}:
            depths = [] if bad & {"depth", "depths"} else [p["depth"], *(p.get("depths") or [])]
            problems += check_backbone(p["backbone"], backbone_kwargs(p, p["backbone"]), depths,
                                       image_size=p["image_size"], patch_size=p["patch_size"])
        name = root = label = None
        if not bad & {"dataset", "data_root", "data_roots", "aircraft_level"}:
            try:
                name, root = check_data(p)
                label = "synthetic" if root is None else config.dataset_label(p, name)
            except (ValueError, FileNotFoundError) as e:
                problems.append(str(e))
        if label is not None and not bad & {"backbone", "finetune", "synthetic_finetune"}:
            problems += check_schedule(p, label, p["backbone"])
        if problems:  # nothing is replaced: a bad value is an error, never the profile's default
            raise config.ProfileError(problems)
        return cls._typed(p, name, root, label)

    @classmethod
    def _typed(cls, p: dict[str, Any], name: str, root: Path | None, label: str) -> "RunSettings":
        syn = MappingProxyType(dict(p.get("synthetic") or {}))
        data = DataSettings(dataset=name, label=label, root=synthetic_root(syn) if root is None else root,
                            loader="cub" if root is None else name, embedded=root is None,
                            image_size=int(p["image_size"]), patch_size=int(p["patch_size"]),
                            max_images_per_class=config.images_per_class(p, label),
                            aircraft_level=p.get("aircraft_level") or config.AIRCRAFT_LEVELS[0], synthetic=syn)
        bb = p["backbone"]
        backbone = BackboneSettings(name=bb, weights=weights_for(p, bb),
                                    kwargs=MappingProxyType(backbone_kwargs(p, bb)),
                                    recipe=TrainingRecipe(seed=0, **config.finetune_settings(p, label, bb)))
        keyed = dict(PROTOCOL_DEFAULTS, **protocol_settings(p))
        protocol = ProtocolSettings(
            conditions=tuple(p["conditions"]), targets=tuple(p["targets"]), seeds=tuple(int(s) for s in p["seeds"]),
            idauc_steps=int(p["idauc_steps"]), max_eval_images=_optional_int(p.get("max_eval_images")),
            max_idauc_images=_optional_int(p.get("max_idauc_images")),
            eval_subset_seed=int(keyed["eval_subset_seed"]),
            scorer_train=MappingProxyType(dict(p.get("scorer_train") or {})),
            throughput_batch=int(keyed["throughput_batch"]), throughput_repeats=int(keyed["throughput_repeats"]))
        return cls(profile=p["profile"], point=Point(p["depth"], p["budget"]), data=data, backbone=backbone,
                   protocol=protocol, statistics=StatisticsSettings(bootstrap=int(p["bootstrap"])),
                   sweep=SweepSettings.of(p),
                   device=str(p["device"]), torch_threads=_optional_int(p.get("torch_threads")),
                   values=MappingProxyType(p))


@dataclass(frozen=True)
class ReportSettings:
    """What the report (:mod:`midas_nb.report`) reads of a run's profile, typed; data roots and
    weights are not checked (the run checked them): a store is read where they may be absent.

    Attributes:
        profile: the profile's name (``"default"`` for a mapping without one).
        dataset, backbone: the study's dataset name and backbone.
        point: the study's ``(depth L, budget b)``.
        conditions: the three-condition protocol's conditions.
        relaxation: the protocol relaxation whose rows are reported (default ``"st"``).
        bootstrap: resamples of every interval (default 1000).
        sweep: the regime sweep's and the scale readout's lists (:meth:`SweepSettings.of`).
        values: the profile itself, read-only: result cells are keyed by it
            (:func:`midas_nb.study.make_grid`), and dataset labels and image caps read it.
    """

    profile: str
    dataset: str
    backbone: str
    point: Point
    conditions: tuple[str, ...]
    relaxation: str
    bootstrap: int
    sweep: SweepSettings
    values: Mapping[str, Any]

    @classmethod
    def of(cls, settings: "ReportSettings | RunSettings | str | Mapping[str, Any]") -> "ReportSettings":
        """The report's part of a study's settings, a profile by name or a profile mapping.

        Raises:
            KeyError: a mapping without ``dataset``, ``backbone``, ``depth``, ``budget``,
                ``conditions`` or ``seeds``; ValueError: a depth or budget out of range
                (:class:`midas_nb.point.Point`).
        """
        if isinstance(settings, ReportSettings):
            return settings
        p = profile_values(settings)
        return cls(profile=str(p.get("profile", "default")), dataset=str(p["dataset"]), backbone=str(p["backbone"]),
                   point=Point(p["depth"], p["budget"]), conditions=tuple(p["conditions"]),
                   relaxation=str(p.get("relaxation", "st")), bootstrap=int(p.get("bootstrap", 1000)),
                   sweep=SweepSettings.of(p), values=MappingProxyType(p))


def profile_values(settings: RunSettings | str | Mapping[str, Any]) -> dict[str, Any]:
    """The profile mapping a sweep's cells are keyed by (:func:`midas_nb.study.make_grid`): a
    study's :attr:`RunSettings.values`, a profile by name (:func:`midas_nb.config.get_profile`)
    or a profile mapping, as a new ``dict`` (a study's a deep copy: its lists stay its own)."""
    if isinstance(settings, RunSettings):
        return copy.deepcopy(dict(settings.values))
    return config.get_profile(settings) if isinstance(settings, str) else dict(settings)
