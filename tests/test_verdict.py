"""The claim's computed verdict (midas_nb.analysis.verdict) on constructed tables: a run where both
halves hold, one where the two winners tie, one where coverage and faithfulness rose together."""
from __future__ import annotations

import re

import numpy as np
import pandas as pd
import pytest

from midas_nb.analysis import claim_verdict, condition_reading, per_image_means

N_IMG = 60


def _row(cond: str, seed: int, miou: np.ndarray, idauc: np.ndarray) -> dict:
    ids = [f"img{i}" for i in range(len(miou))]
    return {"dataset": "cub", "backbone": "b", "checkpoint_id": "ck", "condition": cond, "target": "",
            "relaxation": "", "depth": 6, "budget": 0.25, "seed": seed, "n_images": len(ids),
            "miou": float(miou.mean()), "idauc": float(idauc.mean()),
            "image_ids": ids, "miou_per_image": list(map(float, miou)),
            "idauc_image_ids": ids, "idauc_per_image": list(map(float, idauc))}


def _table(means: dict[str, tuple[float, float]], noise: float = 0.01, seeds=(0, 1), rng_seed=0,
           random_idauc: float | None = 0.0) -> pd.DataFrame:
    """Per-image values = condition mean + a shared image effect + small per-condition noise."""
    rng = np.random.default_rng(rng_seed)
    img_m, img_f = rng.normal(0, 0.05, N_IMG), rng.normal(0, 0.05, N_IMG)
    rows = []
    for cond, (m, f) in means.items():
        for s in (seeds if cond != "reference" else seeds[:1]):
            rows.append(_row(cond, s, m + img_m + rng.normal(0, noise, N_IMG),
                             f + img_f + rng.normal(0, noise, N_IMG)))
    if random_idauc is not None:       # the random ranking: the band's own check on the reference
        rows.append(_row("random", 0, 0.05 + img_m + rng.normal(0, noise, N_IMG),
                         random_idauc + img_f + rng.normal(0, noise, N_IMG)))
    return pd.DataFrame(rows)


def test_both_halves_hold():
    # T5: coverage +8 pp at parity (ΔIDAUC ≈ 0); unsupervised: the most faithful, less coverage
    t = _table({"reference": (0.10, 0.20), "T5": (0.18, 0.20), "unsupervised": (0.12, 0.30),
                "T1": (0.08, 0.25)})
    v = claim_verdict(t, n_boot=400)
    r = v.conditions.set_index("condition").loc["T5"]
    assert r["D_pp"] == pytest.approx(8.0, abs=1.0) and r["reading"] == "coverage up at parity"
    assert v.winners["coverage_winner"] == "T5" and v.winners["faithfulness_winner"] == "unsupervised"
    assert v.winners["reading"] == "different winners"
    assert v.decoupling_shown and "shows the decoupling" in v.text


def test_winners_that_tie_within_noise_are_not_resolved():
    # T3 covers most; T5 is the most faithful by 0.0005 IDAUC with 0.01 per-image noise on 60
    # images: "coverage-first T3, faithfulness-first T5" is not two winners, the lead is not resolved
    t = _table({"reference": (0.10, 0.20), "T5": (0.15, 0.2005), "T3": (0.18, 0.2000)})
    v = claim_verdict(t, n_boot=400)
    w = v.winners
    assert (w["coverage_winner"], w["faithfulness_winner"]) == ("T3", "T5")
    assert w["idauc_diff"] == pytest.approx(0.0005, abs=0.003)
    assert w["idauc_diff_lo"] <= 0 <= w["idauc_diff_hi"] and w["miou_diff_lo"] > 0
    assert w["reading"] == "not resolved: the faithfulness lead is within noise"
    assert not v.decoupling_shown and "does not show a decoupling" in v.text
    # T3's lead over its runner-up T5 is the winners' difference itself: one interval, printed once
    assert w["miou_runner_up"] == "T5"
    assert (w["miou_lead"], w["miou_lead_lo"], w["miou_lead_hi"]) == (w["miou_diff"], w["miou_diff_lo"],
                                                                      w["miou_diff_hi"])


def test_both_rose_together_is_not_called_decoupling():
    t = _table({"reference": (0.10, 0.20), "unsupervised": (0.12, 0.23), "T1": (0.14, 0.26),
                "T3": (0.16, 0.29), "T5": (0.18, 0.32)}, noise=0.005)  # 0.01: T5's lead over T3 prints +0.000
    v = claim_verdict(t, n_boot=400)
    assert v.conditions.set_index("condition").loc["T5", "reading"] == "both rose"
    assert v.comovement["reading"] == "move together" and v.comovement["r_lo"] > 0
    assert v.winners["reading"] == "one condition leads both"
    assert v.winners["miou_runner_up"] == "T3" and v.winners["miou_lead_lo"] > 0
    assert not v.decoupling_shown
    assert "rose together" in v.text and "shows the decoupling" not in v.text


def test_one_condition_with_both_highest_means_ties_where_its_lead_is_not_resolved():
    # T3 covers most (resolved) and is the most faithful by 0.002 IDAUC over T5 (0.01 noise on
    # 60 images): not "T3 leads both", but T3 and T5 tie on faithfulness
    t = _table({"reference": (0.10, 0.20), "T5": (0.15, 0.2995), "T3": (0.18, 0.3015)})
    v = claim_verdict(t, n_boot=400)
    w = v.winners
    assert (w["coverage_winner"], w["faithfulness_winner"]) == ("T3", "T3")
    assert w["miou_lead_lo"] > 0 and w["idauc_lead_lo"] <= 0 <= w["idauc_lead_hi"]
    assert w["reading"] == "highest means on both; the faithfulness lead is within noise"
    assert "T3 and T5 tie on faithfulness within this sample" in v.text
    assert "T3 leads on both" not in v.text and not v.decoupling_shown
    # a tie on one metric leaves two winners possible: never "no different winners"
    assert "this sample cannot tell one winner from two" in v.text and "no different winners" not in v.text


def test_correlation_and_paired_difference_match_independent_computations():
    t = _table({"reference": (0.10, 0.20), "T5": (0.18, 0.20), "unsupervised": (0.12, 0.30),
                "T1": (0.08, 0.25)}, random_idauc=None)
    v = claim_verdict(t, n_boot=200)
    means = t.explode(["image_ids", "miou_per_image", "idauc_image_ids", "idauc_per_image"])
    m = means.groupby("condition")["miou_per_image"].apply(lambda s: np.mean(s.astype(float)))
    f = means.groupby("condition")["idauc_per_image"].apply(lambda s: np.mean(s.astype(float)))
    conds = sorted(m.index)
    assert v.comovement["r"] == pytest.approx(np.corrcoef(m[conds], f[conds])[0, 1], abs=1e-12)
    # coverage winner T5 minus faithfulness winner unsupervised, image by image (seed means)
    pm = per_image_means(t, "miou")
    diff = np.mean([pm["T5"][i] - pm["unsupervised"][i] for i in pm["T5"]])
    assert v.winners["miou_diff"] == pytest.approx(diff, abs=1e-12)
    assert v.winners["miou_diff_lo"] <= diff <= v.winners["miou_diff_hi"]


def test_per_image_means_average_the_seeds_image_by_image():
    rows = [_row("T5", 0, np.array([0.1, 0.3]), np.array([0.0, 0.2])),
            _row("T5", 1, np.array([0.3, 0.5]), np.array([0.2, np.nan]))]
    pm = per_image_means(pd.DataFrame(rows), "idauc")
    assert pm == {"T5": {"img0": pytest.approx(0.1), "img1": pytest.approx(0.2)}}
    with pytest.raises(ValueError, match="metric must be one of"):
        per_image_means(pd.DataFrame(rows), "pib")


def test_readings_by_hand():
    assert condition_reading(1.0, 3.0, 0.01, 0.05, "in band") == "both rose"
    assert condition_reading(1.0, 3.0, -0.005, 0.02, "in band") == "coverage up at parity"
    assert condition_reading(1.0, 3.0, -0.05, -0.02, "outside band") == "coverage up, faithfulness down"
    assert condition_reading(-3.0, -1.0, -0.005, 0.02, "in band") == "coverage down"
    assert condition_reading(-1.0, 1.0, -0.005, 0.02, "in band") == "coverage change not resolved"
    assert condition_reading(1.0, 3.0, -0.005, 0.02, "uninformative").endswith("(band uninformative)")


