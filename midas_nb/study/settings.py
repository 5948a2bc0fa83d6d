"""The run description: one frozen, typed settings object per study, built and checked once (decision 0060), e.g.
``RunSettings.build("smoke", budget=0.5).point``; :class:`ReportSettings`: what the report reads of a run's profile."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from types import MappingProxyType
from typing import Any, Mapping, Optional

from .. import config
from ..analysis.protocol import PROTOCOL_DEFAULTS
from ..backbones import (backbone_kwargs, check_backbone, check_epochs, comparison_backbones, TrainingRecipe,
                         weights_for)
from ..data import check_layout
from ..identity import hash_json
from ..point import Budget, Point

__all__ = ["RunSettings", "DataSettings", "BackboneSettings", "SweepSettings", "ReportSettings",
           "TOP_LEVEL_PROTOCOL_SETTINGS", "protocol_settings", "grid_spans"]


@dataclass(frozen=True)
class DataSettings:
    """The data one study reads. ``label``: the name results carry (``"aircraft (family)"``); ``loader``: the reader
    (CUB's for the embedded synthetic set, ``embedded``); sizes in px; ``max_images_per_class``: ``None`` for all."""

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
    """The backbone a study fine-tunes and prunes. ``weights``: a file, ``"hub"`` or ``None`` (random init);
    ``kwargs``: timm ``VisionTransformer`` arguments; ``recipe`` seeded by ``build``; ``builds``: decision 0072."""

    name: str
    weights: str | None
    kwargs: Mapping[str, Any]
    recipe: TrainingRecipe
    build: int
    builds: int


@dataclass(frozen=True)
class SweepSettings:
    """The regime sweep (notebook 04), the scale readout (05) and the related methods' seeds (06); ``seeds`` at the
    sweep's other points; ``compare_backbones``: :func:`midas_nb.backbones.comparison_backbones` (``planned``)."""

    depths: tuple[int, ...]
    budgets: tuple[Budget, ...]
    regime_grid: str
    seeds: tuple[int, ...]
    conditions: tuple[str, ...]
    related_seeds: tuple[int, ...]
    scale_backbones: tuple[str, ...]
    other_backbones: bool
    compare_backbones: tuple[str, ...]

    @classmethod
    def of(cls, p: Mapping[str, Any]) -> "SweepSettings":
        """The sweep lists of a profile, typed, not checked (empty stays empty); a list left out is the study's."""
        seeds, depths, budgets = tuple(int(s) for s in p["seeds"]), p.get("depths"), p.get("budgets")
        return cls(depths=tuple(int(d) for d in ([p["depth"]] if depths is None else depths)),
                   budgets=tuple(Budget(b) for b in ([p["budget"]] if budgets is None else budgets)),
                   regime_grid=str(p.get("regime_grid", "cross")),
                   seeds=tuple(int(s) for s in p.get("sweep_seeds") or seeds),
                   conditions=tuple(p.get("sweep_conditions") or p["conditions"]),
                   related_seeds=tuple(int(s) for s in p.get("related_seeds") or seeds),
                   scale_backbones=tuple(p.get("scale_backbones") or [p["backbone"]]),
                   other_backbones=bool(p.get("other_backbones", True)),
                   compare_backbones=tuple(comparison_backbones(dict(p), planned=True)))


def grid_spans(p: Mapping[str, Any], kind: str = "regime") -> tuple[list[str], list[str]]:
    """``(datasets, backbones)`` a sweep of ``kind`` spans, each defaulting to the study's own: for ``"scale"`` the
    ``scale_backbones`` (the study's alone where ``other_backbones`` is false), else the ``backbones``."""
    own = [p["backbone"]]
    alone = kind == "scale" and not p.get("other_backbones", True)
    backbones = own if alone else p.get("scale_backbones" if kind == "scale" else "backbones") or own
    return list(p.get("datasets") or [p["dataset"]]), list(backbones)


#: protocol settings a profile may also set at its top level (:func:`protocol_settings`)
TOP_LEVEL_PROTOCOL_SETTINGS = ("relaxation", "lam", "temperature", "eval_subset_seed", "throughput_batch",
                               "throughput_repeats", "precision")
_ALWAYS_KEYED = ("relaxation", "lam", "temperature")     # in every cell's key, given or not (PROTOCOL_DEFAULTS)


def protocol_settings(profile: Mapping[str, Any]) -> dict[str, Any]:
    """The profile's settings that change a protocol run's result (every cell's key; ``run_protocol``'s arguments less
    ``image_size``/``patch_size``); relaxation, lam, temperature always; ``scorer_train`` keys win over the top."""
    out = {k: profile.get(k, PROTOCOL_DEFAULTS[k]) for k in _ALWAYS_KEYED}
    out.update({k: profile[k] for k in TOP_LEVEL_PROTOCOL_SETTINGS if k in profile})
    out.update(dict(profile.get("scorer_train") or {}))
    return out | {k: profile[k] for k in ("idauc_steps", "max_eval_images", "max_idauc_images", "bootstrap",
                                          "image_size", "patch_size") if k in profile}


@dataclass(frozen=True)
class RunSettings:
    """One study's settings, typed; build with :meth:`build`. ``statistics``: the profile's ``RunProfile``;
    ``protocol``: that model as the protocol's runs receive it (:func:`protocol_settings`' values, tuples)."""

    profile: str
    point: Point
    data: DataSettings
    backbone: BackboneSettings
    protocol: config.RunProfile
    statistics: config.RunProfile
    sweep: SweepSettings
    device: str
    torch_threads: int | None
    values: Mapping[str, Any]

    @classmethod
    def build(cls, profile: str = "quick", **overrides: Any) -> "RunSettings":
        """Profile ``profile`` with ``overrides`` (``None`` values ignored), checked and typed; raises
        :class:`midas_nb.config.ProfileError` (a ``ValueError``) with every problem, one line each."""
        if profile not in config.PROFILES:
            raise config.ProfileError([f"profile: expected one of {sorted(config.PROFILES)}, got {profile!r}"])
        p = config.get_profile(profile, **overrides)
        run, problems = config.RunProfile.check(p)   # the profile's part, typed and checked once (decision 0081)
        problems += config.check_device(p.get("device"))   # a device of this machine
        recipe = p.get("scorer_train") if isinstance(p.get("scorer_train"), dict) else {}
        problems += [f"{k}: {p[k]!r} at the top level and {recipe[k]!r} in scorer_train; give one (scorer_train's "
                     "would be used)" for k in TOP_LEVEL_PROTOCOL_SETTINGS
                     if k in p and k in recipe and p[k] != recipe[k]]
        bad = {config.setting_of(line) for line in problems}
        if not bad & {"backbone", "backbone_kwargs", "image_size", "patch_size"}:
            depths = [] if bad & {"depth", "depths"} else [p["depth"], *(p.get("depths") or [])]
            problems += check_backbone(p["backbone"], backbone_kwargs(p, p["backbone"]), depths,
                                       image_size=p["image_size"], patch_size=p["patch_size"])
        name, root, label, bb = p.get("dataset", "cub"), None, None, p["backbone"]
        if not bad & {"dataset", "data_root", "data_roots", "aircraft_level"}:   # the data, no image read
            try:
                root = config.data_root_for(p, name)
                label = "synthetic" if root is None else config.dataset_label(p, name)
            except ValueError as e:
                problems.append(str(e))
            problems += check_layout(name, root) if root is not None and not root.is_dir() else []
        if label is not None and not bad & {"backbone", "finetune", "synthetic_finetune"}:   # bb trains on label
            problems += [f"{config.finetune_setting_name(p, label, bb, 'epochs')}: on {label}, {why}"
                         for why in check_epochs(bb, config.finetune_settings(p, label, bb).get("epochs"))]
        if problems:  # nothing is replaced: a bad value is an error, never the profile's default
            raise config.ProfileError(problems)
        syn, embedded = MappingProxyType(dict(p.get("synthetic") or {})), root is None   # root: by its generator
        root = config.cache_dir() / "data" / f"synthetic_{hash_json(dict(syn), 12)}" if embedded else root
        data = DataSettings(dataset=name, label=label, root=root, loader="cub" if embedded else name, embedded=embedded,
                            image_size=run.image_size, patch_size=run.patch_size,
                            max_images_per_class=config.images_per_class(p, label),
                            aircraft_level=run.aircraft_level, synthetic=syn)
        backbone = BackboneSettings(name=bb, weights=weights_for(p, bb),
                                    kwargs=MappingProxyType(backbone_kwargs(p, bb)),
                                    recipe=TrainingRecipe(seed=run.build, **config.finetune_settings(p, label, bb)),
                                    build=run.build, builds=run.builds)
        keyed = dict(PROTOCOL_DEFAULTS, **protocol_settings(p))
        protocol = run.model_copy(update={k: tuple(getattr(run, k)) for k in ("conditions", "targets", "seeds")} | {
            k: int(keyed[k]) for k in ("eval_subset_seed", "throughput_batch", "throughput_repeats")} | {
            "scorer_train": MappingProxyType(dict(p.get("scorer_train") or {}))})
        return cls(profile=p["profile"], point=run.point, data=data, backbone=backbone, protocol=protocol,
                   statistics=run, sweep=SweepSettings.of(p), device=run.device, torch_threads=run.torch_threads,
                   values=MappingProxyType(p))


class ReportSettings(config.RunProfile):
    """What the report reads of a run's profile (no root or weights file opened): its validated model with
    ``relaxation`` ``"st"`` by default, 05's ``compare_backbones``, its :class:`SweepSettings`, ``values`` read-only."""

    profile: str = "default"
    relaxation: str = "st"
    compare_backbones: Optional[list[str]] = None
    values: Any = None

    @classmethod
    def of(cls, settings: "ReportSettings | Mapping[str, Any]") -> "ReportSettings":
        """The report's part of a profile mapping (no data read); raises :class:`midas_nb.config.ProfileError`."""
        if isinstance(settings, ReportSettings):
            return settings
        s, problems = cls.check(dict(settings, values=MappingProxyType(dict(settings))))
        if problems:
            raise config.ProfileError(problems)
        return s

    @cached_property
    def sweep(self) -> SweepSettings:
        return SweepSettings.of(self.values)
