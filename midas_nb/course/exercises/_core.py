"""The registry and checking of the course's exercises (registered by :mod:`.early` for notebooks 00–03 and
:mod:`.late` for 04–07), the comparisons and the helpers they share.

Three kinds of exercise (:attr:`Exercise.kind`): a *look-up* (a name the notebook shows), a *computation*
(a number or name worked out from the objects) and *reasoning* — why / what-if / predict-then-check
questions answered with an option letter (:class:`Choice`): fixed statements about the science whose
true one is computed from this run's objects. A number is accepted to the precision the notebooks print
(:data:`PRINTED_DECIMALS`); a "which is best" question accepts every name tied with the leader within
noise (:func:`midas_nb.results.leaders`). An exercise a run may be unable to ask (one backbone, one
budget) has an ``applies`` test: where it fails, :func:`show_exercise` shows a note instead of the prompt. The
question of every other exercise is its notebook's Markdown cell (``**Exercise NN.i** (`name`).``), its one copy:
the registry holds the hint, the checker and the answer."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...metrics import parity_band
from ...metrics.stats import interval_sign as sign_of
from ...results import format_ci


# ------------------------------------------------------------------------------------ exercises
@dataclass(frozen=True)
class Exercise:
    """One checkable exercise ``"NN.short_name"`` (``NN``: its notebook): the ``hint`` shown with a wrong answer;
    ``needs``, the notebook objects ``expected(**ctx)`` (the expected answer) takes; ``compare(answer,
    expected)`` → ``(ok, message)``; ``applies(**ctx)`` → ``None`` where it can be asked of this run, else why
    not (e.g. "needs ≥ 2 backbones; this run has one"; no test: always); ``kind``: ``"look-up"``,
    ``"computation"`` or ``"reasoning"`` (option letters); ``prompt``: the question (Markdown) of an exercise
    with an ``applies`` test, which :func:`show_exercise` shows (every other question is its notebook's
    Markdown cell, the one copy)."""

    name: str
    hint: str
    needs: tuple[str, ...]
    expected: Callable[..., Any]
    compare: Callable[[Any, Any], tuple[bool, str]]
    applies: Callable[..., str | None] | None = None
    kind: str = "look-up"
    prompt: str = ""


class NotApplicable(Exception):
    """The exercise cannot be asked of this run (``args[0]``: why, e.g. one backbone only)."""


@dataclass(frozen=True)
class Choice:
    """The expected answer of a multiple-choice exercise: ``accepted``, the option letters whose statement is
    true on this run (several where statements overlap or an interval sits on the edge; any is accepted; one
    letter or several, stored as a frozenset; ValueError where none, or one not in ``options``), ``options``,
    every option letter of the question (``"abc"``), and ``why``, this run's numbers behind the answer
    (printed with a right answer)."""

    accepted: frozenset[str]
    options: str
    why: str

    def __post_init__(self):
        object.__setattr__(self, "accepted", frozenset(self.accepted))
        if not self.accepted or not self.accepted <= set(self.options):
            raise ValueError(f"the accepted options {sorted(self.accepted)} are not among {self.options!r}")


EXERCISES: dict[str, Exercise] = {}


def register(name: str, hint: str, compare: Callable[[Any, Any], tuple[bool, str]],
             expected: Callable[..., Any] | None = None, applies: Callable[..., str | None] | None = None,
             kind: str = "look-up", prompt: str = ""):
    """Register exercise ``name`` whose answer ``expected(**needs)`` computes (its parameters name the
    notebook objects it needs); without ``expected``, a decorator of that function. ``kind``: "reasoning" for
    option letters, "computation" for a number, else as given. ValueError: a name registered twice, or an
    ``applies`` test without the ``prompt`` :func:`show_exercise` shows."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in EXERCISES:
            raise ValueError(f"exercise {name!r} registered twice")
        if (applies is not None) != bool(prompt):
            raise ValueError(f"exercise {name!r}: a prompt goes with an applies test (show_exercise), and only there")
        kinds = {option: "reasoning", number: "computation", integer: "computation"}
        EXERCISES[name] = Exercise(name, hint, tuple(inspect.signature(fn).parameters), fn, compare, applies,
                                   kinds.get(compare, kind), prompt)
        return fn
    return deco if expected is None else deco(expected)


def list_exercises(notebook: str | None = None) -> list[str]:
    """Registered exercise names, optionally only those of notebook ``"NN"`` (e.g. ``"02"``)."""
    return [k for k in EXERCISES if notebook is None or k.split(".")[0] == notebook[:2]]


def expected_answer(name: str, **ctx: Any) -> Any:
    """The answer the checker of exercise ``name`` expects, computed from ``ctx``. KeyError: an unknown exercise
    or a missing context object; :class:`NotApplicable`: not asked of this run."""
    ex, why_not = _get(name, ctx), not_applicable(name, **ctx)
    if why_not:
        raise NotApplicable(why_not)
    return ex.expected(**{k: ctx[k] for k in ex.needs})


