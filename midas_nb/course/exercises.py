"""Exercise checkers of the course edition: each notebook's 2–4 exercises, their expected answers from the
objects the notebook built, and :func:`check_exercise`.

Two kinds of exercise: *look-ups and computations* (a number, a name, a tensor) and *why / what-if*
questions answered with an option letter (:class:`Choice`): the options are fixed statements about
the science, and which of them is true is computed from this run's objects, so the right letter can
differ from run to run. An exercise whose question needs something a run may lack (several
backbones, two budgets) has an ``applies`` test: where it fails, the notebook shows a note instead
of the prompt (:func:`show_exercise`) and the checker says why it cannot be checked.

Size: one registry holding every notebook's exercises with their checkers, kept together so a
notebook's questions and answers are read in one place."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..metrics import decoupling_D, INFORMATIVE_BOX_MAX_FRACTION, PARITY_BAND, parity_band
from ..analysis import recommend_deployment, share_falls
from ..backbones.vit import keep_count


# ------------------------------------------------------------------------------------ exercises
@dataclass(frozen=True)
class Exercise:
    """One checkable exercise.

    Attributes:
        name: ``"NN.short_name"``; ``NN`` is the notebook's two-digit number.
        prompt: the question, as shown in the notebook (Markdown).
        hint: shown when an answer is wrong.
        needs: keyword arguments the checker reads (objects the notebook already built).
        expected: ``expected(**ctx)`` → the expected answer.
        compare: ``compare(answer, expected)`` → ``(ok, message)``.
        applies: ``applies(**ctx)`` → ``None`` when the exercise can be asked of this run, else
            the reason it cannot (e.g. "needs ≥ 2 backbones; this run has one"); ``None``: always.
    """

    name: str
    prompt: str
    hint: str
    needs: tuple[str, ...]
    expected: Callable[..., Any]
    compare: Callable[[Any, Any], tuple[bool, str]]
    applies: Callable[..., str | None] | None = None


class NotApplicable(Exception):
    """The exercise cannot be asked of this run (``args[0]``: why, e.g. one backbone only)."""


@dataclass(frozen=True)
class Choice:
    """The expected answer of a multiple-choice exercise.

    Attributes:
        accepted: the option letters whose statement is true on this run (several where
            statements overlap or an interval sits on the edge; any of them is accepted).
        options: every option letter of the question (``"abc"``).
        why: this run's numbers behind the answer, printed with a right answer.
    """

    accepted: frozenset[str]
    options: str
    why: str


EXERCISES: dict[str, Exercise] = {}


def _register(name: str, prompt: str, hint: str, needs: Iterable[str],
              compare: Callable[[Any, Any], tuple[bool, str]],
              applies: Callable[..., str | None] | None = None):
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in EXERCISES:
            raise ValueError(f"exercise {name!r} registered twice")
        EXERCISES[name] = Exercise(name, prompt, hint, tuple(needs), fn, compare, applies)
        return fn
    return deco


def list_exercises(notebook: str | None = None) -> list[str]:
    """Registered exercise names, optionally only those of notebook ``"NN"`` (e.g. ``"02"``)."""
    return [k for k in EXERCISES if notebook is None or k.split(".")[0] == notebook[:2]]


def expected_answer(name: str, **ctx: Any) -> Any:
    """The answer the checker of exercise ``name`` expects, computed from ``ctx``.

    Raises:
        KeyError: for an unknown exercise or a missing context object.
    """
    ex = _get(name)
    missing = [k for k in ex.needs if k not in ctx]
    if missing:
        raise KeyError(f"exercise {name!r} needs {', '.join(f'{k}=' for k in missing)} "
                       f"(objects the notebook already built)")
    why_not = not_applicable(name, **ctx)
    if why_not:
        raise NotApplicable(why_not)
    return ex.expected(**{k: ctx[k] for k in ex.needs})


def not_applicable(name: str, **ctx: Any) -> str | None:
    """Why exercise ``name`` cannot be asked of this run (``ctx``: the objects it needs), or
    ``None`` when it can (always, for an exercise without an ``applies`` test)."""
    ex = _get(name)
    if ex.applies is None:
        return None
    return ex.applies(**{k: ctx[k] for k in ex.needs if k in ctx})


def exercise_label(name: str) -> str:
    """``"NN.i"``: the exercise's number in its notebook (registry order = notebook order)."""
    nb = name.split(".")[0]
    return f"{nb}.{list_exercises(nb).index(_get(name).name) + 1}"


def show_exercise(name: str, **ctx: Any):
    """The prompt of exercise ``name`` as Markdown, for a notebook cell that shows it only where
    the run can answer it; elsewhere a one-line note says why it is left out (e.g. "needs ≥ 2
    backbones; this run has one").

    Returns:
        :class:`IPython.display.Markdown` (the cell's last expression displays it; its plain
        text, ``repr``, is the Markdown source rather than an object repr).

    Raises:
        KeyError: an unknown exercise or a missing context object.
    """
    from IPython.display import Markdown

    class _Prompt(Markdown):
        """Markdown whose plain text (``repr``) is its source, not an object repr."""

        def __repr__(self) -> str:
            return str(self.data)

    ex = _get(name)
    missing = [k for k in ex.needs if k not in ctx]
    if missing:
        raise KeyError(f"exercise {name!r} needs {', '.join(f'{k}=' for k in missing)}")
    head = f"**Exercise {exercise_label(name)}** (`{name}`)."
    why_not = not_applicable(name, **ctx)
    if why_not:
        return _Prompt(f"{head} *Not asked on this run: it {why_not}.*")
    return _Prompt(f"{head} {ex.prompt}")


def _get(name: str) -> Exercise:
    if name not in EXERCISES:
        raise KeyError(f"unknown exercise {name!r}; registered: {sorted(EXERCISES)}")
    return EXERCISES[name]


