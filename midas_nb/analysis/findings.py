"""Which of the MIDAS paper's findings hold in a run (DESIGN.md §8), each with its evidence and intervals."""
from __future__ import annotations

import math
from typing import Any, Literal, Mapping, Sequence

import numpy as np
import pandas as pd

from ..config import PAPER_BACKBONES
from ..metrics import band_resolution, decoupling_D, is_finite_number, parity_band
from ..results import format_ci
from .paper_reference import PAPER_COSINE_MAX, PAPER_FINDINGS, PAPER_SETTING


Holds = bool | Literal["undefined", "not resolved", "uninformative", "not counted"]

#: the fitness rule (decision 0070): a backbone has learned its task when the Wilson 95 % lower bound of its test
#: top-1, chance-corrected against the best label-frequency answer (max(chance, majority share)), is at least
#: FIT_MARGIN, and its top-1 is at least FIT_TEACHER_SHARE of its teacher's
FIT_MARGIN, FIT_TEACHER_SHARE = 0.10, 0.5


def backbone_fitness(top1: float, n_test: int, chance: float, majority: float,
                     teacher: float | None = None) -> tuple[bool, str]:
    """Whether a backbone has learned its task (DESIGN.md §6 "Fitness"; decision 0070), and why in words.

    ``base = max(chance, majority)``; ``lo`` is the Wilson 95 % lower bound of ``top1`` over ``n_test`` images
    (Wilson, 1927); fit when ``(lo − base) / (1 − base) ≥`` :data:`FIT_MARGIN` (resolvably above what the label
    frequencies give, by a tenth of what is left to learn) and, with a ``teacher`` top-1, ``top1 ≥``
    :data:`FIT_TEACHER_SHARE` ``· teacher``. All accuracies are fractions of the test split.

    Returns:
        ``(fit, text)``; ``text`` e.g. ``"the backbone has not learned the task (5.1 % against chance 1.0 %, …)"``.

    Raises:
        ValueError: ``n_test < 1`` or an accuracy outside [0, 1].
    """
    if n_test < 1 or not all(0 <= float(v) <= 1 for v in (top1, chance, majority) + ((teacher,) if teacher else ())):
        raise ValueError(f"backbone_fitness: needs n_test ≥ 1 and accuracies in [0, 1]; got top1={top1}, "
                         f"n_test={n_test}, chance={chance}, majority={majority}, teacher={teacher}")
    base, z = max(chance, majority), 1.959964
    lo = ((top1 + z * z / (2 * n_test) - z * math.sqrt(top1 * (1 - top1) / n_test + z * z / (4 * n_test ** 2)))
          / (1 + z * z / n_test))
    gain = (lo - base) / (1 - base) if base < 1 else 0.0
    share = top1 / teacher if teacher else math.inf
    fit = gain >= FIT_MARGIN and share >= FIT_TEACHER_SHARE
    pc = lambda x: f"{100 * x:.1f} %"  # noqa: E731
    why = (f"{pc(top1)} against chance {pc(chance)}, majority {pc(majority)}" + (f", teacher {pc(teacher)}" if teacher
           else "") + f"; {n_test} test images: its lower bound {pc(lo)} is {100 * gain:.0f} % of the way from {pc(base)} "
           f"to 100 % (rule ≥ {100 * FIT_MARGIN:.0f} %)" + (f", {100 * share:.0f} % of its teacher (rule ≥ {100 * FIT_TEACHER_SHARE:.0f} %)"
                                                    if teacher else ""))
    return fit, f"the backbone {'has' if fit else 'has not'} learned the task ({why})"


def fitness_over_builds(per_build: Mapping[int, tuple[bool, str]]) -> tuple[bool, str]:
    """One backbone's :func:`backbone_fitness` over its builds ``{build: (fit, text)}`` (decision 0082): fit only
    where every build is, since the intervals of the findings span the builds; the text is the one build's, else
    it names the first build that fails (or says that every build passes). ``ValueError`` for no build."""
    if not per_build:
        raise ValueError("fitness_over_builds: no build to judge; expected {build: (fit, text)}")
    bad = [(k, t) for k, (ok, t) in sorted(per_build.items()) if not ok]
    if len(per_build) == 1:
        return next(iter(per_build.values()))
    if bad:
        return False, f"build {bad[0][0]} of builds {', '.join(map(str, sorted(per_build)))}: {bad[0][1]}"
    return True, f"each of the {len(per_build)} backbone builds has learned the task"


