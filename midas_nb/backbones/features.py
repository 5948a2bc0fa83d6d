"""Cached stem features of a dataset (the hybrid trains on them) and the data helpers of fine-tuning."""
from __future__ import annotations

import contextlib
import functools
import os
from pathlib import Path
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..config import cache_dir as default_cache
from ..identity import dataset_identity, file_digest, hash_json, load_or_build
from .optim import cosine_lr
from .vit import classify_tokens, frozen
from .lite0 import efficientnet_lite0_file, FrozenStemEmbed, is_hybrid, tokens_from_stem_features


def collate_samples(samples: list) -> tuple[Tensor, Tensor]:
    """``(images [B,3,H,W], labels [B])`` from a list of ``midas_nb.data.Sample``."""
    return torch.stack([s.image for s in samples]), torch.tensor([int(s.label) for s in samples], dtype=torch.long)


def _loader(dataset, batch_size: int, num_workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False,
                                       num_workers=num_workers, collate_fn=collate_samples)


def _dataset_labels(dataset) -> list[int]:
    labels = getattr(dataset, "labels", None)
    return [int(v) for v in (labels if labels is not None else (dataset[i].label for i in range(len(dataset))))]


def dataset_fingerprint(dataset) -> str:
    """Content identity of a dataset split, independent of where it lives on disk (16 hex digits).

    :attr:`midas_nb.identity.DatasetIdentity.full` of :func:`midas_nb.identity.dataset_identity`:
    image ids and the bytes of every image file, dataset kind, split, class names and labels,
    part keypoints and boxes of the split's images, and the transform (image size, crop,
    normalisation). Moving the directory keeps it; changing one annotation line or one image
    changes it. Checkpoints key on the narrower ``model_inputs`` component (no keypoints, see
    :func:`checkpoint_key`).

    Raises:
        ValueError: for an empty dataset.
    """
    return dataset_identity(dataset).full


def dataset_info(dataset) -> dict[str, Any]:
    """What a checkpoint's metadata records of a split: class name, dataset name, root (``str``
    or ``None``), split, number of images and :func:`dataset_fingerprint`."""
    name = getattr(dataset, "name", None) or getattr(dataset, "dataset_name", None)
    return dict(type=type(dataset).__name__, name=name,
                root=None if getattr(dataset, "root", None) is None else str(dataset.root),
                split=getattr(dataset, "split", None), num_images=len(dataset),
                fingerprint=dataset_fingerprint(dataset))


def _progress(iterable, total: int | None, desc: str, enabled: bool, unit: str = "batch"):
    from ..progress import tqdm
    return tqdm(iterable, total=total, desc=desc, leave=False, unit=unit, disable=not enabled)


@torch.no_grad()
def stem_features(model: nn.Module, dataset, *, flip: bool = False, batch_size: int = 64,
                  device: torch.device | str = "cpu", cache_dir: str | os.PathLike | None = None, num_workers: int = 0,
                  progress: bool = True) -> Tensor:
    """Frozen-stem features of every image of ``dataset``, cached on disk (float16).

    Computed once per (dataset content: images, labels, transform — see
    :func:`midas_nb.identity.dataset_identity`; stem weights; image size; flip) with the
    dataset's own (eval) transform and stored as a verified cache file
    (:func:`midas_nb.identity.load_or_build`: a truncated file is reported and recomputed);
    ``flip=True`` adds the features of the horizontally flipped image.

    Args:
        model: a hybrid backbone (its ``patch_embed`` is a :class:`FrozenStemEmbed`).
        dataset: ``Dataset`` of ``midas_nb.data.Sample``.
        flip: also compute the mirrored copy.
        cache_dir: checkpoint cache root; features go to ``<cache_dir>/stem_features``
            (default ``midas_nb.config.cache_dir()/stem_features``).

    Returns:
        float16 CPU tensor ``[M,112,h,w]`` (``flip=False``) or ``[M,2,112,h,w]`` (index 1 of
        dim 1 is the flipped image), ``M = len(dataset)``, ``(h,w)`` the model's grid.

    Raises:
        ValueError: if ``model`` is not a hybrid backbone.
    """
    if not is_hybrid(model):
        raise ValueError("stem_features needs the hybrid backbone (patch_embed is a FrozenStemEmbed)")
    embed: FrozenStemEmbed = model.patch_embed
    key = dict(kind="lite0_stem_features", data=dataset_identity(dataset).model_inputs,
               stem_sha256=file_digest(efficientnet_lite0_file()), stride=list(embed.patch_size),
               channels=embed.feature_dim, img_size=list(embed.img_size), flip=bool(flip), dtype="float16")
    folder = default_cache(cache_dir) / "stem_features"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"lite0_{hash_json(key)}.pt"

    def build() -> Tensor:
        stem = embed.backbone
        was_device = next(stem.parameters()).device
        stem.to(device)
        out = []
        loader = _loader(dataset, batch_size, num_workers)
        for images, _ in _progress(loader, len(loader), f"stem features ({'+flip' if flip else 'eval'})", progress):
            images = images.to(device)
            f = embed.stem(images).float()
            if flip:
                f = torch.stack([f, embed.stem(images.flip(-1)).float()], dim=1)
            out.append(f.half().cpu())
        stem.to(was_device)
        return torch.cat(out).contiguous()

    return load_or_build(path, build, key=key, what="stem-feature cache",
        validate=lambda t: None if isinstance(t, Tensor) and t.shape[0] == len(dataset)
        else f"holds {getattr(t, 'shape', type(t).__name__)}, expected {len(dataset)} rows")[0]


