"""Weight files in the layouts people download (shared by test modules), written from a model.

- :func:`write_deit_release` — the DeiT release ``.pth``: ``torch.save({"model": state_dict})``
  (``deit_small_patch16_224-cd65a155.pth``).
- :func:`write_timm_safetensors` — the timm hub file ``model.safetensors`` (timm key names).
- :func:`write_timm_pth` — a plain timm state dict saved with ``torch.save``.
- :func:`write_augreg_npz` — the original ViT / AugReg ``.npz`` (Steiner et al. 2022,
  ``B_16-i21k-300ep-...-res_224.npz``): JAX names and layouts, written here by inverting the
  mapping of timm's ``_load_weights`` independently of the package's own layout check.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import torch


def paper_arch(name: str, num_classes: int = 1000, seed: int = 0, **kwargs) -> torch.nn.Module:
    """A randomly initialised (seeded) timm model of ``name`` with ``kwargs``: the source of the files."""
    import timm

    torch.manual_seed(seed)
    return timm.create_model(name, pretrained=False, num_classes=num_classes, **kwargs).eval()


def write_deit_release(model: torch.nn.Module, path: Path) -> Path:
    torch.save({"model": {k: v.clone() for k, v in model.state_dict().items()}}, path)
    return path


def write_timm_pth(model: torch.nn.Module, path: Path) -> Path:
    torch.save({k: v.clone() for k, v in model.state_dict().items()}, path)
    return path


def write_timm_safetensors(model: torch.nn.Module, path: Path) -> Path:
    from safetensors.torch import save_file

    save_file({k: v.detach().contiguous().clone() for k, v in model.state_dict().items()}, str(path))
    return path


def write_augreg_npz(model: torch.nn.Module, path: Path) -> Path:
    """The original (non-big_vision) ViT ``.npz`` of ``model``'s weights."""
    sd = {k: v.detach().float().numpy() for k, v in model.state_dict().items()}
    D = model.embed_dim
    w: dict[str, np.ndarray] = {
        "embedding/kernel": sd["patch_embed.proj.weight"].transpose(2, 3, 1, 0),   # [D,3,p,p] -> [p,p,3,D]
        "embedding/bias": sd["patch_embed.proj.bias"],
        "cls": sd["cls_token"],                                                  # [1,1,D]
        "Transformer/posembed_input/pos_embedding": sd["pos_embed"],             # [1,T,D]
        "Transformer/encoder_norm/scale": sd["norm.weight"],
        "Transformer/encoder_norm/bias": sd["norm.bias"],
        "head/kernel": sd["head.weight"].T,                                      # [C,D] -> [D,C]
        "head/bias": sd["head.bias"],
    }
    for i, blk in enumerate(model.blocks):
        H = blk.attn.num_heads
        hd = D // H
        p, b = f"blocks.{i}.", f"Transformer/encoderblock_{i}/"
        m = b + "MultiHeadDotProductAttention_1/"
        w[b + "LayerNorm_0/scale"], w[b + "LayerNorm_0/bias"] = sd[p + "norm1.weight"], sd[p + "norm1.bias"]
        w[b + "LayerNorm_2/scale"], w[b + "LayerNorm_2/bias"] = sd[p + "norm2.weight"], sd[p + "norm2.bias"]
        qkv_w, qkv_b = sd[p + "attn.qkv.weight"], sd[p + "attn.qkv.bias"]
        for j, n in enumerate(("query", "key", "value")):
            w[m + f"{n}/kernel"] = qkv_w[j * D:(j + 1) * D].T.reshape(D, H, hd)      # [D,H,hd]
            w[m + f"{n}/bias"] = qkv_b[j * D:(j + 1) * D].reshape(H, hd)
        w[m + "out/kernel"] = sd[p + "attn.proj.weight"].reshape(D, H, hd).transpose(1, 2, 0)  # [H,hd,D]
        w[m + "out/bias"] = sd[p + "attn.proj.bias"]
        w[b + "MlpBlock_3/Dense_0/kernel"] = sd[p + "mlp.fc1.weight"].T
        w[b + "MlpBlock_3/Dense_0/bias"] = sd[p + "mlp.fc1.bias"]
        w[b + "MlpBlock_3/Dense_1/kernel"] = sd[p + "mlp.fc2.weight"].T
        w[b + "MlpBlock_3/Dense_1/bias"] = sd[p + "mlp.fc2.bias"]
    np.savez(path, **{k: np.ascontiguousarray(v) for k, v in w.items()})
    return path


#: small widths of the three paper architectures for CPU tests (12 blocks, as the real ones)
SMALL_KWARGS: dict[str, dict] = {
    "deit_tiny_patch16_224.fb_in1k": dict(embed_dim=24, num_heads=2),
    "deit_small_patch16_224.fb_in1k": dict(embed_dim=32, num_heads=2),
    "vit_base_patch16_224.augreg_in21k_ft_in1k": dict(embed_dim=48, num_heads=3),
}

#: the layout each paper backbone's file is written in (what its users download)
PAPER_WRITERS = {
    "deit_tiny_patch16_224.fb_in1k": ("deit_tiny_patch16_224-a1311bcf.pth", write_deit_release),
    "deit_small_patch16_224.fb_in1k": ("model.safetensors", write_timm_safetensors),
    "vit_base_patch16_224.augreg_in21k_ft_in1k": (
        "B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_224.npz",
        write_augreg_npz),
}
