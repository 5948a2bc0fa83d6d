"""``python -m midas_nb.cli``: the ``midas-nb`` command."""
import sys

from . import main

sys.exit(main())
