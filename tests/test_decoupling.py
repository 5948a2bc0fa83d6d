"""decoupling_D's parity band against an unfaithful reference, its paired point and interval, the
t-based seed component, and cells keyed by checkpoint (DESIGN.md §6; hand-computed tables)."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student_t

from midas_nb.metrics import decoupling_D
from midas_nb.analysis.findings import findings_paragraph, paper_findings
from midas_nb.metrics.stats import seed_image_interval

BASE = dict(dataset="cub", backbone="deit_s", checkpoint_id="ck-a", depth=6, budget=0.25)


def _row(cond: str, seed: int, ids, miou, idauc, **kw) -> dict:
    miou, idauc = np.asarray(miou, float), np.asarray(idauc, float)
    return dict(BASE, condition=cond, target=cond, seed=seed, miou=float(miou.mean()), idauc=float(idauc.mean()),
                image_ids=list(ids), miou_per_image=miou.tolist(), idauc_image_ids=list(ids),
                idauc_per_image=idauc.tolist(), **kw)


IDS = [f"i{k}" for k in range(8)]
REF_I = np.array([0.30, 0.10, 0.25, 0.05, 0.40, 0.20, 0.15, 0.35])     # mean 0.225
REF_M = np.full(8, 0.40)


def _cell(random_offsets) -> pd.DataFrame:
    """reference, T5 (mIoU +0.03, IDAUC +0.002 on every image) and, unless ``None``, the random
    ranking with IDAUC = reference − offsets (per image)."""
    rows = [_row("reference", 0, IDS, REF_M, REF_I), _row("T5", 0, IDS, REF_M + 0.03, REF_I + 0.002)]
    if random_offsets is not None:
        rows.append(_row("random", 0, IDS, REF_M - 0.1, REF_I - np.asarray(random_offsets)))
    return pd.DataFrame(rows)


def test_reference_not_above_random_makes_the_band_uninformative():
    # reference − random = ±0.1 alternating: mean 0, the paired interval straddles 0
    D = decoupling_D(_cell([0.1, -0.1] * 4), n_boot=500).set_index("condition")
    t5 = D.loc["T5"]
    assert t5["D_pp"] == pytest.approx(3.0) and t5["delta_idauc"] == pytest.approx(0.002)
    assert bool(t5["in_band"])                         # the point decision is kept ...
    assert t5["status"] == "uninformative"             # ... but the verdict says the band cannot speak
    assert t5["reference_check"] == "not above random"
    assert t5["ref_minus_random"] == pytest.approx(0.0, abs=1e-12)
    assert t5["ref_minus_random_lo"] < 0 < t5["ref_minus_random_hi"]
    assert "not above random 0.225" in t5["band_reason"] and "reference IDAUC 0.225" in t5["band_reason"]
    assert t5["D_cell"].startswith("+3.00 (band uninformative")


def test_reference_clearly_above_random_keeps_the_band_and_no_random_row_is_untested():
    D = decoupling_D(_cell([0.20, 0.22] * 4), n_boot=500).set_index("condition")
    t5 = D.loc["T5"]
    assert t5["status"] == "in band" and t5["reference_check"] == "above random"
    assert t5["ref_minus_random"] == pytest.approx(0.21)
    assert 0 < t5["ref_minus_random_lo"] <= 0.21 <= t5["ref_minus_random_hi"] <= 0.22
    assert "above random 0.015" in t5["band_reason"]
    none = decoupling_D(_cell(None), n_boot=200).set_index("condition").loc["T5"]
    assert none["status"] == "in band" and none["reference_check"] == "untested"
    assert "untested: no 'random' row" in none["band_reason"]


def test_point_and_interval_come_from_the_same_paired_images():
    # reference on i0..i3, T5 on i2..i5: shared i2, i3 where T5 = reference + 0.05; on its own
    # images i4, i5 T5 is far higher, so its own mean is 0.5875 vs the reference's 0.40
    ref = _row("reference", 0, IDS[:4], [0.4] * 4, [0.2] * 4)
    t5 = _row("T5", 0, IDS[2:6], [0.45, 0.45, 0.725, 0.725], [0.21, 0.21, 0.5, 0.5])
    D = decoupling_D(pd.DataFrame([ref, t5]), n_boot=200).set_index("condition").loc["T5"]
    assert D["miou"] - D["miou_ref"] == pytest.approx(0.1875)            # the rows' own means differ
    assert D["D_pp"] == pytest.approx(5.0)                                # D over the paired images
    assert (D["D_pp_lo"], D["D_pp_hi"]) == pytest.approx((5.0, 5.0))
    assert D["delta_idauc"] == pytest.approx(0.01) and D["n_paired_images"] == 2


def test_no_shared_images_is_undefined_with_a_reason():
    ref = _row("reference", 0, IDS[:4], [0.4] * 4, [0.2] * 4)
    t5 = _row("T5", 0, IDS[4:], [0.45] * 4, [0.21] * 4)
    D = decoupling_D(pd.DataFrame([ref, t5]), n_boot=200).set_index("condition").loc["T5"]
    assert D["status"] == "undefined" and D["n_paired_images"] == 0
    assert math.isnan(D["D_pp"]) and math.isnan(D["delta_idauc"]) and pd.isna(D["in_band"])
    assert "no image" in D["band_reason"] and "in common" in D["band_reason"]


def test_seed_interval_is_t_based():
    # three seeds, per-image differences constant within a seed: the image component is 0 and
    # the interval is mean ± t_{2, 0.975}·s/√3 (the percentile bootstrap gives about [min, max])
    ref = _row("reference", 0, IDS, REF_M, REF_I)
    shifts = [0.0, 0.01, 0.05]
    rows = [ref] + [_row("T5", s, IDS, REF_M + 0.02, REF_I + d) for s, d in enumerate(shifts)]
    D = decoupling_D(pd.DataFrame(rows), n_boot=400).set_index("condition").loc["T5"]
    mean, sd = np.mean(shifts), np.std(shifts, ddof=1)
    half = student_t.ppf(0.975, 2) * sd / math.sqrt(3)
    assert D["delta_idauc"] == pytest.approx(mean)
    assert D["delta_idauc_lo"] == pytest.approx(mean - half, abs=1e-12)
    assert D["delta_idauc_hi"] == pytest.approx(mean + half, abs=1e-12)
    assert D["ci_method"].startswith("t over 3 seeds")
    # per seed, for a notebook to print
    assert D["D_pp_by_seed"] == "seed 0: +2.00, seed 1: +2.00, seed 2: +2.00"
    per = decoupling_D(pd.DataFrame(rows), n_boot=100, per_seed=True)
    assert per[per.condition == "T5"].sort_values("seed")["delta_idauc"].tolist() == pytest.approx(shifts)


def test_seed_image_interval_with_both_components_matches_the_formula():
    rng = np.random.default_rng(0)
    n = 200
    x = rng.normal(0.0, 0.3, n)[None, :] + np.array([[0.0], [0.1]])      # 2 seeds, shared image effects
    r = seed_image_interval(x, n_boot=4000, alpha=0.05, seed=1)
    d = x.mean(axis=1)
    a = d.var(ddof=1) / 2
    ebar = x.mean(axis=0)
    # the bootstrap variance of a mean over images ≈ (n−1)/n · s²/n (a known property)
    assert r.var_images == pytest.approx((n - 1) / n * ebar.var(ddof=1) / n, rel=0.1)
    df = (a + r.var_images) ** 2 / (a ** 2 / 1 + r.var_images ** 2 / (n - 1))
    half = student_t.ppf(0.975, df) * math.sqrt(a + r.var_images)
    assert r.var_seeds == pytest.approx(a) and r.df == pytest.approx(df)
    assert (r.lo, r.hi) == pytest.approx((d.mean() - half, d.mean() + half))


def test_rows_of_two_checkpoints_are_never_mixed():
    ref = _row("reference", 0, IDS, REF_M, REF_I)
    t5a = _row("T5", 0, IDS, REF_M + 0.03, REF_I)
    t5b = dict(_row("T5", 1, IDS, REF_M - 0.10, REF_I - 0.05), checkpoint_id="ck-b")   # a fresh fine-tune
    D = decoupling_D(pd.DataFrame([ref, t5a, t5b]), by=["dataset", "backbone", "depth", "budget"], n_boot=200)
    t5 = D[D.condition == "T5"].set_index("checkpoint_id")
    assert len(t5) == 2
    assert t5.loc["ck-a", "D_pp"] == pytest.approx(3.0) and t5.loc["ck-a", "n_seeds"] == 1
    assert t5.loc["ck-b", "status"] == "no reference" and math.isnan(t5.loc["ck-b", "D_pp"])
    assert "checkpoint_id=ck-b" in t5.loc["ck-b", "band_reason"]
    assert "checkpoint_id=ck-a" in t5.loc["ck-b", "band_reason"]
    # same checkpoint id, other weights (a digest differs): no reference either
    t5c = dict(t5a, weights_digest="bbb")
    D2 = decoupling_D(pd.DataFrame([dict(ref, weights_digest="aaa"), dict(t5a, weights_digest="aaa"), t5c]),
                      n_boot=200)
    by_digest = D2[D2.condition == "T5"].set_index("weights_digest")
    assert by_digest.loc["aaa", "status"] == "in band" and by_digest.loc["bbb", "status"] == "no reference"


def test_findings_do_not_count_an_uninformative_band():
    t = _cell([0.1, -0.1] * 4)
    f = paper_findings(t, n_boot=200).set_index("finding")
    assert f.loc["t5_gain_in_band", "holds"] == "uninformative"
    assert "not above random" in f.loc["t5_gain_in_band", "evidence"]
    # the regime finding has no informative T5 cell left either
    assert f.loc["fades_deep", "holds"] == f.loc["fades_loose", "holds"] == "uninformative"
    text = findings_paragraph(f.reset_index())
    assert "0 of the paper's 6 findings hold" in text and "3 are uninformative" in text
    ok = paper_findings(_cell([0.20, 0.22] * 4), n_boot=200).set_index("finding")
    assert ok.loc["t5_gain_in_band", "holds"] is True


def test_aggregate_seeds_never_averages_two_checkpoints():
    """aggregate_seeds with a ``by`` that omits the checkpoint still keeps checkpoints apart."""
    from midas_nb.results import aggregate_seeds

    a = _row("T5", 0, IDS, REF_M, REF_I)
    b = dict(_row("T5", 1, IDS, REF_M + 0.2, REF_I), checkpoint_id="ck-b")
    agg = aggregate_seeds(pd.DataFrame([a, b]), by=["dataset", "backbone", "condition"], metrics=("miou",),
                          n_boot=50).set_index("checkpoint_id")
    assert agg.loc["ck-a", "miou_mean"] == pytest.approx(0.40) and agg.loc["ck-b", "miou_mean"] == pytest.approx(0.60)
    assert (agg["n_seeds"] == 1).all()


def test_a_seedless_row_against_a_control_with_two_seeds_is_the_negative_of_its_d():
    """Notebook 02's "D vs random_map": the T0 reference (seed 0 only) against a control with
    seeds 0 and 1 used to be paired with seed 0 alone (+7.05 pp where −D(random_map) = +2.21 on
    FGVC-Aircraft). Hand-computed: control mIoU 0.30 (seed 0) and 0.36 (seed 1) on every image,
    reference 0.40 → D(reference vs control) = 0.40 − 0.33 = +7 pp = −D(control vs reference)."""
    rows = [_row("reference", 0, IDS, REF_M, REF_I),
            _row("random_map", 0, IDS, np.full(8, 0.30), REF_I),
            _row("random_map", 1, IDS, np.full(8, 0.36), REF_I)]
    t = pd.DataFrame(rows)
    vs_control = decoupling_D(t, reference="random_map", n_boot=200).set_index("condition")
    vs_reference = decoupling_D(t, n_boot=200).set_index("condition")
    assert vs_control.loc["reference", "D_pp"] == pytest.approx(7.0)
    assert vs_reference.loc["random_map", "D_pp"] == pytest.approx(-7.0)
    assert not bool(vs_control.loc["reference", "ref_paired"])
    # the interval mirrors too: the control's seed spread (0.30 vs 0.36) is in both
    assert vs_control.loc["reference", "D_pp_lo"] == pytest.approx(-vs_reference.loc["random_map", "D_pp_hi"])
    assert vs_control.loc["reference", "D_pp_hi"] == pytest.approx(-vs_reference.loc["random_map", "D_pp_lo"])
    assert vs_control.loc["reference", "D_pp_lo"] < 0 < vs_control.loc["reference", "D_pp_hi"]
    # one row per results row keeps the same-seed pairing: 0.40 − 0.30
    per = decoupling_D(t, reference="random_map", n_boot=200, per_seed=True).set_index("condition")
    assert per.loc["reference", "D_pp"] == pytest.approx(10.0)


def test_a_two_seed_interval_stays_inside_the_range_of_a_difference():
    """Two seeds that disagree (ν = 1, t = 12.7) gave "+1.89 [−147.53, +151.30]" pp on
    FGVC-Aircraft: the interval is cut at ±100 pp, the point stays the seeds' mean."""
    rows = [_row("reference", 0, IDS, REF_M, REF_I),
            _row("T5", 0, IDS, REF_M - 0.30, REF_I), _row("T5", 1, IDS, REF_M + 0.50, REF_I)]
    D = decoupling_D(pd.DataFrame(rows), n_boot=200).set_index("condition").loc["T5"]
    assert D["D_pp"] == pytest.approx(10.0)
    half = student_t.ppf(0.975, 1) * 40.0 / math.sqrt(2) * math.sqrt(2)   # s = 56.57, S = 2
    assert 10.0 - half < -100 and 10.0 + half > 100                      # what the t-interval gives
    assert (D["D_pp_lo"], D["D_pp_hi"]) == (-100.0, 100.0)


