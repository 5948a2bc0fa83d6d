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
    assert "one protocol cell (run_protocol" in out


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda_is_an_error(capsys):
    assert _module().main(["--device", "cuda"]) == 2
    assert "has no CUDA device" in capsys.readouterr().err