def check_exercise(name: str, answer: Any, **ctx: Any) -> bool:
    """Check a student's ``answer`` to exercise ``name``; prints ``✓``/``✗`` and why.

    Args:
        name: a registered exercise (:func:`list_exercises`), e.g. ``"01.abs_t5"``.
        answer: the student's answer; ``None`` means "not answered yet": returns ``False``
            without printing or raising, so an unanswered notebook runs, and its executed and
            HTML editions show nothing under the question.
        **ctx: the notebook objects the checker needs (``study=study``, ``maps=maps``, ...;
            :attr:`Exercise.needs`).

    Returns:
        ``True`` when the answer matches the expected one (numbers within 1e-6 relative,
        tensors elementwise, names case-insensitively, ties accepted).

    Raises:
        KeyError: for an unknown exercise name (a typo in the notebook, not a wrong answer).
    """
    ex = _get(name)
    if answer is None:      # unanswered: silent, so executed and HTML editions carry no noise
        return False
    try:
        expected = expected_answer(name, **ctx)
    except KeyError as e:
        print(f"✗ {name}: cannot check — {e.args[0]}")
        return False
    except NotApplicable as e:
        print(f"✗ {name}: not asked on this run — it {e.args[0]}; there is nothing to check.")
        return False
    try:
        ok, why = ex.compare(answer, expected)
    except (TypeError, ValueError, RuntimeError) as e:
        ok, why = False, f"could not compare your answer ({type(e).__name__}: {e})"
    if ok:
        print(f"✓ {name}: correct. {why}".rstrip())
    else:
        print(f"✗ {name}: {why} Hint: {ex.hint}")
    return bool(ok)


def check_solution(name: str, answer: Any, **ctx: Any) -> None:
    """Verify a reference solution against the checker of exercise ``name``, silently.

    The cells tagged ``solution`` call this instead of :func:`check_exercise`, so that a run
    still proves every reference solution right while the executed notebook and its HTML
    edition do not print the answer under the question.

    An exercise that cannot be asked of this run (:func:`not_applicable`, e.g. one backbone
    where it needs several) has nothing to verify: the call returns silently, whatever ``answer``.

    Raises:
        AssertionError: the solution disagrees with the checker (the message says how).
        KeyError: an unknown exercise or a missing context object.
    """
    ex = _get(name)
    try:
        expected = expected_answer(name, **ctx)
    except NotApplicable:
        return
    ok, why = ex.compare(answer, expected)
    if not ok:
        raise AssertionError(f"the reference solution of {name} disagrees with its checker: {why}")


# ---------------------------------------------------------------------------------- comparisons
def _number(answer: Any, expected: float, rtol: float = 1e-6, atol: float = 1e-9) -> tuple[bool, str]:
    if isinstance(answer, torch.Tensor):
        if answer.numel() != 1:
            return False, f"expected one number, got a tensor of shape {tuple(answer.shape)}."
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, (int, float)) and not hasattr(answer, "__float__"):
        return False, f"expected a number, got {type(answer).__name__}."
    a = float(answer)
    if math.isnan(expected):
        return (math.isnan(a), "the expected value is undefined (NaN) on this run.")
    if math.isclose(a, expected, rel_tol=rtol, abs_tol=atol):
        return True, f"({a:.6g})"
    return False, f"your value {a:.6g} is too {'high' if a > expected else 'low'}."


def _integer(answer: Any, expected: int) -> tuple[bool, str]:
    if isinstance(answer, torch.Tensor) and answer.numel() == 1:
        answer = answer.item()
    if isinstance(answer, bool) or not isinstance(answer, int) and not (isinstance(answer, float) and answer.is_integer()):
        return False, f"expected a whole number, got {answer!r}."
    a = int(answer)
    if a == expected:
        return True, f"({a})"
    return False, f"{a} is too {'high' if a > expected else 'low'}."


def _integers(answer: Any, expected: list[int]) -> tuple[bool, str]:
    try:
        a = [int(x) for x in answer]
    except (TypeError, ValueError):
        return False, f"expected a list of {len(expected)} whole numbers, got {answer!r}."
    if len(a) != len(expected):
        return False, f"expected {len(expected)} numbers (one per budget), got {len(a)}."
    wrong = [i for i, (x, y) in enumerate(zip(a, expected)) if x != y]
    if not wrong:
        return True, f"({a})"
    return False, f"entries at positions {wrong} are wrong."


def _choice(answer: Any, accepted: set[str]) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, f"expected a name (a string), got {type(answer).__name__}."
    if answer.strip().lower() in {a.lower() for a in accepted}:
        tie = f" (tied with {sorted(accepted - {answer.strip()})})" if len(accepted) > 1 else ""
        return True, f"({answer}{tie})"
    return False, f"{answer!r} is not it."


def _pair(answer: Any, accepted: set[frozenset[str]]) -> tuple[bool, str]:
    try:
        a = frozenset(str(x).lower() for x in answer)
    except TypeError:
        return False, f"expected two target names, e.g. ('T0', 'T1'), got {answer!r}."
    if len(a) != 2:
        return False, f"expected two different target names, got {answer!r}."
    if a in {frozenset(x.lower() for x in p) for p in accepted}:
        return True, f"({tuple(answer)})"
    return False, f"{tuple(answer)} is not the most similar pair."


def _names(answer: Any, expected: set[str]) -> tuple[bool, str]:
    if isinstance(answer, str):
        return False, "expected a collection of names (list or set), got a single string."
    try:
        a = {str(x).lower() for x in answer} - {"reference"}
    except TypeError:
        return False, f"expected a list or set of condition names, got {answer!r}."
    e = {x.lower() for x in expected} - {"reference"}
    if a == e:
        return True, f"({sorted(a)})"
    msgs = []
    if a - e:
        msgs.append(f"{sorted(a - e)} should not be there")
    if e - a:
        msgs.append(f"{len(e - a)} condition(s) are missing")
    return False, "; ".join(msgs) + "."


