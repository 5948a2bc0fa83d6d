"""Token Cropr: a cross-attention pruner trained through an auxiliary head (scorer ``cropr``).

Bergner, Lippert & Mahendran, *Token Cropr: Faster ViTs for Quite a Few Tasks*, CVPR 2025,
https://arxiv.org/abs/2412.00965. Follows the official code, ``benbergner/cropr``, file
``cls/cropr.py`` (``CrossAttention``, ``ClassificationHead``, ``Cropr``), with the defaults of
``cls/main.py`` (``--cropr_num_heads 1``, ``--cropr_mlp_ratio 4``, no pre-attention norm, no
query/key/value projection, ``--cropr_mlp true``). One Cropr module at depth ``L``
(DESIGN.md §5), reading the output of block ``L`` like every other scorer of
:mod:`midas_nb.scorers`:

- **scorer** (``CrossAttention.forward_scorer``) — one learnable query ``q ∈ R^D`` (split into
  ``H`` heads; ``H = 1`` by default) against the stop-gradient tokens themselves as keys; the
  score of token ``j`` is the unscaled query–key product summed over heads,
  ``s_j = Σ_h ⟨q_h, x_{j,h}⟩``.
- **aggregator** (``CrossAttention.forward``) — ``a_h = softmax_j(⟨q_h, x_{j,h}⟩ / √d_h)`` over
  all ``P + N`` tokens (prefix included, as the official module sees the CLS token), values =
  the tokens, ``o = proj(concat_h Σ_j a_{h,j} x_{j,h})`` (``proj`` a linear map when ``H > 1``,
  identity when ``H = 1``), then ``z = o + MLP(LN(o))`` (timm ``Mlp``, hidden ``4·D``, GELU;
  LayerNorm ``eps = 1e-6``).
- **auxiliary head** (``ClassificationHead``) — ``LN → Linear(D, C)`` on ``z``, trained with
  cross-entropy on the label. The aggregator's softmax carries the gradient to the query, so
  the scores learn task relevance; the stop-gradient keeps the auxiliary loss out of the
  backbone.

At inference only the scorer remains: top-``k`` of ``s`` at budget ``b`` (the official keeps a
fixed number per module, ``M − pruning_rate``, and pins the CLS token with ``+∞``; here prefix
tokens are always kept and ``k = ceil(b·N)``). **Last-layer fusion** (LLF, ``--cropr_llf``): the
pruned tokens are put back, with their block-``L`` states, before the final block, which runs
on all ``P + N`` tokens (:func:`prune_tokens_llf`, :func:`cropr_forward` with ``fusion=True``).

Differences of setting (not of the module): the backbone stays frozen here (MIDAS's
protocol), where the paper trains it jointly with one module per block; the module sits at one
depth ``L`` so it shares the MIDAS tables. The official's optional switches (pre-attention
norm, query/key/value projections, several queries) are off by default there and not offered.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from timm.layers import Mlp, trunc_normal_, trunc_normal_tf_
from torch import Tensor, nn

from ..pruning import PrunedOutput, keep_mask_from_indices, kept_token_indices, prune_tokens, score_tokens
from .base import TokenScorer, register_scorer
from ..backbones.vit import classify_tokens, gather_tokens, run_blocks

__all__ = ["CroprScorer", "prune_tokens_llf", "cropr_forward"]


class CroprScorer(TokenScorer):
    """Cropr module at depth ``L``: query-key scorer + aggregator + auxiliary head.

    Official code: ``benbergner/cropr``, ``cls/cropr.py`` (``CrossAttention`` with
    ``num_queries=1``, ``ClassificationHead``); parameter names follow it (``queries``,
    ``proj``, ``mlp_norm``, ``mlp.fc1``/``mlp.fc2``; ``head_norm``/``head`` are the official
    ``head.norm``/``head.head``).

    Args:
        dim: embedding width ``D``.
        num_classes: classes ``C`` of the auxiliary head.
        num_heads: heads ``H`` of the cross-attention (``D % H == 0``). Default: 1 (official).
        mlp_ratio: hidden width of the aggregator's MLP as a multiple of ``D``. Default: 4.0
            (official).

    Shapes: ``score(tokens [B,P+N,D], P) -> [B,N]``; ``aux_logits(tokens, P) -> [B,C]``.

    Raises:
        ValueError: ``D`` not divisible by ``H``, or a non-positive size.
    """

    trainable = True
    #: architecture identity, part of the scorer cache key (:func:`midas_nb.train.load_or_train_scorer`)
    architecture = "cropr/official-cls-v1"

    def __init__(self, dim: int, num_classes: int, num_heads: int = 1, mlp_ratio: float = 4.0):
        super().__init__()
        if dim <= 0 or num_classes <= 0 or num_heads <= 0 or mlp_ratio <= 0:
            raise ValueError(f"dim, num_classes, num_heads and mlp_ratio must be positive, got {dim}, "
                             f"{num_classes}, {num_heads}, {mlp_ratio}")
        if dim % num_heads:
            raise ValueError(f"Cropr: dim={dim} must be divisible by num_heads={num_heads}")
        self.dim, self.num_classes, self.num_heads = int(dim), int(num_classes), int(num_heads)
        self.head_dim = dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.mlp_ratio = float(mlp_ratio)
        self.queries = nn.Parameter(torch.empty(1, 1, dim))
        trunc_normal_tf_(self.queries, std=dim ** -0.5)
        self.proj = nn.Linear(dim, dim) if num_heads > 1 else nn.Identity()
        self.mlp_norm = nn.LayerNorm(dim, eps=1e-6)
        self.mlp = Mlp(dim, int(dim * mlp_ratio))
        self.head_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)
        trunc_normal_(self.head.weight, std=0.02)
        nn.init.zeros_(self.head.bias)

    def attention_logits(self, tokens: Tensor) -> Tensor:
        """Unscaled per-head query-key products ``⟨q_h, x_{j,h}⟩`` of all tokens: ``[B,H,P+N]``.

        The tokens are detached first (stop-gradient: nothing flows back into the backbone).
        """
        x = tokens.detach()
        B, T, _ = x.shape
        q = self.queries.reshape(self.num_heads, self.head_dim)
        return torch.einsum("bthd,hd->bht", x.reshape(B, T, self.num_heads, self.head_dim), q)

    def score(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        return self.attention_logits(tokens)[:, :, num_prefix:].sum(dim=1)

    def aggregate(self, tokens: Tensor, logits: Tensor | None = None) -> Tensor:
        """Aggregator output ``z = o + MLP(LN(o))`` over all ``P + N`` tokens: ``[B,D]``."""
        if logits is None:
            logits = self.attention_logits(tokens)
        x = tokens.detach()
        B, T, D = x.shape
        a = (logits * self.scale).softmax(dim=-1)                           # [B,H,T]
        o = torch.einsum("bht,bthd->bhd", a, x.reshape(B, T, self.num_heads, self.head_dim)).reshape(B, D)
        o = self.proj(o)
        return o + self.mlp(self.mlp_norm(o))

    def aux_logits(self, tokens: Tensor, num_prefix: int, logits: Tensor | None = None) -> Tensor:
        """Auxiliary head on the aggregator: ``[B,C]`` (training only; ``num_prefix`` unused,
        the aggregator attends over every token)."""
        return self.head(self.head_norm(self.aggregate(tokens, logits)))

    def training_loss(self, backbone: nn.Module, hidden: Tensor, labels: Tensor, *, depth: int,
                      budget: float, num_prefix: int) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-entropy of the auxiliary head; logged logits are the hard top-``k`` pruned
        model's (no gradient: the selection is not differentiated, as in the paper)."""
        logits_attn = self.attention_logits(hidden)
        scores = logits_attn[:, :, num_prefix:].sum(dim=1)
        loss = F.cross_entropy(self.aux_logits(hidden, num_prefix, logits_attn), labels)
        with torch.no_grad():
            pruned = prune_tokens(backbone, hidden.detach(), scores.detach(), depth, budget).logits
        return loss, pruned, scores


