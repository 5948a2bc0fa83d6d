"""Course edition of the notebooks (decision 0022): exercise checkers (:mod:`.exercises`: a student's cell calls
``check_exercise(name, answer, study=study, ...)``, a solution cell the silent ``check_solution``), solution
stripping and the static HTML edition (:mod:`.publish`: ``midas-nb strip-solutions`` and ``export-html``)."""
from __future__ import annotations

from .exercises import (EXERCISES, Choice, Exercise, NotApplicable, check_exercise, check_solution,  # noqa: F401
                        exercise_label, expected_answer, list_exercises, not_applicable, show_exercise)
from .publish import SOLUTION_TAG, export_html, strip_solutions  # noqa: F401

__all__ = ["Exercise", "EXERCISES", "Choice", "NotApplicable", "not_applicable", "show_exercise", "exercise_label",
           "check_exercise", "check_solution", "list_exercises", "expected_answer", "strip_solutions", "export_html",
           "SOLUTION_TAG"]
