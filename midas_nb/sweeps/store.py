"""The sweep cell (:class:`SweepCell`, keyed by content: decision 0015), the JSON result store (:class:`ResultStore`:
one record per finished or failed cell) and its status (:class:`StoreStatus`, :func:`format_status`)."""
from __future__ import annotations

import fcntl
import functools
import json
import math
import os
import socket
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Callable, Literal, Mapping, Sequence

import pandas as pd

from ..config import runs_dir
from ..identity import (RESULT_FORMAT_VERSION, atomic_write_text, canonical_json, file_lock, hash_bytes, hash_json,
                        jsonable)
from ..point import Budget

__all__ = ["SweepCell", "CellState", "ExecutorKind", "RECORD_FORMAT", "ResultStore", "StoreStatus", "format_status",
           "open_store", "all_stores", "n_unusable"]

ExecutorKind = Literal["local", "slurm"]
CellState = Literal["done", "failed", "running", "pending"]
RECORD_FORMAT = "midas_nb.sweep_record/2"
#: records written before the content digest (docs/decisions/0066-verified-store-and-report-settings.md)
_LEGACY_FORMAT = "midas_nb.sweep_record/1"
#: the cell's parameters in a status table and in the result rows
_CELL_COLUMNS = ("dataset", "backbone", "depth", "budget", "condition", "seed", "checkpoint_id")
_MISSING = object()


@dataclass(frozen=True)
class SweepCell:
    """One protocol run: depth ``L`` (1-based block), kept fraction ``b ∈ (0, 1]``, ``condition``, ``seed``, ids of
    its checkpoint and evaluated data, ``params`` (JSON; not in ``hash()``), all in :attr:`key`. ValueError: L < 1."""

    dataset: str
    backbone: str
    depth: int
    budget: float
    condition: str
    seed: int
    checkpoint_id: str = ""
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    data_id: str = ""

    def __post_init__(self) -> None:     # equal cells hash equally (numpy ints, 0.25 vs 0.2500000001)
        for name, value in dict(depth=int(self.depth), seed=int(self.seed), budget=Budget(self.budget).keyed(),
                                params=json.loads(canonical_json(dict(self.params)))).items():
            object.__setattr__(self, name, value)
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1 (1-based block index), got {self.depth}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SweepCell":
        return cls(**{f.name: d[f.name] for f in fields(cls) if f.name in d})

    @functools.cached_property
    def key(self) -> str:
        """16 hex digits of the SHA-256 of every field and ``RESULT_FORMAT_VERSION`` (canonical JSON)."""
        return hash_json(dict(self.to_dict(), result_format=RESULT_FORMAT_VERSION), 16)

    @property
    def label(self) -> str:
        """E.g. ``cub/hybrid_lite0_vit L6 b0.25 T5 s0``."""
        return f"{self.dataset}/{self.backbone} L{self.depth} b{self.budget:g} {self.condition} s{self.seed}"


def _cell(d: Any) -> SweepCell | None:
    try:
        return SweepCell.from_dict(d)
    except (KeyError, TypeError, ValueError):
        return None


def _read_json(path: Path) -> tuple[Any, str | None, str]:
    """``(JSON, None, text)``; ``(None, None, "")`` without the file; ``(None, why, "")`` when unreadable."""
    try:
        text = path.read_text(encoding="utf-8")
        return json.loads(text), None, text
    except FileNotFoundError:
        return None, None, ""
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        return None, f"unreadable JSON ({e})", ""


def _with_digest(body: str) -> str:
    """A record's JSON text ``body`` (``indent=1``) with a first entry ``"digest"``: the SHA-256 of ``body``."""
    return f'{{\n "digest": "{hash_bytes(body.encode())}",\n' + body[2:]


