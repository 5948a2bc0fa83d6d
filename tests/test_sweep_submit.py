"""Submitting a sweep without waiting, from a machine without the jobs' GPU (issue 30, cases 1 and 4),
and the ``midas-nb sweep submit | plan`` commands. A fake submitit executor records what would
reach Slurm, so nothing here needs a cluster (``tests/test_slurm.py`` has the real one)."""
from __future__ import annotations

import contextlib
import re

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

    monkeypatch.setattr("midas_nb.sweeps.executors.slurm_executor", executor)
    monkeypatch.setattr("midas_nb.sweeps.executors.max_array_size", lambda default=1001: 3)
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
    sent = [j.args[1] for j in fake_slurm.jobs]                   # (cells, cell_fn, root) / (cell, cell_fn)
    assert sent and all(fn.profile["device"] == "cuda" for fn in sent)
    # the cells name the checkpoint the GPU node trains (bfloat16 autocast), not this CPU's
    b = study.settings.backbone
    want = checkpoint_key(b.name, study.train_set, study.test_set, b.recipe, weights=b.weights,
                          backbone_kwargs=dict(b.kwargs) or None, device="cuda")[0]
    assert {c.checkpoint_id for c in sub.cells} == {want} != {study.checkpoint_id}
    # the local executor still refuses cuda here, before anything runs
    with pytest.raises(config.ProfileError, match="no CUDA device"):
        study.sweep("regime", executor="local", device="cuda")


def test_the_same_submit_again_sends_only_the_cells_nothing_holds(fake_slurm, monkeypatch, capsys):
    """Decision 0078: `sweep submit` run again (no resubmit command) sends every cell of the grid that is not done,
    not held by a process and has no job in the queue: a lost job's cell, a failed cell, a cell never sent."""
    import time

    from midas_nb import cli
    from midas_nb.study import make_grid, ProtocolCellRunner
    from midas_nb.sweeps import ResultStore, submit_sweep

    cells = make_grid(config.get_profile("smoke"), "regime")
    assert len(cells) >= 6
    store = ResultStore(config.runs_dir() / "sweeps" / "smoke")
    submit_sweep(cells[:-1], ProtocolCellRunner(config.get_profile("smoke")), store, slurm=dict(cells_per_job=1))
    jobs = store.jobs()          # the last cell was never sent; the others' jobs left the queue (lost) but:
    monkeypatch.setattr("midas_nb.sweeps.slurm.scheduler_states", lambda ids: {jobs[cells[0].key]: "PENDING"})
    store.record_failed(cells[1], "RuntimeError: boom", started=time.time())
    store.record_done(cells[2], [dict(metric="m", value=1.0)], started=time.time())
    fd = store.hold(cells[3].key)                                 # a live worker computes it
    sent = len(fake_slurm.jobs)
    argv = ["sweep", "submit", "--profile", "smoke", "--sweep", "regime", "--cells-per-job", "1"]
    try:
        assert cli.main(argv) == 0, capsys.readouterr().err
    finally:
        store.release(cells[3].key, fd)
    new = [j for j in fake_slurm.jobs[sent:] if j.fn.__name__ == "run_chunk"]
    want = [c.key for c in [cells[1], *cells[4:]]]
    assert sorted(c.key for j in new for c in j.args[0]) == sorted(want)
    assert f"submitted {len(want)} cells (3 done or held)" in capsys.readouterr().out
    assert store.jobs()[cells[0].key] == jobs[cells[0].key] and store.jobs()[cells[-1].key] == new[-1].job_id


def test_cuda_numerics_keyed_off_the_gpu_match_a_bfloat16_gpu(monkeypatch):
    _no_cuda_here()
    from midas_nb.backbones import training_numerics

    here = training_numerics("cuda", None)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: True)
    assert training_numerics("cuda", None) == here and here["precision"] == "bfloat16"
    monkeypatch.setattr(torch.cuda, "is_bf16_supported", lambda *a, **k: False)
    assert training_numerics("cuda", None)["precision"] == "float16"    # such a node refuses the cells


def test_worker_without_the_gpu_fails_with_its_host(monkeypatch):
    _no_cuda_here()
    from midas_nb.study import ProtocolCellRunner
    from midas_nb.sweeps import SweepCell

    monkeypatch.setenv("SLURM_JOB_ID", "4242")
    runner = ProtocolCellRunner(config.get_profile("smoke", device="cuda"))
    cell = SweepCell("synthetic", "vit_smoke", 1, 0.25, "reference", 0)
    with pytest.raises(RuntimeError, match=r"Slurm job 4242\) cannot run the sweep's device 'cuda'.*--gpus"):
        runner(cell)


