"""Submitting a sweep without waiting, from a machine without the jobs' GPU (issue 30, cases 1 and 4),
and the ``midas-nb sweep submit | plan`` commands. A fake submitit executor records what would
reach Slurm, so nothing here needs a cluster (``tests/test_slurm.py`` has the real one)."""
from __future__ import annotations

import contextlib
import re

import cloudpickle
import pytest
import torch

from midas_nb import config


class FakeJob:
    def __init__(self, job_id: str, fn, args) -> None:
        self.job_id, self.fn, self.args = job_id, fn, args

    def exception(self):
        return None


class FakeExecutor:
    """Stands for submitit's ``AutoExecutor`` on Slurm: records every submission, runs nothing."""

    def __init__(self) -> None:
        self.jobs: list[FakeJob] = []
        self.params: dict = {}
        self.arrays = 0
        self.task = 0

    def update_parameters(self, **kw) -> None:
        self.params.update(kw)

    @contextlib.contextmanager
    def batch(self):
        self.arrays += 1
        self.task = 0
        yield

    def submit(self, fn, *args) -> FakeJob:
        job = FakeJob(f"{100 + self.arrays}_{self.task}", fn, args)
        self.task += 1
        self.jobs.append(job)
        return job


@pytest.fixture
def fake_slurm(monkeypatch, tmp_path):
    ex = FakeExecutor()

    def executor(folder, cluster, params):
        ex.update_parameters(**params)
        return ex, "slurm"

    monkeypatch.setattr("midas_nb.sweeps.slurm.slurm_executor", executor)
    monkeypatch.setattr("midas_nb.sweeps.slurm.max_array_size", lambda default=1001: 3)
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    return ex


def _no_cuda_here():
    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the login-node case needs one without")


def test_study_sweep_wait_false_returns_the_submission(fake_slurm):
    from midas_nb import Study
    from midas_nb.study import make_grid
    from midas_nb.sweeps import ResultStore, Submission

    study = Study("smoke", progress=False)
    sub = study.sweep("regime", executor="slurm", wait=False, partition="gpu", cells_per_job=2)
    assert isinstance(sub, Submission)
    grid = make_grid(study.params, "regime")
    assert [c.key for c in sub.cells] == [c.key for c in grid] and sub.skipped == 0
    cell_jobs = [j for j in fake_slurm.jobs if j.fn.__name__ == "run_chunk"]
    assert sub.job_ids == [j.job_id for j in cell_jobs]                        # what reached the scheduler
    assert sorted(k for ks in sub.jobs.values() for k in ks) == sorted(c.key for c in grid)
    assert all(len(ks) <= 2 for ks in sub.jobs.values())                       # cells_per_job
    assert sub.preparation == [j.job_id for j in fake_slurm.jobs if j.fn.__name__ == "prepare_group"]
    assert fake_slurm.params["slurm_partition"] == "gpu" and "wait" not in fake_slurm.params
    assert ResultStore(sub.store).jobs() == {k: j for j, ks in sub.jobs.items() for k in ks}
    assert all(ResultStore(sub.store).read(c.key) is None for c in grid)       # nothing computed here
    assert "submitted" in str(sub) and sub.job_ids[0].split("_")[0] in str(sub)


def test_wait_false_needs_slurm():
    from midas_nb import Study

    study = Study("smoke", progress=False)
    with pytest.raises(ValueError, match="executor='slurm'"):
        study.sweep(executor="local", wait=False)


def test_login_node_submission_carries_cuda_unresolved(fake_slurm, monkeypatch):
    """Case 4: the profile asks for cuda, the login node has none and follows the advice
    (device='cpu'); the jobs still get 'cuda', keyed with the GPU's numerics."""
    _no_cuda_here()
    from midas_nb import Study
    from midas_nb.backbones import checkpoint_key

    monkeypatch.setitem(config.PROFILES["smoke"], "device", "cuda")
    with pytest.raises(config.ProfileError, match="no CUDA device"):
        Study("smoke", progress=False)
    study = Study("smoke", device="cpu", progress=False)          # the advice
    sub = study.sweep("regime", executor="slurm", wait=False)
    runner = cloudpickle.loads((sub.store / "submitit" / "runner.pkl").read_bytes())
    assert runner.profile["device"] == "cuda" and runner.device is None
    sent = [j.args[1] for j in fake_slurm.jobs]                   # (cells, cell_fn, root) / (cell, cell_fn)
    assert sent and all(fn.profile["device"] == "cuda" for fn in sent)
    # the cells name the checkpoint the GPU node trains (bfloat16 autocast), not this CPU's
    want = checkpoint_key(study.params["backbone"], study.train_set, study.test_set,
                          **dict(study._finetune_args(), device="cuda"))[0]
    assert {c.checkpoint_id for c in sub.cells} == {want} != {study.checkpoint_id}
    # the local executor still refuses cuda here, before anything runs
    with pytest.raises(config.ProfileError, match="no CUDA device"):
        study.sweep("regime", executor="local", device="cuda")


def test_cuda_numerics_keyed_off_the_gpu_match_a_bfloat16_gpu(monkeypatch):
    _no_cuda_here()
    from midas_nb.backbones import _training_numerics

    here = _training_numerics("cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert _training_numerics("cuda", None) == here and here["precision"] == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert _training_numerics("cuda", None)["precision"] == "float16"    # such a node refuses the cells


def test_worker_without_the_gpu_fails_with_its_host(monkeypatch):
    _no_cuda_here()
    from midas_nb.study import ProtocolCellRunner
    from midas_nb.sweeps import SweepCell

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    runner = ProtocolCellRunner(config.get_profile("smoke", device="cuda"))
    cell = SweepCell("synthetic", "vit_smoke", 1, 0.25, "reference", 0)
    with pytest.raises(RuntimeError, match=r"Slurm job 4242\) cannot run the sweep's device 'cuda'.*--gpus"):
        runner(cell)
