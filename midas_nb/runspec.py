"""One run description for ``midas-nb run``, and the checks done before any kernel starts.

A :class:`RunSpec` holds everything a batch run needs: the profile, each dataset's root, each
backbone's weights file, the device, the notebook parameters (``-p NAME VALUE``), the notebook
selection and the output directory. It comes from the command line, from a run file
(``midas-nb run --config run.yaml``, the same settings as YAML) or both (the command line
wins). Example run file for the paper setting::

    profile: paper
    device: cuda
    data_roots:
      cub: /data/CUB_200_2011
      aircraft: /data/fgvc-aircraft-2013b
      cars: /data/stanford_cars
    weights:
      deit_tiny_patch16_224.fb_in1k: /weights/deit_tiny_patch16_224-a1311bcf.pth
      deit_small_patch16_224.fb_in1k: /weights/deit_small_patch16_224-cd65a155.pth
      vit_base_patch16_224.augreg_in21k_ft_in1k: /weights/B_16-i21k-300ep-...-res_224.npz
    params:
      seeds: [0, 1, 2]

Every notebook receives the same parameters (``data_roots`` and ``weights`` as dicts), so the
notebooks that span several datasets and backbones (regime sweep, scale readout) find every
root and file.

:func:`preflight` checks the whole description before any kernel starts and returns one line
per problem: the profile's values (types and ranges, :func:`midas_nb.config.check_profile`),
the device, the backbone names and the depths against their blocks, every data root against
its dataset's layout (annotation files parsed, images checked to exist, none decoded), a root
for every dataset the selected notebooks use (no silent synthetic stand-in), every weights
file loaded into its architecture (missing / unexpected / wrong-shape keys named), and the
reachability of the Hugging Face hub for timm backbones without a file (a few seconds at most,
with the local-file alternative named).
"""
from __future__ import annotations

import concurrent.futures
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

from . import config

__all__ = ["RunSpec", "PreflightError", "RUN_FILE_KEYS", "parse_data_roots", "parse_weights", "load_run_file",
           "notebook_needs", "preflight"]

#: keys a run file may hold (``params`` = notebook parameters, as ``-p NAME VALUE``)
RUN_FILE_KEYS: tuple[str, ...] = ("profile", "dataset", "backbone", "device", "notebooks", "output",
                                  "data_root", "data_roots", "weights", "params", "cell_timeout")

#: notebooks whose sweep spans more than the study's (dataset, backbone): the grid kind they run
GRID_NOTEBOOKS: dict[str, str] = {"04": "regime", "05": "scale"}


class PreflightError(ValueError):
    """A run description that cannot run; ``problems`` holds one line per problem."""

    def __init__(self, problems: Sequence[str]):
        self.problems = list(problems)
        super().__init__("\n".join(self.problems))


