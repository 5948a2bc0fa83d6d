"""The reader's take-away in one place (decision 0073): the paper's claims beside this run's, one row each
(:func:`claims_table`), whether a scorer's gain comes from its target's content or from the training signal
(:func:`content_vs_signal`), and the short "what this run shows" box every notebook ends with (:func:`box`).

Every row is read from a computed verdict — :func:`midas_nb.analysis.findings.paper_findings`,
:func:`midas_nb.analysis.claim_verdict` — never computed a second time here.
"""
from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pandas as pd

from .findings import (finding_verdict, backbone_fitness, ci_text, cosine_verdict, count_fitness,
                       paper_findings)
from .paper_reference import PAPER_COSINE_MAX, paper_status, paper_value
from ..metrics import is_finite_number, parity_band
from ..metrics.stats import LEAD_DIGITS, interval_sign as _sign
from .verdict import CONTROL_CONDITION, ClaimVerdict, lead_resolved, paired_gap

__all__ = ["CLAIM_BOXES", "CLAIM_VERDICTS", "box", "claims_markdown", "claims_table", "collapsed_scorers",
           "content_vs_signal", "cosine_depths", "cosine_scope", "headline", "leak_test", "probe_claims",
           "advice_lines", "content_from_d", "pib_trade", "run_claims"]

#: the words of the verdict column, in the order a headline counts them
CLAIM_VERDICTS = ("holds", "opposite of the paper", "does not hold", "not resolved", "uninformative", "not counted",
                  "undefined")

#: the claim of :func:`content_vs_signal` (``content["how"]`` follows it where another test decided it)
CONTENT_CLAIM = "T5's content explains its scorer's gain"

#: finding id -> (claim, what the paper reports, the claim's short name in a headline); the T5 and T1 values are
#: the dataset's (DESIGN.md §8)
_FINDING_CLAIMS = {
    "t5_gain_in_band": ("T5 gains coverage at faithfulness parity", "D(T5) > 0, in band", "T5 parity"),
    "t1_below_reference": ("T1 covers less than the reference", "D(T1) < 0", "T1"),
    "cosine_small": ("hidden- and attention-gradient rankings unrelated", f"|cos| ≤ {PAPER_COSINE_MAX}", "cosines"),
    # what D(T5) does along an axis, in pp (and as a share of the IoU ceiling along the budget): the paper reads its
    # fall as the decoupling fading, which needs a decoupling to fade (02's verdict; decision 0079)
    "fades_deep": ("D(T5) falls with depth",
                   "the decoupling fades: D(T5) smaller at L ∈ {9, 11} than at L ∈ {3, 6}", "depth"),
    "fades_loose": ("D(T5) falls with the budget (pp and share of the IoU ceiling)",
                    "the decoupling fades: D(T5) smaller at b ≥ 50 % than at b ≤ 25 %", "budget"),
    "scale": ("reproduces on DeiT-Ti, reverses on ViT-B", "D(T5) > 0 on DeiT-Ti, lost on ViT-B", "scale"),
}


def _paper(fid: str, dataset: str) -> str:
    """What the paper reports for a finding, with its number on ``dataset`` where it gives one."""
    text = _FINDING_CLAIMS[fid][1]
    cond = {"t5_gain_in_band": "T5", "t1_below_reference": "T1"}.get(fid)
    v = paper_value(cond, dataset) if cond else None
    return text if v is None else f"D({cond}) = {v:+.2f} pp" + (f", {paper_status(cond, dataset)}"
                                                              if paper_status(cond, dataset) else "")


def _pp(m_lo_hi: Sequence[float], lead: bool = False) -> str:
    """A difference of mIoU fractions ``(m, lo, hi)`` in percentage points, as ``D`` is printed (a ``lead`` between two
    scorers: at 0.1 pp, the precision :func:`~midas_nb.analysis.verdict.lead_resolved` decides it at, as printed)."""
    return ci_text(*(100 * float(x) for x in m_lo_hi), "+.1f" if lead else "+.2f", " pp", () if lead else (0.0,))


