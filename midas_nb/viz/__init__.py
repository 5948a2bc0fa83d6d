"""Figures of the MIDAS notebooks (matplotlib only), one function per figure.

Every function returns a :class:`matplotlib.figure.Figure` with labelled axes (units in the
labels), a legend or colour bar where colours carry meaning, and font sizes readable at
notebook width. With ``save="name"`` the figure is also written to
``<output dir>/<notebook>_<name>.png`` (DESIGN.md §1: figures are named after the notebook);
the notebook and the output directory are set once per notebook with :func:`set_output`
(default directory: :func:`midas_nb.config.figures_dir`).

Figures are made with ``pyplot`` so that Jupyter's inline backend shows each one exactly once
at the end of its cell (notebook cells assign ``fig = plots.x(...)``, which prints no repr).
Under a non-interactive backend (``Agg``: scripts, tests, nbval with ``MPLBACKEND=Agg``) the
figure is closed as soon as it is drawn and saved, so long runs never accumulate open figures.

Every figure that colours by condition or target takes the colour from
:func:`condition_color` (a fixed colour per known name), so one condition has one colour in
every notebook.

Figures:

- :func:`show_parts_on_grid` — photos with part keypoints, the part-mask patches of the patch
  grid and the object box (how part mIoU sees an image, DESIGN.md §6).
- :func:`target_heatmaps` — target maps ``[B,N]`` over the photos: one block of panels per
  image (photo, then one panel per target), part patches outlined (DESIGN.md §4).
- :func:`taxonomy_table` — the T0–T5 taxonomy (source × operator) as a DataFrame, read from the
  registered targets' metadata (:func:`midas_nb.targets.taxonomy_table`).
- :func:`coverage_vs_faithfulness` — part mIoU vs IDAUC per condition with CIs and the
  IDAUC parity band around the reference (DESIGN.md §6).
- :func:`cosine_heatmap` — the cosine matrix of target rankings with one pair called out;
  :func:`cosine_depth_lines` — chosen pairs across depths.
- :func:`regime_heatmap`, :func:`regime_lines` — D over depth × budget, in-band cells marked.
- :func:`scale_plot` — D per backbone.
- :func:`kept_tokens_overlay` — the kept patch tokens over the photo.
- :func:`insertion_deletion_curves` — the curves behind IDAUC (Petsiuk et al., 2018, RISE,
  https://arxiv.org/abs/1806.07421).
- :func:`perturbation_plot` — TokenTM's positive / negative perturbation tests (Wu et al.,
  2024, https://arxiv.org/abs/2403.14552).
"""
from __future__ import annotations

# finish_figure, to_numpy and patch_rects are drawing helpers midas_nb.viz.widgets shares (not in __all__)
from .output import figure_path, finish_figure, FONT, save_csv, save_figure, set_output  # noqa: F401
from .colors import CONDITION_COLORS, condition_color  # noqa: F401
from .common import image_to_rgb, patch_rects, to_numpy  # noqa: F401
from .images import kept_tokens_overlay, show_parts_on_grid, target_heatmaps  # noqa: F401
from .protocol import coverage_vs_faithfulness, insertion_deletion_curves, perturbation_plot  # noqa: F401
from .probes import cosine_depth_lines, cosine_heatmap  # noqa: F401
from .regimes import regime_heatmap, regime_lines, scale_plot  # noqa: F401
from ..targets import taxonomy_table  # noqa: F401 - the taxonomy is metadata of the registered targets

__all__ = [
    "set_output",
    "figure_path",
    "save_figure",
    "save_csv",
    "image_to_rgb",
    "condition_color",
    "CONDITION_COLORS",
    "show_parts_on_grid",
    "target_heatmaps",
    "taxonomy_table",
    "coverage_vs_faithfulness",
    "cosine_heatmap",
    "cosine_depth_lines",
    "regime_heatmap",
    "regime_lines",
    "scale_plot",
    "kept_tokens_overlay",
    "insertion_deletion_curves",
    "perturbation_plot",
]
