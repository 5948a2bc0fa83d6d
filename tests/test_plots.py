"""Figures of :mod:`midas_nb.viz` on small hand-made inputs.

Each figure function must return a Figure with labelled axes, write ``<notebook>_<name>.png``
into the output directory, and draw what its inputs say (checked on the artists).
"""
from __future__ import annotations

import math
import warnings
from types import SimpleNamespace

import matplotlib

matplotlib.use("Agg")

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.figure import Figure

from midas_nb import viz


@pytest.fixture(autouse=True)
def out_dir(tmp_path):
    d = viz.set_output("99_test", tmp_path)
    yield d
    viz.set_output(None, None)


def _labelled(fig: Figure) -> list:
    """Visible axes with both axis labels (colour-bar axes excluded)."""
    return [ax for ax in fig.axes if ax.get_visible() and ax.get_xlabel() and ax.get_ylabel()]


def _png(out_dir, name):
    p = out_dir / f"99_test_{name}.png"
    assert p.is_file() and p.stat().st_size > 2000, p
    return p


def _batch(B=2, H=32, p=8):
    g = H // p
    images = torch.randn(B, 3, H, H)
    parts = torch.zeros(B, 3, 3)
    parts[0, 0] = torch.tensor([3.0, 3.0, 1.0])       # patch (0, 0) -> token 0
    parts[0, 1] = torch.tensor([20.0, 28.0, 1.0])     # patch (3, 2) -> token 14
    parts[1, 2] = torch.tensor([12.0, 12.0, 1.0])     # patch (1, 1) -> token 5
    part_mask = torch.zeros(B, g * g, dtype=torch.bool)
    part_mask[0, [0, 14]] = True
    part_mask[1, 5] = True
    boxes = torch.tensor([[0.0, 0.0, 24.0, 32.0], [8.0, 8.0, 16.0, 16.0]])[:B]
    return SimpleNamespace(images=images, labels=torch.tensor([0, 1])[:B], parts=parts, boxes=boxes,
                           part_mask=part_mask, box_mask=part_mask.clone(), image_ids=["a", "b"][:B],
                           indices=torch.arange(B))


def test_figure_path_uses_notebook_prefix(out_dir):
    assert viz.figure_path("x") == out_dir / "99_test_x.png"
    with pytest.raises(ValueError, match="plain file stem"):
        viz.figure_path("a/b")
    path = viz.save_csv(pd.DataFrame({"a": [1, 2]}), "tab")
    assert path == out_dir / "99_test_tab.csv"
    assert pd.read_csv(path)["a"].tolist() == [1, 2]


def test_image_to_rgb_undoes_normalisation():
    mean, std = (0.5, 0.4, 0.3), (0.2, 0.1, 0.25)
    rgb = np.random.default_rng(0).uniform(0.1, 0.9, size=(4, 5, 3))
    x = (torch.tensor(rgb).permute(2, 0, 1) - torch.tensor(mean)[:, None, None]) / torch.tensor(std)[:, None, None]
    np.testing.assert_allclose(viz.image_to_rgb(x, (mean, std)), rgb, atol=1e-6)
    mm = viz.image_to_rgb(x)
    assert mm.min() == pytest.approx(0.0) and mm.max() == pytest.approx(1.0)


def test_show_parts_on_grid(out_dir):
    b = _batch()
    fig = viz.show_parts_on_grid(b, patch_size=8, n=2, class_names=["gull", "wren"], save="parts")
    assert isinstance(fig, Figure)
    assert _labelled(fig), "no labelled axes"
    _png(out_dir, "parts")
    ax0, ax1 = fig.axes[0], fig.axes[1]
    # 2 part patches + 1 box on image 0, 1 + 1 on image 1
    assert len(ax0.patches) == 3 and len(ax1.patches) == 2
    # keypoints drawn: image 0 shows exactly its two visible keypoints
    offsets = ax0.collections[-1].get_offsets()      # drawn over the patch grid's lines
    np.testing.assert_allclose(np.asarray(offsets), [[3.0, 3.0], [20.0, 28.0]])
    assert "gull" in ax0.get_title() and "part patches: 2 of 16" in ax0.get_title()


