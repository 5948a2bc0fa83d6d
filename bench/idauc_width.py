"""Where the width of ΔIDAUC's interval comes from: backbone builds or images (decision 0072).

Reads the cells of a result store (``RUNS/sweeps/<profile>/cells/*.json``), keeps the main point's
straight-through rows (``--depth``, ``--budget``) and prints, per condition, the ΔIDAUC point and
interval half-width of :func:`midas_nb.metrics.decoupling.decoupling_D` over every build
(builds → seeds → images) and within each build alone (seeds → images: the interval a one-build
run reports, as the README's grid did before decision 0072), then

    ratio: <mean within-build half-width / --before>

``--before``: the half-width to compare with (default 0.057: ΔIDAUC(T5) on the committed CUB run
of one build and 64 IDAUC images). A ratio ≤ 0.5 means the images now decide at half the width;
what the across-build interval adds beyond that is the run-to-run variance of the backbone.

Usage: ``python bench/idauc_width.py STORE_CELLS_DIR [--depth 6] [--budget 0.25] [--condition T5]``
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from midas_nb.metrics.decoupling import decoupling_D  # noqa: E402


def half_widths(table: pd.DataFrame) -> pd.DataFrame:
    out = decoupling_D(table, by=["dataset", "backbone", "depth", "budget"])
    out = out[out.condition != "reference"].set_index("condition")
    return pd.DataFrame({"delta_idauc": out.delta_idauc, "half_width": (out.delta_idauc_hi - out.delta_idauc_lo) / 2})


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cells", type=Path)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--condition", default="T5")
    ap.add_argument("--before", type=float, default=0.057)
    a = ap.parse_args()
    rows = [r for f in sorted(a.cells.glob("*.json")) for d in [json.loads(f.read_text())]
            if d.get("status") == "done" for r in d["rows"]]
    t = pd.DataFrame(rows)
    t = t[(t.depth == a.depth) & (t.budget == a.budget) & (t.relaxation.fillna("") != "soft")]
    t = t.assign(build=t.build.fillna(0)).drop_duplicates(["condition", "build", "seed"])
    parts = {"all builds": half_widths(t)}
    for b, tb in t.groupby("build"):
        parts[f"build {int(b)}"] = half_widths(tb.drop(columns="build"))
    print(pd.concat(parts, axis=1).round(4).to_string())
    within = sum(p.half_width[a.condition] for k, p in parts.items() if k != "all builds") / (len(parts) - 1)
    print(f"{a.condition}: half-width over builds {parts['all builds'].half_width[a.condition]:.4f}, "
          f"within one build {within:.4f} (mean of {len(parts) - 1}), before {a.before:.4f}")
    print(f"ratio: {within / a.before:.2f}")


if __name__ == "__main__":
    main()
