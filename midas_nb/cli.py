"""``midas-nb`` command line: batch reruns of the notebooks and small utilities.

Subcommands::

    midas-nb run [--profile smoke|quick|paper] [--data-root PATH] [--dataset NAME]
                 [--backbone NAME] [--device DEV] [--notebooks 02,04] [-p NAME VALUE]...
                 [--output DIR]
    midas-nb params NOTEBOOK            # list a notebook's parameters
    midas-nb sweep status [NAME]        # cells done / failed / pending of a sweep
    midas-nb strip-solutions [PATHS]    # remove cells tagged "solution" (course edition)
    midas-nb export-html [--profile P]  # static HTML edition of a run's executed notebooks
"""
from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

import yaml

from . import config

__all__ = ["main", "notebook_paths", "run_notebooks"]


def notebooks_dir() -> Path:
    """``notebooks/`` of the project."""
    return config.project_root() / "notebooks"


def notebook_paths(selection: str | None = None) -> list[Path]:
    """The ordered notebooks (``00_*.ipynb`` ...), optionally only the comma-separated prefixes.

    Raises:
        ValueError: when a requested prefix matches no notebook.
    """
    paths = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    if not selection:
        return paths
    wanted = [s.strip() for s in selection.split(",") if s.strip()]
    out = []
    for w in wanted:
        hits = [p for p in paths if p.name.startswith(w) or p.stem == w]
        if not hits:
            raise ValueError(f"no notebook matches {w!r}; available: {[p.stem for p in paths]}")
        out.extend(h for h in hits if h not in out)
    return sorted(out)


def _parse_value(text: str) -> Any:
    """A ``-p NAME VALUE`` value: YAML scalars/lists (``0.25``, ``[0, 1]``, ``null``) or a string."""
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        return text


def run_notebooks(profile: str = "quick", *, data_root: str | None = None, dataset: str | None = None,
                  backbone: str | None = None, device: str | None = None, notebooks: str | None = None,
                  extra: dict[str, Any] | None = None, output: str | Path | None = None,
                  progress: bool = True) -> Path:
    """Execute the notebooks in order with papermill; returns the output directory.

    The data settings and the ``extra`` parameter names are checked before any kernel
    starts. Each notebook executes into ``<output>/.partial/`` and replaces
    ``<output>/<name>`` only when it succeeds, so an earlier good copy survives a failure.
    Stops at the first failure, naming the notebook and the failing cell; papermill's
    executed copy (with the error) is kept as ``<output>/failed/<name>``.

    Raises:
        RuntimeError: when a notebook fails (the message names notebook, cell, error and
            the failed copy).
        ValueError, FileNotFoundError: bad data settings (unknown dataset, missing data root,
            a dataset without embedded default and no data root) or a parameter name that
            none of the selected notebooks accepts.
    """
    import shutil

    import papermill as pm
    from papermill.exceptions import PapermillExecutionError

    from .study import check_data

    out_dir = Path(output) if output else config.runs_dir() / profile
    out_dir.mkdir(parents=True, exist_ok=True)
    params: dict[str, Any] = {"profile": profile}
    for k, v in dict(data_root=data_root, dataset=dataset, backbone=backbone, device=device).items():
        if v is not None:
            params[k] = str(Path(v).expanduser().resolve()) if k == "data_root" else v
    params.update(extra or {})
    paths = notebook_paths(notebooks)
    if not paths:
        raise RuntimeError(f"no notebooks found in {notebooks_dir()}")
    check_data(config.get_profile(profile, **{k: v for k, v in params.items() if k != "profile"}))
    accepted_by = {nb: set(pm.inspect_notebook(str(nb))) for nb in paths}
    known = set().union(*accepted_by.values())
    unknown = sorted(set(extra or {}) - known)
    if unknown:
        raise ValueError(f"unknown notebook parameter(s) {unknown}; the selected notebooks accept {sorted(known)}")
    env_profile = os.environ.get("MIDAS_PROFILE")
    os.environ["MIDAS_PROFILE"] = profile
    # batch runs have no widget front-end: the explorer draws its static figure
    os.environ.setdefault("MIDAS_HEADLESS", "1")
    # no tqdm residue in the executed notebooks (and their HTML edition); papermill's own bar
    # shows the progress of a batch run
    env_tqdm = os.environ.get("TQDM_DISABLE")
    os.environ.setdefault("TQDM_DISABLE", "1")
    t_all = time.time()
    try:
        for i, nb in enumerate(paths, 1):
            target = out_dir / nb.name
            print(f"[{i}/{len(paths)}] {nb.name} ...", flush=True)
            t0 = time.time()
            accepted = accepted_by[nb]
            partial = out_dir / ".partial" / nb.name
            partial.parent.mkdir(parents=True, exist_ok=True)
            try:
                pm.execute_notebook(str(nb), str(partial), parameters={k: v for k, v in params.items() if k in accepted},
                                    cwd=str(nb.parent), progress_bar=progress, kernel_name="python3")
            except PapermillExecutionError as e:
                failed = out_dir / "failed" / nb.name
                failed.parent.mkdir(parents=True, exist_ok=True)
                shutil.move(str(partial), str(failed))
                raise RuntimeError(
                    f"notebook {nb.name} failed in cell {e.exec_count} ({e.ename}: {e.evalue}); "
                    f"the executed copy with the error is {failed}") from None
            partial.replace(target)
            print(f"    done in {time.time() - t0:.0f} s -> {target}", flush=True)
    finally:
        for name, value in (("MIDAS_PROFILE", env_profile), ("TQDM_DISABLE", env_tqdm)):
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    print(f"\nAll {len(paths)} notebooks ran in {time.time() - t_all:.0f} s.")
    print(f"  executed notebooks: {out_dir}")
    print(f"  results tables:     {config.runs_dir() / 'tables'}")
    print(f"  figures:            {config.figures_dir()}")
    return out_dir


