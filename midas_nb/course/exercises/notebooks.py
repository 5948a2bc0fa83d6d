"""The exercises of notebooks 00–07 (quickstart, targets, protocol, probes, sweeps, scale, related methods,
deployment), registered in notebook order."""
from __future__ import annotations

import math

import torch

from ...analysis import recommend_deployment, share_falls
from ...analysis.paper_reference import PAPER_COSINE_MAX
from ...backbones.vit import keep_count
from ...metrics import box_coverage, decoupling_D, part_miou
from ...pruning import keep_mask_from_indices, select_top_k
from ...results import leaders
from ._core import (Choice, choice, d_pp, integer, number, option, pair, register, resolved_in_band, sign_of,
                    signs_near_edge, two_backbones)

def _ceiling(f: float, b: float) -> float:
    """The best IoU of ``ceil(b·N)`` kept tokens with a share ``f`` of part (or box) patches (notebook 00)."""
    return min(f, b) / max(f, b)


register("00.keep_count", "k = ceil(b·N) with N = rows × cols of `study.grid`.", integer,
         lambda study: keep_count(0.10, math.prod(study.grid)))

register("00.iou_ceiling", "f is the fraction of part patches in `batch.part_mask`; b = 0.10.", number,
         lambda batch: _ceiling(float(batch.part_mask.float().mean()), 0.10))


@register("00.ceiling_what_if", "`f = float(coverage_mask.float().mean())`; compare the two ceilings.", option)
def _ex_ceiling_what_if(coverage_mask) -> Choice:
    f = float(coverage_mask.float().mean())
    c = {b: _ceiling(f, b) for b in (0.10, 0.50)}
    pick = "a" if c[0.50] > c[0.10] + 1e-12 else "b" if c[0.50] < c[0.10] - 1e-12 else "c"
    return Choice(pick, "abc", f"f = {f:.1%}: the ceiling is {c[0.10]:.3f} at b = 10 % and {c[0.50]:.3f} at "
                               f"b = 50 %. Part mIoU and box coverage are read against this ceiling, not against 1.")


def _per_image_coverage(scores: torch.Tensor, study) -> torch.Tensor:
    """Per-image part IoU (or box coverage) of the study's top-k of ``scores``, as ``Study.target_coverage``."""
    ds = study.test_set
    has_parts = bool(getattr(ds, "has_parts", True))
    ref = torch.stack([ds[i].part_mask if has_parts else ds[i].box_mask for i in range(len(ds))])
    n = scores.shape[1]
    keep = keep_mask_from_indices(select_top_k(scores.float(), keep_count(float(study.settings.point.budget), n)), n)
    return (part_miou if has_parts else box_coverage)(keep, ref).per_image


register("01.abs_t5_miou",
         "`midas_nb.pruning.select_top_k`, `keep_mask_from_indices` and `midas_nb.metrics.part_miou` (`box_coverage` "
         "where `study.test_set.has_parts` is false); the masks are `study.test_set[i].part_mask` (`.box_mask`).",
         number, lambda maps, study: float(_per_image_coverage(maps["T5"].abs(), study).nanmean()))

register("01.best_target",
         "sort `coverage` by `miou`.", choice, lambda coverage: set(leaders(coverage, "miou", name="target")))


@register("01.abs_t5_sign",
           "per-image IoUs: `metrics.part_miou(keep, part_mask).per_image` (`metrics.box_coverage(keep, box_mask)` on "
           "a dataset without parts) for the top-k of `maps['T5']` and of `maps['T5'].abs()`; the interval: "
           "`midas_nb.metrics.stats.bootstrap_ci(abs_iou - t5_iou, n_boot=study.settings.statistics.bootstrap)` "
           "(skipped images — no part or box patch, or a box covering nearly the whole image — are NaN).", option)
def _ex_abs_t5_sign(maps, study) -> Choice:
    from ...metrics.stats import bootstrap_ci
    t5 = maps["T5"].float()
    diff = _per_image_coverage(t5.abs(), study) - _per_image_coverage(t5, study)
    m, lo, hi = bootstrap_ci(diff, n_boot=study.settings.statistics.bootstrap)
    letter = {"positive": "a", "negative": "b", "not resolved": "c"}
    signs = signs_near_edge(lo, hi) - {"undefined"}
    if not signs:
        raise ValueError("no image with a part (or informative box) patch: the difference is undefined")
    return Choice({letter[x] for x in signs}, "abc",
                  f"|T5| − T5: {100 * m:+.2f} pp [{100 * lo:+.2f}, {100 * hi:+.2f}] of part (or box) IoU, "
                  f"paired over {int(diff.isfinite().sum())} images.")


register("02.D_T5", "`table.groupby('condition')['miou'].mean()`.", number,
         lambda table: float(decoupling_D(table).set_index("condition").loc["T5", "D_pp"]))

_BASELINES = {"reference", "random", "random_map"}


@register("02.D_leaders",
           "the leader's `D_pp_lo` against every other row's `D_pp_hi`; `midas_nb.results.leader_line(D, 'D_pp', "
           "name='condition', what='largest D')` says the same in words.", option)
def _ex_d_leaders(D) -> Choice:
    first, *ties = leaders(D[~D["condition"].isin(_BASELINES)], "D_pp", name="condition")
    return Choice("b" if ties else "a", "ab", f"largest D: {first}; tied with it within noise: "
                                              f"{', '.join(ties) or 'none'}.")


