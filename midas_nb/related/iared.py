"""IA-RED²: a multi-head interpreter trained with REINFORCE (scorer ``iared``).

Pan, Panda, Jiang, Wang, Feris & Oliva, *IA-RED²: Interpretability-Aware Redundancy Reduction
for Vision Transformers*, NeurIPS 2021, https://arxiv.org/abs/2106.12620. One interpreter at
depth ``L`` (DESIGN.md §5), reading the output of block ``L``:

- **multi-head interpreter** — a learnable policy token ``p ∈ R^D``; per head ``h`` linear maps
  ``q_h = (W_q p + b_q)_h``, ``k_{h,j} = (W_k LN(x_j) + b_k)_h``; the informative score of patch
  token ``j`` is the mean over heads of ``σ(⟨q_h, k_{h,j}⟩ / √d_h)`` — a keep probability
  ``π_j ∈ (0,1)``.
- **policy** — keep token ``j`` with ``u_j ~ Bernoulli(π_j)`` independently (prefix tokens are
  always kept); blocks ``L+1..depth`` see only the kept tokens (key masking,
  :func:`masked_logits`).
- **reward** (:func:`iared_reward`) — ``R = 1 − ρ^e`` when the prediction is correct (``ρ`` the
  kept fraction, ``e = 2`` by default: fewer tokens, more reward) and ``R = −γ`` when it is
  wrong.
- **REINFORCE** (Williams, 1992) with the batch-mean baseline (:func:`reinforce_loss`):
  ``∇J ≈ mean_b (R_b − R̄) ∇ log π(u_b)``, ``log π(u) = Σ_j u_j log π_j + (1−u_j) log(1−π_j)``.

The backbone is frozen (MIDAS's protocol; the paper also fine-tunes it afterwards) and no
gradient flows through it: the forward that decides the reward runs under ``no_grad``.
Evaluation ranks tokens by ``π`` and keeps the top ``k`` at the shared budget; the interpreter's
own rule (keep ``π_j > 0.5``) is reported beside it (``threshold_keep_rate``,
``threshold_accuracy``) by :meth:`IARedScorer.evaluation_extras`.
"""
from __future__ import annotations

import math
from typing import Any

import torch
from torch import Tensor, nn

from ..metrics import bootstrap_ci
from ..pruning import check_depth
from ..scorers import TokenScorer, register_scorer
from ..vit import classify_tokens, num_prefix_tokens
from .cropr import default_heads

__all__ = ["IARedScorer", "iared_reward", "bernoulli_log_prob", "reinforce_loss", "masked_logits"]


def iared_reward(correct: Tensor, keep_rate: Tensor, penalty: float = 1.0, exponent: float = 2.0) -> Tensor:
    """IA-RED² reward per image: ``1 − ρ^e`` if correct, ``−γ`` otherwise.

    Args:
        correct: ``[B]`` bool, the prediction with the kept tokens equals the label.
        keep_rate: ``[B]`` ``ρ ∈ [0,1]``, fraction of patch tokens kept.
        penalty: ``γ ≥ 0``. Default: 1.0.
        exponent: ``e > 0``. Default: 2.0.

    Returns:
        ``[B]`` float rewards.
    """
    if correct.shape != keep_rate.shape:
        raise ValueError(f"correct and keep_rate must both be [B], got {tuple(correct.shape)} and "
                         f"{tuple(keep_rate.shape)}")
    if penalty < 0 or exponent <= 0:
        raise ValueError(f"need penalty ≥ 0 and exponent > 0, got {penalty}, {exponent}")
    keep_rate = keep_rate.float()
    return torch.where(correct.bool(), 1.0 - keep_rate.pow(exponent), torch.full_like(keep_rate, -float(penalty)))


def bernoulli_log_prob(probs: Tensor, keep: Tensor, eps: float = 1e-6) -> Tensor:
    """``log π(u) = Σ_j u_j log π_j + (1−u_j) log(1−π_j)``: ``[B,N], [B,N] bool → [B]``."""
    if probs.shape != keep.shape:
        raise ValueError(f"probs and keep must have the same [B,N] shape, got {tuple(probs.shape)} "
                         f"and {tuple(keep.shape)}")
    p = probs.clamp(eps, 1.0 - eps)
    k = keep.to(p.dtype)
    return (k * p.log() + (1.0 - k) * (1.0 - p).log()).sum(dim=-1)


