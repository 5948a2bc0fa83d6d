"""The sweep engine against a real Slurm that the test starts (issue 30): a single-node Slurm on
localhost (Debian's slurmctld, slurmd, munge; ``tests/slurm_cluster.py``) with ``MaxArraySize``
set low. Skipped, with the reason, where the packages are absent (``.ci/run`` installs them).

Checks that only a real Slurm can pass: every record names the Slurm array task that computed it
(a local fallback has none), arrays never exceed ``MaxArraySize``, one fine-tune per (dataset,
backbone), a cancelled job's cell sent by the same submission again (and nothing else) and finished, two
concurrent submissions without duplicate work.
"""
from __future__ import annotations

import functools
import json
import os
import re
import threading
import time
import uuid
from pathlib import Path

import pytest

from slurm_cluster import missing, start_cluster

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent

pytestmark = pytest.mark.skipif(missing() is not None, reason=str(missing()))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    cl = start_cluster(tmp_path_factory.mktemp("slurm"), max_array_size=2)
    saved = {k: os.environ.get(k) for k in ("SLURM_CONF", "PYTHONPATH", "MIDAS_CLAIM_TTL_S")}
    os.environ["SLURM_CONF"] = cl.env["SLURM_CONF"]
    # the jobs inherit the submitting environment (--export=ALL): this checkout and the tests
    os.environ["PYTHONPATH"] = os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")])
    yield cl
    cl.stop()
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


def toy_fn(cell, marker_dir: str) -> list[dict]:
    """Leaves ``start``/``finish`` markers with the Slurm job; blocks while ``block-<key>`` exists."""
    d = Path(marker_dir)
    job = os.environ.get("SLURM_ARRAY_JOB_ID", "none") + "_" + os.environ.get("SLURM_ARRAY_TASK_ID", "none")
    (d / f"start-{cell.key}-{uuid.uuid4().hex}").write_text(job)
    deadline = time.monotonic() + 120
    while (d / f"block-{cell.key}").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    (d / f"finish-{cell.key}-{uuid.uuid4().hex}").write_text(job)
    return [dict(metric="score", value=cell.depth)]


def n(d: Path, kind: str, cell) -> int:
    return len(list(d.glob(f"{kind}-{cell.key}-*")))


def toy_cells(k: int, tag: str):
    from midas_nb.sweeps import SweepCell
    return [SweepCell("synthetic", "vit_smoke", depth=L, budget=0.25, condition="reference", seed=0,
                      checkpoint_id=tag) for L in range(1, k + 1)]


def _until(cond, what: str, timeout: float = 150.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.5)


def assert_slurm_records(store, cells, max_array: int, exact: bool = True) -> None:
    """Every cell done by a Slurm job or array task (the one jobs.json names, where ``exact``: with two
    submissions it names the later one's); arrays within MaxArraySize."""
    jobs = store.jobs()
    for c in cells:
        rec = store.read(c.key)
        assert rec is not None and rec["status"] == "done", c.label
        assert re.fullmatch(r"\d+(_\d+)?", str(rec["job_id"])), rec["job_id"]
        assert not exact or rec["job_id"] == jobs[c.key], (rec["job_id"], jobs.get(c.key))
    tasks: dict[str, set[str]] = {}
    for jid in jobs.values():
        array, _, task = jid.partition("_")
        if task:  # a single job (one cell submitted again) is no array
            tasks.setdefault(array, set()).add(task)
    assert all(len(t) <= max_array and max(int(i) for i in t) < max_array for t in tasks.values()), tasks


class CountingRunner:
    """The protocol's runner, leaving a ``finetuned-*`` marker wherever the backbone was trained
    rather than loaded from the checkpoint cache."""

    def __init__(self, profile, marker_dir: str):
        from midas_nb.study import ProtocolCellRunner
        self.inner, self.marker_dir = ProtocolCellRunner(profile), marker_dir

    def _note(self, cell) -> None:
        if not self.inner.study(cell).meta["loaded_from_cache"]:
            (Path(self.marker_dir) / f"finetuned-{uuid.uuid4().hex}").write_text(os.environ.get("SLURM_JOB_ID", ""))

    def prepare(self, cell):
        out = self.inner.prepare(cell)
        self._note(cell)
        return out

    def __call__(self, cell):
        rows = self.inner(cell)
        self._note(cell)
        return rows


