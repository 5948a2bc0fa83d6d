"""Reader-facing formatting of results tables (results.present)."""
from __future__ import annotations

import math

import pandas as pd
import pytest

from midas_nb.results import compact, format_ci, full_text, images_note, leader_line, probe_note, sample_note


def test_format_ci_by_hand():
    assert format_ci(0.1534, 0.1481, 0.1579) == "0.153 [0.148, 0.158]"
    assert format_ci(0.1534) == "0.153" and format_ci(math.nan, 0, 1) == "n/a"
    assert format_ci(-0.0004, -0.001, 0.0002) == "-0.000 [-0.001, 0.0002]"     # a bound shows its side of 0
    assert format_ci(-0.0004, -0.001, 0.0002, edges=()) == "-0.000 [-0.001, 0.000]"  # the sign of a value below 0
    assert format_ci(2.5, 1.0, 4.0, "+.2f") == "+2.50 [+1.00, +4.00]"
    assert format_ci(-0.001, fmt="+.2f") == "-0.00"
    assert format_ci(-1.234, -2.5, 0.4, "+.2f", " pp") == "-1.23 pp [-2.50, +0.40]"


def test_findings_ci_text_is_format_ci_signed():
    """One interval formatter: ``ci_text`` (D in pp) is ``format_ci`` signed with two decimals; both keep the sign
    of a bound below zero, and a bound that would print onto 0 shows its side (decision 0090)."""
    from midas_nb.analysis.findings import ci_text
    assert ci_text(-0.004, -0.001, 0.0002) == "-0.00 [-0.001, +0.0002]" == format_ci(-0.004, -0.001, 0.0002, "+.2f")
    assert ci_text(1.5, 0.25, 2.75, unit=" pp") == "+1.50 pp [+0.25, +2.75]" and ci_text(math.nan, 0, 1) == "n/a"


def test_a_bound_never_prints_onto_the_edge_its_verdict_compares_it_with():
    """Issue 51 (a fresh reader): "+0.2 pp [+0.0, +0.3]" did not say whether the lower bound was above 0, and a
    ΔIDAUC bound of −0.0104 printed "−0.010", the band's edge, beside "not resolved". A bound that rounds onto an edge
    it is not on gets the decimals that show its side (three more at most, then a strict mark); the mean, a bound far
    from every edge and a bound on an edge print as before (decision 0090)."""
    assert format_ci(0.2, 0.04, 0.3, "+.1f", " pp") == "+0.2 pp [+0.04, +0.3]"          # old: [+0.0, +0.3]
    assert format_ci(0.2, -0.004, 0.3, "+.1f") == "+0.2 [-0.004, +0.3]"                  # old: [-0.0, +0.3]
    assert format_ci(0.2, 0.0, 0.3, "+.1f") == "+0.2 [+0.0, +0.3]"                        # on the edge: as it is
    assert format_ci(0.2, 1e-9, 0.3, "+.1f") == "+0.2 [>+0.0000, +0.3]"                   # too close: a strict mark
    band = (0, -0.01)
    assert format_ci(-0.005, -0.0104, 0.002, "+.3f", edges=band) == "-0.005 [-0.0104, +0.002]"   # below −0.01
    assert format_ci(-0.005, -0.0096, 0.002, "+.3f", edges=band) == "-0.005 [-0.0096, +0.002]"   # above it
    assert format_ci(-0.005, -0.0104, 0.002, "+.3f", edges=(0,)) == "-0.005 [-0.010, +0.002]"    # no band edge given
    assert format_ci(0.002, 0.0004, 0.003, "+.3f", edges=()) == "+0.002 [+0.000, +0.003]"  # a lead: a tie as printed


