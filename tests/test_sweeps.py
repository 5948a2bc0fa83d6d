"""Sweeps (midas_nb.sweeps): grids, the atomic per-cell store, resume after a real SIGKILL,
failure recording and retry, and every executor (local, submitit debug and local).

Cell functions here are top-level (picklable) and leave marker files, so the tests count
how often each cell was started and finished without relying on timing.
"""
from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from pathlib import Path

import pandas as pd
import pytest

from midas_nb.config import get_profile
from midas_nb.study import make_grid, RunSettings
from midas_nb.identity import atomic_write_text
from midas_nb.sweeps import ResultStore, SweepCell, format_status, open_store, run_sweep, submit_sweep

REPO = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent


# ------------------------------------------------------------------------------ helpers


def marker_cell_fn(cell: SweepCell, marker_dir: str) -> list[dict]:
    """Leaves ``start-<key>-*`` / ``finish-<key>-*`` markers; blocks while ``block-<key>``
    exists (so a test can kill it mid-cell); raises while ``fail-<key>`` exists."""
    d = Path(marker_dir)
    (d / f"start-{cell.key}-{uuid.uuid4().hex}").touch()
    (d / f"pid-{cell.key}").write_text(str(os.getpid()))
    deadline = time.monotonic() + 120
    while (d / f"block-{cell.key}").exists():
        if time.monotonic() > deadline:
            raise TimeoutError("test cell blocked for 120 s without being killed")
        time.sleep(0.02)
    if (d / f"fail-{cell.key}").exists():
        raise RuntimeError(f"boom in {cell.label}")
    (d / f"finish-{cell.key}-{uuid.uuid4().hex}").touch()
    return [dict(metric="score", value=cell.depth * 100 + cell.seed),
            dict(metric="other", value=-cell.depth)]


def frame_cell_fn(cell: SweepCell) -> pd.DataFrame:
    return pd.DataFrame(dict(condition=[cell.condition], miou=[cell.depth / 10], idauc=[cell.budget]))


def count(marker_dir: Path, kind: str, cell: SweepCell) -> int:
    return len(list(marker_dir.glob(f"{kind}-{cell.key}-*")))


def toy_cells(n: int = 4) -> list[SweepCell]:
    return [SweepCell("synthetic", "vit_smoke", depth=L, budget=0.25, condition="reference", seed=0,
                      checkpoint_id="ckpt-test") for L in range(1, n + 1)]


def _sweep_script(store_root: str, marker_dir: str) -> None:
    """Body of the subprocess that the kill test SIGKILLs (local executor)."""
    run_sweep(toy_cells(), functools.partial(marker_cell_fn, marker_dir=marker_dir), ResultStore(store_root))


def wait_for(cond, what: str, timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.02)


def assert_store_clean(store: ResultStore, cells: list[SweepCell]) -> None:
    """Every cell done exactly once, every record a complete valid file, nothing stray."""
    assert store.scan()[1] == []
    files = sorted(p.name for p in store.cells_dir.iterdir())
    assert files == sorted(f"{c.key}.json" for c in cells)
    for c in cells:
        rec = json.loads(store.path(c.key).read_text())
        assert rec["status"] == "done" and rec["key"] == c.key and rec["cell"] == c.to_dict()
        assert [r["value"] for r in rec["rows"]] == [c.depth * 100 + c.seed, -c.depth]


@pytest.fixture
def markers(tmp_path) -> Path:
    d = tmp_path / "markers"
    d.mkdir()
    return d


# ------------------------------------------------------------------------------ grids


def test_quick_reads_out_other_backbones_only_when_asked():
    """quick's 45-min budget: the scale readout and the side-by-side run the profile's own backbone
    unless other_backbones is on (each other backbone is trained from nothing offline)."""
    from midas_nb.backbones import comparison_backbones
    from midas_nb.config import RunProfile
    prof = get_profile("quick")
    assert prof["other_backbones"] is False and get_profile("paper")["other_backbones"] is True
    assert {c.backbone for c in make_grid(prof, "scale")} == {prof["backbone"]}
    assert comparison_backbones(prof) == [prof["backbone"]]
    assert comparison_backbones(prof, planned=True) == ["hybrid_lite0_vit", "hybrid_lite0_deit"]
    on = get_profile("quick", other_backbones=True)
    assert {c.backbone for c in make_grid(on, "scale")} == set(on["scale_backbones"])
    assert comparison_backbones(on) == ["hybrid_lite0_vit", "hybrid_lite0_deit"]
    assert make_grid(on, "regime") == make_grid(prof, "regime")      # the regime sweep is the main backbone's
    assert RunProfile.problems(get_profile("quick", other_backbones="yes")) == [
        "other_backbones: expected true or false, got 'yes'"]


def test_sweep_seeds_apply_off_the_profiles_point():
    """quick sweeps its other (L, b) points with sweep_seeds (one seed); its own point keeps every
    seed (notebook 02's cells), and an explicit seeds list applies everywhere."""
    prof = get_profile("quick")
    assert prof["sweep_seeds"] == [0] and prof["seeds"] == [0, 1]
    cross = make_grid(prof, "regime")
    L0, b0 = prof["depth"], prof["budget"]
    centre = [c for c in cross if (c.depth, c.budget) == (L0, b0)]
    off = [c for c in cross if (c.depth, c.budget) != (L0, b0)]
    assert {c.seed for c in centre if c.condition == "T5"} == {0, 1}
    # the profile's sweep conditions plus the random ranking (the band's check on the reference)
    assert {c.seed for c in off} == {0} and len(off) == 4 * (len(prof["sweep_conditions"]) + 1)
    assert "random" not in prof["sweep_conditions"]
    for point in {(c.depth, c.budget) for c in cross}:
        assert any(c.condition == "random" and (c.depth, c.budget) == point for c in cross), point
    assert {c.seed for c in make_grid(prof, "regime", seeds=[0, 1]) if c.condition == "T5"} == {0, 1}
    assert len(make_grid(prof, "regime", seeds=[0, 1])) == (5 + prof["builds"] - 1) * (3 * 2 + 1)   # builds at (L, b)
    # explicit conditions are taken as given
    assert {c.condition for c in make_grid(prof, "regime", conditions=["reference", "T5"])} == {"reference", "T5"}
    from midas_nb.config import RunProfile
    assert RunProfile.problems(get_profile("quick", sweep_seeds=[0, 0])) == [
        "sweep_seeds: duplicated entries in [0, 0]"]


