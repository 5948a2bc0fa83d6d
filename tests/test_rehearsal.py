"""The CPU rehearsal of the paper run (issue 14): the paper profile's grid shape — CUB, and
format-true FGVC-Aircraft and Stanford Cars directories built from the CUB photos; DeiT-Ti/S and
AugReg ViT-B by their timm names with 12 blocks (narrower), loaded from local files in the DeiT
release ``.pth``, timm ``.safetensors`` and AugReg ``.npz`` layouts; every L and b of the paper
grid; every condition; two seeds — with tiny image counts and sizes, all 8 notebooks through
``midas-nb run`` (the real command line, no network), ending with the paper-shaped table."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import yaml

from midas_nb.data import make_aircraft_from_cub, make_cars_from_cub
from midas_nb.analysis.paper_reference import PAPER_D_T5
from midas_nb.runs import run_state

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weight_files import PAPER_WRITERS, SMALL_KWARGS, paper_arch  # noqa: E402

REPO = Path(__file__).resolve().parents[1]
BACKBONES = list(PAPER_WRITERS)


@pytest.mark.slow
@pytest.mark.real_data
def test_rehearsal_of_the_paper_run(shared_data, tmp_path):
    cub = shared_data / "cub200_subset"
    air = make_aircraft_from_cub(cub, tmp_path / "fgvc-aircraft-2013b", num_classes=4, per_split=(2, 1, 2))
    cars = make_cars_from_cub(cub, tmp_path / "stanford_cars", num_classes=4, per_split=(2, 2))
    weights = {}
    for name, (fname, writer) in PAPER_WRITERS.items():
        (tmp_path / "w" / name).mkdir(parents=True)
        weights[name] = writer(paper_arch(name, **SMALL_KWARGS[name]), tmp_path / "w" / name / fname)
    run_file = tmp_path / "run.yaml"
    run_file.write_text(yaml.safe_dump(dict(profile="rehearsal", device="cpu", params=dict(
        backbone_kwargs=dict(img_size=64, **SMALL_KWARGS)))))
    runs, cache = tmp_path / "runs", tmp_path / "cache"
    env = dict(os.environ, MIDAS_RUNS_DIR=str(runs), MIDAS_CACHE_DIR=str(cache),
               MIDAS_FIGURES_DIR=str(tmp_path / "figures"), HF_HUB_OFFLINE="1", HF_HOME=str(tmp_path / "hf"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    cmd = [sys.executable, "-m", "midas_nb.cli", "run", "--config", str(run_file), "--no-progress",
           "--data-root", f"cub={cub}", "--data-root", f"aircraft={air}", "--data-root", f"cars={cars}"]
    cmd += [a for n, w in weights.items() for a in ("--weights", f"{n}={w}")]
    t0 = time.time()
    r = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200, cwd=str(tmp_path))
    took = time.time() - t0
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    print(f"rehearsal: {took:.0f} s")

    out = runs / "rehearsal"
    states = run_state(out).notebooks
    assert len(states) == 8 and all(s.state == "current" for s in states), states
    assert len({s.run_id for s in states}) == 1

    # every weights file was loaded through the run's path: each fine-tuned checkpoint names its file
    metas = [json.loads(p.read_text()) for p in (cache / "checkpoints").rglob("*.json")]
    metas = [m for m in metas if isinstance(m.get("backbone"), dict) and m["backbone"].get("name") in weights]
    assert len(metas) == 9                                     # one fine-tune per dataset x backbone
    for m in metas:
        assert Path(str(m["weights"])).name == Path(weights[m["backbone"]["name"]]).name
        assert m["backbone"]["depth"] == 12
        assert m["backbone"]["embed_dim"] == SMALL_KWARGS[m["backbone"]["name"]]["embed_dim"]

    # the paper grid's shape: 3 datasets x 3 backbones, every L and b, every condition, 2 seeds
    from midas_nb.sweeps import ResultStore
    rows = ResultStore(runs / "sweeps" / "rehearsal").results()
    assert set(rows["dataset"]) == {"cub", "aircraft", "cars"} and set(rows["backbone"]) == set(BACKBONES)
    assert {3, 6, 9, 11} <= set(rows["depth"]) and {0.1, 0.25, 0.5, 0.75} <= set(rows["budget"].round(6))
    assert {"reference", "unsupervised", "T1", "T2", "T3", "T4", "T5"} <= set(rows["condition"])
    assert set(rows["seed"]) == {0, 1}
    kinds = rows.groupby("dataset")["coverage_kind"].unique()
    assert list(kinds["cub"]) == ["part mIoU"]
    assert list(kinds["aircraft"]) == ["box coverage"] and list(kinds["cars"]) == ["box coverage"]

    # the paper-shaped table: a block per dataset x backbone, the paper's values beside DeiT-S's
    table = pd.read_csv(runs / "tables" / "paper_table_rehearsal.csv")
    blocks = list(dict.fromkeys(zip(table["dataset"], table["backbone"])))
    assert blocks == [(d, b) for d in ("cub", "aircraft", "cars") for b in BACKBONES]
    for (d, b), g in table.groupby(["dataset", "backbone"]):
        assert list(g["condition"]) == ["reference", "T1", "T5"]
        assert g["miou"].between(0, 1).all() and g["idauc"].between(-1, 1).all()
        assert set(g["coverage_kind"]) == {"part mIoU" if d == "cub" else "box coverage"}
        t5 = g[g["condition"] == "T5"].iloc[0]
        if b == "deit_small_patch16_224.fb_in1k":
            assert t5["paper_D_pp"] == pytest.approx(PAPER_D_T5[d]["D_pp"])
            assert t5["paper_delta_idauc"] == pytest.approx(PAPER_D_T5[d]["delta_idauc"])
        else:
            assert math.isnan(t5["paper_D_pp"])
    assert "The paper-shaped table" in r.stdout and "aircraft × vit_base_patch16_224.augreg_in21k_ft_in1k" in r.stdout


@pytest.mark.slow
@pytest.mark.real_data
def test_quickstart_on_a_dataset_without_part_keypoints_shows_boxes(shared_data, tmp_path):
    """Issue 14, case 4: notebook 00 on FGVC-Aircraft (no part keypoints) shows the object boxes
    and box coverage instead of failing on "no visible part patch"."""
    import nbformat

    air = make_aircraft_from_cub(shared_data / "cub200_subset", tmp_path / "fgvc-aircraft-2013b",
                                 num_classes=4, per_split=(2, 1, 2))
    env = dict(os.environ, MIDAS_RUNS_DIR=str(tmp_path / "runs"), MIDAS_FIGURES_DIR=str(tmp_path / "figures"),
               PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep))
    r = subprocess.run([sys.executable, "-m", "midas_nb.cli", "run", "--profile", "smoke", "--dataset", "aircraft",
                        "--data-root", str(air), "--notebooks", "00", "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=600, cwd=str(tmp_path))
    assert r.returncode == 0, (r.stdout[-3000:], r.stderr[-3000:])
    nb = nbformat.read(str(tmp_path / "runs" / "smoke" / "00_quickstart.ipynb"), as_version=4)
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "box patches cover" in text and "part patches cover" not in text
    html = "".join(str(o.get("data", {}).get("text/html", "")) for c in nb.cells if c.cell_type == "code"
                   for o in c.get("outputs", []))
    assert "none (box coverage)" in html                                      # the study summary says so
    assert (tmp_path / "figures" / "00_quickstart_parts_on_grid.png").stat().st_size > 5_000