@dataclass
class RunSpec:
    """Everything ``midas-nb run`` needs (module docstring); ``None`` = the profile's default.

    Attributes:
        profile: ``smoke``, ``quick``, ``paper`` or ``rehearsal``.
        dataset, backbone, device: the study's dataset, backbone and device.
        data_root: the root of the study's dataset (``--data-root PATH``).
        data_roots: ``{dataset: root}`` (``--data-root NAME=PATH``, repeatable).
        weights: ``{backbone: file}`` (``--weights NAME=PATH``, repeatable; a bare path is the
            study's backbone's file).
        params: further notebook parameters (``-p NAME VALUE``).
        notebooks: comma-separated prefixes (``00,02``); ``None``: all.
        output: directory of the executed notebooks (default ``runs/<profile>``).
        cell_timeout: seconds one cell may run (``None``: no limit).
    """

    profile: str = "quick"
    dataset: str | None = None
    backbone: str | None = None
    device: str | None = None
    data_root: str | None = None
    data_roots: dict[str, str] = field(default_factory=dict)
    weights: dict[str, str] = field(default_factory=dict)
    params: dict[str, Any] = field(default_factory=dict)
    notebooks: str | None = None
    output: str | None = None
    cell_timeout: float | None = None

    def notebook_parameters(self) -> dict[str, Any]:
        """The papermill parameters every notebook gets (only those it accepts are injected)."""
        out: dict[str, Any] = {"profile": self.profile}
        for k in ("dataset", "backbone", "device"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        if self.data_root is not None:
            out["data_root"] = str(Path(self.data_root).expanduser().resolve())
        if self.data_roots:
            out["data_roots"] = {k: str(Path(v).expanduser().resolve()) for k, v in self.data_roots.items()}
        if self.weights:
            out["weights"] = {k: str(Path(v).expanduser().resolve()) for k, v in self.weights.items()}
        out.update(self.params)
        return out

    def settings(self) -> dict[str, Any]:
        """The profile dict the notebooks will build their study from (no ``output_dir``)."""
        p = {k: v for k, v in self.notebook_parameters().items() if k not in ("profile", "output_dir")}
        return config.get_profile(self.profile, **p)


def parse_data_roots(values: Iterable[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """``--data-root`` values → ``(plain root, {dataset: root}, problems)``.

    ``NAME=PATH`` names a dataset (``cub``, ``aircraft``, ``cars``); a value without such a
    prefix is the root of the run's own dataset (as ``--data-root PATH`` always was).
    """
    plain: str | None = None
    roots: dict[str, str] = {}
    problems = []
    for v in values:
        name, sep, path = str(v).partition("=")
        if sep and name in config.DATA_ROOT_DATASETS:
            if name in roots and roots[name] != path:
                problems.append(f"--data-root {name}= given twice ({roots[name]!r}, {path!r}); give one")
            roots[name] = path
        elif sep and name and os.sep not in name and "/" not in name and not Path(v).exists():
            problems.append(f"--data-root {v!r}: unknown dataset {name!r}; expected NAME=PATH with NAME one of "
                            f"{list(config.DATA_ROOT_DATASETS)}, or a plain PATH")
        else:
            if plain is not None and plain != v:
                problems.append(f"--data-root given two plain paths ({plain!r}, {v!r}); name the datasets: "
                                f"--data-root cub=PATH --data-root aircraft=PATH ...")
            plain = str(v)
    return plain, roots, problems


def parse_weights(values: Iterable[str]) -> tuple[str | None, dict[str, str], list[str]]:
    """``--weights`` values → ``(bare file for the study's backbone, {backbone: file}, problems)``."""
    bare: str | None = None
    out: dict[str, str] = {}
    problems = []
    for v in values:
        name, sep, path = str(v).partition("=")
        if sep and name and os.sep not in name and "/" not in name and not Path(v).exists():
            if name in out and out[name] != path:
                problems.append(f"--weights {name}= given twice ({out[name]!r}, {path!r}); give one")
            out[name] = path
        else:
            if bare is not None and bare != v:
                problems.append(f"--weights given two bare paths ({bare!r}, {v!r}); name the backbones: "
                                f"--weights NAME=PATH")
            bare = str(v)
    return bare, out, problems


def load_run_file(path: str | os.PathLike) -> tuple[dict[str, Any], list[str]]:
    """A run file's settings (YAML mapping with :data:`RUN_FILE_KEYS`) and its problems."""
    import yaml

    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return {}, [f"--config {str(path)!r}: no such file"]
    except (yaml.YAMLError, UnicodeDecodeError) as e:
        return {}, [f"--config {str(path)!r}: not valid YAML ({e})"]
    if data is None:
        data = {}
    if not isinstance(data, dict):
        return {}, [f"--config {str(path)!r}: expected a mapping of settings ({', '.join(RUN_FILE_KEYS)}), "
                    f"got {type(data).__name__}"]
    problems = [f"--config {str(path)!r}: unknown setting {k!r}; expected one of {list(RUN_FILE_KEYS)}"
                for k in data if k not in RUN_FILE_KEYS]
    for k in ("data_roots", "weights", "params"):
        if k in data and data[k] is not None and not isinstance(data[k], (dict, str) if k == "weights" else dict):
            problems.append(f"--config {str(path)!r}: {k} must be a mapping, got {type(data[k]).__name__}")
    return {k: v for k, v in data.items() if k in RUN_FILE_KEYS}, problems


def notebook_needs(settings: dict[str, Any], notebooks: Sequence[str | Path]) -> tuple[list[str], list[str]]:
    """``(datasets, backbones)`` the selected notebooks use: the study's dataset and backbone,
    plus the grid of the notebooks that sweep (:data:`GRID_NOTEBOOKS`: 04 the regime grid, 05
    the scale readout)."""
    from .sweeps import grid_spans

    datasets, backbones = [settings["dataset"]], [settings["backbone"]]
    for nb in notebooks:
        kind = GRID_NOTEBOOKS.get(Path(nb).name[:2])
        if kind:
            d, b = grid_spans(settings, kind)
            datasets += d
            backbones += b
    return list(dict.fromkeys(datasets)), list(dict.fromkeys(backbones))


def _check_weights_file(name: str, path: str, kwargs: dict[str, Any]) -> str | None:
    from .backbones import BackboneError, create_backbone

    try:
        create_backbone(name, 2, weights=path, head="replace", **kwargs)
    except BackboneError as e:
        return f"--weights {name}: {e}"
    return None


def preflight(spec: RunSpec, notebooks: Sequence[str | Path], accepted: set[str] | None = None) -> list[str]:
    """Every problem of running ``notebooks`` with ``spec``, one line each (module docstring).

    Args:
        spec: the run description.
        notebooks: the selected notebook paths (their number prefix tells which grids they run).
        accepted: the parameter names the selected notebooks accept (unknown ``-p`` names are
            problems); ``None`` skips that check.

    Returns:
        ``[]`` when the run can start.
    """
    if spec.profile not in config.PROFILES:
        return [f"--profile: unknown profile {spec.profile!r}; expected one of {sorted(config.PROFILES)}"]
    problems: list[str] = []
    if "profile" in spec.params:
        problems.append("-p profile: set the profile with --profile (or 'profile:' in the run file)")
    if accepted is not None:  # every parameter the run would inject must reach a notebook
        unknown = sorted(set(spec.notebook_parameters()) - set(accepted) - {"profile"})
        if unknown:
            problems.append(f"unknown notebook parameter(s) {unknown}; the selected notebooks accept {sorted(accepted)}")
    if "output_dir" in spec.params and not isinstance(spec.params["output_dir"], (str, type(None))):
        problems.append(f"output_dir: expected a directory path, got {spec.params['output_dir']!r}")
    if spec.cell_timeout is not None and not (isinstance(spec.cell_timeout, (int, float))
                                              and not isinstance(spec.cell_timeout, bool) and spec.cell_timeout > 0):
        problems.append(f"--cell-timeout: expected seconds > 0, got {spec.cell_timeout!r}")
    try:
        settings = spec.settings()
    except (TypeError, ValueError) as e:
        return problems + [str(e)]
    problems += config.check_profile(settings)
    if problems:
        return problems  # the later checks need well-typed settings

    from .backbones import check_backbone, hub_problem, weights_for
    from .study import check_layout

    try:
        datasets, backbones = notebook_needs(settings, notebooks)
    except (KeyError, ValueError) as e:
        return [str(e)]
    # data: a root for every dataset used; every named root in its dataset's layout
    roots: dict[str, Path] = {}
    for ds in datasets:
        try:
            root = config.data_root_for(settings, ds)
        except ValueError as e:
            problems.append(str(e))
            continue
        if root is not None:
            roots[ds] = root
    for ds, root in dict(config._roots(settings)).items():
        roots.setdefault(ds, Path(root).expanduser())
    for ds, root in roots.items():
        problems += check_layout(ds, root, max_images_per_class=settings.get("max_images_per_class"))
    # backbones: names, arguments, depths; weights files load; hub reachable where needed
    depths = [settings["depth"], *(settings.get("depths") or [])]
    unknown_bb = set()
    for bb in backbones:
        bad = check_backbone(bb, config.backbone_kwargs_for(settings, bb), depths)
        if any(b.startswith("backbone:") for b in bad):
            unknown_bb.add(bb)
        problems += bad
    unused = sorted(set(settings.get("weights") or {}) - set(backbones))
    for name in unused:
        problems.append(f"--weights {name}: the selected notebooks do not use this backbone; they use {backbones}")
    jobs = {}
    with concurrent.futures.ThreadPoolExecutor(max_workers=4) as pool:
        for bb in (b for b in backbones if b not in unknown_bb):
            w = weights_for(settings, bb)
            if w == "hub":
                jobs[pool.submit(hub_problem, bb)] = bb
            elif w is not None:
                if not Path(w).is_file():
                    problems.append(f"--weights {bb}: weights file {w} does not exist")
                else:
                    problems_w = _check_weights_file(bb, w, config.backbone_kwargs_for(settings, bb))
                    if problems_w:
                        problems.append(problems_w)
        for fut, bb in jobs.items():
            why = fut.result()
            if why:
                problems.append(why)
    return problems