def test_rows_of_two_cells_or_checkpoints_are_refused():
    t = _table({"reference": (0.10, 0.20), "T5": (0.18, 0.20)})
    t2 = t.copy()
    t2["checkpoint_id"] = "other"
    with pytest.raises(ValueError, match="rows of one cell"):
        claim_verdict(pd.concat([t, t2]), n_boot=50)
    with pytest.raises(ValueError, match="no 'reference' condition"):
        claim_verdict(t[t["condition"] != "reference"], n_boot=50)


def _coverage(targets: dict[str, float], rng_seed: int = 1) -> pd.DataFrame:
    rng = np.random.default_rng(rng_seed)
    ids = [f"img{i}" for i in range(N_IMG)]
    return pd.DataFrame([dict(target=t, miou=m, image_ids=ids,
                              miou_per_image=list(m + rng.normal(0, 0.02, N_IMG))) for t, m in targets.items()])


def test_targets_vs_scorers_credits_a_target_only_above_the_random_map_control():
    from midas_nb.analysis import targets_vs_scorers
    # targets' own coverage differs a lot; scorers all land near the control, except T1 (+5 pp)
    cov = _coverage({"T1": 0.12, "T2": 0.09, "T5": 0.06})
    t = _table({"reference": (0.10, 0.2), "T1": (0.20, 0.2), "T2": (0.15, 0.2), "T5": (0.1505, 0.2),
                "random_map": (0.15, 0.2)}, random_idauc=None)
    frame, text = targets_vs_scorers(cov, t, n_boot=400)
    r = frame.set_index("target")
    assert r.loc["T1", "reading"].startswith("above the control")
    assert r.loc["T5", "reading"].startswith("not separated from the control")
    pm = per_image_means(t, "miou")
    assert r.loc["T5", "gain_over_control"] == pytest.approx(np.mean([pm["T5"][i] - pm["random_map"][i]
                                                                      for i in pm["T5"]]), abs=1e-12)
    own_t5 = np.mean(cov.set_index("target").loc["T5", "miou_per_image"])
    assert r.loc["T5", "target_miou"] == pytest.approx(own_t5, abs=1e-12)
    assert "T1 covers more than it (resolved); T2, T5: not separated from the control — for a scorer" in text
    assert "this run cannot credit what it gains over the reference to its target's content." in text and "spans" in text
    # every scorer above the control (FGVC-Aircraft's notebook 02): no "others" are spoken of
    frame3, text3 = targets_vs_scorers(cov[cov.target != "T5"], t[~t.condition.isin(["T2", "T5"])], n_boot=100)
    assert text3.endswith("T1 covers more than it (resolved).")
    # without the control, nothing is credited
    frame2, text2 = targets_vs_scorers(cov, t[t["condition"] != "random_map"], n_boot=100)
    assert frame2["reading"].str.startswith("no random_map").all() and "cannot be credited" in text2
    with pytest.raises(ValueError, match="per-image columns"):
        targets_vs_scorers(cov.drop(columns=["miou_per_image"]), t)


def test_paired_gap_over_shared_images_by_hand():
    from midas_nb.analysis import paired_gap
    a = pd.DataFrame([dict(condition="T5", seed=s, image_ids=["i0", "i1", "i2"],
                           accuracy_per_image=acc) for s, acc in ((0, [1.0, 1.0, 0.0]), (1, [1.0, 0.0, 0.0]))])
    b = pd.DataFrame([dict(condition="random", seed=0, image_ids=["i1", "i2", "i3"], accuracy_per_image=[0.0, 0.0, 1.0])])
    m, lo, hi, n = paired_gap(a, b, "accuracy", n_boot=200)
    # shared images i1, i2; b's one seed is paired with each of a's: gaps [1, 0] (seed 0) and
    # [0, 0] (seed 1), seed means 0.5 and 0.0 → 0.25; two seeds that disagree this much leave the
    # t interval (1 degree of freedom at most) far wider than the data, cut at the range ±1
    assert (m, n) == (pytest.approx(0.25), 2)
    assert -1.0 <= lo < 0.0 < 0.5 < hi <= 1.0
    # one seed a side: the percentile bootstrap over the two images' gaps, inside their range
    m1, lo1, hi1, n1 = paired_gap(a[a["seed"] == 0], b, "accuracy", n_boot=200)
    assert (m1, n1) == (pytest.approx(0.5), 2) and 0.0 <= lo1 <= m1 <= hi1 <= 1.0


def test_different_winners_name_a_winner_that_ties_with_its_runner_up():
    """FGVC-Aircraft's notebook 07 read "best faithfulness T5 … → different winners" while T5, T3
    and T2 all had IDAUC 0.004: the coverage winner is resolved apart from T5, but T5's own lead
    over T3 is not, and the text now says so."""
    t = _table({"reference": (0.10, 0.15), "T1": (0.30, 0.10), "T5": (0.15, 0.2003), "T3": (0.12, 0.2000)},
               noise=0.03)
    w = claim_verdict(t, n_boot=400).winners
    assert (w["coverage_winner"], w["faithfulness_winner"], w["reading"]) == ("T1", "T5", "different winners")
    assert w["idauc_runner_up"] == "T3" and w["idauc_lead_lo"] <= 0 <= w["idauc_lead_hi"]
    assert w["miou_runner_up"] == "T5" and w["miou_lead_lo"] > 0
    text = claim_verdict(t, n_boot=400).text
    assert "T5 ties with T3 on faithfulness within this sample" in text
    assert "T1 ties with" not in text and w["miou_ties"] == []


def test_a_condition_tying_with_both_winners_leaves_them_not_different():
    """FGVC-Aircraft's notebooks 02 and 07 read "best coverage T1, best faithfulness T5 → different
    winners" while T3 tied with T1 on coverage and with T5 on faithfulness: T3 could be the best
    on both, so the run does not show two different winners."""
    t = _table({"reference": (0.10, 0.15), "T1": (0.30, 0.10), "T5": (0.15, 0.2003), "T3": (0.295, 0.2000)},
               noise=0.03).assign(coverage_kind="box coverage")
    v = claim_verdict(t, n_boot=400)
    w = v.winners
    assert (w["coverage_winner"], w["faithfulness_winner"]) == ("T1", "T5")
    assert w["miou_diff_lo"] > 0 and w["idauc_diff_lo"] > 0                    # T1 vs T5: both resolved
    assert "T3" in w["miou_ties"] and "T3" in w["idauc_ties"] and w["shared_ties"] == ["T3"]
    assert w["reading"] == "not resolved: T3 ties with both winners" and not v.decoupling_shown
    assert "→ not resolved: T3 ties with both winners" in v.text
    assert "T1 − T5: box coverage " in v.text and "mean box coverage and mean IDAUC" in v.text
    # without T3 the same two winners are different winners, as before
    w2 = claim_verdict(t[t["condition"] != "T3"], n_boot=400).winners
    assert w2["reading"] == "different winners" and w2["shared_ties"] == []


def test_every_condition_a_winner_ties_with_is_named():
    """FGVC-Aircraft: T5 0.0045, T3 0.0038 and T2 0.0036 IDAUC, neither lead resolved; the line
    named T3 only."""
    t = _table({"reference": (0.10, 0.15), "T1": (0.30, 0.10), "T5": (0.15, 0.2003), "T3": (0.12, 0.2000),
                "T2": (0.11, 0.1999)}, noise=0.03)
    v = claim_verdict(t, n_boot=400)
    w = v.winners
    assert w["faithfulness_winner"] == "T5" and set(w["idauc_ties"]) == {"T3", "T2"}
    assert w["idauc_ties"][0] == w["idauc_runner_up"]
    assert f"T5 ties with {', '.join(w['idauc_ties'])} on faithfulness within this sample" in v.text