def test_smoke_sweep_on_slurm_one_finetune_chunked_arrays(cluster, tmp_path, monkeypatch, capsys):
    from midas_nb.config import get_profile
    from midas_nb.study import make_grid
    from midas_nb.sweeps import ResultStore, run_sweep
    from midas_nb.sweeps.slurm import max_array_size, wait

    monkeypatch.setenv("MIDAS_CACHE_DIR", str(tmp_path / "cache"))   # empty cache: a fine-tune is needed
    prof = get_profile("smoke")
    cells = make_grid(prof, "depth", conditions=["reference"], seeds=[0])     # L = 1, 2
    markers = tmp_path / "m"
    markers.mkdir()
    store = ResultStore(tmp_path / "store")
    assert max_array_size() == 2                                   # read from scontrol show config
    st = run_sweep(cells, CountingRunner(prof, str(markers)), store, executor="slurm", wait=False,
                   slurm=dict(partition="test", cpus_per_task=1, time=10, cells_per_job=1))
    assert st.done == 0                                            # wait=False: returned after submission
    table = wait(store, poll_s=1, progress=False, timeout_s=170)
    assert len(cells) == 2 and list(table["status"]) == ["done"] * 2, table[["label", "status", "job_state"]]
    assert_slurm_records(store, cells, 2)
    assert len(list(markers.glob("finetuned-*"))) == 1                  # one fine-tune, in the preparation job

    # the command line: `sweep submit` returns after submission, `sweep wait` until the cell is done
    from midas_nb import cli
    from midas_nb.study.cluster import profile_sweeps

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    (cell,) = profile_sweeps(prof, ["random"])["02 random"]                  # the checkpoint fine-tuned above
    assert cli.main(["sweep", "submit", "--profile", "smoke", "--sweep", "random", "--partition", "test",
                     "--cpus", "1", "--time", "10", "--cells-per-job", "1"]) == 0
    runs = ResultStore(tmp_path / "runs" / "sweeps" / "smoke")
    assert cell.key in runs.jobs() and runs.read(cell.key) is None          # returned before the job ran
    assert cli.main(["sweep", "wait", "smoke"]) == 0
    rec = runs.read(cell.key)
    assert rec["status"] == "done" and rec["job_id"] == runs.jobs()[cell.key]
    # the README's other cluster commands, on the same store (status exits 0: nothing failed)
    capsys.readouterr()
    assert cli.main(["sweep", "status", "smoke"]) == 0
    assert re.search(r"\bdone\b", capsys.readouterr().out)
    jobs = runs.jobs()          # the same submit again: nothing is missing, nothing is sent
    assert cli.main(["sweep", "submit", "--profile", "smoke", "--sweep", "random", "--partition", "test",
                     "--cpus", "1", "--time", "10", "--cells-per-job", "1"]) == 0
    assert "1 already done, 0 to run" in capsys.readouterr().out and runs.jobs() == jobs
    assert cli.main(["sweep", "plan", "--profile", "smoke", "--sweep", "random", "--max-array-size", "2"]) == 0
    out = capsys.readouterr().out
    assert re.search(r"all +1 distinct cells, 1 done, 0 to run", out) and "projection: nothing to run" in out


def test_cancelled_job_submitted_again_and_concurrent_submissions(cluster, tmp_path):
    from midas_nb.sweeps import ResultStore, run_sweep, submit_sweep
    from midas_nb.sweeps.slurm import cell_states, wait

    markers = tmp_path / "m"
    markers.mkdir()
    fn = functools.partial(toy_fn, marker_dir=str(markers))
    slurm = dict(partition="test", cpus_per_task=1, time=5, cells_per_job=1)

    # two submissions of the same four cells at once: every cell computed exactly once
    cells = toy_cells(4, "twice")
    store = ResultStore(tmp_path / "twice")
    subs = [threading.Thread(target=run_sweep, args=(cells, fn, store),
                             kwargs=dict(executor="slurm", slurm=slurm, wait=False)) for _ in range(2)]
    for t in subs:
        t.start()
    for t in subs:
        t.join()
    wait(store, poll_s=1, progress=False, timeout_s=170)
    assert [n(markers, "start", c) for c in cells] == [1] * 4
    assert [n(markers, "finish", c) for c in cells] == [1] * 4
    assert_slurm_records(store, cells, 2, exact=False)
    assert len({j.split("_")[0] for j in store.jobs().values()}) == 2   # 4 jobs in 2 arrays under MaxArraySize 2

    # a cell whose job is cancelled (scancel) shows as lost; the same submission again sends it alone; it finishes
    cells = toy_cells(2, "cancel")
    store = ResultStore(tmp_path / "cancel")
    (markers / f"block-{cells[0].key}").touch()
    assert len(submit_sweep(cells, fn, store, slurm=slurm).cells) == 2
    _until(lambda: n(markers, "start", cells[0]) == 1, "the blocked cell to start")
    assert submit_sweep(cells, fn, store, slurm=slurm).cells == []   # each cell done, held or in the queue
    cluster.run("scancel", store.jobs()[cells[0].key])
    table = wait(store, poll_s=1, progress=False, timeout_s=120)
    assert table["job_state"].iloc[0] == "lost" and table["status"].iloc[1] == "done"
    # the cancelled job's claim stays behind, but its process is gone: the cell reads pending, not running
    _until(lambda: store.state(cells[0].key) == "pending", "the cancelled job's claim to read dead")
    assert store.running_path(cells[0].key).exists()
    (markers / f"block-{cells[0].key}").unlink()
    old_job = store.jobs()[cells[0].key]
    done_job = store.jobs()[cells[1].key]
    assert [c.key for c in submit_sweep(cells, fn, store, slurm=slurm).cells] == [cells[0].key]
    assert store.jobs()[cells[0].key] != old_job and store.jobs()[cells[1].key] == done_job
    table = wait(store, poll_s=1, progress=False, timeout_s=120)
    assert list(table["status"]) == ["done", "done"]
    assert [n(markers, "finish", c) for c in cells] == [1, 1]
    assert_slurm_records(store, cells, 2)
    assert cell_states(store)["job_state"].tolist() == ["", ""]
