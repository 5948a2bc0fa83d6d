"""Exercise checkers of the course edition: each notebook's 2–4 exercises, their expected answers from the
objects the notebook built, and :func:`check_exercise`."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Iterable

import torch

from ..metrics import decoupling_D
from ..results import recommend_deployment
from ..vit import keep_count


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
    """

    name: str
    prompt: str
    hint: str
    needs: tuple[str, ...]
    expected: Callable[..., Any]
    compare: Callable[[Any, Any], tuple[bool, str]]


EXERCISES: dict[str, Exercise] = {}


def _register(name: str, prompt: str, hint: str, needs: Iterable[str],
              compare: Callable[[Any, Any], tuple[bool, str]]):
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        if name in EXERCISES:
            raise ValueError(f"exercise {name!r} registered twice")
        EXERCISES[name] = Exercise(name, prompt, hint, tuple(needs), fn, compare)
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
    return ex.expected(**{k: ctx[k] for k in ex.needs})


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

    Raises:
        AssertionError: the solution disagrees with the checker (the message says how).
        KeyError: an unknown exercise or a missing context object.
    """
    ex = _get(name)
    expected = expected_answer(name, **ctx)
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


# --------------------------------------------------------------------------------- helpers
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
           "at **b = 10 %**? (`float`, the `min(f, b) / max(f, b)` ceiling above)",
           "f is the fraction of part patches in `batch.part_mask`; b = 0.10.", ["batch"], _number)
def _ex_iou_ceiling(batch) -> float:
    f = float(batch.part_mask.float().mean())
    return min(f, 0.10) / max(f, 0.10)


@_register("00.part_patches",
           "How many part patches does the **first** example image of `batch` have? (`int`)",
           "count the True entries of one row of `batch.part_mask`.", ["batch"], _integer)
def _ex_part_patches(batch) -> int:
    return int(batch.part_mask[0].sum())


# --------------------------------------------------------------------------- 01 targets
@_register("01.abs_t5",
           "Add a target that is the **absolute value of T5**: build its map over the test split "
           "(a tensor `[M, N]` like `maps['T5']`).",
           "T5 is signed (input × gradient); `torch`'s `.abs()` works on tensors.", ["maps"], _tensor)
def _ex_abs_t5(maps) -> torch.Tensor:
    return maps["T5"].abs()


@_register("01.abs_t5_miou",
           "What part mIoU do the top `k = ceil(b·N)` tokens of **|T5|** reach on the test split, at the "
           "study's budget? (`float`; images without a part patch are left out)",
           "`midas_nb.pruning.select_top_k`, `keep_mask_from_indices` and `midas_nb.metrics.part_miou`; "
           "the part masks are `study.test_set[i].part_mask`.", ["maps", "study"], _number)
def _ex_abs_t5_miou(maps, study) -> float:
    # independent of midas_nb.pruning/metrics: per-image sets, stable sort (ties → lower index)
    import math as _m
    scores = maps["T5"].abs().float()
    n = scores.shape[1]
    k = max(1, min(n, _m.ceil(round(float(study.params["budget"]) * n, 9))))
    ious = []
    for i in range(scores.shape[0]):
        order = torch.sort(scores[i], descending=True, stable=True).indices[:k]
        kept = set(order.tolist())
        parts = set(torch.nonzero(study.test_set[i].part_mask).flatten().tolist())
        if parts:
            ious.append(len(kept & parts) / len(kept | parts))
    return sum(ious) / len(ious) if ious else float("nan")


@_register("01.best_target",
           "Which target's own top-k tokens cover the parts best (highest `miou` in `coverage`)? (`str`)",
           "sort `coverage` by `miou`.", ["coverage"], _choice)
def _ex_best_target(coverage) -> set[str]:
    return _argmax_ties(dict(zip(coverage["target"], coverage["miou"].astype(float))))


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


def _resolved_in_band(D, band: float = 0.01) -> Any:
    """Per row of a ``decoupling_D`` table: inside the parity band *as its interval says* — the
    whole paired ΔIDAUC interval ``≥ −band`` (``delta_idauc_lo``); the point value only where a
    row has no interval; a row whose ΔIDAUC or ``D_pp`` is undefined (``status`` "undefined")
    is never inside. Computed here from the interval columns, independently of
    ``decoupling_D``'s ``status`` (with its tolerance: ΔIDAUC = −band counts as inside)."""
    import pandas as pd
    lo = D["delta_idauc_lo"] if "delta_idauc_lo" in D.columns else pd.Series(float("nan"), index=D.index)
    hi = D["delta_idauc_hi"] if "delta_idauc_hi" in D.columns else pd.Series(float("nan"), index=D.index)
    point = D["delta_idauc"].astype(float)
    defined = point.notna() & (D["D_pp"].astype(float).notna() if "D_pp" in D.columns else True)
    has_ci = lo.notna() & hi.notna()
    inside = (has_ci & (lo.astype(float) >= -band - 1e-12)) | (~has_ci & (point >= -band - 1e-12))
    return defined & inside


