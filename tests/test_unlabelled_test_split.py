"""The library refuses a test split without labels (issue 27): a Stanford Cars directory without
``cars_test_annos_withlabels.mat`` used to train, evaluate and store accuracy 0.0 as done."""
from __future__ import annotations

import pytest
import torch

from midas_nb.data import DatasetError, make_synthetic_cub
from midas_nb.data.builders import make_cars_from_cub


def test_study_refuses_cars_without_the_labelled_test_file_before_anything_is_stored(tmp_path, monkeypatch):
    from midas_nb.study import Study
    from midas_nb.sweeps import ResultStore

    monkeypatch.setenv("MIDAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    cub = make_synthetic_cub(tmp_path / "cub", num_classes=2, images_per_class=4, image_size=64)
    cars = make_cars_from_cub(cub, tmp_path / "cars", num_classes=2, per_split=(2, 2))
    labelled = Study("smoke", dataset="cars", data_root=str(cars), progress=False)
    assert sorted(labelled.test_set.labels) == [0, 0, 1, 1]          # with the labelled file: usable
    (cars / "devkit" / "cars_test_annos_withlabels.mat").unlink()      # the original test file only
    study = Study("smoke", dataset="cars", data_root=str(cars), progress=False)
    assert len(study.train_set) == 4                                   # the train split has labels
    with pytest.raises(DatasetError, match=r"cars_test_annos\.mat has no class field.*"
                                           r"cars_test_annos_withlabels\.mat — put it in .*devkit"):
        study.test_set
    with pytest.raises(DatasetError, match="cars_test_annos_withlabels.mat"):
        study.protocol(conditions=["reference", "T5"])
    # nothing was trained or stored
    assert ResultStore(name="smoke").results().empty
    assert not list((tmp_path / "cache").glob("checkpoints/*.pt"))


def test_run_protocol_refuses_test_images_without_a_label(tmp_path):
    from midas_nb.analysis.protocol import run_protocol
    from test_protocol import tiny_vit
    from tiny_data import TinyDataset

    torch.set_num_threads(1)
    train = TinyDataset(8, 4)
    test = TinyDataset(6, 5, labels=torch.tensor([0, 1, -1, 3, -1, 1]))
    with pytest.raises(ValueError, match="2 of 6 evaluated images without a label"):
        run_protocol(train, test, tiny_vit(), depth=2, budget=0.25, conditions=["reference"], seeds=[0],
                     dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", idauc_steps=2, bootstrap=10,
                     cache_dir=tmp_path, progress=False, throughput_repeats=1, throughput_batch=2)
