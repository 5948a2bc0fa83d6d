"""Notebook 04's regime sweep of the rehearsal profile, cell by cell against grouped (docs/decisions/0069).

Builds the rehearsal's inputs as ``tests/test_rehearsal.py`` does (FGVC-Aircraft and Stanford Cars
directories made from the CUB subset; DeiT-Ti/S and AugReg ViT-B weight files of narrow, seeded random
models; no network) and fine-tunes the backbones (not timed). Then two processes of their own (so that
neither reuses the other's in-process memos) each compute the whole regime grid into a store and protocol
caches of their own: cell by cell (``ProtocolCellRunner.__call__``: one ``run_protocol`` cell at a time, as
before decision 0069) and grouped (the runner itself: ``run_sweep`` hands each (dataset, backbone) to
``run_group``). Prints the wall and CPU seconds of each, the largest difference between the two engines'
rows (timings left out) and

    ratio: <cell-by-cell CPU seconds / grouped CPU seconds>

Goal ≥ 3 on 2 CPU cores. The ratio is of the sweep process's CPU time (the profile runs torch on one
thread): on a machine that other jobs share, wall time measures their load as much as the sweep, and the
CPU time too varies (±10 %), so each engine runs ``--repeats`` times (default 2), alternating, and its
fastest run counts.

Usage: ``python bench/sweep_cost.py [--datasets cub aircraft cars] [--backbones NAME ...] [--repeats 2] [--work DIR]``
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO), str(REPO / "tests")]   # run from a checkout; the weight-file writers of the tests

#: columns that time something: they differ between any two runs
TIMINGS = {"throughput", "throughput_full", "speedup", "train_seconds"}


def inputs(work: Path, cub: Path) -> dict:
    """The rehearsal's data roots, weight files and backbone widths (tests/test_rehearsal.py)."""
    from midas_nb.data import make_aircraft_from_cub, make_cars_from_cub
    from weight_files import PAPER_WRITERS, SMALL_KWARGS, paper_arch

    air = make_aircraft_from_cub(cub, work / "fgvc-aircraft-2013b", num_classes=4, per_split=(2, 1, 2))
    cars = make_cars_from_cub(cub, work / "stanford_cars", num_classes=4, per_split=(2, 2))
    weights = {}
    for name, (fname, writer) in PAPER_WRITERS.items():
        (work / "w" / name).mkdir(parents=True)
        weights[name] = str(writer(paper_arch(name, **SMALL_KWARGS[name]), work / "w" / name / fname))
    return dict(data_roots=dict(cub=str(cub), aircraft=str(air), cars=str(cars)), weights=weights,
                backbone_kwargs=dict(img_size=64, **SMALL_KWARGS))


def largest_difference(a, b) -> float:
    """The largest absolute difference between two stores' rows (numbers and lists of numbers), ``inf``
    where a text or a row count differs."""
    import numpy as np

    if len(a) != len(b) or set(a.columns) != set(b.columns):
        return float("inf")
    worst = 0.0
    for col in sorted(set(a.columns) - TIMINGS):
        for x, y in zip(a[col], b[col]):
            if isinstance(x, (list, float, int)) and not isinstance(x, bool):
                x, y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
                if x.shape != y.shape or not np.array_equal(np.isnan(x), np.isnan(y)):
                    return float("inf")
                worst = max(worst, float(np.max(np.abs(np.nan_to_num(x - y)), initial=0.0)))
            elif x != y:
                return float("inf")
    return worst