class ResultStore:
    """Per-cell JSON records ``<root>/cells/<key>.json`` (default root ``runs_dir()/"sweeps"/name``; fields:
    :meth:`record_done`, its ``digest`` first), ``<key>.running`` claims (:meth:`hold`), ``grid.json`` (registered
    cells), ``jobs.json``. Invalid files (:meth:`_load`) are ignored, listed by :meth:`scan`; their cells pending."""

    def __init__(self, root: str | Path | None = None, *, name: str = "default") -> None:
        self.root = Path(root) if root is not None else runs_dir() / "sweeps" / name
        self.cells_dir = self.root / "cells"
        self.manifest_path, self.jobs_path = self.root / "grid.json", self.root / "jobs.json"
        self.cells_dir.mkdir(parents=True, exist_ok=True)

    def __repr__(self) -> str:
        return f"ResultStore({str(self.root)!r})"

    def __reduce__(self):  # workers re-open the store
        return (ResultStore, (str(self.root),))

    def path(self, key: str) -> Path:
        return self.cells_dir / f"{key}.json"

    def running_path(self, key: str) -> Path:
        return self.cells_dir / f"{key}.running"

    def write_record(self, record: Mapping[str, Any]) -> Path:
        """Write a record atomically, its ``digest`` first; returns its path."""
        return atomic_write_text(self.path(record["key"]), _with_digest(json.dumps(
            {k: v for k, v in record.items() if k != "digest"}, default=jsonable, allow_nan=True, indent=1)))

    def record_done(self, cell: SweepCell, rows: list[dict[str, Any]], *, started: float, error: str | None = None,
                    tb: str | None = None) -> Path:
        """Write ``cell``'s record: ``done`` with ``rows``, or ``failed`` where ``error`` is given."""
        prev, now, array = self.read(cell.key), time.time(), os.environ.get("SLURM_ARRAY_JOB_ID")
        job = f"{array}_{os.environ.get('SLURM_ARRAY_TASK_ID')}" if array else os.environ.get("SLURM_JOB_ID")
        return self.write_record(dict(
            format=RECORD_FORMAT, key=cell.key, label=cell.label, cell=cell.to_dict(),
            attempt=int(prev.get("attempt", 0)) + 1 if prev else 1, started=started, finished=now,
            duration_s=now - started, host=socket.gethostname(), pid=os.getpid(), job_id=job,
            status="done" if error is None else "failed", rows=rows, error=error, traceback=tb))

    def record_failed(self, cell: SweepCell, error: str, tb: str = "", *, started: float) -> Path:
        return self.record_done(cell, [], started=started, error=error, tb=tb)

    def hold(self, key: str, wait: bool = False) -> int | None:
        """Claim cell ``key``: a descriptor holding an exclusive ``flock`` on ``<key>.running`` (the kernel releases it
        however its process ends: 0078); ``None`` while another holds it (``wait``: block). :meth:`release` it."""
        fd = os.open(self.running_path(key), os.O_CREAT | os.O_RDWR, 0o644)
        for _ in range(3):      # a status probe (claim_info) holds it for microseconds: try again before leaving it
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | (0 if wait else fcntl.LOCK_NB))
                return fd
            except BlockingIOError:
                time.sleep(0.1)
        os.close(fd)
        return None

    def release(self, key: str, fd: int) -> None:
        """Give back :meth:`hold`'s claim; its file is removed while it is the one this descriptor locks."""
        try:
            if os.stat(self.running_path(key)).st_ino == os.fstat(fd).st_ino:
                self.running_path(key).unlink()
        except FileNotFoundError:
            pass
        finally:
            os.close(fd)

    def claim_info(self, key: str) -> dict[str, Any] | None:
        """``{"live": whether a process holds cell key's claim}``; ``None`` without a claim file."""
        try:
            fd = os.open(self.running_path(key), os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
            return dict(live=False)
        except BlockingIOError:
            return dict(live=True)
        finally:
            os.close(fd)

    def _merge(self, path: Path, read: Callable[[], dict], new: Mapping[str, Any]) -> None:
        """``read()`` updated with ``new``, written to ``path`` under ``locks/<stem>.lock`` (no entry lost)."""
        with file_lock(self.root / "locks" / f"{path.stem}.lock"):
            atomic_write_text(path, json.dumps({**read(), **new}, default=jsonable, indent=1))

    def record_jobs(self, jobs: Mapping[str, str]) -> None:
        """Merge ``{cell key: scheduler job id}`` into ``jobs.json``."""
        self._merge(self.jobs_path, self.jobs, {str(k): str(v) for k, v in jobs.items()})

    def jobs(self) -> dict[str, str]:
        """``{cell key: job id}`` of the latest submission of each cell (``jobs.json``)."""
        data = _read_json(self.jobs_path)[0]
        return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}

    def register(self, cells: Sequence[SweepCell]) -> None:
        """Add ``cells`` to the store's ``grid.json`` (merged with the cells already listed)."""
        self._merge(self.manifest_path, lambda: self._manifest()[0], {c.key: c.to_dict() for c in cells})

    def _manifest(self, recover: bool = True) -> tuple[dict[str, dict], str | None]:
        """``(grid.json's {key: cell} or {}, None)``; an unreadable one: ``(the records' cells if recover, why)``."""
        grid, why, text = _read_json(self.manifest_path)
        why = why or (None if isinstance(grid, dict) or not text else f"a JSON {type(grid).__name__}, not an object")
        if why or not text:
            grid = {k: r["cell"] for k, r in self.scan()[0].items()} if why and recover else {}
        return grid, why

    def registered_cells(self) -> list[SweepCell]:
        """The cells listed in ``grid.json`` (empty if none were registered)."""
        return [c for c in map(_cell, self._manifest()[0].values()) if c is not None]

    def _load(self, path: Path) -> tuple[dict | None, str | None]:
        """``(record, None)``; ``(None, why)`` for a file that is no valid record; ``(None, None)``: no file."""
        rec, why, text = _read_json(path)
        if why or not isinstance(rec, dict):
            return None, why or ("not a JSON object" if text else None)
        key, fmt, cell = path.stem, rec.get("format"), _cell(rec.get("cell"))
        checks = [(fmt in (RECORD_FORMAT, _LEGACY_FORMAT), f"format {fmt!r} is not {RECORD_FORMAT!r}"),
                  (rec.get("key") == key, f"key {rec.get('key')!r} does not match the file name {key!r}"),
                  (rec.get("status") in ("done", "failed"), f"status {rec.get('status')!r} is not 'done' or 'failed'"),
                  (isinstance(rec.get("rows"), list), "rows is not a list"),
                  (cell is not None, "cell is not a valid cell"),
                  (cell is None or cell.key == key, f"its cell hashes to {cell and cell.key}, not to its key (a record "
                                                    "of another cell's settings, or of an older result format)"),
                  (fmt == _LEGACY_FORMAT or text == _with_digest("{\n" + text.split("\n", 2)[-1]),
                   "its text does not match its digest (edited by hand, or damaged)")]
        why = next((why for ok, why in checks if not ok), None)
        return (None, why) if why else (rec, None)

    def read(self, key: str) -> dict[str, Any] | None:
        """The valid record of cell ``key``, or ``None``."""
        return self._load(self.path(key))[0]

    def scan(self) -> tuple[dict[str, dict], list[dict[str, str]]]:
        """All valid records by key, and the problems found (``path``, ``reason``)."""
        records, problems = {}, []
        for p in sorted(self.cells_dir.iterdir()):
            if p.suffix == ".json":
                rec, why = self._load(p)
                if rec is not None:
                    records[p.stem] = rec
                reason = why and f"invalid record ignored: {why}"
            elif p.name.endswith(".tmp"):
                reason = "leftover temporary file (a writer was interrupted, or one is writing now); ignored"
            else:   # a claim, or NFS's name for a removed claim file that a waiting worker still has open
                reason = None if p.suffix == ".running" or p.name.startswith(".nfs") else "unexpected file; ignored"
            if reason:
                problems.append(dict(path=str(p), reason=reason))
        if why := self._manifest(recover=False)[1]:
            problems.append(dict(path=str(self.manifest_path),
                                 reason=f"grid.json is {why}; the cells are recovered from their {len(records)} "
                                        "records (cells registered but never finished are not listed)"))
        return records, problems

    def state(self, key: str, rec: Any = _MISSING) -> CellState:
        """``done``, ``failed``, ``running`` (claimed, no record) or ``pending`` (``rec``: its record, if read)."""
        rec = self.read(key) if rec is _MISSING else rec
        return rec["status"] if rec is not None else \
            "running" if (self.claim_info(key) or {}).get("live") else "pending"

    def status(self, cells: Sequence[SweepCell] | None = None) -> pd.DataFrame:
        """One row per cell (default: the registered ones, then any other with a record): its parameters, ``status``,
        ``error``, ``attempt``, ``duration_s``, ``n_rows``, ``job_id``; ``attrs``: problems, root, store_cells."""
        records, problems = self.scan()
        by_key = {c.key: c for c in self.registered_cells()}
        extra = [c for c in (_cell(rec["cell"]) for k, rec in records.items() if k not in by_key) if c is not None]
        cells, jobs = list(by_key.values()) + extra if cells is None else cells, self.jobs()
        rows = [dict(key=c.key, label=c.label, **{f: getattr(c, f) for f in _CELL_COLUMNS},
                     status=self.state(c.key, records.get(c.key)), error=r.get("error"), attempt=r.get("attempt", 0),
                     duration_s=r.get("duration_s", math.nan), n_rows=len(r.get("rows", [])), job_id=jobs.get(c.key))
                for c in cells for r in [records.get(c.key) or {}]]
        cols = ["key", "label", *_CELL_COLUMNS, "status", "error", "attempt", "duration_s", "n_rows", "job_id"]
        df = pd.DataFrame(rows, columns=cols)
        df.attrs.update(problems=problems, root=str(self.root), store_cells=len(by_key) + len(extra))
        return df

    def results(self, cells: Sequence[SweepCell] | None = None) -> pd.DataFrame:
        """The rows of the done cells (all, or of ``cells``) with ``cell_key``, the cell's parameters where missing."""
        records, _ = self.scan()
        keys = ([c.key for c in cells] if cells is not None else   # grid order, then cells never registered
                dict.fromkeys([c.key for c in self.registered_cells() if c.key in records] + list(records)))
        done = [(k, r) for k in keys if (r := records.get(k)) is not None and r["status"] == "done" and r["rows"]]
        frames = [df.assign(**{c: r["cell"].get(c) for c in _CELL_COLUMNS if c not in df.columns}, cell_key=k)
                  for k, r in done for df in [pd.DataFrame(r["rows"])]]
        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


