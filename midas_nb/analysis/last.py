"""LaSt-ViT selective aggregation: a backbone variant whose class representation is pooled
from the most stable patch tokens, with Patch Score maps and Point-in-Box before and after.

Shi, Yu & Yang, *Vision Transformers Need More Than Registers* (LaSt-ViT, 2026),
https://arxiv.org/abs/2602.22394; official code github.com/ChengShiest/LAST-ViT,
``cls_pretrain/conf.py``, class ``dense_vit`` (followed here). On the tokens after the final
LayerNorm, ``x``, the stability of patch token ``j`` in channel ``d`` is the signed ratio
``r_{j,d} = x_{j,d} / |lowpass(x_j)_d − x_{j,d}|`` (:func:`midas_nb.targets.stability_ratio`,
channel-axis Gaussian low-pass with σ = √D — the same statistic as the ``last_votes`` target,
DESIGN.md §4). **Selective aggregation** replaces the CLS representation by the channel-wise
top-``K`` pooling ``z_d = mean_{j ∈ top-K_j(r_{·,d})} x_{j,d}`` (prefix tokens excluded; the
official config uses ``K = 1``, :data:`LAST_FINETUNE_K`), then the classifier head
(:func:`last_aggregate`, :class:`LaStHead`).

:func:`last_finetune` fine-tunes a copy of the backbone's last block(s) and head with it
(everything else frozen; the input states of the tuned blocks are computed once and cached,
so an epoch runs only the tuned blocks). ``aggregation="cls"`` runs the same recipe with the
CLS head — the control that separates the aggregation from the extra training.
:func:`pib_table` reports Point-in-Box of the Patch Score map (``cos(representation,
patch)`` on the last block's tokens after the final norm, as the official
``visualization/patch_score.py``; the representation is CLS for a plain backbone, ``z`` for the
LaSt variant; :func:`midas_nb.metrics.patch_score`, :func:`midas_nb.metrics.point_in_box`)
beside its centre-patch and box-area baselines, the paired difference to a reference row, and
accuracy per model.
"""
from __future__ import annotations

import copy
import json
import time
from pathlib import Path
from typing import Any, Literal, Mapping

import pandas as pd
import torch
import torch.nn.functional as F
from torch import Tensor, nn
from torch.utils.data import DataLoader, Subset
from ..progress import tqdm

from ..config import cache_dir as default_cache_dir
from ..data import collate_samples, evaluation_subset
from ..identity import dataset_identity, hash_json, load_or_build, state_dict_digest
from ..metrics import bootstrap_ci, box_share, centre_in_box, patch_score, point_in_box
from ..targets import LAST_STATISTIC, resolve_last_k, stability_ratio
from ..train import block_cache, optimise_on_cache
from ..backbones import ATTENTION_KERNEL, machine_info, UNFUSED_ATTENTION_KERNEL
from ..backbones.vit import embed_tokens, frozen, grid_size, num_prefix_tokens, run_blocks

__all__ = ["Aggregation", "LAST_FINETUNE_K", "token_stability", "last_aggregate", "LaStHead", "LaStViT",
           "last_finetune", "patch_score_maps", "pib_table", "pib_columns"]

Aggregation = Literal["last", "cls"]


#: ``K`` of the LaSt fine-tune's aggregation when none is given: 1, the official config
#: (``torch.topk(diff, k=1, dim=1)`` in github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``)
LAST_FINETUNE_K = 1


def token_stability(tokens: Tensor, sigma: float | None = None) -> Tensor:
    """LaSt-ViT stability ``x / |lowpass(x) − x|`` per token and channel: ``[B,N,D] → [B,N,D]`` float32.

    :func:`midas_nb.targets.stability_ratio` (the official ``diff`` of
    github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``, class ``dense_vit``); ``tokens`` are
    patch tokens after the final norm. Raises ``ValueError`` when ``tokens`` is not 3-D.
    """
    return stability_ratio(tokens, sigma)