def _tensor(answer: Any, expected: torch.Tensor) -> tuple[bool, str]:
    if not isinstance(answer, torch.Tensor):
        return False, f"expected a tensor, got {type(answer).__name__}."
    if tuple(answer.shape) != tuple(expected.shape):
        return False, f"expected shape {tuple(expected.shape)} ([M images, N patch tokens]), got {tuple(answer.shape)}."
    a, e = answer.detach().float().cpu(), expected.detach().float().cpu()
    bad = ~torch.isclose(a, e, rtol=1e-5, atol=1e-8)
    if not bool(bad.any()):
        return True, ""
    return False, f"{int(bad.sum())} of {bad.numel()} values differ."


def _option(answer: Any, expected: Choice) -> tuple[bool, str]:
    if not isinstance(answer, str):
        return False, f"expected one option letter such as 'a', got {type(answer).__name__}."
    a = answer.strip().strip("()").strip().lower()
    if len(a) != 1 or a not in expected.options:
        return False, (f"expected one of the option letters {', '.join(repr(x) for x in expected.options)}, "
                       f"got {answer!r}.")
    if a in expected.accepted:
        also = sorted(expected.accepted - {a})
        more = f" Also true on this run: {', '.join(f'({x})' for x in also)}." if also else ""
        return True, f"({a}) {expected.why}{more}"
    return False, f"({a}) is not what this run shows."


# --------------------------------------------------------------------------------- helpers
def _choice_of(accepted: Iterable[str], options: str, why: str) -> Choice:
    acc = frozenset(accepted)
    if not acc or not acc <= set(options):
        raise ValueError(f"the accepted options {sorted(acc)} are not among {options!r}")
    return Choice(acc, options, why)


def _sign_of(lo: float, hi: float) -> str:
    """``"positive"`` (whole interval above 0), ``"negative"``, ``"not resolved"`` or ``"undefined"``."""
    if not (math.isfinite(lo) and math.isfinite(hi)):
        return "undefined"
    return "positive" if lo > 0 else "negative" if hi < 0 else "not resolved"


def _signs_near_edge(lo: float, hi: float, slack: float = 0.1) -> set[str]:
    """The interval's sign, plus its neighbour where the edge nearer 0 lies within ``slack`` of
    the interval's width from 0 (an answer from another bootstrap draw may fall on either side)."""
    s = _sign_of(lo, hi)
    out = {s}
    width = max(hi - lo, 0.0)
    if s == "positive" and lo <= slack * width:
        out.add("not resolved")
    elif s == "negative" and -hi <= slack * width:
        out.add("not resolved")
    elif s == "not resolved":
        if -lo <= slack * width:
            out.add("positive")
        if hi <= slack * width:
            out.add("negative")
    return out


def _t5_backbones(D) -> list[str]:
    return sorted(set(D.loc[D["condition"] == "T5", "backbone"].astype(str)))


def _two_backbones(D) -> str | None:
    """``None`` where ``D`` has T5 rows of ≥ 2 backbones, else why the exercise is not asked."""
    bbs = _t5_backbones(D)
    if len(bbs) >= 2:
        return None
    return (f"needs ≥ 2 backbones; this run has one ({bbs[0]})" if bbs else
            "needs ≥ 2 backbones; this run has no T5 row")


def _n_patches(study) -> int:
    r, c = study.grid
    return int(r * c)


def _argmax_ties(values: dict[str, float], tol: float = 1e-9) -> set[str]:
    finite = {k: v for k, v in values.items() if not math.isnan(v)}
    if not finite:
        raise ValueError("no finite value to compare")
    best = max(finite.values())
    return {k for k, v in finite.items() if v >= best - tol}


def _D_by_condition(table) -> Any:
    return decoupling_D(table).set_index("condition")


# ------------------------------------------------------------------------ 00 quickstart
@_register("00.keep_count",
           "At budget **b = 10 %**, how many patch tokens does the pruned model keep on this study's "
           "patch grid? (`int`)",
           "k = ceil(b·N) with N = rows × cols of `study.grid`.", ["study"], _integer)
def _ex_keep_count(study) -> int:
    return keep_count(0.10, _n_patches(study))


@_register("00.iou_ceiling",
           "On the four example images (`batch`), what is the best part IoU any ranking could reach "
           "at **b = 10 %**? (`float`, the `min(f, b) / max(f, b)` ceiling above, with `f` the share of "
           "part patches in `batch.part_mask`: 0 on a dataset without part keypoints, and so is the ceiling)",
           "f is the fraction of part patches in `batch.part_mask`; b = 0.10.", ["batch"], _number)
def _ex_iou_ceiling(batch) -> float:
    f = float(batch.part_mask.float().mean())
    return min(f, 0.10) / max(f, 0.10)


@_register("00.part_patches",
           "How many part patches does the **first** example image of `batch` have? (`int`; 0 on a dataset "
           "without part keypoints)",
           "count the True entries of one row of `batch.part_mask`.", ["batch"], _integer)
def _ex_part_patches(batch) -> int:
    return int(batch.part_mask[0].sum())



@_register("00.ceiling_what_if",
           "**What-if.** Raise the budget of 00.2 from b = 10 % to **b = 50 %**. Compute the ceiling "
           "`min(f, b) / max(f, b)` at both budgets, with `f` the fraction of the grid that `coverage_mask` "
           "marks on the example images (part patches, or box patches where the dataset has no parts). "
           "What happens to the best IoU any ranking can reach, and why? (`'a'`, `'b'` or `'c'`)\n\n"
           "* (a) it **rises**: 50 % lies closer to `f` than 10 % does (as a ratio, `b/f` nearer 1), so a perfect "
           "ranking leaves out fewer part (or box) patches, or keeps fewer surplus tokens, than it had to at 10 %;\n"
           "* (b) it **falls**: 50 % lies further from `f`, so even a perfect ranking must keep many tokens that "
           "are not part (or box) patches, and each of them enlarges the union of the IoU;\n"
           "* (c) it **stays the same**: the ceiling does not depend on the budget.",
           "`f = float(coverage_mask.float().mean())`; compare the two ceilings.", ["coverage_mask"], _option)
