"""The registry and checking of the course's exercises (decisions 0022, 0086), the comparisons and the helpers
they share. A number is accepted to the printed precision, a "which is best" answer if tied with the leader
within noise; reasoning questions take an option letter (:class:`Choice`) whose truth this run's objects decide."""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable

import torch

from ...metrics import parity_band
from ...metrics.stats import interval_sign as sign_of
from ...results import format_ci


@dataclass(frozen=True)
class Exercise:
    """Exercise ``"NN.short_name"`` (``NN``: its notebook): ``hint`` (shown with a wrong answer), ``needs`` (the
    notebook objects ``expected(**ctx)`` takes), ``compare(answer, expected)`` → ``(ok, message)``,
    ``applies(**ctx)`` → ``None`` or why this run cannot ask it, ``kind`` ("look-up", "computation" or
    "reasoning"), ``prompt``: the question of an exercise with ``applies`` (others: its notebook's Markdown)."""

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
    """A multiple-choice answer: ``accepted``, the option letters true on this run (any is accepted; ValueError:
    none, or one not in ``options``), ``options`` (``"abc"``), ``why``: the numbers behind it (printed if right)."""

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
    """Register exercise ``name`` answered by ``expected`` (its parameters: the objects it needs; without it: a
    decorator). ValueError: a name registered twice, or an ``applies`` test without a ``prompt``."""
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
    """Registered exercise names, or those of notebook ``"NN"``."""
    return [k for k in EXERCISES if notebook is None or k.split(".")[0] == notebook[:2]]


def expected_answer(name: str, **ctx: Any) -> Any:
    """The answer exercise ``name`` expects from ``ctx``. KeyError: unknown exercise or missing object;
    :class:`NotApplicable`: not asked of this run."""
    ex, why_not = _get(name, ctx), not_applicable(name, **ctx)
    if why_not:
        raise NotApplicable(why_not)
    return ex.expected(**{k: ctx[k] for k in ex.needs})


def not_applicable(name: str, **ctx: Any) -> str | None:
    """Why exercise ``name`` cannot be asked of this run (``ctx``: its objects), or ``None``."""
    ex = _get(name)
    return None if ex.applies is None else ex.applies(**{k: ctx[k] for k in ex.needs if k in ctx})


def exercise_label(name: str) -> str:
    """``"NN.i"``: the exercise's number in its notebook (registry order = notebook order)."""
    return f"{name.split('.')[0]}.{list_exercises(name).index(_get(name).name) + 1}"


def show_exercise(name: str, **ctx: Any):
    """The prompt of exercise ``name`` (one with an ``applies`` test) as :class:`IPython.display.Markdown` (its
    ``repr``: the source), or a one-line note why this run does not ask it. KeyError as :func:`expected_answer`."""
    from IPython.display import Markdown

    class _Prompt(Markdown):      # its plain text (repr) is the Markdown source, not an object repr
        def __repr__(self) -> str:
            return str(self.data)

    ex, why_not = _get(name, ctx), not_applicable(name, **ctx)
    head = f"**Exercise {exercise_label(name)}** (`{name}`)."
    return _Prompt(f"{head} *Not asked on this run: it {why_not}.*" if why_not else f"{head} {ex.prompt}")


def _get(name: str, ctx: dict[str, Any] | None = None) -> Exercise:
    if name not in EXERCISES:
        raise KeyError(f"unknown exercise {name!r}; registered: {sorted(EXERCISES)}")
    if missing := [k for k in EXERCISES[name].needs if ctx is not None and k not in ctx]:
        raise KeyError(f"exercise {name!r} needs {', '.join(f'{k}=' for k in missing)} "
                       f"(objects the notebook already built)")
    return EXERCISES[name]


def check_exercise(name: str, answer: Any, **ctx: Any) -> bool:
    """Check a student's ``answer`` to exercise ``name`` from the notebook objects ``ctx`` it needs
    (``study=study``, ...); prints ``✓``/``✗`` and why, returns whether it matches. ``None`` (not answered yet):
    ``False``, silently. KeyError: an unknown exercise name (a typo, not a wrong answer)."""
    ex = _get(name)
    if answer is None:
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
    """Verify a reference solution (the cells tagged ``solution``) against the checker of exercise ``name``, silently
    (an exercise not asked of this run: nothing). AssertionError: they disagree; KeyError as :func:`expected_answer`."""
    try:
        ok, why = _get(name).compare(answer, expected_answer(name, **ctx))
    except NotApplicable:
        return
    if not ok:
        raise AssertionError(f"the reference solution of {name} disagrees with its checker: {why}")


#: decimals the notebooks print (``results.compact``'s default): a value typed as printed is right
PRINTED_DECIMALS = 3


def _item(answer: Any) -> Any:
    return answer.item() if isinstance(answer, torch.Tensor) and answer.numel() == 1 else answer


def number(answer: Any, expected: float, decimals: int = PRINTED_DECIMALS) -> tuple[bool, str]:
    answer = _item(answer)
    if isinstance(answer, (bool, torch.Tensor)) or not hasattr(answer, "__float__"):   # int and float have it
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


def signs_near_edge(lo: float, hi: float, slack: float = 0.1) -> set[str]:
    """The interval's sign and those of it widened and narrowed by ``slack`` of its width (another bootstrap
    draw may fall on either side of 0)."""
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
    """Per row of a ``decoupling_D`` table, recomputed apart from its ``status``: the whole paired ΔIDAUC interval
    ``≥ −band`` (the point value where a row has none); an undefined ΔIDAUC or ``D_pp`` is never inside."""
    def col(c):
        return D[c].astype(float) if c in D.columns else D["delta_idauc"].astype(float) * math.nan
    lo, point = col("delta_idauc_lo"), col("delta_idauc")
    has_ci = lo.notna() & col("delta_idauc_hi").notna()
    defined = point.notna() & (col("D_pp").notna() | ("D_pp" not in D.columns))
    return defined & (lo.where(has_ci, point) >= -parity_band(band) - 1e-12)