@register("02.mean_vs_interval", "`D[['condition', 'delta_idauc', 'delta_idauc_lo', 'status']]`.", option)
def _ex_mean_vs_interval(D) -> Choice:
    d = D[~D["condition"].isin(_BASELINES)]
    by_mean = d["delta_idauc"].astype(float) >= -0.01 - 1e-12
    near = list(d.loc[by_mean, "condition"].astype(str))
    over = list(d.loc[by_mean & ~resolved_in_band(d), "condition"].astype(str))
    pick = "c" if not near else "b" if over else "a"
    return Choice(pick, "abc", f"at parity by the mean: {', '.join(near) or 'none'}; of these, not resolved by "
                               f"the interval: {', '.join(over) or 'none'}.")


@register("02.scorer_vs_control",
           "the T5 row of `vs_targets`: `gain_over_control_lo` / `_hi`, `target_miou` against `control_miou`; "
           "`scorer_miou_lo` of T5 against the other rows' `scorer_miou_hi`.", option)
def _ex_scorer_vs_control(vs_targets) -> Choice:
    rows = vs_targets[vs_targets["target"] == "T5"] if "target" in getattr(vs_targets, "columns", []) else []
    if len(rows) == 0:
        return Choice("e", "abcde", "vs_targets has no T5 scorer.")
    r = rows.iloc[0]
    g, lo, hi = (float(r.get(f"gain_over_control{x}", math.nan)) for x in ("", "_lo", "_hi"))
    sign = sign_of(lo, hi)
    if sign == "undefined":
        return Choice("e", "abcde", "there is no control to compare with.")
    tied = leaders(vs_targets, "scorer_miou", name="target")
    alone = tied == ["T5"] and float(r["target_miou"]) > float(r["control_miou"])
    pick = {"positive": "a" if alone else "b", "not resolved": "c", "negative": "d"}[sign]
    return Choice(pick, "abcde", f"T5's own top-k {float(r['target_miou']):.3f}, the T5 scorer "
                                 f"{float(r['scorer_miou']):.3f}, the control {float(r['control_miou']):.3f}; "
                                 f"scorer − control {g:+.3f} [{lo:+.3f}, {hi:+.3f}]; the best scorers within "
                                 f"noise: {', '.join(tied)}.")


@register("03.t5_t3_vs_paper", "`lo.loc['T5', 'T3']` and `hi.loc['T5', 'T3']`.", option)
def _ex_t5_t3_vs_paper(mean, lo, hi) -> Choice:
    m, a, b, c = float(mean.loc["T5", "T3"]), float(lo.loc["T5", "T3"]), float(hi.loc["T5", "T3"]), PAPER_COSINE_MAX
    pick = "a" if -c <= a and b <= c else "b" if a > c or b < -c else "c"
    return Choice(pick, "abc", f"cos(T5, T3) = {m:.3f} [{a:.3f}, {b:.3f}] against ±{c}.")


@register("03.most_similar_pair",
           "`mean.stack()` lists (row, column, value); skip pairs of a target with itself.", pair)
def _ex_most_similar(mean, lo, hi) -> set[frozenset[str]]:
    import pandas as pd
    pairs = pd.DataFrame([dict(pair=f"{a}|{b}", v=mean.loc[a, b], v_lo=lo.loc[a, b], v_hi=hi.loc[a, b])
                          for i, a in enumerate(mean.index) for b in list(mean.columns)[i + 1:] if a != b])
    return {frozenset(k.split("|")) for k in leaders(pairs, "v", name="pair")}


@register("03.hidden_vs_attention", "compare `lo` and `hi` of each row of `hv` with 0.", option)
def _ex_hidden_vs_attention(hv) -> Choice:
    signs = [(f"{r['hidden']}–{r['attention']}", sign_of(float(r["lo"]), float(r["hi"]))) for _, r in hv.iterrows()]
    pos, neg = ([name for name, x in signs if x == want] for want in ("positive", "negative"))
    return Choice(({"b"} if pos else set()) | ({"c"} if neg else set()) or {"a"}, "abc",
                  f"resolvably positive: {', '.join(pos) or 'none'}; resolvably negative: {', '.join(neg) or 'none'} "
                  f"(of {len(signs)} pairs).")


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
          "`D_pp_hi`.", option, applies=_two_budgets,
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
          "smallest's `D_pp_hi`?", option, applies=two_backbones,
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


@register("07.coverage_first", "`midas_nb.metrics.decoupling_D(table)` has `D_pp` and `status`.", choice,
          kind="computation")
def _ex_cov_first(table) -> set[str]:
    """The coverage-first advice of :func:`midas_nb.analysis.recommend_deployment` and its ties within noise."""
    r = recommend_deployment(table)[0].set_index("goal").loc["coverage-first"]
    return {str(r["condition"]), *(t.strip() for t in str(r["ties"] or "").split(",") if t.strip())}


@register("07.decoupling_shown",
           "`verdict.decoupling_shown`, `verdict.winners['reading']` and `verdict.comovement['reading']`.", option)
def _ex_decoupling_shown(verdict) -> Choice:
    shown = bool(verdict.decoupling_shown)
    winners, co = str(verdict.winners.get("reading")), str(verdict.comovement.get("reading"))
    two = winners == "different winners"
    accepted = {x for x, true in zip("abcd", (shown, not two, co == "move together", two and not shown)) if true}
    return Choice(accepted, "abcd", f"winners: {winners}; co-movement: {co}; decoupling shown: {shown}.")