def reinforce_loss(log_prob: Tensor, reward: Tensor) -> Tensor:
    """REINFORCE with the batch-mean baseline: ``−mean_b (R_b − mean(R)) · log π(u_b)``.

    Minimising it ascends the expected reward (Williams, 1992, "Simple statistical
    gradient-following algorithms for connectionist reinforcement learning", Eq. 11 with the
    baseline ``b = mean R``). The advantage is detached.

    Args:
        log_prob: ``[B]`` log-probability of the sampled actions (differentiable).
        reward: ``[B]`` rewards.

    Returns:
        scalar loss.
    """
    if log_prob.shape != reward.shape or log_prob.dim() != 1:
        raise ValueError(f"log_prob and reward must both be [B], got {tuple(log_prob.shape)} and "
                         f"{tuple(reward.shape)}")
    advantage = (reward - reward.mean()).detach().to(log_prob.dtype)
    return -(advantage * log_prob).mean()


def masked_logits(backbone: nn.Module, hidden: Tensor, keep_mask: Tensor, depth: int) -> Tensor:
    """Logits when blocks ``L+1..depth`` see only the prefix and the patch tokens ``keep_mask``.

    Every block after ``L`` gets the additive key mask ``−∞`` at dropped patch tokens, so no
    query attends to them; with CLS pooling the logits equal those of really dropping them
    (:func:`midas_nb.pruning.prune_tokens`) — also for a different number of kept tokens per
    image, which token dropping cannot batch.

    Args:
        backbone: timm ViT with CLS pooling (``global_pool="token"``).
        hidden: ``[B,P+N,D]`` output of block ``L``.
        keep_mask: ``[B,N]`` bool.
        depth: ``L``.

    Returns:
        ``[B,C]`` logits.

    Raises:
        ValueError: a backbone without CLS pooling (it would average the masked tokens), or a
            mask of the wrong shape.
    """
    depth = check_depth(backbone, depth)
    pool = getattr(backbone, "global_pool", "token")
    if pool != "token":
        raise ValueError(f"masked_logits needs CLS pooling (global_pool='token'); the backbone pools "
                         f"with {pool!r} and would average the masked tokens")
    P = num_prefix_tokens(backbone)
    B, T, _ = hidden.shape
    if keep_mask.shape != (B, T - P):
        raise ValueError(f"keep_mask must be [B,N]=({B},{T - P}), got {tuple(keep_mask.shape)}")
    bias = torch.zeros(B, T, dtype=hidden.dtype, device=hidden.device)
    bias[:, P:] = bias[:, P:].masked_fill(~keep_mask.bool().to(hidden.device), float("-inf"))
    attn_mask = bias[:, None, None, :]                                        # [B,1,1,T] on keys
    x = hidden
    for blk in backbone.blocks[depth:]:
        x = blk(x, attn_mask=attn_mask)
    return classify_tokens(backbone, x)