def last_aggregate(tokens: Tensor, num_tokens: int | None = None, sigma: float | None = None) -> Tensor:
    """Channel-wise top-``K`` pooling of the most stable patch tokens: ``[B,N,D] → [B,D]``
    (LaSt-ViT's selective aggregation; official code ChengShiest/LAST-ViT, class ``dense_vit``,
    with ``K = 1`` there and ``K ≈ N/2`` here, DESIGN.md §4).

    Transcribes github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``, class ``dense_vit``,
    ``forward``: ``indices = topk(diff, K, dim=1, largest=True)``, ``z = mean(gather(x, 1,
    indices), dim=1)`` with ``diff`` = :func:`token_stability`; channel ``d`` of ``z`` averages
    ``x_{j,d}`` over its own ``K`` selected tokens. Differentiable in ``tokens`` through the
    selected values (the selection itself is not, as there).

    Args:
        tokens: ``[B,N,D]`` patch tokens (prefix removed) after the final norm.
        num_tokens: ``K``, ``1 ≤ K ≤ N``. Default: :data:`LAST_FINETUNE_K` (1, the official config).
        sigma: low-pass window width (default ``√D``).

    Returns:
        ``[B,D]`` in the dtype of ``tokens``.

    Raises:
        ValueError: ``tokens`` not 3-D or ``K`` outside ``1..N``.
    """
    stab = token_stability(tokens, sigma)
    k = resolve_last_k(num_tokens, tokens.shape[1], LAST_FINETUNE_K)
    idx = stab.topk(k, dim=1, largest=True).indices                          # [B,K,D]
    return tokens.gather(1, idx).mean(dim=1)


class LaStHead(nn.Module):
    """Classifier on the last block's output with LaSt (or CLS) aggregation.

    ``x = norm(tokens)``; ``logits = head(fc_norm(z))`` with ``z = last_aggregate(x[:, P:], K)``
    (``"last"``: the official ``dense_vit.forward`` of github.com/ChengShiest/LAST-ViT,
    ``cls_pretrain/conf.py``, whose encoder ends with its LayerNorm and whose ``heads`` read ``z``)
    or ``z = x[:, 0]`` (``"cls"``). A distilled backbone (``head_dist`` given; timm
    ``VisionTransformerDistilled``, DeiT) answers the mean of its two heads, and so does this head:
    ``(head(fc_norm(z)) + head_dist(fc_norm(z')))/2`` with ``z'`` the distillation token ``x[:, 1]``
    (``"cls"``) or ``z`` (``"last"``). With ``"cls"`` the logits are the backbone's own
    ``forward_head(norm(tokens))``, plain or distilled.

    Args:
        norm, fc_norm, head, head_dist: the backbone's final norm, pooled-feature norm, classifier
            and distillation classifier (``None``: not distilled); copies are trained by
            :func:`last_finetune`.
        num_prefix: ``P``.
        aggregation: ``"last"`` (default) or ``"cls"``.
        num_tokens: ``K`` (default :data:`LAST_FINETUNE_K`).
        sigma: low-pass window width (default ``√D``).
    """

    def __init__(self, norm: nn.Module, fc_norm: nn.Module, head: nn.Module, num_prefix: int,
                 aggregation: Aggregation = "last", num_tokens: int | None = None, sigma: float | None = None,
                 head_dist: nn.Module | None = None):
        super().__init__()
        assert aggregation in ("last", "cls"), f"aggregation must be 'last' or 'cls', got {aggregation!r}"
        self.norm, self.fc_norm, self.head, self.head_dist = norm, fc_norm, head, head_dist
        self.num_prefix, self.aggregation = int(num_prefix), aggregation
        self.num_tokens, self.sigma = num_tokens, sigma

    def representation(self, normed: Tensor) -> Tensor:
        """The class representation ``z`` from tokens after the final norm: ``[B,P+N,D] → [B,D]``."""
        if self.aggregation == "cls":
            return normed[:, 0]
        return last_aggregate(normed[:, self.num_prefix:], self.num_tokens, self.sigma)

    def logits(self, normed: Tensor, z: Tensor) -> Tensor:
        """``[B,C]`` from the normed tokens ``[B,P+N,D]`` and their representation ``z`` ``[B,D]``."""
        out = self.head(self.fc_norm(z))
        if self.head_dist is None:
            return out
        return (out + self.head_dist(self.fc_norm(normed[:, 1] if self.aggregation == "cls" else z))) / 2

    def forward(self, tokens: Tensor) -> Tensor:
        x = self.norm(tokens)
        return self.logits(x, self.representation(x))


