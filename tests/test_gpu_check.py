"""``bench/gpu_check.py`` runs small on the CPU (CI); on a CUDA machine run it with ``--device cuda``."""
from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest
import torch

SCRIPT = Path(__file__).resolve().parents[1] / "bench" / "gpu_check.py"


def _module():
    spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.mark.slow
def test_cpu_small_run_checks_every_stage_and_projects_hours(capsys):
    rc = _module().main(["--device", "cpu", "--small", "--repeats", "1", "--cell-images", "16"])
    out = capsys.readouterr().out
    assert rc == 0, out
    for check in ("capture attention A", "capture dy_c/dh", "target T2", "target T5", "pruned forward (st) softmax",
                  "pruned forward (soft) softmax", "IDAUC (T5 ranking)", "scorer step: weight update"):
        assert re.search(re.escape(check) + r".* ok$", out, re.M), check
    assert "MISMATCH" not in out and "all checks passed" in out
    hours = float(re.search(r"projected paper table .*: ([0-9.]+) h on this device", out).group(1))
    ratio = float(re.search(r"^ratio: ([0-9.]+)$", out, re.M).group(1))
    assert hours > 0 and ratio == pytest.approx(hours / 2.0, abs=5e-3)   # hours printed to 0.01
    assert "protocol cells (run_protocol" in out
    cells = re.findall(r"seed [01] \(.*\): ([0-9.e+-]+) s, projected ([0-9.e+-]+) s \(measured/projected ([0-9.]+)\)", out)
    assert len(cells) == 2 and all(float(p) > 0 for _, p, _ in cells)
    assert float(cells[1][1]) < float(cells[0][1])        # the second cell reuses the cached states and targets


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_an_error(capsys):
    assert _module().main(["--device", "cuda"]) == 2
    assert "has no CUDA device" in capsys.readouterr().err


def test_profile_projection_prices_every_paper_sweep_and_feeds_the_plan(tmp_path, monkeypatch, capsys):
    """Part (c) on the per-image timings of the last H200 measurement (docs/benchmarks.md; no timing
    here): every backbone and dataset priced, wider backbones cost more, the whole profile at the
    measured 33.0 GPU-hours, the shipped table is this projection, and a table gpu_check writes
    here is the one `sweep plan` reads, before the shipped one."""
    import argparse
    import json

    from midas_nb.sweeps.plan import SHIPPED_COST_TABLE, load_cost_table

    mod = _module()
    shipped = json.loads(SHIPPED_COST_TABLE.read_text())
    assert (shipped["device"], shipped["date"], shipped["calibration"]) == ("NVIDIA H200", "2026-12-04", 1.23)
    assert shipped["per_image_ms"] == {"block cache": 0.143, "targets": 0.905, "train": 0.127, "evaluate": 1.734,
                                       "finetune": 0.303}
    per = {k: v / 1e3 for k, v in shipped["per_image_ms"].items()}
    args = argparse.Namespace(epochs=10, finetune_epochs=30, small=True, steps=20)
    table = mod.profile_projection(per, mod.create_backbone(mod.BACKBONE, 10), args, shipped["calibration"])
    out = capsys.readouterr().out
    ti, s, b = (table["cell_s"][k] for k in mod.PAPER_WIDTHS)
    assert set(ti) == set(s) == set(b) == {"cub", "aircraft", "cars"}
    assert all(ti[d] < s[d] < b[d] for d in ti)
    for part in ("cell_s", "finetune_s"):
        for bb in mod.PAPER_WIDTHS:
            assert table[part][bb] == pytest.approx(shipped[part][bb], rel=1e-9), (part, bb)
    for name in ("02 protocol", "04 regime", "05 scale", "06 related"):
        assert name in out
    total = float(re.search(r"projected paper profile: ([0-9.]+) h on this device", out).group(1))
    assert total == pytest.approx(33.0, abs=0.15)                  # components recorded to the microsecond
    ratio = float(re.search(r"profile ratio: ([0-9.]+)$", out, re.M).group(1))
    assert ratio == pytest.approx(total / 4.0, rel=1e-3, abs=5e-3)
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path))
    assert load_cost_table()["path"] == str(SHIPPED_COST_TABLE)
    mod.write_cost_table(tmp_path / "bench" / "cell_cost.json", table, "cpu", args)
    loaded = load_cost_table()
    assert loaded["device"] == "cpu" and "says nothing about a GPU" in loaded["note"]
    assert loaded["path"] == str(tmp_path / "bench" / "cell_cost.json") and len(loaded["date"]) == 10
    assert loaded["cell_s"]["deit_small_patch16_224.fb_in1k"]["cub"] == pytest.approx(s["cub"])
