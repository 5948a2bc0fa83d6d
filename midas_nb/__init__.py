"""midas_nb: notebook research companion for the MIDAS analysis of token choice in small ViTs.

See README.md and docs/architecture.md. The notebooks start from :class:`midas_nb.Study`.

The public names are loaded on first use (PEP 562 module ``__getattr__``), so that the command
line (:mod:`midas_nb.cli`) answers ``--help``, ``--version`` and argument errors without
importing torch. The scorer families of :mod:`midas_nb.scorers` (cropr, iared) register
themselves where they are defined, on the first import of :mod:`midas_nb.scorers`.
"""
from __future__ import annotations

from .point import lazy_names

__all__ = ["Study", "get_profile", "list_profiles", "__version__"]
__version__ = "0.1.0"

__getattr__, __dir__ = lazy_names(__name__, {"Study": ".study", "get_profile": ".config", "list_profiles": ".config"})
