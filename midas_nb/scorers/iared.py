"""IA-RED²: a multi-head interpreter trained with REINFORCE (scorer ``iared``).

Pan, Panda, Jiang, Wang, Feris & Oliva, *IA-RED²: Interpretability-Aware Redundancy Reduction
for Vision Transformers*, NeurIPS 2021, https://arxiv.org/abs/2106.12620. The interpreter
follows the authors' model file ``IA_RED_model.py`` (classes ``PerBlockAgent``, ``AttnGroup``,
builder ``interp_deit_small_patch16_224``; the project page lists the code as "coming soon",
the file is distributed with LTRP's score networks, e.g. ``joon-stack/ltrp``,
``score_net/ia_red_utils/IA_RED_model.py``). One interpreter at depth ``L`` (DESIGN.md §5),
reading the output of block ``L``:

- **multi-head interpreter** (``PerBlockAgent``) — ``x̂ = LN(x)`` without affine parameters
  over the whole sequence, one linear map ``W_qk`` (bias) gives per head ``h`` a query and a key
  for every token; the **query comes from the sequence's first token** (CLS), so the score of a
  token depends on the image, not on the token alone: ``π_j = mean_h σ(⟨q_{h,0}, k_{h,j}⟩/√d_h)``,
  a keep probability in ``(0,1)``. Heads: 6, the value ``AttnGroup`` builds (the class's own
  default, 2, is not used by the released model).
- **policy** (``AttnGroup.forward_agent``) — keep token ``j`` with ``u_j ~ Bernoulli(π_j)``
  (prefix tokens always kept); at inference keep ``π_j > 0.5``. Blocks ``L+1..n`` see only
  the kept tokens (key masking, :func:`masked_logits`).
- **reward** (:func:`iared_reward`, the paper's reward) — ``R = 1 − ρ^e`` when the prediction is
  correct (``ρ`` the kept fraction, ``e = 2``) and ``R = −γ`` when it is wrong (``γ = 1``, the
  builder's ``error_penalty=-1``).
- **REINFORCE** (Williams, 1992) with the batch-mean baseline (:func:`reinforce_loss`):
  ``∇J ≈ mean_b (R_b − R̄) ∇ log π(u_b)``, ``log π(u) = Σ_j u_j log π_j + (1−u_j) log(1−π_j)``.
  The released file has no training loop; the baseline is this package's choice.

Differences of setting: the backbone is frozen (MIDAS's protocol; the paper also fine-tunes
it) and no gradient flows through it; one interpreter scores once at depth ``L`` instead of one
per group of blocks (the first group's interpreter, whose previous policy is all ones);
evaluation ranks tokens by ``π`` and keeps the top ``k`` at the shared budget, and the
interpreter's own rule (keep ``π_j > 0.5``) is reported beside it (``threshold_keep_rate``,
``threshold_accuracy``) by :func:`midas_nb.metrics.family_readout`. The official ``W_qk`` has a
third, unused output block (``dim * 3``); it is left out.
"""
from __future__ import annotations

import torch
from torch import Tensor, nn

from ..pruning import check_depth
from .base import TokenScorer, register_scorer
from ..backbones.vit import classify_tokens, num_prefix_tokens

#: heads of the released interpreter (``AttnGroup``: ``PerBlockAgent(dim, num_heads=6)``)
DEFAULT_HEADS = 6

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
        raise ValueError(f"log_prob and reward must both be [B], got {tuple(log_prob.shape)} and {tuple(reward.shape)}")
    advantage = (reward - reward.mean()).detach().to(log_prob.dtype)
    return -(advantage * log_prob).mean()