#: the evidence of a depth or budget finding where there is no coverage gain of T5 at parity to fade, and where a fall
#: in pp is the IoU ceiling's (the per-claim table reads neither as the paper's opposite: decision 0079)
NOTHING_TO_FADE, CEILING_FALL = "no coverage gain of T5 at parity to fade", "the fall is the ceiling's"


def finding_verdict(fid: str, holds: Any, evidence: str) -> str:
    """A finding's verdict in the table's words. ``False`` is the **opposite of the paper** where the run
    shows the reverse sign: T1 resolvably above the reference; T5 resolvably below it (not merely outside
    the band); ``D(T5)`` rising along an axis where T5 had a coverage gain at parity to fade (the findings module
    says :data:`~midas_nb.analysis.findings.NOTHING_TO_FADE` otherwise; a fall in pp that is the IoU ceiling's
    "does not hold")."""
    if holds is True or str(holds) == "True":
        return "holds"
    if str(holds) != "False":
        return str(holds)
    opposite = (fid == "t1_below_reference" or (fid == "t5_gain_in_band" and "outside band" not in evidence)
                or (fid in ("fades_deep", "fades_loose")       # "no decoupling": tables of earlier releases
                    and not any(s in evidence for s in (NOTHING_TO_FADE, "no decoupling", CEILING_FALL))))
    return "opposite of the paper" if opposite else "does not hold"


def share_falls(near: float, far: float) -> bool:
    """The notebooks' reading of ``D`` as a share of the IoU ceiling along the budget (decision 0041): the share
    falls unless it is positive at the near end (tight budget) and at least half of it is left at the far end.
    Exercise 04.budget_fall and the ``fades_loose`` finding read it so."""
    return not (near > 0 and far >= 0.5 * near)


def count_fitness(findings: pd.DataFrame, fitness: Mapping[tuple[str, str], tuple[bool, str]],
                  verdict: str = "holds", evidence: str = "evidence") -> pd.DataFrame:
    """``findings`` (one row per dataset × backbone × finding; ``scale`` rows name their backbones joined by
    ``+``) with every verdict of a backbone that fails :func:`backbone_fitness` replaced by ``"not counted"`` and
    its evidence prefixed with the reason; ``fitness``: ``{(dataset, backbone): (fit, text)}``, a block without
    an entry is left as it is. Idempotent."""
    out = findings.copy()
    for i, r in (out.iterrows() if fitness else ()):
        bad = [fitness[k][1] for k in ((r["dataset"], b) for b in str(r["backbone"]).split("+"))
               if k in fitness and not fitness[k][0]]
        if bad and str(r[verdict]) != "not counted":
            out.at[i, verdict] = "not counted"
            out.at[i, evidence] = f"not counted: {bad[0]}; {r[evidence]}"
    return out


#: RNG seed of every bootstrap interval of a report (a rerun is byte-identical)
BOOTSTRAP_SEED = 0


def d_by_condition(rows: pd.DataFrame, by: Sequence[str], band: float | None, n_boot: int = 1000,
                   reference: str = "reference") -> pd.DataFrame:
    """:func:`midas_nb.metrics.decoupling_D` by condition (its intervals and status where it
    gives them; NaN intervals otherwise), ``n_boot`` resamples, seed :data:`BOOTSTRAP_SEED`; cells
    are keyed by checkpoint too (``decoupling_D`` adds ``checkpoint_id``/``weights_digest``).

    Returns one row per cell (``by``) and condition with ``D_pp`` (percentage points),
    ``delta_idauc`` and their ``_lo``/``_hi`` bounds (always present), and ``status``.

    Raises:
        ValueError: as :func:`~midas_nb.metrics.decoupling_D` (missing columns, no reference row).
    """
    return decoupling_D(rows, reference=reference, band=band, by=list(by), condition_cols=("condition",),
                        n_boot=int(n_boot), ci_seed=BOOTSTRAP_SEED)


def plural(n: int, one: str, many: str) -> str:
    """``"1 cell"`` / ``"3 cells"``: ``n`` with the singular ``one`` or the plural ``many``."""
    return f"{n} {one if n == 1 else many}"


