"""Token pruning at depth ``L`` and budget ``b`` (DESIGN.md §3, §5).

The pruned forward of a timm ViT runs blocks ``1..L`` on all ``P + N`` tokens, scores the
``N`` patch tokens from block ``L``'s output with a :class:`TokenScorer` (the contract of
:mod:`midas_nb.scorers`, defined here),
keeps the prefix tokens plus the top ``k = ceil(b·N)`` patch tokens, and runs blocks
``L+1..n`` (n: the backbone's number of blocks) on the really shorter sequence of ``P + k``
tokens (so the FLOPs drop), then the final norm and head. Kept tokens keep their position embedding (it was added before
pruning), as in DynamicViT (Rao et al., 2021, https://arxiv.org/abs/2106.02034) and EViT
(Liang et al., 2022, https://arxiv.org/abs/2202.07800), whose one-stage variant at a single
depth this is.

Conventions:
- ``keep_idx [B,k]`` lists the kept patch tokens (0..N-1, prefix excluded) **sorted by
  position** (ascending), so the kept sequence stays row-major; the ranking itself is in
  ``scores``.
- top-k ties are broken by :func:`torch.topk` (implementation-defined).

Example::

    >>> out = pruned_forward(model, images, ReferenceScorer(), depth=6, budget=0.25)
    >>> out.logits.shape, out.keep_idx.shape, out.keep_mask.shape    # B x C, B x k, B x N
"""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

import torch
from torch import Tensor, nn

from .point import Budget
from .backbones.vit import classify_tokens, embed_tokens, gather_tokens, keep_count, num_prefix_tokens, run_blocks

__all__ = ["TokenScorer", "PrunedOutput", "PrunedViT", "check_depth", "select_top_k", "keep_mask_from_indices",
           "kept_token_indices", "record_attention", "score_tokens", "prune_tokens", "pruned_forward"]