def test_target_heatmaps_rank_normalised(out_dir):
    B, N = 2, 16
    images = torch.randn(B, 3, 32, 32)
    t0 = torch.arange(N, dtype=torch.float32).repeat(B, 1)          # rank = position
    t5 = -t0 * 1000.0                                               # reversed, other units
    fig = viz.target_heatmaps(images, {"T0": t0, "T5": t5}, grid=(4, 4), save="targets")
    _png(out_dir, "targets")
    axes = [a for a in fig.axes if a.get_visible()]
    # rows = images, cols = photo + targets; + one colour bar
    assert len(axes) == B * 3 + 1
    cbar = axes[-1]
    # issue 52: "kept first" mislabelled maps that prune nothing (06's LaSt Patch Score); the bar says what it is
    assert cbar.get_ylabel() == "rank percentile within the image (1 = its highest score)"
    heat_t0 = axes[1].images[-1].get_array()
    heat_t5 = axes[2].images[-1].get_array()
    np.testing.assert_allclose(heat_t0.ravel(), np.arange(N) / (N - 1))
    np.testing.assert_allclose(heat_t5.ravel(), 1 - np.arange(N) / (N - 1))
    assert axes[1].get_title() == "T0" and axes[0].get_ylabel() == "image 0"
    with pytest.raises(ValueError, match="does not hold"):
        viz.target_heatmaps(images, {"T0": t0}, grid=(3, 3))


def test_target_heatmaps_selects_rows_by_indices(out_dir):
    images = torch.randn(2, 3, 16, 16)
    split_maps = {"T1": torch.stack([torch.arange(4.0), -torch.arange(4.0), torch.arange(4.0).flip(0)])}
    fig = viz.target_heatmaps(images, split_maps, grid=(2, 2), indices=torch.tensor([1, 2]),
                                normalize="minmax")
    heat = [a for a in fig.axes if a.get_visible()]
    np.testing.assert_allclose(heat[1].images[-1].get_array().ravel(), [1.0, 2 / 3, 1 / 3, 0.0])
    np.testing.assert_allclose(heat[3].images[-1].get_array().ravel(), [1.0, 2 / 3, 1 / 3, 0.0])
    assert "min–max" in heat[-1].get_ylabel()


def test_cosine_depth_lines(out_dir):
    df = pd.DataFrame(dict(depth=[1, 2, 3, 1, 2, 3], hidden=["T5"] * 3 + ["T4"] * 3, attention=["T3"] * 6,
                           cosine=[0.1, 0.05, -0.02, 0.3, 0.2, 0.1], lo=[0.0] * 6, hi=[0.4] * 6))
    fig = viz.cosine_depth_lines(df, save="cosdepth")
    _png(out_dir, "cosdepth")
    ax = fig.axes[0]
    assert ax.get_xlabel().startswith("depth L") and ax.get_ylabel() == "mean per-image rank cosine (Spearman ρ)"
    lines = {l.get_label(): l for l in ax.get_lines() if not l.get_label().startswith("_")}
    assert set(lines) == {"T5 vs T3", "T4 vs T3"}
    np.testing.assert_allclose(lines["T5 vs T3"].get_ydata(), [0.1, 0.05, -0.02])
    # issue 52: tab10 by position gave a pair the colour another figure gives another target; a pair is in
    # its hidden-gradient target's colour
    from matplotlib.colors import to_hex
    assert to_hex(lines["T5 vs T3"].get_color()) == viz.condition_color("T5")
    assert to_hex(lines["T4 vs T3"].get_color()) == viz.condition_color("T4")


def test_taxonomy_table():
    t = viz.taxonomy_table()
    assert list(t.index) == ["T0", "T1", "T2", "T3", "T4", "T5"]
    assert {"source", "operator", "definition (patch token j)"} <= set(t.columns)
    assert t.loc["T5", "source"] == "hidden state" and t.loc["T0", "source"] == "attention"
    assert t.loc["T3", "gradient of"] == "logit y_c" and t.loc["T2", "gradient of"] == "loss ℓ"
    full = viz.taxonomy_table(related=True)
    assert {"rollout", "tokentm", "last_votes", "random"} <= set(full.index)