def masked_logits(backbone: nn.Module, hidden: Tensor, keep_mask: Tensor, depth: int) -> Tensor:
    """Logits when blocks ``L+1..n`` see only the prefix and the patch tokens ``keep_mask``.

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

    Official code: ``PerBlockAgent`` in ``IA_RED_model.py`` (see the module docstring); the
    parameter ``qk`` holds the official ``qk`` layer's query and key blocks (its first ``2·D``
    output rows).

    Args:
        dim: embedding width ``D``.
        num_heads: heads ``H`` (``D % H == 0``). Default: 6 (the released model).
        qkv_bias: bias of the query/key map. Default: True (official).
        penalty: ``γ`` of the reward for a wrong prediction. Default: 1.0.
        exponent: ``e`` of the reward ``1 − ρ^e``. Default: 2.0.
        threshold: the interpreter's own keep rule ``π_j > threshold``. Default: 0.5.
        seed: seed of the Bernoulli draws (a CPU generator, so CPU and CUDA sample alike).
            Default: ``None`` — drawn from torch's global RNG at construction, so
            ``torch.manual_seed`` before building the scorer fixes it.
        num_classes: accepted for the protocol's factory convention; unused.

    Shapes: ``score(tokens [B,P+N,D], P) -> [B,N]`` (``P ≥ 1``: the query is token 0).

    Raises:
        ValueError: ``D`` not divisible by ``H``, or a setting out of range.
    """

    trainable = True
    #: architecture identity, part of the scorer cache key (:func:`midas_nb.train.load_or_train_scorer`)
    architecture = "iared/official-perblockagent-v1"

    def __init__(self, dim: int, num_heads: int = DEFAULT_HEADS, qkv_bias: bool = True, penalty: float = 1.0,
                 exponent: float = 2.0, threshold: float = 0.5, seed: int | None = None,
                 num_classes: int | None = None):
        super().__init__()
        if dim <= 0 or num_heads <= 0 or dim % num_heads:
            raise ValueError(f"IA-RED² interpreter: dim={dim} must be positive and divisible by num_heads="
                             f"{num_heads} (the released model uses 6 heads; pass num_heads= for other widths)")
        if penalty < 0 or exponent <= 0 or not 0 < threshold < 1:
            raise ValueError(f"need penalty ≥ 0, exponent > 0, 0 < threshold < 1; got {penalty}, {exponent}, "
                             f"{threshold}")
        self.dim, self.num_heads, self.head_dim = int(dim), int(num_heads), dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.penalty, self.exponent, self.threshold = float(penalty), float(exponent), float(threshold)
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.qk = nn.Linear(dim, 2 * dim, bias=qkv_bias)
        self.seed = int(torch.randint(0, 2 ** 62, (1,)).item()) if seed is None else int(seed)
        self.generator = torch.Generator().manual_seed(self.seed)

    def head_scores(self, tokens: Tensor, num_prefix: int) -> Tensor:
        """Per-head informative scores ``σ(⟨q_{h,0}, k_{h,j}⟩/√d_h)`` of the patch tokens: ``[B,H,N]``."""
        if num_prefix < 1:
            raise ValueError("IA-RED²'s query comes from the first (CLS) token; got num_prefix=0")
        B, T, _ = tokens.shape
        qk = self.qk(self.norm(tokens)).view(B, T, 2, self.num_heads, self.head_dim)
        q, k = qk[:, 0, 0], qk[:, num_prefix:, 1]                              # [B,H,d], [B,N,H,d]
        return torch.sigmoid(torch.einsum("bhd,bnhd->bhn", q, k) * self.scale)

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


#: heads of ``PerBlockAgent``'s own default (used where the released 6 do not divide the width)
CLASS_DEFAULT_HEADS = 2


def default_heads(dim: int) -> int:
    """The released model's 6 heads where they divide ``dim``, else ``PerBlockAgent``'s class
    default 2 (a narrow rehearsal or smoke backbone), else 1."""
    return DEFAULT_HEADS if dim % DEFAULT_HEADS == 0 else CLASS_DEFAULT_HEADS if dim % CLASS_DEFAULT_HEADS == 0 else 1


register_scorer("iared", condition=True)(     # IARedScorer's own arguments; num_heads=None: the width's default
    lambda dim, num_heads=None, **kw: IARedScorer(dim, default_heads(dim) if num_heads is None else num_heads, **kw))