def content_vs_signal(vs_targets: pd.DataFrame, table: pd.DataFrame, *, focus: str = "T5",
                      control: str = CONTROL_CONDITION, n_boot: int = 1000, seed: int = 0) -> dict[str, Any]:
    """Whether ``focus``'s scorer gains coverage from its target's **content** or from being trained on any
    structured map (the training signal of ``L_ga``; DESIGN.md §5), three comparisons (the first two paired):

    1. the ``focus`` scorer against the ``control`` (``gain_over_control`` of :func:`targets_vs_scorers`);
    2. the ``focus`` scorer against every other target's scorer (:func:`paired_gap` on mIoU, seeds × images);
    3. the ``focus`` target's own top-k coverage against the control scorer's (``target_miou`` interval
       against ``control_miou``).

    Args:
        vs_targets: :func:`midas_nb.analysis.targets_vs_scorers` frame.
        table: the protocol rows of its cell (per-image mIoU).
        focus, control: the target whose content the paper credits; the random-map control.
        n_boot, seed: bootstrap resamples and seed of the paired intervals.

    Returns:
        ``reading``: ``"T5 specifically"`` (above the control *and* resolvably above every other target's
        scorer), ``"any structured target"`` (above the control, but another target's scorer, itself above
        the control, ties with it or beats it), ``"not resolved"`` (the gain over the control, or the
        comparison with the other targets, is not resolved), ``"no gain over the control"`` or
        ``"undefined"`` (no control or no ``focus`` scorer) — ``T5`` is ``focus``'s name; ``sentence``
        (the sentence the run supports, numbers included); ``gain`` ``(m, lo, hi)``; ``vs_others``
        ``{target: (m, lo, hi)}``; ``ties``; ``own_vs_control`` (``"above"``, ``"not above"``).

    Raises:
        KeyError: ``vs_targets`` lacks the columns of :func:`targets_vs_scorers`.
    """
    row = vs_targets[vs_targets["target"] == focus] if len(vs_targets) else vs_targets
    out: dict[str, Any] = {"reading": "undefined", "gain": (np.nan,) * 3, "vs_others": {}, "ties": [],
                           "own_vs_control": "undefined"}
    if row.empty or not is_finite_number(row["gain_over_control_lo"].iloc[0]):
        out["sentence"] = (f"Target content against training signal: this run has no {control} control or no "
                           f"{focus} scorer, so it cannot say whether {focus}'s content explains its scorer's gain.")
        return out
    r = row.iloc[0]
    out["gain"] = g = (r["gain_over_control"], r["gain_over_control_lo"], r["gain_over_control_hi"])
    own_above = r["target_miou_lo"] > r["control_miou"]
    out["own_vs_control"] = "above" if own_above else "not above"
    head = (f"Target content against training signal (mIoU as a fraction, differences in pp as D): the {focus} "
            f"scorer covers {r['scorer_miou']:.3f}, the {control} control {r['control_miou']:.3f} (gain {_pp(g)}); "
            f"{focus}'s own top-k covers "
            f"{ci_text(*r[['target_miou', 'target_miou_lo', 'target_miou_hi']], '.3f', edges=(r['control_miou'],))}, "
            + ("resolvably more than the control" if own_above else "not resolvably more than the control"))
    sign = _sign(g[1], g[2])
    if sign != "positive":
        out["reading"] = "not resolved" if sign == "not resolved" else "no gain over the control"
        out["sentence"] = head + f" → {out['reading']}: this run cannot credit {focus}'s gain to its content."
        return out
    above = set(vs_targets.loc[vs_targets["reading"] == "above the control", "target"])
    mine = table[table["condition"] == focus]
    for i, other in enumerate(t for t in vs_targets["target"] if t != focus):
        m, lo, hi, _ = paired_gap(mine, table[table["condition"] == other], "miou", n_boot=n_boot, seed=seed + i)
        out["vs_others"][other] = (m, lo, hi)
        out["ties"] += [] if lead_resolved(lo, hi) else [other]
    out["ties_above"] = ties_above = [t for t in out["ties"] if t in above]
    key = ("not resolved" if not out["vs_others"] else "specifically" if not out["ties"] else
           "any structured target" if ties_above else "not resolved")
    out["reading"] = f"{focus} specifically" if key == "specifically" else key
    said = "; ".join(f"{focus} − {t} {_pp(v, lead=True)}" for t, v in out["vs_others"].items())
    out["sentence"] = head + (f"; against the other targets' scorers: {said}" if said else
                              "; no other target's scorer to compare with") + f" → {out['reading']}" + {
        "specifically": f": {focus}'s content adds coverage that the other targets' do not.",
        "any structured target": f": distilling any structured map helps ({', '.join(ties_above)}: resolvably above "
                                 f"the control, not resolvably below {focus}; a tie not above the control does not "
                                 f"count); this run does not credit {focus}'s content.",
        "not resolved": f": this run cannot tell {focus}'s content from any target's."}[key]
    return out


#: conditions of a three-condition table that distil no supervision target (or are scorer families of their own)
_NOT_TARGETS = ("reference", "unsupervised", "random", CONTROL_CONDITION, "cropr", "iared")


