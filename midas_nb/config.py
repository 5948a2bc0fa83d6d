"""Profiles (smoke / quick / paper / rehearsal) and paths (DESIGN.md §7): a profile is a plain dict of
settings read from ``midas_nb/profiles.yaml`` (decision 0064); ``get_profile(name, **overrides)`` overrides
single keys."""
from __future__ import annotations

import contextlib
import os
import re
from pathlib import Path
from typing import Any, Callable, Sequence

import yaml

from .point import MIN_BUDGET, Budget, Point, is_int, is_number, show_value

__all__ = ["PROFILES", "get_profile", "finetune_settings", "finetune_setting_name", "finetune_source",
           "cache_dir", "runs_dir", "figures_dir", "project_root", "default_data_root",
           "DATASET_NAMES", "PAPER_DATASETS", "PAPER_BACKBONES", "data_root_for", "dataset_label", "images_per_class",
           "dataset_of_label", "AIRCRAFT_LEVELS", "PRECISIONS", "backbone_kwargs_for", "check_profile",
           "check_device", "check_data_roots", "SCHEDULE_CHECKS", "schedule_problems", "is_int", "is_number", "is_path",
           "setting_of", "ProfileError"]

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
    """A copy of profile ``name`` with ``overrides`` (``None`` values ignored) merged in, its ``budget``
    a :class:`midas_nb.point.Budget` where valid; CUB named by an override clears ``synthetic_default``;
    ``ValueError`` for an unknown profile name."""
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; expected one of {sorted(PROFILES)}")
    prof = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in dict(_COMMON, **PROFILES[name]).items()}
    prof.update({k: v for k, v in overrides.items() if v is not None})
    named = [overrides.get("dataset")] + (overrides["datasets"] if isinstance(overrides.get("datasets"), list) else [])
    if "cub" in named and "synthetic_default" not in overrides:
        prof["synthetic_default"] = False  # CUB asked for by name is read from a root, never the synthetic set
    if isinstance(prof.get("weights"), (str, os.PathLike)):  # a bare path: the study's backbone's file
        prof["weights"] = {str(prof.get("backbone")): str(prof["weights"])}
    prof["profile"] = name
    with contextlib.suppress(ValueError):  # a bad budget stays as given, for check_profile's line
        prof["budget"] = Budget(prof.get("budget"))
    return prof


def finetune_source(profile: dict[str, Any], dataset_label: str) -> str:
    """``"synthetic_finetune"`` for the embedded synthetic set when the profile has one, else ``"finetune"``."""
    return "synthetic_finetune" if dataset_label == "synthetic" and profile.get("synthetic_finetune") else "finetune"


def finetune_setting_name(profile: dict[str, Any], dataset_label: str, backbone: str, setting: str) -> str:
    """The dotted profile key a :func:`finetune_settings` value comes from (``"finetune.aircraft.lr"``)."""
    source = finetune_source(profile, dataset_label)
    recipe = profile.get(source) or {}
    for entry in (backbone, dataset_of_label(dataset_label)):
        if isinstance(recipe.get(entry), dict) and setting in recipe[entry]:
            return f"{source}.{entry}.{setting}"
    return f"{source}.{setting}"


def finetune_settings(profile: dict[str, Any], dataset_label: str, backbone: str | None = None) -> dict[str, Any]:
    """The fine-tuning recipe (:func:`finetune_source`) for a dataset and backbone: the shared settings,
    overridden by the dataset's entry ``{dataset: {...}}``, then by the backbone's ``{backbone: {...}}``."""
    return _merged(profile.get(finetune_source(profile, dataset_label)), dataset_of_label(dataset_label), backbone)


def backbone_kwargs_for(profile: dict[str, Any], backbone: str) -> dict[str, Any]:
    """The timm ``VisionTransformer`` arguments a profile gives ``backbone``: the non-dict entries of
    ``backbone_kwargs``, updated by ``backbone_kwargs[backbone]`` (a dict; else an argument of that name)."""
    return _merged(profile.get("backbone_kwargs"), backbone)