def test_compact_table_drops_empty_columns_and_uses_seed_means():
    t = pd.DataFrame({"condition": ["reference", "T5"], "miou_mean": [0.1, 0.18], "miou_lo": [0.09, 0.17],
                      "miou_hi": [0.11, 0.19], "pib": [math.nan, math.nan], "D_pp": [0.0, 8.0],
                      "D_pp_lo": [0.0, 7.5], "D_pp_hi": [0.0, 8.5]})
    c = compact(t, ["miou", "pib", "D_pp"], signed=["D_pp"], digits=2)
    assert list(c.columns) == ["miou", "D_pp"]
    assert c.loc["T5", "miou"] == "0.18 [0.17, 0.19]" and c.loc["T5", "D_pp"] == "+8.00 [+7.50, +8.50]"
    with pytest.raises(ValueError, match="no column 'idauc'"):
        compact(t, ["idauc"])


def test_sample_note_states_both_samples_and_the_training_settings():
    rows = [dict(condition="reference", seed=0, n_images=299, n_skipped_parts=3, n_idauc_images=64, idauc_steps=8,
                 epochs=0, lambda_ga=0.0, scorer="reference", relaxation="", depth=6, budget=0.25,
                 backbone="hybrid_lite0_deit", checkpoint_id="9a979eb22e80abcdef", coverage_kind="part mIoU")]
    for s in (0, 1):
        rows.append(dict(rows[0], condition="T5", seed=s, epochs=30, lambda_ga=1.0, scorer="mlp", relaxation="st"))
    note = sample_note(pd.DataFrame(rows))
    assert note == ("part mIoU: 299 test images, 3 skipped; IDAUC: 64 images, 8 steps; seeds 0, 1; "
                    "mlp scorers trained 30 epochs; λ = 1; relaxation st; L = 6, b = 25%; "
                    "backbone hybrid_lite0_deit (9a979eb22e80)")
    with pytest.raises(ValueError, match="no rows"):
        sample_note(pd.DataFrame())
    # a regime sweep whose own point ran both seeds and its other points one (quick's sweep_seeds)
    others = [dict(r, depth=L) for L in (3, 9) for r in rows if r["seed"] == 0]
    sweep = sample_note(pd.DataFrame(rows + others))
    assert "; seeds 0, 1 at (L=6, b=25%); seed 0 at (L=3, b=25%), (L=9, b=25%); " in sweep
    more = [dict(r, budget=b) for b in (0.1, 0.5) for r in others]
    assert "; seeds 0, 1 at (L=6, b=25%); seed 0 at 6 points; " in sample_note(pd.DataFrame(rows + others + more))


def test_compact_keeps_plain_columns_and_named_bounds():
    hv = pd.DataFrame({"depth": [math.nan, math.nan], "hidden": ["T5", "T4"], "attention": ["T3", "T3"],
                       "cosine": [0.0412, -0.0061], "lo": [0.01, -0.03], "hi": [0.07, 0.02], "n_images": [64, 64],
                       "mode": ["rank", "rank"]})
    c = compact(hv, ["cosine"], index=["hidden", "attention"], bounds={"cosine": ("lo", "hi")},
                keep=["n_images", "depth", "missing"])
    assert list(c.columns) == ["cosine", "n_images"]          # the all-NaN depth and the absent name dropped
    assert c.loc[("T5", "T3"), "cosine"] == "0.041 [0.010, 0.070]"
    assert c.loc[("T4", "T3"), "cosine"] == "-0.006 [-0.030, 0.020]" and c.loc[("T4", "T3"), "n_images"] == 64


def test_sample_note_of_a_target_table_states_its_budget():
    cov = pd.DataFrame({"target": ["T0", "T5"], "miou": [0.2, 0.3], "n_images": [60, 60], "budget": [0.25, 0.25],
                        "coverage_kind": ["part mIoU"] * 2})
    assert sample_note(cov) == "part mIoU: 60 test images; b = 25%"
    assert sample_note(cov.assign(n_skipped=[2, 2])) == "part mIoU: 60 test images, 2 skipped; b = 25%"
    # issue 52: 01 promises the line counts the skipped images; none is a count too
    assert sample_note(cov.assign(n_skipped=[0, 0])) == "part mIoU: 60 test images, none skipped; b = 25%"