def content_from_d(three: pd.DataFrame, focus: str = "T5", control: str = CONTROL_CONDITION) -> dict[str, Any]:
    """:func:`content_vs_signal` read from a report's three-condition table, which keeps ``D`` and
    ``D_vs_<control>_pp`` with their intervals but no per-image values: ``focus`` is credited
    ("T5 specifically") only where its ``D`` interval lies above every other target's (unpaired, so
    stricter than the paired test), "any structured target" where it is above the control and another
    target's ``D`` interval, itself above the control, overlaps it."""
    col = f"D_vs_{control}_pp"
    t = three.set_index("condition") if col in three.columns else pd.DataFrame()
    if focus not in t.index or not is_finite_number(t.loc[focus, f"{col}_lo"]):
        return {"reading": "undefined"}
    g = _sign(t.loc[focus, f"{col}_lo"], t.loc[focus, f"{col}_hi"])
    above = [c for c in t.index if c not in _NOT_TARGETS and c != focus and is_finite_number(t.loc[c, f"{col}_lo"])
             and t.loc[c, f"{col}_lo"] > 0]
    ties = [c for c in above if t.loc[c, "D_pp_hi"] >= t.loc[focus, "D_pp_lo"]]
    others = [c for c in t.index if c not in _NOT_TARGETS and c != focus]
    reading = ("no gain over the control" if g == "negative" else "not resolved" if g != "positive" or not others
               else "any structured target" if ties else f"{focus} specifically"
               if all(t.loc[c, "D_pp_hi"] < t.loc[focus, "D_pp_lo"] for c in others) else "not resolved")
    return {"reading": reading + (f" (D within {', '.join(ties)}'s)" if ties else ""),
            "how": " (from the D intervals, unpaired)"}


def collapsed_scorers(table: pd.DataFrame, n_boot: int = 1000, band: float | None = None) -> str:
    """The trained scorers of a protocol table that collapsed, counted and named per condition (decision 0088):
    a scorer of one build and seed has collapsed where its IDAUC is resolvably at or below the random keep's of
    the same build on the same images — the upper end of :func:`paired_gap`'s interval of ``IDAUC − IDAUC(random)``
    below the parity ``band`` (:data:`~midas_nb.metrics.PARITY_BAND`): its ranking carries no more of the
    classifier's evidence than a random one. Their rows stay in every interval. ``""`` without trained scorers;
    ``reference`` and ``random`` are not trained and ``random_map`` (the training-signal control, trained to rank
    like a random map) is expected at random's: none is judged; a table without ``build`` is build 0."""
    t = table.assign(build=table["build"] if "build" in table.columns else 0)
    trained, rand = t[~t["condition"].isin(["reference", "random", "random_map"])], t[t["condition"] == "random"]
    if rand.empty or trained.empty:
        return "Collapsed scorers: no random rows to judge them against." if len(trained) else ""
    out = []
    for cond, g in trained.groupby("condition", sort=False):
        bad = []
        for i, ((b, s), r) in enumerate(g.groupby(["build", "seed"])):
            m, lo, hi, n = paired_gap(r, rand[rand["build"] == b], "idauc", n_boot=n_boot, seed=i)
            if is_finite_number(hi) and hi < parity_band(band):
                gap = ci_text(m, lo, hi, "+.3f", edges=(0, parity_band(band)))
                bad.append(f"build {b} seed {s} (IDAUC − random's {gap} on {n} images)")
        if bad:
            n = g.groupby(["build", "seed"]).ngroups
            out.append(f"{len(bad)} of {n} {cond} scorer{'s' * (n > 1)} collapsed: " + ", ".join(bad))
    return ("Collapsed scorers (no more faithful than the random keep: IDAUC − random's on the same images "
            f"resolvably below +{parity_band(band):g}, the parity band; their rows stay in every interval): "
            + ("; ".join(out) if out else f"none of the {trained.groupby(['condition', 'build', 'seed']).ngroups}")
            + ".")


def _winners_row(v: ClaimVerdict) -> list[str]:
    w, r = v.winners, v.winners.get("reading", "undefined")
    verdict = ("holds" if r == "different winners" else "opposite of the paper" if r == "one condition leads both"
               else "undefined" if r == "undefined" else "not resolved")
    return ["two different winners", "coverage-first ≠ faithfulness-first",
            f"coverage {w.get('coverage_winner')}, faithfulness {w.get('faithfulness_winner')}: {r}", verdict]