def _empty_d() -> pd.DataFrame:
    return pd.DataFrame(columns=["dataset", "backbone", "depth", "budget", "condition", "D_pp", "D_pp_lo", "D_pp_hi",
                                 "delta_idauc", "delta_idauc_lo", "delta_idauc_hi", "status"])


def ci_text(m: float, lo: float, hi: float, fmt: str = "+.2f", unit: str = "", edges: Sequence[float] = (0.0,)) -> str:
    """:func:`~midas_nb.results.format_ci`, signed with two decimals by default: ``"+1.23 pp [+0.40, +2.10]"``."""
    return format_ci(m, lo, hi, fmt, unit, edges)


def _sign_holds(m: float, lo: float, hi: float, positive: bool) -> Holds:
    """``m > 0`` (``positive``) or ``m < 0``: decided by the interval when there is one, else by
    the point value; ``"not resolved"`` when the interval contains 0."""
    if not is_finite_number(m):
        return "undefined"
    if is_finite_number(lo) and is_finite_number(hi):
        return positive if lo > 0 else (not positive) if hi < 0 else "not resolved"
    return bool(m > 0) if positive else bool(m < 0)


def _point(g: pd.DataFrame, depth: int | None, budget: float | None) -> tuple[int, float]:
    if depth is not None and budget is not None:
        return int(depth), float(budget)
    pts = g.groupby(["depth", "budget"])["condition"].nunique()
    default = (int(PAPER_SETTING["depth"]), float(PAPER_SETTING["budget"]))
    if depth is None and budget is None and default in pts.index:
        return default
    if depth is not None:
        pts = pts[pts.index.get_level_values(0) == int(depth)]
    if budget is not None:
        pts = pts[np.isclose(pts.index.get_level_values(1).astype(float), float(budget))]
    if not len(pts):
        raise ValueError(f"paper_findings: no rows at depth={depth}, budget={budget}")
    L, b = pts.idxmax()
    return int(L), float(b)


def _row_of(d: pd.DataFrame, cond: str) -> pd.Series | None:
    r = d[d["condition"] == cond]
    return None if r.empty else r.iloc[0]


def _finding(dataset: str, backbone: str, fid: str, holds: Holds, evidence: str, depth: Any, budget: Any,
             n_builds: int = 1) -> dict:
    holds = bool(holds) if isinstance(holds, (bool, np.bool_)) else holds
    return dict(dataset=dataset, backbone=backbone, depth=int(depth), budget=float(budget), finding=fid,
                statement=PAPER_FINDINGS[fid], holds=holds, evidence=evidence, n_builds=int(n_builds))


def _builds(d: pd.DataFrame) -> int:
    """The fewest backbone builds behind a cell of ``d`` (1 without the column or rows)."""
    return int(d["n_builds"].min()) if "n_builds" in d.columns and len(d) else 1


def _borrow_builds(dr: pd.DataFrame, d: pd.DataFrame) -> tuple[pd.DataFrame, str]:
    """``(dr, note)``: the regime cells of one build with the D interval of each widened by its condition's
    between-build spread measured at the point (``d``, several builds): half-width ``√(h² + (t_{B−1}·s_B)²)``,
    ``s_B`` the sd of the B builds' D (root sum of squares of independent parts, JCGM 100:2008 §5.1;
    decision 0072); ``note`` says so for the evidence (``""`` where the point has one build)."""
    at = d[(d["n_builds"] > 1) & d["D_pp_build_std"].notna()] if "D_pp_build_std" in d.columns else d.iloc[:0]
    if at.empty or "n_builds" not in dr.columns:
        return dr, ""
    from scipy.stats import t as student_t
    spread = {c: student_t.ppf(0.975, B - 1) * s
              for c, B, s in zip(at["condition"], at["n_builds"], at["D_pp_build_std"])}
    out = dr.copy()
    one = (out["n_builds"] == 1) & out["condition"].isin(spread)
    if not one.any():                                   # every cell has its own builds: nothing to borrow
        return out, ""
    extra = out.loc[one, "condition"].map(spread)
    out.loc[one, "D_pp_lo"] = out.loc[one, "D_pp"] - np.hypot(out.loc[one, "D_pp"] - out.loc[one, "D_pp_lo"], extra)
    out.loc[one, "D_pp_hi"] = out.loc[one, "D_pp"] + np.hypot(out.loc[one, "D_pp_hi"] - out.loc[one, "D_pp"], extra)
    s5 = dict(zip(at["condition"], at["D_pp_build_std"])).get("T5", math.nan)
    return out, (f"; the cells of one build borrow the build spread measured at the point (sd of D(T5) over "
                 f"{int(at['n_builds'].max())} builds {s5:.2f} pp)")


