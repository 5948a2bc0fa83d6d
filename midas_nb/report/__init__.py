"""``midas-nb report``: the run's result store as ``REPORT.md`` plus its CSV tables (:data:`TABLES`), each
number beside the paper's where the paper has one, and a computed statement of which of the paper's findings
hold. ``REPORT.md`` and the README's results section are rendered only from the CSV files (docs/architecture.md,
"report"; row selection: docs/decisions/0009-report-row-selection.md). Rendering imports no torch: the names of
the build path (the store, :func:`build_tables`) load on first use (decision 0080).
"""
from __future__ import annotations

from ..point import lazy_names
from ..analysis.findings import BOOTSTRAP_SEED, Holds, findings_paragraph, paper_findings  # noqa: F401
from .tables import (IncompleteReportError, MixedSettingsError, SECTIONS, TABLES, read_tables,  # noqa: F401
                     write_tables)
from .markdown import (README_BEGIN, README_END, make_report, readme_current_section, readme_section,  # noqa: F401
                       render_report, update_readme)

_LAZY = {"build_tables": ".build", **dict.fromkeys(("expected_cells", "load_probes", "load_store_rows", "missing_cells",
                                                     "save_probes"), ".store")}

__all__ = ["TABLES", "README_BEGIN", "README_END", "Holds", "load_store_rows", "IncompleteReportError", "SECTIONS",
           "MixedSettingsError",
           "BOOTSTRAP_SEED", "expected_cells", "missing_cells", "save_probes", "load_probes", "paper_findings",
           "findings_paragraph", "build_tables", "write_tables", "read_tables", "render_report", "readme_section",
           "update_readme", "readme_current_section", "make_report"]


__getattr__, __dir__ = lazy_names(__name__, _LAZY)
