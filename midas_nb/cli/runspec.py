"""``midas-nb run``'s description (:class:`RunSpec`, from the command line and/or a run file) and
:func:`preflight`, the checks before any kernel starts; torch is imported only once the checks that need none
pass (docs/decisions/0024-preflight.md, 0029-run-description.md)."""
from __future__ import annotations

import concurrent.futures
import os
import re
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterable, Optional, Sequence

from pydantic import AfterValidator, ConfigDict, Field

from .. import config
from .args import check_output, list_param, param_value, unwritable, yaml_load
from ..config import DATASET_NAMES, is_path, setting_of, show_value
from ..point import did_you_mean

__all__ = ["RunSpec", "parse_data_roots", "parse_weights", "load_run_file",
           "notebook_needs", "preflight", "fold_structured_params", "spec_from_args"]


def _params(v: Any) -> Any:
    """Check of notebook parameters (a run file's ``params``, ``-p NAME VALUE``)."""
    if not isinstance(v, dict):
        return config.check_lines([f"params: expected a mapping of notebook parameters {{name: value}} (e.g. "
                                   f"params: {{seeds: [0, 1]}}), got {show_value(v)}"], v)
    odd = [x for x in v if not isinstance(x, str)]
    split, cw = [x for x in odd if v[x] is None], v.get("compare_with")
    return config.check_lines([line for bad, line in (
        (split, f"params: {show_value(split[:1] and split[0])} is read as a parameter name: YAML splits {{name: "
                f"a,b}} at the comma; write a list in brackets, e.g. {{seeds: [0, 1]}}, or one parameter a line "
                f"(params: then '  seeds: [0, 1]')"),
        (odd and not split, f"params: parameter names must be strings, got {', '.join(map(show_value, odd))}"),
        ("profile" in v, "-p profile: set the profile with --profile (or 'profile:' in the run file)"),
        (v.get("output_dir") is not None and not is_path(v["output_dir"]),
         f"output_dir: expected a directory path, got {v.get('output_dir')!r}"),
        (cw is not None and not (isinstance(cw, list) and cw and all(map(is_path, cw)) and len(set(cw)) == len(cw)),
         f"compare_with: expected a list of distinct backbone names (e.g. [hybrid_lite0_deit, hybrid_lite0_vit]), "
         f"got {show_value(cw)}")) if bad], v)


def _one_of(names: Sequence[str], hint: Any = lambda v: "") -> Any:
    return Annotated[Any, config.expect(f"one of {names}", lambda v: isinstance(v, str) and v in names, hint)]


class RunSpec(config.Checked):
    """Everything ``midas-nb run`` needs, as its options name them; ``None`` = the profile's default. The fields'
    types are the checks of a run file and of the command line (made unchecked, checked by :func:`preflight`)."""

    model_config = ConfigDict(extra="forbid")
    UNKNOWN: ClassVar[str] = "unknown setting {name!r}; expected one of {known}"
    profile: _one_of(sorted(config.PROFILES), lambda v: did_you_mean([v], config.PROFILES)
                     if isinstance(v, str) else "") = "quick"
    dataset: _one_of(list(DATASET_NAMES)) = None
    backbone: config.BackboneName = None   # the profile's checks (a bad value is said once)
    device: config.DeviceName = None
    notebooks: Annotated[Any, config.expect(
        "prefixes as a string '00,02' or a list of quoted strings ['00', '02']",
        lambda v: is_path(v) or (isinstance(v, list) and v and all(is_path(x) for x in v)),
        lambda v: " (YAML reads 00 and 02 as the numbers 0 and 2: quote them)" if v else "")] = None
    data_root: config.DirPath = None
    output: config.DirPath = None
    data_roots: Optional[config.DataRoots] = Field({})
    weights: config.WeightsFiles = Field({})
    params: Annotated[Any, AfterValidator(_params)] = Field({})
    cell_timeout: Annotated[Any, config.expect("seconds > 0", lambda v: config.is_number(v) and v > 0)] = None

    def notebook_parameters(self) -> dict[str, Any]:
        """The papermill parameters (each notebook gets those it accepts)."""
        out = {"profile": self.profile, **{k: getattr(self, k) for k in ("dataset", "backbone", "device")
                                           if getattr(self, k) is not None}}
        if self.data_root is not None:
            out["data_root"] = _absolute(self.data_root)
        out.update({k: _absolute(getattr(self, k)) for k in ("data_roots", "weights") if getattr(self, k)})
        return {**out, **self.params}

    def settings(self) -> dict[str, Any]:
        """The profile dict the notebooks will build their study from (no ``output_dir``)."""
        p = {k: v for k, v in self.notebook_parameters().items() if k not in ("profile", "output_dir")}
        return config.get_profile(self.profile, **p)