def _d_text(r: pd.Series, ceiling: float) -> str:
    """``D`` of a condition's row in pp and, where the point's IoU ceiling (a fraction) is known, as a share of it,
    as notebook 04 reads it (``D_pp / (100·ceiling)``, decision 0041): ``"+6.16 pp [+5.63, +6.69], +0.26 [+0.24,
    +0.28] of the IoU ceiling 0.237"``."""
    D = ci_text(r["D_pp"], r["D_pp_lo"], r["D_pp_hi"], unit=" pp")
    if not (is_finite_number(ceiling) and ceiling > 0):
        return D
    return D + f", {ci_text(*(r[k] / (100 * ceiling) for k in ('D_pp', 'D_pp_lo', 'D_pp_hi')))} of the IoU ceiling " \
               f"{ceiling:.3f}"


def _t5_finding(d: pd.DataFrame, band: float, ceiling: float = math.nan) -> tuple[Holds, str]:
    r = _row_of(d, "T5")
    if r is None:
        return "undefined", "no T5 rows at this point"
    status = str(r["status"])
    D = _d_text(r, ceiling)
    dI = ci_text(r["delta_idauc"], r["delta_idauc_lo"], r["delta_idauc_hi"], fmt="+.3f")
    resolves = band_resolution(r["delta_idauc_lo"], r["delta_idauc_hi"])
    ev = f"D(T5) = {D}, ΔIDAUC = {dI}, {status}" + (f" ({resolves})" if resolves else "")
    if status in ("no reference", "undefined"):
        return "undefined", ev
    if status == "uninformative":     # the band cannot speak about faithfulness parity here
        return "uninformative", ev + f" — {r.get('band_reason', 'reference not above random')}"
    gain = _sign_holds(r["D_pp"], r["D_pp_lo"], r["D_pp_hi"], positive=True)
    if status == "outside band":
        return False, ev + f" (ΔIDAUC < −{band:g})"
    if gain is False:                 # no coverage gain, whatever the band says
        return False, ev
    return ("not resolved" if status == "not resolved" else gain), ev      # gain itself may be "not resolved"


def _t1_finding(d: pd.DataFrame, ceiling: float = math.nan) -> tuple[Holds, str]:
    r = _row_of(d, "T1")
    if r is None:
        return "undefined", "no T1 rows at this point"
    if str(r["status"]) in ("no reference", "undefined"):
        return "undefined", f"D(T1) has no reference ({r['status']})"
    return _sign_holds(r["D_pp"], r["D_pp_lo"], r["D_pp_hi"], positive=False), f"D(T1) = {_d_text(r, ceiling)}"


def cosine_verdict(probes: pd.DataFrame | None, depth: int) -> tuple[Holds, str]:
    """The ``cosine_small`` finding on hidden- × attention-gradient probes (``depth``, ``hidden``,
    ``attention``, ``cosine``, ``lo``, ``hi``: :func:`midas_nb.metrics.probes.hidden_vs_attention_gradient`)
    at ``depth``: ``(holds, evidence)``, as :func:`paper_findings` decides it (notebook 03 reads it)."""
    if probes is None or probes.empty:
        return "undefined", "no cosine probes recorded for this checkpoint (notebook 03 saves them)"
    at = probes[probes["depth"].astype(int) == int(depth)]
    if at.empty:
        return "undefined", f"no cosine probes at L={depth} (have L ∈ {sorted(set(probes['depth'].astype(int)))})"
    bound = PAPER_COSINE_MAX
    top = at.loc[at["cosine"].abs().idxmax()]
    ev = (f"largest |cos|: {top['hidden']}·{top['attention']} = {ci_text(top['cosine'], top['lo'], top['hi'], '+.3f')} "
          f"of {len(at)} hidden×attention pairs at L={depth}")
    if not (at[["lo", "hi"]].notna().all().all()):
        return bool(at["cosine"].abs().max() <= bound), ev + " (no CI)"
    if bool((at[["lo", "hi"]].abs().max(axis=1) <= bound).all()):
        return True, ev
    if bool(((at["lo"] > bound) | (at["hi"] < -bound)).any()):
        return False, ev
    return "not resolved", ev + f"; an interval crosses ±{bound}"


