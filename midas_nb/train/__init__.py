"""Scorer training at depth ``L`` and budget ``b`` with the backbone frozen (DESIGN.md §5).

The loss of a trainable scorer (:class:`~midas_nb.scorers.MLPScorer`) is

    ``L = L_cls + λ·L_ga``

- ``L_cls`` — cross-entropy of the *pruned* model's logits on the label. It reaches the
  scorer through a relaxation of the hard top-k selection (``relaxation``):

  * ``"st"`` (default) — hard top-k forward; the kept tokens ``x_j`` (block-``L`` output) are
    multiplied by the straight-through multiplier ``m_j = 1 + s_j − sg(s_j)`` (value 1,
    gradient 1 w.r.t. ``s_j``), so ``∂L_cls/∂s_j = ⟨∂L_cls/∂x_j, x_j⟩`` for kept tokens — an
    input×gradient signal at depth ``L``, i.e. T5-like (DESIGN.md §4) — and **0 for dropped
    tokens**. The forward equals the evaluation forward exactly. Only ``P + k`` tokens run
    through blocks ``L+1..n``.
  * ``"soft"`` — all ``P + N`` tokens run through blocks ``L+1..n`` with an additive
    attention bias on the *keys*: ``β_j = log σ((s_j − t) / (τ_m·sd(s)))`` for patch tokens and
    ``0`` for prefix tokens, where ``t`` is the midpoint between the ``k``-th and ``(k+1)``-th
    highest score and ``sd(s)`` the per-image standard deviation of the scores (both
    detached, so ``τ_m`` is in units of the score spread and the mask does not soften or
    sharpen with the scores' scale). ``exp(β_j)`` multiplies the attention every query pays to
    key ``j`` (before renormalisation) — the attention masking of DynamicViT (Rao et al., 2021,
    https://arxiv.org/abs/2106.02034, Eq. 8–9) with a sigmoid gate around the top-k threshold
    instead of Gumbel samples. Every token gets a gradient; evaluation uses the hard top-k.
    Needs CLS pooling (``global_pool="token"``).

- ``L_ga`` — distillation of a cached target map ``T [B,N]`` into the scores (:func:`distill_loss`);
  default ``"kl"``: ``KL(softmax(z(T)/τ) ‖ softmax(s/τ))`` with ``z`` the per-image z-score
  (the attention-guidance loss of MIDAS; the ListNet top-one loss, Cao et al., 2007).

The backbone stays frozen and in eval mode (:func:`frozen`); only scorer parameters train.
Block-``L`` hidden states of a split are computed once and cached (:func:`block_cache`), so a
scorer step runs only the scorer and blocks ``L+1..n`` on the kept tokens. No flip
augmentation is used (cached states are of the un-augmented images; the scorer has ~D²/2
parameters and a frozen backbone). Trained scorers are cached by key
(:func:`load_or_train_scorer`) under ``midas_nb.config.cache_dir()/scorers``.
"""
from __future__ import annotations

from ..backbones.vit import frozen
from .cache import BlockCache, block_cache, block_caches, key_hash
from .loop import optimise_on_cache
from .scorer import (DistillForm, Relaxation, TrainResult, distill_loss, load_or_train_scorer,
                     load_or_train_scorers, relaxed_logits, train_scorers, zscore)

__all__ = ["Relaxation", "DistillForm", "BlockCache", "TrainResult", "zscore", "distill_loss", "relaxed_logits",
           "frozen", "key_hash", "block_cache", "block_caches", "train_scorers", "load_or_train_scorer",
           "load_or_train_scorers", "optimise_on_cache"]