def _plan(capsys, *extra) -> str:
    from midas_nb import cli

    assert cli.main(["sweep", "plan", "--profile", "paper", *extra]) == 0
    return capsys.readouterr().out


def test_plan_of_the_paper_profile_counts_every_notebook_and_chunks_arrays(capsys, monkeypatch, tmp_path):
    import json

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    out = _plan(capsys, "--max-array-size", "100")
    # 3 datasets x 3 backbones x 16 (L, b) x (6 trained conditions x 3 seeds + the reference)
    assert re.search(r"04 regime\s+2,736 cells", out) and re.search(r"05 scale\s+171 cells,\s+171 shared", out)
    for name in ("02 protocol", "02 soft", "02 random", "05 backbones", "06 related"):
        assert name in out
    distinct = int(re.search(r"all\s+([\d,]+) distinct cells", out).group(1).replace(",", ""))
    assert distinct == 2736 + 4 + 3 + 15          # soft (with random), random, related's other systems (cropr, ...)
    assert "preparation jobs: 9 " in out
    jobs = int(re.search(r"cell jobs: ([\d,]+) of <= 8", out).group(1).replace(",", ""))
    assert re.search(r"in 4 array\(s\) of <= 100 tasks \(MaxArraySize 100, --max-array-size\): 100, 100, 100, "
                     + str(jobs - 300), out)
    # no store timings, no table of this machine: the shipped one, the last H200 measurement
    from midas_nb.study.cluster import profile_sweeps
    from midas_nb.sweeps.plan import SHIPPED_COST_TABLE

    shipped = json.loads(SHIPPED_COST_TABLE.read_text())
    cells = {c.key: c for v in profile_sweeps(config.get_profile("paper"), planned=True).values() for c in v}.values()
    hours = (sum(shipped["cell_s"][c.backbone][c.dataset] for c in cells)
             + sum(s for per in shipped["finetune_s"].values() for s in per.values())) / 3600
    assert f"projected: {hours:,.1f} GPU-hours" in out and "wall time on 8 GPUs" in out and "on 32 GPUs" in out
    assert f"cost table measured on NVIDIA H200 on 2026-12-04: {SHIPPED_COST_TABLE}" in out
    assert not (tmp_path / "runs" / "bench").exists()
    assert not (tmp_path / "runs" / "sweeps").exists()                  # a plan creates no store
    # with a cost table: GPU-hours = cells x cost + fine-tunes, wall time on 8 and 32 GPUs
    table = dict(device="test GPU", note="", cell_s={b: {"*": 360.0} for b in config.PROFILES["paper"]["scale_backbones"]},
                 finetune_s={b: {d: 3600.0 for d in ("cub", "aircraft", "cars")}
                             for b in config.PROFILES["paper"]["scale_backbones"]})
    (tmp_path / "runs" / "bench").mkdir(parents=True)
    (tmp_path / "runs" / "bench" / "cell_cost.json").write_text(json.dumps(table))
    out = _plan(capsys, "--sweep", "regime")
    assert f"projected: {2736 * 0.1 + 9:,.1f} GPU-hours = cells {273.6:,.1f} h + preparation fine-tunes 9.0 h" in out
    assert "cost table measured on test GPU" in out
    rounds8 = -(-342 // 8)
    assert f"wall time on 8 GPUs: ~{(3600 + rounds8 * 2736 * 360 / 342) / 3600:,.1f} h" in out
    assert "wall time on 32 GPUs" in out
    table["device"] = "cpu"                                  # a CPU table is never read as GPU-hours
    (tmp_path / "runs" / "bench" / "cell_cost.json").write_text(json.dumps(table))
    assert "CPU-hours (the cost table was measured on a CPU" in _plan(capsys, "--sweep", "scale")


def test_plan_prefers_the_stores_timed_cells(capsys, monkeypatch, tmp_path):
    from midas_nb.study.cluster import profile_sweeps
    from midas_nb.sweeps import ResultStore

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    cells = profile_sweeps(config.get_profile("paper"), ["scale"], planned=True)["05 scale"]
    store = ResultStore(tmp_path / "runs" / "sweeps" / "paper")
    one_each = list({c.backbone: c for c in cells}.values())             # a timed cell of each backbone
    for c in one_each:
        store.record_done(c, [dict(metric="x", value=1.0)], started=__import__("time").time() - 720)
    out = _plan(capsys, "--sweep", "scale")
    assert "168 to run" in out and "mean of 3 timed cells in the store" in out
    assert "cost per cell: 12.0 min" in out


def test_plan_and_submit_refuse_bad_input(capsys):
    from midas_nb import cli

    assert cli.main(["sweep", "plan", "--profile", "paper", "--sweep", "regime,bogus"]) == 2
    assert "unknown sweep(s) ['bogus']" in capsys.readouterr().err
    assert cli.main(["sweep", "plan", "--profile", "paper", "--sweep", " , "]) == 2   # never a plan of 0 cells
    assert "' , ' names no sweep; expected some of [" in capsys.readouterr().err
    assert cli.main(["sweep", "plan", "--profile", "paper", "--cells-per-job", "0"]) == 2
    assert "cells_per_job must be >= 1" in capsys.readouterr().err


def test_submit_through_the_cli_returns_after_submission(fake_slurm, capsys, monkeypatch):
    from midas_nb import cli
    from midas_nb.study import make_grid
    from midas_nb.sweeps import ResultStore

    monkeypatch.setitem(config.PROFILES["smoke"], "device", "cuda")      # the profile's GPU, absent here
    rc = cli.main(["sweep", "submit", "--profile", "smoke", "--sweep", "regime", "--partition", "gpu", "--gpus", "1",
                   "--time", "30", "--cells-per-job", "1"])
    out = capsys.readouterr()
    assert rc == 0, out.err
    grid = make_grid(config.get_profile("smoke"), "regime")
    assert re.search(rf"submitted {len(grid)} cells \(0 done or held\)", out.out)
    assert "midas-nb sweep wait smoke" in out.out
    assert fake_slurm.params["slurm_partition"] == "gpu" and fake_slurm.params["gpus_per_node"] == 1
    assert fake_slurm.params["timeout_min"] == 30
    store = ResultStore(config.runs_dir() / "sweeps" / "smoke")
    assert len(store.jobs()) == len(grid) and not store.scan()[0]        # submitted, nothing computed
    assert all(j.args[1].profile["device"] == "cuda" for j in fake_slurm.jobs)


def test_submit_local_runs_and_refuses_cuda_without_cuda(capsys, monkeypatch, tmp_path):
    _no_cuda_here()
    from midas_nb import cli

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["sweep", "submit", "--profile", "smoke", "--executor", "local", "--device", "cuda"]) == 2
    assert "no CUDA device" in capsys.readouterr().err
    assert not (tmp_path / "runs" / "sweeps" / "smoke").exists()           # refused before anything


