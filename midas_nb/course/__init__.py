"""Course edition of the notebooks: exercise checkers, solution stripping, static HTML export.

Each notebook ends with 2–4 exercises. An exercise has a name ``"NN.short_name"`` (``NN`` =
the notebook's number), a prompt, a hint and a *checker* that computes the expected answer
from objects the notebook already built (``study``, ``maps``, ``table``, ...), passed as
keyword arguments::

    >>> answer = None                                   # the student's cell, left unanswered
    >>> check_exercise("00.keep_count", answer, study=study)   # silent until answered
    False

The reference solution of each exercise lives in a code cell tagged ``solution`` (collapsed
in Jupyter through ``metadata.jupyter.source_hidden``) that calls ``check_solution(...)``, which
prints nothing and raises when the solution disagrees with the checker;
:func:`strip_solutions` (``midas-nb strip-solutions``) removes those cells for students.
:func:`export_html` (``midas-nb export-html``) turns a run's executed notebooks into a static
HTML edition with a contents page and previous/next links.
"""
from __future__ import annotations

from .exercises import EXERCISES, Exercise, check_exercise, check_solution, expected_answer, list_exercises  # noqa: F401
from .publish import SOLUTION_TAG, export_html, notebook_title, strip_solutions  # noqa: F401

__all__ = [
    "Exercise",
    "EXERCISES",
    "check_exercise",
    "check_solution",
    "list_exercises",
    "expected_answer",
    "strip_solutions",
    "export_html",
    "notebook_title",
    "SOLUTION_TAG",
]
