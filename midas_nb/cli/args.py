"""Command-line text read into values, with nothing heavy imported (no torch, no papermill), so
that ``midas-nb --help``, ``--version`` and argument errors answer at once
(docs/decisions/0019-cli-answers-at-once.md; values: 0030-parameter-values.md).
"""
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
    """``yaml.safe_load`` that reads ``1e-9`` and ``5E3`` as numbers (PyYAML's YAML 1.1 floats need
    a dot). Raises ``yaml.YAMLError`` for text that is not YAML."""
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
    """``value`` of the list-valued parameter ``name`` as a list (``"0,1"``: ``[0, 1]``, ``v``:
    ``[v]``); ``None``, lists and other parameters' values as they are."""
    if name not in LIST_PARAMS or value is None or isinstance(value, (list, tuple, dict)):
        return value
    if isinstance(value, str) and "," in value:
        return [_scalar(x) for x in value.split(",") if x.strip()]
    return [value]


def param_value(name: str, text: str) -> Any:
    """A ``-p NAME VALUE`` value: a decimal number, else YAML, else the text; a list for a
    list-valued ``name`` (:func:`list_param`; docs/decisions/0030-parameter-values.md)."""
    return list_param(name, _scalar(text))


def _unbalanced(text: str) -> bool:
    return text.count("[") > text.count("]") or text.count("{") > text.count("}")


def check_split_values(argv: Sequence[str]) -> list[str]:
    """One line when a ``-p NAME VALUE`` value opens a bracket it does not close (the shell split
    ``-p seeds [0, 1]`` at its spaces); ``[]`` when every ``-p`` value is whole."""
    args = list(argv)
    for i, (tok, name, value) in enumerate(zip(args, args[1:], args[2:])):
        if tok not in ("-p", "--param") or not _unbalanced(value):
            continue
        whole = value
        for t in args[i + 3:]:
            whole += " " + t
            if not _unbalanced(whole):
                break
        hint = f" or without spaces: -p {name} {''.join(whole.split())}"
        if name in LIST_PARAMS and whole.startswith("["):
            hint += f" (or -p {name} {''.join(whole.strip('[]').split())})"
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
    """argparse ``type`` of a known profile (else ``run``'s error, exit status 2)."""
    if text in config.PROFILES:
        return text
    from ..point import did_you_mean

    raise argparse.ArgumentTypeError(f"unknown profile {text!r}{did_you_mean([text], config.PROFILES)}; "
                                     f"expected one of {sorted(config.PROFILES)}")


#: ``--profile``'s metavar: the profiles, as argparse's ``choices`` would list them
PROFILE_METAVAR = "{" + ",".join(sorted(config.PROFILES)) + "}"


_FLAG, _INTEGER, _MANY = dict(action="store_true"), dict(type=int), dict(action="append")
_PROFILE = dict(type=profile_name, metavar=PROFILE_METAVAR)
_PAIRS = dict(nargs=2, action="append", metavar=("NAME", "VALUE"))

