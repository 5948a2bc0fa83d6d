"""Course edition of the notebooks: exercise checkers, solution stripping, static HTML export.

Each notebook ends with 2–4 exercises — look-ups, computations and, at least half of them over the
course, *why* / *what-if* / *predict-then-check* questions answered with an option letter whose right
option is computed from the run (:attr:`Exercise.kind`). An exercise has a name ``"NN.short_name"`` (``NN`` =
the notebook's number), a prompt, a hint and a *checker* that computes the expected answer
from objects the notebook already built (``study``, ``maps``, ``table``, ...), passed as
keyword arguments::

    >>> answer = None                                   # the student's cell, left unanswered
    >>> check_exercise("00.keep_count", answer, study=study)   # silent until answered
    False

The reference solution of each exercise lives in a code cell tagged ``solution`` (collapsed
in Jupyter through ``metadata.jupyter.source_hidden``) that calls ``check_solution(...)``, which
prints nothing and raises when the solution disagrees with the checker. An exercise a run cannot
answer (e.g. one that compares backbones, on a run with one) shows its prompt through a code cell,
``show_exercise(name, ...)``, which prints a one-line note instead of the question there;
:func:`strip_solutions` (``midas-nb strip-solutions``) removes those cells for students.
:func:`export_html` (``midas-nb export-html``) turns a run's executed notebooks into a static
HTML edition with a contents page and previous/next links.
"""
from __future__ import annotations

from .exercises import (EXERCISES, Choice, Exercise, NotApplicable, check_exercise, check_solution,  # noqa: F401
                        exercise_label, expected_answer, list_exercises, not_applicable, show_exercise)
from .publish import SOLUTION_TAG, export_html, notebook_title, strip_solutions  # noqa: F401

__all__ = [
    "Exercise",
    "EXERCISES",
    "Choice",
    "NotApplicable",
    "not_applicable",
    "show_exercise",
    "exercise_label",
    "check_exercise",
    "check_solution",
    "list_exercises",
    "expected_answer",
    "strip_solutions",
    "export_html",
    "notebook_title",
    "SOLUTION_TAG",
]
