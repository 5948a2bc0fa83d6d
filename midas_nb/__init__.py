"""midas_nb: notebook research companion for the MIDAS analysis of token choice in small ViTs.

See README.md and docs/architecture.md. The notebooks start from :class:`midas_nb.Study`.

The public names are loaded on first use (PEP 562 module ``__getattr__``), so that the command
line (:mod:`midas_nb.cli`) answers ``--help``, ``--version`` and argument errors without
importing torch. The scorer families of :mod:`midas_nb.scorers` (cropr, iared) register
themselves where they are defined, on the first import of :mod:`midas_nb.scorers`.
"""
from __future__ import annotations

import importlib
from typing import Any

__all__ = ["Study", "get_profile", "list_profiles", "__version__"]
__version__ = "0.1.0"

_LAZY = {"Study": ".study", "get_profile": ".config", "list_profiles": ".config"}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name], __name__), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))
