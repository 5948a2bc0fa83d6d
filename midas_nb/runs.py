"""The run manifest of ``midas-nb run``: which run produced each executed notebook, and which
copies are stale.

Every ``midas-nb run`` gets a run id and records, in ``<output>/run.json``, its settings (the
parameters injected into the notebooks), the notebooks it selected, and per notebook the run
that produced the copy in ``<output>/`` and the outcome of the latest attempt (``done``,
``failed`` with its message, ``not run`` when an earlier notebook stopped the run). Each
executed copy also carries its run id in its metadata (``metadata["midas_nb"]["run_id"]``).

:func:`notebook_states` reads both and classifies each ``NN_*.ipynb`` in the output directory:

- ``current`` — produced by the latest run, or by an earlier run with the same settings that
  the latest run did not select;
- ``stale`` — an older copy that the latest run should have replaced (its attempt failed or
  was never reached), one from an earlier run with other settings, or one the manifest does
  not account for (its run id differs from the recorded one, or no record);
- ``unrecorded`` — there is no manifest (a directory written before manifests existed).

The run summary (:func:`run_summary`) and the HTML edition
(:func:`midas_nb.course.export_html`) show these states, so an old notebook is never
published as a current result.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable, Literal

from .identity import atomic_write_text

__all__ = ["MANIFEST_NAME", "RunManifest", "NotebookState", "new_run_id", "notebook_states", "run_summary",
           "settings_digest"]

MANIFEST_NAME = "run.json"
_FORMAT = "midas_nb.run_manifest/1"
_GLOB = "[0-9][0-9]_*.ipynb"

State = Literal["current", "stale", "failed", "unrecorded"]


def new_run_id() -> str:
    """A unique, sortable run id: ``YYYYmmdd-HHMMSS-<6 hex>``."""
    return time.strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


def settings_digest(settings: dict[str, Any]) -> str:
    """12-hex-digit digest of a run's injected parameters (key order does not matter)."""
    return hashlib.sha1(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()[:12]


class RunManifest:
    """``<output>/run.json``: the latest run and, per notebook, its copy's run and latest attempt.

    Args:
        out_dir: the run's output directory (``runs/<profile>`` by default).
    """

    def __init__(self, out_dir: str | os.PathLike):
        self.out_dir = Path(out_dir)
        self.path = self.out_dir / MANIFEST_NAME
        self.data: dict[str, Any] = self._read() or {"format": _FORMAT, "runs": {}, "latest": None, "notebooks": {}}

    def _read(self) -> dict[str, Any] | None:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except (FileNotFoundError, json.JSONDecodeError, UnicodeDecodeError):
            return None
        return data if isinstance(data, dict) and data.get("format") == _FORMAT else None

    @property
    def exists(self) -> bool:
        return self.path.is_file() and self._read() is not None

    def save(self) -> None:
        atomic_write_text(self.path, json.dumps(self.data, indent=1, default=str))

    # -- writing ---------------------------------------------------------------------------------
    def start(self, run_id: str, settings: dict[str, Any], selected: Iterable[str]) -> None:
        """Record the start of run ``run_id`` with its injected ``settings`` and notebook names."""
        selected = list(selected)
        self.data["runs"][run_id] = dict(run_id=run_id, started=time.time(), finished=None, status="running",
                                         settings=settings, digest=settings_digest(settings), selected=selected)
        self.data["latest"] = run_id
        for name in selected:
            entry = self.data["notebooks"].setdefault(name, {})
            entry["attempt"] = dict(run_id=run_id, status="not run", message="not reached yet")
        self.save()

    def record(self, run_id: str, name: str, status: Literal["done", "failed", "not run"],
               message: str = "", seconds: float | None = None) -> None:
        """Record the outcome of notebook ``name`` in run ``run_id`` (``done`` replaces its copy)."""
        entry = self.data["notebooks"].setdefault(name, {})
        entry["attempt"] = dict(run_id=run_id, status=status, message=message, seconds=seconds)
        if status == "done":
            entry.update(run_id=run_id, finished=time.time())
        self.save()

    def finish(self, run_id: str, status: Literal["done", "failed", "interrupted"]) -> None:
        run = self.data["runs"].get(run_id)
        if run is not None:
            run.update(finished=time.time(), status=status)
        for entry in self.data["notebooks"].values():
            att = entry.get("attempt") or {}
            if att.get("run_id") == run_id and att.get("status") == "not run":
                att["message"] = "not reached: an earlier notebook of the run stopped it" \
                    if status != "interrupted" else "not reached: the run was interrupted"
        self.save()

    # -- reading ---------------------------------------------------------------------------------
    def run(self, run_id: str | None) -> dict[str, Any] | None:
        return self.data["runs"].get(run_id) if run_id else None

    @property
    def latest(self) -> dict[str, Any] | None:
        return self.run(self.data.get("latest"))


@dataclass
class NotebookState:
    """Where an executed notebook in an output directory comes from.

    Attributes:
        name: file name (``02_three_condition_protocol.ipynb``).
        state: ``current``, ``stale``, ``unrecorded`` (see the module docstring).
        run_id: the run that produced this copy (``None`` when unknown).
        reason: one line explaining a ``stale`` state (empty otherwise).
    """

    name: str
    state: State
    run_id: str | None
    reason: str = ""


def _copy_run_id(path: Path) -> str | None:
    try:
        meta = json.loads(path.read_text(encoding="utf-8")).get("metadata", {})
    except (OSError, json.JSONDecodeError, UnicodeDecodeError):
        return None
    return (meta.get("midas_nb") or {}).get("run_id")


def _when(run: dict[str, Any] | None) -> str:
    t = (run or {}).get("started")
    return time.strftime("%Y-%m-%d %H:%M", time.localtime(t)) if t else "?"


def _diff(a: dict[str, Any], b: dict[str, Any]) -> str:
    keys = sorted(k for k in set(a) | set(b) if a.get(k) != b.get(k))
    return ", ".join(f"{k} {a.get(k)!r} -> {b.get(k)!r}" for k in keys[:4]) + (" …" if len(keys) > 4 else "")


def notebook_states(out_dir: str | os.PathLike) -> list[NotebookState]:
    """The state of every executed ``NN_*.ipynb`` in ``out_dir`` (module docstring), in name order."""
    out_dir = Path(out_dir)
    paths = sorted(out_dir.glob(_GLOB)) if out_dir.is_dir() else []
    man = RunManifest(out_dir)
    if not man.exists:
        return [NotebookState(p.name, "unrecorded", _copy_run_id(p)) for p in paths]
    latest = man.latest or {}
    states = []
    for p in paths:
        entry = man.data["notebooks"].get(p.name) or {}
        copy_id = _copy_run_id(p)
        made_by = man.run(entry.get("run_id"))
        att = entry.get("attempt") or {}
        if not entry.get("run_id") or copy_id != entry.get("run_id"):
            states.append(NotebookState(p.name, "stale", copy_id,
                                        "not produced by a run recorded in run.json"))
            continue
        if att.get("run_id") and att.get("run_id") != entry["run_id"] and att.get("status") != "done":
            what = (f"the later run {att['run_id']} failed here: {att.get('message', '')}"
                    if att.get("status") == "failed" else f"the later run {att['run_id']} did not reach it")
            states.append(NotebookState(p.name, "stale", copy_id,
                                        f"from run {entry['run_id']} ({_when(made_by)}); {what}"))
            continue
        if made_by is not None and latest and made_by.get("digest") != latest.get("digest"):
            states.append(NotebookState(p.name, "stale", copy_id,
                                        f"from run {entry['run_id']} ({_when(made_by)}) with other settings than "
                                        f"the latest run {latest.get('run_id')}: "
                                        f"{_diff(made_by.get('settings') or {}, latest.get('settings') or {})}"))
            continue
        states.append(NotebookState(p.name, "current", copy_id))
    return states


def run_summary(out_dir: str | os.PathLike) -> str:
    """Printable summary of an output directory: the latest run, then one line per notebook
    (current / stale with the reason / failed in the latest run)."""
    out_dir = Path(out_dir)
    man = RunManifest(out_dir)
    latest = man.latest
    lines = [f"run summary of {out_dir}"
             + (f" (latest run {latest['run_id']}, {_when(latest)}, {latest.get('status')})" if latest else "")]
    for st in notebook_states(out_dir):
        if st.state == "current":
            lines.append(f"  current  {st.name}  (run {st.run_id})")
        elif st.state == "stale":
            lines.append(f"  STALE    {st.name}  {st.reason}")
        else:
            lines.append(f"  ?        {st.name}  (no run manifest)")
    if man.exists:
        present = {p.name for p in out_dir.glob(_GLOB)}
        for name, entry in sorted(man.data["notebooks"].items()):
            att = entry.get("attempt") or {}
            if name not in present and att.get("status") == "failed":
                lines.append(f"  FAILED   {name}  {att.get('message', '')} (no earlier copy)")
    return "\n".join(lines)
