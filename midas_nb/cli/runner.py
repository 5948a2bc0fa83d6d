"""``midas-nb run``: the notebooks executed in order with papermill once every setting is checked, each into
``<output>/.partial/<run_id>/`` so that papermill's metadata names its run (read back by :mod:`midas_nb.runs`)
(docs/decisions/0023-batch-run-progress.md, 0076-thin-runner.md, 0087-no-run-manifest.md)."""
from __future__ import annotations

import contextlib
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Sequence, TYPE_CHECKING

from .. import config
from ..point import show_value
from ..progress import LineWriter, PROGRESS_ENV, PROGRESS_LINE
from ..runs import run_summary, scoped_environ

if TYPE_CHECKING:
    from .runspec import RunSpec

__all__ = ["execute_notebook", "kernel_arguments", "notebook_paths", "notebooks_dir", "report_command",
           "run_datasets", "run_notebooks"]


def notebooks_dir() -> Path:
    return config.project_root() / "notebooks"


def is_source_dir(path: str | os.PathLike) -> bool:
    return Path(path).expanduser().resolve() == notebooks_dir().resolve()


def notebook_paths(selection: str | Sequence[str] | None = None) -> list[Path]:
    """The ordered notebooks, or those ``selection`` names (``"00,02"`` or a list); ``ValueError`` if it names none."""
    paths = sorted(notebooks_dir().glob("[0-9][0-9]_*.ipynb"))
    if selection is None:
        return paths
    if isinstance(selection, (list, tuple)) and all(isinstance(x, str) for x in selection):
        selection = ",".join(selection)
    if not isinstance(selection, str):
        raise ValueError(f"expected comma-separated prefixes such as '00,02', got {show_value(selection)}")
    words, available = [s.strip() for s in selection.split(",")], [p.stem for p in paths]
    # a one-digit word would match every notebook of that decade: never a prefix
    hits = {w: [p for p in paths if p.name.startswith(w) and len(w) > 1] for w in words if w}
    if not hits or "" in words:
        raise ValueError(f"{selection!r} names no notebook; expected comma-separated prefixes such as 00,02 "
                         f"(available: {available})" if not hits else f"{selection!r} has an empty entry; expected "
                         "comma-separated prefixes such as 00,02")
    if missing := [repr(w) + (f" (prefixes have two digits: '0{w}')" if len(w) == 1 and any(
            p.name.startswith(f"0{w}") for p in paths) else "") for w, h in hits.items() if not h]:
        raise ValueError(f"no notebook matches {', '.join(missing)}; available: {available}")
    return sorted({p for h in hits.values() for p in h})


def run_notebooks(profile: str = "quick", *, notebooks: str | None = None, extra: dict[str, Any] | None = None,
                  output: str | Path | None = None, cell_timeout: float | None = None, progress: bool = True,
                  spec: RunSpec | None = None, problems: Sequence[str] = ()) -> Path:
    """Execute the notebooks once ``spec`` (else the arguments; ``extra``: ``-p``) and ``problems`` found are checked,
    per dataset where several roots are named; returns the output dir; raises ProfileError, RuntimeError (failed)."""
    from .runspec import fold_structured_params, RunSpec

    if spec is None:
        spec = RunSpec.model_construct(profile=profile, params=dict(extra or {}), notebooks=notebooks,
                                       output=None if output is None else str(output), cell_timeout=cell_timeout)
    fold_structured_params(spec)
    if len(datasets := run_datasets(spec)) > 1:
        return run_each_dataset(spec, datasets, progress=progress, problems=problems)
    out_dir = run_checked(spec, *checked(spec, [spec], problems), progress=progress)
    print(f"  report:             {report_command(spec)}  (REPORT.md from the result store)")
    return out_dir


def run_datasets(spec: RunSpec) -> list[str | None]:
    """The datasets ``data_roots`` names when several, no ``dataset`` or ``datasets`` grid set, else ``[None]``."""
    named = [d for d in config.PAPER_DATASETS if d in (spec.data_roots if isinstance(spec.data_roots, dict) else {})]
    grid = config.PROFILES.get(spec.profile, {}).get("datasets") or "datasets" in spec.params
    return [None] if spec.dataset is not None or len(named) < 2 or grid else named


