"""Command-line text read into values, with nothing heavy imported (no torch, no papermill), so
that ``midas-nb --help``, ``--version`` and argument errors answer at once
(docs/decisions/0019-cli-answers-at-once.md; values: 0030-parameter-values.md).
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any, Sequence

from .. import config

__all__ = ["EXAMPLES", "LIST_PARAMS", "add_examples", "add_sweep_parser", "list_param", "package_version",
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


#: one example per subcommand, shown under its --help (and all of them under midas-nb --help)
EXAMPLES: dict[str, str] = {
    "run": "midas-nb run --profile quick --notebooks 00,02 -p seeds 0,1\n"
           "midas-nb run --profile paper --device cuda --data-root cub=/data/CUB_200_2011",
    "params": "midas-nb params 02",
    "sweep": "midas-nb sweep plan --profile paper\n"
             "midas-nb sweep submit --profile paper --data-root cub=/data/CUB_200_2011 --partition gpu --gpus 1 "
             "--time 120\n"
             "midas-nb sweep status paper",
    "strip-solutions": "midas-nb strip-solutions notebooks/02_three_condition_protocol.ipynb",
    "export-html": "midas-nb export-html --profile quick",
    "report": "midas-nb report --profile quick --output runs/quick/report",
}


def package_version() -> str:
    """The installed package's version (importlib.metadata), else the source tree's."""
    from importlib import metadata

    try:
        return metadata.version("midas_nb")
    except metadata.PackageNotFoundError:
        from .. import __version__
        return __version__


def add_examples(ap: argparse.ArgumentParser, sub: Any) -> None:
    """Each subcommand's example as its epilog, all of them under the top-level help."""
    for name, parser in sub.choices.items():
        if name in EXAMPLES:
            parser.formatter_class = argparse.RawDescriptionHelpFormatter
            lines = EXAMPLES[name].splitlines()
            parser.epilog = f"example{'s' if len(lines) > 1 else ''}:\n" + "\n".join(f"  {line}" for line in lines)
    ap.epilog = "examples:\n" + "\n".join(f"  {line}" for n in sub.choices if n in EXAMPLES
                                           for line in EXAMPLES[n].splitlines())


def profile_name(text: str) -> str:
    """argparse ``type`` of a known profile (else ``run``'s error, exit status 2)."""
    if text in config.PROFILES:
        return text
    from ..point import did_you_mean

    raise argparse.ArgumentTypeError(f"unknown profile {text!r}{did_you_mean([text], config.PROFILES)}; "
                                     f"expected one of {sorted(config.PROFILES)}")


#: ``--profile``'s metavar: the profiles, as argparse's ``choices`` would list them
PROFILE_METAVAR = "{" + ",".join(sorted(config.PROFILES)) + "}"


def add_sweep_parser(sub: Any, func: Any) -> argparse.ArgumentParser:
    """The ``midas-nb sweep`` subcommand, calling ``func``."""
    s = sub.add_parser("sweep", help="sweeps on a cluster: plan, submit, status, wait",
                       description="plan: the jobs, arrays, cells and projected GPU-hours of a profile's sweeps, "
                                   "nothing submitted; submit: send them (returns after submission; the same submit "
                                   "again sends the failed, lost and never-submitted cells); status: cells done / "
                                   "failed / pending of the result stores under runs/sweeps (one per profile); wait: "
                                   "until nothing is queued")
    s.add_argument("action", choices=["plan", "submit", "status", "wait"],
                   help="plan, submit, status (exit 1 while cells failed, were lost or were never submitted), wait")
    s.add_argument("name", nargs="?", default=None,
                   help="status/wait: store name = the profile that wrote it, e.g. quick (default: every store)")
    s.add_argument("--profile", type=profile_name, metavar=PROFILE_METAVAR, default=None,
                   help="plan/submit: the profile whose sweeps are planned or submitted (default: paper); "
                        "status/wait: that profile's store, as NAME")
    s.add_argument("--sweep", default="all", metavar="NAMES",
                   help="plan/submit: comma-separated sweeps: protocol, soft, random (notebook 02), regime (04), "
                        "scale, backbones (05), related (06), or all (default)")
    s.add_argument("--executor", choices=["slurm", "local", "processes"], default="slurm",
                   help="submit: slurm (default; returns after submission), local or processes (run here)")
    s.add_argument("--partition", default=None, help="submit: Slurm partition")
    s.add_argument("--gpus", type=int, default=None, help="submit: GPUs per job (gpus_per_node)")
    s.add_argument("--cpus", type=int, default=None, help="submit: CPUs per job (cpus_per_task)")
    s.add_argument("--mem", default=None, help="submit: memory per job, e.g. 32G")
    s.add_argument("--time", type=int, default=None, metavar="MINUTES", help="submit: time limit per job")
    s.add_argument("--cells-per-job", type=int, default=8, help="plan/submit: cells per job (default 8)")
    s.add_argument("--max-array-size", type=int, default=None,
                   help="plan/submit: array size limit (default: MaxArraySize from scontrol show config, else 1001)")
    s.add_argument("--device", default=None,
                   help="submit: device of the cells (default: the profile's); with --executor slurm it is resolved "
                        "on the compute node, not here")
    s.add_argument("--data-root", action="append", default=None, metavar="DATASET=PATH",
                   help="plan/submit: a dataset's directory, repeatable (cub=..., aircraft=..., cars=...)")
    s.add_argument("--workers", type=int, default=2, help="submit --executor processes: workers (default 2)")
    s.add_argument("--cost", default=None, metavar="FILE",
                   help="plan: cost table of bench/gpu_check.py (default runs/bench/cell_cost.json, else the one "
                        "shipped: the last H200 measurement); the store's timed cells come first")
    s.set_defaults(func=func)
    return s


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