class LaStViT(nn.Module):
    """A frozen timm ViT whose last ``t`` blocks and head are tuned copies with LaSt aggregation.

    The LaSt head follows github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``, class
    ``dense_vit`` (:class:`LaStHead`); there the whole ViT trains, here its last ``t`` blocks.

    ``forward(images) -> [B,C]``; :meth:`patch_scores` gives the Patch Score map ``[B,N]``.
    The backbone is shared (not copied) and stays in eval mode.

    Args:
        backbone: timm ViT (frozen).
        tune_blocks: ``t``, trailing blocks that are copied and tuned, ``1 ≤ t < depth``.
        aggregation: ``"last"`` or ``"cls"`` (see :class:`LaStHead`).
        num_tokens, sigma: see :func:`last_aggregate` (``None``: ``K =`` :data:`LAST_FINETUNE_K`).
    """

    def __init__(self, backbone: nn.Module, tune_blocks: int = 1, aggregation: Aggregation = "last",
                 num_tokens: int | None = None, sigma: float | None = None):
        super().__init__()
        num_tokens = LAST_FINETUNE_K if num_tokens is None else int(num_tokens)
        n = len(backbone.blocks)
        if not 1 <= int(tune_blocks) <= n - 1:
            raise ValueError(f"tune_blocks must be in 1..{n - 1} for a {n}-block ViT, got {tune_blocks}")
        self.backbone, self.start = backbone, n - int(tune_blocks)
        self.blocks = copy.deepcopy(backbone.blocks[self.start:])
        self.head = LaStHead(copy.deepcopy(backbone.norm), copy.deepcopy(getattr(backbone, "fc_norm", nn.Identity())),
                             copy.deepcopy(backbone.head), num_prefix_tokens(backbone), aggregation,
                             num_tokens, sigma, copy.deepcopy(getattr(backbone, "head_dist", None)))
        for p in self.tuned_parameters():       # the backbone may come frozen; its copies train
            p.requires_grad_(True)
        self.history: dict[str, Any] = {}

    def train(self, mode: bool = True) -> "LaStViT":
        super().train(mode)
        self.backbone.eval()
        return self

    def tuned_parameters(self) -> list[nn.Parameter]:
        """Parameters of the tuned copies (blocks and head)."""
        return list(self.blocks.parameters()) + list(self.head.parameters())

    def trunk(self, images: Tensor) -> Tensor:
        """Frozen part: embedding and blocks ``1..n−t``: ``[B,3,H,W] → [B,P+N,D]``."""
        return run_blocks(self.backbone, embed_tokens(self.backbone, images), 0, self.start)

    def forward_tokens(self, x: Tensor) -> Tensor:
        """Tuned blocks on the trunk's output: ``[B,P+N,D] → [B,P+N,D]`` (last block's output)."""
        for blk in self.blocks:
            x = blk(x)
        return x

    def forward(self, images: Tensor) -> Tensor:
        return self.head(self.forward_tokens(self.trunk(images)))

    def scores_and_logits(self, images: Tensor) -> tuple[Tensor, Tensor]:
        """``(patch scores [B,N], logits [B,C])`` from one forward."""
        x = self.head.norm(self.forward_tokens(self.trunk(images)))
        z = self.head.representation(x)
        return F.cosine_similarity(x[:, self.head.num_prefix:], z[:, None], dim=-1), self.head.logits(x, z)

    def patch_scores(self, images: Tensor) -> Tensor:
        """Patch Score ``cos(z, x_j)`` on the last block's tokens after the final norm (``z`` the class
        representation): ``[B,N]``."""
        return self.scores_and_logits(images)[0]


def _scores_and_logits(model: nn.Module, images: Tensor) -> tuple[Tensor, Tensor]:
    if isinstance(model, LaStViT):
        return model.scores_and_logits(images)
    x = model.norm(run_blocks(model, embed_tokens(model, images)))
    return patch_score(x, num_prefix_tokens(model)), model.forward_head(x)


