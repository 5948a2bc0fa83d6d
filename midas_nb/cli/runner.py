"""``midas-nb run``: the notebooks executed in order with papermill, every setting checked first
(:mod:`midas_nb.cli.runspec`), each into ``<output>/.partial/<run_id>/`` so that papermill's metadata names
its run (read back by :mod:`midas_nb.runs`), and papermill's own log condensed into one status line per
notebook (docs/decisions/0023-batch-run-progress.md, 0076-thin-runner.md, 0088-no-run-manifest.md).
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Sequence, TYPE_CHECKING

from .. import config
from ..progress import ANSI, finished_step, PROGRESS_ENV, PROGRESS_LINE
from ..runs import run_summary, scoped_environ

if TYPE_CHECKING:
    from .runspec import RunSpec

__all__ = ["StatusLine", "execute_notebook", "kernel_arguments", "notebook_paths", "notebooks_dir",
           "report_command", "run_datasets", "run_notebooks"]


def notebooks_dir() -> Path:
    """``notebooks/`` of the project."""
    return config.project_root() / "notebooks"


def is_source_dir(path: str | os.PathLike) -> bool:
    """``path`` is the project's ``notebooks/`` (the source notebooks)."""
    return Path(path).expanduser().resolve() == notebooks_dir().resolve()


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
    if not isinstance(selection, str):
        raise ValueError(f"expected comma-separated prefixes such as '00,02', got {selection!r} "
                         f"({type(selection).__name__})")
    words, available = [s.strip() for s in selection.split(",")], [p.stem for p in paths]
    # a one-digit word would match every notebook of that decade: never a prefix
    hits = {w: [p for p in paths if p.name.startswith(w) and not re.fullmatch(r"\d", w)] for w in words if w}
    if not hits or "" in words:
        raise ValueError(f"{selection!r} names no notebook; expected comma-separated prefixes such as 00,02 "
                         f"(available: {available})" if not hits else f"{selection!r} has an empty entry; expected "
                         "comma-separated prefixes such as 00,02")
    missing = [repr(w) + (f" (prefixes have two digits: '0{w}')" if re.fullmatch(r"\d", w) and
                          any(p.name.startswith(f"0{w}") for p in paths) else "") for w, h in hits.items() if not h]
    if missing:
        raise ValueError(f"no notebook matches {', '.join(missing)}; available: {available}")
    return sorted({p for h in hits.values() for p in h})


def run_notebooks(profile: str = "quick", *, notebooks: str | None = None, extra: dict[str, Any] | None = None,
                  output: str | Path | None = None, cell_timeout: float | None = None, progress: bool = True,
                  spec: RunSpec | None = None, problems: Sequence[str] = ()) -> Path:
    """Execute the notebooks in order, the run description (``spec``, else the arguments; ``extra``:
    ``-p`` parameters) checked first; returns the output directory. Several named data roots and no
    ``--dataset``: once per dataset, then the report over them. Stops at the first failure (its copy
    under ``<output>/failed/``). ``problems``: found already, listed with the others.

    Raises:
        midas_nb.config.ProfileError: the run cannot start; one line per problem.
        RuntimeError: a notebook failed, its kernel died or a cell timed out.
    """
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
    """The datasets a run executes the notebooks on, one after another: those ``data_roots`` names,
    in :data:`midas_nb.config.PAPER_DATASETS` order, when several and neither ``spec.dataset`` nor
    a ``datasets`` grid is set; else ``[None]`` (the profile's own dataset)."""
    named = [d for d in config.PAPER_DATASETS if d in (spec.data_roots if isinstance(spec.data_roots, dict) else {})]
    if spec.dataset is not None or len(named) < 2 or config.PROFILES.get(spec.profile, {}).get("datasets") \
            or "datasets" in spec.params:
        return [None]
    return named


