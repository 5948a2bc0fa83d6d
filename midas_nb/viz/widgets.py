"""The explorer (decision 0056): two rankings side by side on one test image at one depth ``L`` and budget ``b``:
the kept top ``k = ceil(b·N)`` patch tokens over the photo, the insertion and deletion curves of ``p_c`` on that
image (RISE, https://arxiv.org/abs/1806.07421) and a read-out of part IoU and IDAUC. Live ipywidgets controls in
a Jupyter front-end; a static still where none can show widgets (papermill, scripts, the HTML edition)."""
from __future__ import annotations

import html
import io
import math
import os
from dataclasses import dataclass, field
from typing import Any, Sequence

import matplotlib.pyplot as plt
import numpy as np
import torch
from matplotlib.patches import Patch
from torch import Tensor

from .common import (BOX_HANDLE, class_name, condition_color, draw_parts_or_box, finish_figure, FONT, image_to_rgb,
                     KEYPOINT_HANDLE, label_axes, legend_below, PART_COLOR, patch_rects, to_numpy)
from ..metrics import box_coverage, insertion_deletion_auc, part_miou
from ..point import Budget
from ..pruning import check_depth, keep_mask_from_indices, select_top_k
from ..targets import compute_targets
from ..backbones.vit import keep_count

STATIC_NOTE = ("Static still of a batch run. In JupyterLab this explorer is interactive: "
               "pick the image, the two targets, depth L and budget b.")

DEFAULT_PAIR: tuple[str, str] = ("T0", "T5")


def is_headless() -> bool:
    """No widget front-end expected: ``MIDAS_HEADLESS`` says (``1``/``true``/``yes``/``on``: headless; ``midas-nb
    run`` sets ``1``), else no IPython kernel or no ``ipywidgets``."""
    if (env := os.environ.get("MIDAS_HEADLESS")) is not None:
        return env.strip().lower() in ("1", "true", "yes", "on")
    try:
        from IPython import get_ipython
        import ipywidgets  # noqa: F401
    except ImportError:
        return True
    return not hasattr(get_ipython(), "kernel")   # None (no IPython) has none either


def kept_mask(scores: Tensor, budget: float) -> Tensor:
    """``[B,N]`` bool: the top ``k = ceil(b·N)`` patch tokens of ``scores [B,N]`` (DESIGN.md §3)."""
    return keep_mask_from_indices(select_top_k(scores, keep_count(budget, scores.shape[1])), scores.shape[1])


@dataclass
class ExplorerView:
    """What the explorer shows for one setting: the image at ``position`` in its list (``index`` in the test
    split), the two ranking ids ``targets`` at ``depth`` L and ``budget`` b; ``keep``: ``[2,N]`` bool kept patch
    tokens of each, ``n_keep`` = ``ceil(b·N)``; ``iou``: this image's IoU of each one's kept tokens with its part
    (box) patches (``NaN``: none); ``miou``: its mean over the ``n_images`` images; ``insdel``: ``{id: InsDel}``
    of ``p_c`` on this image (``B = 1``)."""

    position: int
    index: int
    class_name: str
    depth: int
    budget: float
    targets: tuple[str, str]
    keep: Tensor
    n_keep: int
    n_patches: int
    coverage_kind: str
    iou: tuple[float, float]
    miou: tuple[float, float]
    n_images: int
    insdel: dict[str, Any] = field(default_factory=dict)

    @property
    def region(self) -> str:
        return "part" if self.coverage_kind == "part mIoU" else "box"

    def lines(self) -> list[str]:
        """The read-out, plain-text lines."""
        out = [f"image {self.position} (test index {self.index}, {self.class_name}) · depth L={self.depth} · "
               f"budget b={self.budget:.0%} → k={self.n_keep} of N={self.n_patches} patch tokens"]
        for t, iou in zip(self.targets, self.iou):
            r = self.insdel[t]
            iou_s = "n/a (no part patch)" if math.isnan(iou) else f"{iou:.3f}"
            out.append(f"{t}: kept {self.n_keep}/{self.n_patches} patch tokens · {self.region} IoU {iou_s} · "
                       f"IDAUC {float(r.idauc[0]):+.3f} (insertion {float(r.ins_auc[0]):.3f}, "
                       f"deletion {float(r.del_auc[0]):.3f})")
        means = " · ".join(f"{t} {m:.3f}" for t, m in zip(self.targets, self.miou))
        out.append(f"{self.coverage_kind} over the explorer's {self.n_images} images at this L and b: {means}")
        return out


