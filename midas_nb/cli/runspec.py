"""One run description for ``midas-nb run`` (:class:`RunSpec`, from the command line, a run file
or both) and :func:`preflight`, the checks done before any kernel starts
(docs/decisions/0024-preflight.md, 0029-run-description.md).
"""
from __future__ import annotations

import concurrent.futures
import os
from pathlib import Path
from typing import Annotated, Any, ClassVar, Iterable, Optional, Sequence

from pydantic import AfterValidator, ConfigDict, Field

from .. import config
from ..backbones import (backbone_kwargs, BackboneError, check_hub, check_weights_path, create_backbone,
                         weights_for)
from .args import check_output, list_param, param_value, yaml_load
from ..config import DATASET_NAMES, is_path, setting_of, show_value
from ..point import did_you_mean
from ..study import check_layout, RunSettings, study_overrides, sweep_cells

__all__ = ["RunSpec", "RUN_FILE_KEYS", "parse_data_roots", "parse_weights", "load_run_file",
           "notebook_needs", "preflight", "fold_structured_params", "spec_from_args"]

def _is_seconds(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0


def _params(v: Any) -> Any:
    """A run file's ``params`` when it maps names to values, else why not (YAML reads ``{seeds: 0,1}``
    as the names ``seeds`` and ``1``)."""
    odd = [x for x in v if not isinstance(x, str)] if isinstance(v, dict) else []
    if not isinstance(v, dict):
        why = (f"params: expected a mapping of notebook parameters {{name: value}} (e.g. params: {{seeds: [0, "
               f"1]}}), got {show_value(v)}")
    elif split := [x for x in odd if v[x] is None]:
        why = (f"params: {show_value(split[0])} is read as a parameter name: YAML splits {{name: a,b}} at the "
               f"comma; write a list in brackets, e.g. {{seeds: [0, 1]}}, or one parameter a line "
               f"(params: then '  seeds: [0, 1]')")
    else:
        why = f"params: parameter names must be strings, got {', '.join(show_value(x) for x in odd)}" if odd else ""
    return config.check_lines([why] if why else [], v)


def _one_of(names: Sequence[str], hint: Any = lambda v: "") -> Any:
    return Annotated[Any, config.expect(f"one of {names}", lambda v: isinstance(v, str) and v in names, hint)]


_NAME = Annotated[Any, config.expect("a name (a string)", is_path)]
_DIR = Annotated[Any, config.expect("a directory path (a non-empty string)", is_path)]


class RunSpec(config.Checked):
    """Everything ``midas-nb run`` needs, as its options name them; ``None`` = the profile's default.
    ``data_root``: the study's dataset's root; ``data_roots``: ``{dataset: root}``; ``weights``:
    ``{backbone: file}``; ``params``: further notebook parameters (``-p NAME VALUE``). The fields' types
    are a run file's checks (:meth:`check`; docs/decisions/0029-run-description.md); the command line's
    values are made into a spec unchecked (``model_construct``) and checked by :func:`preflight`."""

    model_config = ConfigDict(extra="forbid")
    UNKNOWN: ClassVar[str] = "unknown setting {name!r}; expected one of {known}"
    profile: _one_of(sorted(config.PROFILES), lambda v: did_you_mean([v], config.PROFILES)
                     if isinstance(v, str) else "") = "quick"
    dataset: _one_of(list(DATASET_NAMES)) = None
    backbone: _NAME = None
    device: _NAME = None
    notebooks: Annotated[Any, config.expect(
        "prefixes as a string '00,02' or a list of quoted strings ['00', '02']",
        lambda v: is_path(v) or (isinstance(v, list) and v and all(is_path(x) for x in v)),
        lambda v: " (YAML reads 00 and 02 as the numbers 0 and 2: quote them)" if v else "")] = None
    data_root: _DIR = None
    output: _DIR = None
    data_roots: Optional[config.DataRoots] = Field({})
    weights: Annotated[Any, config.expect("a file path or a mapping {backbone: file}", lambda v: is_path(v) or isinstance(
        v, dict)), AfterValidator(lambda v: config.check_weights(v) if isinstance(v, dict) else v)] = Field({})
    params: Annotated[Any, AfterValidator(_params)] = Field({})
    cell_timeout: Annotated[Any, config.expect("seconds > 0", _is_seconds)] = None

    def notebook_parameters(self) -> dict[str, Any]:
        """The papermill parameters every notebook gets (only those it accepts are injected)."""
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


#: keys a run file may hold (``params`` = notebook parameters, as ``-p NAME VALUE``)
RUN_FILE_KEYS: tuple[str, ...] = tuple(RunSpec.model_fields)


def _absolute(value: Any, base: Path | None = None) -> Any:
    """``value`` as an absolute path string (``~`` expanded, relative to ``base`` or the working
    directory), a mapping's values each; empty or non-path values unchanged (the checks name them)."""
    if isinstance(value, dict):
        return {k: _absolute(v, base) for k, v in value.items()}
    return str((Path(base or ".") / Path(value).expanduser()).resolve()) if is_path(value) else value


def _parse_named(values: Iterable[str], option: str, known: Sequence[str] | None, expected: str, empty: str,
                 unnamed: str) -> tuple[str | None, dict[str, str], list[str]]:
    """``(unnamed value, {name: value}, problems)`` of the repeatable ``option NAME=PATH``, ``NAME``
    one of ``known`` (``None``: any name that is not a path); ``expected``, ``empty``, ``unnamed``
    (a format of ``plain`` and ``v``): words of the problems."""
    plain, named, problems = None, {}, []
    for v in map(str, values):
        name, sep, path = v.partition("=")
        free = bool(sep and name) and os.sep not in name and "/" not in name and not Path(v).exists()
        is_named = bool(sep) and name in known if known is not None else free
        if not v.strip() or (is_named and not path.strip()):
            problems.append(f"{option} {v!r}: empty path; expected {expected}{empty}")
        elif is_named:
            if named.get(name, path) != path:
                problems.append(f"{option} {name}= given twice ({named[name]!r}, {path!r}); give one")
            named[name] = path
        elif free:  # a name that is not one of ``known``
            problems.append(f"{option} {v!r}: unknown dataset {name!r}; expected {expected}")
        else:
            if plain not in (None, v):
                problems.append(f"{option} given two " + unnamed.format(plain=plain, v=v))
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
    """``(settings, problems)`` of a YAML run file with :data:`RUN_FILE_KEYS`
    (docs/decisions/0029-run-description.md): a setting of the wrong type is a problem (lines start
    with ``--config 'PATH':``) and left out; relative paths are taken from the file's directory."""
    import yaml

    path = Path(path)
    where = f"--config {str(path)!r}"
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
        return {}, [f"{where}: expected a mapping of settings ({', '.join(RUN_FILE_KEYS)}), "
                    f"got {type(data).__name__}"]
    lines = RunSpec.problems({k: v for k, v in data.items() if v is not None})
    problems = [f"{where}: {line}" for line in lines]
    bad = {setting_of(line) for line in lines}
    data = {k: v for k, v in data.items() if k in RUN_FILE_KEYS and k not in bad and v is not None}
    if isinstance(data.get("notebooks"), list):
        data["notebooks"] = ",".join(x.strip() for x in data["notebooks"])
    base = path.expanduser().resolve().parent  # relative paths are the run file's
    data = {k: _absolute(v, base) if k in ("data_root", "data_roots", "weights", "output") else v
            for k, v in data.items()}
    if isinstance(data.get("params"), dict):
        data["params"] = {k: _absolute(v, base) if k in ("data_root", "data_roots", "weights", "output_dir") else v
                          for k, v in data["params"].items()}
    return data, problems


def notebook_needs(settings: dict[str, Any], notebooks: Sequence[str | Path]) -> tuple[list[str], list[str]]:
    """``(datasets, backbones)`` the selected notebooks use: the study's, then those of the cells of the sweeps
    :data:`midas_nb.config.SWEEPS` gives them (:func:`midas_nb.study.sweep_cells`, planned: nothing is read;
    05's ``compare_with`` is its ``backbones`` sweep's, as the notebook passes it)."""
    picked = {Path(nb).name[:2] for nb in notebooks}
    cw = settings.get("compare_with")   # as preflight checks it: its names, each once
    cw = list(dict.fromkeys(b for b in cw if is_path(b))) or None if isinstance(cw, list) else None
    cells = [c for name, nb in config.SWEEPS.items() if nb in picked for c in sweep_cells(
        settings, name, planned=True, **({"backbones": cw} if name == "backbones" else {}))]
    return (list(dict.fromkeys([settings["dataset"], *(config.dataset_of_label(c.dataset) for c in cells)])),
            list(dict.fromkeys([settings["backbone"], *(c.backbone for c in cells)])))


def preflight(spec: RunSpec, notebooks: Sequence[str | Path], accepted: set[str] | None = None) -> list[str]:
    """Every problem of running ``notebooks`` with ``spec``, one line each (``[]``: it can start;
    docs/decisions/0024-preflight.md): the settings of the study and of each (dataset, backbone)
    the sweeps read, the layouts, weights files and hub; a group is skipped where a setting it
    reads is reported. ``accepted``: the notebooks' parameter names (``None``: not checked)."""
    problems: list[str] = []
    unknown: list[str] = []
    if "profile" in spec.params:
        problems.append("-p profile: set the profile with --profile (or 'profile:' in the run file)")
    if accepted is not None:  # every parameter the run would inject must reach a notebook
        unknown = sorted(set(spec.notebook_parameters()) - set(accepted) - {"profile"})
        offered = set(accepted) - {"profile"}  # -p refuses it (--profile sets it)
        problems += [f"unknown notebook parameter(s) {unknown}{did_you_mean(unknown, offered)}; "
                     f"the selected notebooks accept {sorted(offered)}"] if unknown else []
    if spec.params.get("output_dir") is not None and not is_path(spec.params["output_dir"]):
        problems.append(f"output_dir: expected a directory path, got {spec.params['output_dir']!r}")
    cw = spec.params.get("compare_with")  # notebook 05's side-by-side backbones (a notebook parameter only)
    if cw is not None and not (isinstance(cw, list) and cw and all(is_path(b) for b in cw)
                               and len(set(cw)) == len(cw)):
        problems.append(f"compare_with: expected a list of distinct backbone names (e.g. [hybrid_lite0_deit, "
                        f"hybrid_lite0_vit]), got {show_value(cw)}")
    if spec.cell_timeout is not None and not _is_seconds(spec.cell_timeout):
        problems.append(f"--cell-timeout: expected seconds > 0, got {spec.cell_timeout!r}")
    made = {}   # where every run and kernel writes: MIDAS_RUNS_DIR, MIDAS_CACHE_DIR, MIDAS_FIGURES_DIR
    for name, where in (("runs", config.runs_dir), ("cache", config.cache_dir),
                        ("figures", lambda: config.figures_dir(str(spec.profile)))):
        try:
            made[name] = where()
        except config.ProfileError as e:
            problems += e.problems
    if spec.output is not None and not is_path(spec.output):
        problems.append(f"--output: expected a directory path, got {spec.output!r}")
    elif spec.output is not None or "runs" in made:
        problems += check_output(spec.output if spec.output is not None else made["runs"] / str(spec.profile))
    if not isinstance(spec.profile, str) or spec.profile not in config.PROFILES:  # nothing else can be read
        hint = did_you_mean([spec.profile], config.PROFILES) if isinstance(spec.profile, str) else ""
        return problems + [f"--profile: unknown profile {spec.profile!r}{hint}; "
                           f"expected one of {sorted(config.PROFILES)}"]
    try:
        settings = spec.settings()
    except (TypeError, ValueError) as e:
        return problems + [str(e)]
    # "checked before any kernel" is building what the notebooks build: the study's settings
    # (a refused parameter is reported once, as unknown; the profile's value stands for it)
    known, injected = config.RunProfile.model_fields, spec.notebook_parameters()
    given = {k: v for k, v in settings.items() if k in known and k not in unknown}   # no compare_with, output_dir
    lines = _build_lines(spec.profile, {k: v for k, v in given.items() if k in injected and k != "profile"})
    problems += lines
    bad = {setting_of(line) for line in lines}
    if bad & {"profile", "dataset", "backbone", "datasets", "backbones", "scale_backbones"}:
        return problems  # which datasets and backbones the notebooks use is not known
    safe = {**config.get_profile(spec.profile), **{k: v for k, v in settings.items() if k not in bad}}
    try:   # the sweeps' cells, a setting reported above at the profile's value
        datasets, backbones = notebook_needs(safe, notebooks)
        every = notebook_needs(safe, list(config.SWEEPS.values()))[0]
    except (KeyError, ValueError) as e:
        return problems + [str(e)]
    # ... and the study of every (dataset, backbone) the selected notebooks' sweeps build
    unbuildable = {bb for bb in backbones[:1] if any(line.startswith("backbone:") for line in lines)}
    for ds, bb in ((ds, bb) for ds in datasets for bb in backbones):
        if (ds, bb) == (settings["dataset"], settings["backbone"]) or bad & {"data_root", "data_roots"}:
            continue
        try:
            found = _build_lines(spec.profile, study_overrides(given, ds, bb))
        except ValueError as e:   # no root for a dataset the run reads
            found = [str(e)]
        unbuildable |= {bb} if any(line.startswith("backbone:") for line in found) else set()
        problems += [line for line in found if line not in problems]
    if not bad & {"data_root", "data_roots", "max_images_per_class"}:
        problems += _layout_problems(settings, datasets, every)
    if not bad & {"backbone_kwargs", "weights", "pretrained"}:
        problems += _weights_problems(settings, [bb for bb in backbones if bb not in unbuildable], backbones)
    return problems + (_cache_problems(made["cache"], backbones) if "cache" in made else [])


def _cache_problems(cache: Path, backbones: Sequence[str]) -> list[str]:
    """A cache that cannot be written (a lab's prepared, read-only one) serves a run that finds its
    backbones' checkpoints there: one line naming those it holds none of."""
    import re
    import tempfile

    try:
        tempfile.TemporaryDirectory(dir=cache, prefix=".midas-probe-").cleanup()
        return []
    except OSError as e:
        why = e.strerror or str(e)
    held = [p.name for p in (cache / "checkpoints").glob("*.pt")]
    lacking = [bb for bb in backbones if not any(n.startswith(re.sub(r"[^A-Za-z0-9_.-]", "_", bb) + "-") for n in held)]
    return [f"cache {cache} cannot be written ({why}) and holds no checkpoint of {', '.join(lacking)} "
            f"(checkpoints/<backbone>-*.pt), which the run would train and write; expected a writable "
            f"MIDAS_CACHE_DIR, or a cache prepared by a run of these backbones"] if lacking else []


def _build_lines(profile: str, overrides: dict[str, Any]) -> list[str]:
    """The lines :meth:`midas_nb.study.RunSettings.build` refuses ``overrides`` with (``[]``: it builds)."""
    try:
        RunSettings.build(profile, **overrides)
    except config.ProfileError as e:
        return list(e.problems)
    return []


def _layout_problems(settings: dict[str, Any], datasets: Sequence[str], every: Sequence[str]) -> list[str]:
    """Every root of ``datasets`` in its dataset's layout; no named root that no notebook reads (``every``)."""
    problems: list[str] = []
    roots: dict[str, Path] = {}
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
    """Weights files that load into their architecture, none for an unused backbone; the hub
    reachable where a backbone needs it (probed in parallel)."""
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
        for fut in hub:
            problems += fut.result()
    return problems


def fold_structured_params(spec: RunSpec) -> None:
    """Move ``-p data_root/data_roots/weights`` into the spec's fields (a bare weights path: the
    study's backbone's file)."""
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
    """``(spec, problems)`` of ``midas-nb run``'s parsed ``args``: the run file (``--config``),
    overridden by the command line."""
    file, problems = load_run_file(args.config) if args.config else ({}, [])
    plain, roots, root_problems = parse_data_roots(args.data_root or [])
    bare, named, weights_problems = parse_weights(args.weights or [])
    fw, given = file.get("weights"), file.get("params")
    spec = RunSpec.model_construct(profile=args.profile or file.get("profile") or "quick",
                   data_root=plain if plain is not None else file.get("data_root"),
                   data_roots={**(file["data_roots"] if isinstance(file.get("data_roots"), dict) else {}), **roots},
                   weights={**(fw if isinstance(fw, dict) else {}), **named},
                   params={k: list_param(k, v) for k, v in given.items()} if isinstance(given, dict) else {},
                   **{k: file.get(k) if getattr(args, k, None) is None else getattr(args, k)
                      for k in ("dataset", "backbone", "device", "notebooks", "output", "cell_timeout")})
    # an option and a -p of one setting: the same value, else refused (-p would silently win)
    options = {k: getattr(args, k) for k in ("dataset", "backbone", "device") if getattr(args, k, None) is not None}
    if args.weights:
        options["weights"] = bare if bare is not None else named
    bare = bare if bare is not None else fw if isinstance(fw, str) else None
    if bare is not None:
        spec.params.setdefault("weights", bare)
    given_values: dict[str, list[str]] = {}
    for name, value in args.param or []:
        given_values.setdefault(name, []).append(value)
        spec.params[name] = v = param_value(name, value)
        if name in options and _absolute(v) != _absolute(options[name]):
            problems.append(f"--{name} {options[name]!r} and -p {name} {v!r} differ; give one of them")
    repeated = [f"-p {name}: given {len(v)} times ({', '.join(v)}); expected one value"
                for name, v in given_values.items() if len(set(v)) > 1]
    return spec, [*problems, *root_problems, *weights_problems, *repeated]