def checked(spec: RunSpec, subs: Sequence[RunSpec], problems: Sequence[str]) -> tuple[list[Path], dict]:
    """``(notebooks, {notebook: parameters it accepts})`` once each run of ``subs`` passes :func:`runspec.preflight`,
    else :class:`midas_nb.config.ProfileError` with every problem (one of only some datasets' runs prefixed by it)."""
    try:
        paths = notebook_paths(spec.notebooks)
    except ValueError as e:
        raise config.ProfileError([*problems, f"--notebooks: {e} (the other settings are checked once it names one)"]) \
            from None
    if not paths:
        raise RuntimeError(f"no notebooks found in {notebooks_dir()}")
    import papermill as pm  # heavy; imported only when a batch run starts

    from . import runspec

    accepted_by = {nb: set(pm.inspect_notebook(str(nb))) for nb in paths}
    accepted = set().union(*accepted_by.values())   # each problem names a data root as typed
    each = [(sub.dataset, [runspec.as_typed(sub, p) for p in runspec.preflight(sub, paths, accepted)]) for sub in subs]
    common = set.intersection(*(set(lines) for _, lines in each))
    out = spec.output  # --output naming the source notebooks' folder would replace them with executed copies
    source = [f"--output {str(out)!r}: is the folder of the source notebooks ({notebooks_dir()}); the executed "
              f"copies would replace them; expected another directory (default runs/<profile>)"] \
        if isinstance(out, (str, os.PathLike)) and str(out).strip() and is_source_dir(out) else []
    if found := [*problems, *source, *(p if p in common else f"{ds}: {p}" for ds, lines in each for p in lines)]:
        raise config.ProfileError(list(dict.fromkeys(found)))   # a problem two checks meet is said once
    return paths, accepted_by


def run_each_dataset(spec: RunSpec, datasets: Sequence[str], *, progress: bool, problems: Sequence[str]) -> Path:
    """:func:`run_notebooks` once per dataset into ``<output>/<dataset>/`` (figures in
    ``figures/<profile>/<dataset>/``), every run checked first; then the report over them (``<output>/report``)."""
    out_dir = Path(spec.output) if spec.output else config.runs_dir() / spec.profile
    # each dataset's run keeps only its own root: the others are for the other runs, not unused
    subs = [spec.model_copy(update=dict(dataset=d, data_roots={d: spec.data_roots[d]}, output=str(out_dir / d)))
            for d in datasets]
    paths, accepted_by = checked(spec, subs, problems)   # every dataset's run, once, before any kernel
    from ..report import make_report
    from ..report.markdown import datasets_summary
    from ..study import protocol_settings

    t_all, figures = time.time(), config.figures_dir(spec.profile)
    for i, sub in enumerate(subs, 1):
        print(f"\n=== dataset {i}/{len(subs)}: {sub.dataset} ===", flush=True)
        # each dataset's figures and tables in their own folder: the next dataset would overwrite them
        with scoped_environ(MIDAS_FIGURES_DIR=str(figures / str(sub.dataset))):
            run_checked(sub, paths, accepted_by, progress=progress)
    print(f"\nThe {len(subs)} datasets ran in {time.time() - t_all:.0f} s.")
    prof = spec.settings()
    overrides = {k: prof[k] for k in ("backbone", "depth", "budget", *protocol_settings(prof))   # this run's settings
                 if k in prof and (k in spec.params or k == "backbone")}
    report = make_report(spec.profile, output=out_dir / "report", overrides=overrides, allow_incomplete=True,
                         allow_mixed_settings=True)
    print(f"  report over {', '.join(datasets)}: {report}\n\n{datasets_summary(report.parent)}")
    return out_dir