class _ViewCache:
    """The explorer's images, their target maps per depth and insertion/deletion per (depth, image, target), lazily."""

    def __init__(self, study, n_images: int, ids: Sequence[str]):
        self.study, self.ids = study, list(ids)
        self.batch = study.batch(n=max(1, min(int(n_images), len(study.test_set))))
        self.maps: dict[int, dict[str, Tensor]] = {}
        self.insdel: dict[tuple[int, int, str], Any] = {}

    def maps_at(self, depth: int) -> dict[str, Tensor]:
        """Target maps ``{id: [B,N]}`` at ``depth`` for the predicted class."""
        if depth not in self.maps:
            st, batch = self.study, self.batch
            model, images = st.model.to(st.device).eval(), batch.images.to(st.device)
            with torch.no_grad():
                pred = model(images).argmax(-1)
            maps = compute_targets(model, images, self.ids, depth, pred, labels=batch.labels.to(st.device),
                                   indices=batch.indices)
            self.maps[depth] = {k: v.detach().float().cpu() for k, v in maps.items()}
        return self.maps[depth]

    def insdel_of(self, depth: int, position: int, target: str):
        key = (depth, position, target)
        if key not in self.insdel:
            st = self.study
            ranking = self.maps_at(depth)[target][position:position + 1]
            self.insdel[key] = insertion_deletion_auc(st.model.to(st.device), self.batch.images[position:position + 1],
                                                      ranking, steps=st.settings.protocol.idauc_steps, device=st.device)
        return self.insdel[key]

    def view(self, position: int, targets: Sequence[str], depth: int | None = None,
             budget: float | None = None) -> ExplorerView:
        st, batch, targets = self.study, self.batch, tuple(targets)
        if len(targets) != 2:
            raise ValueError(f"the explorer compares two rankings, got {len(targets)}: {targets}")
        if not 0 <= position < len(batch.indices):
            raise ValueError(f"image position {position} is outside the explorer's {len(batch.indices)} images")
        if unknown := [t for t in targets if t not in self.ids]:
            raise ValueError(f"unknown ranking(s) {unknown}; the explorer offers {self.ids}")
        depth = check_depth(st.model, st.settings.point.depth if depth is None else depth)
        budget = float(Budget(st.settings.point.budget if budget is None else budget))
        has_parts = bool(getattr(st.test_set, "has_parts", True))
        keep_all = [kept_mask(self.maps_at(depth)[t], budget) for t in targets]   # each image's IoU is its own
        scored = [(part_miou if has_parts else box_coverage)(k, batch.part_mask if has_parts else batch.box_mask)
                  for k in keep_all]
        keep = torch.stack([k[position] for k in keep_all])
        return ExplorerView(
            position=position, index=int(batch.indices[position]), depth=depth, budget=budget, targets=targets,
            class_name=class_name(getattr(st.test_set, "classes", None), int(batch.labels[position]), 40),
            keep=keep, n_keep=int(keep[0].sum()), n_patches=int(keep.shape[1]),
            coverage_kind="part mIoU" if has_parts else "box coverage",
            iou=tuple(float(r.per_image[position]) for r in scored), miou=tuple(float(r.mean) for r in scored),
            n_images=len(batch.indices), insdel={t: self.insdel_of(depth, position, t) for t in targets})