def _comovement_row(v: ClaimVerdict) -> list[str]:
    co, wo = v.comovement, v.comovement.get("without_controls") or {}
    run = (f"r = {ci_text(co['r'], co['r_lo'], co['r_hi'])} over {co['n_conditions']} conditions "
           f"({co.get('resampled', 'images and seeds resampled')})") + (
        f"; without {', '.join(wo['left_out'])}: r = {ci_text(wo['r'], wo['r_lo'], wo['r_hi'])}" if wo else "")
    verdict = {"trade off": "holds", "move together": "opposite of the paper", "not resolved": "not resolved"}.get(
        co["reading"], "undefined")
    if co.get("rests_on_controls"):
        verdict = "not resolved without the controls"
    return ["coverage and faithfulness decouple", "not rising together", run, verdict]


def claims_table(findings: pd.DataFrame | None = None, verdict: ClaimVerdict | None = None,
                 content: Mapping[str, Any] | None = None, *, dataset: str | None = None, backbone: str | None = None,
                 keep_undefined: bool = False, fitness: tuple[bool, str] | None = None) -> pd.DataFrame:
    """One row per claim of the paper: ``claim | paper | this run | verdict``.

    Args:
        findings: :func:`midas_nb.analysis.findings.paper_findings` rows of one dataset × backbone (and
            its ``scale`` row), or ``None``.
        verdict: :func:`midas_nb.analysis.claim_verdict` of the paper's cell: the two winners and the
            co-movement rows (and T5's parity where ``findings`` has none).
        content: :func:`content_vs_signal`: the row "T5's content explains its gain".
        dataset: whose paper values to show (default: the findings' dataset).
        backbone: keep only this backbone's findings (and the ``scale`` row).
        keep_undefined: keep the findings these rows cannot test (e.g. the regime findings without a sweep).
        fitness: the backbone's ``(fit, text)`` (:func:`~midas_nb.analysis.findings.fitness_over_builds`): where it
            is not fit, every verdict is "not counted" and its evidence starts with the reason (the text before its
            first parenthesis: the numbers are for the box; the report's rule, by
            :func:`~midas_nb.analysis.findings.count_fitness`; decision 0070).

    Returns:
        Columns ``claim``, ``paper``, ``this run``, ``verdict`` (one of :data:`CLAIM_VERDICTS`, or
        ``"not resolved without the controls"``).
    """
    rows: list[list[str]] = []
    f = findings if findings is not None else pd.DataFrame(columns=["finding", "holds", "evidence", "dataset"])
    if backbone is not None:
        f = f[(f["backbone"] == backbone) | (f["finding"] == "scale")]
    ds = dataset or (str(f["dataset"].iloc[0]) if len(f) else "")
    for _, r in f.iterrows():
        if r["finding"] in _FINDING_CLAIMS and (keep_undefined or str(r["holds"]) != "undefined"):
            rows.append([_FINDING_CLAIMS[r["finding"]][0], _paper(r["finding"], ds), str(r["evidence"]),
                         finding_verdict(r["finding"], r["holds"], str(r["evidence"]))])
    if verdict is not None:
        c = verdict.conditions.set_index("condition")
        if "t5_gain_in_band" not in set(f["finding"]) and "T5" in c.index:
            t = c.loc["T5"]
            gain = _sign(t["D_pp_lo"], t["D_pp_hi"])
            rows.insert(0, [_FINDING_CLAIMS["t5_gain_in_band"][0], _paper("t5_gain_in_band", ds),
                            f"D(T5) = {ci_text(t['D_pp'], t['D_pp_lo'], t['D_pp_hi'], unit=' pp')}, {t['status']}",
                            "holds" if t["reading"] == "coverage up at parity" else "opposite of the paper"
                            if gain == "negative" else "not resolved" if gain == "not resolved" else "does not hold"])
        rows += [_winners_row(verdict), _comovement_row(verdict)]
    if content is not None:
        g = content.get("gain", (np.nan,) * 3)
        run = str(content.get("reading", "undefined"))
        if is_finite_number(g[0]):  # the gain, and the other targets' scorers that gain as much (its reading's reason)
            shared = "; ".join(f"T5 − {t} {_pp(content['vs_others'][t], lead=True)}"
                               for t in content.get("ties_above", []))
            run = (f"scorer − random-map control {_pp(g)}" + (f", but other targets' scorers gain as well and T5's "
                   f"does not resolvably beat them ({shared})" if shared else "") + f": {run}")
        rows.append([CONTENT_CLAIM + str(content.get("how", "")), "credited to T5's content", run,
                     "holds" if str(content.get("reading")).endswith("specifically") else
                     {"undefined": "undefined", "not resolved": "not resolved"}.get(content.get("reading"),
                                                                                    "does not hold")])
    out = pd.DataFrame(rows, columns=["claim", "paper", "this run", "verdict"])
    if fitness is None:
        return out
    short = (fitness[0], str(fitness[1]).split(" (")[0])    # the reason; its numbers stand once, in the box
    keyed = count_fitness(out.assign(dataset="", backbone=""), {("", ""): short}, "verdict", "this run")
    return keyed[list(out.columns)]