def _cmd_run(args: argparse.Namespace) -> int:
    extra = {name: _parse_value(value) for name, value in (args.param or [])}
    try:
        run_notebooks(args.profile, data_root=args.data_root, dataset=args.dataset, backbone=args.backbone,
                      device=args.device, notebooks=args.notebooks, extra=extra, output=args.output,
                      progress=not args.no_progress)
    except (RuntimeError, ValueError, FileNotFoundError) as e:
        print(f"midas-nb run: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_params(args: argparse.Namespace) -> int:
    import papermill as pm
    path = Path(args.notebook)
    if not path.is_file():
        try:
            path = notebook_paths(args.notebook)[0]
        except ValueError as e:
            print(f"midas-nb params: {e}", file=sys.stderr)
            return 1
    print(f"parameters of {path.name} (set with `midas-nb run -p NAME VALUE`; None = the profile's default)")
    for name, info in pm.inspect_notebook(str(path)).items():
        print(f"  {name:12s} default {info['default']:42s} {info['help']}")
    return 0


def _cmd_sweep(args: argparse.Namespace) -> int:
    from .sweeps import sweep_status_report
    try:
        print(sweep_status_report(args.name))
    except (FileNotFoundError, ValueError) as e:
        print(f"midas-nb sweep status: {e}", file=sys.stderr)
        return 1
    return 0


def _cmd_strip(args: argparse.Namespace) -> int:
    from .course import strip_solutions
    paths = [Path(p) for p in args.paths] or notebook_paths()
    for p in paths:
        n = strip_solutions(p, p if args.in_place else None)
        print(f"{p}: {n} solution cell(s) removed")
    return 0


def _cmd_export(args: argparse.Namespace) -> int:
    from .course import export_html
    index = export_html(Path(args.input) if args.input else config.runs_dir() / args.profile,
                        Path(args.output) if args.output else None)
    print(f"HTML edition: {index}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="midas-nb", description=__doc__.split("\n")[0])
    sub = ap.add_subparsers(dest="command", required=True)

    r = sub.add_parser("run", help="execute the notebooks in order with papermill")
    r.add_argument("--profile", choices=sorted(config.PROFILES), default="quick")
    r.add_argument("--data-root", default=None, help="dataset directory (default: embedded synthetic CUB-format set)")
    r.add_argument("--dataset", choices=["cub", "aircraft", "cars", "synthetic"], default=None)
    r.add_argument("--backbone", default=None, help="backbone name (default: the profile's)")
    r.add_argument("--device", default=None, help="cpu, cuda, cuda:1 ... (default: the profile's)")
    r.add_argument("--notebooks", default=None, help="comma-separated prefixes, e.g. 00,02")
    r.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="extra notebook parameter (YAML value), repeatable")
    r.add_argument("--output", default=None, help="directory for executed notebooks (default runs/<profile>)")
    r.add_argument("--no-progress", action="store_true")
    r.set_defaults(func=_cmd_run)

    p = sub.add_parser("params", help="list a notebook's parameters")
    p.add_argument("notebook", help="path or prefix such as 02")
    p.set_defaults(func=_cmd_params)

    s = sub.add_parser("sweep", help="sweep utilities",
                       description="status: cells done / failed / pending of the result stores under "
                                   "runs/sweeps (one store per profile), with the failures' errors")
    s.add_argument("action", choices=["status"], help="what to do (status)")
    s.add_argument("name", nargs="?", default=None,
                   help="store name = the profile that wrote it, e.g. quick (default: every store)")
    s.set_defaults(func=_cmd_sweep)

    st = sub.add_parser("strip-solutions", help="remove cells tagged 'solution' from notebooks")
    st.add_argument("paths", nargs="*")
    st.add_argument("--in-place", action="store_true", help="overwrite (default: write student/<name> beside each notebook)")
    st.set_defaults(func=_cmd_strip)

    e = sub.add_parser("export-html", help="static HTML edition of executed notebooks")
    e.add_argument("--profile", choices=sorted(config.PROFILES), default="quick")
    e.add_argument("--input", default=None, help="directory of executed notebooks (default runs/<profile>)")
    e.add_argument("--output", default=None, help="output directory (default <input>/html)")
    e.set_defaults(func=_cmd_export)
    return ap


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return int(args.func(args) or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