def explorer_view(study, image: int = 0, targets: Sequence[str] = DEFAULT_PAIR, depth: int | None = None,
                  budget: float | None = None, n_images: int = 12) -> ExplorerView:
    """The :class:`ExplorerView` (drawing nothing) of a :class:`midas_nb.study.Study` for image ``image`` of
    ``n_images``, two ranking ids ``targets``, ``depth`` L and ``budget`` b (default the study's). ValueError: not
    two targets, an unknown one, an image outside the list, ``L`` outside ``1..n−1`` or ``b`` outside ``(0, 1]``."""
    return _ViewCache(study, n_images, targets).view(int(image), targets, depth, budget)


def explorer_figure(view: ExplorerView, batch, grid: Sequence[int], normalization=None, note: str | None = None):
    """The explorer's figure (not closed, not saved) of ``view``: two kept-token panels and the insertion/deletion
    curves on ``batch.images[view.position]``, patch ``grid`` ``(rows, cols)``, ``note`` a line under it."""
    (rows, cols), p = (int(g) for g in grid), view.position
    img = image_to_rgb(batch.images[p], normalization)
    H, W = img.shape[:2]
    fig, axes = plt.subplots(1, 3, figsize=(12.5, 4.4), gridspec_kw=dict(width_ratios=[1, 1, 1.35]))
    for j, (ax, t) in enumerate(zip(axes[:2], view.targets)):
        keep = to_numpy(view.keep[j]).astype(bool)
        ax.imshow(img, extent=(0, W, H, 0))
        shade = np.where(keep.reshape(rows, cols, 1), 0.0, [0.0, 0.0, 0.0, 0.75])   # dropped tokens dimmed
        ax.imshow(shade, extent=(0, W, H, 0), interpolation="nearest")
        patch_rects(ax, keep, rows, cols, H / rows, W / cols, fill=False, edgecolor="white", lw=0.6)
        if view.region == "part":   # part patches outlined and visible keypoints dotted, else the object box
            patch_rects(ax, to_numpy(batch.part_mask[p]).astype(bool), rows, cols, H / rows, W / cols, fill=False,
                        edgecolor=PART_COLOR, lw=1.4, ls="--")
        draw_parts_or_box(ax, batch.parts[p] if view.region == "part" else None,
                          batch.boxes[p] if view.region == "box" else None, s=14, lw=1.6)
        ax.set(xlim=(0, W), ylim=(H, 0), xticks=[], yticks=[])
        iou, r = view.iou[j], view.insdel[t]
        ax.set_title(f"{t}: kept {view.n_keep}/{view.n_patches}\n{view.region} IoU "
                     f"{'n/a' if math.isnan(iou) else f'{iou:.2f}'} · IDAUC {float(r.idauc[0]):+.3f}",
                     fontsize=FONT["label"], color=condition_color(t))
    ax = axes[2]
    for t in dict.fromkeys(view.targets):      # in each ranking's colour in every figure
        r = view.insdel[t]
        for curve, auc, style, what in ((r.ins_curve, r.ins_auc, "-o", "insertion"),
                                        (r.del_curve, r.del_auc, "--s", "deletion")):
            ax.plot(to_numpy(r.fractions) * 100, to_numpy(curve[0]), style, ms=3, color=condition_color(t),
                    label=f"{t} {what} (AUC {float(auc[0]):.3f})")
    label_axes(ax, "patch tokens inserted / deleted, most important first (%)", "p_c (predicted class)",
               "insertion (solid) and deletion (dashed), this image", size=FONT["tick"], title_size=FONT["label"],
               legend=dict(fontsize=FONT["legend"] - 1))
    ax.set_ylim(-0.02, 1.02)
    handles = [Patch(facecolor="white", edgecolor="0.3", label="kept patch token"),
               Patch(facecolor=(0, 0, 0, 0.75), label="dropped patch token")] + (
        [Patch(fill=False, edgecolor=PART_COLOR, ls="--", lw=1.4, label="part patch"), KEYPOINT_HANDLE]
        if view.region == "part" else [BOX_HANDLE])
    fig.suptitle(f"{view.class_name} (test image {view.index}) · depth L={view.depth} · budget b={view.budget:.0%}",
                 fontsize=FONT["title"])
    legend_below(fig, handles, ncol=len(handles), note=note, x=0.005, loc="lower left")
    return fig


