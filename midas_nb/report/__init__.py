"""``midas-nb report``: ``REPORT.md``, its CSV tables and the README's results section (docs/architecture.md,
"report"); the build path's names load on first use, so rendering imports no torch (decision 0080)."""
from __future__ import annotations

from ..point import lazy_names
from ..analysis.findings import BOOTSTRAP_SEED, findings_paragraph, paper_findings
from .tables import IncompleteReportError, MixedSettingsError, TABLES, read_tables, write_tables
from .markdown import (README_BEGIN, README_END, make_report, readme_current_section, readme_section, render_report,
                       update_readme)

_LAZY = dict.fromkeys(("build_tables", "expected_cells", "load_probes", "load_store_rows", "missing_cells",
                       "save_probes"), ".build")
__all__ = ["BOOTSTRAP_SEED", "findings_paragraph", "paper_findings", "IncompleteReportError", "MixedSettingsError",
           "TABLES", "read_tables", "write_tables", "README_BEGIN", "README_END", "make_report",
           "readme_current_section", "readme_section", "render_report", "update_readme", *_LAZY]
__getattr__, __dir__ = lazy_names(__name__, _LAZY)