def test_prefetch_targets_only_where_other_cells_read_them():
    """The first cell at (backbone, L) computes all the profile's targets only at its own backbone and
    depth (notebooks 02 and 06 train every condition there); elsewhere only the swept targets."""
    from midas_nb.study.grid import prefetch_targets
    prof = get_profile("quick")
    assert prefetch_targets(prof, prof["backbone"], prof["depth"]) == prof["targets"]
    assert prefetch_targets(prof, prof["backbone"], 3) == ["T1", "T5"]
    assert prefetch_targets(prof, "hybrid_lite0_vit", prof["depth"]) == ["T1", "T5"]
    paper = get_profile("paper")      # no sweep_conditions: every supervised condition is swept
    assert prefetch_targets(paper, "deit_tiny_patch16_224.fb_in1k", 3) == ["T1", "T2", "T3", "T4", "T5"]


def test_make_grid_sizes_follow_the_profile():
    prof = get_profile("quick", other_backbones=True, builds=1)     # builds: test_cell_identity.py
    # sweeps cross the profile's sweep_conditions (the protocol table shows all conditions), plus
    # the random ranking that tests the reference in each cell
    assert set(prof["sweep_conditions"]) < set(prof["conditions"])
    assert {c.condition for c in make_grid(prof, "cross")} == set(prof["sweep_conditions"]) | {"random"}
    assert {c.condition for c in make_grid(prof, "cross", conditions=prof["conditions"])} == set(prof["conditions"])
    prof.pop("sweep_conditions")
    prof.pop("sweep_seeds")
    nc, ns = len(prof["conditions"]), len(prof["seeds"])
    nL, nb = len(prof["depths"]), len(prof["budgets"])
    assert "reference" in prof["conditions"] and ns > 1
    per_point = (nc - 1) * ns + 1          # the parameter-free reference is run for one seed
    assert len(make_grid(prof, "depth", seedless_conditions=())) == nL * nc * ns
    assert prof["depth"] in prof["depths"] and prof["budget"] in prof["budgets"]
    depth = make_grid(prof, "depth")
    budget = make_grid(prof, "budget")
    cross = make_grid(prof, "cross")
    assert len(depth) == nL * per_point and len(budget) == nb * per_point
    # L sweep at b=25% plus b sweep at L=6; the shared point (6, 0.25) once
    assert len(cross) == (nL + nb - 1) * per_point
    assert {c.seed for c in cross if c.condition == "reference"} == {prof["seeds"][0]}
    assert {c.seed for c in cross if c.condition == "T5"} == set(prof["seeds"])
    assert make_grid(prof, "regime") == cross
    assert {(c.depth, c.budget) for c in cross} == (
        {(L, prof["budget"]) for L in prof["depths"]} | {(prof["depth"], b) for b in prof["budgets"]})
    assert len(make_grid(prof, "full")) == nL * nb * per_point
    scale = make_grid(prof, "scale")
    assert len(scale) == len(prof["scale_backbones"]) * per_point
    assert {c.backbone for c in scale} == set(prof["scale_backbones"])
    assert {(c.depth, c.budget) for c in scale} == {(prof["depth"], prof["budget"])}
    for grid in (depth, budget, cross, scale):
        assert len({c.key for c in grid}) == len(grid)


def test_paper_grid_is_the_full_product():
    prof = get_profile("paper")
    # without a CUB root the paper grid is an error (issue 14: never the synthetic set instead)
    with pytest.raises(ValueError, match=r"dataset 'cub' has no data root: pass --data-root cub="):
        make_grid(prof, "regime")
    roots = {"cub": "/data/CUB_200_2011", "aircraft": "/data/fgvc", "cars": "/data/cars"}
    # cells are keyed by data content, which needs the data: explicit ids read nothing
    pairs = [(d, b) for d in roots for b in prof["scale_backbones"]]
    ids = {p: f"ckpt-{i}" for i, p in enumerate(pairs)}
    data = {p: f"data-{p[0]}" for p in pairs}
    real = make_grid(get_profile("paper", data_roots=roots), "regime", checkpoint_ids=ids, data_ids=data)
    # 4 depths × 4 budgets × (6 trained conditions × 3 seeds + reference) × 3 datasets × 3 backbones
    assert len(real) == 4 * 4 * ((len(prof["conditions"]) - 1) * 3 + 1) * 3 * 3
    assert {c.dataset for c in real} == {"cub", "aircraft", "cars"}
    assert {c.backbone for c in real} == set(prof["scale_backbones"])
    assert len({c.checkpoint_id for c in real}) == 3 * 3      # one checkpoint per dataset × backbone
    assert {c.data_id for c in real} == set(data.values())
    # planned: the same cells, read from no data root (none exists), the ids placeholders of the build
    planned = make_grid(get_profile("paper", data_roots=roots, builds=2), "regime", planned=True)
    ids_out = dict(checkpoint_id=None, data_id=None)
    assert [c.to_dict() | ids_out for c in planned if "build" not in c.params] == [c.to_dict() | ids_out for c in real]
    assert {c.data_id for c in planned} == {"planned"}
    assert {(c.checkpoint_id, c.params.get("build", 0)) for c in planned} == {("planned-0", 0), ("planned-1", 1)}
    with pytest.raises(ValueError, match=r"dataset 'cars' has no data root"):
        make_grid(get_profile("paper", data_roots={k: v for k, v in roots.items() if k != "cars"}), "regime",
                  checkpoint_ids=ids, data_ids=data)


