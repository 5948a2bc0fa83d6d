"""What ``midas-nb run`` left in ``<output>``, read from papermill's metadata of the executed copies alone
(``NN_*.ipynb``, ``failed/NN_*.ipynb``): the latest run and which copies are stale, for the run summary and the
HTML edition (docs/decisions/0087-no-run-manifest.md)."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, NamedTuple
from unittest import mock

__all__ = ["NotebookState", "RunState", "run_state", "run_summary", "scoped_environ"]

_FAILURE = "**midas-nb run: this notebook did not finish.** "   # the first cell of a copy the runner wrote


def scoped_environ(**values: str) -> Any:
    """A context manager: ``os.environ`` with ``values`` set inside the block, restored after it."""
    return mock.patch.dict(os.environ, values)


class NotebookState(NamedTuple):
    """An executed copy's ``state`` (:func:`run_state`), its run and why it is ``stale``."""

    name: str
    state: Literal["current", "stale", "unrecorded"]
    run_id: str | None
    reason: str = ""


class RunState(NamedTuple):
    """The ``latest`` run (id, ``started`` ``YYYY-MM-DD HH:MM UTC``, the ``settings`` papermill injected), each
    executed copy's state and ``failed`` (``{notebook: why}``: a failure with no earlier copy)."""

    latest: str | None
    started: str
    settings: dict[str, Any]
    notebooks: list[NotebookState]
    failed: dict[str, str]


def _read(path: Path) -> dict[str, Any] | None:
    """The copy's ``run_id`` (``None``: not from ``midas-nb run``), ``params``, ``started``, ``accepted`` (its
    parameters cell's names) and ``why`` it failed; ``None`` when unreadable (being written by another run)."""
    import nbformat
    import papermill   # heavy: imported when copies are read
    try:
        nb = nbformat.reads(path.read_text(encoding="utf-8"), as_version=4)
        pm, cells = nb["metadata"].get("papermill") or {}, nb["cells"]
        accepted = set(papermill.inspect_notebook(nb))   # as the runner reads the source notebooks
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    where = Path(str(pm.get("output_path") or ""))
    source = [("".join(c.get("source", "")), c) for c in cells]
    why = next((s.removeprefix(_FAILURE) for s, _ in source if s.startswith(_FAILURE)), None) or next(
        (f"failed in cell {c.get('execution_count')} ({o.get('ename')}: {o.get('evalue')})" for _, c in source
         for o in c.get("outputs", []) if o.get("output_type") == "error"), "")
    return dict(run_id=where.parent.name if where.parent.parent.name == ".partial" else None, why=why,
                params=pm.get("parameters") or {}, accepted=accepted,
                started=f"{t[:16].replace('T', ' ')} UTC" if (t := str(pm.get("start_time") or "")) else "?")


def run_state(out_dir: str | os.PathLike) -> RunState:
    """The runs of ``out_dir``: the latest is the newest run id (ids sort by start). A copy is ``stale`` when its
    copy under ``failed/`` is from a later run, or when a parameter its notebook accepts had another value than
    in the latest run; ``unrecorded`` when papermill's ``output_path`` names no run; else ``current``."""
    good, bad = ({p.name: c for p in sorted(where.glob("[0-9][0-9]_*.ipynb")) if (c := _read(p)) is not None}
                 for where in (Path(out_dir), Path(out_dir) / "failed"))
    latest = max((c["run_id"] for c in [*good.values(), *bad.values()] if c["run_id"]), default=None)
    of_latest = [c for c in [*good.values(), *bad.values()] if c["run_id"] == latest]
    settings = {k: v for c in of_latest for k, v in c["params"].items()}
    states = []
    for name, c in good.items():
        reason, later, made = "", bad.get(name, {}).get("run_id") or "", f"from run {c['run_id']} ({c['started']})"
        keys = sorted(k for k in c["accepted"] & (set(c["params"]) | set(settings))
                      if c["params"].get(k) != settings.get(k))
        if c["run_id"] and later > c["run_id"]:
            reason = f"{made}; the later run {later} failed here: {bad[name]['why']}"
        elif c["run_id"] and keys:
            diff = ", ".join(f"{k} {c['params'].get(k)!r} -> {settings.get(k)!r}" for k in keys[:4])
            reason = f"{made} with other settings than the latest run {latest}: {diff}{' …' if len(keys) > 4 else ''}"
        state = "unrecorded" if c["run_id"] is None else "stale" if reason else "current"
        states.append(NotebookState(name, state, c["run_id"], reason))
    started = min((c["started"] for c in of_latest), default="")
    return RunState(latest, started, settings, states, {n: c["why"] for n, c in bad.items() if n not in good})


def run_summary(out_dir: str | os.PathLike) -> str:
    """The latest run of ``out_dir``, then one line per notebook (current, stale and why, failed)."""
    run = run_state(out_dir)
    lines = [f"run summary of {out_dir}" + (f" (latest run {run.latest}, {run.started})" if run.latest else "")
             + ("" if run.notebooks or run.failed else ": no notebook has finished yet")]
    shown = {"current": "current  {0.name}  (run {0.run_id})", "stale": "STALE    {0.name}  {0.reason}",
             "unrecorded": "?        {0.name}  (not from midas-nb run: its papermill metadata names no run)"}
    lines += ["  " + shown[st.state].format(st) for st in run.notebooks]
    return "\n".join(lines + [f"  FAILED   {name}  {why} (no earlier copy)" for name, why in run.failed.items()])
