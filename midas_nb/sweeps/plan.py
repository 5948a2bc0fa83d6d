"""What a sweep would send to Slurm and what it would cost, without submitting (``midas-nb sweep plan``,
:func:`plan_text`; the cost per cell: docs/decisions/0020-sweep-cost-model.md)."""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Mapping, Sequence

from .. import config
from ..identity import canonical_json
from .slurm import chunk_arrays, plan_jobs
from .store import ResultStore, SweepCell

__all__ = ["default_cost_path", "SHIPPED_COST_TABLE", "load_cost_table", "plan_text", "sweep_lines", "CELL_IDENTITY",
           "cell_ident"]

#: the cost table of the last GPU measurement, shipped with the package (docs/decisions/0068)
SHIPPED_COST_TABLE = Path(__file__).with_name("cell_cost.json")


def default_cost_path() -> Path:
    """Where ``bench/gpu_check.py`` writes its cost table: ``runs/bench/cell_cost.json``."""
    return config.runs_dir() / "bench" / "cell_cost.json"


def load_cost_table(path: str | Path | None = None) -> dict[str, Any] | None:
    """The cost table (``cell_s``, ``finetune_s``: ``{backbone: {dataset: s}}``, ``device``, ``date``, ``path``) at
    ``path``, :func:`default_cost_path` or :data:`SHIPPED_COST_TABLE`; ``None``: none. ValueError, FileNotFoundError."""
    p = Path(path) if path is not None else default_cost_path() if default_cost_path().is_file() else SHIPPED_COST_TABLE
    if not p.is_file():
        if path is not None:
            raise FileNotFoundError(f"--cost {str(path)!r}: no such file (expected the cost table that "
                                    "bench/gpu_check.py writes)")
        return None
    try:
        table = json.loads(p.read_text(encoding="utf-8"))
        ok = isinstance(table, dict) and all(isinstance(table.get(k), dict) for k in ("cell_s", "finetune_s"))
    except ValueError:
        ok = False
    if not ok:
        raise ValueError(f"{p} is not a cost table (expected JSON with cell_s and finetune_s per backbone and "
                         "dataset, as bench/gpu_check.py writes)")
    return dict(table, path=str(p))


def _cell_cost(cell: SweepCell, timed: Mapping[tuple[str, str], list[float]],
               table: Mapping[str, Any] | None) -> tuple[float | None, str]:
    """Seconds for one cell and where the number comes from (``store``, ``table``, ``none``)."""
    same = timed.get((cell.backbone, cell.dataset)) or [s for (b, _), v in timed.items() if b == cell.backbone
                                                          for s in v]
    if same:
        return sum(same) / len(same), "store"
    per = (table or {}).get("cell_s", {}).get(cell.backbone, {})
    value = per.get(cell.dataset.split(" ")[0], per.get("*"))
    return (float(value), "table") if value is not None else (None, "none")


def _hours(seconds: float) -> str:
    return f"{seconds / 3600:,.1f} h"


#: the columns that name one cell apart from its checkpoint, data and settings (decision 0077)
_IDENT_TYPES = dict(dataset=str, backbone=str, depth=int, budget=lambda b: round(float(b), 6), condition=str, seed=int,
                    build=int)
CELL_IDENTITY = list(_IDENT_TYPES)


def cell_ident(d: Mapping[str, Any], cols: Sequence[str] = CELL_IDENTITY) -> tuple:
    """The one cell key of the plan and the report (decision 0077): the values of ``cols`` (of :data:`CELL_IDENTITY`)
    of a row or a :meth:`SweepCell.to_dict`, typed; the build is the row's, else ``params["build"]``, else 0."""
    try:
        build = float(d.get("build"))                     # type: ignore[arg-type]
    except (TypeError, ValueError):
        build = math.nan
    build = int(build) if math.isfinite(build) else int((d.get("params") or {}).get("build", 0))
    return tuple(_IDENT_TYPES[c](build if c == "build" else d[c]) for c in cols)


def _done_key(cell: Mapping[str, Any]) -> Any:
    """A cell's coordinates and settings, without its checkpoint and data ids."""
    return cell_ident(cell), canonical_json({k: v for k, v in (cell.get("params") or {}).items() if k != "build"})


