"""The run manifest of ``midas-nb run`` (``<output>/run.json``: the runs, and which executed copies
are stale; docs/decisions/0032-run-manifest.md) and the streamed progress of its notebooks
(:func:`execute_notebook`; docs/decisions/0023-batch-run-progress.md).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import sys
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator, Literal, NamedTuple
from unittest import mock

from .identity import atomic_write_text, file_lock
from .progress import finished_step, PROGRESS_ENV

__all__ = ["MANIFEST_NAME", "RunManifest", "NotebookState", "StatusLine", "execute_notebook", "kernel_arguments",
           "notebook_states", "run_summary", "scoped_environ", "settings_digest"]

MANIFEST_NAME = "run.json"
_FORMAT = "midas_nb.run_manifest/2"
_GLOB = "[0-9][0-9]_*.ipynb"


def scoped_environ(**values: str) -> Any:
    """A context manager: ``os.environ`` with ``values`` set inside the block, restored after it."""
    return mock.patch.dict(os.environ, values)


def settings_digest(settings: dict[str, Any]) -> str:
    """12-hex-digit digest of a run's injected parameters (key order does not matter)."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


class RunManifest:
    """``<out_dir>/run.json``: ``latest`` (a run id) and ``runs`` by id, each with its ``started`` and
    ``finished`` times, ``status``, injected ``settings`` and their ``digest``, the ``selected``
    notebooks and ``failed`` (``{notebook: why}``). Each executed copy names its run in
    ``metadata.midas_nb.run_id``."""

    def __init__(self, out_dir: str | os.PathLike):
        self.path = Path(out_dir) / MANIFEST_NAME
        self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):  # ValueError: not JSON, not UTF-8
            data = None
        self.exists = isinstance(data, dict) and data.get("format") == _FORMAT
        self.data: dict[str, Any] = data if self.exists else {"format": _FORMAT, "runs": {}, "latest": None}

    @contextlib.contextmanager
    def _update(self) -> Iterator[dict[str, Any]]:
        """``run.json`` read afresh and written back under its lock (``.run.json.lock``), so that two
        runs into one folder lose no update of each other's."""
        with file_lock(self.path.with_name(f".{MANIFEST_NAME}.lock")):
            self._read()
            yield self.data
            atomic_write_text(self.path, json.dumps(self.data, indent=1, default=str))

    def start(self, settings: dict[str, Any], selected: list[str]) -> str:
        """Record the start of a run with its injected ``settings`` and notebook names; returns its
        id, unique and sortable: ``YYYYmmdd-HHMMSS-<6 hex>``."""
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        with self._update() as data:
            data["runs"][run_id] = dict(run_id=run_id, started=time.time(), finished=None, status="running",
                                        settings=settings, digest=settings_digest(settings),
                                        selected=list(selected), failed={})
            data["latest"] = run_id
        return run_id

    def record_failure(self, run_id: str, name: str, why: str) -> None:
        """Record that notebook ``name`` stopped run ``run_id`` and ``why``."""
        with self._update() as data:
            data["runs"][run_id]["failed"][name] = why

    def finish(self, run_id: str, completed: bool) -> None:
        """Record the end of run ``run_id``: ``done``, else ``failed`` (a notebook failed) or ``interrupted``."""
        with self._update() as data:
            run = data["runs"][run_id]
            status = "done" if completed else "failed" if run["failed"] else "interrupted"
            run.update(finished=time.time(), status=status)

    @property
    def latest(self) -> dict[str, Any] | None:
        return self.data["runs"].get(self.data.get("latest"))


class NotebookState(NamedTuple):
    """An executed notebook's ``state`` (:func:`notebook_states`), the run that produced it and
    why it is ``stale``."""

    name: str
    state: Literal["current", "stale", "unrecorded"]
    run_id: str | None
    reason: str = ""


def _copy_run_id(path: Path) -> str | None:
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, ValueError):
        return None
    return (meta.get("midas_nb") or {}).get("run_id")


def _when(run: dict[str, Any] | None) -> str:
    t = (run or {}).get("started")
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:4]) + (" …" if len(keys) > 4 else "")


def _last_attempts(man: RunManifest) -> dict[str, dict[str, Any]]:
    """``{notebook: the latest run that selected it}``."""
    return {name: run for run in man.data["runs"].values() for name in run.get("selected", [])}


