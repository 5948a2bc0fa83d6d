"""Interactive explorer of token pruning (ipywidgets), with a static fallback for batch runs.

:func:`explorer` shows which patch tokens a ranking keeps — image × ranking (a supervision
target of DESIGN.md §4; ``T0`` is exactly the training-free reference scorer) × depth ``L`` ×
budget ``b`` — over the photo, with the part patches outlined, and the part IoU of that
single image. In a live Jupyter front-end it returns ipywidgets controls; when no front-end
can show widgets (papermill, nbval, scripts, the smoke profile) it returns one static
:class:`matplotlib.figure.Figure` instead, so executed notebooks always hold a figure.

Headless rule (:func:`is_headless`), first match wins:

1. ``MIDAS_HEADLESS`` is set: truthy (``1``, ``true``, ``yes``) → headless, else interactive;
2. ``MIDAS_PROFILE == "smoke"`` → headless;
3. no IPython kernel (plain Python, or a terminal IPython) or no ``ipywidgets`` → headless;
4. otherwise interactive.
"""
from __future__ import annotations

import os
from typing import Any, Sequence

import torch

from . import plots

__all__ = ["is_headless", "kept_mask", "explorer", "static_explorer"]


def is_headless() -> bool:
    """True when no widget front-end is expected (see the module docstring)."""
    env = os.environ.get("MIDAS_HEADLESS")
    if env is not None:
        return env.strip().lower() in ("1", "true", "yes", "on")
    if os.environ.get("MIDAS_PROFILE") == "smoke":
        return True
    try:
        from IPython import get_ipython
    except ImportError:
        return True
    ip = get_ipython()
    if ip is None or not hasattr(ip, "kernel"):
        return True
    try:
        import ipywidgets  # noqa: F401
    except ImportError:
        return True
    return False


def kept_mask(scores: torch.Tensor, budget: float) -> torch.Tensor:
    """``[B,N]`` bool: the top ``k = ceil(b·N)`` patch tokens of ``scores [B,N]`` (DESIGN.md §3)."""
    from .pruning import keep_mask_from_indices, select_top_k
    from .vit import keep_count
    k = keep_count(budget, scores.shape[1])
    return keep_mask_from_indices(select_top_k(scores, k), scores.shape[1])


def _maps(study, batch, depth: int, ids: Sequence[str]) -> dict[str, torch.Tensor]:
    """Target maps of one batch at ``depth`` (class = the backbone's prediction, test rule)."""
    from .targets import compute_targets
    model = study.model.to(study.device).eval()
    images = batch.images.to(study.device)
    with torch.no_grad():
        pred = model(images).argmax(-1)
    maps = compute_targets(model, images, list(ids), depth, pred, labels=batch.labels.to(study.device),
                           indices=batch.indices)
    return {k: v.detach().cpu() for k, v in maps.items()}


def _short(name: str, limit: int = 24) -> str:
    name = name.split(".", 1)[-1].replace("_", " ")
    return name if len(name) <= limit else name[: limit - 1] + "…"


def _title(study, batch, b: int) -> str:
    label = int(batch.labels[b])
    classes = getattr(study.test_set, "classes", None)
    return _short(classes[label]) if classes else f"class {label}"


def static_explorer(study, image: int = 0, rankings: Sequence[str] = ("T0", "T1", "T3", "T5"),
                    depth: int | None = None, budget: float | None = None, save: str | None = "explorer"):
    """One figure: the kept tokens of each ranking on one test image at ``(depth, budget)``.

    Args:
        study: a :class:`midas_nb.study.Study`.
        image: position in the study's test split.
        rankings: target ids (``T0`` = the reference scorer's ranking).
        depth, budget: default the study's.
        save: figure name for :func:`midas_nb.plots.save_figure` (``None``: not saved).
    """
    from .metrics import part_miou
    depth = int(depth or study.params["depth"])
    budget = float(budget or study.params["budget"])
    batch = study.batch(indices=[int(image)])
    maps = _maps(study, batch, depth, rankings)
    masks = torch.cat([kept_mask(maps[r], budget) for r in rankings])
    ious = [part_miou(masks[i:i + 1], batch.part_mask).mean for i in range(len(rankings))]
    titles = [f"{r}  (IoU {v:.2f})" if v == v else r for r, v in zip(rankings, ious)]
    return plots.kept_tokens_overlay(
        batch.images.expand(len(rankings), -1, -1, -1), masks, study.grid,
        part_mask=batch.part_mask.expand(len(rankings), -1), titles=titles,
        normalization=study.normalization, ncols=len(rankings),
        suptitle=f"Kept tokens at depth L={depth}, budget b={budget:.0%} — {_title(study, batch, 0)}",
        save=save)


def explorer(study, n_images: int = 12, rankings: Sequence[str] | None = None,
             interactive: bool | None = None, save: str | None = "explorer"):
    """Image × ranking × depth × budget → kept tokens over the photo.

    Args:
        study: a :class:`midas_nb.study.Study`.
        n_images: test images offered by the image menu.
        rankings: target ids offered (default: the profile's targets).
        interactive: force (``True``) or forbid (``False``) widgets; ``None`` → not
            :func:`is_headless`.
        save: name of the static figure (headless only).

    Returns:
        ``ipywidgets.VBox``, already displayed (interactive), or a ``matplotlib`` Figure
        (headless, from :func:`static_explorer` with the study's depth and budget). Notebook
        cells assign the result (``view = explorer(study)``) so nothing is shown twice.
    """
    if interactive is None:
        interactive = not is_headless()
    ids = list(rankings or study.params["targets"])
    if not interactive:
        shown = [r for r in ("T0", "T1", "T3", "T5") if r in ids] or ids[:4]
        return static_explorer(study, 0, shown, save=save)

    import ipywidgets as W
    import matplotlib.pyplot as plt
    from IPython.display import display

    from .metrics import part_miou

    n_blocks = len(study.model.blocks)
    m = min(int(n_images), len(study.test_set))
    batch = study.batch(n=m)
    options = [(f"{i}: {_title(study, batch, i)}", i) for i in range(m)]
    image_w = W.Dropdown(options=options, value=0, description="image")
    rank_w = W.Dropdown(options=ids, value="T5" if "T5" in ids else ids[0], description="ranking")
    depth_w = W.IntSlider(value=int(study.params["depth"]), min=1, max=n_blocks - 1, description="depth L")
    budget_w = W.FloatSlider(value=float(study.params["budget"]), min=0.05, max=1.0, step=0.05,
                             description="budget b", readout_format=".0%")
    out = W.Output()
    cache: dict[int, dict[str, torch.Tensor]] = {}

    def draw(*_: Any) -> None:
        L = depth_w.value
        if L not in cache:
            cache[L] = _maps(study, batch, L, ids)
        b = image_w.value
        mask = kept_mask(cache[L][rank_w.value][b:b + 1], budget_w.value)
        iou = part_miou(mask, batch.part_mask[b:b + 1]).mean
        with out:
            out.clear_output(wait=True)
            fig = plots.kept_tokens_overlay(
                batch.images[b], mask[0], study.grid, part_mask=batch.part_mask[b:b + 1],
                titles=[f"{rank_w.value}, L={L}, b={budget_w.value:.0%}, part IoU {iou:.2f}"],
                normalization=study.normalization, ncols=1)
            display(fig)
            plt.close(fig)

    for w in (image_w, rank_w, depth_w, budget_w):
        w.observe(draw, names="value")
    box = W.VBox([W.HBox([image_w, rank_w]), W.HBox([depth_w, budget_w]), out])
    display(box)
    draw()
    return box
