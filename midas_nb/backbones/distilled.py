"""Distilling an ImageNet CNN into the offline hybrid ViT: distillation token and token labels.

The offline hybrid ViT (:mod:`midas_nb.backbones`) puts twelve transformer blocks, trained from
nothing, on top of the frozen stride-16 stage of an ImageNet EfficientNet-Lite0. Trained on
labels alone its blocks learn little from the 1,200 photos of the 40-class CUB subset. Here the *rest of the same EfficientNet-Lite0* — its stages above the student's stem,
which saw ImageNet — teaches them, with the field's tools:

- **Distillation token** (Touvron et al., 2021, DeiT, "Training data-efficient image
  transformers & distillation through attention", https://arxiv.org/abs/2012.12877, §4): a
  second prefix token whose head learns the teacher's prediction — soft (KL at temperature
  ``τ``, Hinton et al., 2015, https://arxiv.org/abs/1503.02531) or hard (the teacher's arg max,
  DeiT's "hard-label distillation"); the class token's head learns the label. The loss is
  ``(1-α)·CE(head(z_cls), y) + α·KD(head_dist(z_dist), teacher)``; at inference the model's
  logits are the mean of both heads (timm :class:`~timm.models.deit.VisionTransformerDistilled`).
- **Token labels** (Jiang et al., 2021, "All Tokens Matter: Token Labeling for Training Better
  Vision Transformers", https://arxiv.org/abs/2104.10858): the teacher's class scores *per
  location* (its linear probe applied to every position of its last feature map before
  pooling) are distilled into the final patch tokens through a training-only linear head,
  average-pooled to the teacher's grid (KL per location).
- **MixToken** (same paper): CutMix (Yun et al., 2019, https://arxiv.org/abs/1905.04899) on the
  token grid after the patch embedding — here on the cached stem features, so it costs nothing —
  with the labels mixed by area and the dense teacher targets pasted with the same box.
- **Dense feature hints** (Romero et al., 2015, FitNets, https://arxiv.org/abs/1412.6550), off
  by default: a linear map of the patch tokens regresses the teacher's channel-standardised map.

The teacher is ``stem → blocks[k:] → conv_head → bn2`` of the ImageNet EfficientNet-Lite0
(:func:`lite0_teacher_head`; ``k`` = the stem's stage) with a linear classifier fitted on its
globally pooled features (:func:`fit_linear_probe`). Since the student's frozen stem *is* the
teacher's first stages, the teacher runs on the cached stem features: seconds, not a second
CNN pass. On its own training images a linear probe is (nearly) always correct, so its predictions
there would only repeat the labels: the distillation token and the token labels learn **out-of-fold**
scores instead (``k``-fold cross-fitting, :func:`out_of_fold_logits`: each image's scores come
from a probe that never saw it), which carry the teacher's honest mistakes and class
similarities. The auxiliary heads exist only during training; the saved backbone is a plain timm
``VisionTransformerDistilled`` (two prefix tokens: CLS and distillation).

Measured recipes and accuracies (CUB subset, classes 1–20 for tuning, 21–40 and 1–40 to check):
docs/decisions/0001-distilled-offline-backbone.md, docs/benchmarks.md and
``bench/backbone_distill.py``.

Shapes: stem features ``[M,C_s,h,w]`` (``C_s`` = 112 at stride 16, 40 at stride 8), teacher
features ``[M,1280,h',w']`` (``h' = h/2`` at stride 16: the stride-32 map), pooled ``[M,1280]``,
class score maps ``[M,K,h',w']``, logits ``[M,K]`` for ``K`` classes."""
from __future__ import annotations

import math
import time
from dataclasses import dataclass
from typing import Any, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .vit import fused_attention, num_prefix_tokens
from .checkpoint import checkpoint_meta
from .factory import create_backbone
from .features import (adamw_cosine, check_training_args, feature_accuracy, head_accuracies, mixed_precision,
                       run_epochs, stem_features)
from .lite0 import is_hybrid, lite0_classifier, LITE0_STAGES, tokens_from_stem_features
from .recipes import distill_recipe, DistillRecipe, is_distilled_name, TrainingRecipe
from .token_schedules import coarse_tokens, drop_cells, kept_token_label_loss