def _merged(settings: dict[str, Any] | None, *entries: str | None) -> dict[str, Any]:
    """The non-dict values of ``settings``, updated by its dict values named ``entries``, in order."""
    settings = settings or {}
    out = {k: v for k, v in settings.items() if not isinstance(v, dict)}
    for entry in entries:
        if isinstance(settings.get(entry), dict):
            out.update(settings[entry])
    return out


def project_root() -> Path:
    """The repository root (parent of the ``midas_nb`` package)."""
    return Path(__file__).resolve().parent.parent


def _env_dir(env: str, default: Path) -> Path:
    """The directory environment variable ``env`` names, else ``default``, created where absent;
    :class:`ProfileError` naming ``env`` where it cannot be (a bad setting, as any other)."""
    path = Path(os.environ.get(env) or default)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        why = "is a file" if path.is_file() else f"cannot be created ({e.strerror or e})"
        src = f"{env} names it" if os.environ.get(env) else f"set {env} to move it"
        raise ProfileError([f"{path} {why}; expected a writable directory ({src})"]) from None
    return path


def cache_dir() -> Path:
    """Cache for checkpoints, stem features and target maps: ``MIDAS_CACHE_DIR`` when set, else
    ``$XDG_CACHE_HOME/midas_nb`` or ``~/.cache/midas_nb``."""
    return _env_dir("MIDAS_CACHE_DIR", Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "midas_nb")


def runs_dir() -> Path:
    """``runs/`` (git-ignored) under the project root, or ``MIDAS_RUNS_DIR``."""
    return _env_dir("MIDAS_RUNS_DIR", project_root() / "runs")


def figures_dir(profile: str | None = None) -> Path:
    """``MIDAS_FIGURES_DIR`` when set, else ``figures/<profile>/`` under the project root."""
    return _env_dir("MIDAS_FIGURES_DIR", project_root() / "figures" / (profile or ""))


def default_data_root() -> Path:
    """``../shared/data`` relative to the project root (may not exist)."""
    return project_root().parent / "shared" / "data"


def list_profiles() -> list[str]:
    """Names of the profiles, sorted."""
    return sorted(PROFILES)


#: the sweeps of a profile, by name, with the notebook that reads them (``midas-nb sweep --sweep``)
SWEEPS: dict[str, str] = {"protocol": "02", "soft": "02", "random": "02", "regime": "04", "scale": "05",
                          "backbones": "05", "related": "06"}