def test_the_parity_band_is_one_constant(monkeypatch):
    """ΔIDAUC = −0.02 on every image is outside the band of 0.01 and inside one of 0.03: changing
    PARITY_BAND alone (no band passed anywhere) changes decoupling_D's verdict and the T5 finding's."""
    from midas_nb.metrics import decoupling as dec
    rows = pd.DataFrame([_row("reference", 0, IDS, REF_M, REF_I), _row("T5", 0, IDS, REF_M + 0.03, REF_I - 0.02)])
    t5 = lambda: decoupling_D(rows, n_boot=200).set_index("condition").loc["T5", "status"]  # noqa: E731
    find = lambda: paper_findings(rows, n_boot=200).set_index("finding").loc["t5_gain_in_band", "holds"]  # noqa: E731
    assert dec.PARITY_BAND == 0.01 and t5() == "outside band" and find() is False
    monkeypatch.setattr(dec, "PARITY_BAND", 0.03)
    assert t5() == "in band" and find() is True


def test_every_band_verdict_states_what_its_sample_resolves():
    """ΔIDAUC = −0.01 ± 0.02 alternating over 8 images: the interval straddles −0.01 (not resolved) and its
    half-width — what this sample can tell from the band's edge — is printed beside the verdict."""
    from midas_nb.metrics import band_resolution
    rows = pd.DataFrame([_row("reference", 0, IDS, REF_M, REF_I),
                         _row("T5", 0, IDS, REF_M + 0.03, REF_I - 0.01 + np.array([0.02, -0.02] * 4))])
    t5 = decoupling_D(rows, n_boot=500).set_index("condition").loc["T5"]
    h = (t5["delta_idauc_hi"] - t5["delta_idauc_lo"]) / 2
    assert t5["status"] == "not resolved" and 0.005 < h < 0.02
    assert band_resolution(t5["delta_idauc_lo"], t5["delta_idauc_hi"]) == f"this sample resolves |ΔIDAUC| ≥ {h:.3f}"
    assert t5["D_cell"] == f"+3.00 (band not resolved: this sample resolves |ΔIDAUC| ≥ {h:.3f})"
    ev = paper_findings(rows, n_boot=500).set_index("finding").loc["t5_gain_in_band", "evidence"]
    assert "not resolved (this sample resolves |ΔIDAUC| ≥" in ev
    assert band_resolution(float("nan"), 0.1) == ""
    from midas_nb.results import band_checks        # the line notebook 02 prints under its D table
    assert band_checks(decoupling_D(rows, n_boot=500)).endswith(f"this sample resolves |ΔIDAUC| ≥ {h:.3f} (T5): "
                                                               "the ΔIDAUC intervals' half-widths, the band verdicts "
                                                               "cannot tell less")