def run_claims(rows: pd.DataFrame, verdict: ClaimVerdict | None = None, content: Mapping[str, Any] | None = None,
               *, depth: int | None = None, budget: float | None = None, n_boot: int = 1000,
               fitness: tuple[bool, str] | None = None, sweep: pd.DataFrame | None = None) -> pd.DataFrame:
    """:func:`claims_table` of :func:`~midas_nb.analysis.findings.paper_findings` on ``rows`` (one dataset ×
    backbone; a protocol table, or a regime sweep for the depth and budget findings) at ``(depth, budget)``
    (default: the rows' first), with the verdict's and the content rows; ``fitness``: as :func:`claims_table`'s.
    ``sweep``: the regime sweep the depth and budget findings are read from (07: the point's findings from the
    protocol table as 02 reads them, the regime's from the sweep as 04 reads them; decision 0090).

    Raises:
        ValueError: as :func:`~midas_nb.analysis.findings.paper_findings`.
    """
    depth = int(rows["depth"].iloc[0]) if depth is None else int(depth)
    budget = float(rows["budget"].iloc[0]) if budget is None else float(budget)
    regime = ["fades_deep", "fades_loose"]
    f = paper_findings(rows, depth=depth, budget=budget, n_boot=n_boot)
    if sweep is not None and len(sweep):
        swept = paper_findings(sweep, depth=depth, budget=budget, n_boot=n_boot)
        f, rows = pd.concat([f[~f["finding"].isin(regime)], swept[swept["finding"].isin(regime)]]), sweep
    if len(rows[["depth", "budget"]].drop_duplicates()) < 2:          # one cell: no regime to judge
        f = f[~f["finding"].isin(regime)]
    return claims_table(f, verdict, content, fitness=fitness)


def probe_claims(probes: pd.DataFrame, depth: int, dataset: str = "") -> pd.DataFrame:
    """:func:`claims_table` of the ``cosine_small`` finding on one depth's hidden- × attention-gradient
    probes (a probe table without ``depth`` is read as that depth's)."""
    holds, ev = cosine_verdict(probes.assign(depth=probes["depth"].fillna(depth)) if "depth" in probes
                               else probes.assign(depth=depth), depth)
    return claims_table(pd.DataFrame([dict(finding="cosine_small", holds=holds, evidence=ev, dataset=dataset)]))


def cosine_scope(probes: pd.DataFrame, depth: int, pair: tuple[str, str] = ("T5", "T3")) -> str:
    """What the cosine claim is about, in one computed sentence: every hidden- × attention-gradient pair of
    ``probes`` (:func:`midas_nb.metrics.probes.hidden_vs_attention_gradient`, one depth) within
    ±:data:`~midas_nb.analysis.paper_reference.PAPER_COSINE_MAX`, so the pair that decides it is the one with
    the largest ``|cos|`` (the quantity :func:`probe_claims` reads); ``pair`` (the paper's example) is one of
    them, printed beside it."""
    if probes is None or probes.empty:
        return "Cosine claim: no hidden- × attention-gradient probes in this run."
    top = probes.loc[probes["cosine"].abs().idxmax()]
    p = probes[(probes["hidden"] == pair[0]) & (probes["attention"] == pair[1])]
    pairs = ", ".join(f"{h}·{a}" for h, a in zip(probes["hidden"], probes["attention"]))
    # T4 reads attention too: why its pairs count (DESIGN.md §4: E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂)
    t4 = ("; T4 is hidden-gradient: the hidden-state gradient weighted by CLS attention"
          if "T4" in set(probes["hidden"]) else "")
    return (f"Cosine claim: every hidden- × attention-gradient pair at L = {depth} ({pairs}{t4}) within "
            f"±{PAPER_COSINE_MAX} (the paper, DeiT-S/16), so the largest |cos| decides it: {_pair(top)}"
            + (f"; the pair the paper names is one of them: {_pair(p.iloc[0])}." if len(p) else "."))


def _pair(r: pd.Series) -> str:
    return f"{r['hidden']}·{r['attention']} = {ci_text(r['cosine'], r['lo'], r['hi'], '+.3f')}"


