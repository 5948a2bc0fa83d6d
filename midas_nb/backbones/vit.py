"""The token path of a timm Vision Transformer, in stages.

Every module of midas_nb that runs part of a backbone (capture, pruning, insertion/deletion,
probes) goes through these functions, so that "block L", "prefix tokens" and "token dropping"
mean the same thing everywhere. They wrap, never fork, timm's
:class:`timm.models.vision_transformer.VisionTransformer`:

- ``embed_tokens``    = ``patch_embed`` → ``_pos_embed`` (prefix tokens, position embedding)
  → ``patch_drop`` → ``norm_pre``                                     ``[B,3,H,W] → [B,T,D]``
- ``run_blocks``      = ``blocks[start:end]`` (0-based slice; depth ``L`` ⇔ ``end=L``)
- ``classify_tokens`` = ``norm`` → ``forward_head`` (pool, fc_norm, head) ``[B,T',D] → [B,C]``

Token dropping keeps positions: position embeddings are added in ``embed_tokens``, before any
patch token is removed, so a kept token still carries its own position (Rao et al., 2021,
DynamicViT, https://arxiv.org/abs/2106.02034; Liang et al., 2022, EViT,
https://arxiv.org/abs/2202.07800).

Shapes: ``B`` images, ``T = P + N`` tokens (``P`` prefix tokens: CLS, distillation and
register tokens; ``N`` patch tokens, row-major over the patch grid), ``D`` embedding width.
"""
from __future__ import annotations

import math
from contextlib import contextmanager, nullcontext
from typing import Iterator

import torch
from torch import Tensor, nn

from ..point import Budget

__all__ = ["num_prefix_tokens", "grid_size", "num_patches", "embed_tokens", "run_blocks", "classify_tokens",
           "gather_tokens", "forward_kept_tokens", "keep_count", "disable_fused_attention", "fused_attention",
           "math_sdpa", "frozen"]


def num_prefix_tokens(model: nn.Module) -> int:
    """Number ``P`` of prefix tokens (CLS, distillation, register) of a timm ViT."""
    return int(getattr(model, "num_prefix_tokens", 1))


def grid_size(model: nn.Module) -> tuple[int, int]:
    """Patch grid ``(rows, cols)`` of the model's patch embedding (``patch_embed.grid_size``)."""
    return int(model.patch_embed.grid_size[0]), int(model.patch_embed.grid_size[1])


def num_patches(model: nn.Module) -> int:
    """Number ``N`` of patch tokens (rows × cols of the patch grid)."""
    return math.prod(grid_size(model))


def keep_count(budget: float, n_patches: int) -> int:
    """``k = ceil(b·N)`` patch tokens kept at budget ``b`` (DESIGN.md §3).

    ``budget``: a :class:`midas_nb.point.Budget` (taken as it is) or a number made into one.

    Raises:
        ValueError: if ``budget`` is not a budget (:class:`midas_nb.point.Budget`).
    """
    # round before ceil so that e.g. 0.29 * 100 = 28.999999999999996 keeps 29 tokens, not 30
    return max(1, min(n_patches, math.ceil(round(float(Budget(budget)) * n_patches, 9))))


def disable_fused_attention(model: nn.Module) -> nn.Module:
    """Switch every timm ``Attention`` module to the unfused path (in place).

    The fused ``scaled_dot_product_attention`` path never forms the softmax matrix, so hooks
    on ``attn_drop`` would record nothing (DESIGN.md §3). Returns the model.
    """
    for m in model.modules():
        if hasattr(m, "fused_attn"):
            m.fused_attn = False
    return model


# switches of a model's computation (restored on exit)

@contextmanager
def fused_attention(model: nn.Module) -> Iterator[nn.Module]:
    """Switch every timm ``Attention`` of ``model`` to the fused path; restore the flags on exit.

    Speed only (about a quarter faster on CPU): the protocol never reads attention except
    block ``L``'s for T0, which :func:`midas_nb.pruning.record_attention` unfuses itself.
    """
    mods = [m for m in model.modules() if hasattr(m, "fused_attn")]
    flags = [m.fused_attn for m in mods]
    for m in mods:
        m.fused_attn = True
    try:
        yield model
    finally:
        for m, f in zip(mods, flags):
            m.fused_attn = f


@contextmanager
def math_sdpa(enabled: bool) -> Iterator[None]:
    """Restrict ``F.scaled_dot_product_attention`` to the math kernel when ``enabled``."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    with sdpa_kernel([SDPBackend.MATH]) if enabled else nullcontext():
        yield


@contextmanager
def frozen(backbone: nn.Module) -> Iterator[nn.Module]:
    """Eval mode and ``requires_grad=False`` on every parameter; both restored on exit (a backbone frozen
    already, as in a nested call, is left as it is)."""
    was_training = backbone.training
    flags = [(p, p.requires_grad) for p in backbone.parameters()]
    if not any(f for _, f in flags) and not any(m.training for m in backbone.modules()):
        yield backbone
        return
    backbone.eval()
    for p, _ in flags:
        p.requires_grad_(False)
    try:
        yield backbone
    finally:
        for p, f in flags:
            p.requires_grad_(f)
        backbone.train(was_training)


def embed_tokens(model: nn.Module, images: Tensor) -> Tensor:
    """Patch embedding, prefix tokens and position embedding: ``[B,3,H,W] → [B,P+N,D]``."""
    return model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))


def run_blocks(model: nn.Module, x: Tensor, start: int = 0, end: int | None = None) -> Tensor:
    """Run ``model.blocks[start:end]`` on tokens ``x [B,T,D]`` (any ``T``); returns ``[B,T,D]``."""
    for blk in model.blocks[start:end]:
        x = blk(x)
    return x


def classify_tokens(model: nn.Module, x: Tensor) -> Tensor:
    """Final norm and classifier head on the output of the last block: ``[B,T,D] → [B,C]``.

    Works on shortened sequences as long as the prefix tokens come first (CLS pooling reads
    token 0; average pooling averages whatever patch tokens are present).
    """
    return model.forward_head(model.norm(x))


def gather_tokens(x: Tensor, keep_idx: Tensor, num_prefix: int) -> Tensor:
    """Prefix tokens plus the patch tokens ``keep_idx``: ``[B,P+N,D], [B,k] → [B,P+k,D]``.

    ``keep_idx`` indexes patch tokens (0..N-1, prefix excluded).
    """
    B, _, D = x.shape
    if keep_idx.dim() != 2 or keep_idx.shape[0] != B:
        raise ValueError(f"keep_idx must be [B,k] with B={B}, got {tuple(keep_idx.shape)}")
    kept = x[:, num_prefix:].gather(1, keep_idx.long().unsqueeze(-1).expand(-1, -1, D))
    return torch.cat([x[:, :num_prefix], kept], dim=1)


def forward_kept_tokens(model: nn.Module, images: Tensor, keep_idx: Tensor) -> Tensor:
    """Logits of the model when only the patch tokens ``keep_idx [B,k]`` enter the sequence.

    Prefix tokens are always present; positions are kept. ``k = 0`` (an empty ``[B,0]``
    index) runs the prefix tokens alone. Returns ``[B,C]``.
    """
    x = gather_tokens(embed_tokens(model, images), keep_idx, num_prefix_tokens(model))
    return classify_tokens(model, run_blocks(model, x))
