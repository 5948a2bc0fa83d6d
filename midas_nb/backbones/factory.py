"""Building a backbone by name (:func:`create_backbone`): timm ViTs, the hybrid and smoke architectures, weights."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Sequence

import torch
from torch import Tensor, nn

from ..config import get_profile, merged_settings, PROFILES
from .vit import disable_fused_attention
from .lite0 import FrozenStemEmbed, is_hybrid, LITE0_STRIDE, lite0_timm_state_dict
from .registry import BackboneError, default_image_size, LOCAL_ARCHS, LOCAL_NORMALIZATION, timm_pretrained_cfg
from .weights import check_hub, check_weights_path, load_weights_file


def _architecture(name: str, kwargs: dict[str, Any]) -> nn.Module:
    """``name`` built with ``kwargs`` on the meta device (no memory, no weights, no download):
    the same classes and constructor arguments :func:`create_backbone` uses, so every argument
    timm or the hybrid embedding rejects fails here, before any work.

    Raises:
        BackboneError: unknown name, or arguments the architecture rejects (the message names
            the backbone, the arguments and the constructor's error).
    """
    import warnings

    local = name in LOCAL_ARCHS
    if not local:
        timm_pretrained_cfg(name)  # unknown names: BackboneError naming the known ones
    import timm

    try:
        with torch.device("meta"), warnings.catch_warnings():
            # the hybrid's stem reloads its ImageNet tensors: a no-op into meta tensors
            warnings.simplefilter("ignore")
            return _build_local(name, 2, dict(kwargs)) if local else timm.create_model(name, pretrained=False, **kwargs)
    except Exception as e:  # noqa: BLE001 - bad kwargs (TypeError, AssertionError, ...): one line naming them
        who = f"{name!r} (built here from timm's VisionTransformer)" if local else f"timm's {name!r}"
        raise BackboneError(f"{who} cannot be built with backbone_kwargs {kwargs}: {type(e).__name__}: {e}") from e


def backbone_kwargs(profile: dict[str, Any], name: str) -> dict[str, Any]:
    """The ``VisionTransformer`` arguments backbone ``name`` is built with in ``profile``:
    ``merged_settings(profile['backbone_kwargs'], name)``, plus ``img_size`` = the profile's
    ``image_size`` where neither names ``img_size`` and the architecture's own input size
    (:func:`default_image_size`) differs. The data decides the input size, as in the rehearsal,
    so DeiT-Ti/16 in a 64 px profile reads a 4×4 grid instead of failing on its first batch
    (timm resamples a 224 px file's position embeddings); nothing is added where the sizes
    agree, so the profiles' own backbones keep their arguments (and checkpoint keys). The patch
    size is the architecture's and is checked, not adapted (:func:`check_backbone`)."""
    out = merged_settings(profile.get("backbone_kwargs"), name)
    size = profile.get("image_size")
    if ("img_size" not in out and isinstance(size, int) and not isinstance(size, bool)
            and default_image_size(name) not in (None, size)):
        out["img_size"] = size
    return out


def num_blocks(name: str, **kwargs: Any) -> int:
    """Transformer blocks of backbone ``name`` built with ``kwargs`` (built on the meta device:
    no memory, no weights, no download; local architectures too, so bad ``kwargs`` fail here).

    Raises:
        BackboneError: unknown name or arguments the architecture rejects.
    """
    return len(_architecture(name, dict(kwargs)).blocks)


def check_backbone(name: str, kwargs: dict[str, Any] | None = None, depths: Sequence[int] = (), *,
                   image_size: int | None = None, patch_size: int | None = None) -> list[str]:
    """Problems (one line each) of using backbone ``name`` with ``kwargs`` at scorer depths
    ``depths`` on ``image_size`` px images cut into ``patch_size`` px patches: an unknown name,
    arguments the architecture rejects (the model is built on the meta device, local ones
    included), a depth outside ``1..blocks-1`` (the scorer reads block ``L``; blocks ``L+1..``
    must exist to see the kept tokens), a patch size other than the architecture's (the part
    masks are cut on the profile's patch grid), or a fixed input size other than the images'.

    Args:
        name: backbone name (:func:`list_backbones` or a timm ViT tag).
        kwargs: its ``VisionTransformer`` arguments (:func:`backbone_kwargs`).
        depths: scorer depths ``L`` to check against the blocks.
        image_size, patch_size: the profile's input and patch sizes in px (``None``: not checked).
    """
    try:
        model = _architecture(name, dict(kwargs or {}))
    except BackboneError as e:
        return [f"backbone: {e}"]
    blocks = len(model.blocks)
    problems = []
    if bad := sorted({int(L) for L in depths if not 1 <= int(L) <= blocks - 1}):
        problems.append(f"depth: L = {', '.join(map(str, bad))} is outside 1..{blocks - 1} for {name} "
                        f"({blocks} blocks; the scorer reads block L and blocks L+1..{blocks} see the kept tokens)")
    pe = model.patch_embed
    patch = pe.patch_size[0] if isinstance(pe.patch_size, (tuple, list)) else int(pe.patch_size)
    if patch_size is not None and int(patch) != int(patch_size):
        fits = [n for n in sorted(PROFILES) if get_profile(n)["patch_size"] == int(patch)]
        problems.append(f"patch_size: {name} has {patch} px patches but the profile's patch_size is {patch_size} px "
                        f"(part masks and kept tokens are cut on the profile's patch grid); choose a backbone with "
                        f"{patch_size} px patches" + (f", or a profile with {patch} px patches ({', '.join(fits)})"
                                                      if fits else ""))
    strict = getattr(pe, "strict_img_size", True) and not getattr(model, "dynamic_img_size", False)
    img = tuple(int(v) for v in pe.img_size) if isinstance(pe.img_size, (tuple, list)) else (int(pe.img_size),) * 2
    if image_size is not None and strict and img != (int(image_size), int(image_size)):
        problems.append(f"image_size: {name} is built for {img[0]}×{img[1]} px inputs (backbone_kwargs img_size) but "
                        f"the profile's images are {image_size} px; drop img_size from backbone_kwargs (it then "
                        f"follows image_size) or pass -p image_size {img[0]}")
    return problems


def _build_local(name: str, num_classes: int, kwargs: dict[str, Any]) -> nn.Module:
    from timm.models.vision_transformer import VisionTransformer
    from timm.models.deit import VisionTransformerDistilled

    args = dict(LOCAL_ARCHS[name], **kwargs)
    hybrid = args.pop("lite0_stem", False)
    distilled = args.pop("distilled", False)
    if hybrid:
        args.setdefault("patch_size", LITE0_STRIDE)
        args["embed_layer"] = FrozenStemEmbed
    model = (VisionTransformerDistilled if distilled else VisionTransformer)(num_classes=num_classes, **args)
    if hybrid:
        # the ViT initialiser must not have touched the stem: reload its ImageNet weights
        stem = model.patch_embed.backbone
        stem.load_state_dict(dict(zip(stem.state_dict(), _stem_tensors(len(stem) - 2))))
    mean, std = LOCAL_NORMALIZATION[name]
    img = model.patch_embed.img_size
    model.pretrained_cfg = dict(
        architecture=name, tag="", num_classes=num_classes, input_size=(3, *img), mean=mean, std=std,
        classifier="head", first_conv="patch_embed.proj", interpolation="bilinear", crop_pct=1.0, fixed_input_size=True)
    return model


def _stem_tensors(num_blocks: int) -> list[Tensor]:
    """Stem tensors of :func:`lite0_timm_state_dict` in ``lite0_stem()`` state-dict order."""
    sd = lite0_timm_state_dict()
    return [sd[k] for k in sd if k.startswith(("conv_stem.", "bn1.")) or
            (k.startswith("blocks.") and int(k.split(".")[1]) < num_blocks)]


def create_backbone(name: str, num_classes: int, weights: str | os.PathLike | None = None,
                    device: torch.device | str = "cpu", *, head: Literal["auto", "replace", "keep"] = "auto",
                    **kwargs: Any) -> nn.Module:
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
    local = name in LOCAL_ARCHS
    hub = isinstance(weights, str) and weights == "hub"
    if local:
        if hub:
            raise BackboneError(f"{name!r} is built here and has no hub weights; use weights=None or a file")
        model = _build_local(name, num_classes, kwargs)
    else:
        timm_pretrained_cfg(name)  # raises BackboneError for unknown names
        if hub and (problems := check_hub(name)):  # fail in seconds, naming the local file, not hang offline
            raise BackboneError(problems[0])
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
        if problems := check_weights_path(path):
            raise BackboneError(problems[0])
        load_weights_file(model, path, head, timm_filter=not local)
        model.pretrained_cfg = dict(model.pretrained_cfg, file=str(path))
    disable_fused_attention(model)
    return model.to(device).eval()


def backbone_config(model: nn.Module, name: str | None = None) -> dict[str, Any]:
    """Plain-dict description of a backbone for metadata: name, width, depth, heads, grid, …"""
    blk = model.blocks[0]
    cfg = getattr(model, "pretrained_cfg", {}) or {}
    pe = model.patch_embed
    return dict(name=name or cfg.get("architecture"), cls=type(model).__name__, embed_dim=int(model.embed_dim),
        depth=len(model.blocks), num_heads=int(blk.attn.num_heads), mlp_hidden=int(blk.mlp.fc1.out_features),
        num_prefix_tokens=int(getattr(model, "num_prefix_tokens", 1)), img_size=list(pe.img_size),
        patch_size=list(pe.patch_size), grid_size=list(pe.grid_size), num_classes=int(model.num_classes),
        mean=list(cfg.get("mean", ())), std=list(cfg.get("std", ())), hybrid=is_hybrid(model),
        trainable_params=int(sum(p.numel() for p in model.parameters() if p.requires_grad)))