def lite0_teacher_head(stride: Literal[8, 16] = 16) -> nn.Sequential:
    """The stages of the ImageNet EfficientNet-Lite0 above its stride-``stride`` stem (frozen, eval):
    ``blocks[k:]`` → ``conv_head`` → ``bn2`` (BN + ReLU6), i.e. ``forward_features`` of
    ``tf_efficientnet_lite0`` continued from :func:`midas_nb.backbones.lite0_stem`'s output.

    ``[B,C_s,h,w] → [B,1280,h·stride/32,w·stride/32]``.

    Raises:
        ValueError: for a stride other than 8 or 16.
    """
    if stride not in LITE0_STAGES:
        raise ValueError(f"Lite0 stem stride must be one of {sorted(LITE0_STAGES)}, got {stride}")
    full = lite0_classifier()
    return nn.Sequential(*full.blocks[LITE0_STAGES[stride][0]:], full.conv_head, full.bn2).requires_grad_(False).eval()


@torch.no_grad()
def teacher_features(head: nn.Module, stem_feats: Tensor, batch_size: int = 64,
                     device: torch.device | str = "cpu") -> Tensor:
    """Teacher feature maps of cached stem features, float16 on CPU.

    ``[M,C_s,h,w]`` or ``[M,2,C_s,h,w]`` (image and flip) → ``[M,1280,h',w']`` or
    ``[M,2,1280,h',w']``.
    """
    flat = stem_feats.flatten(0, 1) if stem_feats.dim() == 5 else stem_feats
    head = head.to(device)
    feats = torch.cat([head(flat[i:i + batch_size].to(device).float()).half().cpu()
                       for i in range(0, len(flat), batch_size)])
    return feats.view(*stem_feats.shape[:2], *feats.shape[1:]) if stem_feats.dim() == 5 else feats


class LinearProbe(nn.Module):
    """Linear classifier on standardised features: ``[M,F] → [M,K]``, ``(x − μ)/σ · Wᵀ + b``."""

    def __init__(self, mean: Tensor, std: Tensor, num_classes: int):
        super().__init__()
        self.register_buffer("mean", mean.clone())
        self.register_buffer("std", std.clone())
        self.fc = nn.Linear(mean.numel(), num_classes)

    def forward(self, x: Tensor) -> Tensor:
        return self.fc((x.float() - self.mean) / self.std)


def fit_linear_probe(features: Tensor, labels: Tensor, num_classes: int, *, steps: int = 100, lr: float = 1e-2,
                     weight_decay: float = 0.1, label_smoothing: float = 0.1, seed: int = 0) -> LinearProbe:
    """Fit a :class:`LinearProbe` by full-batch AdamW on cross-entropy with label smoothing.

    Args:
        features: ``[M,F]`` pooled teacher features (float).
        labels: ``[M]`` class indices in ``[0, num_classes)``.

    Raises:
        ValueError: mismatched lengths or labels outside ``[0, num_classes)``.
    """
    if features.dim() != 2 or labels.shape != (features.shape[0],):
        raise ValueError(f"need features [M,F] and labels [M], got {tuple(features.shape)} and {tuple(labels.shape)}")
    if len(labels) and (int(labels.min()) < 0 or int(labels.max()) >= num_classes):
        raise ValueError(f"labels must lie in [0, {num_classes}), got [{int(labels.min())}, {int(labels.max())}]")
    x = features.float()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        # a floor on the scale: a channel almost constant over the pooled training features
        # (a ReLU6 unit that rarely fires) must not blow up when the probe is applied per location
        std = x.std(0)
        probe = LinearProbe(x.mean(0), std.clamp_min(0.01 * float(std.mean()) + 1e-6), num_classes)
    opt = torch.optim.AdamW(probe.parameters(), lr=lr, weight_decay=weight_decay)
    with torch.enable_grad():
        for _ in range(steps):
            loss = F.cross_entropy(probe(x), labels, label_smoothing=label_smoothing)
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
    return probe.eval().requires_grad_(False)


def probe_maps(probe: LinearProbe, maps: Tensor, batch_size: int = 256) -> Tensor:
    """The probe applied at every location of teacher feature maps (before pooling): class
    score maps ``[n,F,h,w] → [n,K,h,w]`` (float32). The probe is affine, so their mean over
    locations equals the probe's logits of the pooled features."""
    out = [probe(maps[i:i + batch_size].float().permute(0, 2, 3, 1)).permute(0, 3, 1, 2)
           for i in range(0, len(maps), batch_size)]
    return torch.cat(out) if out else maps.new_zeros(0, probe.fc.out_features, *maps.shape[-2:]).float()