def _ex_ceiling_what_if(coverage_mask) -> Choice:
    f = float(coverage_mask.float().mean())
    c = {b: (min(f, b) / max(f, b)) for b in (0.10, 0.50)}
    pick = "a" if c[0.50] > c[0.10] + 1e-12 else "b" if c[0.50] < c[0.10] - 1e-12 else "c"
    return _choice_of(pick, "abc", f"f = {f:.1%}: the ceiling is {c[0.10]:.3f} at b = 10 % and {c[0.50]:.3f} at "
                                   f"b = 50 %. Part mIoU and box coverage are read against this ceiling, "
                                   f"not against 1.")

# --------------------------------------------------------------------------- 01 targets
@_register("01.abs_t5",
           "Add a target that is the **absolute value of T5**: build its map over the test split "
           "(a tensor `[M, N]` like `maps['T5']`).",
           "T5 is signed (input × gradient); `torch`'s `.abs()` works on tensors.", ["maps"], _tensor)
def _ex_abs_t5(maps) -> torch.Tensor:
    return maps["T5"].abs()


@_register("01.abs_t5_miou",
           "What part mIoU (box coverage on a dataset without part keypoints: FGVC-Aircraft, Stanford Cars) "
           "do the top `k = ceil(b·N)` tokens of **|T5|** reach on the test split, at the study's budget? "
           "(`float`; images without a part patch, or with an empty or uninformative box, are left out)",
           "`midas_nb.pruning.select_top_k`, `keep_mask_from_indices` and `midas_nb.metrics.part_miou` "
           "(`box_coverage` where `study.test_set.has_parts` is false); the masks are "
           "`study.test_set[i].part_mask` (`.box_mask`).", ["maps", "study"], _number)
def _ex_abs_t5_miou(maps, study) -> float:
    # independent of midas_nb.pruning/metrics: per-image sets, stable sort (ties → lower index)
    import math as _m
    scores = maps["T5"].abs().float()
    n = scores.shape[1]
    k = max(1, min(n, _m.ceil(round(float(study.settings.point.budget) * n, 9))))
    has_parts = bool(getattr(study.test_set, "has_parts", True))
    ious = []
    for i in range(scores.shape[0]):
        order = torch.sort(scores[i], descending=True, stable=True).indices[:k]
        kept = set(order.tolist())
        if has_parts:
            parts = set(torch.nonzero(study.test_set[i].part_mask).flatten().tolist())
        else:   # box coverage: an empty box, or one over more of the patches than is informative, is left out
            parts = set(torch.nonzero(study.test_set[i].box_mask).flatten().tolist())
            parts = parts if len(parts) / n <= INFORMATIVE_BOX_MAX_FRACTION else set()
        if parts:
            ious.append(len(kept & parts) / len(kept | parts))
    return sum(ious) / len(ious) if ious else float("nan")


@_register("01.best_target",
           "Which target's own top-k tokens cover the parts best (highest `miou` in `coverage`: part mIoU, or "
           "box coverage on a dataset without parts)? (`str`)",
           "sort `coverage` by `miou`.", ["coverage"], _choice)
def _ex_best_target(coverage) -> set[str]:
    return _argmax_ties(dict(zip(coverage["target"], coverage["miou"].astype(float))))


def _per_image_coverage(scores: torch.Tensor, study) -> torch.Tensor:
    """Per-image part IoU (box coverage where the dataset has no parts) of the top ``k`` tokens of
    ``scores`` at the study's budget, as :meth:`midas_nb.study.Study.target_coverage` measures it."""
    from ..metrics import box_coverage, part_miou
    from ..pruning import keep_mask_from_indices, select_top_k
    ds = study.test_set
    has_parts = bool(getattr(ds, "has_parts", True))
    ref = torch.stack([ds[i].part_mask if has_parts else ds[i].box_mask for i in range(len(ds))])
    n = scores.shape[1]
    keep = keep_mask_from_indices(select_top_k(scores.float(), keep_count(float(study.settings.point.budget), n)), n)
    return (part_miou if has_parts else box_coverage)(keep, ref).per_image


@_register("01.abs_t5_sign",
           "**Why.** T5 (input × gradient) is **signed**: a large negative value is evidence *against* the "
           "class, and the top-k of the signed map never keeps such a token. Does the sign matter for part "
           "coverage on this run? Pair, image by image, the part IoU (the box IoU, on a dataset without parts) "
           "of **|T5|**'s top-k (as in 01.2) with T5's own, and take a 95 % bootstrap interval of the mean "
           "difference |T5| − T5. (`'a'`, `'b'` or `'c'`)\n\n"
           "* (a) |T5| covers resolvably **more**: strong evidence against the class also sits on the parts (or "
           "in the box) — they matter to the decision in both directions, and the signed ranking drops the "
           "negative ones;\n"
           "* (b) |T5| covers resolvably **less**: the negative-evidence tokens lie mostly off the parts (or "
           "outside the box), so the sign itself points at them;\n"
           "* (c) the difference is **not resolved** (the interval contains 0): on these images the sign does not "
           "change how much of the parts (or the box) is kept.",
           "per-image IoUs: `metrics.part_miou(keep, part_mask).per_image` (`metrics.box_coverage(keep, "
           "box_mask)` on a dataset without parts) for the top-k of `maps['T5']` and of `maps['T5'].abs()`; "
           "the interval: `midas_nb.metrics.stats.bootstrap_ci(abs_iou - t5_iou, n_boot=study.settings.statistics.bootstrap)` "
           "(skipped images — no part or box patch, or a box covering nearly the whole image — are NaN).",
           ["maps", "study"], _option)