def not_applicable(name: str, **ctx: Any) -> str | None:
    """Why exercise ``name`` cannot be asked of this run (``ctx``: the objects it needs), or
    ``None`` when it can (always, for an exercise without an ``applies`` test)."""
    ex = _get(name)
    return None if ex.applies is None else ex.applies(**{k: ctx[k] for k in ex.needs if k in ctx})


def exercise_label(name: str) -> str:
    """``"NN.i"``: the exercise's number in its notebook (registry order = notebook order)."""
    nb = name.split(".")[0]
    return f"{nb}.{list_exercises(nb).index(_get(name).name) + 1}"


def show_exercise(name: str, **ctx: Any):
    """The prompt of exercise ``name`` (one with an ``applies`` test) as :class:`IPython.display.Markdown` (its
    plain text, ``repr``, is the Markdown source), for a notebook cell that shows it only where the run can
    answer it; elsewhere a one-line note says why it is left out (e.g. "needs ≥ 2 backbones; this run has
    one"). KeyError: an unknown exercise or a missing context object."""
    from IPython.display import Markdown

    class _Prompt(Markdown):      # its plain text (repr) is the Markdown source, not an object repr
        def __repr__(self) -> str:
            return str(self.data)

    ex, why_not = _get(name, ctx), not_applicable(name, **ctx)
    head = f"**Exercise {exercise_label(name)}** (`{name}`)."
    return _Prompt(f"{head} *Not asked on this run: it {why_not}.*" if why_not else f"{head} {ex.prompt}")


def _get(name: str, ctx: dict[str, Any] | None = None) -> Exercise:
    """The registered exercise ``name``; KeyError for an unknown one or, given ``ctx``, a missing context object."""
    if name not in EXERCISES:
        raise KeyError(f"unknown exercise {name!r}; registered: {sorted(EXERCISES)}")
    missing = [k for k in EXERCISES[name].needs if ctx is not None and k not in ctx]
    if missing:
        raise KeyError(f"exercise {name!r} needs {', '.join(f'{k}=' for k in missing)} "
                       f"(objects the notebook already built)")
    return EXERCISES[name]


def check_exercise(name: str, answer: Any, **ctx: Any) -> bool:
    """Check a student's ``answer`` to exercise ``name`` (:func:`list_exercises`, e.g. ``"01.best_target"``) from
    the notebook objects ``ctx`` it needs (:attr:`Exercise.needs`: ``study=study``, ...); prints ``✓``/``✗`` and
    why. ``None`` ("not answered yet") returns ``False`` silently, so an unanswered notebook runs and its
    executed and HTML editions show nothing under the question. Returns ``True`` when the answer matches (numbers
    to the printed :data:`PRINTED_DECIMALS`, names case-insensitively, every name tied with the leader);
    KeyError for an unknown exercise name (a typo in the notebook, not a wrong answer).
    """
    ex = _get(name)
    if answer is None:      # unanswered: silent, so executed and HTML editions carry no noise
        return False
    try:
        expected = expected_answer(name, **ctx)
    except (KeyError, NotApplicable) as e:
        print(f"✗ {name}: cannot check — {e.args[0]}" if isinstance(e, KeyError) else
              f"✗ {name}: not asked on this run — it {e.args[0]}; there is nothing to check.")
        return False
    try:
        ok, why = ex.compare(answer, expected)
    except (TypeError, ValueError, RuntimeError) as e:
        ok, why = False, f"could not compare your answer ({type(e).__name__}: {e})"
    print(f"✓ {name}: correct. {why}".rstrip() if ok else f"✗ {name}: {why} Hint: {ex.hint}")
    return bool(ok)


def check_solution(name: str, answer: Any, **ctx: Any) -> None:
    """Verify a reference solution against the checker of exercise ``name``, silently: the cells tagged
    ``solution`` call this instead of :func:`check_exercise`, so a run proves every reference solution right
    while the executed notebook and its HTML edition do not print the answer under the question. An exercise
    not asked of this run (:func:`not_applicable`) has nothing to verify. AssertionError: the solution
    disagrees with the checker (the message says how); KeyError: an unknown exercise or a missing object.
    """
    try:
        ok, why = _get(name).compare(answer, expected_answer(name, **ctx))
    except NotApplicable:
        return
    if not ok:
        raise AssertionError(f"the reference solution of {name} disagrees with its checker: {why}")


# ---------------------------------------------------------------------------------- comparisons
#: decimals the notebooks print a number with (``results.compact``'s default): an answer within half
#: a unit of the last of them is accepted, so a value typed as printed is right
PRINTED_DECIMALS = 3


def _item(answer: Any) -> Any:
    return answer.item() if isinstance(answer, torch.Tensor) and answer.numel() == 1 else answer