def out_of_fold_logits(pooled: Tensor, labels: Tensor, num_classes: int, folds: int, *, seed: int = 0,
                       maps: Tensor | None = None, **probe_kw: Any) -> Tensor:
    """Cross-fitted probe logits: each image's logits come from a probe fitted without it.

    Args:
        pooled: ``[M,V,F]`` pooled teacher features of ``V`` views per image (image, flip); the
            views of one image always fall in the same fold.
        labels: ``[M]``.
        folds: number of folds (``>= 2``); images are split by a permutation seeded with ``seed``.
        maps: optional ``[M,V,F,h,w]`` teacher maps (``pooled`` is their mean); then the
            held-out probe is applied at every location (:func:`probe_maps`).
        **probe_kw: :func:`fit_linear_probe` settings.

    Returns:
        ``[M,V,K]`` logits, or ``[M,V,K,h,w]`` score maps when ``maps`` is given.

    Raises:
        ValueError: fewer images than folds, or ``folds < 2``.
    """
    M, V, Fdim = pooled.shape
    if folds < 2 or M < folds:
        raise ValueError(f"need 2 <= folds <= number of images, got folds={folds} for {M} images")
    perm = torch.randperm(M, generator=torch.Generator().manual_seed(seed))
    out = torch.empty(M, V, num_classes, *(() if maps is None else maps.shape[-2:]))
    for f, held in enumerate(perm.chunk(folds)):
        keep = torch.ones(M, dtype=torch.bool)
        keep[held] = False
        probe = fit_linear_probe(pooled[keep].flatten(0, 1), labels[keep].repeat_interleave(V), num_classes,
                                 seed=seed + f, **probe_kw)
        out[held] = (probe(pooled[held].flatten(0, 1)).view(len(held), V, num_classes) if maps is None
                     else probe_maps(probe, maps[held].flatten(0, 1)).view(len(held), V, *out.shape[2:]))
    return out


def distillation_loss(logits_cls: Tensor, logits_dist: Tensor, labels: Tensor, teacher_logits: Tensor,
                      recipe: DistillRecipe, label_smoothing: float = 0.1, *,
                      labels_mixed: Tensor | None = None, lam: float = 1.0) -> Tensor:
    """``(1−α)·CE(logits_cls, labels) + α·KD(logits_dist, teacher)`` (DeiT, §4).

    KD is ``τ²·KL(softmax(t/τ) ‖ softmax(s/τ))`` (``token="soft"``), ``CE(s, argmax t)``
    (``"hard"``) or ``CE(s, labels)`` (``"none"``). With MixToken (``labels_mixed``, the labels of
    the pasted images, and ``λ`` the kept area) every label cross-entropy is
    ``λ·CE(·, labels) + (1−λ)·CE(·, labels_mixed)``. Inputs ``[B,K]``, ``labels [B]``; returns a scalar.
    """
    def ce(logits: Tensor) -> Tensor:
        out = F.cross_entropy(logits, labels, label_smoothing=label_smoothing)
        if labels_mixed is not None:
            out = lam * out + (1.0 - lam) * F.cross_entropy(logits, labels_mixed, label_smoothing=label_smoothing)
        return out

    s = logits_dist.float()
    if recipe.token == "soft":
        t = recipe.tau
        kd = t * t * F.kl_div(F.log_softmax(s / t, -1), F.log_softmax(teacher_logits.float() / t, -1),
                              reduction="batchmean", log_target=True)
    elif recipe.token == "hard":
        kd = F.cross_entropy(s, teacher_logits.argmax(-1))
    else:
        kd = ce(s)
    return (1.0 - recipe.alpha) * ce(logits_cls.float()) + recipe.alpha * kd


def _token_maps(tokens: Tensor, head: nn.Linear, grid: tuple[int, int], size: tuple[int, int]) -> Tensor:
    """A linear map of patch tokens ``[B,N,D]`` on the patch grid, average-pooled to ``size``:
    ``[B,C,size]`` (float32)."""
    return F.adaptive_avg_pool2d(head(tokens).float().transpose(1, 2).reshape(tokens.shape[0], -1, *grid), size)


