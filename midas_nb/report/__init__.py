"""``midas-nb report``: the run's result store as ``REPORT.md`` plus its CSV tables (:data:`TABLES`), each
number beside the paper's where the paper has one, and a computed statement of which of the paper's findings
hold. ``REPORT.md`` and the README's results section are rendered only from the CSV files (docs/architecture.md,
"report"; row selection: docs/decisions/0009-report-row-selection.md).
"""
from __future__ import annotations

from .store import (IncompleteReportError, MixedSettingsError, SECTIONS, expected_cells, load_probes,  # noqa: F401
                    load_store_rows, missing_cells, save_probes)
from ..analysis.findings import BOOTSTRAP_SEED, Holds, findings_paragraph, paper_findings  # noqa: F401
from .tables import TABLES, build_tables, read_tables, write_tables  # noqa: F401
from .markdown import README_BEGIN, README_END, make_report, readme_current_section, readme_section, render_report, update_readme  # noqa: F401

__all__ = ["TABLES", "README_BEGIN", "README_END", "Holds", "load_store_rows", "IncompleteReportError", "SECTIONS",
           "MixedSettingsError",
           "BOOTSTRAP_SEED", "expected_cells", "missing_cells", "save_probes", "load_probes", "paper_findings",
           "findings_paragraph", "build_tables", "write_tables", "read_tables", "render_report", "readme_section",
           "update_readme", "readme_current_section", "make_report"]