def number(answer: Any, expected: float, decimals: int = PRINTED_DECIMALS) -> tuple[bool, str]:
    answer = _item(answer)
    number_like = isinstance(answer, (int, float)) or hasattr(answer, "__float__")
    if isinstance(answer, (bool, torch.Tensor)) or not number_like:
        shape = f" of shape {tuple(answer.shape)}" if isinstance(answer, torch.Tensor) else ""
        return False, f"expected one number, got {type(answer).__name__}{shape}."
    a = float(answer)
    if math.isnan(expected):
        return (math.isnan(a), "the expected value is undefined (NaN) on this run.")
    if abs(a - expected) <= 0.5 * 10 ** -decimals * (1 + 1e-9):
        return True, f"({expected:.{decimals}f} to {decimals} decimals)"
    return False, f"your value {a:.6g} is too {'high' if a > expected else 'low'} (to {decimals} decimals)."


def integer(answer: Any, expected: int) -> tuple[bool, str]:
    a = _item(answer)
    if isinstance(a, bool) or not isinstance(a, int) and not (isinstance(a, float) and a.is_integer()):
        return False, f"expected a whole number, got {answer!r}."
    a = int(a)
    return a == expected, f"({a})" if a == expected else f"{a} is too {'high' if a > expected else 'low'}."


def choice(answer: Any, accepted: set[str]) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, f"expected a name (a string), got {type(answer).__name__}."
    if answer.strip().lower() in {a.lower() for a in accepted}:
        tie = f" (tied within noise with {sorted(accepted - {answer.strip()})})" if len(accepted) > 1 else ""
        return True, f"({answer}{tie})"
    return False, f"{answer!r} is not it: its interval lies below the leader's."


def pair(answer: Any, accepted: set[frozenset[str]]) -> tuple[bool, str]:
    try:
        a = frozenset() if isinstance(answer, str) else frozenset(str(x).lower() for x in answer)
    except TypeError:       # not a collection (a number, a 0-d tensor)
        a = frozenset()
    if len(a) != 2:
        return False, f"expected two different target names, e.g. ('T0', 'T1'), got {answer!r}."
    ok = a in {frozenset(x.lower() for x in p) for p in accepted}
    return ok, f"({tuple(answer)})" if ok else f"{tuple(answer)} is not the most similar pair."


def option(answer: Any, expected: Choice) -> tuple[bool, str]:
    a = answer.strip().strip("()").strip().lower() if isinstance(answer, str) else None
    if a is None or len(a) != 1 or a not in expected.options:
        return False, (f"expected one of the option letters {', '.join(repr(x) for x in expected.options)}, "
                       f"got {answer!r}.")
    if a in expected.accepted:
        also = ", ".join(f"({x})" for x in sorted(expected.accepted - {a}))
        return True, f"({a}) {expected.why}" + (f" Also true on this run: {also}." if also else "")
    return False, f"({a}) is not what this run shows."


# --------------------------------------------------------------------------------- helpers
def signs_near_edge(lo: float, hi: float, slack: float = 0.1) -> set[str]:
    """The interval's sign, plus its neighbour where the edge nearer 0 lies within ``slack`` of
    the interval's width from 0 (an answer from another bootstrap draw may fall on either side):
    the signs of the interval widened and narrowed by that much."""
    w = slack * max(hi - lo, 0.0)
    return {sign_of(lo, hi), sign_of(lo - w, hi + w), sign_of(lo + w, hi - w)}


def d_pp(r) -> str:
    """A row's D with its interval, ``"+1.33 [+0.20, +2.40] pp"`` (:func:`midas_nb.results.format_ci`)."""
    return format_ci(r["D_pp"], r["D_pp_lo"], r["D_pp_hi"], "+.2f") + " pp"


def two_backbones(D) -> str | None:
    """``None`` where ``D`` has T5 rows of ≥ 2 backbones, else why the exercise is not asked."""
    bbs = sorted(set(D.loc[D["condition"] == "T5", "backbone"].astype(str)))
    return None if len(bbs) >= 2 else f"needs ≥ 2 backbones; this run has {f'one ({bbs[0]})' if bbs else 'no T5 row'}"


def resolved_in_band(D, band: float | None = None) -> Any:
    """Per row of a ``decoupling_D`` table: inside the parity band *as its interval says* — the whole paired
    ΔIDAUC interval ``≥ −band`` (``delta_idauc_lo``); the point value only where a row has no interval; a row
    whose ΔIDAUC or ``D_pp`` is undefined (``status`` "undefined") is never inside. Computed from the interval
    columns, independently of ``decoupling_D``'s ``status`` (with its tolerance: ΔIDAUC = −band is inside)."""
    def col(c):
        return D[c].astype(float) if c in D.columns else D["delta_idauc"].astype(float) * math.nan
    lo, point = col("delta_idauc_lo"), col("delta_idauc")
    has_ci = lo.notna() & col("delta_idauc_hi").notna()
    defined = point.notna() & (col("D_pp").notna() | ("D_pp" not in D.columns))
    return defined & (lo.where(has_ci, point) >= -parity_band(band) - 1e-12)
