"""Fine-tuning a backbone on a dataset (:func:`finetune`) and the verified checkpoint cache (:func:`load_or_finetune`)."""
from __future__ import annotations

import json
import math
import os
import re
import time
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..identity import atomic_write, atomic_write_text, file_digest, file_lock, report_corrupt, state_dict_digest
from .vit import classify_tokens, fused_attention
from .checkpoint import checkpoint_dir, checkpoint_key, checkpoint_meta
from .distilled import finetune_distilled
from .factory import create_backbone
from .features import (adamw_cosine, check_training_args, collate_samples, evaluate_accuracy, feature_accuracy,
                       mixed_precision, run_epochs, stem_features)
from .lite0 import is_hybrid, tokens_from_stem_features
from .recipes import is_distilled_name, TrainingRecipe


def finetune(model_name: str, train_set, test_set, recipe: TrainingRecipe, *, device: torch.device | str = "cpu",
             cache_dir: str | os.PathLike | None = None, num_workers: int = 0, progress: bool = True,
             weights: str | os.PathLike | None = None, backbone_kwargs: dict[str, Any] | None = None,
             amp: bool | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """Fine-tune (or, for the hybrid and smoke backbones, train from scratch) a backbone.

    AdamW (no weight decay on biases, norms, position embedding and prefix tokens), per-step
    linear warm-up for ``warmup_epochs`` then cosine decay to 0, cross-entropy with label
    smoothing, random horizontal flips (p = 0.5), seeded (init, order, flips). Mixed
    precision: autocast on CUDA; bfloat16 autocast on CPUs with native bfloat16 (``amp=None``
    decides; ``False`` forces float32). Hybrid backbone: the frozen stem runs once per
    image and its flip (:func:`stem_features`, cached), training touches only the
    transformer; pass the datasets with their *eval* transform (flips are added here).
    Reported accuracies are measured in float32, eval mode, without flips.

    Args:
        model_name: see :func:`create_backbone`.
        train_set / test_set: ``Dataset`` of ``midas_nb.data.Sample`` with the backbone's
            normalisation (:func:`backbone_normalization`) and a fixed image size.
        recipe: the schedule (:class:`~midas_nb.backbones.TrainingRecipe`).
        device: ``"cpu"``, ``"cuda"``, …
        cache_dir: checkpoint cache; stem features go to ``<cache_dir>/stem_features``.
        weights: initial weights (:func:`create_backbone`), e.g. ``"hub"`` for the paper's DeiTs.
        backbone_kwargs: extra :func:`create_backbone` arguments (``img_size``, ``drop_path_rate``).
        amp: mixed precision (``None``: automatic, see above).

    Returns:
        ``(model, meta)``: the model in eval mode and a JSON-serialisable dict (backbone
        config, datasets, classes, recipe, accuracies in ``[0,1]``, timings in s, versions,
        ``num_threads``, ``weights_digest`` — :func:`midas_nb.identity.state_dict_digest`).

    Raises:
        ValueError: empty datasets, labels outside ``[0, num_classes)``.
        BackboneError: see :func:`create_backbone`.
    """
    if is_distilled_name(model_name):  # DeiT-style students: teacher, distillation token, dense hints
        return finetune_distilled(model_name, train_set, test_set, recipe, device=device, cache_dir=cache_dir,
                                  num_workers=num_workers, progress=progress, weights=weights,
                                  backbone_kwargs=backbone_kwargs, amp=amp)
    epochs, batch_size, lr, seed = recipe.epochs, recipe.batch_size, recipe.lr, recipe.seed
    train_labels, test_labels, num_classes = check_training_args(train_set, test_set)
    device = torch.device(device)
    backbone_kwargs = dict(backbone_kwargs or {})
    t_start = time.perf_counter()
    torch.manual_seed(seed)
    model = create_backbone(model_name, num_classes, weights=weights, device=device, **backbone_kwargs)
    hybrid = is_hybrid(model)
    autocast, precision = mixed_precision(device, amp)
    gen = torch.Generator().manual_seed(seed)
    t_feat = time.perf_counter()
    train_feats, test_feats = ([stem_features(model, s, flip=flip, batch_size=batch_size, device=device,
                                              cache_dir=cache_dir, num_workers=num_workers, progress=progress)
                                for s, flip in ((train_set, True), (test_set, False))] if hybrid else (None, None))
    features_s = time.perf_counter() - t_feat
    steps_per_epoch = math.ceil(len(train_set) / batch_size)
    optimizer, scheduler = adamw_cosine(model, (), lr=lr, weight_decay=recipe.weight_decay,
                                        total=epochs * steps_per_epoch,
                                        warmup=max(1, round(recipe.warmup_epochs * steps_per_epoch)))
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and precision == "float16")
    model.train()
    t_train = time.perf_counter()

    def run_epoch(_epoch: int) -> dict[str, float]:
        batches = _batches(train_set, train_labels, train_feats, gen, batch_size, device, num_workers)
        return _train_epoch(model, batches, hybrid, autocast, optimizer, scheduler, scaler, recipe.label_smoothing)

    # training and evaluation run timm's fused attention (speed only, ATTENTION_KERNEL); the
    # returned model is unfused again, as capture needs
    with fused_attention(model):
        history = run_epochs(epochs, f"finetune {model_name}, build {seed}", progress, run_epoch)
        train_s = time.perf_counter() - t_train
        model.eval()
        t_eval = time.perf_counter()
        if hybrid:
            train_acc = feature_accuracy(model, train_feats[:, 0], train_labels, batch_size, device)
            test_acc = feature_accuracy(model, test_feats, test_labels, batch_size, device)
        else:
            train_acc = evaluate_accuracy(model, train_set, batch_size, device, num_workers=num_workers)
            test_acc = evaluate_accuracy(model, test_set, batch_size, device, num_workers=num_workers)
        eval_s = time.perf_counter() - t_eval
    meta = checkpoint_meta(model, model_name, train_set, test_set, recipe, num_classes=num_classes, weights=weights,
                           backbone_kwargs=backbone_kwargs, device=device, amp=amp, precision=precision,
                           train_accuracy=train_acc, test_accuracy=test_acc, history=history,
                           timings=dict(features_s=features_s, train_s=train_s, eval_s=eval_s,
                                        epoch_s=train_s / epochs, total_s=time.perf_counter() - t_start))
    return model, meta