def checked(spec: RunSpec, subs: Sequence[RunSpec], problems: Sequence[str]) -> tuple[list[Path], dict]:
    """``(notebooks, {notebook: parameters it accepts})`` once each run of ``subs`` (one per dataset)
    passes :func:`midas_nb.cli.runspec.preflight`; a problem of several runs is said once, the others
    prefixed with their dataset. Raises :class:`midas_nb.config.ProfileError` with every problem (a
    selection of no notebook: at once, with ``problems``, the others are not checked)."""
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
    each = [(sub.dataset, runspec.preflight(sub, paths, set().union(*accepted_by.values()))) for sub in subs]
    common = set.intersection(*(set(lines) for _, lines in each))
    out = spec.output  # --output naming the source notebooks' folder would replace them with executed copies
    source = [f"--output {str(out)!r}: is the folder of the source notebooks ({notebooks_dir()}); the executed "
              f"copies would replace them; expected another directory (default runs/<profile>)"] \
        if isinstance(out, (str, os.PathLike)) and str(out).strip() and is_source_dir(out) else []
    found = [*problems, *source, *(p if p in common else f"{ds}: {p}" for ds, lines in each for p in lines)]
    if found:
        raise config.ProfileError(list(dict.fromkeys(found)))   # a problem two checks meet is said once
    return paths, accepted_by


def run_each_dataset(spec: RunSpec, datasets: Sequence[str], *, progress: bool, problems: Sequence[str]) -> Path:
    """:func:`run_notebooks` once per dataset into ``<output>/<dataset>/`` (figures into
    ``figures/<profile>/<dataset>/``), every run checked first; then the report over the datasets
    (``<output>/report``) and the paper-shaped table."""
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
    """The run once ``spec`` passed :func:`checked`: execute ``paths`` (each into
    ``.partial/<run_id>/``, then beside the others; a failure into ``failed/``), print the run summary
    and where its outputs are (and the paper-shaped table after a multi-dataset readout)."""
    from ..study import grid_spans

    out_dir = Path(spec.output) if spec.output else config.runs_dir() / spec.profile
    out_dir.mkdir(parents=True, exist_ok=True)
    params, t_all = spec.notebook_parameters(), time.time()
    run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]   # unique, sorts by start
    # batch runs have no widget front-end (the explorer draws its static figure) and leave no tqdm
    # residue in the executed notebooks (the status line shows the progress)
    env = dict(MIDAS_PROFILE=spec.profile, MIDAS_HEADLESS=os.environ.get("MIDAS_HEADLESS", "1"),
               TQDM_DISABLE=os.environ.get("TQDM_DISABLE", "1"))
    try:
        with scoped_environ(**env):
            for i, nb in enumerate(paths, 1):
                failed = _execute(nb, f"[{i}/{len(paths)}]", out_dir / ".partial" / run_id, out_dir,
                                  {k: v for k, v in params.items() if k in accepted_by[nb]}, spec, progress)
                if failed:
                    raise RuntimeError(failed[2])
    finally:
        for where in (out_dir / ".partial" / run_id, out_dir / ".partial"):
            with contextlib.suppress(OSError):
                where.rmdir()         # where empty: it holds only notebooks still running
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
        save_table(table, f"paper_table_{spec.profile}", config.runs_dir() / "tables")
        print(f"\nThe paper-shaped table (L={settings['depth']}, b={settings['budget']:g}; "
              f"saved as {config.runs_dir() / 'tables' / f'paper_table_{spec.profile}.csv'}):\n"
              f"{format_paper_table(table)}")
    return out_dir


def report_command(spec: RunSpec) -> str:
    """The ``midas-nb report`` command over this run's result store, with its overridden point and backbone,
    preceded by the run's ``MIDAS_CACHE_DIR`` / ``MIDAS_RUNS_DIR`` where set (the report reads the checkpoints'
    top-1 from the one, the result store from the other)."""
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
             progress: bool) -> tuple[str, str, str] | None:
    """Execute ``nb`` into ``partial_dir`` (each run has its own), then move it to ``<out_dir>/<name>``;
    on failure keep the executed copy under ``failed/``; returns ``None``, or ``(name, what happened,
    the line naming the copy)``."""
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
            return nb.name, what, f"notebook {nb.name} {what}; the executed copy with the error is {failed}"
        what = (f"a cell ran longer than the cell timeout ({spec.cell_timeout} s) and was stopped ({name}: {first})"
                if "Timeout" in name else f"the kernel died ({name}: {e}); out of memory, a crash in native code or a "
                "killed process are the usual causes" if "DeadKernel" in name else f"the kernel stopped ({name}: {e})")
        # the executed copy papermill left (or the source) with a first cell saying why it did not finish
        copy = nbformat.read(str(partial if partial.is_file() else nb), as_version=4)
        copy.cells.insert(0, nbformat.v4.new_markdown_cell(f"**midas-nb run: this notebook did not finish.** {what}",
                                                           metadata={"tags": ["midas-run-failure"]}))
        nbformat.write(copy, str(failed))
        partial.unlink(missing_ok=True)
        return nb.name, what, f"notebook {nb.name}: {what}; the executed copy is {failed}"
    partial.replace(out_dir / nb.name)
    print(f"    done in {time.time() - t0:.0f} s -> {out_dir / nb.name}", flush=True)
    return None


