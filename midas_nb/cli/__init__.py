"""``midas-nb`` command line: ``run``, ``sweep`` (``plan``, ``submit``, ``status``, ``wait``), ``strip-solutions``,
``export-html``, ``report``; ``midas-nb COMMAND --help`` gives each one's options."""
from __future__ import annotations

import argparse
import atexit
import functools
import logging
import signal
import sys
from pathlib import Path
from typing import Any, Sequence

# no torch at import time: --help, --version and argument errors answer at once (commands import the rest)
from .. import config
from . import runner
from .args import add_commands, check_split_values, package_version, param_value
from .runner import notebook_paths, run_notebooks

__all__ = ["main", "notebook_paths", "run_notebooks"]


def _answer(command: str, lines: Sequence[str], status: int = 2, outcome: str = "") -> int:
    """Each line as ``midas-nb COMMAND: line`` on stderr; with ``outcome``, then ``N problems; outcome``."""
    n = len(lines)
    for line in [*lines, *([f"{n} problem{'s' * (n != 1)}; {outcome}"] if outcome else [])]:
        print(f"midas-nb {command}: {line}", file=sys.stderr)
    return status


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        from .runspec import spec_from_args

        spec, problems = spec_from_args(args)
        run_notebooks(spec=spec, progress=not args.no_progress, problems=problems)
    except config.ProfileError as e:  # one line each (whatever a message holds); the run's own settings as options
        lines = [" ".join(str(line).split()) for line in e.problems]
        return _answer("run", [f"--{s.replace('_', '-')}{ln[len(s):]}" if (s := config.setting_of(ln)) in
                               ("cell_timeout", "output") else ln for ln in lines], outcome="no notebook was started")
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        return _answer("run", [str(e)], 1)
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    say = functools.partial(_answer, f"sweep {args.action}")
    if args.action in ("plan", "submit"):  # a profile's sweeps (midas_nb.study.cluster)
        args.profile = args.profile or "paper"
        try:   # a bad --sweep is answered before anything (the study, torch, pandas) is imported
            config.sweep_names(args.sweep)
        except ValueError as e:
            return say([str(e)])
        from ..study import cluster
        from ..sweeps.slurm import SlurmNotFound
        from .runspec import parse_data_roots

        root, roots, problems = parse_data_roots(args.data_root or [])
        try:
            return say(problems) if problems else cluster.cmd_from_args(
                args, dict(data_root=root, data_roots=roots or None, device=args.device))
        except (ValueError, FileNotFoundError, SlurmNotFound) as e:   # bad input: nothing was submitted
            return say([str(e)])
    if args.profile and args.name and args.profile != args.name:
        return say([f"store {args.name!r} and --profile {args.profile!r} differ; expected one of them (a store is "
                    "named after its profile)"])
    from ..sweeps import slurm, store as stores  # status / wait: the generic engine (no torch)

    name, rc = args.name or args.profile, 0
    names = [name] if name is not None else stores.all_stores()
    if not names:
        print("no sweeps found")
    for n in names:
        try:   # wait: a progress bar until nothing of the store is queued
            store = stores.open_store(n, must_exist=True)
            rc |= _sweep_status(slurm.wait(store, poll_s=10.0) if args.action == "wait" else slurm.cell_states(store))
        except (FileNotFoundError, ValueError) as e:
            return say([str(e)])
    if args.action == "status" and name in config.PROFILES:   # a profile's store: its notebook sweeps
        from ..study.cluster import catalogue_status
        print(catalogue_status(name))
    return rc


def _sweep_status(table: Any) -> int:
    """Print a store's status and its cells' jobs; 1 while failed, lost, unsubmitted or invalid cells remain."""
    from ..sweeps.store import format_status, n_unusable

    print(format_status(table))
    for state in ("PENDING", "RUNNING", "lost"):
        if len(rows := table[table["job_state"] == state]):
            print(f"  {len(rows)} cells {state.lower()}: jobs {', '.join(sorted(set(rows['job_id'].astype(str))))}")
    if unsent := int(table["job_state"].eq("unsubmitted").sum()):
        print(f"  {unsent} cells never submitted (sbatch refused): the same midas-nb sweep submit again sends them")
    return 1 if n_unusable(table) or table["job_state"].isin(["lost", "unsubmitted"]).any() else 0


