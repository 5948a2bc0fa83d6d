"""bench/equivalence.py's comparison: what it ignores (timings, paths) and what it reports (any
other value of a stored row or a report table)."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pandas as pd

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "equivalence.py"


def _module():
    spec = importlib.util.spec_from_file_location("equivalence", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def _side(root: Path, miou: float, seconds: float, store_path: str) -> tuple[Path, Path]:
    (root / "store" / "cells").mkdir(parents=True)
    rows = [dict(condition="T5", miou=miou, idauc=float("nan"), train_seconds=seconds)]
    (root / "store" / "cells" / "k1.json").write_text(json.dumps(dict(key="k1", rows=rows)))
    (root / "report").mkdir()
    pd.DataFrame(dict(dataset=["cub", ""], setting=["coverage", "result store"],
                      value=["part mIoU", store_path])).to_csv(root / "report" / "provenance.csv", index=False)
    pd.DataFrame(dict(condition=["T5"], miou=[miou])).to_csv(root / "report" / "three_conditions.csv", index=False)
    return root / "store", root / "report"


def test_equal_runs_differ_only_in_time_and_paths(tmp_path):
    eq = _module()
    a = _side(tmp_path / "a", 0.25, 1.0, "/tmp/a/store")
    b = _side(tmp_path / "b", 0.25, 9.0, "/tmp/b/store")
    assert eq.compare(a, b) == []


def test_a_changed_value_is_reported_in_the_store_and_the_report(tmp_path):
    eq = _module()
    a = _side(tmp_path / "a", 0.25, 1.0, "/x")
    b = _side(tmp_path / "b", 0.5, 1.0, "/x")
    assert eq.compare(a, b) == ["store: cell k1 row 0 column miou: 0.25 -> 0.5",
                                "report: three_conditions.csv row 0 column miou: '0.25' -> '0.5'"]
    (tmp_path / "b" / "store" / "cells" / "k1.json").rename(tmp_path / "b" / "store" / "cells" / "k2.json")
    rec = json.loads((tmp_path / "b" / "store" / "cells" / "k2.json").read_text())
    (tmp_path / "b" / "store" / "cells" / "k2.json").write_text(json.dumps(dict(rec, key="k2")))
    assert eq.compare(a, b)[:2] == ["store: cell k1 only before", "store: cell k2 only after"]