def cosine_depths(probes: pd.DataFrame) -> str:
    """The cosine claim at each depth of ``probes`` (:func:`midas_nb.metrics.probes.hidden_vs_attention_gradient`
    over depths), in one computed sentence: the verdict of :func:`~midas_nb.analysis.findings.cosine_verdict`
    per depth with the pairs whose whole interval lies beyond
    ±:data:`~midas_nb.analysis.paper_reference.PAPER_COSINE_MAX`, then the pairs whose whole interval lies
    below 0 (reversed rankings: related, not independent)."""
    if probes is None or probes.empty or probes["depth"].isna().all():
        return "Across depths: no probes at several depths."
    words, parts = {True: "holds", False: "does not hold"}, []
    for L in sorted(set(probes["depth"].dropna().astype(int))):
        at = probes[probes["depth"] == L]
        holds, _ = cosine_verdict(at, L)
        beyond = at[(at["lo"] > PAPER_COSINE_MAX) | (at["hi"] < -PAPER_COSINE_MAX)]
        parts.append(f"L = {L} {words.get(holds, holds)}" + (f" (beyond ±{PAPER_COSINE_MAX}: "
                     + ", ".join(_pair(r) for _, r in beyond.iterrows()) + ")" if len(beyond) else ""))
    neg = probes[probes["hi"] < 0]
    return ("Across depths, the cosine claim read at each depth as the box reads it: " + "; ".join(parts) + "."
            + (" Reversed rankings (the whole interval below 0: what one ranks first the other ranks late, a "
               "relation, not independence): "
               + ", ".join(f"{_pair(r)} at L = {int(r['depth'])}" for _, r in neg.iterrows()) + "."
               if len(neg) else ""))


def _builds_seeds(r: pd.Series) -> str:
    """``"1 build × 1 seed"`` of a :func:`~midas_nb.metrics.decoupling_D` row (its ``n_builds`` and ``n_seeds``,
    the rows over all builds), ``""`` where it lacks them."""
    if not (is_finite_number(r.get("n_builds")) and is_finite_number(r.get("n_seeds"))):
        return ""
    b, k = int(r["n_builds"]), int(r["n_seeds"]) // max(1, int(r["n_builds"]))
    return f"{b} build{'s' if b != 1 else ''} × {k} seed{'s' if k != 1 else ''}"


def leak_test(st: pd.DataFrame, soft: pd.DataFrame, falsifier: str = "unsupervised", focus: str = "T5",
              builds: pd.DataFrame | None = None) -> str:
    """The straight-through leak test of notebook 02, concluded: under ``st`` ``L_cls`` reaches the scorer
    through kept tokens only, an input×gradient (T5-like) signal; if the ``falsifier``'s ``D`` under
    ``st`` lies resolvably above its ``D`` under ``soft`` (their intervals apart), the straight-through
    path leaked that signal into the "unsupervised" condition.

    Args:
        st, soft: :func:`midas_nb.metrics.decoupling_D` of the same builds and seeds under each relaxation; where
            their ``n_builds`` / ``n_seeds`` say otherwise, the text says that it compares unlike samples.
        builds: ``decoupling_D`` under ``st`` over every build (its ``D_pp_by_build``): a verdict drawn on fewer
            builds says it is theirs and gives the falsifier's D on each build, since the run cannot say whether the
            other builds leak (their soft rows were not trained).
    """
    s, o = st.set_index("condition"), soft.set_index("condition")
    if falsifier not in s.index or falsifier not in o.index:
        return f"Straight-through leak test: no {falsifier} row under both relaxations — not tested."
    a, b = s.loc[falsifier], o.loc[falsifier]
    n = [_builds_seeds(r) for r in (a, b)]
    said = (f"D({falsifier}) = {ci_text(a['D_pp'], a['D_pp_lo'], a['D_pp_hi'], unit=' pp')} under st, "
            f"{ci_text(b['D_pp'], b['D_pp_lo'], b['D_pp_hi'], unit=' pp')} under soft"
            + ("" if not n[0] else f", each on {n[0]}" if n[0] == n[1] else
               f" — unlike samples: st on {n[0]}, soft on {n[1] or 'an unstated sample'}"))
    if focus in s.index and focus in o.index:
        said += f" (D({focus}): {s.loc[focus, 'D_pp']:+.2f} and {o.loc[focus, 'D_pp']:+.2f} pp)"
    if not all(is_finite_number(x) for x in (a["D_pp_lo"], a["D_pp_hi"], b["D_pp_lo"], b["D_pp_hi"])):
        return f"Straight-through leak test: {said} — no intervals, not resolved."
    whole = builds.set_index("condition").loc[falsifier] if builds is not None and falsifier in set(
        builds["condition"]) else None
    fewer = whole is not None and is_finite_number(whole.get("n_builds")) and int(whole["n_builds"]) > (
        int(a["n_builds"]) if is_finite_number(a.get("n_builds")) else 1)
    scope = ("" if not fewer else f" on {n[0] or 'these rows'} only (D({falsifier}) under st by build: "
             f"{whole['D_pp_by_build']} pp; the other builds have no soft rows)")
    if a["D_pp_lo"] > b["D_pp_hi"]:
        return (f"Straight-through leak test: {said} → a leak{scope}: the straight-through path gives the "
                f"{falsifier} scorer a {focus}-like signal, so D({focus}) − D({falsifier}) under st understates "
                "what supervision adds.")
    return (f"Straight-through leak test: {said} → "
            + (f"no leak{scope}: the falsifier covers no more under st than under soft." if a["D_pp_hi"] < b["D_pp_lo"]
               else "not resolved: the intervals overlap, this run cannot say whether st leaks."))


