"""Figures of the notebooks, one function per figure, each returning a :class:`matplotlib.figure.Figure` with
labelled axes and one colour per meaning; ``save="name"`` also writes ``<output dir>/<notebook>_<name>.png``
(:func:`set_output`). Over the photos: :mod:`.images`, :mod:`.widgets`; the protocol and probes: :mod:`.protocol`."""
from __future__ import annotations

# finish_figure and FONT are shared with figures made elsewhere (not in __all__)
from .common import (CONDITION_COLORS, condition_color, figure_path, finish_figure, FONT, image_to_rgb,  # noqa: F401
                     save_csv, set_output)
from .images import show_parts_on_grid, target_heatmaps
from .protocol import (cosine_depth_lines, cosine_heatmap, coverage_vs_faithfulness, insertion_deletion_curves,
                       perturbation_plot, regime_heatmap, regime_lines, scale_plot)
from ..targets import taxonomy_table  # noqa: F401 - the taxonomy is metadata of the registered targets

__all__ = ["set_output", "figure_path", "save_csv", "image_to_rgb", "condition_color",
           "CONDITION_COLORS", "show_parts_on_grid", "target_heatmaps", "taxonomy_table", "coverage_vs_faithfulness",
           "cosine_heatmap", "cosine_depth_lines", "regime_heatmap", "regime_lines", "scale_plot",
           "insertion_deletion_curves", "perturbation_plot"]