def run_checked(spec: RunSpec, paths: Sequence[Path], accepted_by: dict, *, progress: bool) -> Path:
    """Execute ``paths`` of the checked ``spec``; print the summary, the outputs' places, a scale run's paper table."""
    from ..study import grid_spans

    out_dir = Path(spec.output) if spec.output else config.runs_dir() / spec.profile
    out_dir.mkdir(parents=True, exist_ok=True)
    params, t_all = spec.notebook_parameters(), time.time()
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]   # unique, sorts by start
    # no widget front-end in a batch run, no tqdm residue in the executed copies (the loops stream as lines)
    env = dict(MIDAS_PROFILE=spec.profile, MIDAS_HEADLESS=os.environ.get("MIDAS_HEADLESS", "1"),
               TQDM_DISABLE=os.environ.get("TQDM_DISABLE", "1"))
    try:
        with scoped_environ(**env):
            for i, nb in enumerate(paths, 1):
                _execute(nb, f"[{i}/{len(paths)}]", out_dir / ".partial" / run_id, out_dir,
                         {k: v for k, v in params.items() if k in accepted_by[nb]}, spec, progress)
    finally:
        shutil.rmtree(out_dir / ".partial" / run_id, ignore_errors=True)   # its own: a stopped notebook's half copy
        with contextlib.suppress(OSError):
            (out_dir / ".partial").rmdir()   # where empty: other runs' folders hold their notebooks still running
        print("\n" + run_summary(out_dir), flush=True)
    which = "The notebook" if len(paths) == 1 else f"All {len(paths)} notebooks"
    print(f"\n{which} ran in {time.time() - t_all:.0f} s (run {run_id}).\n  executed notebooks: {out_dir}\n"
          f"  results tables:     {config.runs_dir() / 'tables'}\n"
          f"  figures:            {config.figures_dir(spec.profile)}")
    # after a run of the scale readout (05) over several datasets: the paper-shaped table, printed and saved
    settings = spec.settings() if any(p.name[:2] == config.SWEEPS["scale"] for p in paths) else None
    if settings is not None and len(grid_spans(settings, "scale")[0]) > 1:
        from ..report.build import format_paper_table, paper_table_for
        from ..results import save_table

        table = paper_table_for(settings)
        csv = save_table(table, f"paper_table_{spec.profile}", config.runs_dir() / "tables")
        print(f"\nThe paper-shaped table (L={settings['depth']}, b={settings['budget']:g}; saved as {csv}):\n"
              f"{format_paper_table(table)}")
    return out_dir


def report_command(spec: RunSpec) -> str:
    """``midas-nb report`` over this run's store and settings (``MIDAS_CACHE_DIR`` / ``MIDAS_RUNS_DIR`` where set)."""
    import shlex

    from ..study import protocol_settings

    given = spec.notebook_parameters()   # --backbone and -p alike
    flags = "".join(f" --{k} {given[k]}" for k in ("backbone", "depth", "budget") if given.get(k) is not None)
    flags += "".join(f" -p {k} {given[k]}" for k in protocol_settings(given) if k in given)   # e.g. precision
    env = "".join(f"{k}={shlex.quote(os.environ[k])} " for k in ("MIDAS_CACHE_DIR", "MIDAS_RUNS_DIR")
                  if os.environ.get(k))
    # a selection of notebooks leaves the others' cells without a result: the report would refuse
    return f"{env}midas-nb report --profile {spec.profile}{flags}" + (" --allow-incomplete" if spec.notebooks else "")