def _cmd_strip(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.paths] or notebook_paths()
    if sources := [p.name for p in paths if args.in_place and runner.is_source_dir(p.parent)]:
        which = f"the source notebook(s) {', '.join(sources)}" if args.paths else "every source notebook"
        return _answer("strip-solutions", [
            f"--in-place would remove the solutions from {which} in {runner.notebooks_dir()}; expected copies to "
            "overwrite named (e.g. midas-nb strip-solutions --in-place course/02_copy.ipynb), or no --in-place"])
    import nbformat

    from ..course import strip_solutions

    problems = []
    for p in paths:  # every path checked before any notebook is written
        if not p.is_file():
            problems.append(f"{p} {'is a directory' if p.is_dir() else 'does not exist'}; expected an .ipynb file")
            continue
        try:
            nbformat.read(p, as_version=4)
        except Exception as e:  # noqa: BLE001 - NotJSONError, UnicodeDecodeError, a schema error: one line
            first = (str(e).strip().splitlines() or [""])[0][:200]
            problems.append(f"{p} is not a Jupyter notebook ({type(e).__name__}: {first}); expected an .ipynb file")
    if problems:
        return _answer("strip-solutions", problems)
    for p in paths:
        try:
            print(f"{p}: {strip_solutions(p, p if args.in_place else None, args.force)} solution cell(s) removed")
        except FileExistsError as e:  # a student's edited copy
            problems.append(f"{e}; pass --force to replace it")
    return _answer("strip-solutions", problems) if problems else 0


def _cmd_export(args: argparse.Namespace) -> int:
    src = Path(args.input) if args.input else config.runs_dir() / args.profile
    then = f"; run `midas-nb run --output {src}` first" if args.input else \
        f"; run `midas-nb run --profile {args.profile}` first (or name the run's directory with --input DIR)"
    if runner.is_source_dir(src):
        return _answer("export-html", [f"--input {args.input!r} is the folder of the source notebooks, which hold "
                                       f"no outputs; expected a run's directory: `midas-nb run --profile "
                                       f"{args.profile}`, then `midas-nb export-html --profile {args.profile}`"])
    if not src.is_dir():
        return _answer("export-html", [f"no executed notebooks: {src} does not exist or is not a directory{then}"])
    from ..course import export_html

    try:
        print(f"HTML edition: {export_html(src, Path(args.output) if args.output else None)}")
    except FileNotFoundError as e:
        if not str(e).startswith("no executed notebook"):
            return _answer("export-html", [str(e)], 1)
        return _answer("export-html", [f"no executed notebook (NN_*.ipynb with outputs) in {src}{then}"])
    except OSError as e:  # an output directory that cannot be written
        return _answer("export-html", [f"cannot write the HTML edition ({type(e).__name__}: {e})"], 1)
    return 0


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


