"""Exercise checkers of the course edition: the registry and checks (:mod:`._core`) and each notebook's
exercises (:mod:`.notebooks`), registered in notebook order."""
from __future__ import annotations

from . import notebooks  # noqa: F401  (registers the exercises, in notebook order)
from ._core import (EXERCISES, PRINTED_DECIMALS, Choice, Exercise, NotApplicable, check_exercise,  # noqa: F401
                   check_solution, exercise_label, expected_answer, list_exercises, not_applicable, show_exercise)