class _Runner:
    """Stands for ``ProtocolCellRunner``: one row per cell at once, or an error for ``fail`` cells."""
    fail: set = set()

    def __init__(self, prof) -> None:
        pass

    def __call__(self, cell):
        if cell.condition in self.fail:
            raise RuntimeError("no such condition here")
        return {"acc": 0.5}


def test_submit_local_says_what_it_computes_where_and_how_to_follow_it(capsys, monkeypatch, tmp_path):
    from midas_nb import cli

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr("midas_nb.study.cluster.ProtocolCellRunner", _Runner)
    store = tmp_path / "runs" / "sweeps" / "smoke"
    argv = ["sweep", "submit", "--profile", "smoke", "--executor", "local", "--sweep", "soft,random"]
    assert cli.main(argv) == 0
    lines = capsys.readouterr().out.splitlines()
    assert lines[0] == "sweep submit: profile smoke (device cpu): 02 soft 4 cells, 02 random 1 cells"
    assert lines[1] == ("  5 distinct cells, 0 already done, 5 to run; computing them here (local: one cell after "
                        "another; Ctrl-C stops, the same command resumes)")
    assert lines[2] == f"  store {store}; follow it from another shell with: midas-nb sweep status smoke"
    assert lines[-1] == f"5 cells: 5 done, 0 failed, 0 running, 0 pending  [{store}]"
    assert cli.main(argv) == 0                                          # the second time: nothing to run
    assert "  5 distinct cells, 5 already done, 0 to run;" in capsys.readouterr().out