def explorer(study, n_images: int = 12, rankings: Sequence[str] | None = None, interactive: bool | None = None,
             save: str | None = "explorer", targets: Sequence[str] = DEFAULT_PAIR):
    """Two rankings side by side on one test image of a :class:`midas_nb.study.Study` at one depth and budget:
    ``n_images`` images to pick from, ``rankings`` the target ids offered (default the profile's), ``interactive``
    (``None``: not :func:`is_headless`), ``targets`` the pair shown first. Returns, interactive: a displayed
    ``ipywidgets.VBox`` (CSS class ``midas-explorer``, ``view`` the :class:`ExplorerView` shown) of the controls, an
    ``Image`` (``midas-explorer-figure``) and an ``HTML`` read-out (``midas-explorer-readout``, a failing redraw's
    error there); headless: the still figure (``save``), its read-out printed."""
    interactive = not is_headless() if interactive is None else interactive
    ids = list(rankings or study.settings.protocol.targets)
    pair = [t if t in ids else ids[min(i, len(ids) - 1)] for i, t in enumerate(tuple(targets)[:2])]
    if not interactive:
        cache = _ViewCache(study, n_images, pair)
        view = cache.view(0, pair)
        fig = explorer_figure(view, cache.batch, study.grid, study.normalization, note=STATIC_NOTE)
        fig.explorer_view = view
        finish_figure(fig, save)
        print("\n".join(view.lines()))    # the read-out the interactive explorer shows under the figure
        return fig

    import ipywidgets as W
    from IPython.display import display
    cache, n_blocks, style = _ViewCache(study, n_images, ids), len(study.model.blocks), {"description_width": "90px"}
    batch, classes = cache.batch, getattr(study.test_set, "classes", None)
    options = [(f"{i}: {class_name(classes, int(batch.labels[i]), 40)} (test {int(batch.indices[i])})", i)
               for i in range(len(batch.indices))]
    controls = [W.Dropdown(options=options, value=0, description="image", style=style),
                W.Dropdown(options=ids, value=pair[0], description="left target", style=style),
                W.Dropdown(options=ids, value=pair[1], description="right target", style=style),
                W.IntSlider(value=min(study.settings.point.depth, n_blocks - 1), min=1, max=n_blocks - 1,
                            description="depth L", style=style, continuous_update=False),
                W.FloatSlider(value=float(study.settings.point.budget), min=0.05, max=1.0, step=0.05,
                              description="budget b", readout_format=".0%", style=style, continuous_update=False)]
    figure_w = W.Image(format="png").add_class("midas-explorer-figure")
    readout_w = W.HTML().add_class("midas-explorer-readout")
    box = W.VBox([W.HBox(controls[:3]), W.HBox(controls[3:]), figure_w, readout_w]).add_class("midas-explorer")
    box.view = None

    def draw(*_: Any) -> None:
        image, left, right, depth, budget = (w.value for w in controls)
        try:
            view = cache.view(image, (left, right), depth, budget)
            fig, buf = explorer_figure(view, batch, study.grid, study.normalization), io.BytesIO()
            fig.savefig(buf, format="png", dpi=90)
            plt.close(fig)
            figure_w.value = buf.getvalue()
            readout_w.remove_class("midas-explorer-error")
            readout_w.value = "".join(f"<div>{html.escape(s)}</div>" for s in view.lines())   # one per line
            box.view = view
        except Exception as e:  # noqa: BLE001 - an observer's exception would only reach the kernel log
            readout_w.add_class("midas-explorer-error")
            readout_w.value = (f"<div style='color:#b00020'><b>explorer error</b>: "
                               f"{html.escape(type(e).__name__)}: {html.escape(str(e))}</div>")
            raise

    for w in controls:
        w.observe(draw, names="value")
    display(box)
    draw()
    return box