def notebook_states(out_dir: str | os.PathLike) -> list[NotebookState]:
    """The state of every executed ``NN_*.ipynb`` in ``out_dir``, in name order: ``current``,
    ``stale`` (when: docs/decisions/0032-run-manifest.md) or ``unrecorded`` (no manifest)."""
    out_dir = Path(out_dir)
    paths = sorted(out_dir.glob(_GLOB)) if out_dir.is_dir() else []
    man = RunManifest(out_dir)
    if not man.exists:
        return [NotebookState(p.name, "unrecorded", _copy_run_id(p)) for p in paths]
    latest, last, states = man.latest or {}, _last_attempts(man), []
    for p in paths:
        copy_id = _copy_run_id(p)
        made_by = man.data["runs"].get(copy_id) if copy_id else None
        reason = ""  # why the copy is stale
        if made_by is None or p.name not in made_by.get("selected", []) or p.name in made_by.get("failed", {}):
            reason = "not produced by a run recorded in run.json"
        elif last[p.name] is not made_by and last[p.name].get("status") != "done":  # done: a run beside it
            why = last[p.name].get("failed", {}).get(p.name)
            what = f"failed here: {why}" if why is not None else "did not reach it"
            reason = f"from run {copy_id} ({_when(made_by)}); the later run {last[p.name]['run_id']} {what}"
        elif latest and made_by.get("digest") != latest.get("digest"):
            reason = (f"from run {copy_id} ({_when(made_by)}) with other settings than the latest run "
                      f"{latest.get('run_id')}: {_diff(made_by.get('settings') or {}, latest.get('settings') or {})}")
        states.append(NotebookState(p.name, "stale" if reason else "current", copy_id, reason))
    return states


def run_summary(out_dir: str | os.PathLike) -> str:
    """The latest run of ``out_dir``, then one line per notebook (current, stale and why, failed)."""
    out_dir = Path(out_dir)
    man = RunManifest(out_dir)
    latest = man.latest
    lines = [f"run summary of {out_dir}"
             + (f" (latest run {latest['run_id']}, {_when(latest)}, {latest.get('status')})" if latest else "")]
    shown = {"current": "current  {0.name}  (run {0.run_id})", "stale": "STALE    {0.name}  {0.reason}",
             "unrecorded": "?        {0.name}  (no run manifest)"}
    states = notebook_states(out_dir)
    lines += ["  " + shown[st.state].format(st) for st in states]
    present = {st.name for st in states}
    failed = {name: run.get("failed", {}).get(name) for name, run in _last_attempts(man).items()}
    lines += [f"  FAILED   {name}  {why} (no earlier copy)" for name, why in sorted(failed.items())
              if why is not None and name not in present]
    return "\n".join(lines)


#: seconds after which a running cell gets a one-time notice that it may run for minutes
LONG_CELL_S = 60.0
#: at most this many seconds between two status lines when stdout is not a terminal
HEARTBEAT_S = 15.0
#: at least this many seconds between two changed status lines when stdout is not a terminal
MIN_GAP_S = 3.0
#: seconds without output after which the status line says how long the cell has been silent
QUIET_S = 15.0
_WIDTH = 160
_CELL_RE = re.compile(r"^(Executing|Ending) Cell (\d+)-*\s*$")
#: terminal control sequences (cursor moves of nested progress bars, colours)
_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")

def kernel_arguments() -> list[str]:
    """The kernel's extra arguments: ``--config`` of ``midas_nb/kernel/batch_config.py`` (a file of
    the package: nothing is written, so a killed run leaves nothing behind)."""
    return [f"--config={Path(__file__).with_name('kernel') / 'batch_config.py'}"]


def _minutes(seconds: float) -> str:
    """``42 s``, ``3 min 20 s``, ``12 min`` (seconds dropped from 10 minutes on)."""
    s = int(seconds)
    return f"{s} s" if s < 60 else f"{s // 60} min {s % 60} s" if s < 600 else f"{s // 60} min"


def _last_line(text: str) -> str:
    """The last non-empty line of ``text`` (after a carriage return: the latest), no control sequences."""
    for raw in reversed(_ANSI.sub("", text).replace("\r\n", "\n").split("\n")):
        line = raw.split("\r")[-1].strip() if "\r" in raw.rstrip("\r") else raw.strip()
        if line:
            return re.sub(r"\s+", " ", line)
    return ""


