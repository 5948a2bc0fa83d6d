"""bench/compare_runs.py, the before/after check of a refactor, on small hand-made runs: it
reports identical runs as identical, ignores only timing fields, and names every other change."""
from __future__ import annotations

import importlib.util
import json
import shutil
from pathlib import Path

import pandas as pd

REPO = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("compare_runs", REPO / "bench" / "compare_runs.py")
compare_runs = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_runs)


def _cell(tmp: Path, key: str, miou: float, duration: float) -> None:
    tmp.mkdir(parents=True, exist_ok=True)
    rec = dict(key=key, label="synthetic L=2 b=0.25 T5 s0", status="done", duration_s=duration,
               rows=[dict(condition="T5", seed=0, miou=miou, idauc=0.41, miou_per_image=[0.5, float("nan")],
                          throughput=1234.5)])
    (tmp / f"{key}.json").write_text(json.dumps(rec))


def test_store_comparison_ignores_timing_and_names_each_changed_value(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    _cell(a, "k1", 0.25, 3.0)
    _cell(b, "k1", 0.25, 9.0)                     # only the duration and nothing else differs
    assert compare_runs.compare_store(a, b) == []
    _cell(b, "k1", 0.26, 9.0)
    diffs = compare_runs.compare_store(a, b)
    assert len(diffs) == 1 and ".rows[0].miou: 0.25 != 0.26" in diffs[0]
    _cell(b, "k1", 0.25, 9.0)
    _cell(b, "k2", 0.25, 1.0)
    assert compare_runs.compare_store(a, b) == ["cell k2: only after"]
    assert compare_runs.compare_store(tmp_path / "none", b)[-1].startswith("no cells under")


def test_csv_comparison_masks_the_run_directory_and_catches_a_changed_row(tmp_path):
    a, b = tmp_path / "runA", tmp_path / "runB"
    for root in (a, b):
        (root / "tables").mkdir(parents=True)
        pd.DataFrame(dict(condition=["T5", "T1"], D_pp=[1.5, -0.5], store=[f"{root}/sweeps", f"{root}/sweeps"],
                          train_seconds=[1.0, 2.0])).to_csv(root / "tables" / "D.csv", index=False)
    roots = ([str(a)], [str(b)])
    assert compare_runs.compare_csvs(a, b, roots, "runs") == []
    pd.DataFrame(dict(condition=["T5", "T1"], D_pp=[1.5, -0.4], store=[f"{b}/sweeps"] * 2,
                      train_seconds=[5.0, 6.0])).to_csv(b / "tables" / "D.csv", index=False)
    diffs = compare_runs.compare_csvs(a, b, roots, "runs")
    assert len(diffs) == 1 and diffs[0].startswith("runs/tables/D.csv: column 'D_pp' differs in 1 rows, e.g. row 1")
    assert "-0.5" in diffs[0] and "-0.4" in diffs[0]


def _notebook(path: Path, texts: list[str]) -> None:
    cells = [dict(cell_type="code", source="x", metadata={}, execution_count=1,
                  outputs=[dict(output_type="stream", name="stdout", text=t)]) for t in texts]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(dict(cells=cells, metadata={}, nbformat=4, nbformat_minor=5)))


def test_notebook_comparison_masks_durations_but_not_results(tmp_path):
    a, b = tmp_path / "a" / "02.ipynb", tmp_path / "b" / "02.ipynb"
    _notebook(a, ["trained in 3.2 s", "D(T5) = +1.50 pp [+0.10, +2.90]"])
    _notebook(b, ["trained in 41 s", "D(T5) = +1.50 pp [+0.10, +2.90]"])
    assert compare_runs.compare_notebooks(a.parent, b.parent, ([], [])) == []
    _notebook(b, ["trained in 41 s", "D(T5) = +1.51 pp [+0.10, +2.90]"])
    diffs = compare_runs.compare_notebooks(a.parent, b.parent, ([], []))
    assert len(diffs) == 1 and diffs[0].startswith("02.ipynb code cell 1") and "+1.51" in diffs[0]
    shutil.copy(a, b)
    (a.parent / "03.ipynb").write_text(a.read_text())
    assert compare_runs.compare_notebooks(a.parent, b.parent, ([], [])) == ["03.ipynb: only before"]


def test_speed_columns_are_masked_and_the_accuracy_column_is_not():
    def table(speed: str, train: str, acc: str = "0.417 [0.167, 0.710]") -> str:
        df = pd.DataFrame({"accuracy": [acc], "img/s": ["413"], "full img/s": [speed], "speed-up": ["1.12×"],
                           "train s": [train]}, index=pd.Index(["reference"], name="method"))
        return compare_runs._mask_volatile_columns(str(df))

    assert table("370", "0.00") == table("1288", "10.05")        # throughput, speed-up, training seconds
    assert table("370", "0.00") != table("370", "0.00", acc="0.418 [0.167, 0.710]")
    # a rule's width follows its column's widest value (a masked path); the rule is not a result
    assert compare_runs._MASKS[-1][0].sub("---", "ab ------ c") == "ab --- c"