def test_cell_key_depends_on_every_parameter():
    c = toy_cells(1)[0]
    same = SweepCell.from_dict(json.loads(json.dumps(c.to_dict())))
    assert same == c and same.key == c.key and hash(same) == hash(c)
    assert SweepCell("synthetic", "vit_smoke", 1, 0.2500000001, "reference", 0, "ckpt-test").key == c.key
    variants = [
        SweepCell("cub", "vit_smoke", 1, 0.25, "reference", 0, "ckpt-test"),
        SweepCell("synthetic", "vit_other", 1, 0.25, "reference", 0, "ckpt-test"),
        SweepCell("synthetic", "vit_smoke", 2, 0.25, "reference", 0, "ckpt-test"),
        SweepCell("synthetic", "vit_smoke", 1, 0.5, "reference", 0, "ckpt-test"),
        SweepCell("synthetic", "vit_smoke", 1, 0.25, "T5", 0, "ckpt-test"),
        SweepCell("synthetic", "vit_smoke", 1, 0.25, "reference", 1, "ckpt-test"),
        SweepCell("synthetic", "vit_smoke", 1, 0.25, "reference", 0, "ckpt-other"),
        SweepCell("synthetic", "vit_smoke", 1, 0.25, "reference", 0, "ckpt-test", params={"lr": 1e-3}),
    ]
    assert len({v.key for v in variants} | {c.key}) == len(variants) + 1
    # the profile's protocol settings and fine-tuning settings reach the key
    base = make_grid(get_profile("smoke"), "scale")
    other_lr = make_grid(get_profile("smoke", scorer_train=dict(epochs=2, batch_size=32, lr=5e-4)), "scale")
    other_ft = make_grid(get_profile("smoke", finetune=dict(epochs=3, batch_size=32, lr=2e-3, warmup_epochs=1)),
                         "scale")
    assert not ({c.key for c in base} & {c.key for c in other_lr})
    assert not ({c.key for c in base} & {c.key for c in other_ft})
    # a protocol setting given at the top level reaches the cells' settings and key (it was dropped
    # there while the study read it: the study's evaluated images and the cells' could differ)
    recipe = dict(epochs=2, batch_size=32, lr=1e-3)                      # no throughput entry: the top level's
    top = make_grid(get_profile("smoke", eval_subset_seed=3, throughput_batch=8, scorer_train=recipe), "scale")
    assert {c.params["eval_subset_seed"] for c in top} == {3} and not ({c.key for c in base} & {c.key for c in top})
    assert {c.params["throughput_batch"] for c in top} == {8}
    # a study's typed settings key the cells of its profile
    assert make_grid(RunSettings.build("smoke").values, "scale") == base


def test_make_grid_rejects_bad_input():
    with pytest.raises(ValueError, match="grid kind"):
        make_grid(get_profile("smoke"), "diagonal")
    with pytest.raises(ValueError, match="seeds is empty"):
        make_grid(get_profile("smoke"), "depth", seeds=[])
    with pytest.raises(ValueError, match="depths is empty"):                # never the study's depth instead
        make_grid(get_profile("smoke", depths=[]), "depth", checkpoint_ids={("synthetic", "vit_smoke"): "c"},
                  data_ids={("synthetic", "vit_smoke"): "d"})
    with pytest.raises(ValueError, match=r"budget: expected a kept fraction b in \(0, 1\]"):
        SweepCell("cub", "b", 3, 1.5, "reference", 0)


# ------------------------------------------------------------------------------ the store


