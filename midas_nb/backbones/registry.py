"""The backbone names: local architectures (hybrid, smoke) and timm tags, their input size and normalisation."""
from __future__ import annotations

import functools
from typing import Any

from ..config import PAPER_BACKBONES


_TIMM_EXTRA: tuple[str, ...] = ("deit_tiny_distilled_patch16_224.fb_in1k",)

#: The local backbones (hybrid, smoke, distilled students): ``{name: timm VisionTransformer
#: arguments}`` plus ``lite0_stem`` (and ``distilled``) flags; callers' kwargs override them.
LOCAL_ARCHS: dict[str, dict[str, Any]] = {
    "hybrid_lite0_vit": dict(lite0_stem=True, img_size=224, patch_size=16, embed_dim=192, depth=12, num_heads=3,
                             mlp_ratio=4.0),
    "hybrid_lite0_vit_w128": dict(lite0_stem=True, img_size=224, patch_size=16, embed_dim=128, depth=12,
                                  num_heads=4, mlp_ratio=4.0),
    "vit_smoke": dict(lite0_stem=True, img_size=64, patch_size=8, embed_dim=48, depth=4, num_heads=3, mlp_ratio=4.0),
    "vit_smoke_wide": dict(lite0_stem=True, img_size=64, patch_size=8, embed_dim=96, depth=4, num_heads=4,
                           mlp_ratio=4.0),
    # DeiT-style students of the ImageNet Lite0 (timm VisionTransformerDistilled: CLS + distillation
    # token), trained by midas_nb.backbones.distilled.finetune_distilled
    "hybrid_lite0_deit": dict(lite0_stem=True, distilled=True, img_size=224, patch_size=16, embed_dim=192, depth=12,
                              num_heads=3, mlp_ratio=4.0),
    "vit_smoke_deit": dict(lite0_stem=True, distilled=True, img_size=64, patch_size=8, embed_dim=48, depth=4,
                           num_heads=3, mlp_ratio=4.0),
}

_HALF = (0.5, 0.5, 0.5)
#: ``{local backbone name: (mean, std)}``: EfficientNet-Lite0 (TF port) expects inputs scaled to
#: [-1, 1], so mean = std = 0.5 per RGB channel.
LOCAL_NORMALIZATION = {name: (_HALF, _HALF) for name in LOCAL_ARCHS}


class BackboneError(ValueError):
    """A backbone could not be built or its weights could not be loaded (bad name, file, keys)."""


def list_backbones() -> list[str]:
    """Names :func:`create_backbone` knows: local (hybrid, smoke) and timm pretrained tags.

    Any other timm ViT name (``timm.list_models('vit_*')``) is accepted too.
    """
    return list(LOCAL_ARCHS) + list(PAPER_BACKBONES) + list(_TIMM_EXTRA)


def timm_pretrained_cfg(name: str) -> dict[str, Any]:
    """timm's pretrained config of a tag (``input_size``, ``mean``, ``std``, ``hf_hub_id``, ...) as a dict.

    Raises:
        BackboneError: for a name that is not a timm architecture, an unknown tag, or a tag
            without a pretrained config.
    """
    import timm

    if not timm.is_model(name.split(".")[0]):
        raise BackboneError(f"unknown backbone {name!r}; expected one of {list_backbones()} or a timm ViT name")
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
    if name in LOCAL_NORMALIZATION:
        return LOCAL_NORMALIZATION[name]
    cfg = timm_pretrained_cfg(name)
    return tuple(float(v) for v in cfg["mean"]), tuple(float(v) for v in cfg["std"])  # type: ignore[return-value]


@functools.lru_cache(maxsize=None)
def default_image_size(name: str) -> int | None:
    """The input size (px, square) backbone ``name`` is built for without an ``img_size``
    argument: the local architecture's ``img_size``, or the ``input_size`` of timm's pretrained
    config for the tag (224 for DeiT-Ti/S and AugReg ViT-B/16); ``None`` for an unknown name
    (:func:`check_backbone` reports it)."""
    if name in LOCAL_ARCHS:
        return int(LOCAL_ARCHS[name]["img_size"])
    try:
        size = timm_pretrained_cfg(name).get("input_size")
    except BackboneError:
        return None
    return int(size[-1]) if size else None
