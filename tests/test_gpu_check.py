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


def test_profile_projection_prices_every_paper_sweep_and_feeds_the_plan(tmp_path, capsys):
    """Part (c) on given per-image timings (no timing here): every backbone and dataset priced,
    wider backbones cost more, and the table written is the one `sweep plan` reads."""
    import argparse

    from midas_nb.sweeps.plan import load_cost_table

    mod = _module()
    model = mod.create_backbone(mod.BACKBONE, 10, img_size=64, embed_dim=32, num_heads=2)
    per = {"block cache": 1e-3, "targets": 4e-3, "train": 2e-3, "evaluate": 2e-2, "finetune": 5e-3}
    args = argparse.Namespace(epochs=10, finetune_epochs=30, small=True, steps=20)
    table = mod.profile_projection(per, model, args)
    out = capsys.readouterr().out
    ti, s, b = (table["cell_s"][k] for k in mod.PAPER_WIDTHS)
    assert set(ti) == set(s) == set(b) == {"cub", "aircraft", "cars"}
    assert all(ti[d] < s[d] < b[d] for d in ti)
    for name in ("02 protocol", "04 regime", "05 scale", "06 related"):
        assert name in out
    total = float(re.search(r"projected paper profile: ([0-9.]+) h on this device", out).group(1))
    ratio = float(re.search(r"profile ratio: ([0-9.]+)$", out, re.M).group(1))
    assert ratio == pytest.approx(total / 4.0, rel=1e-3, abs=5e-3)
    path = tmp_path / "cell_cost.json"
    mod.write_cost_table(path, table, torch.device("cpu"), args)
    loaded = load_cost_table(path)
    assert loaded["device"] == "cpu" and "says nothing about a GPU" in loaded["note"]
    assert loaded["cell_s"]["deit_small_patch16_224.fb_in1k"]["cub"] == pytest.approx(s["cub"])
