"""What a fine-tuned checkpoint depends on (:func:`checkpoint_key`) and where it is cached."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

from ..config import cache_dir as default_cache
from ..identity import dataset_identity, file_digest, hash_json, state_dict_digest
from .factory import backbone_config
from .features import ATTENTION_KERNEL, dataset_info, machine_info, mixed_precision, package_versions
from .recipes import distill_recipe, is_distilled_name, TrainingRecipe

#: Version of the training recipe in :func:`checkpoint_key`; bump it when the recipe changes in
#: a way that invalidates cached checkpoints.
RECIPE_VERSION = 1


def training_numerics(device: torch.device | str, amp: bool | None) -> dict[str, Any]:
    """What makes two trainings with the same seed give different bits: the precision (autocast
    dtype or float32), the attention kernel (:data:`~midas_nb.backbones.features.ATTENTION_KERNEL`:
    the fused kernel sums in another order than the explicit softmax matrix) and, on CPU, the
    number of intra-op threads (reductions are split by thread, so 1 and 2 threads give different
    float sums; measured on the smoke backbone). A CUDA device on a machine without CUDA is
    keyed as the bfloat16 GPU it will run on."""
    device = torch.device(device)
    # keyed away from the GPU (a Slurm login node): the compute node trains in bfloat16 where
    # its GPU supports it (every GPU since Ampere); one without bfloat16 gives another id and
    # its sweep worker refuses the cells instead of filing float16 rows under this id
    precision = ("bfloat16" if device.type == "cuda" and not torch.cuda.is_available() and amp is not False
                 else mixed_precision(device, amp)[1])
    return dict(device_type=device.type, precision=precision, attention=ATTENTION_KERNEL,
                num_threads=int(torch.get_num_threads()) if device.type == "cpu" else None)


def checkpoint_key(model_name: str, train_set, test_set, recipe: TrainingRecipe, *,
                   weights: str | os.PathLike | None = None, backbone_kwargs: dict[str, Any] | None = None,
                   device: torch.device | str = "cpu", amp: bool | None = None) -> tuple[str, dict[str, Any]]:
    """``(checkpoint_id, key)``: what a fine-tuned checkpoint depends on, and its 12-hex-digit
    SHA-256 (:func:`midas_nb.identity.hash_json`).

    The key holds the model name, initial weights (a file by the SHA-256 of its bytes, not its
    path), backbone kwargs, the ``model_inputs`` identity of both splits (image bytes, labels,
    split, transform — not the part keypoints, which training never reads;
    :func:`midas_nb.identity.dataset_identity`), the recipe and its version, and the training
    numerics (precision; attention kernel; CPU thread count), so that one id means bit-identical
    weights on one machine. Package versions, timings and accuracies are recorded in the metadata only.
    """
    if weights is None or str(weights) == "hub":
        w = None if weights is None else "hub"
    elif Path(weights).is_file():
        w = dict(file_sha256=file_digest(weights), suffix=Path(weights).suffix.lower())
    else:
        w = str(weights)     # create_backbone reports the missing file
    key = dict(model_name=model_name, weights=w,
        backbone_kwargs={k: backbone_kwargs[k] for k in sorted(backbone_kwargs or {})},
        train=dataset_identity(train_set).model_inputs, test=dataset_identity(test_set).model_inputs,
        **recipe.key(), recipe_version=RECIPE_VERSION, numerics=training_numerics(device, amp))
    if is_distilled_name(model_name):  # teacher, losses and their version (midas_nb.backbones.distilled)
        key["distill"] = distill_recipe(model_name).key()
    key = json.loads(json.dumps(key, default=str))
    return hash_json(key, 12), key


def checkpoint_meta(model: nn.Module, model_name: str, train_set, test_set, recipe: TrainingRecipe, *,
                    num_classes: int, weights: Any, backbone_kwargs: dict[str, Any], device: torch.device,
                    amp: bool | None, precision: str, **results: Any) -> dict[str, Any]:
    """The JSON-serialisable metadata of a freshly trained checkpoint (written beside its weights):
    ``checkpoint_id`` and ``key`` (:func:`checkpoint_key`), the backbone's config, initial weights,
    kwargs, both splits (:func:`~midas_nb.backbones.features.dataset_info`), classes, the recipe,
    ``results`` (accuracies in ``[0, 1]``, ``history``, ``timings`` in s, ``distillation``, ...),
    the numerics, package versions, machine and ``weights_digest``."""
    ckpt_id, key = checkpoint_key(model_name, train_set, test_set, recipe, weights=weights,
                                  backbone_kwargs=backbone_kwargs, device=device, amp=amp)
    return dict(checkpoint_id=ckpt_id, key=key, backbone=backbone_config(model, model_name),
        weights=None if weights is None else str(weights), backbone_kwargs=backbone_kwargs,
        train_set=dataset_info(train_set), test_set=dataset_info(test_set),
        classes=[str(c) for c in (getattr(train_set, "classes", None) or range(num_classes))], num_classes=num_classes,
        recipe=dict(recipe.key(), optimizer="AdamW", schedule="linear warm-up + cosine (per step)",
                    augmentation="random horizontal flip p=0.5", recipe_version=RECIPE_VERSION),
        seed=int(recipe.seed), epochs=int(recipe.epochs), **results,
        precision=precision, attention=ATTENTION_KERNEL, device=str(device), versions=package_versions(),
        num_threads=int(torch.get_num_threads()), machine=machine_info(device),
        weights_digest=state_dict_digest(model), loaded_from_cache=False)


def checkpoint_dir(cache_dir: str | os.PathLike | None) -> Path:
    """The checkpoint folder: ``cache_dir`` itself, or ``midas_nb.config.cache_dir()/checkpoints``
    for ``None``; created if missing."""
    p = Path(cache_dir) if cache_dir is not None else default_cache() / "checkpoints"
    p.mkdir(parents=True, exist_ok=True)
    return p
