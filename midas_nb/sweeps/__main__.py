"""``python -m midas_nb.sweeps [NAME|PATH ...]``: print each sweep's status (:func:`commands.main_status`)."""
import sys

from .commands import main_status

sys.exit(main_status())