def test_gain_over_the_control_carries_the_seed_spread_by_hand():
    """Two seeds that disagree: on the images alone the gain looks resolved (every image +0.10 or
    −0.02, no image noise); over the seeds it is t with 1 degree of freedom, as D's interval."""
    from scipy.stats import t as student_t

    from midas_nb.analysis import targets_vs_scorers

    ids = [f"i{k}" for k in range(8)]
    base = np.linspace(0.2, 0.5, len(ids))
    rows = [dict(condition=c, seed=s, dataset="d", backbone="b", depth=2, budget=0.25, image_ids=ids,
                 miou_per_image=list(base + g), miou=float(np.mean(base + g)))
            for c, s, g in (("T5", 0, 0.10), ("T5", 1, -0.02), ("random_map", 0, 0.0), ("random_map", 1, 0.0))]
    cov = pd.DataFrame([dict(target="T5", miou=0.3, image_ids=ids, miou_per_image=list(base))])
    frame, _ = targets_vs_scorers(cov, pd.DataFrame(rows), n_boot=200)
    r = frame.set_index("target").loc["T5"]
    half = student_t.ppf(0.975, 1) * np.sqrt(np.var([0.10, -0.02], ddof=1) / 2)
    assert r["gain_over_control"] == pytest.approx(0.04, abs=1e-12)
    assert (r["gain_over_control_lo"], r["gain_over_control_hi"]) == (pytest.approx(0.04 - half, abs=1e-9),
                                                                      pytest.approx(0.04 + half, abs=1e-9))
    assert r["reading"] == "not separated from the control"
    # one seed a side: the images alone decide, and +0.10 on every image is resolved
    frame1, _ = targets_vs_scorers(cov, pd.DataFrame([rows[0], rows[2]]), n_boot=200)
    assert frame1.set_index("target").loc["T5", "reading"] == "above the control"


# --- the synthesis (decision 0073): target content against training signal, the per-claim table ---------------
def _content(t: pd.DataFrame, cov: pd.DataFrame) -> dict:
    from midas_nb.analysis import targets_vs_scorers
    from midas_nb.analysis.synthesis import content_vs_signal
    return content_vs_signal(targets_vs_scorers(cov, t, n_boot=300)[0], t, n_boot=300)


def test_only_t5s_content_explains_the_gain():
    from midas_nb.analysis.synthesis import claims_table
    # T5's scorer covers 10 pp more than the control and than every other target's scorer; its own map too
    t = _table({"reference": (0.10, 0.2), "T1": (0.15, 0.2), "T2": (0.15, 0.2), "T5": (0.25, 0.2),
                "random_map": (0.15, 0.2)}, random_idauc=None)
    c = _content(t, _coverage({"T1": 0.05, "T2": 0.05, "T5": 0.22}))
    assert c["reading"] == "T5 specifically" and c["ties"] == [] and c["own_vs_control"] == "above"
    assert c["vs_others"]["T1"][1] > 0.05 and "T5's content adds coverage" in c["sentence"]
    assert claims_table(content=c).iloc[-1]["verdict"] == "holds"


def test_every_target_ties_so_the_gain_is_any_structured_targets():
    from midas_nb.analysis.synthesis import claims_table
    # issue 52's run: every target's scorer ≈ 0.157, the control 0.058, T5's own top-k 0.059
    t = _table({"reference": (0.095, 0.2), "T1": (0.157, 0.2), "T2": (0.157, 0.2), "T5": (0.157, 0.2),
                "random_map": (0.058, 0.2)}, random_idauc=None)
    c = _content(t, _coverage({"T1": 0.10, "T2": 0.08, "T5": 0.059}))
    assert c["gain"][1] > 0.05                                # T5's scorer resolvably above the control ...
    assert sorted(c["ties"]) == ["T1", "T2"]                  # ... and tied with every other target's scorer
    assert c["reading"] == "any structured target" and c["own_vs_control"] == "not above"
    assert "not resolvably more than the control" in c["sentence"] and "does not credit T5's content" in c["sentence"]
    # the ties it counts, and why (a reader read "tie with T5 or beat it" where none beat it, and missed T2)
    assert "(T1, T2: resolvably above the control, not resolvably below T5;" in c["sentence"]
    assert claims_table(content=c).iloc[-1]["verdict"] == "does not hold"
    # issue 52: a coverage difference is printed in pp, as D (it was a fraction beside D's pp); 0.157 − 0.058
    g = [f"{100 * x:+.2f}" for x in c["gain"]]
    assert f"(gain {g[0]} pp [{g[1]}, {g[2]}])" in c["sentence"] and c["gain"][0] == pytest.approx(0.099, abs=0.01)
    assert f"scorer − random-map control {g[0]} pp [{g[1]}, {g[2]}]" in claims_table(content=c).iloc[-1]["this run"]
    assert re.search(r"T5 − T1 [+-]\d+\.\d pp \[", c["sentence"])    # a lead: at the precision it is decided
    # the row's own cell says why a resolved gain does not hold: the other targets gain too (issue 52: a reader
    # saw "+5.31 pp" beside "does not hold" with nothing between them)
    run = claims_table(content=c).iloc[-1]["this run"]
    assert ", but other targets' scorers gain as well and T5's does not resolvably beat them (T5 − T1 " in run
    assert "; T5 − T2 " in run and run.endswith("): any structured target")
    # without the control nothing is credited either way
    c2 = _content(t[t["condition"] != "random_map"], _coverage({"T1": 0.10, "T5": 0.059}))
    assert c2["reading"] == "undefined" and "cannot say" in c2["sentence"]


def test_a_reversal_is_named_opposite_of_the_paper():
    from midas_nb.analysis.findings import paper_findings
    from midas_nb.analysis.synthesis import claims_table, headline
    # D(T5) rises with depth (+1, +6, +8 pp) and T1 lies 10 pp above the reference: both reverse the paper
    parts = []
    for L, gain in ((3, 0.01), (6, 0.06), (9, 0.08)):
        parts.append(_table({"reference": (0.10, 0.2), "T5": (0.10 + gain, 0.2), "T1": (0.20, 0.2)},
                            noise=0.005, rng_seed=L).assign(depth=L))
    rows = pd.concat(parts, ignore_index=True)
    f = paper_findings(rows, depth=6, budget=0.25, n_boot=300)
    claims = claims_table(f, claim_verdict(rows[rows["depth"] == 6], n_boot=300)).set_index("claim")
    assert claims.loc["D(T5) falls with depth", "verdict"] == "opposite of the paper"
    assert claims.loc["T1 covers less than the reference", "verdict"] == "opposite of the paper"
    assert claims.loc["T5 gains coverage at faithfulness parity", "verdict"] == "holds"
    assert claims.loc["T5 gains coverage at faithfulness parity", "paper"] == "D(T5) = +2.11 pp, in band"
    assert not any("budget" in c for c in claims.index)       # untested here: left out
    assert "2 opposite of the paper" in headline(claims.reset_index(), False)


def test_comovement_interval_resamples_seeds_and_names_the_control_points():
    from midas_nb.analysis.comovement import comovement
    # T1..T5 a tight cluster with no relation; unsupervised and random_map far off on the line
    means = {"reference": (0.10, 0.20), "T1": (0.150, 0.2010), "T2": (0.151, 0.2000), "T3": (0.152, 0.2012),
             "T5": (0.153, 0.2003), "unsupervised": (0.05, 0.10), "random_map": (0.02, 0.05)}
    v = claim_verdict(_table(means), n_boot=400)
    co = v.comovement
    assert co["reading"] == "move together" and co["without_controls"]["reading"] == "not resolved"
    assert co["rests_on_controls"] and "rests on the control points" in v.text
    # the same per-image means over seeds, but two seeds that disagree: only a seed resample widens the interval
    t = _table(means, seeds=(0, 1), noise=0.0)
    shift = {c: (i % 3 - 1) * 0.04 for i, c in enumerate(means)}
    t2 = t.copy()
    for k, r in t2.iterrows():
        if r["condition"] != "reference":
            d = shift.get(r["condition"], 0.0) * (1 if r["seed"] == 0 else -1)
            t2.at[k, "miou_per_image"] = [x + d for x in r["miou_per_image"]]
    from midas_nb.analysis import per_seed_values
    a = comovement(per_seed_values(t, "miou"), per_seed_values(t, "idauc"), n_boot=400)
    b = comovement(per_seed_values(t2, "miou"), per_seed_values(t2, "idauc"), n_boot=400)
    assert a["r"] == pytest.approx(b["r"], abs=1e-9)
    assert (b["r_hi"] - b["r_lo"]) > 2 * (a["r_hi"] - a["r_lo"])


