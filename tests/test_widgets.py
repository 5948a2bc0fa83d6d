"""The explorer (midas_nb.viz.widgets) as Python objects: its numbers against an independent
computation, its controls, its static still and its error display. The browser side is
tests/test_browser.py."""
from __future__ import annotations

import html
import math

import pytest
import torch

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def study():
    from midas_nb.study import Study
    return Study("smoke", progress=False)


def _by_hand(study, index: int, target: str, depth: int, budget: float) -> tuple[int, float, float]:
    """(k, part IoU, IDAUC) of test image ``index``: top-k by torch.topk on the test split's
    cached map, IoU from Python sets, IDAUC from metrics on that single image."""
    from midas_nb import metrics
    ranking = study.target_maps(depth=depth, ids=[target])[target][index].float()
    N = ranking.numel()
    k = math.ceil(round(budget * N, 9))
    kept = set(torch.topk(ranking, k).indices.tolist())
    parts = set(torch.nonzero(study.test_set[index].part_mask).flatten().tolist())
    iou = len(kept & parts) / len(kept | parts) if parts else math.nan
    r = metrics.insertion_deletion_auc(study.model, study.test_set[index].image[None], ranking[None],
                                       steps=int(study.params["idauc_steps"]))
    return k, iou, float(r.idauc[0])


def test_explorer_view_matches_an_independent_computation(study):
    from midas_nb.viz import widgets
    view = widgets.explorer_view(study, image=2, targets=("T0", "T5"), depth=1, budget=0.3)
    N = study.grid[0] * study.grid[1]
    assert view.n_patches == N and view.n_keep == math.ceil(0.3 * N)          # 0.3·64 = 19.2 → 20
    assert view.keep.shape == (2, N) and view.keep.sum(1).tolist() == [view.n_keep] * 2
    assert view.index == study.batch(n=12).indices[2]
    for j, t in enumerate(view.targets):
        k, iou, idauc = _by_hand(study, view.index, t, 1, 0.3)
        assert view.n_keep == k
        assert view.iou[j] == pytest.approx(iou, abs=1e-6)
        assert float(view.insdel[t].idauc[0]) == pytest.approx(idauc, abs=1e-4)
    # the read-out states exactly these numbers
    text = "\n".join(view.lines())
    assert f"T5: kept {view.n_keep}/{N} patch tokens · part IoU {view.iou[1]:.3f}" in text
    assert f"IDAUC {float(view.insdel['T0'].idauc[0]):+.3f}" in text
    assert f"test index {view.index}" in text and "depth L=1 · budget b=30%" in text


def test_explorer_view_rejects_bad_settings(study):
    from midas_nb.viz import widgets
    n_blocks = len(study.model.blocks)
    with pytest.raises(ValueError, match="two rankings"):
        widgets.explorer_view(study, targets=("T0", "T1", "T5"))
    with pytest.raises(ValueError, match=f"depth L must be in 1..{n_blocks - 1} for a {n_blocks}-block ViT"):
        widgets.explorer_view(study, depth=n_blocks)
    with pytest.raises(ValueError, match=r"expected a kept fraction b in \(0, 1\]"):
        widgets.explorer_view(study, budget=1.5)
    with pytest.raises(ValueError, match="outside the explorer's 3 images"):
        widgets.explorer_view(study, image=3, n_images=3)


def test_static_still(study, tmp_path, capsys):
    from matplotlib.figure import Figure

    from midas_nb import viz
    from midas_nb.viz import widgets
    viz.set_output("00_test", tmp_path)
    try:
        fig = widgets.explorer(study, interactive=False)
    finally:
        viz.set_output(None, None)
    assert isinstance(fig, Figure)
    n_keep = math.ceil(study.params["budget"] * study.grid[0] * study.grid[1])
    titles = [a.get_title() for a in fig.axes[:2]]
    assert [t.split(":")[0] for t in titles] == ["T0", "T5"]                       # T0 against T5
    assert all(f"kept {n_keep}/{study.grid[0] * study.grid[1]}" in t for t in titles)
    v = fig.explorer_view
    rows, cols = study.grid
    for j, ax in enumerate(fig.axes[:2]):              # dropped patch tokens dimmed, kept ones clear
        alpha = ax.images[1].get_array()[..., 3]
        assert ((alpha == 0) == v.keep[j].reshape(rows, cols).numpy()).all() and alpha.max() == 0.75
    # the curves panel: insertion and deletion of both rankings, as the view computed them
    lines = fig.axes[2].get_lines()
    assert len(lines) == 4
    assert lines[0].get_ydata().tolist() == pytest.approx(v.insdel["T0"].ins_curve[0].tolist())
    assert lines[3].get_ydata().tolist() == pytest.approx(v.insdel["T5"].del_curve[0].tolist())
    assert any(widgets.STATIC_NOTE == t.get_text() for t in fig.texts)            # marked as a still
    assert (tmp_path / "00_test_explorer.png").stat().st_size > 10_000
    # issue 52: notebook 00 promises the read-out under the still too (the interactive one shows it)
    assert capsys.readouterr().out.splitlines()[-len(v.lines()):] == v.lines()