def test_atomic_write_leaves_no_temp_file(tmp_path, monkeypatch):
    p = tmp_path / "d" / "rec.json"
    atomic_write_text(p, '{"a": 1}')
    atomic_write_text(p, '{"a": 2}')
    assert json.loads(p.read_text()) == {"a": 2}
    assert sorted(x.name for x in p.parent.iterdir()) == ["rec.json"]

    def broken_replace(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", broken_replace)
    with pytest.raises(OSError, match="disk full"):
        atomic_write_text(p, '{"a": 3}')
    assert json.loads(p.read_text()) == {"a": 2}          # the old record is intact
    assert sorted(x.name for x in p.parent.iterdir()) == ["rec.json"]


def test_corrupt_and_leftover_files_are_ignored_reported_and_recomputed(tmp_path, markers):
    cells = toy_cells(3)
    store = ResultStore(tmp_path / "store")
    fn = functools.partial(marker_cell_fn, marker_dir=str(markers))
    run_sweep(cells, fn, store)
    # a killed writer's temp file, a truncated record, and a record of another cell under this name
    (store.cells_dir / f".{cells[0].key}.json.abc123.tmp").write_text('{"format": "midas')
    full = store.path(cells[1].key).read_text()
    store.path(cells[1].key).write_text(full[: len(full) // 2])
    store.path(cells[2].key).write_text(store.path(cells[0].key).read_text())

    table = store.status(cells)
    assert list(table["status"]) == ["done", "pending", "pending"]
    reasons = {Path(p["path"]).name: p["reason"] for p in table.attrs["problems"]}
    assert "temporary" in reasons[f".{cells[0].key}.json.abc123.tmp"]
    assert "unreadable JSON" in reasons[f"{cells[1].key}.json"]
    assert "does not match" in reasons[f"{cells[2].key}.json"]
    assert set(store.results()["cell_key"]) == {cells[0].key}   # only the valid record is read
    assert "ignored" in format_status(table)

    status = run_sweep(cells, fn, store)
    assert status.complete and status.done == 3
    assert [count(markers, "finish", c) for c in cells] == [1, 2, 2]
    # the temp file is reported, never deleted (its writer may be alive) and never read
    assert [Path(p["path"]).name for p in store.scan()[1]] == [f".{cells[0].key}.json.abc123.tmp"]


def test_a_record_is_used_only_where_its_key_is_its_cells_hash_and_its_digest_its_content(tmp_path):
    """Issue 53, case 2: a record of another cell's settings saved (key and all) under an expected cell's
    file name, and a hand-edited row, are invalid: reported, never used. A record of format 1 (written
    before the digest) is still read, its key checked."""
    cells = toy_cells(4)
    store = ResultStore(tmp_path / "store")
    run_sweep(cells, frame_cell_fn, store)
    other = SweepCell.from_dict(dict(cells[0].to_dict(), params={"precision": "bfloat16"}))
    forged = dict(json.loads(store.path(cells[0].key).read_text()), cell=other.to_dict(),
                  rows=[dict(condition="reference", miou=0.999, idauc=0.25)])
    store.write_record(forged)                                          # a valid digest, but the wrong cell
    text = store.path(cells[1].key).read_text()
    assert text.count('"miou": 0.2,') == 1
    store.path(cells[1].key).write_text(text.replace('"miou": 0.2,', '"miou": 0.999,'))     # a hand edit
    legacy = {k: v for k, v in json.loads(store.path(cells[2].key).read_text()).items() if k != "digest"}
    store.path(cells[2].key).write_text(json.dumps(dict(legacy, format="midas_nb.sweep_record/1")))
    undigested = json.loads(store.path(cells[3].key).read_text())
    store.path(cells[3].key).write_text(json.dumps({k: v for k, v in undigested.items() if k != "digest"}))
    reasons = {Path(p["path"]).stem: p["reason"] for p in store.scan()[1]}
    assert f"its cell hashes to {other.key}, not to its key" in reasons[cells[0].key]
    assert "its text does not match its digest" in reasons[cells[1].key] and cells[2].key not in reasons
    assert "its text does not match its digest" in reasons[cells[3].key]          # format 2 without its digest
    assert store.results()["miou"].tolist() == [0.3]                    # the legacy record alone
    assert list(store.status(cells)["status"]) == ["pending", "pending", "done", "pending"]


def test_sweep_status_exits_1_with_an_unreadable_cell(tmp_path, capsys):
    """Issue 53, case 8: a store whose only problem is an unreadable record is not a clean store."""
    from midas_nb.cli import main
    cells = toy_cells(2)
    store = ResultStore(tmp_path / "store")
    run_sweep(cells, frame_cell_fn, store)
    (store.cells_dir / f".{cells[0].key}.json.abc123.tmp").write_text("{")    # a writer's: no problem
    assert main(["sweep", "status", str(store.root)]) == 0
    store.path(cells[1].key).write_text(store.path(cells[1].key).read_text()[:40])
    capsys.readouterr()
    assert main(["sweep", "status", str(store.root)]) == 1
    assert f"ignored {cells[1].key}.json: invalid record ignored: unreadable JSON" in capsys.readouterr().out


def test_results_fill_cell_columns_and_keep_row_columns(tmp_path):
    cells = toy_cells(2)
    store = ResultStore(tmp_path / "store")
    run_sweep(cells, frame_cell_fn, store)
    df = store.results(cells)
    assert len(df) == 2
    assert list(df["miou"]) == [0.1, 0.2] and list(df["idauc"]) == [0.25, 0.25]
    assert list(df["depth"]) == [1, 2] and list(df["cell_key"]) == [c.key for c in cells]
    assert set(df["checkpoint_id"]) == {"ckpt-test"} and set(df["dataset"]) == {"synthetic"}


# ------------------------------------------------------------------------------ kill + resume


def test_sigkill_mid_sweep_then_resume_runs_every_cell_exactly_once(tmp_path, markers):
    cells = toy_cells(4)
    root = tmp_path / "store"
    (markers / f"block-{cells[1].key}").touch()   # the second cell runs until it is killed
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    code = f"from test_sweeps import _sweep_script; _sweep_script({str(root)!r}, {str(markers)!r})"
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=str(tmp_path))
    try:
        wait_for(lambda: count(markers, "finish", cells[0]) == 1 and count(markers, "start", cells[1]) == 1,
                 "cell 0 finished and cell 1 running")
        os.kill(proc.pid, signal.SIGKILL)
        assert proc.wait(timeout=30) == -signal.SIGKILL
    finally:
        if proc.poll() is None:
            proc.kill()
    store = ResultStore(root)
    # the killed sweep's claim on cell 1 is left behind, but its process is gone: nobody computes it
    assert store.running_path(cells[1].key).exists()
    assert [store.state(c.key) for c in cells] == ["done", "pending", "pending", "pending"]
    assert store.scan()[1] == []
    assert "1 done" in format_status(store.status()) and "0 running, 3 pending" in format_status(store.status())

    (markers / f"block-{cells[1].key}").unlink()
    status = run_sweep(cells, functools.partial(marker_cell_fn, marker_dir=str(markers)), store)
    assert status.complete and status.done == 4
    assert [count(markers, "finish", c) for c in cells] == [1, 1, 1, 1]
    assert [count(markers, "start", c) for c in cells] == [1, 2, 1, 1]   # cell 0 was not redone
    assert_store_clean(store, cells)
    # a third run computes nothing
    run_sweep(cells, functools.partial(marker_cell_fn, marker_dir=str(markers)), store)
    assert [count(markers, "start", c) for c in cells] == [1, 2, 1, 1]


@pytest.mark.slow
def test_submitit_local_executor_survives_a_killed_job_and_resumes(tmp_path, markers, monkeypatch):
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    local = dict(cluster="local", time=5, cpus_per_task=1)
    cells = toy_cells(4)
    store = ResultStore(tmp_path / "store")
    fn = functools.partial(marker_cell_fn, marker_dir=str(markers))
    (markers / f"block-{cells[1].key}").touch()
    pid_file = markers / f"pid-{cells[1].key}"

    def killer():
        wait_for(lambda: count(markers, "start", cells[1]) == 1 and pid_file.exists(), "cell 1 running")
        os.kill(int(pid_file.read_text()), signal.SIGKILL)

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    status = run_sweep(cells, fn, store, executor="slurm", slurm=local)     # one job of 4 cells
    t.join(timeout=60)
    # the killed job's cells have no record (pending: recomputed next time), the executor says what broke
    assert status.done == 1 and status.failed == 0 and status.pending == 3
    assert len(status.executor_errors) == 1 and "(4 cells)" in status.executor_errors[0]
    assert store.read(cells[1].key) is None and store.state(cells[1].key) == "pending"

    (markers / f"block-{cells[1].key}").unlink()
    status = run_sweep(cells, fn, store, executor="slurm", slurm=dict(local, cells_per_job=2))
    assert status.complete
    assert [count(markers, "finish", c) for c in cells] == [1, 1, 1, 1]
    assert [count(markers, "start", c) for c in cells] == [1, 2, 1, 1]
    assert_store_clean(store, cells)


# ------------------------------------------------------------------------------ failures


def test_failing_cell_is_recorded_the_rest_finish_and_rerun_retries(tmp_path, markers):
    cells = toy_cells(3)
    store = ResultStore(tmp_path / "store")
    fn = functools.partial(marker_cell_fn, marker_dir=str(markers))
    (markers / f"fail-{cells[1].key}").touch()
    status = run_sweep(cells, fn, store)
    assert (status.done, status.failed, status.pending) == (2, 1, 0)
    row = status.table.set_index("key").loc[cells[1].key]
    assert row["status"] == "failed" and row["error"] == f"RuntimeError: boom in {cells[1].label}"
    rec = store.read(cells[1].key)
    assert "marker_cell_fn" in rec["traceback"] and rec["rows"] == [] and rec["attempt"] == 1
    text = format_status(status.table)
    assert "1 failed" in text and f"FAILED {cells[1].label}" in text and "boom" in text
    assert set(store.results()["cell_key"]) == {cells[0].key, cells[2].key}

    (markers / f"fail-{cells[1].key}").unlink()
    status = run_sweep(cells, fn, store, retry_failed=False)
    assert status.failed == 1 and count(markers, "start", cells[1]) == 1   # not retried
    status = run_sweep(cells, fn, store)
    assert status.complete and store.read(cells[1].key)["attempt"] == 2
    assert [count(markers, "finish", c) for c in cells] == [1, 1, 1]
    assert_store_clean(store, cells)


def test_unreadable_grid_json_is_reported_and_its_cells_recovered(tmp_path, markers):
    """A garbage grid.json never reads as an empty store: the cells come back from their records,
    the problem is listed, and the next registration writes a good manifest."""
    cells = toy_cells(3)
    store = ResultStore(tmp_path / "store")
    run_sweep(cells, functools.partial(marker_cell_fn, marker_dir=str(markers)), store)
    store.manifest_path.write_text("{not json", encoding="utf-8")
    assert {c.key for c in store.registered_cells()} == {c.key for c in cells}
    (problem,) = [p for p in store.scan()[1] if p["path"].endswith("grid.json")]
    assert "unreadable JSON" in problem["reason"] and "recovered from their 3 records" in problem["reason"]
    store.register(cells[:1])
    assert json.loads(store.manifest_path.read_text()).keys() == {c.key for c in cells}
    assert not store.scan()[1]


def test_unserialisable_output_is_a_cell_failure(tmp_path):
    store = ResultStore(tmp_path / "store")
    status = run_sweep(toy_cells(1), _bad_output_fn, store)
    assert status.failed == 1 and "TypeError" in status.table["error"].iloc[0]


def _bad_output_fn(cell: SweepCell) -> list[dict]:
    return [dict(value=object())]


# ------------------------------------------------------------------------------ executors


def test_submitit_debug_executor_runs_two_cells(tmp_path, markers):
    cells = toy_cells(2)
    store = ResultStore(tmp_path / "store")
    fn = functools.partial(marker_cell_fn, marker_dir=str(markers))
    status = run_sweep(cells, fn, store, executor="slurm",
                       slurm=dict(cluster="debug", partition="gpu", time=10, gpus_per_node=1, cpus_per_task=2))
    assert status.complete and status.done == 2
    assert [count(markers, "finish", c) for c in cells] == [1, 1]
    jobs = json.loads((store.root / "jobs.json").read_text())
    assert set(jobs) == {c.key for c in cells}
    assert (store.root / "submitit").is_dir()
    assert_store_clean(store, cells)


def test_submitit_debug_executor_records_failures(tmp_path, markers):
    cells = toy_cells(2)
    (markers / f"fail-{cells[0].key}").touch()
    status = run_sweep(cells, functools.partial(marker_cell_fn, marker_dir=str(markers)),
                       ResultStore(tmp_path / "store"), executor="slurm", slurm=dict(cluster="debug"))
    assert (status.done, status.failed) == (1, 1)


@pytest.mark.slow
def test_submitit_local_executor_pickles_and_runs_in_subprocesses(tmp_path, markers, monkeypatch):
    # the path a real Slurm job takes: the job is pickled, then run by a fresh interpreter
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    cells = toy_cells(2)
    store = ResultStore(tmp_path / "store")
    status = run_sweep(cells, functools.partial(marker_cell_fn, marker_dir=str(markers)), store,
                       executor="slurm", slurm=dict(cluster="local", time=5, cpus_per_task=1))
    assert status.complete, str(status)
    assert os.getpid() not in {int((markers / f"pid-{c.key}").read_text()) for c in cells}
    assert_store_clean(store, cells)


def test_run_sweep_rejects_duplicates_and_bad_executor(tmp_path):
    c = toy_cells(1)
    with pytest.raises(ValueError, match="duplicated"):
        run_sweep(c + c, frame_cell_fn, ResultStore(tmp_path / "s"))
    with pytest.raises(ValueError, match="executor"):
        run_sweep(c, frame_cell_fn, ResultStore(tmp_path / "s"), executor="threads")


# ------------------------------------------------------------------------------ status CLI hook


def test_sweep_status_by_name_and_of_every_store(tmp_path, monkeypatch, markers, capsys):
    from midas_nb.cli import main

    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    cells = toy_cells(3)
    (markers / f"fail-{cells[2].key}").touch()
    store = ResultStore(name="toy")
    assert store.root == tmp_path / "runs" / "sweeps" / "toy"
    # register the grid, compute only the first two cells: the third shows as pending
    store.register(cells)
    run_sweep(cells[:2], functools.partial(marker_cell_fn, marker_dir=str(markers)), store)
    table = open_store("toy", must_exist=True).status()
    assert list(table["status"]) == ["done", "done", "pending"]
    run_sweep(cells, functools.partial(marker_cell_fn, marker_dir=str(markers)), store)
    table = open_store("toy", must_exist=True).status()
    assert list(table["status"]) == ["done", "done", "failed"]
    assert main(["sweep", "status"]) == 1                               # every store under runs/sweeps
    assert "3 cells: 2 done, 1 failed, 0 running, 0 pending" in capsys.readouterr().out
    assert main(["sweep", "status", "toy"]) == 1
    assert "FAILED" in capsys.readouterr().out
    with pytest.raises(FileNotFoundError, match="no sweep store .*; known sweeps: toy$"):
        open_store("nope", must_exist=True)
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "empty"))      # no store yet: no empty list shown
    with pytest.raises(FileNotFoundError, match=r"\(a profile's store has its name\); none exists yet "
                                                r"\(a run or `midas-nb sweep submit` makes one\)"):
        open_store("nope", must_exist=True)