def _protocol_table():
    rows = []
    for seed in (0, 1):
        for cond, m, i in (("reference", 0.30, 0.20), ("unsupervised", 0.28, 0.215), ("T1", 0.22, 0.21),
                           ("T5", 0.35, 0.205 - 0.02 * seed)):
            rows.append(dict(condition=cond, seed=seed, miou=m + 0.01 * seed, miou_lo=m - 0.02, miou_hi=m + 0.03,
                             idauc=i, idauc_lo=i - 0.01, idauc_hi=i + 0.01, coverage_kind="part mIoU"))
    return pd.DataFrame(rows)


def test_coverage_vs_faithfulness(out_dir):
    table = _protocol_table()
    fig = viz.coverage_vs_faithfulness(table, save="scatter")
    _png(out_dir, "scatter")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "part mIoU (fraction)"                    # the unit of the tables (issue 52)
    assert ax.get_ylabel() == "insertion − deletion AUC"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert {"reference", "unsupervised", "T1", "T5"} <= set(labels)
    assert any(lbl.startswith("parity band") for lbl in labels)
    # the band starts at IDAUC_ref − 0.01 = 0.19
    span = [p for p in ax.patches if p.get_label().startswith("parity band")][0]
    assert span.get_y() == pytest.approx(0.19)
    # points are seed means, fractions as in the tables: T5 mIoU = (0.35 + 0.36) / 2
    xs = {t.get_text(): t.xy[0] for t in ax.texts}
    assert xs["T5"] == pytest.approx(0.355)
    box = viz.coverage_vs_faithfulness(table.assign(coverage_kind="box coverage"))
    assert box.axes[0].get_xlabel() == "box coverage (fraction)"
    with pytest.raises(ValueError, match="missing column"):
        viz.coverage_vs_faithfulness(table.drop(columns=["idauc"]))


def test_cosine_heatmap(out_dir):
    ids = ["T0", "T3", "T5"]
    m = pd.DataFrame([[1.0, 0.4, 0.05], [0.4, 1.0, 0.08], [0.05, 0.08, 1.0]], index=ids, columns=ids)
    fig = viz.cosine_heatmap(m, highlight=("T5", "T3"), lo=m - 0.01, hi=m + 0.01, save="cosine")
    _png(out_dir, "cosine")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "target" and ax.get_ylabel() == "target"
    assert "cos(T5, T3) = 0.080 [0.070, 0.090]" in ax.get_title()
    assert len(ax.patches) == 2                      # both symmetric cells framed
    assert sorted(t.get_text() for t in ax.texts).count("1.00") == 3
    # issue 52: the colour bar said "cosine similarity" of ranks; it names what cosine_matrix computed
    assert fig.axes[1].get_ylabel() == "mean per-image rank cosine (Spearman ρ)"
    assert ax.get_title().startswith("Rank cosine (Spearman ρ) of target maps")
    from midas_nb.metrics.probes import cosine_matrix
    raw = cosine_matrix({"a": np.array([[1.0, 2.0, 4.0]]), "b": np.array([[2.0, 1.0, 3.0]])}, mode="raw", bootstrap=0)[0]
    assert viz.cosine_heatmap(raw, highlight=None).axes[1].get_ylabel() == "mean per-image cosine of raw maps"
    none = viz.cosine_heatmap(m, highlight=("T5", "T9"))
    assert len(none.axes[0].patches) == 0


def _d_table():
    rows = []
    for cond in ("reference", "T1", "T5"):
        for depth in (1, 2, 3):
            for budget in (0.25, 0.5):
                d = 0.0 if cond == "reference" else (2.0 * depth if cond == "T5" else -3.0)
                inb = not (cond == "T5" and depth == 3 and budget == 0.5)
                rows.append(dict(condition=cond, depth=depth, budget=budget, D_pp=d, D_pp_std=0.5,
                                 in_band=inb))
    return pd.DataFrame(rows)