@dataclass
class StoreStatus:
    """:func:`run_sweep`'s: ``table`` (:meth:`ResultStore.status` of its cells), ``executor_errors`` (a job died)."""

    table: pd.DataFrame
    executor_errors: list[str] = field(default_factory=list)

    def count(self, state: CellState) -> int:
        return int((self.table["status"] == state).sum()) if len(self.table) else 0

    done = property(lambda self: self.count("done"))
    failed = property(lambda self: self.count("failed"))
    pending = property(lambda self: self.count("pending") + self.count("running"))   # not computed yet
    complete = property(lambda self: len(self.table) > 0 and self.done == len(self.table))

    def __str__(self) -> str:
        errors = "".join(f"\n  {e}" for e in self.executor_errors)
        return format_status(self.table) + (f"\nexecutor errors:{errors}" if errors else "")


def format_status(table: pd.DataFrame, max_errors: int = 20) -> str:
    """Counts, one line per failed cell with its error, then the store's problems (``table.attrs``)."""
    n = len(table)
    counts = table["status"].value_counts().to_dict() if n else {}
    head = f"{n} cells: " + ", ".join(f"{counts.get(s, 0)} {s}" for s in ("done", "failed", "running", "pending"))
    if "root" in table.attrs:
        total = table.attrs.get("store_cells", n)
        head += f"  [{table.attrs['root']}" + (f"; {total} cells in the store, `midas-nb sweep status` counts them all]"
                                               if total > n else "]")
    failed = table[table["status"] == "failed"] if n else table
    lines = [head] + [f"  FAILED {r['label']} (key {r['key']}, attempt {r['attempt']}): "
                      f"{(str(r['error']).strip().splitlines() or [''])[-1]}"
                      for _, r in failed.head(max_errors).iterrows()]
    if len(failed) > max_errors:
        lines.append(f"  ... and {len(failed) - max_errors} more failures")
    lines += [f"  ignored {Path(p['path']).name}: {p['reason']}" for p in table.attrs.get("problems", [])]
    return "\n".join(lines)