def sweep_names(text: str | None) -> list[str]:
    """``--sweep``'s comma-separated sweep names (``None`` or ``"all"``: every one of :data:`SWEEPS`).

    Raises:
        ValueError: an unknown name, with the known ones; a text that names no sweep.
    """
    names = list(SWEEPS) if text in (None, "all") else [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ValueError(f"{text!r} names no sweep; expected some of {list(SWEEPS)} (or 'all')")
    if bad := [n for n in names if n not in SWEEPS]:
        raise ValueError(f"unknown sweep(s) {bad}; expected some of {list(SWEEPS)} (or 'all')")
    return names


class ProfileError(ValueError):
    """Settings that cannot run, one line per problem in ``problems`` and the message (decision 0024)."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


def setting_of(line: str) -> str:
    """The profile key a :func:`check_profile` line is about (``"finetune"`` for ``"finetune.lr: ..."``)."""
    return line.split(":", 1)[0].split(".", 1)[0].strip()


def data_roots_of(profile: dict[str, Any]) -> dict[str, str]:
    """``{dataset: directory}`` as given: ``data_roots`` (without ``None``) and ``data_root`` for the
    profile's own paper dataset where ``data_roots`` does not name it."""
    roots = {str(k): str(v) for k, v in (profile.get("data_roots") or {}).items() if v is not None}
    own = profile.get("dataset")
    if profile.get("data_root") is not None and own in PAPER_DATASETS:
        roots.setdefault(own, str(profile["data_root"]))
    return roots


def data_root_for(profile: dict[str, Any], dataset: str) -> Path | None:
    """The directory a profile reads ``dataset`` from (:func:`data_roots_of`), or ``None`` for the embedded
    synthetic set: dataset ``"synthetic"``, or ``"cub"`` with ``synthetic_default`` and no root at all;
    ``ValueError`` for an unknown dataset name, or a dataset that needs a root and has none."""
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
    if isinstance(cap, dict):
        cap = cap.get(dataset_of_label(dataset))
    return None if cap is None else int(cap)


def dataset_label(profile: dict[str, Any], dataset: str) -> str:
    """The name results carry for ``dataset``: ``"synthetic"``, ``"aircraft (family)"`` at a label level
    other than the paper's, else the name (raises as :func:`data_root_for`)."""
    if data_root_for(profile, dataset) is None:
        return "synthetic"
    level = profile.get("aircraft_level") or AIRCRAFT_LEVELS[0]
    return f"{dataset} ({level})" if dataset == "aircraft" and level != AIRCRAFT_LEVELS[0] else dataset


def dataset_of_label(label: str) -> str:
    """The dataset name of a :func:`dataset_label` (``"aircraft (manufacturer)"`` -> ``"aircraft"``)."""
    base, _, level = str(label).partition(" (")
    return base if base == "aircraft" and level.rstrip(")") in AIRCRAFT_LEVELS else str(label)


def _is_budget(v: Any) -> bool:
    try:
        Budget(v)
    except ValueError:
        return False
    return True


def is_path(v: Any) -> bool:
    """A non-empty path or name, ``str`` or ``os.PathLike``."""
    return isinstance(v, (str, os.PathLike)) and bool(str(v).strip())


def check_data_roots(roots: Any) -> list[str]:
    """``[]`` when ``roots`` is a mapping ``{paper dataset: directory path}``, else one line per problem."""
    if not isinstance(roots, dict):
        return [f"data_roots: expected a mapping {{dataset: directory}}, got {show_value(roots)}"]
    return [f"data_roots: unknown dataset {k!r}; expected names from {list(PAPER_DATASETS)}" if k not in PAPER_DATASETS
            else f"data_roots.{k}: expected a directory path, got {show_value(v)}"
            for k, v in roots.items() if k not in PAPER_DATASETS or not is_path(v)]


def check_device(device: Any, *, here: bool = True) -> list[str]:
    """``[]`` when ``device`` (cpu, cuda, cuda:N, mps) exists on this machine, else the problem (one line);
    ``here=False`` checks the name only (decision 0038)."""
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


#: what a schedule setting of ``finetune``, ``synthetic_finetune`` or ``scorer_train`` (or of one of their
#: ``{dataset or backbone: {...}}`` entries) must be: ``{key: (test, what a problem line expects)}``, in the
#: order problems are listed; :class:`midas_nb.backbones.TrainingRecipe` checks its schedule with these tests
SCHEDULE_CHECKS: dict[str, tuple[Callable[[Any], bool], str]] = {
    **dict.fromkeys(("epochs", "batch_size", "throughput_repeats", "throughput_batch"),
                    (lambda v: is_int(v) and v >= 1, "an integer >= 1")),
    "lr": (lambda v: is_number(v) and v > 0, "a number > 0"),
    "warmup_epochs": (lambda v: is_number(v) and v >= 0, "a number >= 0"),
    "weight_decay": (lambda v: is_number(v) and v >= 0, "a number >= 0"),
    "label_smoothing": (lambda v: is_number(v) and 0 <= v < 1, "a number in [0, 1)"),
}


def schedule_problems(name: str, recipe: Any) -> list[str]:
    """``[]`` when the schedule ``recipe`` (setting ``name``; ``None``: not given) passes
    :data:`SCHEDULE_CHECKS`, else one line per problem, those of its entries first."""
    if recipe is None:
        return []
    if not isinstance(recipe, dict):
        return [f"{name}: expected a mapping such as {{epochs: 3, batch_size: 64, lr: 0.001}}, "
                f"got {show_value(recipe)}"]
    # a dataset's or backbone's entry {name: {setting: value}} (finetune_settings)
    problems = [line for k, v in recipe.items() if isinstance(v, dict) for line in schedule_problems(f"{name}.{k}", v)]
    return problems + [f"{name}.{k}: expected {what}, got {show_value(recipe[k])}"
                       for k, (ok, what) in SCHEDULE_CHECKS.items() if k in recipe and not ok(recipe[k])]


def check_profile(profile: dict[str, Any], *, device: bool = True) -> list[str]:
    """Every problem of a profile's settings (types and ranges, without loading anything; ``device=True``:
    :func:`check_device`), one line each; ``[]`` when fine."""
    p = profile
    problems: list[str] = []
    _check_names(p, problems)
    if not isinstance(p.get("other_backbones", True), bool):
        problems.append(f"other_backbones: expected true or false, got {show_value(p.get('other_backbones'))}")
    for key, allowed in (("aircraft_level", AIRCRAFT_LEVELS), ("precision", PRECISIONS)):
        if p.get(key, allowed[0]) not in allowed:
            problems.append(f"{key}: expected one of {list(allowed)}, got {show_value(p.get(key))}")
    _check_grid(p, problems)
    for key in ("finetune", "synthetic_finetune", "scorer_train"):
        problems += schedule_problems(key, p.get(key))
    _check_paths(p, problems)
    if device:
        problems += check_device(p.get("device"))
    return problems


def _check_names(p: dict[str, Any], problems: list[str]) -> None:
    """Dataset and backbone names and the lists of names."""
    if p.get("dataset") not in DATASET_NAMES:
        problems.append(f"dataset: expected one of {list(DATASET_NAMES)}, got {show_value(p.get('dataset'))}")
    if not (isinstance(p.get("backbone"), str) and p["backbone"]):
        problems.append(f"backbone: expected a backbone name, got {show_value(p.get('backbone'))}")
    for key in ("scale_backbones", "backbones", "datasets"):
        v = p.get(key)
        if v is not None and not (isinstance(v, list) and v and all(isinstance(x, str) and x for x in v)):
            problems.append(f"{key}: expected a non-empty list of names, got {show_value(v)}")
    if p.get("regime_grid", "cross") not in ("cross", "full", "depth", "budget"):
        problems.append(f"regime_grid: expected cross, full, depth or budget, got {show_value(p['regime_grid'])}")
    if isinstance(p.get("datasets"), list) and (bad := [d for d in p["datasets"] if d not in DATASET_NAMES]):
        problems.append(f"datasets: unknown dataset(s) {bad}; expected names from {list(DATASET_NAMES)}")


def _check_grid(p: dict[str, Any], problems: list[str]) -> None:
    """Depth, budget, their sweep lists, seeds, conditions and the integer settings."""
    try:
        Point(p.get("depth"), p.get("budget"))
    except ValueError as e:
        problems.extend(str(e).splitlines())
    for key, ok, what in (("depths", lambda v: is_int(v) and v >= 1, "integers L >= 1"),
                          ("budgets", _is_budget, f"kept fractions b in (0, 1], at least {MIN_BUDGET:g}"),
                          *((k, is_int, "integers") for k in ("seeds", "sweep_seeds", "related_seeds"))):
        if (v := p.get(key)) is None and key != "seeds":
            continue
        if not isinstance(v, (list, tuple)) or not v:
            problems.append(f"{key}: expected a non-empty list of {what} (e.g. [0, 1]), got {show_value(v)}")
        elif not all(ok(x) for x in v):  # the entries that are wrong, then the whole list
            wrong = ", ".join(show_value(x) for x in v if not ok(x))
            problems.append(f"{key}: expected a list of {what}; wrong: {wrong} (in {list(v)!r})")
        elif len(set(v)) != len(v):
            problems.append(f"{key}: duplicated entries in {list(v)!r}")
    for key in ("conditions", "sweep_conditions", "targets"):
        if (v := p.get(key)) is None and key == "sweep_conditions":
            continue
        if not (isinstance(v, (list, tuple)) and v and all(isinstance(x, str) for x in v)):
            problems.append(f"{key}: expected a non-empty list of names, got {show_value(v)}")
    optional = {"eval_subset_seed": 0, "throughput_batch": 1, "throughput_repeats": 1, "builds": 1, "build": 0}
    for key, lo in (("idauc_steps", 1), ("bootstrap", 1), ("image_size", 1), ("patch_size", 1), *optional.items()):
        if not (is_int(v := p.get(key, optional.get(key))) and v >= lo):
            problems.append(f"{key}: expected an integer >= {lo}, got {show_value(v)}")
    if is_int(p.get("image_size")) and is_int(p.get("patch_size")) and p["patch_size"] >= 1 \
            and p["image_size"] % p["patch_size"]:
        problems.append(f"image_size: {p['image_size']} px is not a multiple of patch_size {p['patch_size']}")
    for key in ("max_eval_images", "max_idauc_images", "max_images_per_class", "torch_threads"):
        v = p.get(key)
        if key == "max_images_per_class" and isinstance(v, dict):   # {dataset: k}; {} caps none
            if bad := {k: x for k, x in v.items() if k not in DATASET_NAMES or not (is_int(x) and x >= 1)}:
                problems.append(f"{key}: expected {{dataset: integer >= 1}} with datasets from "
                                f"{list(DATASET_NAMES)}, got {show_value(bad)}")
        elif v is not None and not (is_int(v) and v >= 1):
            problems.append(f"{key}: expected None (all), an integer >= 1 or {{dataset: integer >= 1}}, "
                            f"got {show_value(v)}")


def _check_paths(p: dict[str, Any], problems: list[str]) -> None:
    """Data roots, weights files, ``pretrained`` and ``backbone_kwargs``."""
    if p.get("data_root") is not None and not is_path(p["data_root"]):
        problems.append(f"data_root: expected a directory path, got {show_value(p['data_root'])}")
    elif p.get("data_root") is not None and p.get("dataset") == "synthetic":
        problems.append(f"data_root: {str(p['data_root'])!r} was given but the run's dataset is 'synthetic', which "
                        f"is generated and takes no data root; use --dataset cub --data-root PATH for a CUB directory")
    roots = p.get("data_roots")
    problems += check_data_roots(roots)
    if isinstance(roots, dict):
        own = p.get("dataset")
        if isinstance(own, str) and own in roots and is_path(roots[own]) and is_path(p.get("data_root")) and \
                Path(str(roots[own])).expanduser() != Path(str(p["data_root"])).expanduser():
            problems.append(f"data_root: {str(p['data_root'])!r} and data_roots.{own} = {str(roots[own])!r} "
                            f"name two roots for {own!r}; give one")
    weights = p.get("weights")
    if not isinstance(weights, dict):
        problems.append(f"weights: expected a mapping {{backbone: file}} or a file path, got {show_value(weights)}")
    else:
        problems += [f"weights.{k}: expected a weights file path, got {show_value(v)}"
                     for k, v in weights.items() if not is_path(v)]
    if p.get("pretrained") not in ("hub", None):
        problems.append(f"pretrained: expected 'hub' or None, got {show_value(p.get('pretrained'))}")
    kw = p.get("backbone_kwargs")
    if not isinstance(kw, dict):
        problems.append(f"backbone_kwargs: expected a mapping of timm VisionTransformer arguments, "
                        f"got {show_value(kw)}")