def test_regime_heatmap_marks_band(out_dir):
    fig = viz.regime_heatmap(_d_table(), save="regime")
    _png(out_dir, "regime")
    panels = [a for a in fig.axes if a.get_title() in ("T1", "T5")]
    assert [a.get_title() for a in panels] == ["T1", "T5"]
    for a in panels:
        assert a.get_xlabel().startswith("budget b") and a.get_ylabel().startswith("depth L")
    t5 = panels[1]
    texts = [t.get_text() for t in t5.texts]
    assert texts.count("✗ (+6.0)") == 1                      # the one outside-band cell
    assert sum(t.endswith("✓") for t in texts) == 5
    assert "+4.0 ✓" in texts
    # colour only in-band cells: the out-of-band cell (depth 3 -> row 2, budget 0.5 -> col 1) is masked
    arr = t5.images[0].get_array()
    assert np.ma.is_masked(arr[2, 1]) and float(arr[0, 0]) == pytest.approx(2.0)
    assert [t.get_text() for t in t5.get_xticklabels()] == ["25%", "50%"]
    assert "pp" in fig.axes[-1].get_ylabel()


def test_regime_heatmap_labels_cells_not_run():
    cross = _d_table()
    cross = cross[~((cross["depth"] == 1) & (cross["budget"] == 0.5))]
    fig = viz.regime_heatmap(cross)
    t5 = [a for a in fig.axes if a.get_title() == "T5"][0]
    notrun = [t for t in t5.texts if t.get_text() == "not run"]
    assert len(notrun) == 1 and notrun[0].get_position() == (1, 0)      # column budget 0.5, row depth 1


def test_regime_lines(out_dir):
    fig = viz.regime_lines(_d_table(), x="depth", hue="budget", save="lines")
    _png(out_dir, "lines")
    t5 = [a for a in fig.axes if a.get_title() == "T5"][0]
    assert t5.get_xlabel().startswith("depth L")
    # exactly one T5 point (depth 3, budget 50%) is outside the band, drawn as an x
    out = [c for c in t5.collections if c.get_gid() == "outside band"]
    inb = [c for c in t5.collections if c.get_gid() == "in band"]
    np.testing.assert_allclose(np.concatenate([c.get_offsets() for c in out]), [[3.0, 6.0]])
    assert sum(len(c.get_offsets()) for c in inb) == 5
    assert _labelled(fig)
    labels = [t.get_text() for t in fig.legends[0].get_texts()]
    assert "budget = 25%" in labels and "outside band" in labels


def test_scale_plot(out_dir):
    rows = []
    for bb, d5 in (("small", 3.0), ("wide", -1.0)):
        for cond, d, inb in (("reference", 0.0, True), ("T5", d5, bb == "small"), ("T1", -4.0, True)):
            rows.append(dict(backbone=bb, condition=cond, D_pp=d, in_band=inb))
    fig = viz.scale_plot(pd.DataFrame(rows), save="scale")
    _png(out_dir, "scale")
    ax = fig.axes[0]
    assert ax.get_xlabel() == "backbone" and "pp" in ax.get_ylabel()
    heights = sorted(round(p.get_height(), 6) for p in ax.patches if hasattr(p, "get_height"))
    assert heights == sorted([3.0, -1.0, -4.0, -4.0])
    assert [t.get_text() for t in ax.get_xticklabels()] == ["small", "wide"]
    # issue 52: the legend ("best" place inside the axes) covered a bar in 05; it now lies right of the axes
    renderer = _renderer(fig)
    assert ax.get_legend().get_window_extent(renderer).x0 >= ax.get_window_extent(renderer).x1


