"""``midas-nb report``: the run's result store as ``REPORT.md`` plus its CSV tables, each number
beside the paper's where the paper has one, and a computed statement of which of the paper's
findings hold.

Pipeline (one direction)::

    result store runs/sweeps/<profile>  ──build_tables──▶  tables (DataFrames)
        ──write_tables──▶  <output>/*.csv  ──read_tables──▶  render_report ──▶ REPORT.md
                                                         └──▶  readme_section ──▶ README.md

``REPORT.md`` and the README's results section are rendered **only** from the CSV files, so a
committed ``results/`` folder regenerates both exactly (``midas-nb report --from-tables
results --readme README.md``; ``tests/test_report.py`` checks the README against it).

Tables (one CSV each):

- ``provenance`` — profile, the store read, bootstrap resamples and seed, backbone,
  checkpoint and weights digest, the evaluated images' and the splits' fingerprints (each with
  its source), seeds, sample sizes, what the report left out (failed cells, rows of older
  checkpoints, superseded settings, other conditions), and completeness: every cell the
  profile expects without a result (:func:`missing_cells`), per dataset × backbone;
- ``three_conditions`` — the protocol at the profile's ``(L, b)``: part mIoU, IDAUC and pruned
  accuracy with their bootstrap CIs over images, ``D`` and ``ΔIDAUC`` with the paired intervals
  and band status of :func:`midas_nb.metrics.decoupling_D`, the paper's ``D`` and ``ΔIDAUC``
  (:mod:`midas_nb.report.paper_reference`);
- ``cosine_probes`` — hidden- vs attention-gradient rank cosines per depth, saved into the
  store by notebook 03 (:func:`save_probes`), beside the paper's bound 0.082;
- ``regime`` — ``D`` per ``(L, b)`` cell of the regime sweep, with the paper's expectation;
- ``scale`` — ``D`` per backbone of the scale readout, with the paper's statement;
- ``findings`` — :func:`paper_findings`.

Decisions (docs/architecture.md, "Report"; docs/decisions/0009-report-row-selection.md): rows come from the newest checkpoint of each
dataset × backbone, the newest record of each cell, and the profile's relaxation; everything
else is counted in ``provenance``. Cells the profile expects but the store lacks make
:func:`make_report` refuse unless ``allow_incomplete`` (then the report says INCOMPLETE and
lists them). Every interval uses the profile's ``bootstrap`` and seed :data:`BOOTSTRAP_SEED`.
The cosine probes are not recomputed by the report (that
needs the backbone and data): notebook 03 writes them into the store next to the rows, tagged
with the checkpoint, and the report uses only probes of the checkpoint it reports.
"""
from __future__ import annotations

from .store import IncompleteReportError, SECTIONS, expected_cells, load_store_rows, missing_cells  # noqa: F401
from .probes import load_probes, save_probes  # noqa: F401
from .findings import BOOTSTRAP_SEED, Holds, findings_paragraph, paper_findings  # noqa: F401
from .tables import TABLES, build_tables, read_tables, write_tables  # noqa: F401
from .markdown import README_BEGIN, README_END, make_report, readme_current_section, readme_section, render_report, update_readme  # noqa: F401

__all__ = [
    "TABLES",
    "README_BEGIN",
    "README_END",
    "Holds",
    "load_store_rows",
    "IncompleteReportError",
    "SECTIONS",
    "BOOTSTRAP_SEED",
    "expected_cells",
    "missing_cells",
    "save_probes",
    "load_probes",
    "paper_findings",
    "findings_paragraph",
    "build_tables",
    "write_tables",
    "read_tables",
    "render_report",
    "readme_section",
    "update_readme",
    "readme_current_section",
    "make_report",
]
