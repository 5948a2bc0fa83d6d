"""midas_nb: notebook research companion for the MIDAS analysis of token choice in small ViTs.

See README.md and docs/architecture.md. The notebooks start from :class:`midas_nb.Study`.
"""
from .config import get_profile, list_profiles
from .study import Study
from . import related  # noqa: F401,E402 - registers the cropr and iared scorer families (as timm registers models)

__all__ = ["Study", "get_profile", "list_profiles", "__version__"]
__version__ = "0.1.0"