def test_one_colour_per_meaning():
    """Issue 52: the budget and the depth shared viridis (04's two line plots); part patches were cyan in
    01's heatmaps, the box's colour in 00; T0 (the reference's ranking) was blue, the reference black."""
    from matplotlib.colors import to_hex
    budget = viz.regime_lines(_d_table(), x="depth", hue="budget")
    depth = viz.regime_lines(_d_table(), x="budget", hue="depth")
    first = [to_hex(f.axes[0].get_lines()[0].get_color()) for f in (budget, depth)]
    assert first[0] != first[1], first
    assert viz.common.AXIS_CMAPS["budget"] != viz.common.AXIS_CMAPS["depth"]
    maps = {"T5": torch.rand(1, 16)}
    parts = torch.zeros(1, 16, dtype=torch.bool)
    parts[0, :3] = True
    fig = viz.target_heatmaps(torch.rand(1, 3, 32, 32), maps, grid=(4, 4), part_mask=parts)
    outline = [c for a in fig.axes for c in a.collections if c.get_gid() == "part outline"]
    assert outline and to_hex(outline[0].get_colors()[0]) == to_hex(viz.common.PART_COLOR) != to_hex(viz.common.BOX_COLOR)
    assert viz.condition_color("T0") == viz.condition_color("reference")
    # the parity band was tab:green, T2's colour, in the scatter that shows T2 (02, 06)
    rows = [dict(condition=c, seed=0, miou=0.3, idauc=0.2) for c in ("reference", "T2", "T5")]
    ax = viz.coverage_vs_faithfulness(pd.DataFrame(rows)).axes[0]
    band = [p for p in ax.patches if p.get_label().startswith("parity band")][0]
    band_rgb = to_hex(band.get_facecolor(), keep_alpha=False)
    assert band_rgb not in {to_hex(c) for c in viz.CONDITION_COLORS.values()} | set(viz.common.FALLBACK_PALETTE)


def test_points_at_one_spot_stay_visible():
    """Issue 52: the five supervised points of 02's and 06's scatters hid each other (filled markers, no
    labels beyond six conditions). Markers are hollow and each of up to ten conditions is labelled; T1–T5
    at one and the same point get five labels whose boxes do not overlap, each pointing at that point."""
    rows = [dict(condition=c, seed=0, miou=0.30 if c[0] == "T" else 0.1 + 0.05 * k,
                 idauc=0.20 if c[0] == "T" else 0.1 + 0.02 * k, coverage_kind="part mIoU")
            for k, c in enumerate(["reference", "unsupervised", "T1", "T2", "T3", "T4", "T5", "random_map"])]
    fig = viz.coverage_vs_faithfulness(pd.DataFrame(rows))
    ax, renderer = fig.axes[0], _renderer(fig)
    assert {t.get_text() for t in ax.texts} == {r["condition"] for r in rows}
    supervised = [t for t in ax.texts if t.get_text()[0] == "T"]
    assert len(supervised) == 5 and {t.xy for t in supervised} == {(0.30, 0.20)}
    assert _no_overlaps([t.get_window_extent(renderer) for t in supervised]) == []
    assert all(line.get_markerfacecolor() == "none" for line in ax.get_lines() if line.get_marker() not in (None, "None", ""))


def test_insertion_deletion_curves(out_dir):
    frac = torch.linspace(0, 1, 5)
    ins = torch.stack([frac, frac ** 2])
    dele = 1 - ins
    r = SimpleNamespace(fractions=frac, ins_curve=ins, del_curve=dele,
                        ins_auc=torch.tensor([0.5, 1 / 3]), del_auc=torch.tensor([0.5, 2 / 3]))
    fig = viz.insertion_deletion_curves({"T5": r, "reference": r}, save="insdel")
    _png(out_dir, "insdel")
    ax_ins, ax_del = fig.axes
    assert "inserted" in ax_ins.get_xlabel() and "p_c" in ax_ins.get_ylabel()
    line = ax_ins.get_lines()[0]
    np.testing.assert_allclose(line.get_xdata(), [0, 25, 50, 75, 100])
    np.testing.assert_allclose(line.get_ydata(), ((frac + frac ** 2) / 2).numpy(), rtol=1e-6)
    assert "AUC 0.417" in ax_ins.get_legend().get_texts()[0].get_text()


def test_perturbation_plot(out_dir):
    frac = [0.0, 0.5, 1.0]
    table = pd.DataFrame(dict(target=["tokentm", "T5"], fractions=[frac, "[0.0, 0.5, 1.0]"],
                              pos_curve=[[0.8, 0.3, 0.1], "[0.8, 0.5, 0.1]"], neg_curve=[[0.8, 0.7, 0.1], [0.8, 0.6, 0.1]],
                              pos_auc=[0.375, 0.475], neg_auc=[0.575, 0.525]))
    fig = viz.perturbation_plot(table, save="perturb")
    _png(out_dir, "perturb")
    pos, neg = fig.axes
    assert pos.get_xlabel() == "patch tokens removed (%)" and pos.get_ylabel() == "top-1 accuracy (%)"
    lines = {l.get_label(): l for l in pos.get_lines()}
    assert set(lines) == {"tokentm (AUC 0.375)", "T5 (AUC 0.475)"}
    np.testing.assert_allclose(lines["T5 (AUC 0.475)"].get_ydata(), [80, 50, 10])     # JSON string parsed
    np.testing.assert_allclose(lines["T5 (AUC 0.475)"].get_xdata(), [0, 50, 100])


