"""``midas-nb report``: ``REPORT.md`` and its CSV tables (:data:`TABLES`) from a run's result store, the README's
results section rendered from the CSVs alone (docs/architecture.md, "report"). The build path's names (the store,
:func:`build_tables`) load on first use, so rendering imports no torch (decision 0080).
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