#: a claim's short name in a headline (every box, the report and the HTML index say which claims they count), in
#: the order of the paper's claims: the findings, then the two winners, the co-movement and T5's content
_SHORT = {**{c.split(" (")[0]: short for c, _, short in _FINDING_CLAIMS.values()}, "two different winners": "winners",
          "coverage and faithfulness decouple": "co-movement", CONTENT_CLAIM: "T5's content"}

#: which notebook's box counts each of the paper's nine claims (decision 0090): 02, 03, 04 and 05 partition them, and
#: 07 counts 02's and 04's (the claims its protocol table and regime sweep decide), so its tally is theirs added up
CLAIM_BOXES = {"02": ("T5 parity", "T1", "winners", "co-movement", "T5's content"), "03": ("cosines",),
               "04": ("depth", "budget"), "05": ("scale",), "07": ("02", "04")}


def _short(claim: Any) -> str:
    return _SHORT.get(str(claim).split(" (")[0], str(claim))


def _owned(notebook: str) -> tuple[str, ...]:
    """The boxes whose claims ``notebook``'s box counts (07: 02's and 04's); ``ValueError`` for another notebook."""
    if notebook not in CLAIM_BOXES:
        raise ValueError(f"no claims box for notebook {notebook!r}; expected one of {', '.join(CLAIM_BOXES)}")
    return CLAIM_BOXES["07"] if notebook == "07" else (notebook,)


def headline(claims: pd.DataFrame, shown: bool | None = None, notebook: str | None = None) -> str:
    """One short line: whether the run shows the decoupling (``shown``, :attr:`ClaimVerdict.decoupling_shown`;
    ``None``: not tested here), how many of the paper's claims (:data:`_SHORT`) the table holds, named, and which
    it leaves to another box, then how many hold, are the opposite of the paper, are not resolved. A ``notebook``'s
    headline names its claims by the box that counts them and the others by theirs (:data:`CLAIM_BOXES`), so the
    tallies of the notebooks add up (decision 0090). A claim two tables share is computed from the same rows by the
    same function in both (decision 0079)."""
    if len(claims) and claims["verdict"].eq("not counted").all():
        shown = None            # a backbone that has not learned its task shows nothing either way (decision 0070)
    n = claims["verdict"].map(lambda v: "not resolved" if str(v).startswith("not resolved") else v).value_counts()
    plural = {"holds": "hold", "does not hold": "do not hold"}
    counts = ", ".join(f"{n[v]} {v if n[v] == 1 else plural.get(v, v)}" for v in CLAIM_VERDICTS if n.get(v, 0))
    lead = {True: "This run shows the decoupling — ", False: "This run does not show a decoupling — ", None: ""}[shown]
    names = [_short(c) for c in claims["claim"]]
    rest = [c for c in dict.fromkeys(_SHORT.values()) if c not in names]
    scope = ("none of the paper's claims" if not names else f"all {len(names)} of the paper's claims" if not rest
             else f"{len(names)} of the paper's {len(set(_SHORT.values()))} claims")
    if notebook is None:
        said = "; ".join(x for x in (", ".join(names), f"not in this table: {', '.join(rest)}" if rest and names
                                     else "") if x)
    else:
        mine = _owned(notebook)
        untested = [c for b in mine for c in CLAIM_BOXES[b] if c not in names]
        said = "; ".join([f"{b}'s: {', '.join(c for c in CLAIM_BOXES[b] if c in names)}" for b in mine
                          if set(CLAIM_BOXES[b]) & set(names)]
                         + ([f"not tested here: {', '.join(untested)}"] if untested else [])
                         + ["the others counted in " + ", ".join(f"{b} ({', '.join(c)})" for b, c in CLAIM_BOXES.items()
                                                                 if b not in mine and b != "07")])
        scope = scope.replace("none of the paper's claims", f"0 of the paper's {len(set(_SHORT.values()))} claims")
    return f"{lead}{scope}" + (f" ({said})" if said else "") + f": {counts or 'none tested'}."