def test_advice_puts_in_band_ties_before_a_leader_whose_band_is_not_resolved():
    from midas_nb.analysis import recommend_deployment
    rng = np.random.default_rng(3)
    t = _table({"reference": (0.10, 0.20), "T5": (0.15, 0.20), "T1": (0.149, 0.2002)}, noise=0.002)
    # T3 covers most, but its ΔIDAUC straddles −0.01 (mean −0.005, noisy): its band is not resolved
    t = pd.concat([t, _table({"T3": (0.17, 0.195)}, noise=0.0, random_idauc=None)], ignore_index=True)
    k = t["condition"] == "T3"
    t.loc[k, "idauc_per_image"] = pd.Series([list(np.array(v) + rng.normal(0, 0.08, N_IMG))
                                            for v in t.loc[k, "idauc_per_image"]], index=t.index[k])
    acc = {"random": 0.50, "reference": 0.70, "T5": 0.52, "T1": 0.60, "T3": 0.60}
    t["accuracy_per_image"] = [list((rng.random(N_IMG) < acc[c]).astype(float)) for c in t["condition"]]
    t["speedup"] = 1.01
    a = recommend_deployment(t, n_boot=300)[0].set_index("goal")
    d = __import__("midas_nb").metrics.decoupling_D(t, n_boot=300).set_index("condition")
    assert d.loc["T3", "status"] == "not resolved" and d.loc["T3", "D_pp"] > d.loc["T5", "D_pp"]
    cov = a.loc["coverage-first"]
    assert cov["condition"] == "T5" and cov["status"] == "in band" and "in_band" not in a.columns
    assert "passed over T3 (higher mean D" in cov["reason"] and "band not resolved" in cov["reason"]
    # T5's pruned accuracy against random top-k, paired, and its speed-up stand beside the pick
    m, lo, hi, _ = __import__("midas_nb").analysis.paired_gap(t[t.condition == "T5"], t[t.condition == "random"],
                                                            "accuracy", n_boot=300)
    assert cov["accuracy_vs_random"] == pytest.approx(m) and lo <= 0 <= hi
    assert "pruned accuracy vs random top-k" in cov["reason"] and "(not resolved); speed-up 1.01×" in cov["reason"]


def test_leak_test_and_pib_trade_conclude_by_hand():
    from midas_nb.analysis.synthesis import leak_test, pib_trade

    def d(u, t5):
        return pd.DataFrame([dict(condition=c, D_pp=m, D_pp_lo=lo, D_pp_hi=hi) for c, (m, lo, hi) in
                             (("unsupervised", u), ("T5", t5))])
    # the unsupervised scorer's D under st above its D under soft, intervals apart: a leak
    assert "→ a leak" in leak_test(d((5.0, 4.0, 6.0), (7.0, 6.0, 8.0)), d((1.0, 0.0, 2.0), (7.0, 6.0, 8.0)))
    assert "→ not resolved" in leak_test(d((5.0, 1.0, 6.0), (7.0, 6.0, 8.0)), d((1.0, 0.0, 2.0), (7.0, 6.0, 8.0)))
    # issue 52: 02 compared st over 3 builds × 2 seeds (decoupling_D's n_seeds counts the rows: 6) with soft's one
    # build and seed; the text says what it compares, and names unlike samples
    st3, soft1 = d((1.37, -8.8, 11.5), (8.7, 7.4, 10.1)), d((2.71, 2.15, 3.28), (9.3, 8.6, 9.8))
    unlike = leak_test(st3.assign(n_builds=3, n_seeds=6), soft1.assign(n_builds=1, n_seeds=1))
    assert "— unlike samples: st on 3 builds × 2 seeds, soft on 1 build × 1 seed" in unlike
    like = leak_test(st3.assign(n_builds=1, n_seeds=1), soft1.assign(n_builds=1, n_seeds=1))
    assert "under soft, each on 1 build × 1 seed (D(T5)" in like and "unlike" not in like
    # a fresh reader: 02 concluded "a leak" on build 0, seed 0 while st's D(unsupervised) over the three builds was
    # +4.10 / +0.24 / -1.62 pp; the verdict says whose it is and shows the builds it cannot speak for
    every = d((0.91, -8.0, 9.8), (8.7, 7.4, 10.1)).assign(n_builds=3, n_seeds=6, D_pp_by_build=(
        "build 0: +4.10, build 1: +0.24, build 2: -1.62"))
    one = d((4.17, 3.5, 4.8), (9.4, 8.6, 10.2)).assign(n_builds=1, n_seeds=1)
    scoped = leak_test(one, soft1.assign(n_builds=1, n_seeds=1), builds=every)
    assert ("→ a leak on 1 build × 1 seed only (D(unsupervised) under st by build: build 0: +4.10, build 1: +0.24, "
            "build 2: -1.62 pp; the other builds have no soft rows): the straight-through path") in scoped
    assert "only (" not in leak_test(one, soft1.assign(n_builds=1, n_seeds=1), builds=every.assign(n_builds=1))
    pib = pd.DataFrame([dict(model="backbone", reference="backbone", pib_delta=0.0, accuracy=0.913),
                        dict(model="LaSt (K=1)", reference="backbone", pib_delta=0.094, pib_delta_lo=0.05,
                             pib_delta_hi=0.13, accuracy=0.508)])
    assert pib_trade(pib) == ["LaSt (K=1): Point-in-Box +0.094 [+0.050, +0.130] over backbone, top-1 accuracy "
                              "0.913 → 0.508 (-0.405) — the localisation gain costs accuracy"]
    # issue 52: 06 reported a LaSt fine-tune near chance (0.208 of 96, chance 0.125) as a Point-in-Box change; a
    # fine-tune failing the fitness rule with the backbone as teacher (Wilson bound 0.140: 2 % of the way; 24 % of
    # 0.865) is said not to have trained; the 0.508 one passes (lower bound 0.409: 32 % of the way; 56 % of 0.913)
    pib = pib.assign(n_images=96)
    assert pib_trade(pib, chance=0.125) == pib_trade(pib)
    failed = pib_trade(pib.assign(accuracy=[0.865, 0.208], pib_delta=[0.0, -0.083]), chance=0.125, majority=0.125)
    assert failed == ["LaSt (K=1): Point-in-Box -0.083 [+0.050, +0.130] over backbone, top-1 accuracy 0.865 → 0.208 "
                      "(-0.657) — did not train here (top-1 0.208, chance 0.125: it fails the fitness rule of "
                      "docs/decisions/0070 with the backbone as teacher), so its Point-in-Box change says nothing "
                      "about the method"]
    # a backbone near chance itself (0.5 of 12, chance 0.25: 00 says it has not learned) flags no fine-tune of it
    small = pib.assign(n_images=12, accuracy=[0.5, 0.167])
    assert "did not train" not in pib_trade(small, chance=0.25)[0]


def test_rows_of_one_seed_in_three_builds_stay_apart_and_pair_within_their_build():
    """Builds (decision 0072): the verdict's per-image values are keyed by (build, seed), a seedless side is
    paired with every seed of its own build, and the interval is over the build means (t with 2 df)."""
    from scipy.stats import t as student_t

    from midas_nb.analysis import paired_gap, per_seed_values

    base = np.linspace(0.2, 0.6, N_IMG)
    a = pd.DataFrame([dict(_row("T5", s, base + 0.1 * (b + 1) + 0.001 * s, base), build=b)
                      for b in range(3) for s in (0, 1)])
    ref = pd.DataFrame([dict(_row("reference", 0, base, base), build=b) for b in range(3)])
    assert sorted(per_seed_values(a, "miou")["T5"]) == [(b, s) for b in range(3) for s in (0, 1)]
    m, lo, hi, n = paired_gap(a, ref, "miou", n_boot=200)
    means = np.array([0.1005, 0.2005, 0.3005])              # each build's gap: constant over its images
    half = student_t.ppf(0.975, 2) * means.std(ddof=1) / np.sqrt(3)
    assert n == N_IMG and m == pytest.approx(means.mean())
    assert (lo, hi) == pytest.approx((means.mean() - half, means.mean() + half))