# ------------------------------------------------------------------------------ the real cell function


@pytest.mark.slow
def test_protocol_cell_runner_on_the_smoke_profile(tmp_path):
    """Two cells of the real protocol through the store; their rows equal a direct run_protocol."""
    from midas_nb.metrics import decoupling_D
    from midas_nb.study import ProtocolCellRunner, run_cells

    prof = get_profile("smoke", max_eval_images=8, bootstrap=20, idauc_steps=4,
                       scorer_train=dict(epochs=1, batch_size=32, lr=1e-3))
    cells = make_grid(prof, "scale", backbones=[prof["backbone"]], conditions=["reference", "unsupervised"])
    store = ResultStore(tmp_path / "store")
    runner = ProtocolCellRunner(prof)
    status = run_sweep(cells, runner, store)
    assert status.complete, str(status)
    df = store.results(cells)
    assert list(df["condition"]) == ["reference", "unsupervised"]
    assert set(df["dataset"]) == {"synthetic"} and set(df["depth"]) == {prof["depth"]}
    study = runner.study(cells[0])
    assert set(df["checkpoint_id"]) == {study.meta["checkpoint_id"]}
    assert df["miou"].between(0, 1).all() and df["idauc"].between(-1, 1).all()
    D = decoupling_D(df)
    assert D.set_index("condition").loc["reference", "D_pp"] == 0
    # the store's rows are exactly what a direct run_protocol with the cells' settings gives
    from midas_nb.analysis.protocol import run_protocol
    from midas_nb.study.grid import protocol_settings
    settings = {k: v for k, v in protocol_settings(prof).items() if k not in ("image_size", "patch_size")}
    direct = run_protocol(study.train_set, study.test_set, study.model, depth=prof["depth"], budget=prof["budget"],
                          conditions=["reference", "unsupervised"], seeds=prof["seeds"],
                          dataset_name=study.dataset_name, backbone_name=prof["backbone"],
                          checkpoint_id=study.meta["checkpoint_id"], progress=False, **settings)
    assert direct["from_cache"][direct["condition"] == "unsupervised"].all()     # the cells' scorer
    for col in ("condition", "seed", "miou", "miou_lo", "miou_hi", "idauc", "idauc_lo", "idauc_hi", "accuracy",
                "n_images", "n_skipped_parts", "weights_digest", "image_ids", "miou_per_image",
                "idauc_per_image", "accuracy_per_image"):
        assert df[col].tolist() == direct[col].tolist(), col
    assert df["weights_digest"].iloc[0] == study.meta["weights_digest"]
    # the same cells through run_cells read the store and compute nothing new
    again, status = run_cells(prof, cells, store=store, runner=_must_not_run)
    assert status.complete
    pd.testing.assert_frame_equal(again, df)


