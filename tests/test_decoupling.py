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


def test_the_interval_over_builds_widens_with_their_spread_and_is_todays_with_one_build():
    """Builds → seeds → images (decision 0072): with one build the interval is the seeds × images
    one exactly; with B builds, the t interval of the B build means plus the shared images' variance
    (Cochran's ultimate-cluster estimator), so it widens as the builds move apart."""
    rng = np.random.default_rng(3)
    img = rng.normal(0.0, 0.2, 60)                        # image effects shared by every row
    seeds = np.array([0.0, 0.02, 0.01, 0.03, -0.01, 0.0])  # six rows: 3 builds × 2 seeds
    builds = [0, 0, 1, 1, 2, 2]
    one = seed_image_interval(img + seeds[:, None], n_boot=500, seed=2)
    same = seed_image_interval(img + seeds[:, None], n_boot=500, seed=2, builds=[7] * 6)
    assert (same.lo, same.hi, same.method) == (one.lo, one.hi, one.method)
    widths = []
    for spread in (0.0, 0.05, 0.2):
        x = img + (seeds + spread * np.repeat([-1.0, 0.0, 1.0], 2))[:, None]
        r = seed_image_interval(x, n_boot=500, seed=2, builds=builds)
        m = np.array([x[:2].mean(), x[2:4].mean(), x[4:].mean()])   # each build's mean over seeds and images
        a = m.var(ddof=1) / 3
        df = (a + r.var_images) ** 2 / (a ** 2 / 2 + r.var_images ** 2 / 59)
        half = student_t.ppf(0.975, df) * math.sqrt(a + r.var_images)
        assert r.per_build == pytest.approx(tuple(m)) and r.mean == pytest.approx(m.mean())
        assert r.var_seeds == pytest.approx(a) and (r.lo, r.hi) == pytest.approx((m.mean() - half, m.mean() + half))
        assert r.method.startswith("t over 3 builds")
        widths.append(r.hi - r.lo)
    assert widths[0] < widths[1] < widths[2]
    with pytest.raises(ValueError, match="one build per row"):
        seed_image_interval(img[None, :], builds=[0, 1])


def _builds(shifts, seeds=(0, 1)) -> pd.DataFrame:
    """reference and T5 rows of one cell for each build b (its own checkpoint), T5's mIoU gain 0.03 + shifts[b]."""
    rows = []
    for b, sh in enumerate(shifts):
        own = dict(build=b, checkpoint_id=f"ck-{b}", weights_digest=f"w{b}")
        for s in seeds:
            rows += [_row("reference", s, IDS, REF_M, REF_I, **own),
                     _row("T5", s, IDS, REF_M + 0.03 + sh + 0.002 * s, REF_I + 0.002, **own)]
    return pd.DataFrame(rows)


def test_decoupling_pools_the_builds_of_a_cell_and_shows_each_builds_d():
    one = decoupling_D(_builds([0.0]), n_boot=200).set_index("condition").loc["T5"]
    assert one["n_builds"] == 1 and one["D_pp_by_build"] == "build 0: +3.10"
    t5 = decoupling_D(_builds([0.0, 0.02, -0.01]), n_boot=200).set_index("condition").loc["T5"]
    assert t5["n_builds"] == 3 and t5["n_seeds"] == 6 and t5["checkpoint_id"] == "ck-0"
    assert t5["D_pp_by_build"] == "build 0: +3.10, build 1: +5.10, build 2: +2.10"
    m = np.array([3.1, 5.1, 2.1])
    half = student_t.ppf(0.975, 2) * m.std(ddof=1) / math.sqrt(3)   # images add nothing: constant differences
    assert t5["D_pp"] == pytest.approx(m.mean())
    assert (t5["D_pp_lo"], t5["D_pp_hi"]) == pytest.approx((m.mean() - half, m.mean() + half))
    assert t5["D_pp_hi"] - t5["D_pp_lo"] > 2 * (one["D_pp_hi"] - one["D_pp_lo"])
    assert "seed 0 (build 2): +2.00" in t5["D_pp_by_seed"]
    # without the build column the three checkpoints stay three cells (decision 0051)
    assert len(decoupling_D(_builds([0.0, 0.02, -0.01]).drop(columns="build"), n_boot=50).query("condition == 'T5'")) == 3
    two = _builds([0.0, 0.02]).assign(build=0)                      # two checkpoints filed as one build
    with pytest.raises(ValueError, match="build 0 of cell .* 2 checkpoints"):
        decoupling_D(two, n_boot=50)
    # aggregate_seeds pools the builds the same way (the lowest build's checkpoint shown)
    from midas_nb.results import aggregate_seeds
    agg = aggregate_seeds(_builds([0.0, 0.02, -0.01]), by=["dataset", "condition"], metrics=("miou",), n_boot=50)
    t5 = agg.set_index("condition").loc["T5"]
    assert t5["n_seeds"] == 6 and t5["checkpoint_id"] == "ck-0" and t5["ci_method"].startswith("t over 3 builds")
    with pytest.raises(ValueError, match="two checkpoints"):
        aggregate_seeds(two, by=["dataset", "condition"], metrics=("miou",), n_boot=50)