# --- issue 52, a fresh reader's confusions (decision 0079) ---------------------------------------------------------
def test_a_lead_or_tie_uses_the_builds_hierarchy_and_says_so():
    """Three builds × two seeds: the winners' lead (T3 − T5 on mIoU) is the t interval over the three build means
    (each build's gap constant over its images, so the image term is 0 and t has 2 degrees of freedom, not the
    1 of two seeds), and the verdict prints the levels it used."""
    from scipy.stats import t as student_t
    base = np.linspace(0.2, 0.6, N_IMG)
    gaps = {0: 0.02, 1: 0.05, 2: 0.11}                       # T3 − T5 per build (the seeds of a build agree)
    rows = [dict(_row("reference", 0, base, base), build=b) for b in gaps]
    rows += [dict(_row("T5", s, base + 0.05, base + 0.01), build=b) for b in gaps for s in (0, 1)]
    rows += [dict(_row("T3", s, base + 0.05 + g, base), build=b) for b, g in gaps.items() for s in (0, 1)]
    v = claim_verdict(pd.DataFrame(rows), n_boot=200)
    w = v.winners
    m = np.mean(list(gaps.values()))
    half = student_t.ppf(0.975, 2) * np.std(list(gaps.values()), ddof=1) / np.sqrt(3)
    assert (w["coverage_winner"], w["miou_runner_up"]) == ("T3", "T5")
    assert (w["miou_lead"], w["miou_lead_lo"], w["miou_lead_hi"]) == pytest.approx((m, m - half, m + half))
    assert "3 builds × 2 seeds × the shared test images (t over the 3 build means" in v.text
    one = pd.DataFrame(rows)
    assert "1 build × 2 seeds × the shared test images (t over the 2 seeds" in claim_verdict(
        one[one["build"] == 0], n_boot=200).text


def test_two_verdicts_say_which_claim_each_column_answers():
    from midas_nb.analysis.control import two_verdicts
    d = pd.DataFrame([dict(condition="T5", status="in band", D_pp_vs_random_map=0.4, D_pp_lo_vs_random_map=-1.2,
                           D_pp_hi_vs_random_map=2.0, status_vs_random_map="in band")])
    s = two_verdicts(d)
    assert "coverage — D vs random_map +0.40 pp [-1.20, +2.00], not resolved: the interval holds 0" in s
    assert "\"T5's content explains its scorer's gain\"" in s and "Faithfulness — the band vs random_map \"in band\"" in s
    assert s.endswith("the band vs the reference, \"in band\" (the D table above).")
    assert "resolvably above the control" in two_verdicts(d.assign(D_pp_lo_vs_random_map=0.1))
    assert two_verdicts(d.drop(columns="D_pp_vs_random_map")) == ""


def test_the_cosine_claim_names_its_pairs_and_the_one_that_decides():
    from midas_nb.analysis.synthesis import box, cosine_scope, probe_claims
    hv = pd.DataFrame([dict(hidden=h, attention=a, cosine=c, lo=c - 0.03, hi=c + 0.03, depth=6)
                       for h, a, c in (("T4", "T2", 0.01), ("T4", "T3", -0.02), ("T5", "T2", 0.214),
                                       ("T5", "T3", 0.05))])
    s = cosine_scope(hv, 6)
    # why T4's pairs count (a reader took T4·T3's correlation for one by construction): T4 is hidden-gradient
    assert ("(T4·T2, T4·T3, T5·T2, T5·T3; T4 is hidden-gradient: the hidden-state gradient weighted by CLS "
            "attention) within ±0.082") in s
    assert "the largest |cos| decides it: T5·T2 = +0.214 [+0.184, +0.244]" in s
    assert s.endswith("; the pair the paper names is one of them: T5·T3 = +0.050 [+0.020, +0.080].")
    claims = probe_claims(hv, 6)       # the box's verdict reads the same pair: beyond the bound, does not hold
    assert claims.iloc[0]["verdict"] == "does not hold" and "T5·T2 = +0.214" in claims.iloc[0]["this run"]
    assert s in box([s], claims)


def test_the_cosine_claim_across_depths_is_read_per_depth_by_hand():
    """03's depth figure was never read: the sentence gives each depth's verdict by the box's rule, the pairs
    beyond ±0.082 and the reversed ones, computed here by hand from constructed intervals."""
    from midas_nb.analysis.synthesis import cosine_depths
    rows = [(3, "T5", "T3", 0.02, 0.00, 0.04), (3, "T5", "T2", 0.091, 0.085, 0.098),      # beyond the bound
            (6, "T5", "T3", 0.01, -0.02, 0.04), (6, "T5", "T2", 0.05, 0.03, 0.07),        # both within
            (9, "T5", "T3", -0.05, -0.07, -0.03), (9, "T5", "T2", 0.06, 0.04, 0.09)]      # 0.09 crosses the bound
    hv = pd.DataFrame([dict(depth=L, hidden=h, attention=a, cosine=c, lo=lo, hi=hi) for L, h, a, c, lo, hi in rows])
    assert cosine_depths(hv) == (
        "Across depths, the cosine claim read at each depth as the box reads it: L = 3 does not hold (beyond ±0.082: "
        "T5·T2 = +0.091 [+0.085, +0.098]); L = 6 holds; L = 9 not resolved. Reversed rankings (the whole interval "
        "below 0: what one ranks first the other ranks late, a relation, not independence): "
        "T5·T3 = -0.050 [-0.070, -0.030] at L = 9.")


def test_depth_and_budget_rows_read_what_d_does_on_a_run_without_a_decoupling():
    """Issue 52: 04 and 05 said "the decoupling fades" on a run whose 02 verdict shows no decoupling (here the two
    winners tie). The rows now say what D(T5) does, and name no decoupling of this run."""
    from midas_nb.analysis.findings import paper_findings
    from midas_nb.analysis.synthesis import claims_table
    parts = [_table({"reference": (0.10, 0.2), "T5": (0.10 + g, 0.2), "T3": (0.10 + g, 0.2001)}, noise=0.005,
                    rng_seed=L).assign(depth=L) for L, g in ((3, 0.08), (6, 0.08), (9, 0.01))]
    rows = pd.concat(parts, ignore_index=True)
    v = claim_verdict(rows[rows["depth"] == 6], n_boot=300)
    assert not v.decoupling_shown
    f = paper_findings(rows, depth=6, budget=0.25, n_boot=300)
    claims = claims_table(f, v).set_index("claim")
    assert claims.loc["D(T5) falls with depth", "verdict"] == "holds"
    assert "decoupling" not in claims.loc["D(T5) falls with depth", "this run"]
    assert f.set_index("finding").loc["fades_deep", "statement"].startswith("D(T5) falls with depth")
    # a rise from no gain is no reversal of a fade: "does not hold", and the evidence says why
    parts = [_table({"reference": (0.10, 0.2), "T5": (0.10 + g, 0.2)}, noise=0.005, rng_seed=L).assign(depth=L)
             for L, g in ((3, -0.02), (6, -0.02), (9, 0.05))]
    f = paper_findings(pd.concat(parts, ignore_index=True), depth=6, budget=0.25, n_boot=300)
    row = claims_table(f).set_index("claim").loc["D(T5) falls with depth"]
    assert row["verdict"] == "does not hold" and "no coverage gain of T5 at parity to fade at L ≤ 6" in row["this run"]


def test_each_box_names_its_claims_and_a_shared_claim_reads_one_verdict():
    """Issue 52: 05's headline read like 02's over another claim set. Each headline names its claims; the claims
    both boxes hold (T5's parity, T1) get the same verdict and evidence from the same rows, whatever else the
    rows hold (02: the protocol table at the point; 05 and the report: the point and the regime cells)."""
    from midas_nb.analysis.findings import paper_findings
    from midas_nb.analysis.synthesis import claims_table, headline, run_claims
    point = _table({"reference": (0.10, 0.2), "T5": (0.16, 0.2), "T1": (0.08, 0.2), "T3": (0.17, 0.2)})
    deep = _table({"reference": (0.10, 0.2), "T5": (0.12, 0.2), "T1": (0.09, 0.2)}, rng_seed=9).assign(depth=9)
    v = claim_verdict(point, n_boot=300)
    c02 = run_claims(point, v, n_boot=300)
    c05 = claims_table(paper_findings(pd.concat([point, deep], ignore_index=True), depth=6, budget=0.25,
                                      n_boot=300), backbone="b")
    h02, h05 = headline(c02, v.decoupling_shown), headline(c05)
    assert h02.startswith("This run does not show a decoupling — 4 of the paper's 9 claims (T5 parity, T1, winners, "
                          "co-movement; not in this table: cosines, depth, budget, scale, T5's content): ")
    assert h05.startswith("3 of the paper's 9 claims (T5 parity, T1, depth; not in this table: cosines, budget, scale, "
                          "winners, co-movement, T5's content): ")
    shared = c02.merge(c05, on="claim", suffixes=("", "_05")).set_index("claim")
    assert list(shared.index) == ["T5 gains coverage at faithfulness parity", "T1 covers less than the reference"]
    assert (shared["verdict"] == shared["verdict_05"]).all() and (shared["this run"] == shared["this run_05"]).all()
    # a backbone that has not learned its task (decision 0070): its claims are counted as such, not left out
    assert headline(c05.assign(verdict="not counted")).endswith("T5's content): 3 not counted.")