def _axis_finding(d: pd.DataFrame, axis: str, L0: int, b0: float,
                  ceiling: Mapping[float, float] | None = None) -> tuple[Holds, str]:
    """D(T5) along one axis of the regime grid, the other held at the point ``(L0, b0)``: the cells
    at ``axis ≤`` the point's value (near) against the cells beyond it (far), in pp and, along the budget, as a
    share of the IoU ceiling (``ceiling``: ``{budget: ceiling}``), as notebook 04 reads it (:func:`share_falls`):
    a fade holds only where both fall."""
    other, v0, o0 = (("budget", L0, b0) if axis == "depth" else ("depth", b0, L0))
    t5 = d[(d["condition"] == "T5") & ~d["status"].isin(["no reference", "undefined"])
           & np.isclose(d[other].astype(float), float(o0))]
    n_uninf = int((t5["status"] == "uninformative").sum())
    t5 = t5[t5["status"] != "uninformative"]        # D at a parity that says nothing: not counted
    near = t5[t5[axis].astype(float) <= float(v0) + 1e-9]
    far = t5[t5[axis].astype(float) > float(v0) + 1e-9]
    show, beyond, fixed = (((lambda v: f"L ≤ {int(v)}"), f"L > {L0}", f"b = {b0:.0%}") if axis == "depth" else
                           ((lambda v: f"b ≤ {float(v):.0%}"), f"b > {b0:.0%}", f"L = {L0}"))
    if near.empty or far.empty:
        why = (f"the regime sweep needs T5 cells at {fixed} with {show(v0)} and with {beyond}; "
               f"have {len(near)} and {len(far)}")
        if n_uninf:
            return "uninformative", why + (f" after leaving out {plural(n_uninf, 'cell', 'cells')} whose reference is "
                                           "not above the random ranking (band uninformative)")
        return "undefined", why
    mn, mf = float(near["D_pp"].mean()), float(far["D_pp"].mean())
    ev = (f"at {fixed}: mean D(T5) {mn:+.2f} pp over {plural(len(near), 'cell', 'cells')} with {show(v0)} vs "
          f"{mf:+.2f} pp over {plural(len(far), 'cell', 'cells')} with {beyond}")
    if n_uninf:
        ev += f" ({plural(n_uninf, 'cell', 'cells')} with an uninformative band left out)"
    # a gain fades only where there is one: T5's coverage gain at parity on the near side
    lost = near["status"].isin(["outside band"]).any()
    if lost or mn <= 0:
        return False, ev + (f"; {NOTHING_TO_FADE} at {show(v0)} ("
                            + ("a cell there is outside the parity band)" if lost else "mean D(T5) ≤ 0 there)"))
    holds: Holds = bool(mn > mf)
    lo_n, hi_f = near["D_pp_lo"].mean(), far["D_pp_hi"].mean()
    hi_n, lo_f = near["D_pp_hi"].mean(), far["D_pp_lo"].mean()
    if is_finite_number(lo_n) and is_finite_number(hi_f):
        # conservative: the averaged intervals of the two groups must not overlap; both are said (a reader saw
        # the cells' own intervals apart beside "overlap": the one-build cells' borrow the build spread)
        ev += f" (averaged intervals [{lo_n:+.2f}, {hi_n:+.2f}] vs [{lo_f:+.2f}, {hi_f:+.2f}] pp"
        if (holds and lo_n <= hi_f) or (not holds and hi_n >= lo_f):
            holds = "not resolved"
            ev += ": they overlap"
        ev += ")"
    if holds is not False and ((near["status"] == "not resolved").any() or (is_finite_number(lo_n) and lo_n <= 0)):
        holds, ev = "not resolved", ev + f"; T5's coverage gain at {show(v0)} is itself not resolved"
    if axis == "depth":
        return holds, ev
    c = [(ceiling or {}).get(round(float(b), 6), math.nan) for b in t5["budget"]]
    if not all(is_finite_number(x) and x > 0 for x in c):
        return (holds if holds is False else "not resolved"), ev + ("; no IoU ceiling in the rows: a fall with the "
                                                                    "budget cannot be told from the ceiling's")
    share = t5["D_pp"].astype(float) / (100 * pd.Series(c, index=t5.index))
    sn, sf = float(share[near.index].mean()), float(share[far.index].mean())
    ev += f"; as a share of the IoU ceiling {sn:.2f} vs {sf:.2f}"
    if holds is True and not share_falls(sn, sf):   # a resolved fall in pp that the share does not repeat
        return False, ev + f" — {CEILING_FALL}, not D(T5)'s own"
    if holds == "not resolved" and not share_falls(sn, sf):   # say why it cannot come out as "holds" either
        ev += (" — the share does not fall, so even a resolved fall in pp would be the ceiling's "
               "(at best: does not hold)")
    return holds, ev