def last_finetune(backbone: nn.Module, train_set, *, aggregation: Aggregation = "last", tune_blocks: int = 1,
                  num_tokens: int | None = None, sigma: float | None = None, epochs: int = 3, batch_size: int = 64,
                  lr: float = 5e-4, weight_decay: float = 0.05, label_smoothing: float = 0.1, seed: int = 0,
                  device: str | torch.device = "cpu", key: Mapping[str, Any] | None = None,
                  cache_dir: str | Path | None = None, progress: bool = True) -> LaStViT:
    """Fine-tune a copy of the backbone's last ``t`` blocks and head(s) with LaSt aggregation.

    The aggregation is the official one (github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``,
    class ``dense_vit``; :class:`LaStHead`); the recipe (which blocks, optimiser, epochs) is this
    package's, as the official recipe trains the whole ViT on ImageNet.

    Everything before the tuned blocks is frozen; the output of block ``depth−t`` of every
    training image is computed once (:func:`midas_nb.train.block_cache`, no augmentation) and
    each step runs the tuned blocks and head only: AdamW, cosine decay per step, cross-entropy
    with label smoothing, batch order seeded by ``seed``.

    Args:
        backbone: the fine-tuned timm ViT (not modified).
        train_set: map-style dataset of :class:`midas_nb.data.Sample`.
        aggregation: ``"last"`` (LaSt-ViT) or ``"cls"`` (the same recipe with the CLS head, a
            control).
        tune_blocks: ``t``, trailing blocks tuned. Default: 1.
        num_tokens, sigma: ``K`` (default :data:`LAST_FINETUNE_K` = 1, the official config) and the
            low-pass width (default ``√D``).
        epochs, batch_size, lr, weight_decay, label_smoothing: optimisation.
        seed: batch order.
        device: where it runs.
        key: identifies the backbone and data (e.g. ``{"checkpoint_id": ..., "dataset": ...}``);
            with a key the block states and the tuned weights are cached on disk under
            ``cache_dir`` (default :func:`midas_nb.config.cache_dir`), ``<cache>/last/<hash>.pt``
            (verified cache file; the key also holds the training split's content identity
            and the backbone's weights digest).
        progress: tqdm bar.

    Returns:
        :class:`LaStViT` in eval mode on ``device``; ``model.history`` holds per-epoch
        ``loss`` and ``train_accuracy``, ``seconds``, the settings, and ``precision``, ``attention``
        and ``machine`` (:func:`midas_nb.backbones.machine_info`) of the build.
    """

    device = torch.device(device)
    backbone.to(device)
    model = LaStViT(backbone, tune_blocks, aggregation, num_tokens, sigma).to(device)
    # the resolved K and the statistic's version are in the cache key: no result of another
    # statistic (or of the old N//2 default) is reused
    settings = dict(aggregation=aggregation, tune_blocks=int(tune_blocks), num_tokens=model.head.num_tokens,
                    sigma=sigma, statistic=LAST_STATISTIC,
                    epochs=int(epochs), batch_size=int(batch_size), lr=float(lr), weight_decay=float(weight_decay),
                    label_smoothing=float(label_smoothing), seed=int(seed), n_train=len(train_set),
                    **({"heads": "head, head_dist"} if model.head.head_dist is not None else {}))  # distilled

    def build() -> dict[str, Any]:
        cache = block_cache(backbone, train_set, depth=model.start,
                            key=None if key is None else dict(key, split="train", purpose="last_finetune"),
                            cache_dir=cache_dir, device=device, progress=progress, masks=False)
        n = len(cache)
        # float32, the tuned copies' attention path as it is (timm's fused_attn flags; the backbone
        # comes unfused for capture), and the machine: recorded as the backbone checkpoints do
        flags = [m.fused_attn for m in model.blocks.modules() if hasattr(m, "fused_attn")]
        fused = bool(flags) and all(flags)
        history: dict[str, Any] = dict(loss=[], train_accuracy=[], settings=settings, precision="float32",
                                       attention=ATTENTION_KERNEL if fused else UNFUSED_ATTENTION_KERNEL,
                                       machine=machine_info(device))
        sums = [0.0, 0]                     # loss sum, correct count of the current epoch

        def step(idx: torch.Tensor) -> torch.Tensor:
            h = cache.hidden[idx].to(device, torch.float32)
            labels = cache.labels[idx].to(device)
            logits = model.head(model.forward_tokens(h))
            loss = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
            sums[0] += loss.item() * len(idx)
            sums[1] += int((logits.argmax(-1) == labels).sum())
            return loss

        def end_epoch() -> None:
            history["loss"].append(sums[0] / n)
            history["train_accuracy"].append(sums[1] / n)
            sums[:] = [0.0, 0]

        t0 = time.perf_counter()
        model.train()
        with frozen(backbone):
            optimise_on_cache(model.tuned_parameters(), n, step, epochs=epochs, batch_size=batch_size, lr=lr,
                              weight_decay=weight_decay, seed=seed, desc=f"LaSt fine-tune ({aggregation})",
                              progress=progress, end_epoch=end_epoch)
        model.eval()
        history["seconds"] = time.perf_counter() - t0
        return {"blocks": {k: v.detach().cpu() for k, v in model.blocks.state_dict().items()},
                "head": {k: v.detach().cpu() for k, v in model.head.state_dict().items()},
                "history": json.dumps(history, default=str)}

    if key is None:
        blob, loaded = build(), False
    else:
        root = default_cache_dir(cache_dir)
        full_key = dict(key, kind="last_finetune", data=dataset_identity(train_set).model_inputs,
                        weights=state_dict_digest(backbone), **settings)
        blob, loaded = load_or_build(root / "last" / f"{hash_json(full_key)}.pt", build, key=full_key,
                                     what="LaSt fine-tune cache")
    if loaded:
        model.blocks.load_state_dict(blob["blocks"])
        model.head.load_state_dict(blob["head"])
    model.history = dict(json.loads(blob["history"]), from_cache=loaded)
    return model.eval()