def _must_not_run(cell: SweepCell) -> list[dict]:
    raise AssertionError(f"cell {cell.label} should have been read from the store")


def test_protocol_cell_runner_reuses_a_given_study_in_process_only():
    import pickle
    from types import SimpleNamespace

    from midas_nb.study import ProtocolCellRunner

    bb = SimpleNamespace(name="vit_smoke", build=0)
    fake = SimpleNamespace(dataset_name="synthetic", settings=SimpleNamespace(backbone=bb))
    runner = ProtocolCellRunner(get_profile("smoke"), study=fake)
    assert runner.study(toy_cells(1)[0]) is fake
    clone = pickle.loads(pickle.dumps(runner))
    assert clone._local_study is None and clone.profile == runner.profile


def test_synthetic_recipe_is_used_only_for_the_embedded_set(tmp_path):
    from midas_nb.config import finetune_settings
    from midas_nb.data import make_synthetic_cub
    from midas_nb.study import checkpoint_spec_id
    prof = get_profile("quick")
    # a real-data root (CUB layout) of its own: spec ids are content-based, so it must exist
    cub = make_synthetic_cub(tmp_path / "cub", num_classes=2, images_per_class=2, image_size=64)
    real = get_profile("quick", data_root=str(cub))
    assert finetune_settings(prof, "synthetic") == prof["synthetic_finetune"]
    shared = {k: v for k, v in real["finetune"].items() if not isinstance(v, dict)}
    assert finetune_settings(real, "cub") == shared == finetune_settings(real, "cub", "hybrid_lite0_vit")
    # a per-backbone entry overrides the shared settings for that backbone only (real data only)
    assert finetune_settings(real, "cub", "hybrid_lite0_deit") == dict(shared, epochs=24)
    assert finetune_settings(prof, "synthetic", "hybrid_lite0_deit") == prof["synthetic_finetune"]
    assert checkpoint_spec_id(real, "cub", "hybrid_lite0_deit") != checkpoint_spec_id(
        dict(real, finetune=dict(shared, hybrid_lite0_deit=dict(epochs=25))), "cub", "hybrid_lite0_deit")
    assert checkpoint_spec_id(real, "cub", "hybrid_lite0_vit") == checkpoint_spec_id(
        dict(real, finetune=shared), "cub", "hybrid_lite0_vit")
    assert finetune_settings(get_profile("smoke"), "synthetic") == get_profile("smoke")["finetune"]  # no override
    # the synthetic recipe enters the spec id of synthetic cells only
    other = dict(prof, synthetic_finetune=dict(prof["synthetic_finetune"], epochs=1))
    assert checkpoint_spec_id(other, "cub", "hybrid_lite0_vit") != checkpoint_spec_id(prof, "cub", "hybrid_lite0_vit")
    real_other = dict(real, synthetic_finetune=dict(epochs=1))
    assert checkpoint_spec_id(real_other, "cub", "hybrid_lite0_vit") == checkpoint_spec_id(real, "cub", "hybrid_lite0_vit")


# ------------------------------------------------------------------------------ claims and the index (issue 30, case 5)