def test_no_figures_left_open():
    import matplotlib.pyplot as plt
    plt.close("all")
    viz.taxonomy_table()
    viz.target_heatmaps(torch.randn(1, 3, 16, 16), {"T0": torch.rand(1, 4)})
    assert plt.get_fignums() == []


def test_glyphs_render_without_warning(out_dir):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        viz.regime_heatmap(_d_table(), save="glyphs")


def _renderer(fig):
    """An Agg renderer for ``fig`` (saved figures are closed and lose their pyplot canvas)."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def _no_overlaps(boxes) -> list[tuple[int, int]]:
    return [(i, j) for i in range(len(boxes)) for j in range(i + 1, len(boxes)) if boxes[i].overlaps(boxes[j])]


def test_coverage_vs_faithfulness_labels_do_not_collide(out_dir):
    """"unsupervised" and "T5" at (nearly) the same point: the labels were drawn over each other."""
    table = _protocol_table()
    close = table.copy()
    t5 = close["condition"] == "T5"
    unsup = close[close["condition"] == "unsupervised"][["miou", "idauc"]].to_numpy()
    close.loc[t5, ["miou", "idauc"]] = unsup + [0.002, 0.001]
    close.loc[close["condition"] == "T1", ["miou", "idauc"]] = unsup + [0.004, -0.001]
    fig = viz.coverage_vs_faithfulness(close, save="scatter_close")
    ax = fig.axes[0]
    renderer = _renderer(fig)
    labels = {t.get_text(): t for t in ax.texts}
    assert set(labels) == {"reference", "unsupervised", "T1", "T5"}
    boxes = [t.get_window_extent(renderer) for t in labels.values()]
    assert _no_overlaps(boxes) == []
    frame = ax.get_window_extent(renderer)
    assert all(frame.x0 <= b.x0 and b.x1 <= frame.x1 and frame.y0 <= b.y0 and b.y1 <= frame.y1 for b in boxes)
    # each label still points at its own condition's mean
    assert labels["T5"].xy[0] == pytest.approx(close[t5]["miou"].mean())


def _status_table():
    rows = []
    for depth, status in zip((1, 2, 3, 4), ("in band", "not resolved", "outside band", "uninformative")):
        rows.append(dict(condition="T5", depth=depth, budget=0.25, D_pp=float(depth), D_pp_std=0.5,
                         in_band=status == "in band", status=status))
        rows.append(dict(condition="reference", depth=depth, budget=0.25, D_pp=0.0, D_pp_std=0.0,
                         in_band=True, status="in band"))
    return pd.DataFrame(rows)


def test_regime_heatmap_legend_swatches_are_distinct_per_status(out_dir):
    """"in band" and "not resolved" had the same empty white swatch."""
    from matplotlib.colors import to_rgba
    fig = viz.regime_heatmap(_status_table(), save="regime_status")
    legend = fig.legends[0]
    labels = [t.get_text() for t in legend.get_texts()]
    assert [lbl[0] for lbl in labels] == ["✓", "?", "○", "✗"]  # in band, not resolved, uninformative, outside
    swatches = [(tuple(np.round(to_rgba(p.get_facecolor()), 3)), p.get_hatch(), tuple(np.round(p.get_edgecolor(), 3)))
                for p in legend.get_patches()]
    assert len(set(swatches)) == len(swatches) == 4
    # the cells carry their status's pattern: the uninformative cell (depth 4) is cross-hatched
    t5 = [a for a in fig.axes if a.get_title() == "T5"][0]
    hatches = {(p.get_x() + 0.5, p.get_y() + 0.5): p.get_hatch() for p in t5.patches}
    assert hatches[(0.0, 3.0)] == "xx" and hatches[(0.0, 1.0)] == "...." and hatches[(0.0, 2.0)] == "///"
    assert "+4.0 ○" in [t.get_text() for t in t5.texts]
    renderer = _renderer(fig)
    assert not any(legend.get_window_extent(renderer).overlaps(ax.get_tightbbox(renderer)) for ax in fig.axes)


def test_cosine_heatmap_has_no_negative_zero(out_dir):
    """A cosine of -0.004 printed as "-0.00"."""
    ids = ["T0", "T3", "T5"]
    m = pd.DataFrame([[1.0, -0.004, 0.05], [-0.004, 1.0, -0.0002], [0.05, -0.0002, 1.0]], index=ids, columns=ids)
    fig = viz.cosine_heatmap(m, highlight=("T3", "T5"), lo=m - 0.0001, hi=m + 0.0001, save="cosine_zero")
    texts = [t.get_text() for t in fig.axes[0].texts] + [fig.axes[0].get_title()]
    import re
    assert not any(re.search(r"[-−]0\.0+(?![0-9])", t) for t in texts), texts  # -0.00, -0.000
    assert [t.get_text() for t in fig.axes[0].texts].count("0.00") == 4
    assert "cos(T3, T5) = 0.000 [0.000, 0.000]" in fig.axes[0].get_title()  # -0.0003 .. -0.0001


def test_condition_color_is_fixed_per_name_across_figures(out_dir):
    from matplotlib.colors import to_hex

    # T5 in the coverage scatter (notebook 02) and in the perturbation curves (notebook 06)
    scatter = viz.coverage_vs_faithfulness(_protocol_table()).axes[0]
    marker = {lbl: h for h, lbl in zip(*scatter.get_legend_handles_labels())}["T5"]  # an ErrorbarContainer
    frac = [0.0, 0.5, 1.0]
    table = pd.DataFrame(dict(target=["tokentm", "T5"], fractions=[frac, frac], pos_curve=[frac, frac],
                              neg_curve=[frac, frac], pos_auc=[0.5, 0.5], neg_auc=[0.5, 0.5]))
    curves = {l.get_label().split(" ")[0]: l for l in viz.perturbation_plot(table).axes[0].get_lines()}
    scatter_t5 = to_hex(marker.lines[0].get_color())
    assert scatter_t5 == to_hex(curves["T5"].get_color()) == viz.condition_color("T5") == "#8c564b"
    assert to_hex(curves["tokentm"].get_color()) == viz.condition_color("tokentm")
    # the colour does not depend on the position of the name among the others
    r = SimpleNamespace(fractions=torch.linspace(0, 1, 3), ins_curve=torch.ones(1, 3), del_curve=torch.ones(1, 3),
                        ins_auc=torch.ones(1), del_auc=torch.ones(1))
    one = viz.insertion_deletion_curves({"T5": r}).axes[0].get_lines()[0]
    two = viz.insertion_deletion_curves({"T1": r, "T5": r}).axes[0].get_lines()[1]
    assert to_hex(one.get_color()) == to_hex(two.get_color()) == "#8c564b"


def test_condition_color_distinct_for_known_names_and_stable_fallback():
    import subprocess
    import sys

    from midas_nb.analysis.protocol import CONTROL_TARGETS, list_conditions
    from midas_nb.analysis.related import PERTURBATION_MAPS, RELATED_CONDITIONS
    from midas_nb.targets import list_targets

    known = set(list_conditions()) | set(CONTROL_TARGETS) | set(CONTROL_TARGETS.values()) | set(list_targets()) \
        | set(RELATED_CONDITIONS) | set(PERTURBATION_MAPS)
    assert known <= set(viz.CONDITION_COLORS), sorted(known - set(viz.CONDITION_COLORS))
    colours = [viz.condition_color(n) for n in sorted(known - {"T0"})]   # T0 is the reference's ranking, its colour
    assert len(set(colours)) == len(colours)
    assert viz.condition_color("reference") == "#000000" and viz.condition_color(" t5 ") == "#8c564b"
    assert viz.condition_color("LaSt") == viz.condition_color("last_votes")
    # unknown names: a palette colour that no known name uses, the same in another process
    # (Python's str hash is salted per process; the fallback must not use it)
    fallback = viz.condition_color("my_new_target")
    assert fallback not in viz.CONDITION_COLORS.values()
    code = "from midas_nb import viz; print(viz.condition_color('my_new_target'))"
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                           env={**__import__("os").environ, "PYTHONHASHSEED": "123"}).stdout.strip()
    assert other == fallback


def test_target_heatmaps_notebook_size_is_legible(out_dir):
    """Notebook 01's figure: 3 images × 11 targets wrap to 6 panels a row, class names label the
    rows, and the part patches are outlined on every panel of an image with parts."""
    batch = _batch(B=2)
    batch.images, batch.labels = torch.randn(3, 3, 32, 32), torch.tensor([0, 1, 1])
    batch.part_mask = torch.cat([batch.part_mask, torch.zeros(1, 16, dtype=torch.bool)])  # image 2: no parts
    ids = ["T0", "T1", "T2", "T3", "T4", "T5", "rollout", "rollout_full", "tokentm", "last_votes", "random"]
    maps = {k: torch.randn(3, 16) for k in ids}
    fig = viz.target_heatmaps(batch, maps, grid=(4, 4), class_names=["017.Cardinal", "042.Vermilion_Flycatcher"],
                                save="targets_nb")
    _png(out_dir, "targets_nb")
    width, height = fig.get_size_inches()
    panels = [a for a in fig.axes if a.get_visible() and a.images]
    assert len(panels) == 3 * 12 and len(fig.axes) == 6 * 6 + 1      # 6 rows × 6 columns + colour bar
    assert width <= 14 and width / 6 >= 1.6 + 0.9 / 6                 # ≥ 1.6 in per panel
    photo_rows = [a for a in panels if a.get_title() == "photo"]
    assert [a.get_ylabel() for a in photo_rows] == ["Cardinal", "Vermilion Flycatcher", "Vermilion Flycatcher"]
    long = viz.target_heatmaps(batch, {"T0": maps["T0"]}, grid=(4, 4), class_names=["Synth beak black long wings", "b"])
    assert long.axes[0].get_ylabel() == "Synth beak black\nlong wings"   # wrapped, not truncated
    assert [a.get_title() for a in panels[1:12]] == ids                # short titles: the target id
    outlined = [a for a in panels if any(c.get_gid() == "part outline" for c in a.collections)]
    assert len(outlined) == 2 * 12                                     # not on the image without parts
    # image 0's parts are tokens 0 and 14 (two separate patches): 8 edges of 8 px
    segs = [c for c in panels[0].collections if c.get_gid() == "part outline"][0].get_segments()
    assert len(segs) == 8 and all(np.abs(np.diff(s, axis=0)).sum() == pytest.approx(8.0) for s in segs)
    assert "outline" in fig._suptitle.get_text()


def test_each_profile_keeps_its_own_figures(tmp_path, monkeypatch):
    """Without MIDAS_FIGURES_DIR a notebook's figures go to figures/<profile>/, so a smoke run never
    overwrites a quick run's; MIDAS_FIGURES_DIR (what ``midas-nb run`` sets per dataset) wins."""
    from midas_nb import config

    monkeypatch.delenv("MIDAS_FIGURES_DIR", raising=False)
    monkeypatch.setattr(config, "project_root", lambda: tmp_path)
    assert config.figures_dir() == tmp_path / "figures"
    paths = {}
    for profile in ("smoke", "quick"):
        assert viz.set_output("02_test", None, profile=profile) == tmp_path / "figures" / profile
        paths[profile] = viz.save_csv(pd.DataFrame(dict(profile=[profile])), "table")
    assert paths["smoke"] != paths["quick"]
    assert [pd.read_csv(paths[p])["profile"][0] for p in ("smoke", "quick")] == ["smoke", "quick"]
    monkeypatch.setenv("MIDAS_FIGURES_DIR", str(tmp_path / "chosen"))
    assert viz.set_output("02_test", None, profile="quick") == tmp_path / "chosen"


def test_an_empty_output_directory_is_refused_not_the_working_directory():
    """``output_dir=""`` would write figures into the notebooks' own folder (papermill's cwd)."""
    for bad in ("", "  "):
        with pytest.raises(ValueError, match=r"output_dir: expected a directory path or None"):
            viz.set_output("02_test", bad, profile="smoke")