def sweep(work: Path, engine: str, datasets: list[str], backbones: list[str] | None, run: str = "") -> dict:
    """One engine's sweep of the regime grid (in this process, into a store and caches of its own named
    ``engine + run``): its wall and CPU seconds and cell count."""
    from midas_nb.study import make_grid, ProtocolCellRunner, Study
    from midas_nb.sweeps import run_sweep

    study = Study("rehearsal", progress=False, datasets=datasets,
                  **json.loads((work / "inputs.json").read_text(encoding="utf-8")))
    params = dict(study.params, **({"backbones": backbones} if backbones else {}))
    cells = make_grid(params, "regime")
    runner = ProtocolCellRunner(params, cache_dir=work / "protocol_cache" / (engine + run))
    for c in {(c.dataset, c.backbone): c for c in cells}.values():
        runner.prepare(c)                           # fine-tune (or load) each backbone: not timed
    t0, c0 = time.perf_counter(), time.process_time()
    status = run_sweep(cells, runner if engine == "grouped" else runner.__call__, work / "stores" / (engine + run))
    out = dict(wall=time.perf_counter() - t0, cpu=time.process_time() - c0, cells=len(cells))
    if not status.complete:
        raise SystemExit(f"{engine}: {status}")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--datasets", nargs="+", default=["cub", "aircraft", "cars"])
    ap.add_argument("--backbones", nargs="+", default=None, help="default: the rehearsal profile's three")
    ap.add_argument("--cub", default=str(REPO.parent / "shared" / "data" / "cub200_subset"))
    ap.add_argument("--work", default=None, help="working directory (default: a temporary one)")
    ap.add_argument("--repeats", type=int, default=2, help="runs of each engine, alternating (cells, grouped, "
                    "grouped, cells, ...); each engine's fastest CPU time counts (default 2)")
    ap.add_argument("--engine", choices=["cells", "grouped"], default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    work = Path(args.work or tempfile.mkdtemp(prefix="sweep_cost_"))
    for var, sub in (("MIDAS_RUNS_DIR", "runs"), ("MIDAS_CACHE_DIR", "cache"), ("MIDAS_FIGURES_DIR", "figures")):
        os.environ[var] = str(work / sub)
    os.environ["HF_HUB_OFFLINE"] = "1"
    if args.engine:                                  # a child: one engine, its times as JSON
        print(json.dumps(sweep(work, args.engine, args.datasets, args.backbones, args.run)))
        return
    (work / "inputs.json").write_text(json.dumps(inputs(work, Path(args.cub).resolve())), encoding="utf-8")
    times: dict[str, list[dict]] = {"cells": [], "grouped": []}
    order = [("cells", "grouped"), ("grouped", "cells")]
    for r in range(max(1, args.repeats)):           # ABBA: the load's drift falls on both engines alike
        for engine in order[r % 2]:
            cmd = [sys.executable, __file__, "--engine", engine, "--work", str(work), "--datasets", *args.datasets,
                   "--run", str(r) if r else ""]
            cmd += ["--backbones", *args.backbones] if args.backbones else []
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode:
                raise SystemExit(f"{engine} sweep failed:\n{done.stderr[-3000:]}")
            t = json.loads(done.stdout.strip().splitlines()[-1])
            times[engine].append(t)
            print(f"{engine} (run {r + 1}): {t['cells']} cells, wall {t['wall']:.1f} s, CPU {t['cpu']:.1f} s "
                  f"({t['cpu'] / t['cells']:.3f} CPU s/cell)", flush=True)
    best = {e: min(ts, key=lambda t: t["cpu"]) for e, ts in times.items()}

    from midas_nb.study import make_grid, Study
    from midas_nb.sweeps import ResultStore
    study = Study("rehearsal", progress=False, datasets=args.datasets,
                  **json.loads((work / "inputs.json").read_text(encoding="utf-8")))
    cells = make_grid(dict(study.params, **({"backbones": args.backbones} if args.backbones else {})), "regime")
    rows = {name: ResultStore(work / "stores" / name).results(cells) for name in times}
    print(f"largest difference between the rows (timings left out): "
          f"{largest_difference(rows['cells'], rows['grouped']):.3g}")
    print(f"CPU seconds (each engine's fastest run): cell by cell {best['cells']['cpu']:.1f}, "
          f"grouped {best['grouped']['cpu']:.1f}; wall-time ratio of those runs "
          f"{best['cells']['wall'] / best['grouped']['wall']:.2f}")
    print(f"ratio: {best['cells']['cpu'] / best['grouped']['cpu']:.2f}")


if __name__ == "__main__":
    main()