def hold_first_start_fn(cell: SweepCell, marker_dir: str) -> list[dict]:
    """Like :func:`marker_cell_fn`, but the *first* start of a cell with a ``hold-<key>`` file
    waits until ``release-<key>`` exists (later starts, a duplicate computation, do not wait)."""
    d = Path(marker_dir)
    first = count(d, "start", cell) == 0
    (d / f"start-{cell.key}-{uuid.uuid4().hex}").touch()
    if first and (d / f"hold-{cell.key}").exists():
        wait_for(lambda: (d / f"release-{cell.key}").exists(), "the test to release the held cell", 120)
    (d / f"finish-{cell.key}-{uuid.uuid4().hex}").touch()
    return [dict(metric="score", value=cell.depth * 100 + cell.seed), dict(metric="other", value=-cell.depth)]


def _held_sweep_script(store_root: str, marker_dir: str, n: int) -> None:
    """Body of a sweep process over :func:`hold_first_start_fn`: exits 0 when its sweep is complete."""
    fn = functools.partial(hold_first_start_fn, marker_dir=marker_dir)
    sys.exit(0 if run_sweep(toy_cells(n), fn, ResultStore(store_root)).complete else 3)


def test_two_sweep_processes_over_one_store_compute_each_cell_once_and_both_complete(tmp_path, markers):
    """Process A holds cell 0; process B over the same store does the other cells, then waits for
    cell 0 (it used to skip it and end incomplete, "1 running"); A, released, finds the others
    done. Both end complete, every cell computed exactly once."""
    cells, root = toy_cells(6), tmp_path / "store"
    (markers / f"hold-{cells[0].key}").touch()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), str(TESTS), os.environ.get("PYTHONPATH", "")]))
    code = f"from test_sweeps import _held_sweep_script; _held_sweep_script({str(root)!r}, {str(markers)!r}, 6)"
    a = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=str(tmp_path))
    try:
        wait_for(lambda: count(markers, "start", cells[0]) == 1, "sweep A holding cell 0")
        b = subprocess.Popen([sys.executable, "-c", code], env=env, cwd=str(tmp_path))
        wait_for(lambda: all(ResultStore(root).state(c.key) == "done" for c in cells[1:]), "the other cells done")
        (markers / f"release-{cells[0].key}").touch()
        assert (a.wait(timeout=120), b.wait(timeout=120)) == (0, 0)
    finally:
        for proc in (a, b):
            if proc.poll() is None:
                proc.kill()
    assert [count(markers, "start", c) for c in cells] == [1] * 6      # no cell computed twice
    assert_store_clean(store := ResultStore(root), cells)
    assert not list((store.root / "locks").glob("*.running")) and not list(store.cells_dir.glob("*.running"))


def test_a_killed_workers_claim_is_taken_over_at_once_and_a_held_one_waited_for(tmp_path, markers):
    """A claim is a kernel lock (decision 0078): a claim file whose holder is gone, even one a job on another node
    left seconds ago (the old heartbeat claims made a sweep wait for its time-to-live), is taken over at once; a
    claim another process holds is waited for and the cell computed once it is given back."""
    cells = toy_cells(2)
    store = ResultStore(tmp_path / "store")
    fn = functools.partial(marker_cell_fn, marker_dir=str(markers))
    store.running_path(cells[1].key).write_text(json.dumps(dict(key=cells[1].key, host="node-elsewhere", pid=1,
                                                                job_id="77_0", ttl_s=5.0, token="x")))
    assert store.claim_info(cells[1].key) == dict(live=False) and store.claim_info(cells[0].key) is None
    held = store.hold(cells[0].key)                  # another descriptor: to flock, another holder
    assert store.claim_info(cells[0].key) == dict(live=True) and store.state(cells[0].key) == "running"
    assert store.hold(cells[0].key) is None
    start = time.time()
    given_back = threading.Timer(1.0, store.release, args=(cells[0].key, held))
    given_back.start()
    status = run_sweep(cells, fn, store)
    assert list(status.table["status"]) == ["done", "done"]
    assert [count(markers, "start", c) for c in cells] == [1, 1]
    assert json.loads(store.path(cells[0].key).read_text())["started"] >= start + 1.0      # after the release
    assert json.loads(store.path(cells[1].key).read_text())["started"] < start + 1.0       # at once
    assert not list(store.cells_dir.glob("*.running"))


def _register_many(root: str, cells: list[SweepCell]) -> None:
    store = ResultStore(root)
    for c in cells:
        store.register([c])


def test_concurrent_registrations_lose_no_cell(tmp_path):
    """300 cells registered one by one from 3 processes × 4 threads: grid.json lists all 300."""
    cells = [SweepCell("synthetic", "vit_smoke", depth=1 + i % 7, budget=0.25, condition="reference", seed=i)
             for i in range(300)]
    root = str(tmp_path / "store")
    ctx = __import__("multiprocessing").get_context("fork")
    procs = [ctx.Process(target=_threads_register, args=(root, cells[i::3])) for i in range(3)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=300)
        assert p.exitcode == 0
    grid = json.loads((Path(root) / "grid.json").read_text())
    assert len(grid) == 300 and set(grid) == {c.key for c in cells}


