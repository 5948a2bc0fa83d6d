"""Does a change keep every number? The smoke profile run at two revisions, compared.

A restructuring must leave every result unchanged. This runs ``midas-nb run --profile smoke`` and
``midas-nb report --profile smoke`` at ``BEFORE`` (a git revision, checked out in a temporary
worktree) and at ``AFTER`` (a revision, or the working tree when omitted), each with its own empty
cache and runs folder, and compares:

- the result store: the same cell keys, and in every cell the same rows, column by column (the
  columns that measure time or name the machine are left out: ``VARYING_COLUMNS``);
- the report: every CSV table cell by cell (provenance rows that name paths, versions or run ids
  are left out: ``VARYING_SETTINGS``).

    python bench/equivalence.py HEAD~3            # HEAD~3 against the working tree
    python bench/equivalence.py main my-branch     # two revisions

Prints one line per difference and ``equivalent: yes`` / ``equivalent: no`` last; exit status 1
when anything differs. Two runs at one revision on one machine are identical (the caches are
content-keyed and training is seeded), so any difference is the change's.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
#: row columns that measure time, count cache hits or name the machine
VARYING_COLUMNS = {"throughput", "throughput_full", "speedup", "train_seconds", "from_cache", "versions", "device"}
#: provenance settings that name paths, run ids or package versions
VARYING_SETTINGS = {"result store", "versions", "test split fingerprint", "train split fingerprint"}


def _run(tree: Path, work: Path) -> tuple[Path, Path]:
    """Run the smoke notebooks and the report from ``tree`` into ``work``; (store, report dir)."""
    env = dict(os.environ, PYTHONPATH=str(tree), MIDAS_CACHE_DIR=str(work / "cache"),
               MIDAS_RUNS_DIR=str(work / "runs"), MIDAS_FIGURES_DIR=str(work / "figures"))
    cli = [sys.executable, "-m", "midas_nb.cli"]
    for args in (["run", "--profile", "smoke", "--output", str(work / "notebooks")],
                 ["report", "--profile", "smoke", "--output", str(work / "report")]):
        print(f"[{tree.name}] midas-nb {' '.join(args[:3])}", flush=True)
        subprocess.run(cli + args, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return work / "runs" / "sweeps" / "smoke", work / "report"


def _cells(store: Path) -> dict[str, list[dict[str, Any]]]:
    out = {}
    for f in sorted((store / "cells").glob("*.json")):
        rec = json.loads(f.read_text())
        out[str(rec["key"])] = [{k: v for k, v in r.items() if k not in VARYING_COLUMNS} for r in rec.get("rows") or []]
    return out


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def compare(before: tuple[Path, Path], after: tuple[Path, Path]) -> list[str]:
    """Every difference between two (store, report dir) pairs, one line each."""
    diffs: list[str] = []
    a, b = _cells(before[0]), _cells(after[0])
    diffs += [f"store: cell {k} only before" for k in sorted(set(a) - set(b))]
    diffs += [f"store: cell {k} only after" for k in sorted(set(b) - set(a))]
    for k in sorted(set(a) & set(b)):
        if len(a[k]) != len(b[k]):
            diffs.append(f"store: cell {k}: {len(a[k])} rows before, {len(b[k])} after")
            continue
        for i, (ra, rb) in enumerate(zip(a[k], b[k])):
            cols = sorted(set(ra) | set(rb))
            diffs += [f"store: cell {k} row {i} column {c}: {ra.get(c)!r} -> {rb.get(c)!r}"
                      for c in cols if not _same(ra.get(c), rb.get(c))]
    for csv in sorted({p.name for p in before[1].glob("*.csv")} | {p.name for p in after[1].glob("*.csv")}):
        pa, pb = before[1] / csv, after[1] / csv
        if not (pa.is_file() and pb.is_file()):
            diffs.append(f"report: {csv} only {'before' if pa.is_file() else 'after'}")
            continue
        ta, tb = pd.read_csv(pa, dtype=str), pd.read_csv(pb, dtype=str)
        if "setting" in ta.columns:
            ta, tb = (t[~t["setting"].isin(VARYING_SETTINGS)].reset_index(drop=True) for t in (ta, tb))
        if list(ta.columns) != list(tb.columns) or len(ta) != len(tb):
            diffs.append(f"report: {csv}: shape {ta.shape} {list(ta.columns)} -> {tb.shape} {list(tb.columns)}")
            continue
        rows, cols = (~((ta == tb) | (ta.isna() & tb.isna()))).to_numpy().nonzero()
        diffs += [f"report: {csv} row {i} column {ta.columns[j]}: {ta.iat[i, j]!r} -> {tb.iat[i, j]!r}"
                  for i, j in zip(rows.tolist(), cols.tolist())]
    return diffs


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("before", help="git revision of the reference run")
    ap.add_argument("after", nargs="?", help="git revision to compare (default: the working tree)")
    ap.add_argument("--work-dir", help="keep the runs here (default: a temporary folder, removed)")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="midas-equivalence-", dir=args.work_dir) as tmp:
        tmp = Path(tmp)
        trees = []
        for name, rev in (("before", args.before), ("after", args.after)):
            if rev is None:
                trees.append((name, ROOT))
                continue
            wt = tmp / name / "tree"
            subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(wt), rev], check=True,
                           stdout=subprocess.DEVNULL)
            trees.append((name, wt))
        try:
            results = [_run(tree, tmp / name) for name, tree in trees]
        finally:
            for name, tree in trees:
                if tree != ROOT:
                    subprocess.run(["git", "-C", str(ROOT), "worktree", "remove", "--force", str(tree)], check=False)
        diffs = compare(*results)
    for line in diffs:
        print(line)
    print(f"equivalent: {'no' if diffs else 'yes'} ({len(diffs)} differences)")
    return 1 if diffs else 0


if __name__ == "__main__":
    sys.exit(main())