@_register("02.in_band",
           "Which conditions does `D` show **inside the IDAUC parity band** — the whole 95 % interval of "
           "ΔIDAUC at or above −0.01 (`delta_idauc_lo ≥ −0.01`)? A mean ΔIDAUC above −0.01 whose interval "
           "straddles −0.01 is *not resolved*, not in band. (a list or set of names; including the "
           "reference is optional)",
           "compare `delta_idauc_lo` in `D` with −0.01 (`status` says the same in words).", ["D"], _names)
def _ex_in_band(D) -> set[str]:
    return set(D.loc[_resolved_in_band(D), "condition"].astype(str))


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


# ---------------------------------------------------------------------------- 04 sweeps
@_register("04.T5_cells_in_band",
           "In how many `(L, b)` cells of the sweep is the **T5** condition inside the parity band — its whole "
           "95 % ΔIDAUC interval at or above −0.01 (cells whose interval straddles −0.01 are *not resolved* "
           "and do not count)? (`int`)",
           "filter `D` to condition T5 and count `delta_idauc_lo ≥ −0.01` (`status == 'in band'`).", ["D"],
           _integer)
def _ex_t5_cells(D) -> int:
    t5 = D[D["condition"] == "T5"]
    return int(_resolved_in_band(t5).sum())


@_register("04.keep_counts",
           "How many tokens are kept at each budget of the sweep (`study.params['budgets']`, in that "
           "order)? (a list of `int`)",
           "k = ceil(b·N) for each b.", ["study"], _integers)
def _ex_keep_counts(study) -> list[int]:
    return [keep_count(b, _n_patches(study)) for b in study.params["budgets"]]


# ----------------------------------------------------------------------------- 05 scale
@_register("05.best_backbone_T5",
           "On which backbone does **T5** gain the most coverage over the reference (largest D)? (`str`)",
           "filter `D` to condition T5.", ["D"], _choice)
def _ex_best_backbone(D) -> set[str]:
    t5 = D[D["condition"] == "T5"]
    return _argmax_ties(dict(zip(t5["backbone"], t5["D_pp"].astype(float))))


@_register("05.D_spread_T5",
           "How much does **D(T5)** vary across backbones: largest minus smallest, in pp? (`float`)",
           "`max - min` of T5's `D_pp`.", ["D"], _number)
def _ex_spread(D) -> float:
    t5 = D.loc[D["condition"] == "T5", "D_pp"].astype(float)
    return float(t5.max() - t5.min())


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
           "the images are `midas_nb.protocol.evaluation_subset(len(study.test_set), n_images, "
           "study.params.get('eval_subset_seed', 0))`; then `study.target_maps(ids=['T0'])['T0'][i].argmax()` "
           "and `study.test_set[i].box_mask`.",
           ["pib"], _number)
def _ex_pib_t0(pib) -> float:
    return float(pib.set_index("ranking").loc["T0", "pib"])


# ---------------------------------------------------------------------------- 07 deploy
@_register("07.coverage_first",
           "Apply the **coverage-first** rule yourself to `table`: among the conditions (not the `random` ranking "
           "or the `random_map` control) whose *mean* ΔIDAUC is "
           "at or above −0.01 (the rule's point decision, reference included with D = 0), the one with the "
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


def _advised(table, goal: str) -> set[str]:
    """The condition :func:`midas_nb.results.recommend_deployment` advises for ``goal``."""
    adv = recommend_deployment(table)[0].set_index("goal")
    return {str(adv.loc[goal, "condition"])}
