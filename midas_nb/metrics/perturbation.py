"""Positive and negative perturbation tests (the evaluation protocol of TokenTM).

Wu, Duan, Kang, Tang & Yan, *Token Transformation Matters: Towards Faithful Post-hoc
Explanation for Vision Transformer* (TokenTM), CVPR 2024, https://arxiv.org/abs/2403.14552,
following Chefer, Gur & Wolf, *Transformer Interpretability Beyond Attention Visualization*,
CVPR 2021, https://arxiv.org/abs/2012.09838 ("perturbation tests"):

- **positive** perturbation — remove the patch tokens in *decreasing* relevance (most relevant
  first); a faithful map makes the accuracy fall fast: **lower AUC is better**;
- **negative** perturbation — remove them in *increasing* relevance (least relevant first); the
  accuracy should hold: **higher AUC is better**.

At step ``s = 0..S`` the ``k_s = round(s·N/S)`` tokens (:func:`midas_nb.metrics.insertion_counts`,
steps of 10 % for ``S = 10``) are removed from the token sequence — token dropping with
positions kept (:func:`midas_nb.backbones.vit.gather_tokens`, the same path as IDAUC; prefix tokens always
stay) — and the top-1 accuracy of the prediction is recorded. The area under the accuracy curve
is the trapezoid over the removed fraction ``k_s/N ∈ [0,1]`` (:func:`midas_nb.metrics.curve_auc`),
so it lies in ``[0,1]``. (The papers stop at 90 % removed and blank pixels; the token-space form
with the 100 % end point matches the IDAUC conventions of DESIGN.md §6.) Accuracy is against the
label (default) or the unperturbed prediction. Per-image AUCs of the 0/1 correctness curves
average to the AUC of the accuracy curve, so bootstrap CIs over images come for free.
"""
from __future__ import annotations

from typing import Any, Callable, Literal, Mapping

import pandas as pd
import torch
from torch import Tensor, nn
from ..progress import tqdm

from ..data import collate_samples, evaluation_subset
from .insdel import curve_auc, insertion_counts
from .stats import bootstrap_ci
from ..backbones.vit import classify_tokens, embed_tokens, gather_tokens, num_prefix_tokens, run_blocks

__all__ = ["ReferenceClass", "perturbation_curves", "perturbation_test", "perturbation_table"]

ReferenceClass = Literal["label", "prediction"]


@torch.no_grad()
def perturbation_curves(backbone: nn.Module, images: Tensor, maps: Mapping[str, Tensor], steps: int = 10, *,
                        labels: Tensor | None = None, target: ReferenceClass = "label",
                        on_map: Callable[[str], Any] | None = None) -> dict[str, tuple[Tensor, Tensor]]:
    """Per-image correctness along positive and negative perturbation, for several maps.

    The positive/negative perturbation test of Chefer et al. as TokenTM evaluates with it
    (hila-chefer/Transformer-Explainability, ``baselines/ViT/pertubation_eval_from_hdf5.py``),
    with tokens dropped instead of pixels blanked (module docstring).

    The images are embedded once and every map's perturbations reuse the embedding.

    Args:
        backbone: timm ViT in eval mode.
        images: ``[B,3,H,W]`` normalised images on the backbone's device.
        maps: ``{id: [B,N]}`` relevance maps (higher = more relevant; ties: lower index first).
        steps: ``S``.
        labels: ``[B]`` long, required for ``target="label"``.
        target: ``"label"`` (accuracy) or ``"prediction"`` (agreement with the unperturbed
            prediction).
        on_map: called with each map's id once its curves are done (a progress bar's tick).

    Returns:
        ``{id: (pos [B,S+1] bool, neg [B,S+1] bool)}``; column ``s`` is step ``s``.

    Raises:
        ValueError: maps of the wrong shape, a missing label, an unknown ``target``.
    """
    if target not in ("label", "prediction"):
        raise ValueError(f"target must be 'label' or 'prediction', got {target!r}")
    P = num_prefix_tokens(backbone)
    x0 = embed_tokens(backbone, images)
    B, T, _ = x0.shape
    N = T - P
    for name, m in maps.items():
        if m.shape != (B, N):
            raise ValueError(f"map {name!r} must be [B,N]=({B},{N}), got {tuple(m.shape)}")
    counts = insertion_counts(N, steps)

    def predict(keep_idx: Tensor, x: Tensor) -> Tensor:
        return classify_tokens(backbone, run_blocks(backbone, gather_tokens(x, keep_idx, P))).argmax(-1)

    all_idx = torch.arange(N, device=x0.device).expand(B, N)
    full_pred = predict(all_idx, x0)
    if target == "label" and labels is None:
        raise ValueError("target='label' needs labels [B]")
    ref = labels.to(x0.device).long() if target == "label" else full_pred
    full_ok = full_pred == ref
    empty_ok = predict(all_idx[:, :0], x0) == ref
    x2 = torch.cat([x0, x0])
    out: dict[str, tuple[Tensor, Tensor]] = {}
    for name, m in maps.items():
        order = torch.argsort(m.to(x0.device).float(), dim=1, descending=True, stable=True)   # most relevant first
        pos, neg = [], []
        for k in counts:
            if k == 0 or k == N:
                ok = full_ok if k == 0 else empty_ok
                pos.append(ok)
                neg.append(ok)
                continue
            keep_pos = order[:, k:].sort(dim=1).values           # most relevant k removed
            keep_neg = order[:, :N - k].sort(dim=1).values       # least relevant k removed
            ok = predict(torch.cat([keep_pos, keep_neg]), x2) == torch.cat([ref, ref])
            pos.append(ok[:B])
            neg.append(ok[B:])
        out[name] = (torch.stack(pos, 1).cpu(), torch.stack(neg, 1).cpu())
        if on_map is not None:
            on_map(name)
    return out