def _absolute(value: Any, base: Path | None = None) -> Any:
    """``value`` (or a mapping's values) as an absolute path string, from ``base`` or the working directory."""
    if isinstance(value, dict):
        return {k: _absolute(v, base) for k, v in value.items()}
    return str((Path(base or ".") / Path(value).expanduser()).resolve()) if is_path(value) else value


def as_typed(spec: RunSpec, line: str) -> str:
    """``line`` (a problem) with each data root of ``spec`` as typed, quoted ones with the resolved path in parentheses
    where that differs: the checks see the resolved one (:func:`_absolute`; the notebooks run in ``notebooks/``)."""
    for v in [spec.data_root, *dict(spec.data_roots or {}).values()]:
        if is_path(v) and (a := _absolute(v)) != v:
            line = re.sub(rf"(?<![\w/']){re.escape(a)}(?![\w/'])", lambda _: v, line)  # in a command: as typed
            line = re.sub(rf"'{re.escape(a)}'", lambda _: f"{v!r} ({a})", line)
    return line


def _parse_named(values: Iterable[str], option: str, known: Sequence[str] | None, expected: str, empty: str,
                 unnamed: str) -> tuple[str | None, dict[str, str], list[str]]:
    """``(unnamed value, {name: value}, problems)`` of ``option NAME=PATH``, ``NAME`` in ``known`` (``None``: any)."""
    plain, named, problems = None, {}, []
    for v in map(str, values):
        name, sep, path = v.partition("=")
        free = bool(sep and name) and os.sep not in name and "/" not in name and not Path(v).exists()
        is_named = bool(sep) and name in known if known is not None else free
        if not v.strip() or (is_named and not path.strip()):
            problems.append(f"{option} {v!r}: empty path; expected {expected}{empty}")
        elif is_named:
            if named.setdefault(name, path) != path:
                problems.append(f"{option} {name}= given twice ({named[name]!r}, {path!r}); give one")
        elif free:  # a name that is not one of ``known``
            problems.append(f"{option} {v!r}: unknown dataset {name!r}; expected {expected}")
        elif plain not in (None, v):
            problems.append(f"{option} given two " + unnamed.format(plain=plain, v=v))
        else:
            plain = v
    return plain, named, problems