def _ex_abs_t5_sign(maps, study) -> Choice:
    from ..metrics.stats import bootstrap_ci
    t5 = maps["T5"].float()
    diff = _per_image_coverage(t5.abs(), study) - _per_image_coverage(t5, study)
    m, lo, hi = bootstrap_ci(diff, n_boot=study.settings.statistics.bootstrap)
    letter = {"positive": "a", "negative": "b", "not resolved": "c"}
    signs = _signs_near_edge(lo, hi) - {"undefined"}
    if not signs:
        raise ValueError("no image with a part (or informative box) patch: the difference is undefined")
    return _choice_of({letter[x] for x in signs}, "abc",
                      f"|T5| − T5: {100 * m:+.2f} pp [{100 * lo:+.2f}, {100 * hi:+.2f}] of part (or box) IoU, "
                      f"paired over "
                      f"{int(diff.isfinite().sum())} images.")


# -------------------------------------------------------------------------- 02 protocol
@_register("02.D_T5",
           "Compute **D(T5)** yourself from `table`: 100 × (mean mIoU of T5 − mean mIoU of the "
           "reference), in percentage points. (`float`)",
           "`table.groupby('condition')['miou'].mean()`.", ["table"], _number)
def _ex_d_t5(table) -> float:
    return float(_D_by_condition(table).loc["T5", "D_pp"])


@_register("02.best_D",
           "Which non-reference condition has the **largest D**? (`str`)",
           "look at `D_pp` in `D`, leaving the reference out.", ["table"], _choice)
def _ex_best_d(table) -> set[str]:
    d = _D_by_condition(table).drop(index="reference", errors="ignore")
    return _argmax_ties(d["D_pp"].astype(float).to_dict())


def _resolved_in_band(D, band: float | None = None) -> Any:
    """Per row of a ``decoupling_D`` table: inside the parity band *as its interval says* — the
    whole paired ΔIDAUC interval ``≥ −band`` (``delta_idauc_lo``); the point value only where a
    row has no interval; a row whose ΔIDAUC or ``D_pp`` is undefined (``status`` "undefined")
    is never inside. Computed here from the interval columns, independently of
    ``decoupling_D``'s ``status`` (with its tolerance: ΔIDAUC = −band counts as inside)."""
    import pandas as pd
    band = parity_band(band)
    lo = D["delta_idauc_lo"] if "delta_idauc_lo" in D.columns else pd.Series(float("nan"), index=D.index)
    hi = D["delta_idauc_hi"] if "delta_idauc_hi" in D.columns else pd.Series(float("nan"), index=D.index)
    point = D["delta_idauc"].astype(float)
    defined = point.notna() & (D["D_pp"].astype(float).notna() if "D_pp" in D.columns else True)
    has_ci = lo.notna() & hi.notna()
    inside = (has_ci & (lo.astype(float) >= -band - 1e-12)) | (~has_ci & (point >= -band - 1e-12))
    return defined & inside


@_register("02.in_band",
           "Which conditions does `D` show **inside the IDAUC parity band** — the whole 95 % interval of "
           f"ΔIDAUC at or above −{PARITY_BAND:g} (`delta_idauc_lo ≥ −{PARITY_BAND:g}`)? A mean ΔIDAUC above "
           f"−{PARITY_BAND:g} whose interval straddles −{PARITY_BAND:g} is *not resolved*, not in band. (a list or set of names; including the "
           "reference is optional)",
           f"compare `delta_idauc_lo` in `D` with −{PARITY_BAND:g} (`status` says the same in words, except where it says "
           "*uninformative*: there the reference ranks tokens no better than random, and parity with it says little).",
           ["D"], _names)
def _ex_in_band(D) -> set[str]:
    return set(D.loc[_resolved_in_band(D), "condition"].astype(str))


@_register("02.scorer_vs_control",
           "**Why.** The scorer distilled from T5 does not simply reproduce T5's own top-k (notebook 01): "
           "`L_cls` trains it too, and under `st` every supervised target gives *every* token a gradient. "
           "`vs_targets` puts T5's own top-k coverage beside the T5 scorer's and the `random_map` control's (the "
           "same scorer, loss and λ distilling a seeded random map: a full ranking without content). Where does "
           "the T5 scorer's coverage come from on this run? (`'a'`–`'d'`)\n\n"
           "* (a) from T5's **content**: the T5 scorer covers resolvably more than the control (the paired "
           "interval of `gain_over_control` lies above 0);\n"
           "* (b) from **training with a full ranking**, not from T5's content: the scorer's coverage is not "
           "resolvably different from the control's (the interval contains 0), whether it lies above or below "
           "T5's own top-k;\n"
           "* (c) T5's content **costs** coverage: the scorer covers resolvably less than the control;\n"
           "* (d) this run **cannot say**: it has no `random_map` control (or no T5 scorer).",
           "the T5 row of `vs_targets`: `gain_over_control_lo` and `gain_over_control_hi`.", ["vs_targets"], _option)
def _ex_scorer_vs_control(vs_targets) -> Choice:
    rows = vs_targets[vs_targets["target"] == "T5"] if "target" in getattr(vs_targets, "columns", []) else []
    if len(rows) == 0:
        return _choice_of("d", "abcd", "vs_targets has no T5 scorer.")
    r = rows.iloc[0]
    g, lo, hi = (float(r.get(c, math.nan)) for c in ("gain_over_control", "gain_over_control_lo",
                                                     "gain_over_control_hi"))
    sign = _sign_of(lo, hi)
    pick = {"positive": "a", "not resolved": "b", "negative": "c", "undefined": "d"}[sign]
    why = ("there is no control to compare with." if sign == "undefined" else
           f"T5's own top-k {float(r['target_miou']):.3f}, the T5 scorer {float(r['scorer_miou']):.3f}, the control "
           f"{float(r['control_miou']):.3f}; scorer − control {g:+.3f} [{lo:+.3f}, {hi:+.3f}].")
    return _choice_of(pick, "abcd", why)


