"""The run manifest of ``midas-nb run``, ``<output>/run.json``: which run is the latest and which
executed copies are stale (docs/decisions/0032-run-manifest.md, 0076-thin-runner.md). Its readers
are the run summary and the HTML edition (header, stale marks). What papermill records in each
executed copy (``metadata.papermill``: parameters, times, exception, ``output_path``) is not repeated.
"""
from __future__ import annotations

import json
import os
import time
import uuid
from pathlib import Path
from typing import Any, Literal, NamedTuple
from unittest import mock

from .identity import atomic_write_text, file_lock

__all__ = ["MANIFEST_NAME", "NotebookState", "RunManifest", "copy_run_id", "notebook_states", "run_summary",
           "scoped_environ"]

MANIFEST_NAME = "run.json"


def scoped_environ(**values: str) -> Any:
    """A context manager: ``os.environ`` with ``values`` set inside the block, restored after it."""
    return mock.patch.dict(os.environ, values)


class RunManifest:
    """``<out_dir>/run.json``: ``latest`` (a run id) and ``runs`` by id, each with its ``started`` time,
    ``status`` (running, done, failed, interrupted), injected ``settings``, ``selected`` notebooks and
    ``failed`` (``{notebook: why}``). Every update is read-modify-write under ``.run.json.lock``, so two
    runs into one folder lose none of each other's (docs/decisions/0067-runs-side-by-side.md)."""

    def __init__(self, out_dir: str | os.PathLike):
        self.path = Path(out_dir) / MANIFEST_NAME
        self._read()

    def _read(self) -> None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, ValueError):  # ValueError: not JSON, not UTF-8
            data = None
        self.exists = isinstance(data, dict) and isinstance(data.get("runs"), dict)
        self.data: dict[str, Any] = data if self.exists else {"runs": {}, "latest": None}

    def _update(self, change: Any) -> None:
        """``change(data)`` applied to the manifest as it is on disk now, under its lock."""
        with file_lock(self.path.with_name(f".{MANIFEST_NAME}.lock")):
            self._read()
            change(self.data)
            atomic_write_text(self.path, json.dumps(self.data, indent=1, default=str))

    def start(self, settings: dict[str, Any], selected: list[str]) -> str:
        """Record a run's start; returns its id, unique and sortable: ``YYYYmmdd-HHMMSS-<6 hex>``."""
        run_id = time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]
        run = dict(run_id=run_id, started=time.time(), status="running", settings=settings, selected=list(selected),
                   failed={})
        self._update(lambda data: data.update(latest=run_id, runs={**data["runs"], run_id: run}))
        return run_id

    def finish(self, run_id: str, failed: tuple[str, str] | None = None, completed: bool = True) -> None:
        """Record the end of run ``run_id``: ``done``, ``failed`` (``failed``: the notebook and why) or
        ``interrupted`` (not ``completed``)."""
        self._update(lambda data: data["runs"][run_id].update(
            status="failed" if failed else "done" if completed else "interrupted",
            failed={**data["runs"][run_id]["failed"], **dict([failed] if failed else [])}))


class NotebookState(NamedTuple):
    """An executed notebook's ``state`` (:func:`notebook_states`), its run and why it is ``stale``."""

    name: str
    state: Literal["current", "stale", "unrecorded"]
    run_id: str | None
    reason: str = ""


def copy_run_id(path: Path) -> str | None:
    """The run that executed the copy ``path``: papermill's ``output_path`` is ``.partial/<run_id>/<name>``."""
    try:
        where = json.loads(path.read_text(encoding="utf-8"))["metadata"]["papermill"]["output_path"]
        return Path(str(where)).parent.name or None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _when(run: dict[str, Any]) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(run.get("started") or 0))


def notebook_states(out_dir: str | os.PathLike) -> list[NotebookState]:
    """The state of every executed ``NN_*.ipynb`` in ``out_dir``, in name order: ``unrecorded`` (no
    ``run.json``), else ``stale`` when the copy is not from a recorded run that selected it, when the
    latest run that selected it failed there or did not reach it (unless that run finished: a run
    beside it), or when its run's settings differ from the latest run's; else ``current``."""
    out_dir = Path(out_dir)
    paths = sorted(out_dir.glob("[0-9][0-9]_*.ipynb")) if out_dir.is_dir() else []
    man = RunManifest(out_dir)
    if not man.exists:
        return [NotebookState(p.name, "unrecorded", copy_run_id(p)) for p in paths]
    runs = man.data["runs"]
    latest = runs.get(man.data.get("latest")) or {}
    last = {name: run for run in runs.values() for name in run.get("selected", [])}  # the last run selecting it
    states = []
    for p in paths:
        copy_id = copy_run_id(p)
        made_by, reason = runs.get(copy_id) or {}, ""
        if p.name not in made_by.get("selected", []) or p.name in made_by.get("failed", {}):
            reason = "not produced by a run recorded in run.json"
        elif last[p.name] is not made_by and last[p.name].get("status") != "done":
            why = last[p.name].get("failed", {}).get(p.name)
            what = f"failed here: {why}" if why is not None else "did not reach it"
            reason = f"from run {copy_id} ({_when(made_by)}); the later run {last[p.name]['run_id']} {what}"
        elif latest and made_by.get("settings") != latest.get("settings"):
            a, b = made_by.get("settings") or {}, latest.get("settings") or {}
            keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
            diff = ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:4]) + (" …" if len(keys) > 4 else "")
            reason = (f"from run {copy_id} ({_when(made_by)}) with other settings than the latest run "
                      f"{latest.get('run_id')}: {diff}")
        states.append(NotebookState(p.name, "stale" if reason else "current", copy_id, reason))
    return states


def run_summary(out_dir: str | os.PathLike) -> str:
    """The latest run of ``out_dir``, then one line per notebook (current, stale and why, failed)."""
    man = RunManifest(out_dir)
    latest = man.data["runs"].get(man.data.get("latest"))
    lines = [f"run summary of {out_dir}"
             + (f" (latest run {latest['run_id']}, {_when(latest)}, {latest.get('status')})" if latest else "")]
    shown = {"current": "current  {0.name}  (run {0.run_id})", "stale": "STALE    {0.name}  {0.reason}",
             "unrecorded": "?        {0.name}  (no run manifest)"}
    states = notebook_states(out_dir)
    lines += ["  " + shown[st.state].format(st) for st in states]
    failed = {name: run.get("failed", {}).get(name) for run in man.data["runs"].values() for name in run["selected"]}
    lines += [f"  FAILED   {name}  {why} (no earlier copy)" for name, why in sorted(failed.items())
              if why is not None and name not in {st.name for st in states}]
    return "\n".join(lines)
