"""The analysis: what the run concludes from the metrics, at one depth ``L`` and budget ``b``.

- :mod:`~midas_nb.analysis.protocol` — the three-condition protocol (DESIGN.md §5): every
  condition's scorer trained and evaluated on the same images; coverage, IDAUC, accuracy,
  speed and ``D`` with paired intervals; its evaluation on the test split (the evaluated images, the
  throughput, each row) in :mod:`~midas_nb.analysis.evaluation`.
- :mod:`~midas_nb.analysis.last` — **LaSt-ViT** (Shi, Yu & Yang, 2026,
  https://arxiv.org/abs/2602.22394): the stability statistic's aggregation, its short fine-tune,
  Patch Score and Point-in-Box before and after.
- :mod:`~midas_nb.analysis.verdict` — whether the MIDAS claim holds on one run, both halves
  tested with paired intervals (:func:`claim_verdict`), and the readings beside it
  (:func:`targets_vs_scorers`, :func:`paired_gap`).
- :mod:`~midas_nb.analysis.synthesis` — the reader's take-away: the paper's claims beside this run's
  (:func:`~midas_nb.analysis.synthesis.claims_table`), target content against training signal
  (:func:`~midas_nb.analysis.synthesis.content_vs_signal`) and each notebook's closing box;
  :mod:`~midas_nb.analysis.comovement` — half (c) of the verdict, images, builds and seeds resampled.
- :mod:`~midas_nb.analysis.advice` — which condition to deploy for a goal
  (:func:`recommend_deployment`).
- :mod:`~midas_nb.analysis.control` — ``D`` against the reference beside ``D`` against the
  random-map control (:func:`~midas_nb.analysis.control.decoupling_with_controls`).
- :mod:`~midas_nb.analysis.findings` — which of the MIDAS paper's findings hold on a run, each
  with its evidence and interval (:func:`~midas_nb.analysis.findings.paper_findings`), against
  the paper's numbers in :mod:`~midas_nb.analysis.paper_reference`.
- :mod:`~midas_nb.analysis.related` — the related methods in one table with the MIDAS
  conditions (notebook 06): :func:`~midas_nb.analysis.related.run_related`.

Example::

    >>> from midas_nb.analysis import related
    >>> res = related.run_related(study)          # protocol + perturbation + LaSt, one table
    >>> res.table[["kind", "method", "miou", "idauc", "D_pp", "pib", "accuracy", "throughput"]]
"""
from .advice import GOALS, recommend_deployment, rule_splits
from .verdict import (BASELINE_CONDITIONS, CELL_COLUMNS, CONTROL_CONDITION, ClaimVerdict, claim_verdict,
                      condition_reading, lead_resolved, paired_gap, per_image_means, per_seed_values,
                      targets_vs_scorers)
from .findings import backbone_fitness, fitness_over_builds, scale_scope, share_falls
from .synthesis import collapsed_scorers

__all__ = ["BASELINE_CONDITIONS", "CELL_COLUMNS", "CONTROL_CONDITION", "ClaimVerdict", "GOALS", "backbone_fitness",
           "claim_verdict", "collapsed_scorers", "condition_reading", "fitness_over_builds", "lead_resolved",
           "paired_gap", "per_image_means", "per_seed_values", "recommend_deployment", "scale_scope", "share_falls",
           "targets_vs_scorers"]