class TokenScorer(nn.Module):
    """Base class of token scorers: ``[B,P+N,D]`` hidden states of block ``L`` → ``[B,N]`` scores.

    Subclasses override only :meth:`score`. ``forward(tokens, num_prefix, attn=None)`` checks
    shapes and calls it. Scorers whose class sets ``needs_attention = True`` also receive the
    attention probabilities of block ``L`` (``[B,H,T,T]``); :func:`midas_nb.pruning.pruned_forward`
    records them only for such scorers.

    One optional hook serves scorer families with an objective of their own (Cropr's auxiliary
    head, IA-RED²'s REINFORCE; :mod:`midas_nb.scorers.cropr`, :mod:`midas_nb.scorers.iared`):
    :meth:`training_loss`, used by :func:`midas_nb.train.train_scorers` instead of the default
    ``L_cls`` (its default, ``None``, keeps the standard behaviour). The scorers live in
    :mod:`midas_nb.scorers`, above this floor; the contract sits here, beside the pruned forward
    that calls it (decision 0075).

    Class attributes:
        needs_attention: the scorer reads block ``L``'s attention (default ``False``).
        trainable: the scorer has parameters that :mod:`midas_nb.train` trains.
    """

    needs_attention: bool = False
    trainable: bool = False

    def score(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        """Scores of the patch tokens (higher = keep).

        Args:
            tokens: ``[B,P+N,D]`` output of block ``L`` (prefix tokens first).
            num_prefix: ``P``.
            attn: ``[B,H,P+N,P+N]`` attention of block ``L`` (only for ``needs_attention``).

        Returns:
            ``[B,N]`` float scores.
        """
        raise NotImplementedError

    def training_loss(self, backbone: nn.Module, hidden: Tensor, labels: Tensor, *, depth: int, budget: float,
                      num_prefix: int) -> tuple[Tensor, Tensor, Tensor] | None:
        """The scorer's own task loss on a batch of block-``L`` states, or ``None`` (default).

        ``None`` means: train with the default ``L_cls`` of :func:`midas_nb.train.train_scorers`
        (cross-entropy of the relaxed pruned forward). A family with its own objective returns
        ``(loss, logits, scores)``: the scalar loss that replaces ``L_cls`` (``λ·L_ga`` is still
        added when a target is given), ``[B,C]`` logits whose accuracy is logged, and the
        ``[B,N]`` scores (differentiable) that ``L_ga`` would distil into.

        Args:
            backbone: the frozen timm ViT (eval mode, ``requires_grad=False``).
            hidden: ``[B,P+N,D]`` block-``L`` output (from the cache; no graph to the backbone).
            labels: ``[B]`` long ground-truth labels.
            depth: ``L``.
            budget: ``b``.
            num_prefix: ``P``.
        """
        return None

    def forward(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        if tokens.dim() != 3:
            raise ValueError(f"tokens must be [B,T,D], got {tuple(tokens.shape)}")
        if not 0 <= num_prefix < tokens.shape[1]:
            raise ValueError(f"num_prefix must be in [0, T={tokens.shape[1]}), got {num_prefix}")
        if self.needs_attention and attn is None:
            raise ValueError(f"{type(self).__name__} needs the attention of block L ([B,H,T,T]); got None")
        s = self.score(tokens, num_prefix, attn)
        B, T, _ = tokens.shape
        if s.shape != (B, T - num_prefix):
            raise RuntimeError(f"{type(self).__name__}.score returned {tuple(s.shape)}, "
                               f"expected [B,N]=({B},{T - num_prefix})")
        return s


@dataclass
class PrunedOutput:
    """Result of a pruned forward.

    Attributes:
        logits: ``[B,C]`` logits of the pruned model.
        keep_idx: ``[B,k]`` long, kept patch tokens (0..N-1), sorted by position.
        keep_mask: ``[B,N]`` bool, ``True`` at kept patch tokens (``k`` per row).
        scores: ``[B,N]`` scorer output at block ``L`` (the ranking; higher = keep).
        tokens: ``[B,P+k,D]`` output of the last block (before the final norm) when
            ``return_tokens=True``, else ``None``.
    """

    logits: Tensor
    keep_idx: Tensor
    keep_mask: Tensor
    scores: Tensor
    tokens: Tensor | None = None


def check_depth(model: nn.Module, depth: int) -> int:
    """Validate depth ``L ∈ {1..len(blocks)-1}`` (DESIGN.md §3); returns it as ``int``.

    Raises:
        ValueError: if ``depth`` is outside ``1..len(model.blocks)-1``.
    """
    n_blocks = len(model.blocks)
    if not (1 <= int(depth) <= n_blocks - 1):
        raise ValueError(f"depth L must be in 1..{n_blocks - 1} for a {n_blocks}-block ViT, got {depth}")
    return int(depth)


def select_top_k(scores: Tensor, k: int) -> Tensor:
    """Indices of the ``k`` highest scores per row, sorted by position: ``[B,N] → [B,k]`` long.

    Raises:
        ValueError: if ``k`` is outside ``1..N``.
    """
    B, N = scores.shape
    if not 1 <= k <= N:
        raise ValueError(f"k must be in 1..N={N}, got {k}")
    idx = scores.detach().topk(k, dim=1, sorted=False).indices
    return idx.sort(dim=1).values


def keep_mask_from_indices(keep_idx: Tensor, n_patches: int) -> Tensor:
    """Boolean keep mask ``[B,N]`` from kept indices ``[B,k]``."""
    mask = torch.zeros(keep_idx.shape[0], n_patches, dtype=torch.bool, device=keep_idx.device)
    return mask.scatter_(1, keep_idx.long(), True)


@contextmanager
def record_attention(block: nn.Module) -> Iterator[dict]:
    """Record the attention probabilities ``[B,H,T,T]`` of one timm ``Block`` (into ``rec["attn"]``).

    The block's attention is switched to the unfused path for the duration (the fused
    ``scaled_dot_product_attention`` never forms the softmax matrix, DESIGN.md §3) and its
    previous setting is restored on exit, as is the hook on ``attn.attn_drop``.
    """
    attn = block.attn
    had_flag = hasattr(attn, "fused_attn")
    fused = getattr(attn, "fused_attn", False)
    rec: dict = {}
    if had_flag:
        attn.fused_attn = False
    handle = attn.attn_drop.register_forward_hook(lambda m, a, o: rec.__setitem__("attn", o))
    try:
        yield rec
    finally:
        handle.remove()
        if had_flag:
            attn.fused_attn = fused


def score_tokens(backbone: nn.Module, images: Tensor, scorer: TokenScorer, depth: int) -> tuple[Tensor, Tensor]:
    """Blocks ``1..L`` on all tokens, then the scorer: returns ``(hidden [B,P+N,D], scores [B,N])``.

    ``hidden`` is the output of block ``L``. Scorers with ``needs_attention`` get block ``L``'s
    attention (recorded with :func:`record_attention`).
    """
    depth = check_depth(backbone, depth)
    P = num_prefix_tokens(backbone)
    x = embed_tokens(backbone, images)
    if scorer.needs_attention:
        x = run_blocks(backbone, x, 0, depth - 1)
        with record_attention(backbone.blocks[depth - 1]) as rec:
            x = backbone.blocks[depth - 1](x)
        return x, scorer(x, P, rec["attn"])
    x = run_blocks(backbone, x, 0, depth)
    return x, scorer(x, P)


def kept_token_indices(backbone: nn.Module, hidden: Tensor, scores: Tensor, depth: int,
                       budget: float) -> tuple[int, int, Tensor]:
    """``(depth L, prefix count P, keep_idx [B,k])``: the top ``k = ceil(b·N)`` patch tokens of
    ``scores [B,N]`` for block-``L`` states ``hidden [B,P+N,D]`` (DESIGN.md §3), after checking
    the depth, the budget and that the shapes agree.

    Raises:
        ValueError: on a depth or budget out of range, or shapes that disagree.
    """
    depth = check_depth(backbone, depth)
    P = num_prefix_tokens(backbone)
    B, T, _ = hidden.shape
    N = T - P
    if scores.shape != (B, N):
        raise ValueError(f"scores must be [B,N]=({B},{N}), got {tuple(scores.shape)}")
    return depth, P, select_top_k(scores, keep_count(budget, N))


def prune_tokens(backbone: nn.Module, hidden: Tensor, scores: Tensor, depth: int, budget: float, *,
                 return_tokens: bool = False) -> PrunedOutput:
    """Keep the top ``k = ceil(b·N)`` patch tokens of block ``L``'s output and finish the forward.

    Args:
        backbone: timm ViT with ``len(blocks) > L``.
        hidden: ``[B,P+N,D]`` output of block ``L`` (e.g. from :func:`score_tokens` or a cache).
        scores: ``[B,N]`` ranking (higher = keep); only its order is used (no gradient flows
            through the selection; see :mod:`midas_nb.train` for the relaxations).
        depth: ``L`` (1-based); blocks ``L+1..n`` run on ``P + k`` tokens.
        budget: ``b ∈ (0,1]``.
        return_tokens: also return the last block's output ``[B,P+k,D]``.

    Returns:
        :class:`PrunedOutput`.

    Raises:
        ValueError: on a depth or budget out of range, or shapes that disagree.
    """
    depth, P, keep_idx = kept_token_indices(backbone, hidden, scores, depth, budget)
    N = hidden.shape[1] - P
    x = run_blocks(backbone, gather_tokens(hidden, keep_idx, P), depth, None)
    return PrunedOutput(logits=classify_tokens(backbone, x), keep_idx=keep_idx,
        keep_mask=keep_mask_from_indices(keep_idx, N), scores=scores, tokens=x if return_tokens else None)


def pruned_forward(backbone: nn.Module, images: Tensor, scorer: TokenScorer, depth: int, budget: float, *,
                   return_tokens: bool = False) -> PrunedOutput:
    """Pruned forward of a timm ViT: all tokens up to block ``L``, prefix + top-``k`` after.

    Args:
        backbone: timm ViT (1 or 2 prefix tokens; the offline hybrid is one too), in the mode
            the caller wants (usually eval); runs under the caller's grad mode.
        images: ``[B,3,H,W]`` normalised images on the backbone's device.
        scorer: a :class:`~midas_nb.scorers.TokenScorer` reading block ``L``'s output.
        depth: ``L ∈ 1..len(blocks)-1`` (1-based; the scorer reads block ``L``'s output).
        budget: ``b ∈ (0,1]``; ``k = ceil(b·N)`` patch tokens are kept
            (:func:`midas_nb.backbones.vit.keep_count`). At ``b = 1`` the logits equal the full model's.
        return_tokens: also return the last block's output ``[B,P+k,D]``.

    Returns:
        :class:`PrunedOutput` (``logits [B,C]``, ``keep_idx [B,k]`` sorted by position,
        ``keep_mask [B,N]``, ``scores [B,N]``).

    Raises:
        ValueError: on a depth or budget out of range.
    """
    hidden, scores = score_tokens(backbone, images, scorer, depth)
    return prune_tokens(backbone, hidden, scores, depth, budget, return_tokens=return_tokens)


class PrunedViT(nn.Module):
    """A backbone and a scorer as one module: ``forward(images) -> logits [B,C]`` (pruned).

    Handy for :func:`midas_nb.metrics.measure_throughput` and for code that expects a
    classifier. Args as in :func:`pruned_forward`.
    """

    def __init__(self, backbone: nn.Module, scorer: TokenScorer, depth: int, budget: float):
        super().__init__()
        self.backbone, self.scorer = backbone, scorer
        self.depth, self.budget = check_depth(backbone, depth), Budget(budget)

    def forward(self, images: Tensor) -> Tensor:
        return pruned_forward(self.backbone, images, self.scorer, self.depth, self.budget).logits
