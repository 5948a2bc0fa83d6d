"""The profiles are data (midas_nb/profiles.yaml, decision 0064): read once by midas_nb.config, with the
paper's names written out as config's constants and numbers that YAML reads as numbers."""
from __future__ import annotations

from pathlib import Path

import yaml

from midas_nb import config


def test_the_paper_profiles_name_configs_paper_datasets_and_backbones():
    for name in ("paper", "rehearsal"):
        p = config.PROFILES[name]
        assert p["datasets"] == list(config.PAPER_DATASETS)
        assert p["backbones"] == p["scale_backbones"] == list(config.PAPER_BACKBONES)
        assert p["backbones"] is not p["scale_backbones"]       # separate lists, as separate settings


def test_profile_values_have_their_python_types():
    quick = config.get_profile("quick")
    assert quick["finetune"] == dict(epochs=15, batch_size=64, lr=0.002, warmup_epochs=1,
                                     hybrid_lite0_deit=dict(epochs=24), aircraft=dict(batch_size=16, lr=0.001))
    assert type(quick["finetune"]["lr"]) is float and type(quick["depth"]) is int
    assert quick["budgets"] == [0.1, 0.25, 0.5] and quick["data_root"] is None and quick["pretrained"] == "hub"
    assert config.get_profile("paper")["max_eval_images"] is None and config.get_profile("smoke")["torch_threads"] == 1
    assert config.list_profiles() == ["paper", "quick", "rehearsal", "smoke"]


def test_the_file_is_package_data():
    """A non-editable install carries the file only where pyproject.toml names it as package data."""
    root = Path(config.__file__).parent
    assert (root / "profiles.yaml").is_file()
    import tomllib
    pyproject = tomllib.loads((root.parent / "pyproject.toml").read_text(encoding="utf-8"))
    assert "profiles.yaml" in pyproject["tool"]["setuptools"]["package-data"]["midas_nb"]
    assert set(yaml.safe_load((root / "profiles.yaml").read_text(encoding="utf-8"))) == {"common", "profiles"}