def test_box_is_drawn_for_datasets_without_parts(study):
    import dataclasses

    from matplotlib.patches import Rectangle

    from midas_nb.viz import widgets
    view = widgets.explorer_view(study, n_images=2)
    boxed = dataclasses.replace(view, coverage_kind="box coverage")
    batch = study.batch(n=2)
    fig = widgets.explorer_figure(boxed, batch, study.grid, study.normalization)
    x0, y0, x1, y1 = batch.boxes[0].tolist()
    cyan = [p for p in fig.axes[0].patches if isinstance(p, Rectangle) and p.get_edgecolor()[:3] == (0.0, 1.0, 1.0)]
    assert len(cyan) == 1 and cyan[0].get_xy() == (x0, y0) and cyan[0].get_width() == pytest.approx(x1 - x0)
    assert "box IoU" in fig.axes[0].get_title() and "box IoU" in "\n".join(boxed.lines())


def test_interactive_controls_redraw(study, monkeypatch):
    import ipywidgets

    from midas_nb.viz import widgets
    box = widgets.explorer(study, n_images=4, interactive=True)
    assert isinstance(box, ipywidgets.VBox) and "midas-explorer" in box._dom_classes
    controls = {w.description: w for row in box.children[:2] for w in row.children}
    assert set(controls) == {"image", "left target", "right target", "depth L", "budget b"}
    assert (controls["left target"].value, controls["right target"].value) == ("T0", "T5")
    assert controls["depth L"].max == len(study.model.blocks) - 1
    figure, readout = box.children[2], box.children[3]
    first_png = figure.value
    assert first_png[:8] == b"\x89PNG\r\n\x1a\n"
    for name, value in (("right target", "T3"), ("depth L", 1), ("budget b", 0.4), ("image", 3)):
        before = figure.value
        controls[name].value = value
        assert figure.value != before, f"{name} did not redraw the figure"
        v = box.view
        assert (v.targets[1], v.depth, v.budget, v.position) == (
            controls["right target"].value, controls["depth L"].value, controls["budget b"].value,
            controls["image"].value)
        assert readout.value == "".join(f"<div>{html.escape(s)}</div>" for s in v.lines())
    k, iou, idauc = _by_hand(study, box.view.index, "T3", 1, 0.4)
    assert box.view.n_keep == k and box.view.iou[1] == pytest.approx(iou, abs=1e-6)
    assert float(box.view.insdel["T3"].idauc[0]) == pytest.approx(idauc, abs=1e-4)
    # a failing redraw shows its error in the read-out (not only in the kernel log)
    monkeypatch.setattr(widgets, "explorer_figure", lambda *a, **k: (_ for _ in ()).throw(RuntimeError("boom")))
    with pytest.raises(RuntimeError, match="boom"):
        controls["budget b"].value = 0.5
    assert "midas-explorer-error" in readout._dom_classes and "RuntimeError: boom" in readout.value


def _renderer(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def _fig_boxes(fig, artists):
    renderer = _renderer(fig)
    return [a.get_window_extent(renderer) for a in artists]


def test_static_still_legend_clears_the_note_on_a_dataset_with_parts(study, tmp_path):
    """The four-entry legend (with "visible part keypoint") ran over the italic note."""
    from midas_nb.viz import widgets
    fig = widgets.explorer(study, interactive=False, save=None)
    assert fig.explorer_view.region == "part"
    legend = fig.legends[0]
    assert [t.get_text() for t in legend.get_texts()][-1] == "visible part keypoint"
    note = [t for t in fig.texts if t.get_text() == widgets.STATIC_NOTE]
    (lb, nb) = _fig_boxes(fig, [legend, note[0]])
    assert not lb.overlaps(nb)
    for ax in fig.axes:  # neither runs into a panel (tick labels and axis labels included)
        tb = ax.get_tightbbox(_renderer(fig))
        assert not tb.overlaps(lb) and not tb.overlaps(nb), ax.get_title()
    fig.savefig(tmp_path / "explorer.png")