def _scale_finding(d: pd.DataFrame) -> tuple[Holds, str]:
    backbones = sorted(set(d["backbone"]))
    tiny, base = PAPER_BACKBONES[0], PAPER_BACKBONES[2]       # matched by exact timm name only
    if tiny not in backbones or base not in backbones:
        return "undefined", (f"the scale readout has {', '.join(backbones) or 'no backbone'}; the finding "
                             f"concerns DeiT-Ti/16 ({tiny}) and AugReg ViT-B/16 ({base})")
    parts, verdicts = [f"scale readout backbones: {', '.join(backbones)}"], []
    for name, bb, positive in ((f"DeiT-Ti ({tiny})", tiny, True), (f"ViT-B ({base})", base, False)):
        r = _row_of(d[d["backbone"] == bb], "T5")
        if r is None or str(r["status"]) in ("no reference", "undefined"):
            return "undefined", f"no D(T5) for {bb}"
        parts.append(f"{name}: D(T5) = {ci_text(r['D_pp'], r['D_pp_lo'], r['D_pp_hi'], unit=' pp')}, {r['status']}")
        if r["status"] == "uninformative":
            parts[-1] += f" ({r.get('band_reason', 'reference not above random')})"
            sign = _sign_holds(r["D_pp"], r["D_pp_lo"], r["D_pp_hi"], positive=False)
            # a decided D < 0 reverses whatever the band says; anything else needs the band
            verdicts.append(True if not positive and sign is True else "uninformative")
        else:  # DeiT-Ti: D > 0 in the band; ViT-B reverses: D < 0, or the gain is lost outside the band
            verdicts.append((not positive) if r["status"] == "outside band" else
                            _sign_holds(r["D_pp"], r["D_pp_lo"], r["D_pp_hi"], positive=positive))
    holds: Holds = ("uninformative" if "uninformative" in verdicts else
                    "not resolved" if "not resolved" in verdicts else all(v is True for v in verdicts))
    return holds, "; ".join(parts)


def scale_scope(backbones: Sequence[str]) -> str:
    """What a scale readout over ``backbones`` can show, in one computed sentence (notebook 05; decision 0085): one
    backbone shows its own ``D`` only; several, whether ``D(T5)`` changes among them; the paper's ``scale`` finding
    (:func:`paper_findings`) needs DeiT-Ti/16 and AugReg ViT-B/16 (:data:`~midas_nb.config.PAPER_BACKBONES`)."""
    bb, (tiny, base) = list(dict.fromkeys(map(str, backbones))), (PAPER_BACKBONES[0], PAPER_BACKBONES[2])
    paper = f"the paper's scale finding needs {tiny} and {base}, so it is undefined here"
    if len(bb) < 2:
        return (f"This run reads out {plural(len(bb), 'backbone', 'backbones')} ({', '.join(bb) or 'none'}): it shows D "
                f"on that backbone only and cannot say whether D depends on scale; {paper}.")
    return (f"This run reads out {len(bb)} backbones ({', '.join(bb)}): it can show whether D(T5) changes from one to "
            "another; " + (f"with {tiny} and {base} among them it tests the paper's scale finding."
                           if tiny in bb and base in bb else f"{paper}."))