def test_submit_local_with_failed_cells_exits_1_and_names_the_status_command(capsys, monkeypatch, tmp_path):
    from midas_nb import cli

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    monkeypatch.setattr("midas_nb.study.cluster.ProtocolCellRunner", _Runner)
    monkeypatch.setattr(_Runner, "fail", {"random"})
    assert cli.main(["sweep", "submit", "--profile", "smoke", "--executor", "local", "--sweep", "random"]) == 1
    out = capsys.readouterr().out
    assert "1 cells: 0 done, 1 failed, 0 running, 0 pending" in out
    assert out.splitlines()[-1] == ("failed cells and their errors: midas-nb sweep status smoke; the same command "
                                    "again retries them (done cells are kept)")


def test_plan_counts_done_cells_by_coordinates_when_its_ids_are_placeholders(tmp_path):
    """`sweep plan` reads no data, so its cells carry placeholder checkpoint and data ids: a
    store's done cells are matched by dataset, backbone, L, b, condition, seed and settings (else
    a half-done sweep would be planned as if nothing had run)."""
    import time

    from midas_nb.sweeps import ResultStore, SweepCell
    from midas_nb.sweeps.plan import plan_text

    real = [SweepCell("cub", "vit", 6, 0.25, c, 0, checkpoint_id="ck1", data_id="d1", params={"lam": 1.0})
            for c in ("reference", "T5")]
    planned = [SweepCell.from_dict(dict(c.to_dict(), checkpoint_id="planned", data_id="planned")) for c in real]
    store = ResultStore(tmp_path / "s")
    store.record_done(real[0], [{"miou": 0.5}], started=time.time())
    kw = dict(cells_per_job=8, max_array=1001, max_array_source="test", store=store)
    assert "2 distinct cells, 1 done, 1 to run" in plan_text({"02 protocol": planned}, **kw)
    assert "2 distinct cells, 1 done, 1 to run" in plan_text({"02 protocol": real}, **kw)
    # a done record of an older result format (its key is not the one its cell gives now) is not done
    old = dict(store.read(real[0].key), key="0123456789abcdef")
    store.path(real[0].key).unlink()
    store.write_record(old)
    assert "2 distinct cells, 0 done, 2 to run" in plan_text({"02 protocol": planned}, **kw)
    assert "2 distinct cells, 0 done, 2 to run" in plan_text({"02 protocol": real}, **kw)