def _batches(train_set, train_labels: Tensor, train_feats: Tensor | None, gen: torch.Generator, batch_size: int,
             device: torch.device, num_workers: int):
    """``(inputs on device, labels on device)`` for one epoch in a seeded order with seeded
    horizontal flips (drawn from ``gen`` when the epoch starts): cached stem features of image
    or flip (``train_feats [M,2,...]``, the hybrid), else the images through a DataLoader."""
    order = torch.randperm(len(train_set), generator=gen)
    flips = torch.rand(len(train_set), generator=gen) < 0.5
    if train_feats is not None:
        for i in range(0, len(order), batch_size):
            idx = order[i:i + batch_size]
            yield train_feats[idx, flips[idx].long()].to(device).float(), train_labels[idx].to(device)
        return
    loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, sampler=order.tolist(),
                                         num_workers=num_workers, collate_fn=collate_samples,
                                         pin_memory=device.type == "cuda")
    for i, (images, labels) in zip(range(0, len(order), batch_size), loader):
        images = torch.where(flips[order[i:i + batch_size]][:, None, None, None], images.flip(-1), images)
        yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)


def _train_epoch(model: nn.Module, batches, hybrid: bool, autocast, optimizer, scheduler, scaler,
                 label_smoothing: float) -> dict[str, float]:
    """One epoch of cross-entropy training (label smoothing) over ``batches`` of ``(inputs,
    labels)`` — stem features for the hybrid, images otherwise; its loss, accuracy and seconds."""
    t_ep = time.perf_counter()
    loss_sum, correct, seen = 0.0, 0, 0
    for x, y in batches:
        with autocast():
            logits = classify_tokens(model, model.blocks(tokens_from_stem_features(model, x))) if hybrid else model(x)
            loss = F.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)
        optimizer.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        scheduler.step()
        loss_sum += float(loss.detach()) * len(y)
        correct += int((logits.argmax(-1) == y).sum())
        seen += len(y)
    return dict(loss=loss_sum / seen, train_running_accuracy=correct / seen, seconds=time.perf_counter() - t_ep)