def test_compact_keep_column_with_gaps_prints_a_dash_and_whole_numbers():
    t = pd.DataFrame({"model": ["backbone", "LaSt"], "pib": [0.25, 0.5], "last_K": [math.nan, 1.0]})
    c = compact(t, ["pib"], index="model", keep=["last_K"])
    assert c["last_K"].tolist() == ["—", 1] and c.loc["LaSt", "pib"] == "0.500"


def test_probe_and_images_notes():
    hv = pd.DataFrame({"depth": [math.nan] * 2, "hidden": ["T5", "T4"], "attention": ["T3", "T3"],
                       "cosine": [0.1, 0.2], "n_images": [24, 24], "mode": ["rank", "rank"]})
    assert probe_note(hv, bootstrap=1000, depth=2) == ("24 test images; rank cosine (Spearman ρ) of the targets at "
                                                        "block L = 2; 95 % CI: bootstrap over images, 1000 resamples")
    pr = hv.assign(depth=[6, 6], backbone=["a", "b"], checkpoint_id=["0123456789abcdef", "fedcba9876543210"])
    assert probe_note(pr) == ("24 test images; rank cosine (Spearman ρ) of the targets at block L = 6; "
                              "backbone a, b (0123456789ab, fedcba987654)")
    assert images_note(hv, "Point-in-Box", bootstrap=200) == ("24 test images; Point-in-Box; 95 % CI: bootstrap "
                                                              "over images, 200 resamples")
    with pytest.raises(ValueError, match="no rows"):
        probe_note(hv.iloc[0:0])
    with pytest.raises(ValueError, match="n_images"):
        images_note(hv.drop(columns="n_images"), "x")


def test_full_text_shows_every_character():
    long = "votes of channels for their K (default N//2) tokens of largest x/|lowpass(x)−x| and more text"
    t = pd.DataFrame({"name": ["T0", "last_votes"], "definition": ["E_h A_h[cls, j]", long]}).set_index("name")
    shown = full_text(t)
    for text in (shown._repr_html_(), repr(shown)):          # pandas' own display cuts the cell at 50 characters
        assert long in text and "..." not in text
    assert repr(shown).splitlines()[-1].split()[:2] == ["last_votes", "votes"]


def test_study_summary_prints_fractions_with_three_decimals():
    from midas_nb.results import format_ci      # Study.summary's train/test accuracy: a lone value

    assert format_ci(0.791667) == "0.792" and format_ci(0.25) == "0.250"
    assert format_ci(None) == "n/a" and format_ci(math.nan) == "n/a"


def test_leader_line_names_the_rows_a_leader_is_not_separated_from():
    # FGVC-Aircraft's notebook 06: "best separation … T5 (+0.037 [−0.004, +0.088])" with every
    # interval overlapping; Cars: T3 0.209 [0.117, 0.299] beside tokentm 0.199 [0.102, 0.289]
    t = pd.DataFrame(dict(target=["T3", "tokentm", "T0"], v=[0.209, 0.199, 0.010],
                          v_lo=[0.117, 0.102, -0.020], v_hi=[0.299, 0.289, 0.050]))
    assert leader_line(t, "v", name="target", what="best") == (
        "best: T3 (0.209 [0.117, 0.299]); not separated from tokentm (its interval overlaps T3's)")
    alone = t[t.target != "tokentm"]
    assert leader_line(alone, "v", name="target", what="best", signed=True) == (
        "best: T3 (+0.209 [+0.117, +0.299]); its interval lies above every other's")
    assert leader_line(t.drop(columns=["v_lo", "v_hi"]), "v", name="target", what="best") == "best: T3 (0.209)"
    assert leader_line(t, "v", name="target", what="lowest", lowest=True) == (
        "lowest: T0 (0.010 [-0.020, 0.050]); its interval lies below every other's")
    with pytest.raises(ValueError, match="no column 'x'"):
        leader_line(t, "x", name="target", what="best")
