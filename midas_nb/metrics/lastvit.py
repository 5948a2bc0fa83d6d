"""LaSt-ViT's probe (Shi et al., 2026, arXiv:2602.22394): the Patch Score map, Point-in-Box and
its two baselines (the centre patch, the box's share of patches; DESIGN.md §6)."""
from __future__ import annotations


import torch.nn.functional as F
from torch import Tensor

from .registry import register_metric


def patch_score(hidden_last: Tensor, num_prefix: int) -> Tensor:
    """LaSt-ViT patch score: ``cos(h_CLS, h_j)`` at the output of the last block.

    Shi, Yu & Yang, 2026, *Vision Transformers Need More Than Registers* (LaSt-ViT),
    https://arxiv.org/abs/2602.22394; official code github.com/ChengShiest/LAST-ViT,
    ``visualization/patch_score.py``, ``DenseViT._compute_patch_scores``, which reads the encoder
    output after its final LayerNorm: pass ``norm(h)`` for that (as
    :func:`midas_nb.analysis.last.pib_table` does).

    Args:
        hidden_last: ``[B,T,D]`` tokens of the last block (after the final norm for the
            official score), CLS first.
        num_prefix: ``P``, prefix tokens to strip (the CLS token is token 0).

    Returns:
        ``[B,N]`` cosine similarities in ``[−1, 1]``.
    """
    if hidden_last.dim() != 3 or hidden_last.shape[1] <= num_prefix:
        raise ValueError(f"hidden_last must be [B,T,D] with T > num_prefix={num_prefix}, got "
                         f"{tuple(hidden_last.shape)}")
    return F.cosine_similarity(hidden_last[:, num_prefix:], hidden_last[:, :1], dim=-1)   # patches vs CLS


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


def centre_patch(grid_size: tuple[int, int]) -> int:
    """Row-major index of the centre patch of a ``(rows, cols)`` grid: ``(rows//2)·cols + cols//2``.

    For an even side the image centre lies on a patch corner; this is the patch holding the
    pixel at ``(H/2, W/2)`` (0-based), i.e. the lower-right of the four central patches.

    Raises:
        ValueError: a non-positive grid side.
    """
    rows, cols = (int(v) for v in grid_size)
    if rows < 1 or cols < 1:
        raise ValueError(f"grid_size must be two positive ints (rows, cols), got {grid_size!r}")
    return (rows // 2) * cols + cols // 2


def centre_in_box(box_mask: Tensor, grid_size: tuple[int, int]) -> Tensor:
    """Centre-patch baseline of Point-in-Box: is the centre patch (:func:`centre_patch`) in the box?

    The PiB of a ranking that always puts the centre patch first (DESIGN.md §6): on object-centred
    photos this alone can score high, so a PiB is read against it.

    Args:
        box_mask: ``[B,N]`` bool, patches inside the object box, row-major.
        grid_size: ``(rows, cols)`` with ``rows·cols = N``.

    Returns:
        ``[B]`` bool; its mean is the baseline rate.

    Raises:
        ValueError: ``box_mask`` not ``[B,N]`` or ``N ≠ rows·cols``.
    """
    if box_mask.dim() != 2 or box_mask.shape[1] != int(grid_size[0]) * int(grid_size[1]):
        raise ValueError(f"box_mask must be [B,N] with N = rows·cols of grid_size {tuple(grid_size)}, got "
                         f"{tuple(box_mask.shape)}")
    return box_mask.bool()[:, centre_patch(grid_size)]


def box_share(box_mask: Tensor) -> Tensor:
    """Box-area baseline of Point-in-Box: the share of patches inside the box, ``[B,N] → [B]`` float32.

    The expected PiB of a patch drawn uniformly at random (DESIGN.md §6).

    Raises:
        ValueError: ``box_mask`` not ``[B,N]``.
    """
    if box_mask.dim() != 2:
        raise ValueError(f"box_mask must be [B,N], got {tuple(box_mask.shape)}")
    return box_mask.float().mean(dim=1)