# ---------------------------------------------------------------- the status line
# a running cell's one-time notice (s); non-terminal output: a line at most every HEARTBEAT_S, at least every
# MIN_GAP_S apart when it changed; after QUIET_S without output the line says so; at most _WIDTH characters
LONG_CELL_S, HEARTBEAT_S, MIN_GAP_S, QUIET_S, _WIDTH = 60.0, 15.0, 3.0, 15.0, 160
_CELL_RE = re.compile(r"^(Executing|Ending) Cell (\d+)-*\s*$")


def kernel_arguments() -> list[str]:
    """The kernel's extra arguments: ``--config`` of ``midas_nb/kernel/batch_config.py`` (a file of
    the package: nothing is written, so a killed run leaves nothing behind)."""
    return [f"--config={Path(__file__).parents[1] / 'kernel' / 'batch_config.py'}"]


def _minutes(seconds: float) -> str:
    """``42 s``, ``3 min 20 s``, ``12 min`` (seconds dropped from 10 minutes on)."""
    s = int(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s < 600 else f"{s // 60} min"


def _last_line(text: str) -> str:
    """The last non-empty line of ``text`` (after a carriage return: the latest), no control sequences."""
    lines = [ln.rstrip("\r").split("\r")[-1].strip() for ln in ANSI.sub("", text).replace("\r\n", "\n").split("\n")]
    return re.sub(r"\s+", " ", next((ln for ln in reversed(lines) if ln), ""))


class StatusLine(logging.Handler):
    """One notebook's progress from papermill's log (``log_output``: ``Executing Cell N`` and the
    cells' output): ``[00_quickstart] cell 5/27, 3 min: <latest output>``; a progress line at its
    total reads ``after <step> (...)``, and output older than :data:`QUIET_S` s says for how long the
    cell has printed nothing. :meth:`tick` (every second) writes it in place on a terminal, else when
    it changed (every :data:`MIN_GAP_S` s at most) and every :data:`HEARTBEAT_S` s; a cell running
    :data:`LONG_CELL_S` s gets a notice. ``sources``: first code line by 1-based cell index.
    """

    def __init__(self, label: str, total: int, sources: dict[int, str] | None = None, *, stream: Any = None,
                 tty: bool | None = None, clock: Any = time.monotonic):
        super().__init__(logging.INFO)
        self.label, self.total, self.sources, self.clock = label, total, dict(sources or {}), clock
        self.stream = stream if stream is not None else sys.stdout
        self.tty = bool(getattr(self.stream, "isatty", lambda: False)()) if tty is None else tty
        self.t0 = self.cell_t0 = clock()
        self.cell, self.detail, self.noticed = 0, "starting the kernel", set()
        self.output_t: float | None = None  # when the cell's latest output line came (None: none yet)
        self._shown, self._shown_at, self._lock = "", -1e9, threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        text = str(record.msg)   # papermill logs the cells' output as it is (no %-arguments)
        m = _CELL_RE.match(text.strip())
        with self._lock:
            if m and m.group(1) == "Executing":
                self.cell, self.cell_t0, self.output_t = int(m.group(2)), self.clock(), None
                self.detail = " ".join(["running", self.sources.get(self.cell, "")]).strip()
            elif m is None and self.cell and (line := _last_line(text)):
                self.detail, self.output_t = line, self.clock()

    def render(self) -> str:
        """The status line now (class docstring)."""
        with self._lock:
            now, where = self.clock(), f" cell {self.cell}/{max(self.total, self.cell)}," if self.cell else ""
            quiet = now - self.output_t if self.output_t is not None else 0.0
            done = finished_step(self.detail) if self.output_t is not None else None
            line = (f"[{self.label}]{where} {_minutes(now - (self.cell_t0 if self.cell else self.t0))}"
                    f"{f' (no output for {_minutes(quiet)})' if quiet >= QUIET_S else ''}: "
                    f"{self.detail if done is None else f'after {done}'}")
        return line if len(line) <= _WIDTH else line[:_WIDTH - 1] + "…"

    def tick(self, final: bool = False) -> None:
        """Write the status line (and a long-cell notice) if it is due (class docstring); ``final``:
        clear the in-place line on a terminal, else write the last status if not written yet."""
        now, clear = self.clock(), "\r\033[K" if self.tty else ""
        if not final and self.cell and self.cell not in self.noticed and now - self.cell_t0 >= LONG_CELL_S:
            self.noticed.add(self.cell)
            self._write(f"{clear}    [{self.label}] cell {self.cell} has run {_minutes(now - self.cell_t0)}: a first "
                        "run trains and caches backbones and scorers, which takes minutes; Ctrl-C stops, and the "
                        "next run resumes from the caches\n")
        if self.tty:
            return self._write(clear + ("" if final else self.render()))
        key, gap = f"{self.cell}|{self.detail}", now - self._shown_at   # the same status later is no change
        if (key != self._shown and (final or gap >= MIN_GAP_S)) or (not final and gap >= HEARTBEAT_S):
            self._shown, self._shown_at = key, now
            self._write(self.render() + "\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def drop_progress_outputs(nb: Any) -> int:
    """Remove :data:`midas_nb.progress.PROGRESS_LINE` lines (shown live) from the stderr outputs of
    ``nb``, in place (an output left blank goes); returns how many were dropped."""
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
    """``papermill.execute_notebook`` with :func:`kernel_arguments`; with ``progress_bar``, a
    :class:`StatusLine` fed by papermill's log and ``MIDAS_PROGRESS=lines`` instead of papermill's
    bar (the progress lines left out of the executed copy). Returns the notebook."""
    import nbformat
    import papermill as pm  # heavy; imported only when a batch run starts

    from ..identity import atomic_write_text

    kwargs.update(parameters=parameters, progress_bar=False, extra_arguments=kernel_arguments())
    if not progress_bar:
        return pm.execute_notebook(str(input_path), str(output_path), **kwargs)
    # the cells as papermill runs them (its parameters cell after the tagged one): their number, first code lines
    cells = nbformat.read(str(input_path), as_version=4).cells
    tagged = [i for i, c in enumerate(cells) if "parameters" in c.get("metadata", {}).get("tags", [])]
    if parameters and tagged:
        cells.insert(tagged[0] + 1, nbformat.v4.new_code_cell("# Parameters"))
    code = {i: [ln.strip() for ln in c.source.splitlines() if ln.strip() and not ln.strip().startswith("#")]
            for i, c in enumerate(cells, 1) if c.cell_type == "code"}
    status = StatusLine(Path(input_path).stem, len(cells), {i: lines[0][:60] for i, lines in code.items() if lines})
    log, stop = logging.getLogger("papermill"), threading.Event()
    saved = (log.level, log.propagate)
    log.addHandler(status)
    log.setLevel(logging.INFO)
    log.propagate = False  # the output goes into the status line only, not to the root logger
    ticker = threading.Thread(target=lambda: [status.tick() for _ in iter(lambda: stop.wait(1.0), True)],
                              daemon=True, name="midas-nb status")
    ticker.start()
    try:
        with scoped_environ(**{PROGRESS_ENV: "lines"}):
            nb = pm.execute_notebook(str(input_path), str(output_path), log_output=True, **kwargs)
        if drop_progress_outputs(nb):       # shown live; the executed copy keeps the cells' own output
            atomic_write_text(Path(output_path), nbformat.writes(nb))
        return nb
    finally:
        stop.set()
        ticker.join(timeout=5)
        status.tick(final=True)
        log.removeHandler(status)
        log.setLevel(saved[0])
        log.propagate = saved[1]