@torch.no_grad()
def patch_score_maps(models: Mapping[str, nn.Module], images: Tensor) -> dict[str, Tensor]:
    """Patch Score maps ``{name: [B,N]}`` of each model on ``images`` (on the models' device).

    A plain timm ViT: ``cos(h_CLS, h_j)`` at the last block (:func:`midas_nb.metrics.patch_score`);
    a :class:`LaStViT`: ``cos(z, h_j)`` with its class representation ``z``.
    """
    return {name: _scores_and_logits(m.eval(), images)[0] for name, m in models.items()}


def pib_columns(hits: Tensor, box_mask: Tensor, grid: tuple[int, int], *, reference_hits: Tensor | None = None,
                n_boot: int = 1000) -> dict[str, float]:
    """Point-in-Box of one ranking beside its baselines and, optionally, against a reference ranking.

    Columns (DESIGN.md §6): ``pib``, ``pib_lo``, ``pib_hi`` (mean and 95 % bootstrap CI over
    images); ``pib_centre`` — the rate of the centre patch alone
    (:func:`midas_nb.metrics.centre_in_box`); ``pib_box_area`` — the mean share of patches in the
    box, the expected PiB of a uniformly random patch (:func:`midas_nb.metrics.box_share`); with
    ``reference_hits``: ``pib_delta``, ``pib_delta_lo``, ``pib_delta_hi`` — the paired difference
    ``mean(hit − hit_ref)`` with its bootstrap CI over the same images, and ``pib_agreement`` — the
    fraction of images whose outcome (hit or miss) equals the reference's.

    Args:
        hits: ``[M]`` bool, the ranking's top patch is in the box (:func:`midas_nb.metrics.point_in_box`).
        box_mask: ``[M,N]`` bool boxes of the same images.
        grid: ``(rows, cols)`` patch grid.
        reference_hits: ``[M]`` bool of the reference ranking on the same images, or ``None``.
        n_boot: bootstrap resamples.

    Raises:
        ValueError: ``hits`` / ``reference_hits`` / ``box_mask`` disagree in the number of images.
    """
    hits = hits.reshape(-1).float()
    if box_mask.shape[0] != hits.numel() or (reference_hits is not None and reference_hits.numel() != hits.numel()):
        raise ValueError(f"hits ({hits.numel()}), box_mask ({tuple(box_mask.shape)}) and reference_hits "
                         f"({None if reference_hits is None else reference_hits.numel()}) must cover the same images")
    pib, lo, hi = bootstrap_ci(hits, n_boot=n_boot)
    out = dict(pib=pib, pib_lo=lo, pib_hi=hi, pib_centre=float(centre_in_box(box_mask, grid).float().mean()),
               pib_box_area=float(box_share(box_mask).mean()))
    if reference_hits is not None:
        ref = reference_hits.reshape(-1).float()
        d, d_lo, d_hi = bootstrap_ci(hits - ref, n_boot=n_boot)
        out.update(pib_delta=d, pib_delta_lo=d_lo, pib_delta_hi=d_hi, pib_agreement=float((hits == ref).float().mean()))
    return out