# ---------------------------------------------------------------------------- 03 probes
@_register("03.cos_t5_t3",
           "What is the mean rank cosine between **T5 and T3** on this run? (`float`)",
           "read it from the matrix `mean` (rows and columns are target ids).", ["mean"], _number)
def _ex_cos_t5_t3(mean) -> float:
    return float(mean.loc["T5", "T3"])


@_register("03.most_similar_pair",
           "Which **two different targets** rank the tokens most alike (highest mean cosine off the "
           "diagonal)? (a pair of names, in any order)",
           "`mean.stack()` lists (row, column, value); skip pairs of a target with itself.", ["mean"], _pair)
def _ex_most_similar(mean) -> set[frozenset[str]]:
    vals = {frozenset((a, b)): float(mean.loc[a, b]) for a in mean.index for b in mean.columns if a != b}
    best = _argmax_ties({"|".join(sorted(k)): v for k, v in vals.items()})
    return {frozenset(k.split("|")) for k in best}


@_register("03.hidden_vs_attention",
           "**Why.** The paper reports |cos| ≤ 0.082 between hidden-gradient (T4, T5) and attention-gradient "
           "(T2, T3) rankings and reads it as *the two families rank tokens independently* — so a scorer "
           "distilled from one inherits nothing of the other's ranking. What do this run's 95 % intervals in "
           "`hv` allow you to say? (`'a'`, `'b'` or `'c'`; where (b) and (c) are both true, either is "
           "accepted)\n\n"
           "* (a) every pair's interval contains 0: no pair is resolvably related — consistent with independent "
           "rankings (though not a proof that the cosine is 0);\n"
           "* (b) some pair is resolvably **positive**: that hidden-gradient target ranks tokens partly like "
           "that attention-gradient one;\n"
           "* (c) some pair is resolvably **negative**: what one ranks first the other tends to rank last — "
           "related, but reversed, not independent.",
           "compare `lo` and `hi` of each row of `hv` with 0.", ["hv"], _option)
def _ex_hidden_vs_attention(hv) -> Choice:
    signs = {(str(r["hidden"]), str(r["attention"])): _sign_of(float(r["lo"]), float(r["hi"]))
             for _, r in hv.iterrows()}
    pos = [f"{a}–{b}" for (a, b), x in signs.items() if x == "positive"]
    neg = [f"{a}–{b}" for (a, b), x in signs.items() if x == "negative"]
    accepted = ({"b"} if pos else set()) | ({"c"} if neg else set()) or {"a"}
    why = (f"resolvably positive: {', '.join(pos) or 'none'}; resolvably negative: {', '.join(neg) or 'none'} "
           f"(of {len(signs)} pairs).")
    return _choice_of(accepted, "abc", why)


# ---------------------------------------------------------------------------- 04 sweeps
@_register("04.T5_cells_in_band",
           "In how many `(L, b)` cells of the sweep is the **T5** condition inside the parity band — its whole "
           f"95 % ΔIDAUC interval at or above −{PARITY_BAND:g} (cells whose interval straddles −{PARITY_BAND:g} are "
           "*not resolved* "
           "and do not count)? (`int`)",
           f"filter `D` to condition T5 and count `delta_idauc_lo ≥ −{PARITY_BAND:g}` (`status == 'in band'`).", ["D"],
           _integer)
def _ex_t5_cells(D) -> int:
    t5 = D[D["condition"] == "T5"]
    return int(_resolved_in_band(t5).sum())


@_register("04.keep_counts",
           "How many tokens are kept at each budget of the sweep (`study.settings.sweep.budgets`, in that "
           "order)? (a list of `int`)",
           "k = ceil(b·N) for each b.", ["study"], _integers)
def _ex_keep_counts(study) -> list[int]:
    return [keep_count(b, _n_patches(study)) for b in study.settings.sweep.budgets]


def _t5_budget_ends(mine, study):
    L0 = study.settings.point.depth
    g = mine[(mine["condition"] == "T5") & (mine["depth"].astype(int) == L0)]
    return g.sort_values("budget"), L0


def _two_budgets(mine, ceiling, study) -> str | None:
    g, L0 = _t5_budget_ends(mine, study)
    n = g["budget"].nunique()
    return None if n >= 2 else f"needs T5 at ≥ 2 budgets at the study's depth L = {L0}; this run has {n}"


@_register("04.budget_fall",
           "**Why.** A looser budget keeps more tokens, and the IoU ceiling of notebook 00 — the best part (or "
           "box) IoU any ranking can reach — changes with it; `D` is a difference of two IoUs under that "
           "ceiling. Follow **D(T5)** from the tightest to the loosest budget of the sweep at the study's depth `L` "
           "(`study.settings.point.depth`), and compute its share of the ceiling, `D / (100 · ceiling)`, at both "
           "ends (`ceiling` holds the ceiling per budget). Is D's change more than the ceiling's? (`'a'`, `'b'` "
           "or `'c'`)\n\n"
           "* (a) D(T5) does **not fall** resolvably: the loosest budget's interval of D is not entirely below "
           "the tightest one's — there is no fall to explain;\n"
           "* (b) D(T5) falls, but its **share of the ceiling holds** (positive at the tightest budget, at least "
           "half of it left at the loosest): the fall is mostly the ceiling's — when most kept tokens cannot be "
           "part (or box) patches, there is less coverage to gain, not a weaker effect;\n"
           "* (c) D(T5) falls and its **share of the ceiling falls too** (less than half of it left, or D not "
           "positive at the tightest budget): more changed than the ceiling.",
           "the T5 rows of `mine` at depth `study.settings.point.depth`, sorted by budget: the ends' `D_pp_lo` / "
           "`D_pp_hi`; `midas_nb.analysis.axis_trend(mine, 'T5', 'budget', L, ceiling=ceiling)` says the same in "
           "words.", ["mine", "ceiling", "study"], _option, applies=_two_budgets)