def token_label_loss(student_maps: Tensor, teacher_maps: Tensor) -> Tensor:
    """Token labeling (Jiang et al., 2021, https://arxiv.org/abs/2104.10858): ``KL(softmax(t) ‖
    softmax(s))`` over classes at every location, mean over locations and images.
    ``[B,K,h,w]`` both; returns a scalar."""
    return F.kl_div(F.log_softmax(student_maps.float(), 1), F.log_softmax(teacher_maps.float(), 1),
                    reduction="none", log_target=True).sum(1).mean()


def mix_tokens(stem: Tensor, targets: Sequence[Tensor], generator: torch.Generator) -> tuple[Tensor, list[Tensor], Tensor, float]:
    """MixToken (Jiang et al., 2021): CutMix on the token grid after the patch embedding.

    A box covering a fraction ``1 − λ`` of the image (``λ ~ U(0, 1)``, the CutMix rule of Yun et
    al., 2019, with ``Beta(1, 1)``), aligned with the grid of the dense ``targets``, is pasted
    into every image from image ``perm[i]`` of the batch, in the stem features and in each
    target map alike.

    Args:
        stem: ``[B,C,H,W]`` stem features; ``H, W`` multiples of the targets' ``h, w``.
        targets: ``[B,…,h,w]`` maps (teacher features, teacher score maps).
        generator: the RNG of the box, ``λ`` and the permutation.

    Returns:
        ``(stem, targets, perm, lam)``: mixed copies, the permutation ``[B]`` and the exact
        kept area fraction ``λ = 1 − box area / (h·w)`` (the weight of each image's own label).
    """
    B, _, H, W = stem.shape
    h, w = targets[0].shape[-2:]
    assert H % h == 0 and W % w == 0, f"stem grid {(H, W)} must be a multiple of the target grid {(h, w)}"
    lam = float(torch.rand((), generator=generator))
    bh, bw = (min(n, max(1, round(n * math.sqrt(1.0 - lam)))) for n in (h, w))
    r0 = int(torch.randint(0, h - bh + 1, (), generator=generator))
    c0 = int(torch.randint(0, w - bw + 1, (), generator=generator))
    perm = torch.randperm(B, generator=generator)
    fy, fx = H // h, W // w

    def paste(t: Tensor, f0: int, f1: int) -> Tensor:
        t = t.clone()
        rs, cs = slice(r0 * f0, (r0 + bh) * f0), slice(c0 * f1, (c0 + bw) * f1)
        t[..., rs, cs] = t[perm][..., rs, cs]
        return t

    return paste(stem, fy, fx), [paste(t, 1, 1) for t in targets], perm, 1.0 - bh * bw / (h * w)


def _checked_recipe(model_name: str, recipe: DistillRecipe | None, epochs: int) -> DistillRecipe:
    """The recipe a build takes: the registry's (the checkpoint key reads it), with fewer coarse
    epochs than epochs. Raises ``ValueError`` otherwise."""
    if recipe is not None and is_distilled_name(model_name) and recipe != distill_recipe(model_name):
        raise ValueError(f"distill={recipe} differs from DISTILLED_RECIPES[{model_name!r}]; the checkpoint key is "
                         "built from that registry, so set the recipe there (as bench/backbone_distill.py does)")
    recipe = recipe or distill_recipe(model_name)
    if recipe.coarse_epochs >= epochs:
        raise ValueError(f"coarse_epochs={recipe.coarse_epochs} must be < epochs={epochs}: the last epochs must "
                         "see every patch token, as evaluation and the saved backbone do")
    return recipe


