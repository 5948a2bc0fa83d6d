"""Token Cropr: a cross-attention pruner trained through an auxiliary head (scorer ``cropr``).

Bergner, Lippert & Mahendran, *Token Cropr: Faster ViTs for Quite a Few Tasks*, CVPR 2025,
https://arxiv.org/abs/2412.00965. One Cropr module at depth ``L`` (DESIGN.md §5), reading the
output of block ``L`` like every other scorer of :mod:`midas_nb.scorers`:

- **router / scorer** — one learnable query ``q ∈ R^{H×d_h}`` cross-attends over the
  stop-gradient patch tokens; keys ``k_j = W_k·LN(sg(x_j)) + b_k`` split into ``H`` heads; the
  score of token ``j`` is the query–key product summed over heads,
  ``s_j = Σ_h ⟨q_h, k_{h,j}⟩ / √d_h``. No value or output projection is needed for scoring.
- **aggregator** — the attention ``a_{h,j} = softmax_j(⟨q_h, k_{h,j}⟩/√d_h)`` averages the
  normalised stop-gradient tokens, head ``h`` its own channel slice (identity value/out
  projection): ``o = concat_h Σ_j a_{h,j} LN(sg(x_j))_h``; then ``z = o + MLP(LN(o))``.
- **auxiliary head** — ``LN → Linear(D, C)`` on ``z``, trained with cross-entropy on the label.
  The aggregator's softmax carries the gradient to the query and key weights, so the scores
  learn task relevance; the stop-gradient keeps the auxiliary loss out of the backbone.

At inference only the scorer remains (the aggregator and head are not run): top-``k`` of
``s`` at budget ``b``. **Last-layer fusion** (LLF, the paper's option for dense tasks): the
pruned tokens are put back, with their block-``L`` states, before the final block, which runs
on all ``P + N`` tokens (:func:`prune_tokens_llf`, :func:`cropr_forward` with ``fusion=True``).

The backbone stays frozen here (MIDAS's protocol), where the paper trains it jointly; the
module sits at one depth ``L`` instead of one per block, so it shares the MIDAS tables.
"""
from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..metrics import bootstrap_ci, measure_throughput
from ..pruning import PrunedOutput, keep_mask_from_indices, kept_token_indices, prune_tokens, score_tokens
from ..scorers import TokenScorer, register_scorer
from ..vit import classify_tokens, gather_tokens, run_blocks

__all__ = ["CroprScorer", "prune_tokens_llf", "cropr_forward"]