def _batches(data: Any, n: int, batch_size: int):
    """Yield ``(images, labels)`` from a Dataset of Samples, a Batch or an ``(images, labels)`` pair."""
    if isinstance(data, (tuple, list)) and len(data) == 2 and isinstance(data[0], Tensor):
        images, labels = data
        for i in range(0, n, batch_size):
            yield images[i:i + batch_size], None if labels is None else labels[i:i + batch_size]
        return
    if hasattr(data, "images") and hasattr(data, "labels"):
        for i in range(0, n, batch_size):
            yield data.images[i:i + batch_size], data.labels[i:i + batch_size]
        return
    from torch.utils.data import DataLoader, Subset

    sub = Subset(data, list(range(n)))
    for b in DataLoader(sub, batch_size=batch_size, collate_fn=collate_samples):
        yield b.images, b.labels


def _run(backbone, data, maps: Mapping[str, Tensor], steps: int, target: ReferenceClass, batch_size: int,
         device, progress: bool) -> tuple[dict[str, tuple[Tensor, Tensor]], Tensor]:
    if not maps:
        raise ValueError("need at least one relevance map")
    sizes = {tuple(m.shape) for m in maps.values()}
    if len(sizes) != 1 or len(next(iter(sizes))) != 2:
        raise ValueError(f"every map must be [M,N] with the same M and N, got {sorted(sizes)}")
    M = next(iter(sizes))[0]
    device = torch.device(device)
    backbone.to(device).eval()
    parts: dict[str, list[tuple[Tensor, Tensor]]] = {k: [] for k in maps}
    seen = 0
    # one tick per (batch, map): a batch of every map can take minutes on a CPU
    with tqdm(total=-(-M // batch_size) * len(maps), desc="perturbation", unit="map", disable=not progress,
              leave=False) as bar:
        for images, labels in _batches(data, M, batch_size):
            b = images.shape[0]
            sl = {k: m[seen:seen + b] for k, m in maps.items()}
            res = perturbation_curves(backbone, images.to(device), sl, steps, labels=labels, target=target,
                                      on_map=lambda _: bar.update(1))
            for k, v in res.items():
                parts[k].append(v)
            seen += b
    if seen != M:
        raise ValueError(f"the maps have M={M} rows but the data gave {seen} images")
    curves = {k: (torch.cat([p for p, _ in v]), torch.cat([n for _, n in v])) for k, v in parts.items()}
    N = next(iter(sizes))[1]
    fractions = torch.tensor(insertion_counts(N, steps), dtype=torch.float64) / N
    return curves, fractions


def perturbation_test(backbone: nn.Module, data: Any, maps: Tensor, steps: int = 10, *,
                      target: ReferenceClass = "label", batch_size: int = 32, device: str | torch.device = "cpu",
                      progress: bool = False) -> dict[str, Any]:
    """Positive and negative perturbation test of one relevance map (TokenTM / Chefer et al.;
    hila-chefer/Transformer-Explainability, ``baselines/ViT/pertubation_eval_from_hdf5.py``).

    Args:
        backbone: timm ViT (eval mode is used; moved to ``device``).
        data: the images whose maps are given, in the maps' row order: a dataset of
            :class:`midas_nb.data.Sample` (its first ``M`` images), a :class:`midas_nb.data.Batch`
            or an ``(images [M,3,H,W], labels [M] | None)`` pair.
        maps: ``[M,N]`` relevance over patch tokens (higher = more relevant).
        steps: ``S`` (``S = 10``: steps of 10 %).
        target: ``"label"`` (default) or ``"prediction"``.
        batch_size, device, progress: evaluation settings.

    Returns:
        ``dict(pos_auc, neg_auc, pos_curve [S+1], neg_curve [S+1], fractions [S+1],
        pos_auc_per_image [M], neg_auc_per_image [M], n_images, steps)`` — AUCs in ``[0,1]``;
        ``pos_auc``: lower is better, ``neg_auc``: higher is better; curves are accuracies.
    """
    curves, fractions = _run(backbone, data, {"map": maps}, steps, target, batch_size, device, progress)
    pos, neg = curves["map"]
    pos_img, neg_img = curve_auc(pos.double(), fractions), curve_auc(neg.double(), fractions)
    return dict(pos_auc=float(pos_img.mean()), neg_auc=float(neg_img.mean()),
                pos_curve=pos.double().mean(0), neg_curve=neg.double().mean(0), fractions=fractions,
                pos_auc_per_image=pos_img, neg_auc_per_image=neg_img, n_images=int(pos.shape[0]), steps=int(steps))


def perturbation_table(backbone: nn.Module, test_set, target_maps: Mapping[str, Tensor], steps: int = 10, *,
                       max_images: int | None = None, subset_seed: int = 0, target: ReferenceClass = "label",
                       batch_size: int = 32, device: str | torch.device = "cpu", n_boot: int = 1000,
                       progress: bool = True) -> pd.DataFrame:
    """Positive/negative perturbation AUCs of several relevance maps on a test split.

    Compares e.g. TokenTM, the rollout over all blocks (``rollout_full``), T3 and T5 the way
    TokenTM's paper does (one embedding per image is shared by all maps). The protocol is
    Chefer's perturbation test, which TokenTM's evaluation reuses (hila-chefer/
    Transformer-Explainability, ``baselines/ViT/pertubation_eval_from_hdf5.py``), in token space.

    Args:
        backbone: timm ViT.
        test_set: dataset of :class:`midas_nb.data.Sample`.
        target_maps: ``{id: [len(test_set), N]}`` in dataset order (e.g.
            ``Study.target_maps()`` or :func:`midas_nb.targets.target_cache` with
            ``class_rule="prediction"``).
        steps: ``S``.
        max_images: a seeded random subset of this many images
            (:func:`midas_nb.data.evaluation_subset`); ``None``: all.
        subset_seed: seed of the subset.
        target: ``"label"`` or ``"prediction"``.
        batch_size, device, progress: evaluation settings.
        n_boot: bootstrap resamples of the 95 % CIs over images.

    Returns:
        One row per map: ``target``, ``pos_auc`` (↓), ``pos_auc_lo``, ``pos_auc_hi``,
        ``neg_auc`` (↑), ``neg_auc_lo``, ``neg_auc_hi``, ``neg_minus_pos`` (↑, with ``_lo``,
        ``_hi``), ``n_images``, ``steps``, ``reference_class``, and the accuracy curves
        ``pos_curve``, ``neg_curve`` (lists over the removed fractions ``fractions``).

    Raises:
        ValueError: maps whose row count differs from ``len(test_set)``.
    """
    from torch.utils.data import Subset


    bad = {k: tuple(v.shape) for k, v in target_maps.items() if v.dim() != 2 or v.shape[0] != len(test_set)}
    if bad:
        raise ValueError(f"target maps must be [len(test_set)={len(test_set)}, N]; got {bad}")
    subset = evaluation_subset(len(test_set), max_images, subset_seed)
    data = test_set if len(subset) == len(test_set) else Subset(test_set, subset)
    idx = torch.tensor(subset, dtype=torch.long)
    maps = {k: v[idx] for k, v in target_maps.items()}
    curves, fractions = _run(backbone, data, maps, steps, target, batch_size, device, progress)
    rows = []
    for name, (pos, neg) in curves.items():
        pos_img, neg_img = curve_auc(pos.double(), fractions), curve_auc(neg.double(), fractions)
        row: dict[str, Any] = dict(target=name)
        for col, v in (("pos_auc", pos_img), ("neg_auc", neg_img), ("neg_minus_pos", neg_img - pos_img)):
            row[col], row[f"{col}_lo"], row[f"{col}_hi"] = bootstrap_ci(v, n_boot=n_boot)
        row.update(n_images=len(subset), steps=int(steps), reference_class=target,
                   pos_curve=pos.double().mean(0).tolist(), neg_curve=neg.double().mean(0).tolist(),
                   fractions=fractions.tolist())
        rows.append(row)
    return pd.DataFrame(rows)