def finetune_distilled(model_name: str, train_set, test_set, recipe: TrainingRecipe, *,
                       device: torch.device | str = "cpu", cache_dir=None, num_workers: int = 0, progress: bool = True,
                       weights=None, backbone_kwargs: dict[str, Any] | None = None, amp: bool | None = None,
                       distill: DistillRecipe | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Train a distilled hybrid backbone from nothing (distillation token, token labels, MixToken).

    Same arguments (``recipe``: the :class:`TrainingRecipe`) and returns as
    :func:`midas_nb.backbones.finetune` (which calls this for the names of
    :data:`DISTILLED_RECIPES`): AdamW, linear warm-up + cosine, label
    smoothing, random flips through the cached stem features of image and flip, bfloat16
    autocast on CPUs with native bfloat16. Added (``distill``, by default the registry's
    :class:`DistillRecipe`): the teacher
    (:func:`lite0_teacher_head` and a :func:`fit_linear_probe` on its pooled features of the
    training images and their flips), its out-of-fold class score maps (token labels; their
    mean is the distillation token's target), MixToken, and optionally the dense hint. ``meta`` adds
    ``distillation``: the recipe, the teacher's test / out-of-fold train accuracy, the
    student's class-token / distillation-token / mean-of-both test accuracies, and timings.
    ``test_accuracy`` is the model's own (mean of both heads, as ``model(images)``).

    Raises:
        ValueError: as :func:`~midas_nb.backbones.finetune`; also for a name that is not a
            distilled hybrid backbone, a ``distill`` recipe other than the registry's (the checkpoint key
            reads :data:`DISTILLED_RECIPES`), or ``coarse_epochs >= epochs``.
    """
    epochs, batch_size, lr, seed = recipe.epochs, recipe.batch_size, recipe.lr, recipe.seed
    distill = _checked_recipe(model_name, distill, epochs)
    train_labels, test_labels, num_classes = check_training_args(train_set, test_set,
                                                                 weights=weights, from_nothing=model_name)
    device = torch.device(device)
    backbone_kwargs = dict(backbone_kwargs or {})
    t_start = time.perf_counter()
    torch.manual_seed(seed)
    model = create_backbone(model_name, num_classes, device=device, **backbone_kwargs)
    if not (is_hybrid(model) and num_prefix_tokens(model) == 2):
        raise ValueError(f"{model_name} must be a hybrid backbone with a distillation token")
    autocast, precision = mixed_precision(device, amp)
    gen = torch.Generator().manual_seed(seed)
    teacher = _teacher_targets(model, distill, train_set, test_set, train_labels, test_labels, num_classes, seed=seed,
                               batch_size=batch_size, device=device, cache_dir=cache_dir, num_workers=num_workers,
                               progress=progress)
    # training-only linear heads on the patch tokens (not part of the saved backbone)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed + 1)
        hint = nn.Linear(model.embed_dim, teacher.channels).to(device) if distill.hint_weight > 0 else None
        tl_head = nn.Linear(model.embed_dim, num_classes).to(device) if distill.token_label_weight > 0 else None
    steps_per_epoch = math.ceil(len(train_set) / batch_size)
    optimizer, scheduler = adamw_cosine(model, (hint, tl_head), lr=lr, weight_decay=recipe.weight_decay,
                                        total=epochs * steps_per_epoch,
                                        warmup=max(1, round(recipe.warmup_epochs * steps_per_epoch)))
    step = _DistillStep(model=model, recipe=distill, teacher=teacher, train_labels=train_labels, hint=hint,
                        tl_head=tl_head, optimizer=optimizer, scheduler=scheduler, autocast=autocast,
                        scaler=torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and precision == "float16"),
                        label_smoothing=recipe.label_smoothing, batch_size=batch_size, device=device, gen=gen)
    model.train()
    t0 = time.perf_counter()
    with fused_attention(model):  # speed only (ATTENTION_KERNEL); the returned model is unfused again
        history = run_epochs(epochs, f"distil {model_name}, build {seed}" + (
            f" (coarse tokens to epoch {distill.coarse_epochs}: the ETA rises after)" if distill.coarse_epochs else ""),
            progress, step.epoch)
        train_s = time.perf_counter() - t0
        model.eval()
        del step, teacher.train, teacher.maps
        t0 = time.perf_counter()
        train_acc = feature_accuracy(model, teacher.train_feats[:, 0], train_labels, batch_size, device)
        head_acc = head_accuracies(model, teacher.test_feats, test_labels, batch_size, device)
        eval_s = time.perf_counter() - t0
    meta = checkpoint_meta(model, model_name, train_set, test_set, recipe, num_classes=num_classes, weights=None,
        backbone_kwargs=backbone_kwargs, device=device, amp=amp, precision=precision, distillation=dict(
            distill.key(), teacher="EfficientNet-Lite0 (ImageNet-1k) stages above the stem + linear probe",
            teacher_test_accuracy=teacher.test_accuracy, teacher_train_accuracy_out_of_fold=teacher.train_accuracy,
            student_test_accuracy_cls=head_acc["cls"], student_test_accuracy_dist=head_acc["dist"],
            student_test_accuracy=head_acc["mean"]),
        train_accuracy=train_acc, test_accuracy=head_acc["mean"], history=history,
        timings=dict(features_s=teacher.features_s, teacher_s=teacher.teacher_s, train_s=train_s, eval_s=eval_s,
                     epoch_s=train_s / epochs, total_s=time.perf_counter() - t_start))
    return model, meta


@dataclass
class _Teacher:
    """The stem features of both splits (train: image and flip) and what the teacher gives the
    student: class score maps ``maps [M,2,K,h',w']`` (half precision), its features ``train``
    ``[M,2,1280,h',w']`` for the dense hint (``None`` without one) with their channel mean/std."""

    train_feats: Tensor
    test_feats: Tensor
    train: Tensor | None
    maps: Tensor
    hint_mean: Tensor
    hint_std: Tensor
    channels: int
    grid: tuple[int, int]
    test_accuracy: float
    train_accuracy: float
    features_s: float
    teacher_s: float


def _teacher_targets(model: nn.Module, recipe: DistillRecipe, train_set, test_set, train_labels: Tensor,
                     test_labels: Tensor, num_classes: int, *, seed: int, batch_size: int, device: torch.device,
                     cache_dir, num_workers: int, progress: bool) -> _Teacher:
    """Stem features (cached by :func:`midas_nb.backbones.stem_features`), then the teacher on
    top of them: a linear probe on its pooled features and its (out-of-fold) class score maps."""
    t0 = time.perf_counter()
    train_feats = stem_features(model, train_set, flip=True, batch_size=batch_size, device=device,
                                cache_dir=cache_dir, num_workers=num_workers, progress=progress)
    test_feats = stem_features(model, test_set, flip=False, batch_size=batch_size, device=device,
                               cache_dir=cache_dir, num_workers=num_workers, progress=progress)
    features_s = time.perf_counter() - t0
    t0 = time.perf_counter()
    head = lite0_teacher_head(model.patch_embed.patch_size[0])
    t_train = teacher_features(head, train_feats, batch_size, device)            # [M,2,1280,h',w']
    t_test = teacher_features(head, test_feats, batch_size, device)              # [M',1280,h',w']
    M, tgrid = len(train_labels), tuple(t_train.shape[-2:])
    pooled = t_train.float().mean((-1, -2))                                      # [M,2,1280]
    probe_kw = dict(steps=recipe.probe_steps, lr=recipe.probe_lr, weight_decay=recipe.probe_weight_decay,
                    label_smoothing=recipe.probe_label_smoothing)
    probe = fit_linear_probe(pooled.flatten(0, 1), train_labels.repeat_interleave(2), num_classes, seed=seed,
                             **probe_kw)
    teacher_test_acc = float((probe(t_test.float().mean((-1, -2))).argmax(-1) == test_labels).float().mean())
    del t_test
    # the teacher's class scores on the training images: per location (token labels; their mean
    # is the pooled logit), out of fold unless oof_folds = 0
    t_maps = (out_of_fold_logits(pooled, train_labels, num_classes, recipe.oof_folds, seed=seed, maps=t_train,
                                 **probe_kw) if recipe.oof_folds
              else probe_maps(probe, t_train.flatten(0, 1)).view(M, 2, num_classes, *tgrid))
    if not torch.isfinite(t_maps).all():
        raise ValueError("the teacher's class score maps are not finite; the probe diverged "
                         f"(probe settings {probe_kw})")
    t_maps = t_maps.half()                                                       # [M,2,K,h',w']
    teacher_train_acc = float((t_maps[:, 0].float().mean((-1, -2)).argmax(-1) == train_labels).float().mean())
    return _Teacher(train_feats=train_feats, test_feats=test_feats, train=t_train if recipe.hint_weight else None,
                    maps=t_maps, hint_mean=t_train.float().mean((0, 1, 3, 4))[None, :, None, None].to(device),
                    hint_std=t_train.float().std((0, 1, 3, 4))[None, :, None, None].to(device) + 1e-3,
                    channels=int(t_train.shape[2]), grid=tgrid, test_accuracy=teacher_test_acc,
                    train_accuracy=teacher_train_acc, features_s=features_s, teacher_s=time.perf_counter() - t0)


@dataclass
class _DistillStep:
    """One epoch of distillation training over the cached stem features (:meth:`epoch`)."""

    model: nn.Module
    recipe: DistillRecipe
    teacher: _Teacher
    train_labels: Tensor
    hint: nn.Linear | None
    tl_head: nn.Linear | None
    optimizer: torch.optim.Optimizer
    scheduler: Any
    autocast: Any
    scaler: Any
    label_smoothing: float
    batch_size: int
    device: torch.device
    gen: torch.Generator

    def epoch(self, index: int) -> dict[str, Any]:
        """Train epoch ``index`` (0-based; random order and flips from ``gen``; on the teacher's
        grid while ``index < recipe.coarse_epochs``); its losses, accuracy, timing."""
        t_ep = time.perf_counter()
        coarse = index < self.recipe.coarse_epochs
        M = len(self.train_labels)
        order = torch.randperm(M, generator=self.gen)
        flips = (torch.rand(M, generator=self.gen) < 0.5).long()
        sums = dict(loss=0.0, hint=0.0, token_labels=0.0)
        correct = seen = mixed = clean = 0
        for i in range(0, M, self.batch_size):
            idx = order[i:i + self.batch_size]
            loss, lc, ld, y, was_mixed = self._batch(idx, flips[idx], sums, coarse)
            self.optimizer.zero_grad(set_to_none=True)
            self.scaler.scale(loss).backward()
            self.scaler.step(self.optimizer)
            self.scaler.update()
            self.scheduler.step()
            sums["loss"] += float(loss.detach()) * len(y)
            seen, mixed = seen + len(y), mixed + was_mixed
            if not was_mixed:   # a MixToken batch has two labels: the accuracy counts the unmixed batches
                correct, clean = correct + int(((lc + ld).argmax(-1) == y).sum()), clean + len(y)
        return dict(loss=sums["loss"] / seen, hint_loss=sums["hint"] / seen, mixed_batches=mixed, coarse=coarse,
                    token_label_loss=sums["token_labels"] / seen, seconds=time.perf_counter() - t_ep,
                    train_running_accuracy=correct / clean if clean else None)

    def _batch(self, idx: Tensor, fl: Tensor, sums: dict[str, float], coarse: bool = False):
        t, recipe, model, device = self.teacher, self.recipe, self.model, self.device
        x = t.train_feats[idx, fl].to(device).float()
        y = self.train_labels[idx].to(device)
        maps = [t.maps[idx, fl].to(device).float()]
        if self.hint is not None:
            maps.append((t.train[idx, fl].to(device).float() - t.hint_mean) / t.hint_std)
        y2, lam, mixed = None, 1.0, 0
        if recipe.mix_prob > 0 and float(torch.rand((), generator=self.gen)) < recipe.mix_prob:
            x, maps, perm, lam = mix_tokens(x, maps, self.gen)
            y2, mixed = y[perm.to(device)], 1
        grid, P, cells = tuple(model.patch_embed.grid_size), 2, None
        tokens = tokens_from_stem_features(model, x)
        if coarse:
            tokens, grid = coarse_tokens(tokens, P, grid, t.grid), t.grid
        if recipe.token_keep < 1.0:
            tokens, cells = drop_cells(tokens, P, grid, t.grid, recipe.token_keep, self.gen)
        with self.autocast():
            z = model.norm(model.blocks(tokens))
            lc, ld = model.head(z[:, 0]), model.head_dist(z[:, 1])
            loss = distillation_loss(lc, ld, y, maps[0].mean((-1, -2)), recipe, self.label_smoothing,
                                     labels_mixed=y2, lam=lam)
            if self.tl_head is not None:
                lt = (kept_token_label_loss(z[:, P:], self.tl_head, cells, maps[0]) if cells is not None
                      else token_label_loss(_token_maps(z[:, P:], self.tl_head, grid, t.grid), maps[0]))
                loss = loss + recipe.token_label_weight * lt
                sums["token_labels"] += float(lt.detach()) * len(y)
            if self.hint is not None:
                if cells is not None:
                    raise ValueError("the dense hint needs every patch token; use token_keep=1.0 with hint_weight > 0")
                lh = F.mse_loss(_token_maps(z[:, P:], self.hint, grid, t.grid), maps[1])
                loss = loss + recipe.hint_weight * lh
                sums["hint"] += float(lh.detach()) * len(y)
        return loss, lc, ld, y, mixed
