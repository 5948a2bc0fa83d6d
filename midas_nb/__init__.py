"""midas_nb: notebook research companion for the MIDAS analysis of token choice in small ViTs (README.md,
docs/architecture.md); the notebooks start from :class:`midas_nb.Study`. Public names load on first use, so the
command line answers ``--help``, ``--version`` and argument errors without importing torch (decision 0019)."""
from __future__ import annotations

from .point import lazy_names

__all__ = ["Study", "get_profile", "list_profiles", "__version__"]
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_names(__name__, {"Study": ".study", "get_profile": ".config", "list_profiles": ".config"})
