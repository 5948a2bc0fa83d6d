"""Profiles (smoke / quick / paper / rehearsal) and paths (DESIGN.md §7): plain dicts of settings read from
``midas_nb/profiles.yaml`` (decision 0064), typed and checked by :class:`RunProfile`."""
from __future__ import annotations

import copy
import os
import re
from pathlib import Path
from typing import Annotated, Any, Callable, ClassVar, Literal, Mapping, Optional, Sequence, Union

import yaml
from pydantic import (AfterValidator, BaseModel, ConfigDict, Discriminator, Field, PlainValidator, StrictBool,
                      StrictStr, Tag, ValidationError, ValidationInfo, WrapValidator, field_validator)
from pydantic_core import PydanticCustomError

from .point import MIN_BUDGET, Budget, Point, did_you_mean, is_int, is_number, show_value

__all__ = ["PROFILES", "get_profile", "finetune_settings", "finetune_setting_name", "merged_settings", "cache_dir",
           "runs_dir", "figures_dir", "project_root", "default_data_root", "DATASET_NAMES", "PAPER_DATASETS",
           "PAPER_BACKBONES", "data_root_for", "dataset_label", "images_per_class", "dataset_of_label",
           "AIRCRAFT_LEVELS", "PRECISIONS", "RunProfile", "Schedule", "Checked", "DataRoots", "BackboneName", "DirPath",
           "DeviceName", "WeightsFiles", "check_lines", "expect", "problem", "check_device", "is_int", "is_number",
           "is_path", "setting_of", "ProfileError"]

#: the paper's three real datasets (DESIGN.md §7), in its order
PAPER_DATASETS: tuple[str, ...] = ("cub", "aircraft", "cars")
#: every dataset name, in the order tables show them
DATASET_NAMES: tuple[str, ...] = PAPER_DATASETS + ("synthetic",)
#: the paper's three backbones (timm tags), smallest first
PAPER_BACKBONES: tuple[str, ...] = ("deit_tiny_patch16_224.fb_in1k", "deit_small_patch16_224.fb_in1k",
                                    "vit_base_patch16_224.augreg_in21k_ft_in1k")
#: FGVC-Aircraft's label levels; the first (the paper's) is the one a dataset label leaves unsaid
AIRCRAFT_LEVELS: tuple[str, ...] = ("variant", "family", "manufacturer")
PRECISIONS: tuple[str, ...] = ("float32", "bfloat16")   # a protocol run's numerics (decisions/0063)

