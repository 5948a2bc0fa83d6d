"""LaSt-ViT's probe (Shi et al., 2026, arXiv:2602.22394): the Patch Score map and Point-in-Box."""
from __future__ import annotations


import torch.nn.functional as F
from torch import Tensor

from .registry import register_metric


def patch_score(hidden_last: Tensor, num_prefix: int) -> Tensor:
    """LaSt-ViT patch score: ``cos(h_CLS, h_j)`` at the output of the last block.

    Shi, Yu & Yang, 2026, *Vision Transformers Need More Than Registers* (LaSt-ViT),
    https://arxiv.org/abs/2602.22394.

    Args:
        hidden_last: ``[B,T,D]`` output of the last block (``CaptureResult.hidden[-1]``), CLS
            first.
        num_prefix: ``P``, prefix tokens to strip (the CLS token is token 0).

    Returns:
        ``[B,N]`` cosine similarities in ``[−1, 1]``.
    """
    if hidden_last.dim() != 3 or hidden_last.shape[1] <= num_prefix:
        raise ValueError(f"hidden_last must be [B,T,D] with T > num_prefix={num_prefix}, got "
                         f"{tuple(hidden_last.shape)}")
    cls = hidden_last[:, :1]
    patches = hidden_last[:, num_prefix:]
    return F.cosine_similarity(patches, cls, dim=-1)


@register_metric("point_in_box", higher_is_better=True, category="localisation",
                 reference="Shi et al., 2026, LaSt-ViT, https://arxiv.org/abs/2602.22394",
                 summary="the top-scoring patch lies inside the object box")
def point_in_box(scores: Tensor, box_mask: Tensor) -> Tensor:
    """Point-in-Box (LaSt-ViT): is the highest-scoring patch inside the object box?

    Args:
        scores: ``[B,N]`` patch scores (e.g. :func:`patch_score`); ties go to the lower index.
        box_mask: ``[B,N]`` bool, patches inside the object box.

    Returns:
        ``[B]`` bool; its mean is the PiB rate.
    """
    if scores.dim() != 2 or scores.shape != box_mask.shape:
        raise ValueError(f"scores and box_mask must both be [B,N], got {tuple(scores.shape)} "
                         f"and {tuple(box_mask.shape)}")
    top = scores.argmax(dim=1, keepdim=True)    # first maximal index
    return box_mask.bool().gather(1, top).squeeze(1)