def claims_markdown(claims: pd.DataFrame) -> str:
    """The claims table as a Markdown table (``|`` in a cell escaped)."""
    cells = [list(claims.columns)] + claims.astype(str).values.tolist()
    lines = ["| " + " | ".join(str(c).replace("|", "\\|") for c in row) + " |" for row in cells]
    return "\n".join(lines[:1] + ["|" + "---|" * len(claims.columns)] + lines[1:])


def box(lines: Sequence[str], claims: pd.DataFrame | None = None, shown: bool | None = None,
        notebook: str | None = None) -> str:
    """The "what this run shows" box a notebook ends with: the :func:`headline` and the claims table where
    ``claims`` is given (a ``notebook``'s: only the rows of the claims its box counts, :data:`CLAIM_BOXES`), then
    ``lines`` (computed sentences), each on its own line."""
    out = ["═" * 8 + " What this run shows (computed from its results) " + "═" * 8]
    if claims is not None:
        if notebook is not None:
            mine = {c for b in _owned(notebook) for c in CLAIM_BOXES[b]}
            claims = claims[claims["claim"].map(_short).isin(mine)]
        out += [headline(claims, shown, notebook), claims_markdown(claims)]
    return "\n".join(out + [f"• {s}" for s in lines if s])


def pib_trade(pib: pd.DataFrame, chance: float | None = None, majority: float | None = None) -> list[str]:
    """Each fine-tuned backbone's Point-in-Box gain over the backbone *with* its top-1 accuracy beside the
    backbone's (a localisation gain bought with accuracy is named as such). Given the test split's ``chance`` and
    ``majority`` shares, a fine-tune of a fit backbone that fails the fitness rule with the backbone as its teacher
    (:func:`~midas_nb.analysis.findings.backbone_fitness`, decision 0070: e.g. near chance) is said not to have
    trained here: its Point-in-Box change is not its method's.

    Args:
        pib: :func:`midas_nb.analysis.last.pib_table` (``model``, ``reference``, ``pib_delta`` with CI,
            ``accuracy``, ``n_images``).
    """
    if pib is None or pib.empty:
        return []
    p = pib.set_index("model")
    ref = str(p["reference"].iloc[0])
    a0 = float(p.loc[ref, "accuracy"])
    out = []
    for m, r in p.drop(index=ref).iterrows():
        da, acc = float(r["accuracy"]) - a0, float(r["accuracy"])
        n, maj = int(r.get("n_images", 0) or 0), chance if majority is None else majority
        failed = (chance is not None and n > 0 and backbone_fitness(a0, n, chance, maj)[0]
                  and not backbone_fitness(acc, n, chance, maj, a0)[0])     # the backbone learned, the fine-tune not
        out.append(f"{m}: Point-in-Box {ci_text(r['pib_delta'], r.get('pib_delta_lo'), r.get('pib_delta_hi'), '+.3f')} "
                   f"over {ref}, top-1 accuracy {a0:.3f} → {acc:.3f} ({da:+.3f})"
                   + (f" — did not train here (top-1 {acc:.3f}, chance {chance:.3f}: it fails the fitness rule of "
                      "docs/decisions/0070 with the backbone as teacher), so its Point-in-Box change says nothing "
                      "about the method" if failed else
                      " — the localisation gain costs accuracy" if r["pib_delta"] > 0 and da < -0.01 else ""))
    return out


def advice_lines(advice: pd.DataFrame) -> list[str]:
    """Each pick of :func:`midas_nb.analysis.recommend_deployment` in one short line: its ``D`` and band
    status, its pruned accuracy against random top-k and its speed-up (what deploying it buys)."""
    out = []
    for _, r in advice.iterrows():
        if not r["recommended"]:
            out.append(f"{r['goal']}: no recommendation")
            continue
        bits = [f"D {ci_text(r['D_pp'], r['D_pp_lo'], r['D_pp_hi'], unit=' pp')}, band {r['status']}"]
        if is_finite_number(r.get("accuracy_vs_random")):
            sign = _sign(r["accuracy_vs_random_lo"], r["accuracy_vs_random_hi"], LEAD_DIGITS)   # as printed
            acc = ci_text(*r[["accuracy_vs_random", "accuracy_vs_random_lo", "accuracy_vs_random_hi"]], "+.3f",
                          edges=())
            bits.append(f"pruned accuracy vs random top-k {acc}"
                        + {"positive": "", "negative": " (below it)"}.get(sign, " (not resolved)"))
        if is_finite_number(r.get("speedup")):
            bits.append(f"speed-up {r['speedup']:.2f}×")
        out.append(f"{r['goal']}: {r['condition']} — " + "; ".join(bits)
                   + (f"; ties with {r['ties']}" if r["ties"] else ""))
    return out