_DATA = yaml.load(Path(__file__).with_name("profiles.yaml").read_text(encoding="utf-8"),   # libyaml where built
                  Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
_COMMON: dict[str, Any] = _DATA["common"]   # keys every profile has (a profile's own entry wins)
#: the profiles by name, each as written in ``midas_nb/profiles.yaml`` (without the common keys)
PROFILES: dict[str, dict[str, Any]] = _DATA["profiles"]


def get_profile(name: str = "quick", **overrides: Any) -> dict[str, Any]:
    """A copy of profile ``name`` with ``overrides`` (``None`` ignored; CUB named clears ``synthetic_default``), as
    written (:meth:`RunProfile.check` checks it); ``ValueError`` for an unknown name."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; expected one of {sorted(PROFILES)}")
    prof = copy.deepcopy(dict(_COMMON, **PROFILES[name]))   # a caller's change never reaches PROFILES
    prof.update({k: v for k, v in overrides.items() if v is not None})
    named = [overrides.get("dataset")] + (overrides["datasets"] if isinstance(overrides.get("datasets"), list) else [])
    if "cub" in named and "synthetic_default" not in overrides:
        prof["synthetic_default"] = False  # CUB asked for by name is read from a root, never the synthetic set
    if isinstance(prof.get("weights"), (str, os.PathLike)):  # a bare path: the study's backbone's file
        prof["weights"] = {str(prof.get("backbone")): str(prof["weights"])}
    prof["profile"] = name
    return prof


def _finetune_source(profile: dict[str, Any], label: str) -> str:
    return "synthetic_finetune" if label == "synthetic" and profile.get("synthetic_finetune") else "finetune"


def finetune_setting_name(profile: dict[str, Any], label: str, backbone: str, setting: str) -> str:
    """The dotted profile key a :func:`finetune_settings` value comes from (``"finetune.aircraft.lr"``)."""
    recipe = profile.get(source := _finetune_source(profile, label)) or {}
    entry = next((f"{e}." for e in (backbone, dataset_of_label(label))
                  if isinstance(recipe.get(e), dict) and setting in recipe[e]), "")
    return f"{source}.{entry}{setting}"


def finetune_settings(profile: dict[str, Any], label: str, backbone: str | None = None) -> dict[str, Any]:
    """The ``finetune`` recipe (``synthetic_finetune`` on synthetic where given): shared, dataset's, backbone's."""
    return merged_settings(profile.get(_finetune_source(profile, label)), dataset_of_label(label), backbone)


def merged_settings(settings: dict[str, Any] | None, *entries: str | None) -> dict[str, Any]:
    """The non-dict values of ``settings``, updated by its dict values named ``entries``, in order."""
    settings = settings or {}
    out = {k: v for k, v in settings.items() if not isinstance(v, dict)}
    return out | {k: v for e in entries if isinstance(settings.get(e), dict) for k, v in settings[e].items()}


def project_root() -> Path:
    """The repository root (parent of the ``midas_nb`` package)."""
    return Path(__file__).resolve().parent.parent


def _env_dir(env: str, default: Path) -> Path:
    """``$env`` else ``default``, created; :class:`ProfileError` naming ``env`` where it cannot be."""
    path = Path(os.environ.get(env) or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "is a file" if path.is_file() else f"cannot be created ({e.strerror or e})"
        src = f"{env} names it" if os.environ.get(env) else f"set {env} to move it"
        raise ProfileError([f"{path} {why}; expected a writable directory ({src})"]) from None
    return path


def cache_dir(given: str | os.PathLike | None = None) -> Path:
    """``given``, else ``MIDAS_CACHE_DIR``, else ``$XDG_CACHE_HOME/midas_nb`` or ``~/.cache/midas_nb`` (checkpoints...)."""
    return Path(given) if given is not None else _env_dir(
        "MIDAS_CACHE_DIR", Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "midas_nb")


def runs_dir() -> Path:
    """``MIDAS_RUNS_DIR``, else ``runs/`` (git-ignored) under the project root."""
    return _env_dir("MIDAS_RUNS_DIR", project_root() / "runs")


def figures_dir(profile: str | None = None) -> Path:
    """``MIDAS_FIGURES_DIR``, else ``figures/<profile>/`` under the project root."""
    return _env_dir("MIDAS_FIGURES_DIR", project_root() / "figures" / (profile or ""))


def default_data_root() -> Path:
    """``../shared/data`` relative to the project root (may not exist)."""
    return project_root().parent / "shared" / "data"


def list_profiles() -> list[str]:
    return sorted(PROFILES)


#: the sweeps of a profile, by name, with the notebook that reads them (``midas-nb sweep --sweep``)
SWEEPS: dict[str, str] = {"protocol": "02", "soft": "02", "random": "02", "regime": "04", "scale": "05",
                          "backbones": "05", "related": "06"}


def sweep_names(text: str | None) -> list[str]:
    """``--sweep``'s comma-separated names (``None``, ``"all"``: all :data:`SWEEPS`); ``ValueError`` for bad ones."""
    names = list(SWEEPS) if text in (None, "all") else [s.strip() for s in text.split(",") if s.strip()]
    if not names or (bad := [n for n in names if n not in SWEEPS]):
        why = f"unknown sweep(s) {bad}" if names else f"{text!r} names no sweep"
        raise ValueError(f"{why}; expected some of {list(SWEEPS)} (or 'all')")
    return names


class ProfileError(ValueError):
    """Settings that cannot run, one line per problem in ``problems`` and the message (decision 0024)."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def setting_of(line: str) -> str:
    """The profile key a :meth:`RunProfile.problems` line is about (``"finetune"`` for ``"finetune.lr: ..."``)."""
    return line.split(":", 1)[0].split(".", 1)[0].strip()


def data_roots_of(profile: dict[str, Any]) -> dict[str, str]:
    """``{dataset: directory}``: ``data_roots`` without ``None``, then ``data_root`` for the profile's own dataset."""
    roots = {str(k): str(v) for k, v in (profile.get("data_roots") or {}).items() if v is not None}
    own = profile.get("dataset")
    if profile.get("data_root") is not None and own in PAPER_DATASETS:
        roots.setdefault(own, str(profile["data_root"]))
    return roots


def data_root_for(profile: dict[str, Any], dataset: str) -> Path | None:
    """The directory a profile reads ``dataset`` from, or ``None`` for the embedded synthetic set (``"synthetic"``,
    or ``"cub"`` with ``synthetic_default`` and no root); ``ValueError`` for an unknown dataset or a missing root."""
    if dataset not in DATASET_NAMES:
        raise ValueError(f"unknown dataset {dataset!r}; expected one of {DATASET_NAMES}")
    if dataset == "synthetic":
        return None
    roots = data_roots_of(profile)
    if dataset in roots:
        return Path(roots[dataset]).expanduser()
    if dataset == "cub" and profile.get("synthetic_default") and not roots:
        return None
    given = f"; data roots given: {sorted(roots)}" if roots else ""
    why = ("CUB asked for by name is never the embedded synthetic set, dataset 'synthetic' is" if dataset == "cub" and
           PROFILES.get(profile.get("profile"), {}).get("synthetic_default") else
           f"the {profile.get('profile', '?')} profile substitutes no synthetic data")
    raise ValueError(f"dataset {dataset!r} has no data root: pass --data-root {dataset}=/path/to/{dataset} "
                     f"({why}{given})")


def images_per_class(profile: dict[str, Any], dataset: str) -> int | None:
    """The profile's cap on images per class of ``dataset`` (a name or a :func:`dataset_label`), or ``None``."""
    cap = profile.get("max_images_per_class")
    cap = cap.get(dataset_of_label(dataset)) if isinstance(cap, dict) else cap
    return None if cap is None else int(cap)


def dataset_label(profile: dict[str, Any], dataset: str) -> str:
    """The name results carry: ``"synthetic"``, ``"aircraft (family)"`` at a non-paper label level, else the name."""
    if data_root_for(profile, dataset) is None:
        return "synthetic"
    level = profile.get("aircraft_level") or AIRCRAFT_LEVELS[0]
    return f"{dataset} ({level})" if dataset == "aircraft" and level != AIRCRAFT_LEVELS[0] else dataset


def dataset_of_label(label: str) -> str:
    """The dataset name of a :func:`dataset_label` (``"aircraft (manufacturer)"`` -> ``"aircraft"``)."""
    base, _, level = str(label).partition(" (")
    return base if base == "aircraft" and level.rstrip(")") in AIRCRAFT_LEVELS else str(label)


def is_path(v: Any) -> bool:
    """A non-empty path or name, ``str`` or ``os.PathLike``."""
    return isinstance(v, (str, os.PathLike)) and bool(str(v).strip())


def check_device(device: Any, *, here: bool = True) -> list[str]:
    """``[]`` when ``device`` (cpu, cuda[:N], mps) exists here, else its problem; ``here=False``: the name only."""
    if not isinstance(device, str) or not re.fullmatch(r"cpu|mps|cuda(:\d+)?", device):
        return [f"device: expected 'cpu', 'cuda', 'cuda:N' or 'mps', got {show_value(device)}"]
    if not here:
        return []
    import torch

    if device.startswith("cuda"):
        if not torch.cuda.is_available():
            return [f"device: {device!r} was asked for but this machine has no CUDA device "
                    f"(torch {torch.__version__}, CUDA build {torch.version.cuda}); "
                    "use device 'cpu' (command line: --device cpu)"]
        if int(device.partition(":")[2] or 0) >= torch.cuda.device_count():
            return [f"device: {device!r} does not exist; this machine has {torch.cuda.device_count()} CUDA device(s)"]
    if device == "mps" and not (getattr(torch.backends, "mps", None) and torch.backends.mps.is_available()):
        return ["device: 'mps' was asked for but is not available on this machine"]
    return []


# The settings as one pydantic model (decision 0081); a problem is one line ``setting: expected WHAT, got VALUE``.
def problem(text: str, whole: bool = True) -> PydanticCustomError:
    """A validator's problem: the whole line, or (``whole=False``) the words after the setting's name."""
    return PydanticCustomError("line" if whole else "expected", "{text}", {"text": text})


def expect(what: str, test: Callable[[Any], bool] = lambda v: True, hint: Callable[[Any], str] = lambda v: "",
           nested: bool = False) -> WrapValidator:
    """Type errors and values ``test`` refuses as ``expected {what}, got {value}{hint}`` (``nested``: inner pass)."""
    def check(v: Any, handler: Callable[[Any], Any]) -> Any:
        try:
            if test(v):
                return handler(v)
        except ValidationError:
            if nested:
                raise
        raise problem(f"expected {what}, got {show_value(v)}{hint(v)}", whole=False)
    return WrapValidator(check)


def check_lines(lines: list[str], v: Any) -> Any:
    """``v`` when ``lines`` is empty, else a validator's problem of those whole lines."""
    if lines:
        raise problem("\n".join(lines))
    return v


def _int(lo: int | None = None, what: str = "") -> Any:
    return Annotated[int, Field(ge=lo), expect(what or f"an integer >= {lo}", is_int)]   # NumPy's too


def _num(what: str, **bounds: float) -> Any:
    return Annotated[float, Field(**bounds), expect(what, is_number)]


def _one_of(*names: str, what: str = "") -> Any:
    return Annotated[Literal[names], expect(what or f"one of {list(names)}")]   # type: ignore[valid-type]


def _list_of(item: Any, what: str) -> Any:
    """A non-empty list of ``item`` without duplicates; a wrong entry is named with the whole list."""
    def check(v: Any, handler: Callable[[Any], Any]) -> Any:
        if not isinstance(v, (list, tuple)) or not v:
            raise problem(f"expected a non-empty list of {what} (e.g. [0, 1]), got {show_value(v)}", whole=False)
        try:
            out = handler(list(v))
        except ValidationError as e:
            wrong = ", ".join(show_value(v[i]) for i in sorted({err["loc"][0] for err in e.errors()}))
            raise problem(f"expected a list of {what}; wrong: {wrong} (in {list(v)!r})", whole=False) from None
        if len(set(out)) != len(out):
            raise problem(f"duplicated entries in {list(v)!r}", whole=False)
        return out
    return Annotated[list[item], WrapValidator(check)]


_NAMES = Annotated[list[Annotated[StrictStr, Field(min_length=1)]], Field(min_length=1),
                   expect("a non-empty list of names")]
#: a backbone's name, a directory (of a profile or a run file: one check, one line)
BackboneName = Annotated[StrictStr, Field(min_length=1), expect("a backbone name", hint=lambda v: "; the names: "
                         "python -c 'import midas_nb.backbones as b; print(b.list_backbones())' or a timm ViT name")]
DirPath = Annotated[Any, expect("a directory path", lambda v: v is None or is_path(v))]
#: a device's name, not looked for on this machine (of a profile or a run file; :func:`check_device`)
DeviceName = Annotated[Any, AfterValidator(lambda v: check_lines(check_device(v, here=False), v))]
_CAPS = "None (all), an integer >= 1 or {dataset: integer >= 1}"
_CAP = Annotated[Optional[int], expect(_CAPS, lambda v: v is None or (is_int(v) and v >= 1))]
_BUDGET = Annotated[Budget, PlainValidator(Budget)]
_SEEDS = Optional[_list_of(_int(), "integers")]
#: ``{paper dataset: directory}`` (``data_roots``, of a profile or a run file)
DataRoots = Annotated[dict, expect("a mapping {dataset: directory}"), AfterValidator(lambda v: check_lines([
    f"data_roots: unknown dataset {k!r}; expected names from {list(PAPER_DATASETS)}" if k not in PAPER_DATASETS
    else f"data_roots.{k}: expected a directory path, got {show_value(x)}"
    for k, x in v.items() if k not in PAPER_DATASETS or not is_path(x)], v))]


def _check_weights(weights: Any) -> Any:
    return check_lines([f"weights.{k}: expected a weights file path, got {show_value(x)}" if isinstance(k, str) and k
                        else f"weights: expected backbone names as keys, got {show_value(k)}"
                        for k, x in weights.items() if not (isinstance(k, str) and k and is_path(x))], weights) \
        if isinstance(weights, dict) else weights


#: ``weights``: a mapping ``{backbone: file}`` or one file (the study's backbone's)
WeightsFiles = Annotated[Any, expect("a mapping {backbone: file} or a file path", lambda v: is_path(v) or isinstance(
    v, dict)), AfterValidator(_check_weights)]


class Checked(BaseModel):
    """A model whose problems are lines (:meth:`check`; ``UNKNOWN``: the line of a name it lacks)."""

    UNKNOWN: ClassVar[str] = "{name}: unknown setting{hint}; expected a key of the profiles (midas_nb.config.PROFILES)"

    @classmethod
    def check(cls, values: Mapping[str, Any]) -> tuple[Any, list[str]]:
        """``(model, [])``, or ``(None, every problem)`` (decision 0024): unknown names first, then the fields'."""
        try:
            return cls.model_validate(dict(values)), []
        except ValidationError as e:
            errors = sorted(e.errors(), key=lambda r: r["type"] != "extra_forbidden")
        lines: list[str] = []
        for err in errors:
            if err["type"] == "extra_forbidden":
                name = str(err["loc"][-1])
                text = cls.UNKNOWN.format(name=name, hint=did_you_mean([name], cls.model_fields),
                                          known=list(cls.model_fields))
            elif err["type"] == "value_error":   # a typed value's own one-line message (Budget)
                text = str(err["ctx"]["error"])
            else:
                where = ".".join(str(x) for x in err["loc"] if x != "entry")
                text = err["msg"] if err["type"] == "line" else f"{where}: {err['msg']}"
            lines += [line for line in text.splitlines() if line not in lines]
        return None, lines

    @classmethod
    def problems(cls, values: Mapping[str, Any]) -> list[str]:
        """Every problem of ``values`` (types and ranges, nothing loaded), one line each; ``[]`` when fine."""
        return cls.check(values)[1]


class Schedule(Checked):
    """A ``finetune``, ``synthetic_finetune`` or ``scorer_train`` schedule; its ``{dataset or backbone: {...}}`` too."""

    model_config = ConfigDict(extra="allow", frozen=True)
    __pydantic_extra__: dict[str, Annotated[Union[Annotated["Schedule", Tag("entry")], Annotated[Any, Tag("value")]],
                                            Discriminator(lambda v: "entry" if isinstance(v, dict) else "value")]]
    epochs: _int(1) = None
    batch_size: _int(1) = None
    throughput_repeats: _int(1) = None
    throughput_batch: _int(1) = None
    lr: _num("a number > 0", gt=0) = None
    warmup_epochs: _num("a number >= 0", ge=0) = None
    weight_decay: _num("a number >= 0", ge=0) = None
    label_smoothing: _num("a number in [0, 1)", ge=0, lt=1) = None


_SCHEDULE = Annotated[Optional[Schedule], expect("a mapping such as {epochs: 3, batch_size: 64, lr: 0.001}",
                                                 lambda v: v is None or isinstance(v, dict), nested=True)]


class RunProfile(Checked):
    """A profile's settings with overrides, typed and validated once (decision 0081); an unknown key is a problem."""

    model_config = ConfigDict(extra="forbid", frozen=True, validate_default=True, arbitrary_types_allowed=True)
    profile: Optional[str] = None
    run_kind: Any = None
    # data and backbone names; the sweeps' lists of them
    dataset: _one_of(*DATASET_NAMES) = None
    backbone: BackboneName = None
    scale_backbones: Optional[_NAMES] = None
    backbones: Optional[_NAMES] = None
    datasets: Optional[_NAMES] = None
    regime_grid: _one_of("cross", "full", "depth", "budget", what="cross, full, depth or budget") = "cross"
    other_backbones: Annotated[StrictBool, expect("true or false")] = True
    aircraft_level: _one_of(*AIRCRAFT_LEVELS) = AIRCRAFT_LEVELS[0]
    precision: _one_of(*PRECISIONS) = PRECISIONS[0]
    # the point and the grids around it
    depth: _int(1, "an integer L >= 1 (the scorer reads block L)") = None
    budget: _BUDGET = None
    depths: Optional[_list_of(_int(1), "integers L >= 1")] = None
    budgets: Optional[_list_of(_BUDGET, f"kept fractions b in (0, 1], at least {MIN_BUDGET:g}")] = None
    seeds: _list_of(_int(), "integers") = None
    sweep_seeds: _SEEDS = None
    related_seeds: _SEEDS = None
    conditions: _NAMES = None
    sweep_conditions: Optional[_NAMES] = None
    targets: _NAMES = None
    # evaluation, statistics, images
    idauc_steps: _int(1) = None
    bootstrap: _int(1) = None
    image_size: _int(1) = None
    patch_size: _int(1) = None
    eval_subset_seed: _int(0) = 0
    throughput_batch: _int(1) = 1
    throughput_repeats: _int(1) = 1
    builds: _int(1) = 1
    build: _int(0) = 0
    max_eval_images: _CAP = None
    max_idauc_images: _CAP = None
    max_images_per_class: Annotated[Union[None, int, dict], expect(_CAPS, lambda v: isinstance(v, dict) or (
        v is None or (is_int(v) and v >= 1)))] = None
    torch_threads: _CAP = None
    # training: the backbone's fine-tuning, the scorers'
    finetune: _SCHEDULE = None
    synthetic_finetune: _SCHEDULE = None
    scorer_train: _SCHEDULE = None
    # paths
    data_root: DirPath = None
    data_roots: DataRoots = None
    weights: WeightsFiles = None
    pretrained: Annotated[Optional[Literal["hub"]], expect("'hub' or None")] = None
    backbone_kwargs: Annotated[dict, expect("a mapping of timm VisionTransformer arguments")] = None
    device: Any = None   # a name of this machine: check_device
    synthetic: Any = None
    synthetic_default: Any = None
    relaxation: Any = None
    lam: Any = None
    temperature: Any = None

    @field_validator("datasets", "max_images_per_class", "patch_size", "data_root", "data_roots")
    @classmethod
    def _across(cls, v: Any, info: ValidationInfo) -> Any:
        """The checks that read another setting or each entry of a mapping."""
        d, key, bad = info.data, info.field_name, None
        if key == "datasets" and v and (wrong := [x for x in v if x not in DATASET_NAMES]):
            bad = f"datasets: unknown dataset(s) {wrong}; expected names from {list(DATASET_NAMES)}"
        elif key == "max_images_per_class" and isinstance(v, dict) and (
                wrong := {k: x for k, x in v.items() if k not in DATASET_NAMES or not (is_int(x) and x >= 1)}):
            bad = (f"max_images_per_class: expected {{dataset: integer >= 1}} with datasets from "
                   f"{list(DATASET_NAMES)}, got {show_value(wrong)}")
        elif key == "patch_size" and isinstance(d.get("image_size"), int) and d["image_size"] % v:
            bad = f"image_size: {d['image_size']} px is not a multiple of patch_size {v}"
        elif key == "data_root" and v is not None and d.get("dataset") == "synthetic":
            bad = (f"data_root: {str(v)!r} was given but the run's dataset is 'synthetic', which is generated and "
                   f"takes no data root; use --dataset cub --data-root PATH for a CUB directory")
        elif key == "data_roots" and (own := d.get("dataset")) in v and is_path(root := d.get("data_root")) and Path(
                str(v[own])).expanduser() != Path(str(root)).expanduser():
            bad = (f"data_root: {str(root)!r} and data_roots.{own} = {str(v[own])!r}"
                   f" name two roots for {own!r}; give one")
        return check_lines([bad] if bad else [], v)

    @property
    def point(self) -> Point:
        """``Point(depth, budget)``."""
        return Point(self.depth, self.budget)