def default_heads(dim: int) -> int:
    """Heads of a ViT of width ``dim`` (head width 64): ``dim // 64`` if it divides ``dim``, else 1."""
    heads = max(1, dim // 64)
    return heads if dim % heads == 0 else 1


class CroprScorer(TokenScorer):
    """Cropr module at depth ``L``: query-key scorer + aggregator + auxiliary head.

    Args:
        dim: embedding width ``D``.
        num_classes: classes ``C`` of the auxiliary head.
        num_heads: heads ``H`` of the cross-attention (``D % H == 0``). Default: ``D // 64``
            (at least 1), the head width of a ViT.
        mlp_ratio: hidden width of the aggregator's MLP as a multiple of ``D``. Default: 2.0.

    Shapes: ``score(tokens [B,P+N,D], P) -> [B,N]``; ``aux_logits(tokens, P) -> [B,C]``.
    """

    trainable = True

    def __init__(self, dim: int, num_classes: int, num_heads: int | None = None, mlp_ratio: float = 2.0):
        super().__init__()
        num_heads = default_heads(dim) if num_heads is None else int(num_heads)
        assert dim > 0 and num_classes > 0, f"dim and num_classes must be positive, got {dim}, {num_classes}"
        assert num_heads > 0 and dim % num_heads == 0, f"dim={dim} must be divisible by num_heads={num_heads}"
        self.dim, self.num_classes, self.num_heads = int(dim), int(num_classes), num_heads
        self.head_dim = dim // num_heads
        hidden = max(1, int(round(mlp_ratio * dim)))
        self.query = nn.Parameter(torch.empty(num_heads, self.head_dim))
        nn.init.trunc_normal_(self.query, std=0.02)
        self.norm = nn.LayerNorm(dim)
        self.key = nn.Linear(dim, dim)
        self.agg_norm = nn.LayerNorm(dim)
        self.agg_mlp = nn.Sequential(nn.Linear(dim, hidden), nn.GELU(), nn.Linear(hidden, dim))
        self.head_norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, num_classes)

    def attention_logits(self, tokens: Tensor, num_prefix: int) -> Tensor:
        """Per-head query-key products ``⟨q_h, k_{h,j}⟩/√d_h`` of the patch tokens: ``[B,H,N]``.

        The tokens are detached first (stop-gradient: nothing flows back into the backbone).
        """
        x = tokens[:, num_prefix:].detach()
        B, N, _ = x.shape
        k = self.key(self.norm(x)).view(B, N, self.num_heads, self.head_dim)
        return torch.einsum("bnhd,hd->bhn", k, self.query) / math.sqrt(self.head_dim)

    def score(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        return self.attention_logits(tokens, num_prefix).sum(dim=1)

    def aggregate(self, tokens: Tensor, num_prefix: int, logits: Tensor | None = None) -> Tensor:
        """Aggregator output ``z = o + MLP(LN(o))``, ``o`` the attention-weighted tokens: ``[B,D]``."""
        if logits is None:
            logits = self.attention_logits(tokens, num_prefix)
        x = self.norm(tokens[:, num_prefix:].detach())
        B, N, D = x.shape
        a = logits.softmax(dim=-1)                                          # [B,H,N]
        o = torch.einsum("bhn,bnhd->bhd", a, x.view(B, N, self.num_heads, self.head_dim)).reshape(B, D)
        return o + self.agg_mlp(self.agg_norm(o))

    def aux_logits(self, tokens: Tensor, num_prefix: int, logits: Tensor | None = None) -> Tensor:
        """Auxiliary head on the aggregator: ``[B,C]`` (training only)."""
        return self.head(self.head_norm(self.aggregate(tokens, num_prefix, logits)))

    def training_loss(self, backbone: nn.Module, hidden: Tensor, labels: Tensor, *, depth: int,
                      budget: float, num_prefix: int) -> tuple[Tensor, Tensor, Tensor]:
        """Cross-entropy of the auxiliary head; logged logits are the hard top-``k`` pruned
        model's (no gradient: the selection is not differentiated, as in the paper)."""
        logits_attn = self.attention_logits(hidden, num_prefix)
        scores = logits_attn.sum(dim=1)
        loss = F.cross_entropy(self.aux_logits(hidden, num_prefix, logits_attn), labels)
        with torch.no_grad():
            pruned = prune_tokens(backbone, hidden.detach(), scores.detach(), depth, budget).logits
        return loss, pruned, scores

    def evaluation_extras(self, backbone: nn.Module, hidden: Tensor, labels: Tensor, scores: Tensor, *,
                          depth: int, budget: float, num_prefix: int,
                          images: Tensor | None = None) -> dict[str, Any]:
        """``accuracy_llf`` (+ bootstrap CI) of the last-layer-fusion forward, ``aux_accuracy``
        of the auxiliary head and, given ``images``, ``throughput_llf`` (images/s) with
        ``llf_speed_ratio`` = LLF / plain Cropr pruning, both timed in alternation here (the
        best of two rounds each) so that the ratio does not depend on the machine's load."""
        device = next(backbone.parameters()).device
        llf, aux = [], []
        with torch.no_grad():
            for i in range(0, hidden.shape[0], 64):
                h = hidden[i:i + 64].to(device, torch.float32)
                llf.append(prune_tokens_llf(backbone, h, scores[i:i + 64].to(device), depth, budget)
                           .logits.argmax(-1).cpu())
                aux.append(self.aux_logits(h, num_prefix).argmax(-1).cpu())
        labels = labels.cpu()
        mean, lo, hi = bootstrap_ci((torch.cat(llf) == labels).float())
        out: dict[str, Any] = dict(accuracy_llf=mean, accuracy_llf_lo=lo, accuracy_llf_hi=hi,
                                   aux_accuracy=float((torch.cat(aux) == labels).float().mean()))
        if images is not None:
            speed = {True: 0.0, False: 0.0}
            for _ in range(2):
                for fusion in (False, True):
                    speed[fusion] = max(speed[fusion], measure_throughput(
                        lambda x, f=fusion: cropr_forward(backbone, x, self, depth, budget, fusion=f).logits,
                        images, repeats=3, warmup=1))
            out.update(throughput_llf=speed[True], llf_speed_ratio=speed[True] / speed[False])
        return out


def prune_tokens_llf(backbone: nn.Module, hidden: Tensor, scores: Tensor, depth: int,
                     budget: float) -> PrunedOutput:
    """Top-``k`` pruning at block ``L`` with Cropr's last-layer fusion.

    Blocks ``L+1..depth−1`` run on the prefix and the top ``k = ceil(b·N)`` patch tokens; before
    the final block the pruned tokens are put back at their positions with their block-``L``
    states, and the final block, norm and head run on all ``P + N`` tokens (Bergner et al.,
    2025, "Last Layer Fusion"). With ``L = depth−1`` the result is the full model's.

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
    if fusion:
        return prune_tokens_llf(backbone, hidden, scores, depth, budget)
    return prune_tokens(backbone, hidden, scores, depth, budget)


@register_scorer("cropr", condition=True)
def _cropr(dim: int, num_classes: int, num_heads: int | None = None, mlp_ratio: float = 2.0) -> TokenScorer:
    return CroprScorer(dim, num_classes, num_heads=num_heads, mlp_ratio=mlp_ratio)