def load_or_finetune(model_name: str, train_set, test_set, recipe: TrainingRecipe, *,
                     device: torch.device | str = "cpu", cache_dir: str | os.PathLike | None = None,
                     num_workers: int = 0, progress: bool = True, weights: str | os.PathLike | None = None,
                     backbone_kwargs: dict[str, Any] | None = None,
                     amp: bool | None = None) -> tuple[nn.Module, dict[str, Any]]:
    """The cached fine-tuned backbone when its metadata key matches (read without a lock: a read-only
    cache serves), else :func:`finetune` it under the checkpoint's lock (``OSError`` naming the
    checkpoint where that cannot be made).

    Checkpoints live in ``cache_dir`` (default ``midas_nb.config.cache_dir()/checkpoints``) as
    ``<name>-<checkpoint_id>.pt`` (state dict) and ``.json`` (``meta``); ``checkpoint_id`` is
    the hash of :func:`checkpoint_key`. ``meta["loaded_from_cache"]`` tells which happened.
    Arguments and returns as :func:`finetune`.
    """
    ckpt_id, key = checkpoint_key(model_name, train_set, test_set, recipe, weights=weights,
                                  backbone_kwargs=backbone_kwargs, device=device, amp=amp)
    folder = checkpoint_dir(cache_dir)
    stem = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', model_name)}-{ckpt_id}"
    pt, js = folder / f"{stem}.pt", folder / f"{stem}.json"
    args = dict(recipe=recipe, device=device, cache_dir=cache_dir, num_workers=num_workers, progress=progress,
                weights=weights, backbone_kwargs=backbone_kwargs, amp=amp)
    cached = _load_cached(model_name, key, pt, js, args)
    if isinstance(cached, tuple):   # present and verified: read without the lock (a read-only shared cache serves)
        return cached
    # one fine-tune per checkpoint even when many processes (sweep jobs) ask at once: the first
    # holds the lock and trains, the others wait and then load its file
    try:
        with file_lock(folder / f"{stem}.lock"):
            return _load_or_train(model_name, train_set, test_set, ckpt_id, key, pt, js, args)
    except OSError as e:   # the lock cannot be made: a read-only cache that lacks this checkpoint
        if e.filename != str(folder / f"{stem}.lock"):
            raise
        raise OSError(e.errno, f"the checkpoint cache {folder} cannot be written ({e.strerror}) and lacks "
                      f"{pt.name}; expected a writable MIDAS_CACHE_DIR or a cache holding this checkpoint") from None


def _load_cached(model_name: str, key: dict, pt: Path, js: Path,
                 args: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]] | str | None:
    """The checkpoint at ``pt``/``js`` loaded when its metadata holds ``key`` and the weights' digest,
    else why not (a problem), else ``None`` (neither file exists)."""
    if not (pt.is_file() or js.is_file()):
        return None
    try:
        meta = json.loads(js.read_text())
        if meta.get("key") != key:
            return "its metadata holds another key"
        if meta.get("weights_sha256") != file_digest(pt):
            return "the weights file's SHA-256 differs from the one recorded when it was written"
    except (OSError, ValueError, AttributeError) as e:
        return f"unreadable checkpoint or metadata ({type(e).__name__}: {e})"
    model = create_backbone(model_name, int(meta["num_classes"]), weights=pt, device=args["device"], head="keep",
                            **(args["backbone_kwargs"] or {}))
    return model, dict(meta, loaded_from_cache=True, checkpoint_path=str(pt), weights_digest=state_dict_digest(model))


def _load_or_train(model_name: str, train_set, test_set, ckpt_id: str, key: dict, pt: Path, js: Path,
                   args: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    """The body of :func:`load_or_finetune`, under the checkpoint's lock."""
    cached = _load_cached(model_name, key, pt, js, args)
    if isinstance(cached, tuple):   # written by another process while this one waited for the lock
        return cached
    if cached is not None:
        report_corrupt(pt, cached, "checkpoint")
    model, meta = finetune(model_name, train_set, test_set, **args)
    assert meta["checkpoint_id"] == ckpt_id, "checkpoint key changed during training"
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    atomic_write(pt, lambda f: torch.save(state, f))
    # the metadata is written second and records the weights file's digest: a checkpoint is
    # used only when both exist and agree (a crash between the two writes means a rebuild)
    meta = dict(meta, checkpoint_path=str(pt), weights_sha256=file_digest(pt))
    atomic_write_text(js, json.dumps(dict(meta, loaded_from_cache=False), indent=1, default=str))
    return model, meta