#: How backbone training and its accuracy evaluation compute attention: timm's fused
#: ``F.scaled_dot_product_attention`` path (:func:`midas_nb.backbones.vit.fused_attention`), the same
#: softmax attention without materialising the ``[B,H,T,T]`` matrix, faster per training step
#: (docs/decisions/0014-training-numerics.md; timings in docs/benchmarks.md). Recorded as ``meta["attention"]``; it sums in another
#: order than the explicit matrix, so like the precision and the thread count it is part of the
#: checkpoint key's training numerics. The returned backbones are unfused again (capture hooks
#: need the matrix).
ATTENTION_KERNEL = "fused (F.scaled_dot_product_attention)"
#: The label of timm's unfused path (the explicit ``softmax(q kᵀ) v`` matrix), for training
#: that runs it (LaSt-ViT's fine-tune, :func:`midas_nb.analysis.last.last_finetune`).
UNFUSED_ATTENTION_KERNEL = "unfused (softmax(q k^T) v)"


def _native_bfloat16() -> bool:
    """Whether this CPU computes bfloat16 natively (AVX-512 BF16 / AMX); elsewhere bfloat16
    autocast is emulated and far slower than float32 (docs/benchmarks.md)."""
    return bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())


def mixed_precision(device: torch.device, amp: bool | None):
    """``(context factory, precision)`` of training on ``device``: calling the factory gives the
    autocast context (``contextlib.nullcontext`` in float32), ``precision`` names its dtype
    (``"bfloat16"``, ``"float16"``, ``"float32"``). ``amp=None`` decides: on for CUDA (bfloat16
    where the GPU supports it, else float16), on CPU only with native bfloat16
    (:func:`machine_info`), off elsewhere; ``False`` forces float32."""
    if amp is None:
        amp = device.type == "cuda" or (device.type == "cpu" and _native_bfloat16())
    if not amp:
        return contextlib.nullcontext, "float32"
    dtype = torch.float16 if device.type == "cuda" and not torch.cuda.is_bf16_supported() else torch.bfloat16
    return functools.partial(torch.autocast, device_type=device.type, dtype=dtype), str(dtype).replace("torch.", "")


@torch.no_grad()
def evaluate_accuracy(model: nn.Module, dataset, batch_size: int = 64, device: torch.device | str = "cpu", *,
                      num_workers: int = 0, progress: bool = False) -> float:
    """Top-1 accuracy in ``[0, 1]`` of ``model`` (eval mode, float32) on a ``Dataset`` of ``Sample``."""
    correct = total = 0
    loader = _loader(dataset, batch_size, num_workers)
    with frozen(model):
        for images, labels in _progress(loader, len(loader), "evaluate", progress):
            logits = model(images.to(device))
            correct += int((logits.argmax(-1).cpu() == labels).sum())
            total += len(labels)
    return correct / max(1, total)


@torch.no_grad()
def feature_accuracy(model: nn.Module, feats: Tensor, labels: Tensor, batch_size: int, device) -> float:
    """Top-1 accuracy in ``[0, 1]`` of a hybrid ``model`` (eval mode) from cached stem features
    ``feats [M,C_s,h,w]`` (:func:`stem_features`) and ``labels [M]``."""
    correct = 0
    with frozen(model):
        for i in range(0, len(labels), batch_size):
            f = feats[i:i + batch_size].to(device).float()
            logits = classify_tokens(model, model.blocks(tokens_from_stem_features(model, f)))
            correct += int((logits.argmax(-1).cpu() == labels[i:i + batch_size]).sum())
    return correct / max(1, len(labels))


