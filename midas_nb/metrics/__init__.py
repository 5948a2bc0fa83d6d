"""Metrics of the MIDAS analysis (DESIGN.md §6), each with its direction and its source.

Every metric is registered with Quantus-style metadata (Hedström et al., 2023, Quantus,
https://arxiv.org/abs/2202.06861): whether a higher value is better, its category and the
paper it comes from. ``list_metrics()`` / ``get_metric(name)`` give access to them.

==========================  ==============  ===========================================
metric                      higher better   source
==========================  ==============  ===========================================
``part_miou``               yes             IoU of kept tokens vs part patches (MIDAS)
``box_coverage``            yes             the same IoU against the object box
``insertion_deletion_auc``  yes (IDAUC)     Petsiuk et al., 2018, RISE, arXiv:1806.07421
``decoupling_D``            yes             MIDAS: D = mIoU_t − mIoU_ref in the IDAUC band
``point_in_box``            yes             Shi et al., 2026, LaSt-ViT, arXiv:2602.22394
``pruned_accuracy``         yes             top-1 accuracy of the pruned model
``throughput``              yes             images per second, device-synchronised
==========================  ==============  ===========================================

Helpers: ``patch_score`` (the LaSt-ViT map behind ``point_in_box``), ``centre_in_box`` and
``box_share`` (the two Point-in-Box baselines), ``curve_auc``
(trapezoid rule), ``gaussian_blur`` (the RISE insertion substrate), ``family_readout`` (Cropr's
last-layer fusion and IA-RED²'s threshold rule, the scorer families' own columns) and ``bootstrap_ci``
(:mod:`midas_nb.metrics.stats`: percentile bootstrap over images, Efron & Tibshirani, 1993, *An Introduction to the
Bootstrap*, ch. 13).

Shapes: ``B`` images, ``N`` patch tokens (row-major over the patch grid, prefix tokens
excluded), ``T = P + N`` tokens, ``D`` embedding width, ``S`` insertion/deletion steps.
"""
from __future__ import annotations

import importlib
from typing import Any

from ..point import lazy_names
from .stats import bootstrap_ci, hierarchical_bootstrap, is_finite_number
from .registry import MetricCategory, MetricSpec, register_metric
from .decoupling import (BUILD_COLUMN, CHECKPOINT_COLUMNS, DEFAULT_CELL, DEFAULT_CONDITION_KEY, D_STATUSES, PARITY_BAND,
                         REFERENCE_CHECKS, band_resolution, band_rule, decoupling_D, parity_band, per_image_values)

#: the submodules that import torch, loaded on first use of one of their names (PEP 562), so that the report
#: renders its tables without torch (decision 0080); ``list_metrics`` and ``get_metric`` load them all first
_LAZY = {".coverage": ("COVERAGE_KINDS", "INFORMATIVE_BOX_MAX_FRACTION", "PartIoU", "box_coverage", "informative_box",
                       "iou_ceiling", "part_miou"),
         ".insdel": ("InsDel", "curve_auc", "gaussian_blur", "insertion_counts", "insertion_deletion_auc"),
         ".lastvit": ("box_share", "centre_in_box", "centre_patch", "patch_score", "point_in_box"),
         ".speed": ("SPEED_ROUNDS", "family_readout", "measure_speed", "measure_throughput", "measure_throughputs",
                    "pruned_accuracy")}


_get, __dir__ = lazy_names(__name__, {**{n: m for m, names in _LAZY.items() for n in names},
                                      "list_metrics": ".registry", "get_metric": ".registry"})


def __getattr__(name: str) -> Any:
    if name in ("list_metrics", "get_metric"):
        for module in _LAZY:
            importlib.import_module(module, __name__)
    return _get(name)


__all__ = ["MetricSpec", "register_metric", "list_metrics", "get_metric", "PartIoU", "part_miou", "box_coverage",
    "informative_box", "INFORMATIVE_BOX_MAX_FRACTION", "iou_ceiling", "InsDel", "insertion_deletion_auc",
    "insertion_counts", "curve_auc", "gaussian_blur", "decoupling_D", "D_STATUSES", "PARITY_BAND", "band_resolution",
    "band_rule", "parity_band", "hierarchical_bootstrap", "patch_score", "point_in_box", "centre_patch",
    "centre_in_box", "box_share", "pruned_accuracy", "measure_throughput", "measure_throughputs", "measure_speed",
    "family_readout", "SPEED_ROUNDS", "bootstrap_ci", "COVERAGE_KINDS", "is_finite_number"]
