"""``python -m midas_nb.sweeps [NAME|PATH ...]``: print each sweep's status (:func:`main_status`)."""
import sys

from .store import main_status

sys.exit(main_status())