def test_the_scorers_following_their_targets_is_read_from_the_order_and_the_spans():
    """Issue 52 (a reader): "the scorers do not follow their targets' differences" was printed whenever the
    scorers spanned less than half the targets' span, also where they kept the targets' order (a quick CUB run:
    targets T1-T5 0.094/0.060/0.127/0.092/0.075, scorers 0.157/0.145/0.167/0.165/0.157)."""
    from midas_nb.analysis.verdict import follows_targets
    quick = follows_targets([0.094, 0.060, 0.127, 0.092, 0.075], [0.1566, 0.145, 0.167, 0.165, 0.1572])
    # spans 6.7 and 2.2 pp; discordant pairs by hand: T1-T4 (0.094 > 0.092, 0.1566 < 0.165), T1-T5 (0.094 > 0.075,
    # 0.1566 < 0.1572): 8 of the 10 pairs ordered alike
    assert "spans 6.7 pp across 5 targets; the scorers distilled from them span 2.2 pp" in quick
    assert "order 8 of the 10 pairs" in quick and "the scorers mostly follow their targets' order" in quick
    assert "compressed to 33% of the targets' span" in quick and "do not follow" not in quick
    reverse = follows_targets([0.1, 0.2, 0.3], [0.3, 0.2, 0.1])
    assert "order 0 of the 3 pairs" in reverse and "mostly reverse their targets' order" in reverse
    assert "compressed" not in reverse and "widened" not in reverse       # the same span
    mixed = follows_targets([0.1, 0.2, 0.3, 0.4], [0.2, 0.1, 0.4, 0.3])  # 4 of 6 alike: neither
    assert "order 4 of the 6 pairs" in mixed and "do not follow their targets' order" in mixed
    assert "widened to 2.5× the targets' span" in follows_targets([0.1, 0.11, 0.12], [0.1, 0.15, 0.15])
    assert follows_targets([0.1], [0.2]).endswith("span 0.0 pp.")    # one target: no pair to order


def test_a_backbone_is_fit_only_where_every_build_is_and_its_claims_are_otherwise_not_counted():
    """Issue 52 (decision 0082): fitness was shown and applied for build 0 alone, and notebooks 02 and 07 counted
    every claim whatever it said; one build that has not learned the task makes every claim "not counted", by the
    report's own count_fitness."""
    from midas_nb.analysis import backbone_fitness, fitness_over_builds
    from midas_nb.analysis.synthesis import claims_table, headline

    good, bad = backbone_fitness(0.9, 300, 0.1, 0.12), backbone_fitness(0.13, 300, 0.1, 0.12)
    assert good[0] and not bad[0]
    assert fitness_over_builds({0: good}) == good and fitness_over_builds({0: bad}) == bad
    assert fitness_over_builds({0: good, 1: good, 2: good}) == (True, "each of the 3 backbone builds has learned "
                                                                      "the task")
    fit, why = fitness_over_builds({0: good, 1: bad, 2: bad})
    assert not fit and why == "build 1 of builds 0, 1, 2: " + bad[1]
    with pytest.raises(ValueError, match="no build"):
        fitness_over_builds({})
    findings = pd.DataFrame([dict(finding="t1_below_reference", holds=False, evidence="D(T1) = +8.67 pp",
                                  dataset="cub", backbone="b")])
    counted = claims_table(findings, fitness=(True, "fit"))
    assert list(counted["verdict"]) == ["opposite of the paper"]
    assert counted.equals(claims_table(findings))
    dropped = claims_table(findings, fitness=(fit, why))
    assert list(dropped.columns) == ["claim", "paper", "this run", "verdict"]
    assert list(dropped["verdict"]) == ["not counted"]
    assert dropped["this run"].iloc[0] == ("not counted: build 1 of builds 0, 1, 2: the backbone has not learned "
                                           "the task; D(T1) = +8.67 pp")
    # nothing counted: the headline says neither "shows" nor "does not show" a decoupling
    assert headline(dropped, shown=False).endswith("T5's content): 1 not counted.")


def test_a_lead_that_prints_as_zero_is_a_tie_for_the_winners_the_advice_and_the_content_test():
    """Issue 52 (decision 0085): 02 called T5's coverage lead over T3 at [+0.000, +0.003] resolved while a reader
    reads a tie. One rule (analysis.lead_resolved: the lower bound above 0 at the three decimals printed) decides
    the winners' leads, 07's advice ties and the content test's ties alike."""
    from midas_nb.analysis import lead_resolved, paired_gap, recommend_deployment
    assert not lead_resolved(0.0004, 0.003) and lead_resolved(0.0006, 0.003) and not lead_resolved(-0.001, 0.003)
    assert not lead_resolved(float("nan"), 0.003)
    # T5 covers 0.15 pp more than T3 on every image, faithfulness equal: a lead of 0.0015 that this sample
    # bounds below by a positive number that prints as +0.000
    t = _table({"reference": (0.10, 0.20), "T5": (0.1515, 0.30), "T3": (0.150, 0.30), "random_map": (0.11, 0.3)},
               noise=0.0035, seeds=(0,), rng_seed=0)
    _, lo, hi, _ = paired_gap(t[t["condition"] == "T5"], t[t["condition"] == "T3"], "miou", n_boot=300)
    assert 0 < lo < 0.0005 and f"{lo:+.3f}" == "+0.000"        # the old rule (lo > 0) called it a lead
    w = claim_verdict(t, n_boot=300).winners
    assert w["coverage_winner"] == "T5" and w["miou_runner_up"] == "T3" and w["miou_ties"] == ["T3"]
    cov = recommend_deployment(t, n_boot=300)[0].set_index("goal").loc["coverage-first"]
    assert cov["condition"] == "T5" and "T3" in cov["ties"].split(", ")
    c = _content(t, _coverage({"T3": 0.10, "T5": 0.12}))
    assert c["ties"] == ["T3"] and "T5 − T3 +0.1 pp [+0.0, +0.3]" in c["sentence"]
    # a pick's pruned accuracy against random top-k: "[+0.000, …]" is not a resolved gain either
    from midas_nb.analysis.synthesis import advice_lines
    pick = dict(goal="coverage-first", recommended=True, condition="T5", D_pp=5.0, D_pp_lo=2.0, D_pp_hi=8.0,
                status="in band", accuracy_vs_random=0.01, accuracy_vs_random_lo=0.0002, accuracy_vs_random_hi=0.02,
                speedup=1.27, ties="")
    assert "vs random top-k +0.010 [+0.000, +0.020] (not resolved)" in advice_lines(pd.DataFrame([pick]))[0]


def test_a_headline_says_which_of_the_papers_claims_it_counts_and_which_it_leaves_out():
    """Issue 52: 02, 04, 05 and 07 counted 5, 4, 5 and 7 claims under one kind of headline. Each says how many of
    the paper's nine claims it counts, names them, and names the ones it leaves to another box (decision 0085)."""
    from midas_nb.analysis.synthesis import headline
    rows = [("T5 gains coverage at faithfulness parity", "holds"), ("T1 covers less than the reference", "not resolved"),
            ("D(T5) falls with depth", "not resolved"),
            ("D(T5) falls with the budget (pp and share of the IoU ceiling)", "not resolved")]
    c04 = pd.DataFrame([dict(claim=c, paper="", verdict=v, **{"this run": ""}) for c, v in rows])
    assert headline(c04) == ("4 of the paper's 9 claims (T5 parity, T1, depth, budget; not in this table: cosines, "
                             "scale, winners, co-movement, T5's content): 1 holds, 3 not resolved.")
    every = ["T5 gains coverage at faithfulness parity", "T1 covers less than the reference",
             "hidden- and attention-gradient rankings unrelated", "D(T5) falls with depth", "D(T5) falls with the budget",
             "reproduces on DeiT-Ti, reverses on ViT-B", "two different winners", "coverage and faithfulness decouple",
             "T5's content explains its scorer's gain (from the D intervals, unpaired)"]
    full = pd.DataFrame([dict(claim=c, paper="", verdict="holds", **{"this run": ""}) for c in every])
    assert headline(full, True) == ("This run shows the decoupling — all 9 of the paper's claims (T5 parity, T1, "
                                    "cosines, depth, budget, scale, winners, co-movement, T5's content): 9 hold.")
    assert headline(full.iloc[:0]) == "none of the paper's claims: none tested."