def paper_findings(rows: pd.DataFrame, probes: pd.DataFrame | None = None, *, depth: int | None = None,
                   budget: float | None = None, band: float | None = None, n_boot: int = 1000,
                   scale_backbones: Sequence[str] | None = None) -> pd.DataFrame:
    """Which of the paper's findings (:data:`midas_nb.analysis.paper_reference.PAPER_FINDINGS`) hold on
    these result rows, per dataset × backbone; how each is decided: docs/decisions/0055-paper-findings-verdicts.md.

    The findings are evaluated at one point ``(L, b)`` — ``depth``/``budget``, default the
    paper's ``L = 6, b = 25 %`` where the rows have it, else the point with the most
    conditions — from :func:`midas_nb.metrics.decoupling_D` of the rows there (its paired
    intervals ``D_pp_lo``/``D_pp_hi`` and band ``status`` where present; the point values
    otherwise). A finding without the rows it needs is ``"undefined"`` (``cosine_small`` without
    ``probes``; ``fades_deep`` / ``fades_loose`` without regime cells on both sides of the point, or
    ``"uninformative"`` where leaving out the cells with an uninformative band empties a side; ``fades_loose``
    reads D in pp and as a share of the rows' ``iou_ceiling``, ``"not resolved"`` without it; ``t5_gain_in_band`` and
    ``t1_below_reference`` give D beside its share of the point's ``iou_ceiling`` where the rows have it).
    ``scale`` has one row per dataset, its backbone the backbones joined by ``+`` (``"uninformative"``
    where a verdict needs an uninformative band).

    Args:
        rows: result rows (:mod:`midas_nb.results` schema; several datasets and backbones allowed).
        probes: cosine probes by dataset, backbone and depth, or ``None``.
        depth, budget: the point of the per-backbone findings.
        band: the parity band of ``decoupling_D`` (``None``: :data:`~midas_nb.metrics.PARITY_BAND`).
        n_boot: bootstrap resamples of the intervals (seed :data:`BOOTSTRAP_SEED`).
        scale_backbones: the backbones of the scale readout (``None``: every backbone in the
            rows at the point); other backbones never enter the ``scale`` finding.

    Returns:
        One row per (dataset, backbone, finding): ``dataset``, ``backbone``, ``depth``,
        ``budget``, ``finding`` (id), ``statement``, ``holds`` (``True`` / ``False`` /
        ``"undefined"`` / ``"not resolved"`` / ``"uninformative"``), ``evidence`` (a short string
        with the numbers), ``n_builds`` (the fewest backbone builds behind a cell it reads; the cosine
        probes: one). Only ``True`` counts as holding. Regime cells of one build where the point has several
        borrow the point's build spread (:func:`_borrow_builds`; decision 0072).

    Raises:
        ValueError: rows without ``dataset``, ``backbone``, ``condition``, ``depth``,
            ``budget``, ``miou``, ``idauc``, or no rows at the requested point.
    """
    band = parity_band(band)
    need = ["dataset", "backbone", "condition", "depth", "budget", "miou", "idauc"]
    missing = [c for c in need if c not in rows.columns]
    if missing:
        raise ValueError(f"paper_findings: rows lack {missing}")
    out: list[dict] = []
    cell = ["dataset", "backbone", "depth", "budget"]
    for (ds, bb), g in rows.groupby(["dataset", "backbone"], sort=False):
        L0, b0 = _point(g, depth, budget)
        at = g[(g["depth"] == L0) & np.isclose(g["budget"].astype(float), b0)]
        has_ref = bool((at["condition"] == "reference").any())
        d = d_by_condition(at, cell, band, n_boot) if has_ref else _empty_d()
        c0 = float(at["iou_ceiling"].mean()) if "iou_ceiling" in at.columns else math.nan   # the point's, as 04 reads it
        for fid, fn in (("t5_gain_in_band", lambda: _t5_finding(d, band, c0)),
                        ("t1_below_reference", lambda: _t1_finding(d, c0))):
            holds, ev = fn() if has_ref else ("undefined", f"no reference rows at L={L0}, b={b0:.0%}")
            out.append(_finding(ds, bb, fid, holds, ev, L0, b0, _builds(d)))
        pr = None
        if probes is not None and len(probes):
            pr = probes[(probes["dataset"] == ds) & (probes["backbone"] == bb)]
            if "checkpoint_id" in probes.columns and "checkpoint_id" in g.columns:
                pr = pr[pr["checkpoint_id"].isin(set(g["checkpoint_id"]))]
        out.append(_finding(ds, bb, "cosine_small", *cosine_verdict(pr, L0), L0, b0))
        reg = g[g.groupby(["depth", "budget"])["condition"].transform(lambda s: (s == "reference").any())]
        dr, borrowed = _borrow_builds(d_by_condition(reg, cell, band, n_boot) if len(reg) else _empty_d(), d)
        ceiling = ({round(float(b), 6): float(c) for b, c in reg.groupby("budget")["iou_ceiling"].mean().items()}
                   if "iou_ceiling" in reg.columns else None)
        for fid, axis in (("fades_deep", "depth"), ("fades_loose", "budget")):
            holds, ev = _axis_finding(dr, axis, L0, b0, ceiling)
            out.append(_finding(ds, bb, fid, holds, ev + borrowed * (holds != "undefined"), L0, b0, _builds(dr)))
    for ds, g in rows.groupby("dataset", sort=False):
        L0, b0 = _point(g, depth, budget)
        at = g[(g["depth"] == L0) & np.isclose(g["budget"].astype(float), b0)]
        if scale_backbones is not None:
            at = at[at["backbone"].isin(list(scale_backbones))]
        bbs = "+".join(sorted(set(at["backbone"])))
        at = at[at.groupby("backbone")["condition"].transform(lambda s: (s == "reference").any())]
        d = d_by_condition(at, cell, band, n_boot) if len(at) else _empty_d()
        out.append(_finding(ds, bbs, "scale", *_scale_finding(d), L0, b0, _builds(d)))
    return pd.DataFrame(out, columns=["dataset", "backbone", "depth", "budget", "finding", "statement", "holds",
                                      "evidence", "n_builds"])