def run_epochs(epochs: int, desc: str, progress: bool, run_epoch) -> list[dict[str, Any]]:
    """``epochs`` calls of ``run_epoch(epoch)`` (``epoch`` = 0, 1, …; one epoch each, returning
    its losses and ``train_running_accuracy``) under a progress bar; the per-epoch history. The bar
    shows each finished epoch's count with its ``loss`` and ``train_acc`` (the running accuracy on the training
    batches, MixToken's mixed ones left out; not a test accuracy), set together: a refresh between two epochs
    (tqdm's monitor) pairs them as they belong."""
    history = []
    with _progress(None, epochs, desc, progress, unit="epoch") as bar:
        for epoch in range(epochs):
            history.append(h := dict(epoch=epoch + 1, **run_epoch(epoch)))
            acc = "all mixed" if (a := h["train_running_accuracy"]) is None else f"{a:.3f}"   # None: mixed batches only
            bar.set_postfix(loss=f"{h['loss']:.3f}", train_acc=acc, refresh=False)
            bar.update()
    return history


@torch.no_grad()
def head_accuracies(model: nn.Module, feats: Tensor, labels: Tensor, batch_size: int, device) -> dict[str, float]:
    """Test accuracies of a distilled backbone's class-token head, its distillation-token head
    and their mean (the model's own logits), from cached stem features ``feats [M,C_s,h,w]``."""
    hits = dict(cls=0, dist=0, mean=0)
    for i in range(0, len(labels), batch_size):
        z = model.norm(model.blocks(tokens_from_stem_features(model, feats[i:i + batch_size].to(device).float())))
        lc, ld = model.head(z[:, 0]).cpu(), model.head_dist(z[:, 1]).cpu()
        y = labels[i:i + batch_size]
        for k, lg in (("cls", lc), ("dist", ld), ("mean", (lc + ld) / 2)):
            hits[k] += int((lg.argmax(-1) == y).sum())
    return {k: v / max(1, len(labels)) for k, v in hits.items()}


def package_versions() -> dict[str, str]:
    """``{"torch", "timm", "python"}`` versions, recorded in a checkpoint's metadata."""
    import platform
    import timm

    return dict(torch=torch.__version__, timm=timm.__version__, python=platform.python_version())


def machine_info(device: torch.device | str | None = None) -> dict[str, Any]:
    """Where a build's timings were measured: CPU model (Linux ``/proc/cpuinfo``, else
    ``platform.processor()``), logical CPUs, torch's CPU kernel level (``AVX2``, ``AVX512``, ...)
    and whether the CPU has native bfloat16 (which decides CPU autocast, :func:`mixed_precision`).
    The same recipe runs several times faster on a CPU with AMX/AVX-512 bfloat16 than on an
    AVX2-only one (docs/benchmarks.md), so a timing means little without these. For a CUDA
    ``device`` also the GPU's name (``gpu``)."""
    import platform

    model = platform.processor() or platform.machine()
    try:
        model = next((line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                      if line.startswith("model name")), model)
    except OSError:
        pass
    info = dict(cpu=model, logical_cpus=os.cpu_count(), cpu_capability=torch.backends.cpu.get_cpu_capability(),
                native_bfloat16=_native_bfloat16())
    if device is not None and torch.device(device).type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def check_training_args(train_set, test_set, *, weights: Any = None,
                        from_nothing: str | None = None) -> tuple[Tensor, Tensor, int]:
    """``(train labels [M], test labels [M'], number of classes)`` of a fine-tuning run (the
    schedule checks itself: :class:`~midas_nb.backbones.TrainingRecipe`).

    Raises:
        ValueError: an empty split, initial ``weights`` for a backbone trained from nothing
            (``from_nothing``: its name), train labels outside ``[0, num_classes)``.
    """
    if len(train_set) == 0 or len(test_set) == 0:
        raise ValueError("train_set and test_set must not be empty")
    if from_nothing is not None and weights is not None:
        raise ValueError(f"{from_nothing} is trained from nothing by distillation; weights must be None, got {weights!r}")
    train_labels, test_labels = (torch.tensor(_dataset_labels(s), dtype=torch.long) for s in (train_set, test_set))
    num_classes = int(getattr(train_set, "num_classes", 0) or int(train_labels.max()) + 1)
    if int(train_labels.min()) < 0 or int(train_labels.max()) >= num_classes:
        raise ValueError(f"train labels must lie in [0, {num_classes}), got "
                         f"[{int(train_labels.min())}, {int(train_labels.max())}]")
    return train_labels, test_labels, num_classes


def adamw_cosine(model: nn.Module, extras: Sequence[nn.Module | None], *, lr: float, weight_decay: float,
                 total: int, warmup: int):
    """``(optimizer, scheduler)`` of both fine-tuning recipes: AdamW over ``model`` (no decay on
    norms, biases and tokens: timm's parameter groups) and the training-only ``extras``, with the
    linear warm-up + cosine multiplier :func:`midas_nb.backbones.optim.cosine_lr` stepped per step."""
    from timm.optim import param_groups_weight_decay

    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    params = param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)
    params = [dict(g, params=[p for p in g["params"] if p.requires_grad]) for g in params]
    params += [dict(params=list(extra.parameters()), weight_decay=weight_decay)
               for extra in extras if extra is not None]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999))
    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, cosine_lr(total, warmup))