def _report_problems(args: argparse.Namespace) -> list[str]:
    """Every problem of ``midas-nb report``'s arguments, one line each (docs/decisions/0024-preflight.md)."""
    from ..report import README_BEGIN, README_END, TABLES
    from .args import check_output

    problems, given = [], [f"--{k}" for k in _given(args, "profile", "store", "backbone", "depth", "budget", "param")]
    if args.from_tables is not None and given:
        one = len(given) == 1
        problems.append(f"--from-tables re-renders the saved tables as they are; {', '.join(given)} "
                        f"select{'s' if one else ''} what is read from a result store and would be ignored: "
                        f"drop {'it' if one else 'them'} or drop --from-tables")
    problems += [f"--{k.replace('_', '-')} {v!r}: expected a directory path"
                 for k, v in _given(args, "store", "output", "from_tables").items() if not v.strip()]
    if (args.from_tables or "").strip():
        tables = Path(args.from_tables).expanduser()
        if not tables.is_dir():
            state = "is not a directory" if tables.exists() else "does not exist"
            problems.append(f"--from-tables {args.from_tables!r}: {state}; expected the directory of a report's "
                            "CSV tables")
        elif absent := [f"{n}.csv" for n in TABLES if not (tables / f"{n}.csv").is_file()]:
            problems.append(f"--from-tables {args.from_tables!r}: {len(absent)} of the report's {len(TABLES)} tables "
                            f"missing ({', '.join(absent)}); expected a directory written by `midas-nb report` "
                            "(e.g. results)")
    if args.readme is not None:
        readme, markers = Path(args.readme).expanduser(), f"{README_BEGIN!r} ... {README_END!r}"
        text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else None
        if text is None:
            problems.append(f"--readme {args.readme!r}: {'is a directory' if readme.is_dir() else 'does not exist'}; "
                            f"expected a README file with the results section markers {markers}")
        elif not -1 < text.find(README_BEGIN) <= text.find(README_END):
            problems.append(f"--readme {args.readme!r}: has no results section; expected the markers {markers} "
                            "around the section to rewrite")
    problems += check_output(args.output, "the report") if (args.output or "").strip() else []
    if overrides := _report_overrides(args):   # the run's own checks of what it overrides (and a backbone's depth)
        from .runspec import build_lines

        named = {*overrides, *(("depth",) if "backbone" in overrides else ())}
        problems += [("--" if config.setting_of(line) in ("backbone", "depth", "budget") else "-p ") + line
                     for line in build_lines(args.profile or "quick", overrides) if config.setting_of(line) in named]
    return problems


def _report_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """--backbone, --depth, --budget and each -p NAME VALUE of ``midas-nb report``."""
    return {**_given(args, "backbone", "depth", "budget"), **{n: param_value(n, v) for n, v in args.param or []}}


def _cmd_report(args: argparse.Namespace) -> int:
    if problems := _report_problems(args):
        return _answer("report", problems, outcome="nothing was written")
    from ..report import make_report

    try:
        path = make_report(args.profile or "quick", store=args.store, output=args.output, readme=args.readme,
                           from_tables=args.from_tables, overrides=_report_overrides(args),
                           allow_incomplete=args.allow_incomplete, allow_mixed_settings=args.allow_mixed_settings)
    except (FileNotFoundError, ValueError) as e:   # bad input: no store, no row, missing cells, rows of other
        return _answer("report", str(e).splitlines())   # settings, tables not a report's, a MIDAS_*_DIR (ProfileError)
    except OSError as e:                   # a directory not writable: a failure
        return _answer("report", [str(e)], 1)
    print(f"report: {path}" + (f"\nREADME results section: {args.readme}" if args.readme else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="midas-nb", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="midas-nb command line: batch reruns of the notebooks and small "
                                             "utilities.\nmidas-nb COMMAND --help shows a command's options.")
    ap.add_argument("--version", action="version", version=f"midas-nb {package_version()}",
                    help="print the package version and exit")
    add_commands(ap, {"run": _cmd_run, "sweep": _cmd_sweep, "strip-solutions": _cmd_strip,
                      "export-html": _cmd_export, "report": _cmd_report})
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if split := check_split_values(argv):  # argparse would say "unrecognized arguments: 1]"
        return _answer("run", split)
    args = build_parser().parse_args(argv)
    # SIGTERM (kill, a scheduler) stops a run as Ctrl-C does; the caller's handler after it
    term = signal.signal(signal.SIGTERM, signal.default_int_handler) if args.command == "run" else None
    try:
        return int(args.func(args) or 0)
    except config.ProfileError as e:  # a bad setting no command checked first (a MIDAS_*_DIR that is a file)
        return _answer(args.command, e.problems)
    except KeyboardInterrupt:
        # nbclient's abandoned cell task logs a traceback as it is collected at exit: the asyncio logger goes off
        # then, not now (an in-process caller keeps it)
        atexit.register(setattr, logging.getLogger("asyncio"), "disabled", True)
        return _answer(args.command, ["interrupted; finished notebooks, finished backbone builds and result-store "
                                      "cells are kept; the next run resumes from them (a build stopped mid-training "
                                      "starts again)"], 130)
    finally:
        if term is not None:
            signal.signal(signal.SIGTERM, term)