def findings_paragraph(findings: pd.DataFrame, dataset: str | None = None, backbone: str | None = None) -> str:
    """One paragraph, computed from :func:`paper_findings` output: which of the paper's
    findings hold on this run, which do not, which are not resolved, which are uninformative and
    which are undefined
    (for one dataset × backbone; the ``scale`` row of that dataset is included)."""
    f = findings
    if dataset is not None:
        f = f[f["dataset"] == dataset]
    if backbone is not None:
        f = f[(f["backbone"] == backbone) | (f["finding"] == "scale")]
    if f.empty:
        return "No finding could be evaluated."
    groups: dict[str, list[str]] = {k: [] for k in ("hold", "are opposite of the paper", "do not hold",
                                                   "are not resolved", "are uninformative", "are not counted",
                                                   "are undefined")}
    for _, r in f.iterrows():
        v = finding_verdict(r["finding"], r["holds"], str(r["evidence"]))
        key = {"holds": "hold", "does not hold": "do not hold"}.get(v, f"are {v}")
        groups[key if key in groups else "are undefined"].append(f"{r['statement']} ({r['evidence']})")
    first = f.iloc[0]
    n = {k: len(v) for k, v in groups.items()}
    be = lambda k: f"{n[k]} {'is' if n[k] == 1 else 'are'}{k[3:]}"  # noqa: E731  ("are not resolved": "2 are …")
    scope = "" if (f["finding"] == "scale").any() else " on one backbone (the one across backbones: the scale readout)"
    head = (f"On {first['dataset']} with {backbone or first['backbone']} at L={int(first['depth'])}, "
            f"b={float(first['budget']):.0%}, {n['hold']} of the paper's {len(f)} findings{scope} "
            f"{'holds' if n['hold'] == 1 else 'hold'}, "
            + (f"{be('are opposite of the paper')}, " if n["are opposite of the paper"] else "")
            + f"{n['do not hold']} {'does' if n['do not hold'] == 1 else 'do'} not, {be('are not resolved')}"
            + (f", {be('are uninformative')} (the reference is not above the random ranking)"
               if n["are uninformative"] else "")
            + (f", {be('are not counted')} (the backbone has not learned the task)" if n["are not counted"] else "")
            + f" and {be('are undefined')} on this run.")
    parts = [head]
    for k, items in groups.items():
        if items:
            one = {"hold": "holds", "do not hold": "does not hold"}.get(k, f"is{k[3:]}")
            parts.append((f"This {one}: " if len(items) == 1 else f"These {k}: ") + "; ".join(items) + ".")
    return " ".join(parts)