class IARedScorer(TokenScorer):
    """IA-RED² multi-head interpreter at depth ``L``; scores are keep probabilities ``π ∈ (0,1)``.

    Args:
        dim: embedding width ``D``.
        num_heads: heads ``H`` (``D % H == 0``). Default: ``D // 64`` (at least 1).
        penalty: ``γ`` of the reward for a wrong prediction. Default: 1.0.
        exponent: ``e`` of the reward ``1 − ρ^e``. Default: 2.0.
        threshold: the interpreter's own keep rule ``π_j > threshold``. Default: 0.5.
        seed: seed of the Bernoulli draws (a CPU generator, so CPU and CUDA sample alike).
            Default: ``None`` — drawn from torch's global RNG at construction, so
            ``torch.manual_seed`` before building the scorer fixes it.
        num_classes: accepted for the protocol's factory convention; unused.
    """

    trainable = True

    def __init__(self, dim: int, num_heads: int | None = None, penalty: float = 1.0, exponent: float = 2.0,
                 threshold: float = 0.5, seed: int | None = None, num_classes: int | None = None):
        super().__init__()
        num_heads = default_heads(dim) if num_heads is None else int(num_heads)
        assert dim > 0 and num_heads > 0 and dim % num_heads == 0, \
            f"dim={dim} must be positive and divisible by num_heads={num_heads}"
        assert penalty >= 0 and exponent > 0 and 0 < threshold < 1, \
            f"need penalty ≥ 0, exponent > 0, 0 < threshold < 1; got {penalty}, {exponent}, {threshold}"
        self.dim, self.num_heads, self.head_dim = int(dim), num_heads, dim // num_heads
        self.penalty, self.exponent, self.threshold = float(penalty), float(exponent), float(threshold)
        self.policy_token = nn.Parameter(torch.empty(dim))
        nn.init.trunc_normal_(self.policy_token, std=0.02)
        self.norm = nn.LayerNorm(dim)
        self.query = nn.Linear(dim, dim)
        self.key = nn.Linear(dim, dim)
        self.seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if seed is None else int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    def head_scores(self, tokens: Tensor, num_prefix: int) -> Tensor:
        """Per-head informative scores ``σ(⟨q_h, k_{h,j}⟩/√d_h)``: ``[B,H,N]``."""
        x = tokens[:, num_prefix:]
        B, N, _ = x.shape
        k = self.key(self.norm(x)).view(B, N, self.num_heads, self.head_dim)
        q = self.query(self.policy_token).view(self.num_heads, self.head_dim)
        return torch.sigmoid(torch.einsum("bnhd,hd->bhn", k, q) / math.sqrt(self.head_dim))

    def score(self, tokens: Tensor, num_prefix: int, attn: Tensor | None = None) -> Tensor:
        return self.head_scores(tokens, num_prefix).mean(dim=1)

    def sample_keep(self, probs: Tensor) -> Tensor:
        """Bernoulli keep decisions ``u ~ Bernoulli(π)``: ``[B,N] → [B,N]`` bool (own generator)."""
        u = torch.rand(probs.shape, generator=self.generator).to(probs.device)
        return u < probs.detach()

    def training_loss(self, backbone: nn.Module, hidden: Tensor, labels: Tensor, *, depth: int,
                      budget: float, num_prefix: int) -> tuple[Tensor, Tensor, Tensor]:
        """REINFORCE loss of one batch; the logged logits are those of the sampled policy."""
        probs = self.score(hidden, num_prefix)
        keep = self.sample_keep(probs)
        with torch.no_grad():
            logits = masked_logits(backbone, hidden.detach(), keep, depth)
        reward = iared_reward(logits.argmax(-1) == labels, keep.float().mean(dim=1), self.penalty, self.exponent)
        loss = reinforce_loss(bernoulli_log_prob(probs, keep), reward.to(probs.device))
        return loss, logits, probs

    def evaluation_extras(self, backbone: nn.Module, hidden: Tensor, labels: Tensor, scores: Tensor, *,
                          depth: int, budget: float, num_prefix: int,
                          images: Tensor | None = None) -> dict[str, Any]:
        """The interpreter's own rule (keep ``π_j > threshold``): ``threshold_keep_rate`` (mean
        kept fraction), ``threshold_accuracy`` (+ bootstrap CI)."""
        device = next(backbone.parameters()).device
        keep = scores > self.threshold
        preds = []
        with torch.no_grad():
            for i in range(0, hidden.shape[0], 64):
                preds.append(masked_logits(backbone, hidden[i:i + 64].to(device, torch.float32),
                                           keep[i:i + 64].to(device), depth).argmax(-1).cpu())
        mean, lo, hi = bootstrap_ci((torch.cat(preds) == labels.cpu()).float())
        return dict(threshold_keep_rate=float(keep.float().mean()), threshold_accuracy=mean,
                    threshold_accuracy_lo=lo, threshold_accuracy_hi=hi, threshold=self.threshold)


@register_scorer("iared", condition=True)
def _iared(dim: int, num_classes: int | None = None, num_heads: int | None = None, penalty: float = 1.0,
           exponent: float = 2.0, threshold: float = 0.5, seed: int | None = None) -> TokenScorer:
    return IARedScorer(dim, num_heads=num_heads, penalty=penalty, exponent=exponent, threshold=threshold,
                       seed=seed)