def _threads_register(root: str, cells: list[SweepCell]) -> None:
    ts = [threading.Thread(target=_register_many, args=(root, cells[i::4])) for i in range(4)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


# ------------------------------------------------------------------------------ cluster submission (issue 30)


def test_slurm_executor_without_slurm_is_one_clear_error(tmp_path, monkeypatch, markers):
    """No silent local fallback: without sbatch, executor='slurm' names the alternatives."""
    from midas_nb.sweeps.slurm import SlurmNotFound
    monkeypatch.setenv("PATH", str(tmp_path))          # no sbatch, no srun
    with pytest.raises(SlurmNotFound, match=r"no 'sbatch'.*run here \(--executor local, or executor='local'\)$"):
        run_sweep(toy_cells(2), functools.partial(marker_cell_fn, marker_dir=str(markers)),
                  ResultStore(tmp_path / "store"), executor="slurm", slurm=dict(partition="gpu"))
    assert not list(markers.iterdir())                  # nothing ran


def test_an_sbatch_that_refuses_is_one_clear_error_on_the_command_line(tmp_path, monkeypatch, markers, capsys):
    """An sbatch without a reachable controller (Slurm's client installed, no cluster configured)
    refuses every submission: one line with its last error and the alternatives, exit status 2,
    not submitit's traceback; nothing runs."""
    from midas_nb import cli
    from midas_nb.sweeps.slurm import SlurmNotFound
    fake = tmp_path / "bin"
    fake.mkdir()
    for name in ("sbatch", "scontrol"):
        (fake / name).write_text("#!/bin/sh\necho 'sbatch: error: fetch_config: DNS SRV lookup failed' >&2\n"
                                 "echo 'sbatch: fatal: Could not establish a configuration source' >&2\nexit 1\n")
        (fake / name).chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake}{os.pathsep}{os.environ['PATH']}")
    with pytest.raises(SlurmNotFound, match=r"sbatch refused the submission: sbatch: fatal: Could not establish a "
                                            r"configuration source; .*run the sweep here "
                                            r"\(--executor local, or executor='local'\)$"):
        run_sweep(toy_cells(2), functools.partial(marker_cell_fn, marker_dir=str(markers)),
                  ResultStore(tmp_path / "store"), executor="slurm", slurm=dict(partition="gpu"), wait=False)
    assert not list(markers.iterdir())
    # the refused cells are not "pending" forever: status says so (exit 1), the same submission sends them again
    from midas_nb.sweeps.slurm import cell_states
    store = ResultStore(tmp_path / "store")
    assert list(cell_states(store)["job_state"]) == ["unsubmitted", "unsubmitted"]
    later = toy_cells(3)[2]                 # registered after the refusal, never sent to sbatch: not refused
    store.register([later])
    assert cell_states(store).set_index("key").loc[later.key, "job_state"] == ""
    capsys.readouterr()
    assert cli.main(["sweep", "status", str(store.root)]) == 1 and cli.main(["sweep", "wait", str(store.root)]) == 1
    assert "2 cells never submitted (sbatch refused): the same midas-nb sweep submit again" in capsys.readouterr().out
    with pytest.raises(SlurmNotFound, match="sbatch refused the submission"):   # tried again: refused again
        submit_sweep(toy_cells(3), functools.partial(marker_cell_fn, marker_dir=str(markers)), store)
    assert list(cell_states(store)["job_state"]) == ["unsubmitted"] * 3       # all three were sent to sbatch
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["sweep", "submit", "--profile", "smoke", "--sweep", "random"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("midas-nb sweep submit: sbatch refused the submission"), err
    # without a store name: every store (the README's commands), no traceback
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "empty"))
    assert cli.main(["sweep", "wait"]) == 0 and capsys.readouterr().out.strip() == "no sweeps found"
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    assert cli.main(["sweep", "wait"]) == 1 and "never submitted" in capsys.readouterr().out


def test_jobs_never_mix_backbones_and_arrays_fit_max_array_size():
    from midas_nb.sweeps.slurm import chunk_arrays, plan_jobs
    cells = [SweepCell(ds, bb, depth=L, budget=b, condition="T5", seed=s, checkpoint_id=f"{ds}-{bb}")
             for ds in ("cub", "cars") for bb in ("deit_tiny", "deit_small") for L in (3, 6, 9, 11)
             for b in (0.1, 0.25) for s in (0, 1, 2)]
    prepare, chunks = plan_jobs(cells, cells_per_job=5)
    assert [(c.dataset, c.backbone) for c in prepare] == [(d, b) for d in ("cub", "cars")
                                                           for b in ("deit_tiny", "deit_small")]
    assert all(len({(c.dataset, c.backbone) for c in ch}) == 1 and len(ch) <= 5 for ch in chunks)
    assert sorted(c.key for ch in chunks for c in ch) == sorted(c.key for c in cells)
    assert len(chunks) == 4 * 5                          # 24 cells a group: 5 jobs each
    arrays = chunk_arrays(2736, 1001)
    assert [len(a) for a in arrays] == [1001, 1001, 734] and max(max(a) for a in arrays) == 2735
    with pytest.raises(ValueError, match="cells_per_job must be >= 1"):
        plan_jobs(cells, 0)


def test_the_regime_grid_and_its_spans_come_from_profile_keys_not_the_profile_name():
    """paper's full grid over three datasets and backbones is its keys' (``regime_grid``,
    ``datasets``, ``backbones``): the same keys give another profile the same grid, and paper
    with ``regime_grid: cross`` gets the cross."""
    from midas_nb.study import grid_spans

    roots = {d: f"/x/{d}" for d in ("cub", "aircraft", "cars")}
    paper = get_profile("paper", data_roots=roots)
    bbs = paper["backbones"]
    ids = {(d, b): "c" for d in paper["datasets"] for b in bbs}
    full = make_grid(paper, "regime", checkpoint_ids=ids, data_ids=ids)
    points = {(c.depth, c.budget) for c in full}
    assert len(points) == 16 and len({c.dataset for c in full}) == 3 and len({c.backbone for c in full}) == 3
    like = get_profile("rehearsal", data_roots=roots, regime_grid="full", depths=paper["depths"],
                       budgets=paper["budgets"])
    assert grid_spans(like) == grid_spans(paper) == (paper["datasets"], bbs)
    assert {(c.depth, c.budget) for c in make_grid(like, "regime", checkpoint_ids=ids, data_ids=ids)} == points
    cross = make_grid(dict(paper, regime_grid="cross"), "regime", checkpoint_ids=ids, data_ids=ids)
    assert len({(c.depth, c.budget) for c in cross}) == 4 + 4 - 1


def test_a_sweeps_status_says_how_many_cells_the_whole_store_holds(tmp_path, markers):
    """A notebook's sweep counts its own grid; the store holds every sweep's cells, which
    ``midas-nb sweep status`` counts: the notebook's line says both, so the two numbers agree."""
    cells = toy_cells(6)
    fn = functools.partial(marker_cell_fn, marker_dir=str(markers))
    store = ResultStore(tmp_path / "store")
    run_sweep(cells[:4], fn, store)                                    # another notebook's grid
    status = run_sweep(cells[4:], fn, store)
    head = str(status).splitlines()[0]
    assert head == (f"2 cells: 2 done, 0 failed, 0 running, 0 pending  [{store.root}; 6 cells in the store, "
                    "`midas-nb sweep status` counts them all]")
    whole = format_status(store.status()).splitlines()[0]
    assert whole == f"6 cells: 6 done, 0 failed, 0 running, 0 pending  [{store.root}]"