def test_one_wording_of_the_parity_band_matches_the_statuses_of_a_constructed_table():
    """Issue 52: the band's interval was described four ways across 02, 06 and the report. metrics.band_rule is the
    one wording; 02 and 06 print it instead of restating it, and each status of a constructed table is the one the
    wording gives its ΔIDAUC interval (decision 0085)."""
    import json
    from pathlib import Path
    from midas_nb import metrics
    text = metrics.band_rule()
    # in band (ΔIDAUC ≈ 0), outside (−0.1), straddling −0.01 (mean −0.01, noisy)
    t = _table({"reference": (0.10, 0.20), "T5": (0.15, 0.20), "T1": (0.15, 0.10), "T3": (0.15, 0.19)}, noise=0.002)
    k = t["condition"] == "T3"
    rng = np.random.default_rng(5)
    t.loc[k, "idauc_per_image"] = pd.Series([list(np.array(v) + rng.normal(0, 0.08, N_IMG))
                                            for v in t.loc[k, "idauc_per_image"]], index=t.index[k])
    d = metrics.decoupling_D(t, n_boot=300).set_index("condition")
    rule = {"in band": lambda lo, hi: lo >= -0.01, "outside band": lambda lo, hi: hi < -0.01,
            "not resolved": lambda lo, hi: lo < -0.01 <= hi}
    assert [d.loc[c, "status"] for c in ("T5", "T1", "T3")] == ["in band", "outside band", "not resolved"]
    for c in ("T5", "T1", "T3"):
        status = d.loc[c, "status"]
        assert rule[status](d.loc[c, "delta_idauc_lo"], d.loc[c, "delta_idauc_hi"]) and f"{status} — " in text
    assert "≥ −0.01" in text and "≥ −0.02" in metrics.band_rule(0.02) and "resolves |ΔIDAUC| ≥ h" in text
    for name in ("02_three_condition_protocol", "06_related_methods"):
        cells = json.loads(Path(f"notebooks/{name}.ipynb").read_text())["cells"]
        prose = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "markdown")
        code = " ".join("".join(c["source"]) for c in cells if c["cell_type"] == "code")
        assert "metrics.band_rule()" in code and "straddles" not in prose, name


def test_what_a_scale_readout_can_show_follows_from_its_number_of_backbones():
    """Issue 52: 05 promised a scale readout on a run with one backbone; scale_scope says what the run can show."""
    from midas_nb.analysis import scale_scope
    from midas_nb.config import PAPER_BACKBONES
    one = scale_scope(["hybrid_lite0_deit"])
    assert one.startswith("This run reads out 1 backbone (hybrid_lite0_deit): it shows D on that backbone only")
    assert "cannot say whether D depends on scale" in one and "undefined here" in one
    two = scale_scope(["a", "b", "a"])
    assert two.startswith("This run reads out 2 backbones (a, b): it can show whether D(T5) changes") and \
        "undefined here" in two
    assert scale_scope(PAPER_BACKBONES).endswith("among them it tests the paper's scale finding.")


def test_comovement_names_the_random_ranking_it_leaves_out():
    """(c) counted 8 conditions of a 9-row table without saying which one it left out (a fresh reader)."""
    means = {"reference": (0.10, 0.20), "T1": (0.15, 0.25), "T3": (0.16, 0.27), "T5": (0.17, 0.29),
             "unsupervised": (0.12, 0.22), "random": (0.05, 0.01)}
    v = claim_verdict(_table(means), n_boot=200)
    assert v.comovement["excluded"] == ["random"] and v.comovement["n_conditions"] == 5
    assert "(c) across 5 conditions (random left out: a lower bound, not a scorer)" in v.text


def test_rule_splits_tell_a_split_of_means_from_a_split_of_the_data():
    from midas_nb.analysis import rule_splits

    def cell(depth, cov, fai, cov_ties="", fai_ties="", fai_status="in band"):
        return [dict(goal="coverage-first", depth=depth, budget=0.25, condition=cov, recommended=True,
                     ties=cov_ties, status="in band"),
                dict(goal="faithfulness-first", depth=depth, budget=0.25, condition=fai, recommended=True,
                     ties=fai_ties, status=fai_status)]

    advice = pd.DataFrame(cell(3, "T5", "T5") + cell(6, "T1", "T5", cov_ties="T5")
                          + cell(9, "T1", "T5", fai_ties="reference") + cell(11, "T1", "T5", fai_status="not resolved"))
    lines = rule_splits(advice).splitlines()
    assert lines == [
        "L = 6, b = 25%: coverage-first T1, faithfulness-first T5 — T5 covers as much as T1 within noise "
        "(paired mIoU): a split of the means, not of the data",
        "L = 9, b = 25%: coverage-first T1, faithfulness-first T5 — both leads are resolved: the two goals part here",
        "L = 11, b = 25%: coverage-first T1, faithfulness-first T5 — T5 is not a coverage-first candidate "
        "(band not resolved) and T1 is resolvably less faithful: the two goals part here"]
    same = pd.DataFrame(cell(6, "T5", "T5", cov_ties="T1"))
    assert rule_splits(same) == "The two rules pick the same condition in every cell."
    tie_both = pd.DataFrame(cell(6, "T1", "T5", cov_ties="T5", fai_ties="T1, T2"))
    assert rule_splits(tie_both).endswith("T5 covers as much as T1 within noise (paired mIoU); T1 is as faithful "
                                          "as T5 within noise (paired IDAUC): a split of the means, not of the data")


# --- a fresh reader of the three-dataset run (issue 51, decision 0088) ----------------------------------------------
def test_a_collapsed_scorer_is_counted_and_named_by_build_and_seed():
    """CUB, build 1 seed 1: the unsupervised scorer's IDAUC fell below the random keep's and nothing said so. Three
    builds × two seeds; that one scorer's per-image IDAUC is random's − 0.05 (± 0.01 noise), the others random's + 0.2:
    only it is named, with its paired gap, and a scorer resolvably above random by less than the band is named too."""
    from midas_nb.analysis.synthesis import collapsed_scorers

    rng = np.random.default_rng(0)
    base = rng.uniform(0.0, 0.1, N_IMG)
    rows = [dict(_row("random", 0, base, base), build=b) for b in range(3)]
    for b in range(3):
        for s in (0, 1):
            gap = -0.05 if (b, s) == (1, 1) else 0.2
            rows.append(dict(_row("unsupervised", s, base, base + gap + rng.normal(0, 0.01, N_IMG)), build=b))
            rows.append(dict(_row("T5", s, base, base + 0.2), build=b))
    line = collapsed_scorers(pd.DataFrame(rows), n_boot=200)
    assert line.startswith("Collapsed scorers (no more faithful than the random keep: IDAUC − random's on the same "
                           "images resolvably below +0.01, the parity band")
    assert re.search(r"1 of 6 unsupervised scorers collapsed: build 1 seed 1 \(IDAUC − random's -0\.05\d "
                     r"\[-0\.05\d, -0\.04\d\] on 60 images\)\.$", line), line
    assert "T5" not in line
    healthy = pd.DataFrame([r for r in rows if not (r["condition"] == "unsupervised" and r["build"] == 1)])
    assert collapsed_scorers(healthy, n_boot=200).endswith("interval): none of the 10.")
    # at random's within the band (+0.005, the whole interval below +0.01): collapsed as well
    near = [dict(r, idauc_per_image=list(base + 0.005)) if r["condition"] == "T5" and r["build"] == 0 else r
            for r in rows]
    assert "2 of 6 T5 scorers collapsed: build 0 seed 0 (IDAUC − random's +0.005" in collapsed_scorers(
        pd.DataFrame(near), n_boot=200)
    # random_map, the training-signal control, is meant to rank like a random map: never judged
    ctrl = [dict(r, condition="random_map") for r in near if r["condition"] == "T5"]
    assert "random_map" not in collapsed_scorers(pd.DataFrame(rows + ctrl), n_boot=200)