def _execute(nb: Path, counter: str, partial_dir: Path, out_dir: Path, params: dict[str, Any], spec: RunSpec,
             progress: bool) -> None:
    """Execute ``nb`` via ``partial_dir`` into ``out_dir``; a failed copy goes to ``failed/`` (``RuntimeError``)."""
    import nbformat
    from papermill.exceptions import PapermillExecutionError  # heavy; imported only when a batch run starts

    print(f"{counter} {nb.name} ...", flush=True)
    t0, partial, failed = time.time(), partial_dir / nb.name, out_dir / "failed" / nb.name
    partial.parent.mkdir(parents=True, exist_ok=True)
    try:
        execute_notebook(nb, partial, parameters=params, cwd=str(nb.parent), progress_bar=progress,
                         kernel_name="python3", execution_timeout=spec.cell_timeout)
    except Exception as e:  # noqa: BLE001 - a failed cell, a dead kernel, a cell timeout, a kernel that never started
        name, first = type(e).__name__, (str(e).splitlines() or [""])[0]
        failed.parent.mkdir(parents=True, exist_ok=True)
        if isinstance(e, PapermillExecutionError):   # papermill's copy holds the error
            shutil.move(str(partial), str(failed))
            what = f"failed in cell {e.exec_count} ({e.ename}: {e.evalue})"
            raise RuntimeError(f"notebook {nb.name} {what}; the executed copy with the error is {failed}") from None
        what = (f"a cell ran longer than the cell timeout ({spec.cell_timeout} s) and was stopped ({name}: {first})"
                if "Timeout" in name else f"the kernel died ({name}: {e}); out of memory, a crash in native code or a "
                "killed process are the usual causes" if "DeadKernel" in name else f"the kernel stopped ({name}: {e})")
        # the executed copy papermill left (or the source) with a first cell saying why it did not finish
        copy = nbformat.read(str(partial if partial.is_file() else nb), as_version=4)
        copy.cells.insert(0, nbformat.v4.new_markdown_cell(f"**midas-nb run: this notebook did not finish.** {what}",
                                                           metadata={"tags": ["midas-run-failure"]}))
        nbformat.write(copy, str(failed))
        partial.unlink(missing_ok=True)
        raise RuntimeError(f"notebook {nb.name}: {what}; the executed copy is {failed}") from None
    partial.replace(out_dir / nb.name)
    print(f"    done in {time.time() - t0:.0f} s -> {out_dir / nb.name}", flush=True)


# ---------------------------------------------------------------- progress: papermill's cell bar, the cells' output
def kernel_arguments() -> list[str]:
    """The kernel's ``--config``: ``midas_nb/kernel/batch_config.py`` (a package file: nothing is written)."""
    return [f"--config={Path(__file__).parents[1] / 'kernel' / 'batch_config.py'}"]


def drop_progress_outputs(nb: Any) -> int:
    """Remove :data:`midas_nb.progress.PROGRESS_LINE` lines from ``nb``'s stderr outputs in place; how many went."""
    dropped = 0
    for cell in nb.cells:
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                lines = str(out.get("text", "")).splitlines(keepends=True)
                out["text"] = "".join(ln for ln in lines if not PROGRESS_LINE.match(ln.strip()))
                dropped += len(lines) - len(out["text"].splitlines())
        if "outputs" in cell:
            cell["outputs"] = [o for o in cell["outputs"] if o.get("name") != "stderr" or str(o.get("text")).strip()]
    return dropped


def execute_notebook(input_path: str | os.PathLike, output_path: str | os.PathLike, *,
                     parameters: dict[str, Any] | None = None, progress_bar: bool = True, **kwargs: Any) -> Any:
    """``papermill.execute_notebook`` with :func:`kernel_arguments`; ``progress_bar``: its cell bar as lines, the cells'
    output streamed, the library's loops as ``MIDAS_PROGRESS=lines`` (not kept in the copy). Returns the notebook."""
    import nbformat
    import papermill as pm  # heavy; imported only when a batch run starts

    from ..identity import atomic_write_text

    kwargs.update(parameters=parameters, extra_arguments=kernel_arguments())
    if not progress_bar:
        return pm.execute_notebook(str(input_path), str(output_path), progress_bar=False, **kwargs)
    # whole lines (none joins a streamed line); disable=False: the run's TQDM_DISABLE is for the kernels' bars
    bar = dict(desc=Path(input_path).stem, file=LineWriter(sys.stderr), disable=False, ascii=True)
    with scoped_environ(**{PROGRESS_ENV: "lines"}):
        nb = pm.execute_notebook(str(input_path), str(output_path), progress_bar=bar, stdout_file=sys.stdout,
                                 stderr_file=sys.stderr, **kwargs)
    if drop_progress_outputs(nb):       # shown live; the executed copy keeps the cells' own output
        atomic_write_text(Path(output_path), nbformat.writes(nb))
    return nb
