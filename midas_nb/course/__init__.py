"""Course edition of the notebooks (decision 0022): exercise checkers (:mod:`.exercises`), solution
stripping and the static HTML edition (:mod:`.publish`).

Each notebook ends with 2–4 exercises ``"NN.short_name"``: a student's cell calls ``check_exercise(name,
answer, study=study, ...)`` (silent while ``answer`` is ``None``), a solution cell the silent
``check_solution(...)``; ``midas-nb strip-solutions`` and ``midas-nb export-html`` call the two others.
"""
from __future__ import annotations

from .exercises import (EXERCISES, Choice, Exercise, NotApplicable, check_exercise, check_solution,  # noqa: F401
                        exercise_label, expected_answer, list_exercises, not_applicable, show_exercise)
from .publish import SOLUTION_TAG, export_html, strip_solutions  # noqa: F401

__all__ = ["Exercise", "EXERCISES", "Choice", "NotApplicable", "not_applicable", "show_exercise", "exercise_label",
           "check_exercise", "check_solution", "list_exercises", "expected_answer", "strip_solutions", "export_html",
           "SOLUTION_TAG"]