def test_comovement_resamples_the_builds_once_for_every_condition_and_says_so():
    """Builds are crossed with conditions (each build is one backbone every condition is measured on): three builds
    whose offset is common to every condition (−0.2, 0, +0.2 in mIoU) leave r = 1 in every resample when the builds
    are drawn once for all conditions; drawn per condition, as seeds (the old interval), the common offset becomes
    noise ten times the conditions' spread and the exact relation reads "not resolved". The claim's row says what
    was resampled."""
    from midas_nb.analysis.comovement import comovement
    from midas_nb.analysis import per_seed_values
    from midas_nb.analysis.synthesis import claims_table
    means = {"reference": (0.09, 0.19), "T1": (0.10, 0.20), "T2": (0.11, 0.21), "T3": (0.12, 0.22),
             "T4": (0.13, 0.23), "T5": (0.14, 0.24)}
    t = pd.concat([_table(means, noise=0.0, random_idauc=None).assign(build=b) for b in range(3)], ignore_index=True)
    t["miou_per_image"] = [list(np.array(v) + 0.2 * (b - 1)) for v, b in zip(t["miou_per_image"], t["build"])]
    co = comovement(per_seed_values(t, "miou"), per_seed_values(t, "idauc"), n_boot=400)
    assert co["r"] == pytest.approx(1.0) and co["r_lo"] == pytest.approx(1.0) and co["reading"] == "move together"
    assert co["n_builds"] == 3 and co["resampled"] == "images, 3 builds and seeds resampled"
    v = claim_verdict(t, n_boot=200)
    assert "r = +1.00 [+1.00, +1.00] (images, 3 builds and seeds resampled) → move together" in v.text
    row = claims_table(verdict=v).set_index("claim").loc["coverage and faithfulness decouple", "this run"]
    assert row.startswith("r = +1.00 [+1.00, +1.00] over 6 conditions (images, 3 builds and seeds resampled)")
    one = comovement(per_seed_values(t[t["build"] == 0], "miou"), per_seed_values(t[t["build"] == 0], "idauc"))
    assert one["resampled"] == "images and seeds resampled"


# --- the take-away of a fresh reader of the README's quick run (issue 51, decision 0090) ----------------------------
def test_a_split_of_the_two_goals_off_the_main_point_says_it_is_a_regime_the_box_does_not_count():
    """07 printed "L = 9, b = 25%: … both leads are resolved: the two goals part here" above a box whose winners row,
    read at the main point L = 6, said "not resolved": two answers to one question. Given the main point, a resolved
    split elsewhere says it is a regime off it, not counted in the box; at the main point the line is as before."""
    from midas_nb.analysis import rule_splits

    def cell(depth, fai_status="in band"):
        return [dict(goal="coverage-first", depth=depth, budget=0.25, condition="T1", recommended=True, ties="",
                     status="in band"),
                dict(goal="faithfulness-first", depth=depth, budget=0.25, condition="T5", recommended=True, ties="",
                     status=fai_status)]

    advice = pd.DataFrame(cell(6) + cell(9) + cell(11, "not resolved"))
    off = ("the two goals part in this regime, off the main point L = 6, b = 25% where the box reads the paper's two "
           "winners: not counted there")
    assert rule_splits(advice, (6, 0.25)).splitlines() == [
        "L = 6, b = 25%: coverage-first T1, faithfulness-first T5 — both leads are resolved: the two goals part here",
        f"L = 9, b = 25%: coverage-first T1, faithfulness-first T5 — both leads are resolved: {off}",
        "L = 11, b = 25%: coverage-first T1, faithfulness-first T5 — T5 is not a coverage-first candidate "
        f"(band not resolved) and T1 is resolvably less faithful: {off}"]
    assert "off the main point" not in rule_splits(advice)                  # no main point given: as before


def test_verdict_and_advice_text_print_the_side_of_a_bound_that_rounds_onto_its_edge():
    """A claim said "holds" (D's lower bound 0.004 pp above 0) beside "[+0.00, …]", and a band "not resolved"
    (ΔIDAUC's lower bound −0.0104 below −0.01) beside "[−0.010, …]": the printed interval read the other way. The
    verdict text and the advice print the digits that show the side; a lead, decided as printed, keeps its
    precision (decision 0085)."""
    from midas_nb.analysis.synthesis import advice_lines
    from midas_nb.analysis.verdict import _text
    cond = pd.DataFrame([dict(condition="T5", D_pp=1.0, D_pp_lo=0.004, D_pp_hi=2.0, delta_idauc=-0.004,
                              delta_idauc_lo=-0.0104, delta_idauc_hi=0.002, status="not resolved",
                              reading="coverage up, parity not resolved")])
    winners = dict(reading="undefined", coverage_winner=None, faithfulness_winner=None)
    text = _text(cond, "T5", winners, dict(r=float("nan"), reason="none", reading="undefined"), False)
    assert "D(T5) = +1.00 [+0.004, +2.00] pp, ΔIDAUC = -0.004 [-0.0104, +0.002], band: not resolved" in text
    pick = dict(goal="coverage-first", recommended=True, condition="T5", D_pp=5.0, D_pp_lo=0.004, D_pp_hi=8.0,
                status="in band", accuracy_vs_random=0.01, accuracy_vs_random_lo=0.0002, accuracy_vs_random_hi=0.02,
                ties="")
    line = advice_lines(pd.DataFrame([pick]))[0]
    assert "D +5.00 pp [+0.004, +8.00], band in band" in line                             # old: [+0.00, +8.00]
    assert "vs random top-k +0.010 [+0.000, +0.020] (not resolved)" in line                # a lead: as printed


def test_the_notebooks_boxes_partition_the_papers_nine_claims_and_07_adds_up_02_and_04():
    """02, 04, 05 and 07 each printed "k of the paper's 9 claims: …" over overlapping subsets (T5 parity and T1 in
    all four), so no two tallies could be joined. One map (synthesis.CLAIM_BOXES) gives each claim to one box:
    02, 03, 04 and 05 partition the nine, 07 counts 02's and 04's, each notebook's box passes its number, and 07's
    table is 02's rows (from the protocol table) plus 04's (from the sweep), its counts their sums."""
    import json
    from pathlib import Path
    from midas_nb.analysis.synthesis import CLAIM_BOXES, _SHORT, box, run_claims
    nine = list(dict.fromkeys(_SHORT.values()))
    owners = [c for nb in ("02", "03", "04", "05") for c in CLAIM_BOXES[nb]]
    assert len(nine) == 9 and sorted(owners) == sorted(nine)               # each claim in exactly one box
    assert CLAIM_BOXES["07"] == ("02", "04")
    for nb in ("02", "03", "04", "05", "07"):
        path = next((Path(__file__).resolve().parents[1] / "notebooks").glob(f"{nb}_*.ipynb"))
        code = " ".join("".join(c["source"]) for c in json.loads(path.read_text())["cells"] if c["cell_type"] == "code")
        assert f'notebook="{nb}"' in code, nb
    point = _table({"reference": (0.10, 0.2), "T5": (0.16, 0.2), "T1": (0.08, 0.2), "T3": (0.17, 0.2)})
    sweep = pd.concat([_table({"reference": (0.10, 0.2), "T5": (0.10 + g, 0.2), "T1": (0.09, 0.2)}, rng_seed=L)
                       .assign(depth=L) for L, g in ((3, 0.07), (6, 0.05), (9, 0.01))], ignore_index=True)
    v = claim_verdict(point, n_boot=300)
    c02, c04 = run_claims(point, v, n_boot=300), run_claims(sweep, depth=6, budget=0.25, n_boot=300)
    c07 = run_claims(point, v, n_boot=300, sweep=sweep, depth=6, budget=0.25)

    def shown(claims, nb):
        lines = box([], claims, None, nb).splitlines()
        return lines[1], [r for r in lines[4:] if r.startswith("|")]

    (h02, r02), (h04, r04), (h07, r07) = shown(c02, "02"), shown(c04, "04"), shown(c07, "07")
    assert r07 == r02[:2] + r04 + r02[2:]                 # the same rows, each from the box that counts it
    others = "the others counted in 02 (T5 parity, T1, winners, co-movement, T5's content), 03 (cosines), 05 (scale)"
    assert h04.startswith(f"1 of the paper's 9 claims (04's: depth; not tested here: budget; {others}): ")
    assert h07.startswith("5 of the paper's 9 claims (02's: T5 parity, T1, winners, co-movement; 04's: depth; not "
                          "tested here: T5's content, budget; the others counted in 03 (cosines), 05 (scale)): ")
    counts = [re.findall(r"(\d+) (hold|holds|not resolved|opposite of the paper|does not hold|do not hold)",
                         h.rpartition("): ")[2]) for h in (h02, h04, h07)]
    total = {}
    for k, v_ in counts[0] + counts[1]:
        total[v_.replace("holds", "hold")] = total.get(v_.replace("holds", "hold"), 0) + int(k)
    assert total == {v_.replace("holds", "hold"): int(k) for k, v_ in counts[2]}