def pib_table(models: Mapping[str, nn.Module], test_set, *, reference: str | None = None, max_images: int | None = None,
              subset_seed: int = 0, batch_size: int = 32, device: str | torch.device = "cpu", n_boot: int = 1000,
              progress: bool = True) -> pd.DataFrame:
    """Point-in-Box of the Patch Score map, its baselines, and top-1 accuracy of each model.

    Patch Score on the last block's tokens after the final norm (official
    github.com/ChengShiest/LAST-ViT, ``visualization/patch_score.py`` and
    ``visualization/evaluate_patch_hit.py``: top-1 patch score inside the box).

    Args:
        models: ``{name: model}``, plain timm ViTs (CLS patch score) and/or :class:`LaStViT`.
        test_set: dataset of :class:`midas_nb.data.Sample` (``box_mask`` is the object box).
        reference: the row the others are compared with per image (``pib_delta``,
            ``pib_agreement``); default: the first model (the backbone, by convention).
        max_images: a seeded random subset of this many images
            (:func:`midas_nb.data.evaluation_subset`); ``None``: all.
        subset_seed: seed of that subset.
        batch_size, device, progress: evaluation settings.
        n_boot: bootstrap resamples of the 95 % CIs over images.

    Returns:
        One row per model: ``model``, ``aggregation`` (``"cls"`` for plain backbones),
        ``last_K`` (the LaSt aggregation's ``K``; NaN for CLS rows), the columns of
        :func:`pib_columns` (``pib`` with CI, ``pib_centre``, ``pib_box_area``, ``pib_delta`` with
        CI and ``pib_agreement`` against ``reference``), ``reference``, ``accuracy``,
        ``accuracy_lo``, ``accuracy_hi``, ``n_images``.

    Raises:
        ValueError: no model, or ``reference`` not among them.
    """
    if not models:
        raise ValueError("pib_table needs at least one model")
    reference = next(iter(models)) if reference is None else reference
    if reference not in models:
        raise ValueError(f"reference {reference!r} is not one of the models {list(models)}")
    device = torch.device(device)
    subset = evaluation_subset(len(test_set), max_images, subset_seed)
    data = test_set if len(subset) == len(test_set) else Subset(test_set, subset)
    hits, correct, boxes = {k: [] for k in models}, {k: [] for k in models}, []
    for m in models.values():
        m.to(device).eval()
    with torch.no_grad():
        for batch in tqdm(DataLoader(data, batch_size=batch_size, collate_fn=collate_samples),
                          desc="Point-in-Box", disable=not progress, leave=False):
            images = batch.images.to(device)
            boxes.append(batch.box_mask.bool())
            for name, m in models.items():
                scores, logits = _scores_and_logits(m, images)
                hits[name].append(point_in_box(scores.float().cpu(), batch.box_mask))
                correct[name].append((logits.argmax(-1).cpu() == batch.labels).float())
    box, ref_hits = torch.cat(boxes), torch.cat(hits[reference])
    rows = []
    for name, m in models.items():
        lv = isinstance(m, LaStViT)
        last, grid = lv and m.head.aggregation == "last", grid_size(m.backbone if lv else m)
        acc, acc_lo, acc_hi = bootstrap_ci(torch.cat(correct[name]), n_boot=n_boot)
        rows.append(dict(model=name, aggregation=m.head.aggregation if lv else "cls",
                         last_K=m.head.num_tokens if last else float("nan"),
                         **pib_columns(torch.cat(hits[name]), box, grid, reference_hits=ref_hits, n_boot=n_boot),
                         reference=reference, accuracy=acc, accuracy_lo=acc_lo, accuracy_hi=acc_hi,
                         n_images=len(subset)))
    return pd.DataFrame(rows)