def parse_data_roots(values: Iterable[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """``--data-root`` values → ``(plain root of the run's dataset, {dataset: root}, problems)``."""
    return _parse_named(values, "--data-root", config.PAPER_DATASETS,
                        f"NAME=PATH with NAME one of {list(config.PAPER_DATASETS)}, or a plain PATH",
                        " (an empty path would silently mean the current directory)",
                        "plain paths ({plain!r}, {v!r}); name the datasets: --data-root cub=PATH --data-root "
                        "aircraft=PATH ...")


def parse_weights(values: Iterable[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """``--weights`` values → ``(bare file for the study's backbone, {backbone: file}, problems)``."""
    return _parse_named(values, "--weights", None, "BACKBONE=FILE or a bare FILE", "",
                        "bare paths ({plain!r}, {v!r}); name the backbones: --weights NAME=PATH")


def load_run_file(path: str | os.PathLike) -> tuple[dict[str, Any], list[str]]:
    """``(settings, problems)`` of a YAML run file with :class:`RunSpec`'s fields as keys: a bad setting is a
    problem and left out; relative paths are the file's directory's."""
    import yaml

    where = f"--config {str(path := Path(path))!r}"
    if path.is_dir():
        return {}, [f"{where}: is a directory; expected a YAML run file (e.g. run.yaml with profile:, data_roots:, "
                    f"weights:, params:)"]
    try:
        data = yaml_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, [f"{where}: no such file"]
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        return {}, [f"{where}: not valid YAML ({e})"]
    except OSError as e:
        return {}, [f"{where}: cannot be read ({type(e).__name__}: {e.strerror or e})"]
    data = {} if data is None else data
    if not isinstance(data, dict):
        return {}, [f"{where}: expected a mapping of settings ({', '.join(RunSpec.model_fields)}), "
                    f"got {type(data).__name__}"]
    lines = RunSpec.problems({k: v for k, v in data.items() if v is not None})
    bad = {setting_of(line) for line in lines}
    data = {k: v for k, v in data.items() if k in RunSpec.model_fields and k not in bad and v is not None}
    base, paths = path.expanduser().resolve().parent, ("data_root", "data_roots", "weights", "output", "output_dir")
    data = {k: _absolute(v, base) if k in paths else v for k, v in data.items()}   # relative paths are the file's
    if "params" in data:
        data["params"] = {k: _absolute(v, base) if k in paths else v for k, v in data["params"].items()}
    return data, [f"{where}: {line}" for line in lines]


def notebook_needs(settings: dict[str, Any], notebooks: Sequence[str | Path]) -> tuple[list[str], list[str]]:
    """``(datasets, backbones)`` the selected notebooks use: the study's, then those of their sweeps' cells."""
    from ..study import sweep_cells

    picked = {Path(nb).name[:2] for nb in notebooks}
    cw = settings.get("compare_with")   # as preflight checks it: its names, each once
    cw = list(dict.fromkeys(b for b in cw if is_path(b))) or None if isinstance(cw, list) else None
    cells = [c for name, nb in config.SWEEPS.items() if nb in picked for c in sweep_cells(
        settings, name, planned=True, **({"backbones": cw} if name == "backbones" else {}))]
    return (list(dict.fromkeys([settings["dataset"], *(config.dataset_of_label(c.dataset) for c in cells)])),
            list(dict.fromkeys([settings["backbone"], *(c.backbone for c in cells)])))


def _quick_problems(spec: RunSpec, accepted: set[str] | None) -> tuple[list[str], dict[str, Any], dict[str, Path]]:
    """``(problems, profile settings the run overrides, {runs, cache, figures: directory})`` without torch."""
    problems = RunSpec.problems({k: v for k in RunSpec.model_fields if (v := getattr(spec, k)) is not None})
    injected = spec.notebook_parameters()
    unknown = sorted(set(injected) - set(accepted) - {"profile"}) if accepted is not None else []
    offered = set(accepted or ()) - {"profile"}  # -p refuses it (--profile sets it)
    problems += [f"unknown notebook parameter(s) {unknown}{did_you_mean(unknown, offered)}; "
                 f"the selected notebooks accept {sorted(offered)}"] if unknown else []
    known = isinstance(spec.profile, str) and spec.profile in config.PROFILES
    made = {}   # where every run and kernel writes: MIDAS_RUNS_DIR, MIDAS_CACHE_DIR, MIDAS_FIGURES_DIR
    for name, where in (("runs", config.runs_dir), ("cache", config.cache_dir),
                        ("figures", lambda: config.figures_dir(spec.profile if known else None))):
        try:
            made[name] = where()
        except config.ProfileError as e:
            problems += e.problems
    if is_path(spec.output) or (spec.output is None and "runs" in made):
        problems += check_output(spec.output if spec.output is not None else made["runs"] / str(spec.profile))
    overrides = {k: v for k, v in injected.items() if k in config.RunProfile.model_fields and k not in unknown
                 and k not in ("profile", "output_dir")}
    lines = config.RunProfile.problems(config.get_profile(spec.profile if known else "quick", **overrides))
    lines += config.check_device(overrides["device"], here=False) if "device" in overrides else []
    problems += [line for line in lines if known or setting_of(line) in overrides]   # else: the stand-in's own
    return list(dict.fromkeys(problems)), overrides, made


def preflight(spec: RunSpec, notebooks: Sequence[str | Path], accepted: set[str] | None = None) -> list[str]:
    """Every problem of running ``notebooks`` with ``spec``, one line each: what needs no torch,
    then each (dataset, backbone) the sweeps read, layouts, weights, hub; each skipped where a setting it reads is."""
    problems, overrides, made = _quick_problems(spec, accepted)
    if problems:
        return problems
    from ..study import study_overrides

    settings = spec.settings()
    lines = build_lines(spec.profile, overrides)
    problems, bad = list(lines), {setting_of(line) for line in lines}
    if bad & {"profile", "dataset", "backbone", "datasets", "backbones", "scale_backbones"}:
        return problems  # which datasets and backbones the notebooks use is not known
    safe = {**config.get_profile(spec.profile), **{k: v for k, v in settings.items() if k not in bad}}
    try:   # the sweeps' cells, a setting reported above at the profile's value
        datasets, backbones = notebook_needs(safe, notebooks)
        every = notebook_needs(safe, list(config.SWEEPS.values()))[0]
    except (KeyError, ValueError) as e:
        return problems + [str(e)]
    # ... and the study of every (dataset, backbone) the selected notebooks' sweeps build
    unbuildable = {bb for bb in backbones[:1] if "backbone" in bad}
    given = {k: v for k, v in settings.items() if k in config.RunProfile.model_fields}
    for ds, bb in ((ds, bb) for ds in datasets for bb in backbones):
        if (ds, bb) == (settings["dataset"], settings["backbone"]) or bad & {"data_root", "data_roots"}:
            continue
        try:
            found = build_lines(spec.profile, study_overrides(given, ds, bb))
        except ValueError as e:   # no root for a dataset the run reads
            found = [str(e)]
        unbuildable |= {bb} if any(setting_of(line) == "backbone" for line in found) else set()
        said = {setting_of(line) for line in problems}
        problems += [line for line in found if setting_of(line) not in said]
    if not bad & {"data_root", "data_roots", "max_images_per_class"}:
        problems += _layout_problems(settings, datasets, every)
    if not bad & {"backbone_kwargs", "weights", "pretrained"}:
        problems += _weights_problems(settings, [bb for bb in backbones if bb not in unbuildable], backbones)
    return problems + (_cache_problems(made["cache"], backbones) if "cache" in made else [])


def _cache_problems(cache: Path, backbones: Sequence[str]) -> list[str]:
    """A read-only cache serves a run that finds its backbones' checkpoints there: a line naming those it lacks."""
    if (why := unwritable(cache)) is None:
        return []
    held = [p.name for p in (cache / "checkpoints").glob("*.pt")]
    lacking = [bb for bb in backbones if not any(n.startswith(re.sub(r"[^A-Za-z0-9_.-]", "_", bb) + "-") for n in held)]
    return [f"cache {cache} cannot be written ({why.strerror or why}) and holds no checkpoint of {', '.join(lacking)} "
            f"(checkpoints/<backbone>-*.pt), which the run would train and write; expected a writable "
            f"MIDAS_CACHE_DIR, or a cache prepared by a run of these backbones"] if lacking else []


def build_lines(profile: str, overrides: dict[str, Any]) -> list[str]:
    """The lines :meth:`midas_nb.study.RunSettings.build` refuses ``overrides`` with (``[]``: it builds)."""
    from ..study import RunSettings

    try:
        RunSettings.build(profile, **overrides)
    except config.ProfileError as e:
        return list(e.problems)
    return []


def _layout_problems(settings: dict[str, Any], datasets: Sequence[str], every: Sequence[str]) -> list[str]:
    """Every root of ``datasets`` in its layout; no named root that no notebook reads (``every``)."""
    from ..data import check_layout

    problems, roots = [], {}
    for ds in datasets:
        try:
            root = config.data_root_for(settings, ds)
        except ValueError:
            continue   # said by the settings' build
        if root is not None and root.is_dir():
            roots[ds] = root
    for ds, root in dict(config.data_roots_of(settings)).items():
        if ds not in every:
            problems.append(f"--data-root {ds}={root}: no notebook of this run reads dataset {ds!r} (the "
                            f"{settings['profile']} profile with dataset {settings['dataset']!r} uses {every}); "
                            f"pass --dataset {ds} to run on it")
            roots.setdefault(ds, Path(root).expanduser())
    for ds, root in roots.items():
        problems += check_layout(ds, root, max_images_per_class=config.images_per_class(settings, ds))
    return problems


def _weights_problems(settings: dict[str, Any], buildable: Sequence[str], backbones: Sequence[str]) -> list[str]:
    """Weights files that load, none for an unused backbone; the hub reachable where needed (probed in parallel)."""
    from ..backbones import backbone_kwargs, BackboneError, check_hub, check_weights_path, create_backbone, weights_for

    problems = [f"--weights {name}: the selected notebooks do not use this backbone; they use {list(backbones)}"
                for name in sorted(set(settings.get("weights") or {}) - set(backbones))]
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        hub = [pool.submit(check_hub, bb) for bb in buildable if weights_for(settings, bb) == "hub"]
        for bb, w in ((bb, weights_for(settings, bb)) for bb in buildable):
            if w in ("hub", None):
                continue
            found = [f"--weights {bb}: {why}" for why in check_weights_path(w)]
            try:
                if not found:
                    create_backbone(bb, 2, weights=w, head="replace", **backbone_kwargs(settings, bb))
            except BackboneError as e:
                found.append(f"--weights {bb}: {e}")
            problems += found
        return problems + [line for fut in hub for line in fut.result()]


def fold_structured_params(spec: RunSpec) -> None:
    """Move ``-p data_root/data_roots/weights`` into the spec's fields (a bare weights path: the study's backbone's)."""
    p = spec.params
    if isinstance(p.get("data_root"), str):
        spec.data_root = p.pop("data_root")
    if isinstance(p.get("data_roots"), dict) and all(isinstance(v, str) for v in p["data_roots"].values()):
        spec.data_roots = {**p.pop("data_roots"), **spec.data_roots}
    w = p.get("weights")
    if isinstance(w, (str, os.PathLike)) and isinstance(spec.profile, str) and spec.profile in config.PROFILES:
        bb = spec.backbone or p.get("backbone") or config.get_profile(spec.profile)["backbone"]
        spec.weights = {str(bb): str(p.pop("weights")), **spec.weights}
    elif isinstance(w, dict) and all(isinstance(v, str) for v in w.values()):
        spec.weights = {**p.pop("weights"), **spec.weights}


def spec_from_args(args: Any) -> tuple[RunSpec, list[str]]:
    """``(spec, problems)`` of ``midas-nb run``'s parsed ``args``: the run file overridden by the command line."""
    file, problems = load_run_file(args.config) if args.config else ({}, [])
    plain, roots, root_problems = parse_data_roots(args.data_root or [])
    bare, named, weights_problems = parse_weights(args.weights or [])
    options = {k: getattr(args, k) for k in ("profile", "dataset", "backbone", "device", "notebooks", "output",
                                             "cell_timeout") if getattr(args, k) is not None}
    fw = file.get("weights", {})
    spec = RunSpec.model_construct(**{**file, **options, "data_roots": {**file.get("data_roots", {}), **roots},
                                      "weights": {**(fw if isinstance(fw, dict) else {}), **named},
                                      "params": {k: list_param(k, v) for k, v in file.get("params", {}).items()},
                                      **({} if plain is None else {"data_root": plain})})
    if args.weights:
        options["weights"] = bare if bare is not None else named
    if (bare := bare if bare is not None else fw if isinstance(fw, str) else None) is not None:
        spec.params.setdefault("weights", bare)
    given: dict[str, list[str]] = {}
    for name, value in args.param or []:   # an option and a -p of one setting: one value, else refused
        given.setdefault(name, []).append(value)
        spec.params[name] = v = param_value(name, value)
        if name in ("dataset", "backbone", "device", "weights") and name in options \
                and _absolute(v) != _absolute(options[name]):
            problems.append(f"--{name} {options[name]!r} and -p {name} {v!r} differ; give one of them")
    repeated = [f"-p {name}: given {len(v)} times ({', '.join(v)}); expected one value"
                for name, v in given.items() if len(set(v)) > 1]
    return spec, [*problems, *root_problems, *weights_problems, *repeated]