def test_wait_on_a_missing_store_and_a_missing_cost_file_are_one_line(tmp_path, monkeypatch, capsys):
    from midas_nb import cli
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["sweep", "wait", "nosuch"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("midas-nb sweep wait: "), err
    assert cli.main(["sweep", "plan", "--profile", "smoke", "--cost", str(tmp_path / "none.json")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "none.json" in err[0] and "no such file" in err[0], err


@pytest.mark.parametrize("profile", ["smoke", "quick", "paper"])
def test_every_catalogue_sweep_at_the_point_carries_the_band_check(profile):
    """A sweep of the protocol's point with the reference has the random ranking where the profile's protocol
    has it (decoupling_D's band check): notebook 02's soft control and 06's related systems compute it, so the
    plan and a Slurm submission count it (the plan's own grids once left it out; decision 0077)."""
    from midas_nb.analysis.protocol import with_band_check
    from midas_nb.study.cluster import profile_sweeps

    prof = config.get_profile(profile)
    for name in ("02 protocol", "02 soft", "06 related"):
        at_point = [c.condition for c in profile_sweeps(prof, [name.split()[1]], planned=True)[name]
                    if (c.depth, c.budget) == (prof["depth"], prof["budget"])]
        conds = list(dict.fromkeys(at_point))
        assert conds == with_band_check(conds, prof["conditions"]), (name, conds)


def test_notebook_06s_protocol_calls_are_the_catalogues_related_sweep():
    """``related.run_related`` (notebook 06) asks ``Study.protocol`` for exactly the cells that ``sweep plan`` and
    ``sweep submit`` count as 06 related (quick: 32, the 6 random cells shared with 02)."""
    from types import SimpleNamespace

    from midas_nb.analysis import related
    from midas_nb.study import sweep_cells
    from midas_nb.study.cluster import profile_sweeps

    prof = config.get_profile("quick")
    calls = []
    fake = SimpleNamespace(settings=SimpleNamespace(protocol=SimpleNamespace(conditions=tuple(prof["conditions"])),
                                                    sweep=SimpleNamespace(related_seeds=tuple(prof["related_seeds"]))),
                           protocol=lambda **kw: calls.append(kw) or __import__("pandas").DataFrame())
    with pytest.raises(AttributeError):            # past the protocol calls: the fake has no more settings
        related.run_related(fake)
    assert [kw["sweep"] for kw in calls] == ["related"]          # one call, the catalogue's sweep
    asked = [c.key for kw in calls for c in sweep_cells(prof, kw.pop("sweep"), planned=True, **kw)]
    planned = [c.key for c in profile_sweeps(prof, ["related"], planned=True)["06 related"]]
    assert asked == planned and len(planned) == 32


def test_given_related_conditions_are_split_as_the_catalogue_splits_them():
    """``run_related(study, conditions=[...])`` asks the catalogue's 06 sweep for those conditions: a MIDAS condition
    of the profile on its seeds and builds (with the random ranking, the band's check), another system on
    ``related_seeds`` and one build, each cell once (the parts once both took the list: every cell twice)."""
    from midas_nb.study import sweep_cells

    prof = config.get_profile("quick", builds=2)
    cells = sweep_cells(prof, "related", planned=True, conditions=["reference", "cropr", "no_such_condition"])
    assert len({c.key for c in cells}) == len(cells)
    got = {(c.condition, c.seed, int(c.params.get("build", 0))) for c in cells}
    seeds, related = list(prof["seeds"]), list(prof["related_seeds"])
    expect = {("reference", seeds[0], b) for b in (0, 1)} | {("random", s, b) for s in seeds for b in (0, 1)} \
        | {("cropr", s, 0) for s in related}
    assert got == expect


def test_sweep_status_of_a_profile_counts_each_notebook_sweep_of_the_catalogue(tmp_path, monkeypatch, capsys):
    """``midas-nb sweep status smoke`` ends with ``sweep plan``'s count per notebook sweep (the catalogue's), its done
    cells matched by coordinates: one done cell of 02 protocol is one done there."""
    from midas_nb.cli import main
    from midas_nb.study import sweep_cells
    from midas_nb.sweeps import ResultStore

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    prof = config.get_profile("smoke")
    cell = sweep_cells(prof, "protocol", planned=True)[0]
    store = ResultStore(name="smoke")
    store.register([cell])
    store.record_done(cell, [dict(miou=0.5)], started=0.0)
    assert main(["sweep", "status", "smoke"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[0].startswith("1 cells: 1 done")
    at = out.index("cells per notebook sweep of profile smoke (midas_nb.study.grid.CATALOGUE):")
    lines = {ln.split()[1]: ln for ln in out[at + 1:]}
    assert list(lines) == list(config.SWEEPS)
    n = len(sweep_cells(prof, "protocol", planned=True))
    assert f"{n:>6,} cells" in lines["protocol"] and lines["protocol"].split("line above,")[1].split()[0] == "1"


def test_submit_defaults_ask_for_a_gpu_and_two_hours(fake_slurm, capsys, monkeypatch):
    """Without --gpus and --time a job of a cuda profile asks for one GPU and 120 minutes (submitit's own defaults,
    no GPU and 5 minutes, would run every cell without its device, and kill a ViT-B job of 8 cells on an H200)."""
    from midas_nb import cli

    monkeypatch.setitem(config.PROFILES["smoke"], "device", "cuda")
    assert cli.main(["sweep", "submit", "--profile", "smoke", "--sweep", "regime"]) == 0, capsys.readouterr().err
    assert fake_slurm.params["gpus_per_node"] == 1 and fake_slurm.params["timeout_min"] == 120
    monkeypatch.setitem(config.PROFILES["smoke"], "device", "cpu")      # a CPU profile asks for no GPU
    fake_slurm.params.clear()
    assert cli.main(["sweep", "submit", "--profile", "smoke", "--sweep", "protocol"]) == 0, capsys.readouterr().err
    assert "gpus_per_node" not in fake_slurm.params and fake_slurm.params["timeout_min"] == 120
    # a GPU count given under submitit's alias (`gpus`) or as gres is the caller's: no default on top of it
    from midas_nb.study import run_cells, sweep_cells

    prof = dict(config.get_profile("smoke"), device="cuda")
    for given, param, value in ((dict(gpus=2), "gpus_per_node", 2), (dict(slurm_gres="gpu:2"), "slurm_gres", "gpu:2")):
        fake_slurm.params.clear()
        run_cells(prof, sweep_cells(prof, "random", planned=False), wait=False, executor="slurm", slurm=given)
        assert fake_slurm.params[param] == value
        assert param == "gpus_per_node" or "gpus_per_node" not in fake_slurm.params
