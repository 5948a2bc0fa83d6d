"""Profiles (smoke / quick / paper) and paths (DESIGN.md §7).

A profile is a plain dict of settings; notebooks read theirs from the ``MIDAS_PROFILE``
environment variable (the way botorch tutorials read ``SMOKE_TEST``) and callers override
single keys with ``get_profile(name, **overrides)``.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

__all__ = ["PROFILES", "ProfileName", "get_profile", "finetune_settings", "profile_from_env", "cache_dir", "runs_dir",
           "figures_dir", "project_root", "default_data_root"]

ProfileName = Literal["smoke", "quick", "paper"]

PROFILES: dict[str, dict[str, Any]] = {
    # seconds on 2 CPU cores: synthetic CUB-format data, a tiny ViT trained from scratch
    "smoke": dict(
        dataset="synthetic",
        data_root=None,              # generated under cache_dir()/data/synthetic_smoke
        synthetic=dict(num_classes=4, images_per_class=12, image_size=96, seed=0),
        backbone="vit_smoke",
        image_size=64,
        patch_size=8,
        finetune=dict(epochs=12, batch_size=32, lr=2e-3, warmup_epochs=1),
        depth=2,
        budget=0.25,
        depths=[1, 2],  # L = depth-1 = 3 makes T5 degenerate (docs/architecture.md)
        budgets=[0.25, 0.5],
        seeds=[0],
        conditions=["reference", "unsupervised", "T1", "T5"],
        targets=["T0", "T1", "T2", "T3", "T4", "T5", "rollout", "tokentm", "last_votes", "random"],
        scorer_train=dict(epochs=2, batch_size=32, lr=1e-3, throughput_repeats=1, throughput_batch=4),
        idauc_steps=4,
        max_eval_images=12,
        bootstrap=100,
        scale_backbones=["vit_smoke", "vit_smoke_wide"],
        device="cpu",
    ),
    # minutes on 2 CPU cores: the real CUB subset where given, the offline hybrid backbone
    "quick": dict(
        dataset="cub",
        data_root=None,              # None: the embedded synthetic default
        synthetic=dict(num_classes=8, images_per_class=24, image_size=256, seed=0),
        backbone="hybrid_lite0_vit",
        image_size=224,
        patch_size=16,
        # 62.3% test top-1 on the real CUB subset (40 classes), checkpoint 40d2cedf4f5c
        finetune=dict(epochs=15, batch_size=64, lr=2e-3, warmup_epochs=1),
        # the embedded synthetic set has 96 training images: 30 steps of the recipe above leave
        # the backbone at 39 % (8 classes); 360 smaller steps reach 88.5 % test top-1 in 2 min
        synthetic_finetune=dict(epochs=60, batch_size=16, lr=1e-3, warmup_epochs=2),
        depth=6,
        budget=0.25,
        depths=[3, 6, 9],
        budgets=[0.10, 0.25, 0.50],
        seeds=[0, 1],
        conditions=["reference", "unsupervised", "T1", "T2", "T3", "T4", "T5"],
        # the regime sweep and the scale readout: the reference and the paper's two headline
        # targets (D needs only the reference); the protocol table keeps every condition
        sweep_conditions=["reference", "T1", "T5"],
        related_seeds=[0],           # Cropr, IA-RED², TokenTM, rollout, LaSt rows: one seed
        targets=["T0", "T1", "T2", "T3", "T4", "T5", "rollout", "tokentm", "last_votes", "random"],
        scorer_train=dict(epochs=3, batch_size=64, lr=1e-3, throughput_repeats=2),
        idauc_steps=8,
        max_eval_images=300,         # mIoU, accuracy, PiB: 300 test images
        max_idauc_images=64,         # IDAUC and perturbation curves: the first 64 of them
        bootstrap=1000,
        scale_backbones=["hybrid_lite0_vit_w128", "hybrid_lite0_vit"],
        device="cpu",
    ),
    # GPU: the paper's datasets, backbones, seeds and full grid
    "paper": dict(
        dataset="cub",
        data_root=None,
        synthetic=dict(num_classes=8, images_per_class=24, image_size=256, seed=0),
        backbone="deit_small_patch16_224.fb_in1k",
        image_size=224,
        patch_size=16,
        finetune=dict(epochs=30, batch_size=128, lr=5e-4, warmup_epochs=3),
        depth=6,
        budget=0.25,
        depths=[3, 6, 9, 11],
        budgets=[0.10, 0.25, 0.50, 0.75],
        seeds=[0, 1, 2],
        conditions=["reference", "unsupervised", "T1", "T2", "T3", "T4", "T5"],
        targets=["T0", "T1", "T2", "T3", "T4", "T5", "rollout", "tokentm", "last_votes", "random"],
        scorer_train=dict(epochs=10, batch_size=128, lr=1e-3),
        idauc_steps=20,
        max_eval_images=None,
        bootstrap=2000,
        scale_backbones=["deit_tiny_patch16_224.fb_in1k", "deit_small_patch16_224.fb_in1k",
                         "vit_base_patch16_224.augreg_in21k_ft_in1k"],
        device="cuda",
    ),
}


def get_profile(name: str = "quick", **overrides: Any) -> dict[str, Any]:
    """A copy of profile ``name`` with ``overrides`` merged in (``None`` values are ignored).

    Raises:
        ValueError: for an unknown profile name.
    """
    if name not in PROFILES:
        raise ValueError(f"unknown profile {name!r}; expected one of {sorted(PROFILES)}")
    prof = {k: (dict(v) if isinstance(v, dict) else list(v) if isinstance(v, list) else v)
            for k, v in PROFILES[name].items()}
    prof.update({k: v for k, v in overrides.items() if v is not None})
    prof["profile"] = name
    return prof


def finetune_settings(profile: dict[str, Any], dataset_label: str) -> dict[str, Any]:
    """The fine-tuning recipe a profile uses for a dataset: ``synthetic_finetune`` for the
    embedded synthetic set when the profile has one, else ``finetune``."""
    if dataset_label == "synthetic" and profile.get("synthetic_finetune"):
        return dict(profile["synthetic_finetune"])
    return dict(profile.get("finetune") or {})


def profile_from_env(default: str = "quick") -> str:
    """The profile named by ``MIDAS_PROFILE`` (``default`` when unset)."""
    return os.environ.get("MIDAS_PROFILE", default)


def project_root() -> Path:
    """The repository root (parent of the ``midas_nb`` package)."""
    return Path(__file__).resolve().parent.parent


def cache_dir() -> Path:
    """Cache for checkpoints, stem features and target maps.

    ``MIDAS_CACHE_DIR`` when set, else ``$XDG_CACHE_HOME/midas_nb`` or ``~/.cache/midas_nb``.
    """
    env = os.environ.get("MIDAS_CACHE_DIR")
    if env:
        p = Path(env)
    else:
        base = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
        p = Path(base) / "midas_nb"
    p.mkdir(parents=True, exist_ok=True)
    return p


def runs_dir() -> Path:
    """``runs/`` (git-ignored) under the project root, or ``MIDAS_RUNS_DIR``."""
    p = Path(os.environ.get("MIDAS_RUNS_DIR") or project_root() / "runs")
    p.mkdir(parents=True, exist_ok=True)
    return p


def figures_dir() -> Path:
    """``figures/`` under the project root, or ``MIDAS_FIGURES_DIR``."""
    p = Path(os.environ.get("MIDAS_FIGURES_DIR") or project_root() / "figures")
    p.mkdir(parents=True, exist_ok=True)
    return p


def default_data_root() -> Path:
    """``../shared/data`` relative to the project root (may not exist)."""
    return project_root().parent / "shared" / "data"


def list_profiles() -> list[str]:
    """Names of the profiles: ``["paper", "quick", "smoke"]``."""
    return sorted(PROFILES)
