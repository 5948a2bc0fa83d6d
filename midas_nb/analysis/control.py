"""D against the reference beside D against the training-signal control (``random_map``).

Under the straight-through relaxation ``L_cls`` reaches only the kept tokens while every
supervised target gives every token a gradient (DESIGN.md §5), so ``D(Tk)`` against the
reference mixes the content of ``Tk`` with merely having a full-ranking signal. The
``random_map`` condition (:mod:`midas_nb.analysis.protocol`) has that signal without content: ``D`` of
``Tk`` against it is the part of the coverage gain that the target's content adds.
:func:`decoupling_with_controls` puts both side by side, from
:func:`midas_nb.metrics.decoupling_D` called once per baseline.
"""
from __future__ import annotations

from typing import Any, Sequence

import pandas as pd

from ..metrics import decoupling_D
from ..metrics.stats import interval_sign
from ..results import format_ci

__all__ = ["CONTROL_COLUMNS", "decoupling_with_controls", "two_verdicts"]

#: the columns of ``decoupling_D`` shown for each control, renamed ``<column>_vs_<control>``
CONTROL_COLUMNS: tuple[str, ...] = ("D_pp", "D_pp_lo", "D_pp_hi", "delta_idauc", "delta_idauc_lo",
                                    "delta_idauc_hi", "status", "band_reason")
_CELL = ("dataset", "backbone", "depth", "budget")
_CONDITION = ("condition", "target", "relaxation")


def decoupling_with_controls(table: pd.DataFrame, controls: Sequence[str] = ("random_map",),
                             reference: str = "reference", **kwargs: Any) -> pd.DataFrame:
    """:func:`midas_nb.metrics.decoupling_D` against ``reference`` with, for each control, the
    same statistic against that control as columns ``<column>_vs_<control>``.
    ``band_reason_vs_<control>`` holds the control's own faithfulness check (its IDAUC against
    the random ranking): the band against the control can speak where the band against the
    reference cannot, and the other way round.

    ``D_pp_vs_random_map = mIoU_t − mIoU_random_map`` (percentage points) and its ΔIDAUC band
    status, paired over seeds and images exactly as against the reference (DESIGN.md §6); the
    control's own row has 0 there, the reference's row the negative of the control's ``D``.

    Args:
        table: protocol rows (:meth:`midas_nb.study.Study.protocol`) holding ``reference`` and
            every control.
        controls: control conditions (default ``("random_map",)``).
        reference: the reference condition.
        **kwargs: further arguments of :func:`~midas_nb.metrics.decoupling_D` (``n_boot``,
            ``band``, ``by``, ...), the same for every baseline.

    Returns:
        The ``decoupling_D(table, reference)`` rows, in their order, with the
        :data:`CONTROL_COLUMNS` of each control appended.

    Raises:
        ValueError: a control without rows in ``table`` (the message says how to add it), a
            control equal to ``reference``, or ``decoupling_D``'s errors.
    """
    controls = list(dict.fromkeys(controls))
    present = set(table["condition"].astype(str)) if "condition" in table.columns else set()
    for c in controls:
        if c == reference:
            raise ValueError(f"control {c!r} is the reference itself; name another condition")
        if c not in present:
            raise ValueError(f"the table has no {c!r} rows (conditions: {sorted(present)}); run the protocol "
                             f"with it, e.g. study.protocol(conditions=[..., {c!r}])")
    out = decoupling_D(table, reference=reference, **kwargs)
    # a row of either table is one (cell, condition[, seed])
    keys_of = list(kwargs.get("by") or _CELL) + list(kwargs.get("condition_cols") or _CONDITION)
    keys_of += [kwargs.get("seed_col", "seed")] if kwargs.get("per_seed") else []
    for c in controls:
        vs = decoupling_D(table, reference=c, **kwargs)
        keys = [k for k in keys_of if k in out.columns and k in vs.columns]
        cols = [k for k in CONTROL_COLUMNS if k in vs.columns]
        vs = vs[keys + cols].rename(columns={k: f"{k}_vs_{c}" for k in cols})
        out = out.merge(vs, on=keys, how="left", validate="one_to_one")
    return out


def two_verdicts(d: pd.DataFrame, focus: str = "T5", control: str = "random_map") -> str:
    """One sentence for ``focus``'s row of :func:`decoupling_with_controls`: what ``D_pp_vs_<control>`` and
    ``status_vs_<control>`` each say and which claim each answers — the first is about **coverage** (the gain
    beyond the control: the claim "T5's content explains its scorer's gain"), the band about **faithfulness**
    (ΔIDAUC against the control's, no claim of the paper; the parity claim is ``status``, against the reference).
    ``""`` where ``d`` lacks the control's columns or the ``focus`` row."""
    col = f"D_pp_vs_{control}"
    if col not in d.columns or focus not in set(d["condition"]):
        return ""
    r = d.set_index("condition").loc[focus]
    lo, hi = r[f"D_pp_lo_vs_{control}"], r[f"D_pp_hi_vs_{control}"]
    num = format_ci(r[col], lo, hi, "+.2f", " pp")
    gain = {"positive": "resolvably above the control", "negative": "resolvably below the control",
            "not resolved": "not resolved: the interval holds 0"}.get(interval_sign(lo, hi), "undefined")
    return (f"Two verdicts for {focus}: coverage — D vs {control} {num}, {gain}; it answers \"{focus}'s content "
            f"explains its scorer's gain\" (the box at the end). Faithfulness — the band vs {control} "
            f"\"{r[f'status_vs_{control}']}\" says whether {focus}'s IDAUC is at parity with the control's, whatever "
            f"the coverage does; the paper's parity claim is the band vs the reference, \"{r['status']}\" (the D "
            "table above).")