def sweep_lines(sweeps: Mapping[str, Sequence[SweepCell]],
                store: ResultStore | None = None) -> tuple[list[str], set[str], list[SweepCell], dict]:
    """``(a line per sweep: its cells, shared with a sweep above, done; distinct keys; distinct cells not done;
    {(backbone, dataset): [duration_s of each done cell]})`` of ``sweeps`` (``{name: cells}``) in ``store``."""
    done: set[Any] = set()
    timed: dict[tuple[str, str], list[float]] = {}
    for r in store.scan()[0].values() if store is not None and store.cells_dir.is_dir() else []:
        if r["status"] == "done":
            done.add(_done_key(r["cell"]))
            if isinstance(r.get("duration_s"), (int, float)):
                timed.setdefault((str(r["cell"]["backbone"]), str(r["cell"]["dataset"])), []).append(r["duration_s"])
    lines, seen, todo = [], set(), []
    for name, cells in sweeps.items():
        is_done = {c.key: _done_key(c.to_dict()) in done for c in cells}
        new = [c for c in cells if c.key not in seen]
        seen.update(c.key for c in new)
        todo += [c for c in new if not is_done[c.key]]
        groups = sorted({f"{c.dataset}/{c.backbone.split('_patch')[0]}" for c in cells})
        lines.append(f"  {name:<14} {len(cells):>6,} cells, {len(cells) - len(new):>6,} shared with a line above, "
                     f"{sum(is_done[c.key] for c in cells):>5,} done  "
                     f"({len(groups)} dataset/backbone: "
                     f"{', '.join(groups[:3])}{', ...' if len(groups) > 3 else ''})")
    return lines, seen, todo, timed


def plan_text(sweeps: Mapping[str, Sequence[SweepCell]], *, cells_per_job: int, max_array: int,
              max_array_source: str, store: ResultStore | None = None, cost_table: Mapping[str, Any] | None = None,
              gpus: Sequence[int] = (8, 32)) -> str:
    """The plan of ``sweeps`` (``{"04 regime": cells, ...}``) as text: cells per sweep (:func:`sweep_lines`), jobs
    and arrays, projected GPU-hours and the wall time on each number of ``gpus``. A store's done cells match by
    coordinates and settings (a plan's ids are placeholders). ``ValueError``: ``cells_per_job``/``max_array`` < 1."""
    lines, seen, todo, timed = sweep_lines(sweeps, store)
    prepare, chunks = plan_jobs(todo, cells_per_job)
    arrays = chunk_arrays(len(chunks), max_array)
    out = [f"cells per notebook sweep ({f'store {store.root}' if store is not None else 'no store yet'}):", *lines,
           f"  {'all':<14} {len(seen):>6,} distinct cells, {len(seen) - len(todo):,} done, {len(todo):,} to run",
           f"preparation jobs: {len(prepare)} (one per dataset, backbone, checkpoint: fine-tune once, hash the data)",
           f"cell jobs: {len(chunks):,} of <= {cells_per_job} cells, in {len(arrays)} array(s) of <= {max_array} tasks "
           f"(MaxArraySize {max_array}, {max_array_source}): " + ", ".join(str(len(a)) for a in arrays)]
    t = {"device": "?", "date": "?", "path": "-", **(cost_table or {})}
    costs = [_cell_cost(c, timed, cost_table) for c in todo]
    known = [s for s, _ in costs if s is not None]
    sources = sorted({src for _, src in costs})
    if len(known) < len(todo) or not todo:
        return "\n".join(out + ["projection: nothing to run" if not todo else
                                f"projection: no cost for {len(todo) - len(known):,} of {len(todo):,} cells (no timed "
                                f"cell of their backbone in the store, none in the cost table {t['path']}); run "
                                "bench/gpu_check.py --device cuda on a GPU node to measure one"])
    ft = t.get("finetune_s", {})
    prep_s = [float(ft.get(c.backbone, {}).get(c.dataset.split(" ")[0], 0.0)) for c in prepare]
    cell_s = sum(known)
    src = {"store": f"mean of {sum(len(v) for v in timed.values())} timed cells in the store",
           "table": f"cost table measured on {t['device']} on {t['date']}: {t['path']}"}
    out.append(f"cost per cell: {cell_s / len(known) / 60:.1f} min on average ({'; '.join(src[s] for s in sources)})"
               + (f"; {t['note']}" if "table" in sources and t.get("note") else ""))
    cpu = "table" in sources and str(t["device"]).startswith("cpu")
    unit = "CPU-hours (the cost table was measured on a CPU: no GPU projection)" if cpu else "GPU-hours"
    out.append(f"projected: {(cell_s + sum(prep_s)) / 3600:,.1f} {unit} = cells {_hours(cell_s)} + preparation "
               f"fine-tunes {_hours(sum(prep_s))}" + ("" if any(prep_s) else " (fine-tune cost unknown: 0 counted)"))
    per_job = cell_s / len(chunks)
    for g in gpus:
        wall = max(prep_s or [0.0]) + math.ceil(len(chunks) / g) * per_job
        out.append(f"  wall time on {g} {'such CPU machines' if cpu else 'GPUs'}: ~{_hours(wall)} (longest "
                   f"preparation job, then {math.ceil(len(chunks) / g)} rounds of cell jobs)")
    return "\n".join(out)
