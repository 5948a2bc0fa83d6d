"""``midas-nb`` command line: batch reruns of the notebooks and small utilities.

Subcommands: ``run``, ``params``, ``sweep`` (``plan``, ``submit``, ``status``, ``wait``, ``resubmit``),
``strip-solutions``, ``export-html``, ``report``; ``midas-nb COMMAND --help`` gives each one's options.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
import time
from pathlib import Path
from dataclasses import replace
from typing import Any, Sequence, TYPE_CHECKING

# no torch at import time: --help, --version and argument errors answer at once (commands import the rest)
from .. import config
from .args import (PROFILE_METAVAR, add_examples, add_sweep_parser, check_split_values, package_version,
                   param_value, profile_name)

if TYPE_CHECKING:
    from .runspec import RunSpec

__all__ = ["main", "notebook_paths", "run_notebooks"]


def notebooks_dir() -> Path:
    """``notebooks/`` of the project."""
    return config.project_root() / "notebooks"


def notebook_paths(selection: str | Sequence[str] | None = None) -> list[Path]:
    """The ordered notebooks, or those ``selection`` names (prefixes ``"00,02"`` or a list of them).

    Raises:
        ValueError: a selection that is not a string (or list of strings), names no prefix, or
            has prefixes that match no notebook (all of them in one message).
    """
    paths = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    if selection is None:
        return paths
    if isinstance(selection, (list, tuple)) and all(isinstance(x, str) for x in selection):
        selection = ",".join(selection)
    available = [p.stem for p in paths]
    if not isinstance(selection, str):
        raise ValueError(f"expected comma-separated prefixes such as '00,02', got {selection!r} "
                         f"({type(selection).__name__})")
    words = [s.strip() for s in selection.split(",")]
    # a one-digit word would match every notebook of that decade: never a prefix
    hits = {w: [p for p in paths if p.name.startswith(w)] if not re.fullmatch(r"\d", w) else [] for w in words if w}
    if not hits:
        raise ValueError(f"{selection!r} names no notebook; expected comma-separated prefixes such as 00,02 "
                         f"(available: {available})")
    if "" in words:
        raise ValueError(f"{selection!r} has an empty entry; expected comma-separated prefixes such as 00,02")
    # a one-digit prefix: suggest the two-digit one only where that notebook exists
    missing = [repr(w) + (f" (prefixes have two digits: '0{w}')" if re.fullmatch(r"\d", w) and
                          any(p.name.startswith(f"0{w}") for p in paths) else "") for w, h in hits.items() if not h]
    if missing:
        raise ValueError(f"no notebook matches {', '.join(missing)}; available: {available}")
    return sorted({p for h in hits.values() for p in h})


def _selected(notebooks: str | Sequence[str] | None, problems: Sequence[str] = ()) -> list[Path]:
    """:func:`notebook_paths` of ``notebooks``; a selection of no notebook raises
    :class:`midas_nb.config.ProfileError` (with ``problems``) before anything else is checked."""
    try:
        return notebook_paths(notebooks)
    except ValueError as e:
        raise config.ProfileError([*problems, f"--notebooks: {e} (the other settings are checked once it "
                                               f"names one)"]) from None


def run_notebooks(profile: str = "quick", *, notebooks: str | None = None, extra: dict[str, Any] | None = None,
                  output: str | Path | None = None, cell_timeout: float | None = None, progress: bool = True,
                  spec: RunSpec | None = None, problems: Sequence[str] = ()) -> Path:
    """Execute the notebooks in order with papermill, the run description (``spec``, else the
    arguments; ``extra``: ``-p`` parameters) checked first; returns the output directory. Stops at
    the first failure (its copy under ``<output>/failed/``); the run is recorded in ``run.json``
    (docs/decisions/0032-run-manifest.md). ``problems``: found already, listed with the others.

    Raises:
        midas_nb.config.ProfileError: the run cannot start; one line per problem.
        RuntimeError: a notebook failed, its kernel died or a cell timed out.
    """
    from .runspec import fold_structured_params, RunSpec

    if spec is None:
        spec = RunSpec(profile=profile, params=dict(extra or {}), notebooks=notebooks,
                       output=None if output is None else str(output), cell_timeout=cell_timeout)
    fold_structured_params(spec)
    if len(run_datasets(spec)) > 1:
        return _run_each_dataset(spec, run_datasets(spec), progress=progress, problems=problems)
    out_dir = _run_checked(spec, *_checked(spec, [spec], problems), progress=progress)
    print(f"  report:             {_report_command(spec)}  (REPORT.md from the result store)")
    return out_dir


def _run_checked(spec: RunSpec, paths: Sequence[Path], accepted_by: dict, *, progress: bool) -> Path:
    """The body of :func:`run_notebooks` once ``spec`` passed :func:`_checked`: execute ``paths``,
    record the run, print where its outputs are (and the paper-shaped table after a multi-dataset readout)."""
    from ..runs import run_summary, RunManifest, scoped_environ
    from ..study import grid_spans
    from .runspec import GRID_NOTEBOOKS

    out_dir = Path(spec.output) if spec.output else config.runs_dir() / spec.profile
    out_dir.mkdir(parents=True, exist_ok=True)
    params, manifest, t_all, completed = spec.notebook_parameters(), RunManifest(out_dir), time.time(), False
    run_id = manifest.start(params, [nb.name for nb in paths])
    # batch runs have no widget front-end (the explorer draws its static figure) and leave no tqdm
    # residue in the executed notebooks (papermill's own bar shows the progress)
    env = dict(MIDAS_PROFILE=spec.profile, MIDAS_HEADLESS=os.environ.get("MIDAS_HEADLESS", "1"),
               TQDM_DISABLE=os.environ.get("TQDM_DISABLE", "1"))
    try:
        with scoped_environ(**env):
            for i, nb in enumerate(paths, 1):
                _execute_notebook(nb, f"[{i}/{len(paths)}]", out_dir, accepted_by[nb], params, spec, progress,
                                  manifest, run_id)
        completed = True
    finally:
        manifest.finish(run_id, completed)
        for where in (out_dir / ".partial" / run_id, out_dir / ".partial"):
            with contextlib.suppress(OSError):
                where.rmdir()         # where empty: it holds only notebooks still running
        print("\n" + run_summary(out_dir), flush=True)
    which = "The notebook" if len(paths) == 1 else f"All {len(paths)} notebooks"
    print(f"\n{which} ran in {time.time() - t_all:.0f} s (run {run_id}).\n  executed notebooks: {out_dir}\n"
          f"  results tables:     {config.runs_dir() / 'tables'}\n"
          f"  figures:            {config.figures_dir(spec.profile)}")
    # after a run of the scale readout (05) over several datasets: the paper-shaped table, printed and saved
    settings = spec.settings() if any(GRID_NOTEBOOKS.get(p.name[:2]) == "scale" for p in paths) else None
    if settings is not None and len(grid_spans(settings, "scale")[0]) > 1:
        from ..report.paper_table import format_paper_table, paper_table_for
        from ..results import save_table

        table = paper_table_for(settings)
        save_table(table, f"paper_table_{spec.profile}", config.runs_dir() / "tables")
        print(f"\nThe paper-shaped table (L={settings['depth']}, b={settings['budget']:g}; "
              f"saved as {config.runs_dir() / 'tables' / f'paper_table_{spec.profile}.csv'}):\n"
              f"{format_paper_table(table)}")
    return out_dir


def _report_command(spec: RunSpec) -> str:
    """The ``midas-nb report`` command over this run's result store, with its overridden point and backbone,
    preceded by the run's ``MIDAS_CACHE_DIR`` / ``MIDAS_RUNS_DIR`` where set (the report reads the checkpoints'
    top-1 from the one, the result store from the other)."""
    import shlex
    given = spec.notebook_parameters()   # --backbone and -p alike
    from ..study import protocol_settings

    flags = "".join(f" --{k} {given[k]}" for k in ("backbone", "depth", "budget") if given.get(k) is not None)
    flags += "".join(f" -p {k} {given[k]}" for k in protocol_settings(given) if k in given)   # e.g. precision
    env = "".join(f"{k}={shlex.quote(os.environ[k])} " for k in ("MIDAS_CACHE_DIR", "MIDAS_RUNS_DIR")
                  if os.environ.get(k))
    # a selection of notebooks leaves the others' cells without a result: the report would refuse
    return f"{env}midas-nb report --profile {spec.profile}{flags}" + (" --allow-incomplete" if spec.notebooks else "")


def run_datasets(spec: RunSpec) -> list[str | None]:
    """The datasets a run executes the notebooks on, one after another: those ``data_roots`` names,
    in :data:`midas_nb.config.PAPER_DATASETS` order, when several and neither ``spec.dataset`` nor
    a ``datasets`` grid is set; else ``[None]`` (the profile's own dataset)."""
    named = [d for d in config.PAPER_DATASETS if d in (spec.data_roots if isinstance(spec.data_roots, dict) else {})]
    if spec.dataset is not None or len(named) < 2 or config.PROFILES.get(spec.profile, {}).get("datasets") \
            or "datasets" in spec.params:
        return [None]
    return named


def _checked(spec: RunSpec, subs: Sequence[RunSpec], problems: Sequence[str]) -> tuple[list[Path], dict]:
    """``(notebooks, {notebook: parameters it accepts})`` once each run of ``subs`` (one per dataset)
    passes :func:`midas_nb.cli.runspec.preflight`; a problem of several runs is said once, the others
    prefixed with their dataset. Raises :class:`midas_nb.config.ProfileError` with every problem."""
    paths = _selected(spec.notebooks, problems)
    if not paths:
        raise RuntimeError(f"no notebooks found in {notebooks_dir()}")
    import papermill as pm  # heavy; imported only when a batch run starts

    from . import runspec

    accepted_by = {nb: set(pm.inspect_notebook(str(nb))) for nb in paths}
    each = [(sub.dataset, runspec.preflight(sub, paths, set().union(*accepted_by.values()))) for sub in subs]
    common = set.intersection(*(set(lines) for _, lines in each))
    out = spec.output  # --output naming the source notebooks' folder would replace them with executed copies
    source = [f"--output {str(out)!r}: is the folder of the source notebooks ({notebooks_dir()}); the executed "
              f"copies would replace them; expected another directory (default runs/<profile>)"] \
        if isinstance(out, (str, os.PathLike)) and str(out).strip() and _is_source_dir(out) else []
    found = [*problems, *source, *(p if p in common else f"{ds}: {p}" for ds, lines in each for p in lines)]
    if found:
        raise config.ProfileError(list(dict.fromkeys(found)))   # a problem two checks meet is said once
    return paths, accepted_by


def _run_each_dataset(spec: RunSpec, datasets: Sequence[str], *, progress: bool, problems: Sequence[str]) -> Path:
    """:func:`run_notebooks` once per dataset into ``<output>/<dataset>/`` (figures into
    ``figures/<profile>/<dataset>/``), every run checked first; then the report over the datasets
    (``<output>/report``) and the paper-shaped table."""
    from ..report import make_report
    from ..report.markdown import datasets_summary
    from ..runs import scoped_environ
    from ..study import protocol_settings

    out_dir = Path(spec.output) if spec.output else config.runs_dir() / spec.profile
    # each dataset's run keeps only its own root: the others are for the other runs, not unused
    subs = [replace(spec, dataset=d, data_roots={d: spec.data_roots[d]}, output=str(out_dir / d)) for d in datasets]
    paths, accepted_by = _checked(spec, subs, problems)   # every dataset's run, once, before any kernel
    t_all, figures = time.time(), config.figures_dir(spec.profile)
    for i, sub in enumerate(subs, 1):
        print(f"\n=== dataset {i}/{len(subs)}: {sub.dataset} ===", flush=True)
        # each dataset's figures and tables in their own folder: the next dataset would overwrite them
        with scoped_environ(MIDAS_FIGURES_DIR=str(figures / str(sub.dataset))):
            _run_checked(sub, paths, accepted_by, progress=progress)
    print(f"\nThe {len(subs)} datasets ran in {time.time() - t_all:.0f} s.")
    prof = spec.settings()
    overrides = {k: prof[k] for k in ("backbone", "depth", "budget", *protocol_settings(prof))   # this run's settings
                 if k in prof and (k in spec.params or k == "backbone")}
    report = make_report(spec.profile, output=out_dir / "report", overrides=overrides, allow_incomplete=True,
                         allow_mixed_settings=True)
    print(f"  report over {', '.join(datasets)}: {report}\n\n{datasets_summary(report.parent)}")
    return out_dir


def _is_source_dir(path: str | os.PathLike) -> bool:
    """``path`` is the project's ``notebooks/`` (the source notebooks)."""
    return Path(path).expanduser().resolve() == notebooks_dir().resolve()


def _execute_notebook(nb: Path, counter: str, out_dir: Path, accepted: set[str], params: dict[str, Any],
                      spec: RunSpec, progress: bool, manifest: Any, run_id: str) -> None:
    """Execute ``nb`` into ``<out_dir>/.partial/<run_id>/`` (another run into ``out_dir`` has its own),
    then move it to ``<out_dir>/<name>``; on failure
    keep the executed copy under ``failed/``, record it and raise ``RuntimeError`` (naming it, what
    happened and the copy)."""
    import shutil

    import nbformat
    from papermill.exceptions import PapermillExecutionError  # heavy; imported only when a batch run starts

    from .. import runs  # runs.execute_notebook: papermill with the streamed status line

    print(f"{counter} {nb.name} ...", flush=True)
    t0 = time.time()
    partial, failed = out_dir / ".partial" / run_id / nb.name, out_dir / "failed" / nb.name
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        runs.execute_notebook(str(nb), str(partial), parameters={k: v for k, v in params.items() if k in accepted},
                              cwd=str(nb.parent), progress_bar=progress, kernel_name="python3",
                              execution_timeout=spec.cell_timeout)
    except Exception as e:  # noqa: BLE001 - a failed cell, a dead kernel, a cell timeout, a kernel that never started
        name = type(e).__name__
        failed.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(e, PapermillExecutionError):
            shutil.move(str(partial), str(failed))
            what = f"failed in cell {e.exec_count} ({e.ename}: {e.evalue})"
            said = f"notebook {nb.name} {what}; the executed copy with the error is {failed}"
        else:
            if "Timeout" in name:
                what = (f"a cell ran longer than the cell timeout ({spec.cell_timeout} s) and was stopped "
                        f"({name}: {str(e).splitlines()[0] if str(e) else ''})")
            elif "DeadKernel" in name:
                what = (f"the kernel died ({name}: {e}); out of memory, a crash in native code or a "
                        f"killed process are the usual causes")
            else:
                what = f"the kernel stopped ({name}: {e})"
            # the executed copy papermill left (or the source) with a first cell saying why it did not finish
            copy = nbformat.read(str(partial if partial.is_file() else nb), as_version=4)
            note = nbformat.v4.new_markdown_cell(f"**midas-nb run: this notebook did not finish.** {what}")
            note.metadata["tags"] = ["midas-run-failure"]
            copy.cells.insert(0, note)
            nbformat.write(copy, str(failed))
            partial.unlink(missing_ok=True)
            said = f"notebook {nb.name}: {what}; the executed copy is {failed}"
        manifest.record_failure(run_id, nb.name, what)
        raise RuntimeError(said) from None
    stamped = nbformat.read(str(partial), as_version=4)  # the run id in its metadata (run manifest)
    stamped.metadata["midas_nb"] = dict(run_id=run_id, profile=spec.profile, parameters=params)
    nbformat.write(stamped, str(partial))
    partial.replace(out_dir / nb.name)
    print(f"    done in {time.time() - t0:.0f} s -> {out_dir / nb.name}", flush=True)


def _answer(command: str, lines: Sequence[str], status: int = 2) -> int:
    """Print each line as ``midas-nb COMMAND: line`` on stderr; returns the exit ``status``."""
    for line in lines:
        print(f"midas-nb {command}: {line}", file=sys.stderr)
    return status


def _cmd_run(args: argparse.Namespace) -> int:
    try:
        if args.notebooks is not None:  # a selection of no notebook is answered before torch and papermill load
            _selected(args.notebooks)
        from .runspec import spec_from_args

        spec, problems = spec_from_args(args)
        # the run file's and command line's problems are listed with every other problem preflight finds
        run_notebooks(spec=spec, progress=not args.no_progress, problems=problems)
    except config.ProfileError as e:  # one line each, whatever a library's message holds
        return _answer("run", [*(" ".join(str(line).split()) for line in e.problems),
                               f"{len(e.problems)} problem(s); no notebook was started"])
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        return _answer("run", [str(e)], 1)
    return 0


def _cmd_params(args: argparse.Namespace) -> int:
    path = Path(args.notebook)
    try:
        found = [path] if path.is_file() else notebook_paths(args.notebook)
    except ValueError as e:
        return _answer("params", [str(e)])
    if len(found) > 1:
        return _answer("params", [f"{args.notebook!r} names {len(found)} notebooks ({', '.join(p.stem for p in found)}); "
                                  "expected one, such as 02"])
    path = found[0]
    import papermill as pm  # heavy: after the cheap checks

    try:
        params = pm.inspect_notebook(str(path))
    except Exception as e:  # noqa: BLE001 - NotJSONError, UnicodeDecodeError, a schema error: one line
        return _answer("params", [f"{_not_a_notebook(path, e)} or a notebook prefix such as 02"])
    # profile is set with --profile, and -p refuses it: not listed among the -p parameters
    rows = [(name, str(info["default"]), str(info["help"])) for name, info in params.items() if name != "profile"]
    print(f"parameters of {path.name} (set with `midas-nb run -p NAME VALUE`; None = the profile's default; "
          f"the profile is set with --profile)")
    wn, wd = (max((len(r[i]) for r in rows), default=0) for i in (0, 1))
    for name, default, text in rows:
        print(f"  {name:{wn}s}  default {default:{wd}s}  {text}".rstrip())
    return 0


def _not_a_notebook(path: Path, e: Exception) -> str:
    first = str(e).strip().splitlines()[0][:200] if str(e).strip() else ""
    return f"{path} is not a Jupyter notebook ({type(e).__name__}: {first}); expected an .ipynb file"


def _cmd_sweep(args: argparse.Namespace) -> int:
    if args.action in ("plan", "submit"):  # a profile's sweeps (midas_nb.study.cluster)
        args.profile = args.profile or "paper"
        try:   # a bad --sweep is answered before the study (and torch) is imported
            config.sweep_names(args.sweep)
        except ValueError as e:
            return _answer(f"sweep {args.action}", [str(e)])
        from ..study import cluster
        from .runspec import parse_data_roots

        root, roots, problems = parse_data_roots(args.data_root or [])
        if problems:
            return _answer(f"sweep {args.action}", problems)
        return cluster.cmd_from_args(args, dict(data_root=root, data_roots=roots or None, device=args.device))
    if args.profile and args.name and args.profile != args.name:
        return _answer(f"sweep {args.action}", [f"store {args.name!r} and --profile {args.profile!r} differ; "
                                                "expected one of them (a store is named after its profile)"])
    from ..sweeps import commands  # status / wait / resubmit (midas_nb.sweeps.commands)

    act = dict(wait=commands.cmd_wait, resubmit=commands.cmd_resubmit).get(args.action, commands.cmd_status)
    return act(args.name or args.profile)


def _cmd_strip(args: argparse.Namespace) -> int:
    paths = [Path(p) for p in args.paths] or notebook_paths()
    sources = [p.name for p in paths if args.in_place and _is_source_dir(p.parent)]
    if sources:
        which = f"the source notebook(s) {', '.join(sources)}" if args.paths else "every source notebook"
        return _answer("strip-solutions", [
            f"--in-place would remove the solutions from {which} in {notebooks_dir()}; expected copies to "
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
            problems.append(_not_a_notebook(p, e))
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
    how = f"midas-nb run --output {src}" if args.input else f"midas-nb run --profile {args.profile}"
    where = "" if args.input else " (or name the run's directory with --input DIR)"
    if _is_source_dir(src):  # the source notebooks hold no outputs, and a run must not write there
        return _answer("export-html", [f"--input {args.input!r} is the folder of the source notebooks, which hold "
                                       f"no outputs; expected a run's directory: `midas-nb run --profile "
                                       f"{args.profile}`, then `midas-nb export-html --profile {args.profile}`"])
    if not src.is_dir():
        return _answer("export-html", [f"no executed notebooks: {src} does not exist or is not a directory; "
                                       f"run `{how}` first{where}"])
    from ..course import export_html

    try:
        print(f"HTML edition: {export_html(src, Path(args.output) if args.output else None)}")
    except FileNotFoundError as e:
        if not str(e).startswith("no executed notebook"):
            return _answer("export-html", [str(e)], 1)
        return _answer("export-html", [f"no executed notebook (NN_*.ipynb with outputs) in {src}; run `{how}` "
                                       f"first{where}"])
    except OSError as e:  # an output directory that cannot be written
        return _answer("export-html", [f"cannot write the HTML edition ({type(e).__name__}: {e})"], 1)
    return 0


def _given(args: argparse.Namespace, *names: str) -> dict[str, Any]:
    """The options among ``names`` that were given (not ``None``)."""
    return {k: getattr(args, k) for k in names if getattr(args, k) is not None}


def _report_problems(args: argparse.Namespace) -> list[str]:
    """Every problem of ``midas-nb report``'s arguments, one line each (docs/decisions/0024-preflight.md)."""
    problems: list[str] = []
    given = [f"--{k}" for k in _given(args, "profile", "store", "backbone", "depth", "budget", "param")]
    if args.from_tables is not None and given:
        one = len(given) == 1
        problems.append(f"--from-tables re-renders the saved tables as they are; {', '.join(given)} "
                        f"select{'s' if one else ''} what is read from a result store and would be ignored: "
                        f"drop {'it' if one else 'them'} or drop --from-tables")
    blank = [k for k, v in _given(args, "store", "output", "from_tables").items() if not v.strip()]
    problems += [f"--{k.replace('_', '-')} {getattr(args, k)!r}: expected a directory path" for k in blank]
    tables = Path(args.from_tables).expanduser() if args.from_tables is not None and "from_tables" not in blank \
        else None
    # a missing --store is "no results yet", answered by make_report (exit 1) as for the default store
    if tables is not None and not tables.is_dir():
        state = "is not a directory" if tables.exists() else "does not exist"
        problems.append(f"--from-tables {args.from_tables!r}: {state}; expected the directory of a report's CSV tables")
    elif tables is not None:
        from ..report import TABLES

        absent = [f"{n}.csv" for n in TABLES if not (tables / f"{n}.csv").is_file()]
        problems += [f"--from-tables {args.from_tables!r}: {len(absent)} of the report's {len(TABLES)} tables "
                     f"missing ({', '.join(absent)}); expected a directory written by `midas-nb report` "
                     "(e.g. results)"] if absent else []
    if args.readme is not None:
        from ..report import README_BEGIN, README_END

        readme, markers = Path(args.readme).expanduser(), f"{README_BEGIN!r} ... {README_END!r}"
        text = readme.read_text(encoding="utf-8", errors="replace") if readme.is_file() else ""
        if not readme.is_file():
            problems.append(f"--readme {args.readme!r}: {'is a directory' if readme.is_dir() else 'does not exist'}; "
                            f"expected a README file with the results section markers {markers}")
        elif not -1 < text.find(README_BEGIN) <= text.find(README_END):
            problems.append(f"--readme {args.readme!r}: has no results section; expected the markers {markers} "
                            f"around the section to rewrite")
    if args.output is not None and "output" not in blank:
        from .runspec import check_output

        problems += [why.replace("for the executed notebooks", "for the report") for why in check_output(args.output)]
    overrides = _report_overrides(args)
    if not overrides:
        return problems
    from ..study import RunSettings

    try:   # the run's own checks; the report names those of the settings it overrides (a backbone: its depth too)
        RunSettings.build(args.profile or "quick", **overrides)
    except config.ProfileError as e:
        named = {*overrides, *(("depth",) if "backbone" in overrides else ())}
        problems += [("--" if config.setting_of(line) in ("backbone", "depth", "budget") else "-p ") + line
                     for line in e.problems if config.setting_of(line) in named]
    return problems


def _report_overrides(args: argparse.Namespace) -> dict[str, Any]:
    """The run settings ``midas-nb report`` was given: --backbone, --depth, --budget and each -p NAME VALUE."""
    return {**_given(args, "backbone", "depth", "budget"), **{n: param_value(n, v) for n, v in args.param or []}}


def _cmd_report(args: argparse.Namespace) -> int:
    problems = _report_problems(args)
    if problems:
        return _answer("report", [*problems, f"{len(problems)} problem(s); nothing was written"])
    from ..report import make_report, MixedSettingsError

    try:
        path = make_report(args.profile or "quick", store=args.store, output=args.output, readme=args.readme,
                           from_tables=args.from_tables, overrides=_report_overrides(args),
                           allow_incomplete=args.allow_incomplete, allow_mixed_settings=args.allow_mixed_settings)
    except config.ProfileError as e:       # a MIDAS_*_DIR that is not a directory
        return _answer("report", e.problems)
    except MixedSettingsError as e:        # the store holds rows of other settings: refused, nothing written
        return _answer("report", str(e).splitlines())
    except (OSError, ValueError) as e:     # no store or tables, unreadable tables, a directory not writable
        return _answer("report", [str(e)], 1)
    print(f"report: {path}" + (f"\nREADME results section: {args.readme}" if args.readme else ""))
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="midas-nb", formatter_class=argparse.RawDescriptionHelpFormatter,
                                 description="midas-nb command line: batch reruns of the notebooks and small "
                                             "utilities.\nmidas-nb COMMAND --help shows a command's options.")
    ap.add_argument("--version", action="version", version=f"midas-nb {package_version()}",
                    help="print the package version and exit")
    sub = ap.add_subparsers(dest="command", required=True, metavar="COMMAND")

    r = sub.add_parser("run", help="execute the notebooks in order with papermill",
                       description="Execute the notebooks in order with papermill. Every setting is checked "
                                   "before any kernel starts; problems are listed one per line (exit status 2).")
    r.add_argument("--config", metavar="RUN.yaml", help="run file with the same settings (profile, data_roots, "
                   "weights, device, params, ...); command-line options override it")
    r.add_argument("--profile", metavar=PROFILE_METAVAR, help="settings profile: smoke (seconds), quick (minutes on a "
                   "CPU), paper (GPU), rehearsal (the paper run's shape on a CPU, tiny sizes) (default: quick)")
    r.add_argument("--data-root", action="append", metavar="[DATASET=]PATH",
                   help="a dataset's directory, repeatable: cub=PATH, aircraft=PATH, cars=PATH; a plain PATH is the "
                        "run's own dataset (default for quick/smoke without any root: the embedded synthetic set)")
    r.add_argument("--weights", action="append", metavar="[BACKBONE=]FILE",
                   help="a backbone's weights file (.pth, .safetensors, AugReg .npz), repeatable; a bare FILE is the "
                        "run's backbone's (default: timm's pretrained weights from the hub)")
    r.add_argument("--dataset", metavar="{" + ",".join(config.DATASET_NAMES) + "}",
                   help="the study's dataset (default: the profile's; synthetic is the generated CUB-format set)")
    r.add_argument("--backbone", help="backbone name (default: the profile's)")
    r.add_argument("--device", help="cpu, cuda, cuda:1 ... (default: the profile's; cuda without CUDA is an error)")
    r.add_argument("--notebooks", help="comma-separated prefixes, e.g. 00,02 (default: every notebook)")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="notebook parameter, repeatable (midas-nb params NOTEBOOK lists them): a number, a YAML "
                        "value in quotes ('[0, 1]'), or for lists comma-separated values (-p seeds 0,1)")
    r.add_argument("--output", help="directory for executed notebooks (default runs/<profile>)")
    r.add_argument("--cell-timeout", type=float, metavar="SECONDS",
                   help="stop a cell that runs longer (the notebook goes to failed/)")
    r.add_argument("--no-progress", action="store_true", help="no progress bar while a notebook runs")
    r.set_defaults(func=_cmd_run)

    p = sub.add_parser("params", help="list a notebook's parameters")
    p.add_argument("notebook", help="path or prefix such as 02")
    p.set_defaults(func=_cmd_params)

    add_sweep_parser(sub, _cmd_sweep)

    st = sub.add_parser("strip-solutions", help="remove cells tagged 'solution' from notebooks")
    st.add_argument("paths", nargs="*", metavar="NOTEBOOK", help="notebooks to strip (default: every notebook in "
                    "notebooks/)")
    st.add_argument("--in-place", action="store_true",
                    help="overwrite the named notebooks (default: write student/<name> beside each notebook)")
    st.add_argument("--force", action="store_true", help="replace a student/<name> that differs from the stripped "
                    "notebook (default: keep it, exit 2)")
    st.set_defaults(func=_cmd_strip)

    e = sub.add_parser("export-html", help="static HTML edition of executed notebooks")
    e.add_argument("--profile", type=profile_name, metavar=PROFILE_METAVAR, default="quick",
                   help="export the run of this profile, runs/<profile> (default: quick)")
    e.add_argument("--input", help="directory of executed notebooks (default runs/<profile>)")
    e.add_argument("--output", help="output directory (default <input>/html)")
    e.set_defaults(func=_cmd_export)

    rp = sub.add_parser("report", help="REPORT.md and its CSV tables from a profile's result store",
                        description="reads runs/sweeps/<profile> (rows, and the cosine probes notebook 03 saved) "
                                    "and writes REPORT.md plus its CSV tables, with the paper's values beside "
                                    "ours and which of the paper's findings hold")
    rp.add_argument("--profile", type=profile_name, metavar=PROFILE_METAVAR,
                    help="the profile whose results are reported, runs/sweeps/<profile> (default: quick)")
    rp.add_argument("--store", help="result store directory (default runs/sweeps/<profile>)")
    rp.add_argument("--output", help="report directory (default runs/<profile>/report)")
    rp.add_argument("--readme", help="rewrite this README's results section from the tables")
    rp.add_argument("--from-tables", help="re-render REPORT.md (and --readme) from the CSV tables in this directory, "
                    "no store")
    rp.add_argument("--backbone", help="the run's backbone, when not the profile's")
    rp.add_argument("--depth", type=int, help="the run's depth L, when not the profile's")
    rp.add_argument("--budget", type=float, help="the run's budget b, when not the profile's")
    rp.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                    help="a setting of the run, when not the profile's (as midas-nb run -p), e.g. -p precision "
                         "bfloat16: the report reads only cells of these settings")
    rp.add_argument("--allow-mixed-settings", action="store_true",
                    help="write the report although the store holds rows of other settings (another -p, "
                         "precision, ...): they are left out and counted (default: refuse, exit 2)")
    rp.add_argument("--allow-incomplete", action="store_true",
                    help="write the report although cells the profile expects have no result (failed, pending, "
                         "unreadable); it is then marked INCOMPLETE and lists them (default: refuse, exit 1)")
    rp.set_defaults(func=_cmd_report)
    add_examples(ap, sub)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    split = check_split_values(argv)  # argparse would say "unrecognized arguments: 1]"
    if split:
        return _answer("run", split)
    args = build_parser().parse_args(argv)
    try:
        return int(args.func(args) or 0)
    except config.ProfileError as e:  # a bad setting no command checked first (a MIDAS_*_DIR that is a file)
        return _answer(args.command, e.problems)
    except KeyboardInterrupt:  # Ctrl-C: one line, no traceback; `run` keeps the last good notebooks
        return _answer(args.command, ["interrupted; finished notebooks, cached checkpoints and result-store cells "
                                      "are kept, and the next run resumes from them"], 130)

