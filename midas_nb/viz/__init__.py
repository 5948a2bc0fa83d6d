"""Figures of the MIDAS notebooks (matplotlib only), one function per figure, each returning a
:class:`matplotlib.figure.Figure` with labelled axes (units in the labels), a legend or colour bar where
colours carry meaning, one colour per meaning in every notebook (:mod:`.common`). ``save="name"`` also
writes ``<output dir>/<notebook>_<name>.png`` (DESIGN.md §1; :func:`set_output`). In a notebook a figure
is shown once, its title as the image's alt text; under ``Agg`` (scripts, tests, nbval) it is closed.

Over the photos (:mod:`.images`): part keypoints on the patch grid (§6), target maps (§4). The
protocol's (:mod:`.protocol`): part mIoU vs IDAUC with the parity band (§6), the insertion/deletion
curves behind IDAUC (Petsiuk et al., 2018, RISE, https://arxiv.org/abs/1806.07421), TokenTM's
perturbation tests (Wu et al., 2024, https://arxiv.org/abs/2403.14552). The cosine probes'
(:mod:`.probes`), the regime sweeps' and the scale readout's (:mod:`.regimes`); the explorer
(:mod:`.widgets`). The taxonomy table is the registered targets' metadata.
"""
from __future__ import annotations

# finish_figure and FONT are shared with figures made elsewhere (not in __all__)
from .common import (CONDITION_COLORS, condition_color, figure_path, finish_figure, FONT, image_to_rgb,  # noqa: F401
                     save_csv, save_figure, set_output)
from .images import show_parts_on_grid, target_heatmaps
from .protocol import coverage_vs_faithfulness, insertion_deletion_curves, perturbation_plot
from .probes import cosine_depth_lines, cosine_heatmap
from .regimes import regime_heatmap, regime_lines, scale_plot
from ..targets import taxonomy_table  # noqa: F401 - the taxonomy is metadata of the registered targets

__all__ = ["set_output", "figure_path", "save_figure", "save_csv", "image_to_rgb", "condition_color",
           "CONDITION_COLORS", "show_parts_on_grid", "target_heatmaps", "taxonomy_table", "coverage_vs_faithfulness",
           "cosine_heatmap", "cosine_depth_lines", "regime_heatmap", "regime_lines", "scale_plot",
           "insertion_deletion_curves", "perturbation_plot"]