#: each subcommand: its help, description, examples (one a line, shown under its --help and all of them under
#: midas-nb --help) and options ``(flags, argparse keywords, help)``
COMMANDS: dict[str, tuple[str, str | None, str, list[tuple[str, dict, str]]]] = {
    "run": ("execute the notebooks in order with papermill", "Execute the notebooks in order with papermill. Every "
            "setting is checked before any kernel starts; problems are listed one per line (exit status 2).",
            "midas-nb run --profile quick --notebooks 00,02 -p seeds 0,1\n"
            "midas-nb run --profile paper --device cuda --data-root cub=/data/CUB_200_2011", [
        ("--config", dict(metavar="RUN.yaml"), "run file with the same settings (profile, data_roots, weights, device, "
         "params, ...); command-line options override it"),
        ("--profile", dict(metavar=PROFILE_METAVAR), "settings profile: smoke (seconds), quick (minutes on a CPU), "
         "paper (GPU), rehearsal (the paper run's shape on a CPU, tiny sizes) (default: quick)"),
        ("--data-root", dict(_MANY, metavar="[DATASET=]PATH"), "a dataset's directory, repeatable: cub=PATH, "
         "aircraft=PATH, cars=PATH; a plain PATH is the run's own dataset (default for quick/smoke without any root: "
         "the embedded synthetic set)"),
        ("--weights", dict(_MANY, metavar="[BACKBONE=]FILE"), "a backbone's weights file (.pth, .safetensors, AugReg "
         ".npz), repeatable; a bare FILE is the run's backbone's (default: timm's pretrained weights from the hub)"),
        ("--dataset", dict(metavar="{" + ",".join(config.DATASET_NAMES) + "}"), "the study's dataset (default: the "
         "profile's; synthetic is the generated CUB-format set)"),
        ("--backbone", {}, "backbone name (default: the profile's)"),
        ("--device", {}, "cpu, cuda, cuda:1 ... (default: the profile's; cuda without CUDA is an error)"),
        ("--notebooks", {}, "comma-separated prefixes, e.g. 00,02 (default: every notebook)"),
        ("-p --param", _PAIRS, "notebook parameter, repeatable (`papermill --help-notebook notebooks/02_*.ipynb` "
         "lists a notebook's): a number, a YAML value in quotes ('[0, 1]'), or for lists comma-separated values "
         "(-p seeds 0,1)"),
        ("--output", {}, "directory for executed notebooks (default runs/<profile>)"),
        ("--cell-timeout", dict(type=float, metavar="SECONDS"), "stop a cell that runs longer (the notebook goes to "
         "failed/)"),
        ("--no-progress", _FLAG, "no progress bar while a notebook runs")]),
    "sweep": ("sweeps on a cluster: plan, submit, status, wait", "plan: the jobs, arrays, cells and projected "
              "GPU-hours of a profile's sweeps, nothing submitted; submit: send them (returns after submission; the "
              "same submit again sends the failed, lost and never-submitted cells); status: cells done / failed / "
              "pending of the result stores under runs/sweeps (one per profile); wait: until nothing is queued",
              "midas-nb sweep plan --profile paper\n"
              "midas-nb sweep submit --profile paper --data-root cub=/data/CUB_200_2011 --partition gpu --gpus 1 "
              "--time 120\nmidas-nb sweep status paper", [
        ("action", dict(choices=["plan", "submit", "status", "wait"]), "plan, submit, status (exit 1 while cells "
         "failed, were lost or were never submitted), wait"),
        ("name", dict(nargs="?"), "status/wait: store name = the profile that wrote it, e.g. quick (default: every "
         "store)"),
        ("--profile", _PROFILE, "plan/submit: the profile whose sweeps are planned or submitted (default: paper); "
         "status/wait: that profile's store, as NAME"),
        ("--sweep", dict(default="all", metavar="NAMES"), "plan/submit: comma-separated sweeps: protocol, soft, random "
         "(notebook 02), regime (04), scale, backbones (05), related (06), or all (default)"),
        ("--executor", dict(choices=["slurm", "local"], default="slurm"), "submit: slurm (default; "
         "returns after submission) or local (run here)"),
        ("--partition", {}, "submit: Slurm partition"),
        ("--gpus", _INTEGER, "submit: GPUs per job (gpus_per_node)"),
        ("--cpus", _INTEGER, "submit: CPUs per job (cpus_per_task)"),
        ("--mem", {}, "submit: memory per job, e.g. 32G"),
        ("--time", dict(_INTEGER, metavar="MINUTES"), "submit: time limit per job"),
        ("--cells-per-job", dict(_INTEGER, default=8), "plan/submit: cells per job (default 8)"),
        ("--max-array-size", _INTEGER, "plan/submit: array size limit (default: MaxArraySize from scontrol show "
         "config, else 1001)"),
        ("--device", {}, "submit: device of the cells (default: the profile's); with --executor slurm it is resolved "
         "on the compute node, not here"),
        ("--data-root", dict(_MANY, metavar="DATASET=PATH"), "plan/submit: a dataset's directory, repeatable (cub=..., "
         "aircraft=..., cars=...)"),
        ("--cost", dict(metavar="FILE"), "plan: cost table of bench/gpu_check.py (default runs/bench/cell_cost.json, "
         "else the one shipped: the last H200 measurement); the store's timed cells come first")]),
    "strip-solutions": ("remove cells tagged 'solution' from notebooks", None,
                        "midas-nb strip-solutions notebooks/02_three_condition_protocol.ipynb", [
        ("paths", dict(nargs="*", metavar="NOTEBOOK"), "notebooks to strip (default: every notebook in notebooks/)"),
        ("--in-place", _FLAG, "overwrite the named notebooks (default: write student/<name> beside each notebook)"),
        ("--force", _FLAG, "replace a student/<name> that differs from the stripped notebook (default: keep it, "
         "exit 2)")]),
    "export-html": ("static HTML edition of executed notebooks", None, "midas-nb export-html --profile quick", [
        ("--profile", dict(_PROFILE, default="quick"), "export the run of this profile, runs/<profile> (default: "
         "quick)"),
        ("--input", {}, "directory of executed notebooks (default runs/<profile>)"),
        ("--output", {}, "output directory (default <input>/html)")]),
    "report": ("REPORT.md and its CSV tables from a profile's result store", "reads runs/sweeps/<profile> (rows, and "
               "the cosine probes notebook 03 saved) and writes REPORT.md plus its CSV tables, with the paper's "
               "values beside ours and which of the paper's findings hold",
               "midas-nb report --profile quick --output runs/quick/report", [
        ("--profile", _PROFILE, "the profile whose results are reported, runs/sweeps/<profile> (default: quick)"),
        ("--store", {}, "result store directory (default runs/sweeps/<profile>)"),
        ("--output", {}, "report directory (default runs/<profile>/report)"),
        ("--readme", {}, "rewrite this README's results section from the tables"),
        ("--from-tables", {}, "re-render REPORT.md (and --readme) from the CSV tables in this directory, no store"),
        ("--backbone", {}, "the run's backbone, when not the profile's"),
        ("--depth", _INTEGER, "the run's depth L, when not the profile's"),
        ("--budget", dict(type=float), "the run's budget b, when not the profile's"),
        ("-p --param", _PAIRS, "a setting of the run, when not the profile's (as midas-nb run -p), e.g. -p precision "
         "bfloat16: the report reads only cells of these settings"),
        ("--allow-mixed-settings", _FLAG, "write the report although the store holds rows of other settings (another "
         "-p, precision, ...): they are left out and counted (default: refuse, exit 2)"),
        ("--allow-incomplete", _FLAG, "write the report although cells the profile expects have no result (failed, "
         "pending, unreadable); it is then marked INCOMPLETE and lists them (default: refuse, exit 1)")]),
}


def add_commands(ap: argparse.ArgumentParser, funcs: dict[str, Any]) -> None:
    """The subcommands of :data:`COMMANDS` under ``ap``, each calling ``funcs[name]``, with its examples as its
    epilog (and all of them as ``ap``'s)."""
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


def check_output(output: str | os.PathLike) -> list[str]:
    """``[]`` when the directory ``output`` takes new files or can be created, else why not (one line)."""
    out = probe_in = Path(output).expanduser()
    while not probe_in.exists() and probe_in != probe_in.parent:
        probe_in = probe_in.parent
    what = ("is a file" if out == probe_in else f"cannot be created: {str(probe_in)!r} is a file") \
        if not probe_in.is_dir() else None
    if what is None and (e := unwritable(probe_in)) is not None:
        what = "is not writable" if probe_in == out else f"cannot be created under {str(probe_in)!r}"
        what += f" ({type(e).__name__}: {e.strerror or e}); expected a writable directory"
    return [f"--output {str(out)!r}: {what}" + ("" if "expected" in what else "; expected a directory") +
            " for the executed notebooks"] if what else []
