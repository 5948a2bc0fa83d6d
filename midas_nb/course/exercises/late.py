"""The exercises of notebooks 04–07 (sweeps, scale, related methods, deployment), registered in notebook order."""
from __future__ import annotations

import math

from ...analysis import recommend_deployment, share_falls
from ...results import leaders
from ._core import (Choice, choice, d_pp, integer, number, option, register, resolved_in_band, sign_of, two_backbones)


# ---------------------------------------------------------------------------- 04 sweeps
register("04.T5_cells_in_band",
         "filter `D` to condition T5 and count `delta_idauc_lo ≥ −0.01` (`status` hides it where uninformative).",
         integer, lambda D: int(resolved_in_band(D[D["condition"] == "T5"]).sum()))


def _t5_budget_ends(mine, study):
    L0 = study.settings.point.depth
    return mine[(mine["condition"] == "T5") & (mine["depth"].astype(int) == L0)].sort_values("budget"), L0


def _two_budgets(mine, ceiling, study) -> str | None:
    n, L0 = _t5_budget_ends(mine, study)[0]["budget"].nunique(), study.settings.point.depth
    return None if n >= 2 else f"needs T5 at ≥ 2 budgets at the study's depth L = {L0}; this run has {n}"


@register("04.budget_fall",
          "the T5 rows of `mine` at depth `study.settings.point.depth`, sorted by budget: the ends' `D_pp_lo` / "
          "`D_pp_hi`.",
          option, applies=_two_budgets,
          prompt="**Why.** A looser budget keeps more tokens, and the IoU ceiling of notebook 00 — the best part (or "
                 "box) IoU any ranking can reach — changes with it; `D` is a difference of two IoUs under that "
                 "ceiling. Follow **D(T5)** from the tightest to the loosest budget of the sweep at the study's depth "
                 "`L` (`study.settings.point.depth`), and compute its share of the ceiling, `D / (100 · ceiling)`, at "
                 "both ends (`ceiling` holds the ceiling per budget). Is D's change more than the ceiling's? (`'a'`, "
                 "`'b'` or `'c'`)\n\n"
                 "* (a) D(T5) does **not fall** resolvably: the loosest budget's interval of D is not entirely below "
                 "the tightest one's — there is no fall to explain;\n"
                 "* (b) D(T5) falls, but its **share of the ceiling holds** (positive at the tightest budget, at "
                 "least half of it left at the loosest): the fall is mostly the ceiling's — when most kept tokens "
                 "cannot be part (or box) patches, there is less coverage to gain, not a weaker effect;\n"
                 "* (c) D(T5) falls and its **share of the ceiling falls too** (less than half of it left, or D not "
                 "positive at the tightest budget): more changed than the ceiling.")
def _ex_budget_fall(mine, ceiling, study) -> Choice:
    g, L0 = _t5_budget_ends(mine, study)
    near, far = g.iloc[0], g.iloc[-1]
    c = dict(zip(ceiling["budget"].astype(float), ceiling["ceiling"].astype(float)))
    c0, c1 = c.get(float(near["budget"]), math.nan), c.get(float(far["budget"]), math.nan)
    r0, r1 = float(near["D_pp"]) / (100 * c0), float(far["D_pp"]) / (100 * c1)
    falls = float(far["D_pp_hi"]) < float(near["D_pp_lo"])
    pick = "a" if not falls else "c" if share_falls(r0, r1) else "b"
    return Choice(pick, "abc", f"at L = {L0}: D(T5) {d_pp(near)} at b = {float(near['budget']):.0%}, "
                               f"{d_pp(far)} at b = {float(far['budget']):.0%}; ceiling {c0:.2f} → {c1:.2f}, "
                               f"share of it {r0:+.2f} → {r1:+.2f}.")


# ----------------------------------------------------------------------------- 05 scale
register("05.best_backbone_T5", "filter `D` to condition T5.",
         choice, lambda D: set(leaders(D[D["condition"] == "T5"], "D_pp", name="backbone")), applies=two_backbones,
         prompt="On which backbone does **T5** gain the most coverage over the reference (largest D)? (`str`; every "
                "backbone whose interval of D overlaps the leader's ties with it within noise and is accepted)")


@register("05.own_backbone_T5",
           "the row of `D` with `backbone == study.settings.backbone.name` and `condition == 'T5'`: `D_pp_lo`, "
           "`D_pp_hi`, `status`.", option)
