"""A result-store cell names the checkpoint its rows were computed with (issue 27): studies that
differ only in ``torch_threads`` (part of the checkpoint identity) never share a protocol table."""
from __future__ import annotations

import pytest
import torch

from midas_nb.data import make_synthetic_cub


@pytest.mark.slow
def test_two_studies_differing_in_torch_threads_never_mix_checkpoints_in_one_table(tmp_path, monkeypatch):
    from midas_nb.study import ProtocolCellRunner, Study
    from midas_nb.sweeps import SweepCell

    monkeypatch.setenv("MIDAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    root = make_synthetic_cub(tmp_path / "data", num_classes=4, images_per_class=6, image_size=96)
    settings = dict(data_root=str(root), dataset="cub", max_eval_images=6, bootstrap=20, idauc_steps=2,
                    finetune=dict(epochs=2, batch_size=32, lr=2e-3, warmup_epochs=0),
                    scorer_train=dict(epochs=1, batch_size=32, lr=1e-3, throughput_repeats=1, throughput_batch=2))
    n = torch.get_num_threads()
    try:
        one = Study("smoke", progress=False, torch_threads=1, **settings)
        ref_one = one.protocol(conditions=["reference"])
        two = Study("smoke", progress=False, torch_threads=2, **settings)
        table = two.protocol(conditions=["reference", "T5"])
        # the 2-thread study fine-tuned its own checkpoint; every row of its table comes from it
        assert two.meta["checkpoint_id"] != one.meta["checkpoint_id"]
        assert set(table["checkpoint_id"]) == {two.meta["checkpoint_id"]}
        assert table["weights_digest"].nunique() == 1
        assert not set(table["cell_key"]) & set(ref_one["cell_key"])   # the 1-thread row was not reused
        # back in the 1-thread study (the other study changed the process's threads meanwhile):
        # its own reference row again, and T5 trained on its own checkpoint
        again = one.protocol(conditions=["reference", "T5"])
        assert set(again["checkpoint_id"]) == {one.meta["checkpoint_id"]}
        assert set(ref_one["cell_key"]) <= set(again["cell_key"])
        # a cell keyed by another checkpoint is refused, not filled with this one's rows
        cell = SweepCell("cub", two.params["backbone"], 2, 0.25, "T5", 0, checkpoint_id=one.meta["checkpoint_id"],
                         params={})
        with pytest.raises(ValueError, match="keyed by checkpoint .*rebuild the grid"):
            ProtocolCellRunner(two.params, study=two)(cell)
    finally:
        torch.set_num_threads(n)


def test_a_study_without_torch_threads_keys_its_checkpoint_at_torch_default_after_another_study():
    """``torch_threads: None`` means torch's default: a quick study made after a smoke study (1
    thread) in one process gets the checkpoint id of a quick study made alone."""
    from midas_nb.study import StudyBase
    from midas_nb.study.base import _TORCH_DEFAULT_THREADS

    n = torch.get_num_threads()
    try:
        alone = StudyBase("quick", progress=False).checkpoint_key()[1]["numerics"]["num_threads"]
        StudyBase("smoke", progress=False)                        # torch_threads = 1
        assert torch.get_num_threads() == 1
        after = StudyBase("quick", progress=False)
        assert torch.get_num_threads() == _TORCH_DEFAULT_THREADS
        assert after.checkpoint_key()[1]["numerics"]["num_threads"] == alone == _TORCH_DEFAULT_THREADS
    finally:
        torch.set_num_threads(n)


def test_canonical_json_of_pandas_missing_values_and_timestamps():
    """pandas' missing values are JSON null (NaT has an isoformat too, and must not read "NaT");
    a timestamp is its ISO text."""
    import pandas as pd

    from midas_nb.identity import canonical_json
    assert canonical_json({"t": pd.NaT, "n": pd.NA}) == '{"n":null,"t":null}'
    assert canonical_json([pd.Timestamp("2026-12-05 10:30")]) == '["2026-12-05T10:30:00"]'


def test_builds_multiply_the_cells_at_the_point_only_and_build_0_keeps_its_keys():
    """``builds`` (decision 0072): the profile's backbone is built with seeds 0..builds-1 at (L, b); each
    build's cells are keyed by its own checkpoint, build 0's exactly as with one build; the sweep's
    other points stay on build 0, and the runner's study of a cell is its build's."""
    from midas_nb import config
    from midas_nb.study import ProtocolCellRunner, make_grid
    from midas_nb.study.grid import cached_study

    one = make_grid(config.get_profile("smoke"), "regime")
    prof = config.get_profile("smoke", builds=2)
    two = make_grid(prof, "regime")
    extra = [c for c in two if c not in one]
    assert set(one) < set(two) and len(extra) == len([c for c in one if (c.depth, c.budget) == (2, 0.25)])
    assert {(c.depth, c.budget, c.params["build"]) for c in extra} == {(2, 0.25, 1)}
    b1 = cached_study(prof, "synthetic", prof["backbone"], build=1)
    assert b1.settings.backbone.recipe.seed == 1
    assert {c.checkpoint_id for c in extra} == {b1.checkpoint_id} != {c.checkpoint_id for c in one}
    assert ProtocolCellRunner(prof).study(extra[0]) is b1


@pytest.mark.slow
def test_a_protocol_of_two_builds_fine_tunes_each_and_pools_them(tmp_path, monkeypatch):
    """The smoke profile keeps one build (its notebooks stay fast); this runs two end to end (decision 0072):
    two checkpoints, rows tagged by build, D pooled over them with each build's D shown."""
    from midas_nb.study import Study

    monkeypatch.setenv("MIDAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    root = make_synthetic_cub(tmp_path / "data", num_classes=4, images_per_class=6, image_size=96)
    study = Study("smoke", progress=False, builds=2, data_root=str(root), dataset="cub", max_eval_images=6,
                  bootstrap=20, idauc_steps=2, finetune=dict(epochs=2, batch_size=32, lr=2e-3, warmup_epochs=0),
                  scorer_train=dict(epochs=1, batch_size=32, lr=1e-3, throughput_repeats=1, throughput_batch=2))
    table = study.protocol(conditions=["reference", "T5"])
    assert sorted(table["build"]) == [0, 0, 1, 1] and table.groupby("build")["checkpoint_id"].nunique().max() == 1
    assert table["checkpoint_id"].nunique() == 2 and study.checkpoint_id in set(table["checkpoint_id"])
    d = study.decoupling(table).set_index("condition").loc["T5"]
    assert d["n_builds"] == 2 and d["D_pp_by_build"].startswith("build 0: ") and "build 1: " in d["D_pp_by_build"]


def test_saved_file_digests_spare_another_process_the_hashing(tmp_path, monkeypatch):
    """A sweep's preparation job saves its image digests (identity.save_file_digests); a cell job that loads them
    hashes no file again, and a file changed since is hashed anew (its size and times are in the memo's key)."""
    import hashlib

    from midas_nb import identity

    img = tmp_path / "a.jpg"
    img.write_bytes(b"pixels")
    digest = identity.file_digest(img)
    assert digest == hashlib.sha256(b"pixels").hexdigest()
    identity.save_file_digests(tmp_path / "memo.json")
    monkeypatch.setattr(identity, "_FILE_DIGESTS", {})                 # another process: an empty memo
    identity.reset_cache_events()
    assert identity.load_file_digests(tmp_path / "memo.json") >= 1
    assert identity.file_digest(img) == digest and identity.cache_events()["file_hashed"] == 0
    img.write_bytes(b"other pixels")
    assert identity.file_digest(img) == hashlib.sha256(b"other pixels").hexdigest()
    assert identity.cache_events()["file_hashed"] == 1
    assert identity.load_file_digests(tmp_path / "absent.json") == 0
