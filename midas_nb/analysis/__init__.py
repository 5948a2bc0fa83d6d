"""The analysis: what the run concludes from the metrics, at one depth ``L`` and budget ``b``.

- :mod:`~midas_nb.analysis.protocol` — the three-condition protocol (DESIGN.md §5): every
  condition's scorer trained and evaluated on the same images; coverage, IDAUC, accuracy,
  speed and ``D`` with paired intervals.
- :mod:`~midas_nb.analysis.last` — **LaSt-ViT** (Shi, Yu & Yang, 2026,
  https://arxiv.org/abs/2602.22394): the stability statistic's aggregation, its short fine-tune,
  Patch Score and Point-in-Box before and after.
- :mod:`~midas_nb.analysis.related` — the related methods in one table with the MIDAS
  conditions (notebook 06): :func:`~midas_nb.analysis.related.run_related`.

Example::

    >>> from midas_nb.analysis import related
    >>> res = related.run_related(study)          # protocol + perturbation + LaSt, one table
    >>> res.table[["kind", "method", "miou", "idauc", "D_pp", "pib", "accuracy", "throughput"]]
"""
