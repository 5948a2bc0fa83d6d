"""Compare two smoke runs (before / after a refactor): result store, CSV tables, report, notebooks.

Usage::

    python bench/compare_runs.py --before DIR/{runs,fig,nb}_before --after ...   # see --help
    python bench/compare_runs.py --revisions HEAD~3            # runs both: HEAD~3 vs the working tree
    python bench/compare_runs.py --revisions main my-branch    # two revisions

With ``--revisions`` the smoke runs are made here: each revision is checked out in a temporary
git worktree (the working tree for a missing second one) and run with its own empty cache.

Each run is three directories written by ``midas-nb run --profile smoke --output NB`` with
``MIDAS_RUNS_DIR=RUNS MIDAS_FIGURES_DIR=FIG``. Four comparisons, each printed as one line
``<part>: identical`` or the differences:

1. the result store ``RUNS/sweeps/<profile>/cells/*.json``: the same cell keys; per record every
   field and every row value (metrics, intervals, per-image values) except timing, host and
   time-stamp fields (:data:`VOLATILE`);
2. every CSV under ``RUNS`` and ``FIG`` (matched by relative path), the same columns left out;
3. the tables ``midas-nb report`` builds from each store, computed by the code installed now;
4. the text/plain and stream outputs of every notebook cell, after masking durations, rates,
   temporary directories and memory addresses.

Floats are compared exactly (NaN equals NaN). Exit status 0 when all four are identical.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pandas as pd

#: record fields and row/table columns that measure time, speed or the machine, not a result
VOLATILE = {"started", "finished", "duration_s", "host", "pid", "throughput", "throughput_full", "speedup",
            "throughput_llf", "llf_speed_ratio", "train_seconds", "seconds", "wall_s", "elapsed_s", "generated",
            "created", "img/s", "speed-up", "digest"}   # a record's digest covers its time stamps


def _norm(x: Any) -> Any:
    if isinstance(x, float) and math.isnan(x):
        return "NaN"
    if isinstance(x, dict):
        return {k: _norm(v) for k, v in x.items() if k not in VOLATILE}
    if isinstance(x, list):
        return [_norm(v) for v in x]
    return x


def _diff(a: Any, b: Any, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = [f"{path}.{k}: only in {'before' if k in a else 'after'}" for k in sorted(set(a) ^ set(b))]
        for k in sorted(set(a) & set(b)):
            out += _diff(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        out = []
        for i, (x, y) in enumerate(zip(a, b)):
            out += _diff(x, y, f"{path}[{i}]")
        return out
    return [] if a == b else [f"{path}: {str(a)[:120]} != {str(b)[:120]}"]


def compare_store(before: Path, after: Path) -> list[str]:
    ka = {p.stem: p for p in before.glob("*.json")}
    kb = {p.stem: p for p in after.glob("*.json")}
    out = [f"cell {k}: only before" for k in sorted(set(ka) - set(kb))]
    out += [f"cell {k}: only after" for k in sorted(set(kb) - set(ka))]
    for k in sorted(set(ka) & set(kb)):
        ra = _norm(json.loads(ka[k].read_text()))
        rb = _norm(json.loads(kb[k].read_text()))
        out += [f"cell {k} ({ra.get('label')}){d}" for d in _diff(ra, rb)]
    if not ka:
        out.append(f"no cells under {before}")
    return out


def _frame_diff(a: pd.DataFrame, b: pd.DataFrame, name: str) -> list[str]:
    a = a[[c for c in a.columns if c not in VOLATILE]]
    b = b[[c for c in b.columns if c not in VOLATILE]]
    if list(a.columns) != list(b.columns):
        return [f"{name}: columns {sorted(set(a.columns) ^ set(b.columns))} differ "
                f"(or their order)"]
    if a.shape != b.shape:
        return [f"{name}: shape {a.shape} != {b.shape}"]
    out = []
    for c in a.columns:
        x, y = a[c], b[c]
        same = (x == y) | (x.isna() & y.isna())
        if not bool(same.all()):
            i = int((~same).values.argmax())
            out.append(f"{name}: column {c!r} differs in {int((~same).sum())} rows, e.g. row {i}: "
                       f"{x.iloc[i]!r} != {y.iloc[i]!r}")
    return out


def _mask_paths(s: str, roots: list[str]) -> str:
    for r in roots:
        s = s.replace(r, "<DIR>")
    return s


def compare_csvs(before: Path, after: Path, roots: tuple[list[str], list[str]], name: str) -> list[str]:
    fa = {p.relative_to(before) for p in before.rglob("*.csv")}
    fb = {p.relative_to(after) for p in after.rglob("*.csv")}
    out = [f"{name}/{f}: only before" for f in sorted(fa - fb)]
    out += [f"{name}/{f}: only after" for f in sorted(fb - fa)]
    for f in sorted(fa & fb):
        a = pd.read_csv(before / f, keep_default_na=True)
        b = pd.read_csv(after / f, keep_default_na=True)
        for df, r in ((a, roots[0]), (b, roots[1])):
            for c in df.columns:
                if df[c].dtype == object or pd.api.types.is_string_dtype(df[c]):
                    df[c] = df[c].map(lambda v: _mask_paths(v, r) if isinstance(v, str) else v)
        out += _frame_diff(a, b, f"{name}/{f}")
    return out


def run_report(runs: Path, profile: str, out: Path) -> None:
    env = dict(os.environ, MIDAS_RUNS_DIR=str(runs))
    subprocess.run([sys.executable, "-m", "midas_nb.cli", "report", "--profile", profile,
                    "--store", str(runs / "sweeps" / profile), "--output", str(out), "--allow-incomplete"],
                   check=True, env=env, stdout=subprocess.DEVNULL)


_MASKS = [
    (re.compile(r"\d+(\.\d+)?\s*(s|ms|min|sec|seconds|it/s|s/it|img/s|images/s)\b"), "<T>"),
    (re.compile(r"0x[0-9a-f]{6,}"), "<ADDR>"),
    (re.compile(r"(throughput|speedup|train_seconds)[^\n]*"), r"\1 <T>"),
    (re.compile(r"-{3,}"), "---"),    # a rule's width follows its column's widest value (a path)
]


def _mask_volatile_columns(text: str) -> str:
    """Blank the values under a volatile column of a printed DataFrame (pandas right-aligns a
    column's values to its header's end; a wide frame prints in blocks, each with a header)."""
    lines = text.split("\n")
    spans: list[tuple[int, int]] = []
    for k, line in enumerate(lines):
        toks = list(re.finditer(r"\S+", line))
        words = [t.group() for t in toks]
        heads = {i: i - 1 for i, w in enumerate(words) if w in VOLATILE}      # column i starts after token i-1
        heads.update({i: i - 2 for i in range(1, len(words)) if words[i - 1:i + 1] == ["train", "s"]})
        if heads:
            spans = [(toks[j].end() if j >= 0 else 0, toks[i].end()) for i, j in sorted(heads.items())]
            continue
        if not line.strip():
            spans = []
        for a, b in spans:
            if len(line) > a:
                line = line[:a] + " " * (min(b, len(line)) - a) + line[b:]
        lines[k] = line
    return "\n".join(lines)


def notebook_texts(path: Path, roots: list[str]) -> list[str]:
    nb = json.loads(path.read_text())
    texts = []
    for cell in nb["cells"]:
        if cell.get("cell_type") != "code":
            continue
        parts: list[list[str]] = []            # [name, text]; consecutive chunks of one stream merged
        for o in cell.get("outputs", []):
            if o.get("output_type") == "stream":
                if parts and parts[-1][0] == o["name"]:
                    parts[-1][1] += "".join(o.get("text", ""))
                else:
                    parts.append([o["name"], "".join(o.get("text", ""))])
            elif "data" in o and "text/plain" in o["data"]:
                parts.append(["", "".join(o["data"]["text/plain"])])
        s = _mask_paths("\n".join(f"{n}: {t}" if n else t for n, t in parts), roots)
        s = _mask_volatile_columns(s)
        for rx, rep in _MASKS:
            s = rx.sub(rep, s)
        texts.append(re.sub(r"[ \t]+", " ", s).strip())
    return texts


def compare_notebooks(before: Path, after: Path, roots: tuple[list[str], list[str]]) -> list[str]:
    out = []
    for pa in sorted(before.glob("*.ipynb")):
        pb = after / pa.name
        if not pb.exists():
            out.append(f"{pa.name}: only before")
            continue
        ta, tb = notebook_texts(pa, roots[0]), notebook_texts(pb, roots[1])
        if len(ta) != len(tb):
            out.append(f"{pa.name}: {len(ta)} code cells != {len(tb)}")
            continue
        for i, (x, y) in enumerate(zip(ta, tb)):
            if x != y:
                xl, yl = x.splitlines(), y.splitlines()
                j = next((j for j, (u, v) in enumerate(zip(xl, yl)) if u != v), min(len(xl), len(yl)))
                out.append(f"{pa.name} code cell {i}: line {j}: {(xl[j] if j < len(xl) else '<end>')[:150]!r} "
                           f"!= {(yl[j] if j < len(yl) else '<end>')[:150]!r}")
    return out


def smoke_run(revision: str | None, work: Path, profile: str) -> list[str]:
    """``midas-nb run --profile PROFILE`` of ``revision`` (``None``: the working tree) into
    ``work``, with its own empty cache; ``[RUNS, FIG, NB]`` for ``--before`` / ``--after``."""
    root = Path(__file__).resolve().parents[1]
    tree = root
    if revision is not None:
        tree = work / "tree"
        subprocess.run(["git", "-C", str(root), "worktree", "add", "--detach", str(tree), revision], check=True,
                       stdout=subprocess.DEVNULL)
    dirs = [str(work / d) for d in ("runs", "fig", "nb")]
    env = dict(os.environ, PYTHONPATH=str(tree), MIDAS_RUNS_DIR=dirs[0], MIDAS_FIGURES_DIR=dirs[1],
               MIDAS_CACHE_DIR=str(work / "cache"))
    print(f"smoke run of {revision or 'the working tree'} ...", flush=True)
    subprocess.run([sys.executable, "-m", "midas_nb.cli", "run", "--profile", profile, "--output", dirs[2]],
                   cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL)
    return dirs


def compare_runs(before: list[Path], after: list[Path], profile: str, masks: tuple[list[str], list[str]]) -> int:
    """The four comparisons of two runs (``[RUNS, FIG, NB]`` each), printed; 0 when identical."""
    rb, fb, nbb = before
    ra, fa, nba = after
    roots = ([str(p) for p in before] + masks[0], [str(p) for p in after] + masks[1])
    parts: dict[str, list[str]] = {}
    parts["1 result store"] = compare_store(rb / "sweeps" / profile / "cells", ra / "sweeps" / profile / "cells")
    parts["2 CSV tables"] = compare_csvs(rb, ra, roots, "runs") + compare_csvs(fb, fa, roots, "figures")
    with tempfile.TemporaryDirectory() as tmp:
        run_report(rb, profile, Path(tmp) / "before")
        run_report(ra, profile, Path(tmp) / "after")
        parts["3 report tables"] = compare_csvs(Path(tmp) / "before", Path(tmp) / "after", roots, "report")
    parts["4 notebook outputs"] = compare_notebooks(nbb, nba, roots)
    n_cells = len(list((rb / "sweeps" / profile / "cells").glob("*.json")))
    print(f"({n_cells} store cells before)")
    for name, diffs in parts.items():
        print(f"{name}: " + ("identical" if not diffs else f"{len(diffs)} difference(s)"))
        for d in diffs[:40]:
            print("   ", d)
    return 0 if not any(parts.values()) else 1


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0], allow_abbrev=False)
    for side in ("before", "after"):
        ap.add_argument(f"--{side}", nargs=3, metavar=("RUNS", "FIG", "NB"))
    ap.add_argument("--revisions", nargs="+", metavar="REV", help="make both runs: BEFORE [AFTER] (git revisions)")
    ap.add_argument("--profile", default="smoke")
    ap.add_argument("--mask-before", nargs="*", default=[], metavar="PATH",
                    help="further paths of the before run shown in outputs (cache dir, source tree), masked")
    ap.add_argument("--mask-after", nargs="*", default=[], metavar="PATH", help="the same for the after run")
    args = ap.parse_args(argv)
    masks = (list(args.mask_before), list(args.mask_after))
    if not args.revisions:
        if not (args.before and args.after):
            ap.error("give --before and --after (three folders each), or --revisions")
        return compare_runs([Path(p) for p in args.before], [Path(p) for p in args.after], args.profile, masks)
    if len(args.revisions) > 2 or args.before or args.after:
        ap.error("--revisions takes BEFORE [AFTER] and replaces --before/--after")
    root = Path(__file__).resolve().parents[1]
    with tempfile.TemporaryDirectory(prefix="midas-compare-") as tmp:
        work = [Path(tmp) / "before", Path(tmp) / "after"]
        try:
            sides = [smoke_run(rev, w, args.profile) for rev, w in zip(list(args.revisions) + [None], work)]
            return compare_runs([Path(p) for p in sides[0]], [Path(p) for p in sides[1]], args.profile,
                                (masks[0] + [str(work[0]), str(root)], masks[1] + [str(work[1]), str(root)]))
        finally:
            for w in work:
                if (w / "tree").exists():
                    subprocess.run(["git", "-C", str(root), "worktree", "remove", "--force", str(w / "tree")],
                                   check=False)


if __name__ == "__main__":
    sys.exit(main())
