"""Command-line text read into values, nothing heavy imported: ``--help`` and argument errors answer at once
(docs/decisions/0019-cli-answers-at-once.md; values: 0030-parameter-values.md)."""
from __future__ import annotations

import argparse
import contextlib
import os
import re
from pathlib import Path
from typing import Any, Sequence

from .. import config

__all__ = ["COMMANDS", "LIST_PARAMS", "add_commands", "list_param", "package_version",
           "param_value", "check_output", "unwritable", "check_split_values", "profile_name", "yaml_load"]

#: parameters whose value is a list in some profile (``seeds``, ``depths``, ``budgets``, ...)
LIST_PARAMS: frozenset[str] = frozenset([k for p in config.PROFILES.values() for k, v in p.items()
                                         if isinstance(v, list)] + ["compare_with"])  # + notebook 05's list

_INT = re.compile(r"[-+]?[0-9]+")
_FLOAT = re.compile(r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?")


def yaml_load(text: str) -> Any:
    """``yaml.safe_load`` that reads ``1e-9`` as a number (YAML 1.1 floats need a dot); raises ``yaml.YAMLError``."""
    import yaml

    loader = type("_Loader", (yaml.SafeLoader,), {})   # a subclass: SafeLoader's own resolvers stay as they are
    loader.add_implicit_resolver("tag:yaml.org,2002:float",
                                 re.compile(r"^[-+]?[0-9][0-9_]*(?:\.[0-9_]*)?[eE][-+]?[0-9]+$"), list("-+0123456789"))
    return yaml.load(text, Loader=loader)  # noqa: S506 - a SafeLoader subclass


def _scalar(text: str) -> Any:
    """A decimal number (never octal), else ``None`` for ``None``, else YAML, else the text."""
    t = text.strip()
    if not t:  # "" is a value given empty (an unset shell variable), not YAML's null: the checks name it
        return text
    if t == "None":
        return None
    if _INT.fullmatch(t):
        return int(t)
    if _FLOAT.fullmatch(t):
        return float(t)
    import yaml

    try:
        return yaml_load(text)
    except yaml.YAMLError:
        return text


def list_param(name: str, value: Any) -> Any:
    """``value`` of the list-valued parameter ``name`` as a list (``"0,1"``: ``[0, 1]``, ``v``: ``[v]``)."""
    if name not in LIST_PARAMS or value is None or isinstance(value, (list, tuple, dict)):
        return value
    if isinstance(value, str) and "," in value:
        return [_scalar(x) for x in value.split(",") if x.strip()]
    return [value]


def param_value(name: str, text: str) -> Any:
    """A ``-p NAME VALUE`` value: a decimal number, else YAML, else the text; a list for a list-valued ``name``."""
    return list_param(name, _scalar(text))


def _unbalanced(text: str) -> bool:
    return text.count("[") > text.count("]") or text.count("{") > text.count("}")


def check_split_values(argv: Sequence[str]) -> list[str]:
    """One line when a ``-p NAME VALUE`` value opens a bracket it does not close (the shell split it)."""
    for i, (tok, name, value) in enumerate(zip(argv, argv[1:], argv[2:])):
        if tok in ("-p", "--param") and _unbalanced(whole := value):
            for t in argv[i + 3:]:
                whole += " " + t
                if not _unbalanced(whole):
                    break
            list_hint = name in LIST_PARAMS and whole.startswith("[")
            hint = f" (or -p {name} {''.join(whole.strip('[]').split())})" if list_hint else ""
            return [f"-p {name} {value!r}: the value was split at its spaces by the shell; quote it: "
                    f"-p {name} '{whole}'{hint}"]
    return []


def package_version() -> str:
    """The installed package's version (importlib.metadata), else the source tree's."""
    from importlib import metadata

    from .. import __version__
    with contextlib.suppress(metadata.PackageNotFoundError):
        return metadata.version("midas_nb")
    return __version__


def profile_name(text: str) -> str:
    """argparse ``type`` of a known profile."""
    if text in config.PROFILES:
        return text
    from ..point import did_you_mean

    raise argparse.ArgumentTypeError(f"unknown profile {text!r}{did_you_mean([text], config.PROFILES)}; "
                                     f"expected one of {sorted(config.PROFILES)}")


PROFILE_METAVAR = "{" + ",".join(sorted(config.PROFILES)) + "}"
_FLAG, _INTEGER, _MANY = dict(action="store_true"), dict(type=int), dict(action="append")
_PROFILE = dict(type=profile_name, metavar=PROFILE_METAVAR)
_PAIRS = dict(nargs=2, action="append", metavar=("NAME", "VALUE"))

#: each subcommand: help, description, examples (one a line) and options ``(flags, argparse keywords, help)``
COMMANDS: dict[str, tuple[str, str | None, str, list[tuple[str, dict, str]]]] = {
    "run": ("execute the notebooks in order with papermill", "Execute the notebooks in order with papermill; every "
            "setting is checked first, problems one per line (exit status 2).",
            "midas-nb run --profile quick --notebooks 00,02 -p seeds 0,1\n"
            "midas-nb run --profile paper --device cuda --data-root cub=/data/CUB_200_2011", [
        ("--config", dict(metavar="RUN.yaml"), "YAML run file of these settings; options override it"),
        ("--profile", dict(metavar=PROFILE_METAVAR), "smoke (seconds), quick (CPU minutes, default), paper (GPU), "
         "rehearsal (the paper run's shape, tiny)"),
        ("--data-root", dict(_MANY, metavar="[DATASET=]PATH"), "a dataset's directory, repeatable (cub=, aircraft=, "
         "cars=; a plain PATH: the run's dataset; default: the embedded synthetic set)"),
        ("--weights", dict(_MANY, metavar="[BACKBONE=]FILE"), "a backbone's weights file (.pth, .safetensors, .npz), "
         "repeatable (default: timm's hub weights)"),
        ("--dataset", dict(metavar="{" + ",".join(config.DATASET_NAMES) + "}"), "dataset (default: the profile's)"),
        ("--backbone", {}, "backbone name (default: the profile's)"),
        ("--device", {}, "cpu, cuda, cuda:1 ... (default: the profile's)"),
        ("--notebooks", {}, "comma-separated prefixes, e.g. 00,02 (default: all)"),
        ("-p --param", _PAIRS, "notebook parameter, repeatable (`papermill --help-notebook notebooks/02_*.ipynb` "
         "lists them): a number, a quoted YAML value ('[0, 1]') or a list as 0,1"),
        ("--output", {}, "directory for executed notebooks (default runs/<profile>)"),
        ("--cell-timeout", dict(type=float, metavar="SECONDS"), "stop a cell that runs longer (default: none)"),
        ("--no-progress", _FLAG, "no progress bar")]),
    "sweep": ("sweeps on a cluster: plan, submit, status, wait", "plan: jobs, cells, GPU-hours; submit: send them "
              "(again: what failed or is missing); status: the stores in runs/sweeps; wait: until none is queued",
              "midas-nb sweep plan --profile paper\n"
              "midas-nb sweep submit --profile paper --data-root cub=/data/CUB_200_2011 --partition gpu --gpus 1 "
              "--time 120\nmidas-nb sweep status paper", [
        ("action", dict(choices=["plan", "submit", "status", "wait"]), "plan, submit, status (exit 1 while cells "
         "failed, were lost or unsubmitted), wait"),
        ("name", dict(nargs="?"), "status/wait: store name = its profile (default: every store)"),
        ("--profile", _PROFILE, "the profile to plan or submit (default: paper); status/wait: its store"),
        ("--sweep", dict(default="all", metavar="NAMES"), "comma-separated sweeps: protocol, soft, random, regime, "
         "scale, backbones, related, or all (default)"),
        ("--executor", dict(choices=["slurm", "local"], default="slurm"), "submit: slurm (default) or local (run "
         "here)"),
        ("--partition", {}, "submit: Slurm partition (default: the cluster's)"),
        ("--gpus", _INTEGER, "submit: GPUs per job (default: 1 for a cuda device, else none)"),
        ("--cpus", _INTEGER, "submit: CPUs per job (default: the cluster's)"),
        ("--mem", {}, "submit: memory per job, e.g. 32G (default: the cluster's)"),
        ("--time", dict(_INTEGER, metavar="MINUTES"), "submit: time limit per job (default 120)"),
        ("--cells-per-job", dict(_INTEGER, default=8), "cells per job (default 8)"),
        ("--max-array-size", _INTEGER, "array size limit (default: Slurm's MaxArraySize, else 1001)"),
        ("--device", {}, "submit: the cells' device (default: the profile's; resolved on the compute node)"),
        ("--data-root", dict(_MANY, metavar="DATASET=PATH"), "a dataset's directory, repeatable"),
        ("--cost", dict(metavar="FILE"), "plan: cost table (default runs/bench/cell_cost.json, else the shipped)")]),
    "strip-solutions": ("remove cells tagged 'solution' from notebooks", None,
                        "midas-nb strip-solutions notebooks/02_three_condition_protocol.ipynb", [
        ("paths", dict(nargs="*", metavar="NOTEBOOK"), "notebooks to strip (default: every notebook in notebooks/)"),
        ("--in-place", _FLAG, "overwrite the named notebooks (default: write student/<name> beside each)"),
        ("--force", _FLAG, "replace a student/<name> that differs (default: keep it, exit 2)")]),
    "export-html": ("static HTML edition of executed notebooks", None, "midas-nb export-html --profile quick", [
        ("--profile", dict(_PROFILE, default="quick"), "export runs/<profile> (default: quick)"),
        ("--input", {}, "directory of executed notebooks (default runs/<profile>)"),
        ("--output", {}, "output directory (default <input>/html)")]),
    "report": ("REPORT.md and its CSV tables from a profile's result store", "reads runs/sweeps/<profile> and writes "
               "REPORT.md and its CSV tables: the paper's values beside ours and which findings hold",
               "midas-nb report --profile quick --output runs/quick/report", [
        ("--profile", _PROFILE, "the profile whose results are reported (default: quick)"),
        ("--store", {}, "result store directory (default runs/sweeps/<profile>)"),
        ("--output", {}, "report directory (default runs/<profile>/report)"),
        ("--readme", {}, "rewrite this README's results section from the tables"),
        ("--from-tables", dict(metavar="DIR"), "re-render REPORT.md (and --readme) from the CSV tables in DIR, no "
         "store"),
        ("--backbone", {}, "the run's backbone, when not the profile's"),
        ("--depth", _INTEGER, "depth L, a 1-based block index, when not the profile's"),
        ("--budget", dict(type=float), "budget b in (0, 1], the kept fraction of patch tokens, when not the profile's"),
        ("-p --param", _PAIRS, "a setting of the run, when not the profile's (as run -p): only its cells are read"),
        ("--allow-mixed-settings", _FLAG, "report although the store holds rows of other settings (left out, "
         "counted; default: refuse, exit 2)"),
        ("--allow-incomplete", _FLAG, "report although expected cells have no result; marked INCOMPLETE "
         "(default: refuse, exit 2)")]),
}


def add_commands(ap: argparse.ArgumentParser, funcs: dict[str, Any]) -> None:
    """The subcommands of :data:`COMMANDS` under ``ap``, each calling ``funcs[name]``, examples as epilogs."""
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (text, description, examples, options) in COMMANDS.items():
        lines = examples.splitlines()
        epilog = f"example{'s' if len(lines) > 1 else ''}:\n  " + "\n  ".join(lines)
        parser = sub.add_parser(name, help=text, description=description, epilog=epilog,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
        for flags, keywords, words in options:
            parser.add_argument(*flags.split(), help=words, **keywords)
        parser.set_defaults(func=funcs[name])
    ap.epilog = "examples:\n  " + "\n  ".join(line for c in COMMANDS.values() for line in c[2].splitlines())


def unwritable(directory: Path) -> OSError | None:
    """Why no file can be made in the existing ``directory`` (the probe leaves nothing behind), else ``None``."""
    import tempfile

    try:
        tempfile.TemporaryDirectory(dir=directory, prefix=".midas-probe-").cleanup()
    except OSError as e:
        return e
    return None


def check_output(output: str | os.PathLike, purpose: str = "the executed notebooks") -> list[str]:
    """``[]`` when the directory ``output`` (for ``purpose``) takes new files or can be created, else why not."""
    out = probe_in = Path(output).expanduser()
    while not probe_in.exists() and probe_in != probe_in.parent:
        probe_in = probe_in.parent
    what = ("is a file" if out == probe_in else f"cannot be created: {str(probe_in)!r} is a file") \
        if not probe_in.is_dir() else None
    if what is None and (e := unwritable(probe_in)) is not None:
        what = "is not writable" if probe_in == out else f"cannot be created under {str(probe_in)!r}"
        what += f" ({type(e).__name__}: {e.strerror or e}); expected a writable directory"
    return [f"--output {str(out)!r}: {what}" + ("" if "expected" in what else "; expected a directory") +
            f" for {purpose}"] if what else []