def prune_tokens_llf(backbone: nn.Module, hidden: Tensor, scores: Tensor, depth: int, budget: float) -> PrunedOutput:
    """Top-``k`` pruning at block ``L`` with Cropr's last-layer fusion.

    Blocks ``L+1..n−1`` run on the prefix and the top ``k = ceil(b·N)`` patch tokens; before
    the final block the pruned tokens are put back at their positions with their block-``L``
    states, and the final block, norm and head run on all ``P + N`` tokens (Bergner et al.,
    2025, "Last Layer Fusion"). With ``L = n−1`` the result is the full model's.

    Args:
        backbone: timm ViT.
        hidden: ``[B,P+N,D]`` output of block ``L``.
        scores: ``[B,N]`` ranking (higher = keep).
        depth: ``L``.
        budget: ``b ∈ (0,1]``.

    Returns:
        :class:`~midas_nb.pruning.PrunedOutput` (``keep_idx``/``keep_mask`` of the pruned
        stretch).
    """
    depth, P, keep_idx = kept_token_indices(backbone, hidden, scores, depth, budget)
    N, D = hidden.shape[1] - P, hidden.shape[2]
    x = run_blocks(backbone, gather_tokens(hidden, keep_idx, P), depth, len(backbone.blocks) - 1)
    patches = hidden[:, P:].scatter(1, keep_idx.unsqueeze(-1).expand(-1, -1, D), x[:, P:])
    x = backbone.blocks[-1](torch.cat([x[:, :P], patches], dim=1))
    return PrunedOutput(logits=classify_tokens(backbone, x), keep_idx=keep_idx,
                        keep_mask=keep_mask_from_indices(keep_idx, N), scores=scores)


def cropr_forward(backbone: nn.Module, images: Tensor, scorer: TokenScorer, depth: int, budget: float,
                  *, fusion: bool = False) -> PrunedOutput:
    """Pruned forward with a Cropr (or any) scorer, optionally with last-layer fusion.

    ``fusion=False`` is :func:`midas_nb.pruning.pruned_forward`; ``fusion=True`` puts the
    pruned tokens back before the final block (:func:`prune_tokens_llf`). Returns a
    :class:`~midas_nb.pruning.PrunedOutput` with ``logits [B,C]``.
    """
    hidden, scores = score_tokens(backbone, images, scorer, depth)
    return (prune_tokens_llf if fusion else prune_tokens)(backbone, hidden, scores, depth, budget)


register_scorer("cropr", condition=True)(CroprScorer)