def _ex_own_backbone_t5(D, study) -> Choice:
    g = D[(D["condition"] == "T5") & (D["backbone"].astype(str) == study.settings.backbone.name)]
    if "dataset" in g.columns and getattr(study, "dataset_name", None) in set(g["dataset"]):
        g = g[g["dataset"] == study.dataset_name]
    if len(g) != 1:
        raise ValueError(f"expected one T5 row of {study.settings.backbone.name} in D, found {len(g)}")
    r = g.iloc[0]
    lo, hi, status = float(r["D_pp_lo"]), float(r["D_pp_hi"]), str(r["status"])
    pick = ("b" if status == "outside band" or sign_of(lo, hi) == "negative" else
            "a" if sign_of(lo, hi) == "positive" and status == "in band" else "c")
    return Choice(pick, "abc", f"{r['backbone']}: D(T5) {d_pp(r)}, band {status}.")


@register("05.spread_resolved",
          "the T5 rows of `D` with the largest and the smallest `D_pp`: is the largest's `D_pp_lo` above the "
          "smallest's `D_pp_hi`?",
          option, applies=two_backbones,
          prompt="**Why.** D(T5) differs between the backbones (largest minus smallest: its spread). Is that a "
                 "property of the backbones, or could this sample alone produce it? Compare the 95 % intervals of the "
                 "**largest** and the **smallest** D(T5). (`'a'` or `'b'`)\n\n"
                 "* (a) **resolved**: the two intervals do not overlap — this run tells those backbones apart on "
                 "D(T5);\n"
                 "* (b) **not resolved**: the intervals overlap — on this sample the backbones cannot be ranked on "
                 "D(T5), however large the spread of the means looks.")
def _ex_spread_resolved(D) -> Choice:
    t5 = D[D["condition"] == "T5"].sort_values("D_pp")
    low, high = t5.iloc[0], t5.iloc[-1]
    apart = float(high["D_pp_lo"]) > float(low["D_pp_hi"])
    return Choice("a" if apart else "b", "ab", f"largest {high['backbone']} {d_pp(high)}, smallest {low['backbone']} "
                                               f"{d_pp(low)}.")


# --------------------------------------------------------------------------- 06 related
register("06.best_separation", "sort `res.perturbation` by `neg_minus_pos`.", choice,
         lambda res: set(leaders(res.perturbation, "neg_minus_pos", name="target")))

register("06.pib_T0", "the images are `midas_nb.data.evaluation_subset(len(study.test_set), n_images, "
         "study.settings.protocol.eval_subset_seed)`; then `study.target_maps(ids=['T0'])['T0'][i].argmax()` and "
         "`study.test_set[i].box_mask`.", number, lambda pib: float(pib.set_index("ranking").loc["T0", "pib"]))


@register("06.patch_score_pib", "the `patch_score` row of `pib`: `pib_lo`, `pib_centre`, `pib_box_area`.", option)
def _ex_patch_score_pib(pib) -> Choice:
    r = pib.set_index("ranking").loc["patch_score"]
    lo, centre, area = float(r["pib_lo"]), float(r["pib_centre"]), float(r["pib_box_area"])
    pick = "a" if lo > max(centre, area) else "b" if lo <= centre else "c"
    return Choice(pick, "abc", f"Patch Score PiB {float(r['pib']):.2f} [{lo:.2f}, {float(r['pib_hi']):.2f}] "
                               f"against the centre patch {centre:.2f} and the box area {area:.2f}.")


# ---------------------------------------------------------------------------- 07 deploy
@register("07.coverage_first", "`midas_nb.metrics.decoupling_D(table)` has `D_pp` and `status`.", choice,
          kind="computation")
def _ex_cov_first(table) -> set[str]:
    """The coverage-first advice of :func:`midas_nb.analysis.recommend_deployment` and its ties within noise."""
    r = recommend_deployment(table)[0].set_index("goal").loc["coverage-first"]
    return {str(r["condition"]), *(t.strip() for t in str(r["ties"] or "").split(",") if t.strip())}


@register("07.decoupling_shown",
           "`verdict.decoupling_shown`, `verdict.winners['reading']` and `verdict.comovement['reading']`.",
           option)
def _ex_decoupling_shown(verdict) -> Choice:
    shown = bool(verdict.decoupling_shown)
    winners, co = str(verdict.winners.get("reading")), str(verdict.comovement.get("reading"))
    two = winners == "different winners"
    accepted = {x for x, true in zip("abcd", (shown, not two, co == "move together", two and not shown)) if true}
    return Choice(accepted, "abcd", f"winners: {winners}; co-movement: {co}; decoupling shown: {shown}.")