def test_regime_cells_of_one_build_borrow_the_build_spread_of_the_point():
    """Decision 0072: with 3 builds at (L=6, b=25 %) (D(T5) 5, 7, 9 pp) and the regime's other cells on
    build 0 alone (L=3: 8 pp, L=9: 4 pp, exact), fades_deep holds on the cells' own intervals but is not
    resolved once each one-build cell's interval borrows t_2 · sd = 4.30 · 2 pp."""
    def at(depth, builds, gains):
        rows = []
        for b, g in zip(builds, gains):
            own = dict(build=b, checkpoint_id=f"ck-{b}", weights_digest=f"w{b}", depth=depth)
            for s in ((0, 1) if len(builds) > 1 else (0,)):
                rows += [_row("reference", s, IDS, REF_M, REF_I, **own), _row("T5", s, IDS, REF_M + g, REF_I, **own)]
        return rows
    rows = pd.DataFrame(at(6, [0, 1, 2], [0.05, 0.07, 0.09]) + at(3, [0], [0.08]) + at(9, [0], [0.04]))
    f = paper_findings(rows, depth=6, budget=0.25, n_boot=100).set_index("finding")
    assert f.loc["fades_deep", "holds"] == "not resolved" and f.loc["fades_deep", "n_builds"] == 1
    assert "borrow the build spread" in f.loc["fades_deep", "evidence"] and "over 3 builds 2.00 pp" in \
        f.loc["fades_deep", "evidence"]
    assert f.loc["t5_gain_in_band", "n_builds"] == 3
    # build 0 alone (5 pp at the point): nothing to borrow, and the same cells say it fades
    one = paper_findings(rows[rows["build"] == 0], depth=6, budget=0.25, n_boot=100).set_index("finding")
    assert one.loc["fades_deep", "holds"] is True and "borrow" not in one.loc["fades_deep", "evidence"]
    # notebook 02's table: three builds at the point and no cell of one build (a quick run crashed on it)
    point = paper_findings(rows[rows["depth"] == 6], depth=6, budget=0.25, n_boot=100).set_index("finding")
    assert point.loc["t5_gain_in_band", "n_builds"] == 3 and "borrow" not in point.loc["t5_gain_in_band", "evidence"]


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
    # ... because no signature carries a band of its own: every parameter named *band* defaults to None
    import ast, pathlib
    for path in pathlib.Path(dec.__file__).parents[1].rglob("*.py"):
        for fn in (n for n in ast.walk(ast.parse(path.read_text())) if isinstance(n, ast.FunctionDef)):
            a = fn.args.posonlyargs + fn.args.args
            pairs = [*zip(a[len(a) - len(fn.args.defaults):], fn.args.defaults),
                     *zip(fn.args.kwonlyargs, fn.args.kw_defaults)]
            assert all(d is None or isinstance(d, ast.Constant) and d.value is None
                       for x, d in pairs if "band" in x.arg), \
                f"{path}: {fn.name}"


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
    from midas_nb.results import band_checks        # the line notebook 02 prints under its D table, h of band_rule
    assert band_checks(decoupling_D(rows, n_boot=500)).endswith(f"this sample resolves |ΔIDAUC| ≥ {h:.3f} (T5)")


def test_a_protocol_row_stored_without_its_build_is_shown_and_grouped_as_build_0():
    """Issue 52: notebook 02's table carried NaN in ``build`` for build 0's rows (cells of build 0 have no build
    parameter), so its per-build index was empty there; Study.protocol gives every row an integer build."""
    from midas_nb.study.core import with_builds
    t = pd.DataFrame(dict(condition=["T5", "T5", "T5"], build=[np.nan, 1.0, 2.0]))
    assert with_builds(t)["build"].tolist() == [0, 1, 2] and with_builds(t)["build"].dtype.kind == "i"
    assert with_builds(t.drop(columns="build"))["build"].tolist() == [0, 0, 0]    # rows from before builds