def _ex_budget_fall(mine, ceiling, study) -> Choice:
    g, L0 = _t5_budget_ends(mine, study)
    near, far = g.iloc[0], g.iloc[-1]
    c = dict(zip(ceiling["budget"].astype(float), ceiling["ceiling"].astype(float)))
    c0, c1 = c.get(float(near["budget"]), math.nan), c.get(float(far["budget"]), math.nan)
    r0, r1 = float(near["D_pp"]) / (100 * c0), float(far["D_pp"]) / (100 * c1)
    falls = float(far["D_pp_hi"]) < float(near["D_pp_lo"])
    pick = "a" if not falls else "c" if share_falls(r0, r1) else "b"
    return _choice_of(pick, "abc",
                      f"at L = {L0}: D(T5) {float(near['D_pp']):+.2f} [{float(near['D_pp_lo']):+.2f}, "
                      f"{float(near['D_pp_hi']):+.2f}] pp at b = {float(near['budget']):.0%}, "
                      f"{float(far['D_pp']):+.2f} [{float(far['D_pp_lo']):+.2f}, {float(far['D_pp_hi']):+.2f}] pp at "
                      f"b = {float(far['budget']):.0%}; ceiling {c0:.2f} → {c1:.2f}, share of it {r0:+.2f} → {r1:+.2f}.")


# ----------------------------------------------------------------------------- 05 scale
@_register("05.best_backbone_T5",
           "On which backbone does **T5** gain the most coverage over the reference (largest D)? (`str`)",
           "filter `D` to condition T5.", ["D"], _choice, applies=_two_backbones)
def _ex_best_backbone(D) -> set[str]:
    t5 = D[D["condition"] == "T5"]
    return _argmax_ties(dict(zip(t5["backbone"], t5["D_pp"].astype(float))))


@_register("05.D_spread_T5",
           "How much does **D(T5)** vary across backbones: largest minus smallest, in pp? (`float`)",
           "`max - min` of T5's `D_pp`.", ["D"], _number, applies=_two_backbones)
def _ex_spread(D) -> float:
    t5 = D.loc[D["condition"] == "T5", "D_pp"].astype(float)
    return float(t5.max() - t5.min())


@_register("05.own_backbone_T5",
           "**What would the paper say?** The paper's scale finding says the T5 gain **reproduces** on DeiT-Ti "
           "(D(T5) > 0 inside the parity band) and **reverses** on AugReg ViT-B (D < 0, or outside the band). "
           "Apply that reading to this run's own backbone (`study.settings.backbone.name`: its T5 row of `D`, with "
           "the paired interval of D and the band `status`). (`'a'`, `'b'` or `'c'`)\n\n"
           "* (a) **reproduces**: the whole interval of D(T5) lies above 0 and `status` is *in band*;\n"
           "* (b) **reverses**: the whole interval of D(T5) lies below 0, or `status` is *outside band*;\n"
           "* (c) **undecided**: neither — the interval of D contains 0, or the band is *not resolved* or "
           "*uninformative*: this backbone can neither confirm nor contradict the finding.",
           "the row of `D` with `backbone == study.settings.backbone.name` and `condition == 'T5'`: `D_pp_lo`, "
           "`D_pp_hi`, `status`.", ["D", "study"], _option)
def _ex_own_backbone_t5(D, study) -> Choice:
    g = D[(D["condition"] == "T5") & (D["backbone"].astype(str) == study.settings.backbone.name)]
    if "dataset" in g.columns and getattr(study, "dataset_name", None) in set(g["dataset"]):
        g = g[g["dataset"] == study.dataset_name]
    if len(g) != 1:
        raise ValueError(f"expected one T5 row of {study.settings.backbone.name} in D, found {len(g)}")
    r = g.iloc[0]
    lo, hi, status = float(r["D_pp_lo"]), float(r["D_pp_hi"]), str(r["status"])
    pick = ("b" if status == "outside band" or _sign_of(lo, hi) == "negative" else
            "a" if _sign_of(lo, hi) == "positive" and status == "in band" else "c")
    return _choice_of(pick, "abc", f"{r['backbone']}: D(T5) {float(r['D_pp']):+.2f} [{lo:+.2f}, {hi:+.2f}] pp, "
                                   f"band {status}.")


@_register("05.spread_resolved",
           "**Why.** D(T5) differs between the backbones by the spread of 05.2. Is that a property of the "
           "backbones, or could this sample alone produce it? Compare the 95 % intervals of the **largest** and "
           "the **smallest** D(T5). (`'a'` or `'b'`)\n\n"
           "* (a) **resolved**: the two intervals do not overlap — this run tells those backbones apart on "
           "D(T5);\n"
           "* (b) **not resolved**: the intervals overlap — on this sample the backbones cannot be ranked on "
           "D(T5), however large the spread of the means looks.",
           "the T5 rows of `D` with the largest and the smallest `D_pp`: is the largest's `D_pp_lo` above the "
           "smallest's `D_pp_hi`?", ["D"], _option, applies=_two_backbones)
def _ex_spread_resolved(D) -> Choice:
    t5 = D[D["condition"] == "T5"].sort_values("D_pp")
    low, high = t5.iloc[0], t5.iloc[-1]
    apart = float(high["D_pp_lo"]) > float(low["D_pp_hi"])
    return _choice_of("a" if apart else "b", "ab",
                      f"largest {high['backbone']} {float(high['D_pp']):+.2f} [{float(high['D_pp_lo']):+.2f}, "
                      f"{float(high['D_pp_hi']):+.2f}] pp, smallest {low['backbone']} {float(low['D_pp']):+.2f} "
                      f"[{float(low['D_pp_lo']):+.2f}, {float(low['D_pp_hi']):+.2f}] pp.")