class StatusLine(logging.Handler):
    """One notebook's progress from papermill's log: ``[00_quickstart] cell 5/27, 3 min: <latest
    output>``; a progress line at its total reads ``after <step> (...)`` (finished, not running), and
    output older than :data:`QUIET_S` s says for how long the cell has printed nothing. :meth:`tick`
    (every second) writes it in place on a terminal, else when it changed (every :data:`MIN_GAP_S`
    s at most) and every :data:`HEARTBEAT_S` s; a cell running :data:`LONG_CELL_S` s gets a notice.
    ``sources``: first code line by 1-based cell index.
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
        self._shown, self._shown_at = "", -1e9
        self._lock = threading.Lock()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            text = record.getMessage()
        except Exception:  # noqa: BLE001 - a malformed record must not stop the run
            return
        m = _CELL_RE.match(text.strip())
        with self._lock:
            if m and m.group(1) == "Executing":
                self.cell, self.cell_t0, self.output_t = int(m.group(2)), self.clock(), None
                first = self.sources.get(self.cell, "")
                self.detail = f"running {first}" if first else "running"
            elif m is None and self.cell and (line := _last_line(text)):
                self.detail, self.output_t = line, self.clock()

    def render(self) -> str:
        """The status line now (class docstring)."""
        with self._lock:
            where = f" cell {self.cell}/{max(self.total, self.cell)}," if self.cell else ""
            now = self.clock()
            quiet = now - self.output_t if self.output_t is not None else 0.0
            note = f" (no output for {_minutes(quiet)})" if quiet >= QUIET_S else ""
            done = finished_step(self.detail) if self.output_t is not None else None
            what = self.detail if done is None else f"after {done}"
            line = f"[{self.label}]{where} {_minutes(now - (self.cell_t0 if self.cell else self.t0))}{note}: {what}"
        return line if len(line) <= _WIDTH else line[:_WIDTH - 1] + "…"

    def tick(self, final: bool = False) -> None:
        """Write the status line (and a long-cell notice) if it is due (class docstring); ``final``:
        clear the in-place line on a terminal, else write the last status if not written yet."""
        now = self.clock()
        if not final and self.cell and self.cell not in self.noticed and now - self.cell_t0 >= LONG_CELL_S:
            self.noticed.add(self.cell)
            self._write(("\r\033[K" if self.tty else "") + f"    [{self.label}] cell {self.cell} has run "
                        f"{_minutes(now - self.cell_t0)}: a first run trains and caches backbones and scorers, "
                        "which takes minutes; Ctrl-C stops, and the next run resumes from the caches\n")
        if self.tty:
            return self._write("\r\033[K" + ("" if final else self.render()))
        with self._lock:
            key = f"{self.cell}|{self.detail}"  # the same status at a later time is no change
        gap = now - self._shown_at
        if (key != self._shown and (final or gap >= MIN_GAP_S)) or (not final and gap >= HEARTBEAT_S):
            self._shown, self._shown_at = key, now
            self._write(self.render() + "\n")

    def _write(self, text: str) -> None:
        self.stream.write(text)
        self.stream.flush()


def drop_progress_outputs(nb: Any) -> int:
    """Remove :data:`midas_nb.progress.PROGRESS_LINE` lines from the stderr outputs of ``nb``, in
    place (an output left blank goes); returns how many were dropped."""
    from .progress import PROGRESS_LINE

    dropped = 0
    for cell in nb.cells:
        kept = []
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream" and out.get("name") == "stderr":
                lines = str(out.get("text", "")).splitlines(keepends=True)
                rest = [ln for ln in lines if not PROGRESS_LINE.match(ln.strip())]
                dropped += len(lines) - len(rest)
                if not "".join(rest).strip():
                    continue
                out["text"] = "".join(rest)
            kept.append(out)
        if "outputs" in cell:
            cell["outputs"] = kept
    return dropped


def execute_notebook(input_path: str | os.PathLike, output_path: str | os.PathLike, *,
                     parameters: dict[str, Any] | None = None, progress_bar: bool = True, **kwargs: Any) -> Any:
    """``papermill.execute_notebook`` with :func:`kernel_arguments`; with ``progress_bar``, a
    :class:`StatusLine` and ``MIDAS_PROGRESS=lines`` instead of papermill's bar (the progress lines
    left out of the executed copy). Returns the notebook."""
    import nbformat
    import papermill as pm  # heavy; imported only when a batch run starts

    kwargs.update(parameters=parameters, progress_bar=False,
                  extra_arguments=[*(kwargs.get("extra_arguments") or []), *kernel_arguments()])
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
    log = logging.getLogger("papermill")
    saved = (log.level, log.propagate)
    log.addHandler(status)
    log.setLevel(logging.INFO)
    log.propagate = False  # the output goes into the status line only, not to the root logger
    stop = threading.Event()
    ticker = threading.Thread(target=_tick_until, args=(status, stop), daemon=True, name="midas-nb status")
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


def _tick_until(status: StatusLine, stop: threading.Event) -> None:
    while not stop.wait(1.0):
        status.tick()