def open_store(name_or_store: str | Path | ResultStore, must_exist: bool = False) -> ResultStore:
    """A :class:`ResultStore` from a store, its directory or a sweep name under ``runs_dir()/"sweeps"``.
    Raises ``FileNotFoundError`` / ``ValueError`` (``must_exist``): no such directory / not a store."""
    if isinstance(name_or_store, ResultStore):
        return name_or_store
    p, named = Path(name_or_store), runs_dir() / "sweeps" / str(name_or_store)
    if len(p.parts) == 1 and (named.is_dir() or not p.is_dir()):  # a bare name is a sweep name
        p = named
    if must_exist and not p.is_dir():
        known = sorted(q.name for q in (runs_dir() / "sweeps").glob("*") if q.is_dir())
        raise FileNotFoundError(f"no sweep store at {p} (a profile's store has its name); " + (f"known sweeps: "
            f"{', '.join(known)}" if known else "none exists yet (a run or `midas-nb sweep submit` makes one)"))
    if must_exist and not ((p / "cells").is_dir() or (p / "grid.json").is_file()):
        raise ValueError(f"{p} is not a sweep store (it has neither cells/ nor grid.json); expected a sweep "
                         f"name under {runs_dir() / 'sweeps'} or a store directory written by midas_nb")
    return ResultStore(p)


def all_stores() -> list[str]:
    """The sweep stores under ``runs_dir()/"sweeps"`` (folders with ``cells/``), as sorted path strings."""
    return sorted(str(q) for q in (runs_dir() / "sweeps").glob("*") if (q / "cells").is_dir())


def n_unusable(table: pd.DataFrame) -> int:
    """The failed cells of a status table and its store's invalid files (a writer's temporary file is none)."""
    return int(table["status"].eq("failed").sum()) + sum(not p["path"].endswith(".tmp")
                                                         for p in table.attrs.get("problems", []))