# --------------------------------------------------------------------------- 06 related
@_register("06.best_separation",
           "Which relevance map separates relevant from irrelevant tokens best in TokenTM's "
           "perturbation tests (highest `neg_minus_pos`)? (`str`)",
           "sort `res.perturbation` by `neg_minus_pos`.", ["res"], _choice)
def _ex_best_sep(res) -> set[str]:
    p = res.perturbation
    return _argmax_ties(dict(zip(p["target"], p["neg_minus_pos"].astype(float))))


@_register("06.pib_T0",
           "Compute the **Point-in-Box rate of T0** yourself: over the `n_images` test images the protocol "
           "evaluates, the fraction whose highest-scoring T0 patch lies in the object box. (`float`)",
           "the images are `midas_nb.data.evaluation_subset(len(study.test_set), n_images, "
           "study.settings.protocol.eval_subset_seed)`; then `study.target_maps(ids=['T0'])['T0'][i].argmax()` "
           "and `study.test_set[i].box_mask`.",
           ["pib"], _number)
def _ex_pib_t0(pib) -> float:
    return float(pib.set_index("ranking").loc["T0", "pib"])


@_register("06.patch_score_pib",
           "**Why.** LaSt-ViT reads the backbone's Patch Score (`cos(CLS, patch)` at the last block) as "
           "localisation: its top patch should lie on the object. Read the `patch_score` row of `pib` against "
           "its two baselines — `pib_centre` (always pick the centre patch) and `pib_box_area` (the box's share "
           "of patches: what a random patch scores). Which describes this run? (`'a'`, `'b'` or `'c'`)\n\n"
           "* (a) the Patch Score **localises**: the lower end of its 95 % interval (`pib_lo`) lies above "
           "**both** baselines;\n"
           "* (b) it does not beat the **centre patch** (`pib_lo ≤ pib_centre`): on these object-centred images "
           "a fixed guess does as well, so Point-in-Box cannot credit the ranking;\n"
           "* (c) it beats the centre patch but not a **random patch** (`pib_centre < pib_lo ≤ pib_box_area`): "
           "the box fills so much of the grid that a random patch lands in it about as often.",
           "the `patch_score` row of `pib`: `pib_lo`, `pib_centre`, `pib_box_area`.", ["pib"], _option)
def _ex_patch_score_pib(pib) -> Choice:
    r = pib.set_index("ranking").loc["patch_score"]
    lo, centre, area = float(r["pib_lo"]), float(r["pib_centre"]), float(r["pib_box_area"])
    pick = "a" if lo > max(centre, area) else "b" if lo <= centre else "c"
    return _choice_of(pick, "abc", f"Patch Score PiB {float(r['pib']):.2f} [{lo:.2f}, {float(r['pib_hi']):.2f}] "
                                   f"against the centre patch {centre:.2f} and the box area {area:.2f}.")


# ---------------------------------------------------------------------------- 07 deploy
@_register("07.coverage_first",
           "Apply the **coverage-first** rule yourself to `table`: among the conditions (not the `random` ranking "
           "or the `random_map` control) whose *mean* ΔIDAUC is "
           f"at or above −{PARITY_BAND:g} (the rule's point decision, reference included with D = 0), the one with the "
           "largest D. (`str`; the advice's `status` then says whether the interval resolves the band)",
           "`midas_nb.metrics.decoupling_D(table)` has `D_pp` and `delta_idauc`.", ["table"], _choice)
def _ex_cov_first(table) -> set[str]:
    return _advised(table, "coverage-first")


@_register("07.faithfulness_first",
           "Apply the **faithfulness-first** rule yourself: the condition (not `random` or `random_map`) with the "
           "highest mean IDAUC "
           "(within 0.001 of the best: the higher mIoU wins). (`str`)",
           "`table.groupby('condition')[['idauc', 'miou']].mean()`.", ["table"], _choice)
def _ex_faith_first(table) -> set[str]:
    return _advised(table, "faithfulness-first")


@_register("07.decoupling_shown",
           "**Does this run show the decoupling?** `verdict` tested both halves of the claim (notebook 02). "
           "Pick a statement that is true on this run (where several are, any of them is accepted). (`'a'`–`'d'`)"
           "\n\n"
           "* (a) **both halves hold**: T5 gains coverage at faithfulness parity *and* the best-coverage and "
           "best-faithfulness conditions are different winners, both leads resolved — the run shows the "
           "decoupling;\n"
           "* (b) **the winners tie**: one condition leads on both metrics, a lead between the two winners is not "
           "resolved, a third condition ties with both, or they cannot be compared — there are no two winners to "
           "decouple, whatever T5 does;\n"
           "* (c) **both metrics rose together**: across the conditions mean mIoU and mean IDAUC correlate "
           "resolvably positively — *both rose*, the opposite of a decoupling;\n"
           "* (d) **only the winners differ**: the two winners are resolved, but T5 does not gain coverage at "
           "parity — half of the claim.",
           "`verdict.decoupling_shown`, `verdict.winners['reading']` and `verdict.comovement['reading']`.",
           ["verdict"], _option)
def _ex_decoupling_shown(verdict) -> Choice:
    shown = bool(verdict.decoupling_shown)
    winners, co = str(verdict.winners.get("reading")), str(verdict.comovement.get("reading"))
    accepted = set()
    if shown:
        accepted.add("a")
    if winners != "different winners":
        accepted.add("b")
    if co == "move together":
        accepted.add("c")
    if winners == "different winners" and not shown:
        accepted.add("d")
    return _choice_of(accepted, "abcd", f"winners: {winners}; co-movement: {co}; decoupling shown: {shown}.")


def _advised(table, goal: str) -> set[str]:
    """The condition :func:`midas_nb.analysis.recommend_deployment` advises for ``goal``."""
    adv = recommend_deployment(table)[0].set_index("goal")
    return {str(adv.loc[goal, "condition"])}
