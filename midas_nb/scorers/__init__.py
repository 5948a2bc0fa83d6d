"""Token scorers: one score per patch token of block ``L``'s output; higher = keep (DESIGN.md §3, §5).

- :mod:`~midas_nb.scorers.base` — the :class:`TokenScorer` contract (one override point,
  :meth:`TokenScorer.score`), the registry and the three plain scorers: ``reference`` (CLS
  attention, EViT), ``mlp`` (DynamicViT's per-token predictor) and ``random``.
- :mod:`~midas_nb.scorers.cropr` — **Token Cropr** (Bergner, Lippert & Mahendran, CVPR 2025):
  family ``cropr``, one learnable query over stop-gradient tokens with an auxiliary head.
- :mod:`~midas_nb.scorers.iared` — **IA-RED²** (Pan et al., NeurIPS 2021): family ``iared``, a
  multi-head interpreter trained by REINFORCE.

Each family registers itself where it is defined (:func:`register_scorer`); importing this
package loads all of them, so :func:`list_scorers` and :func:`list_scorer_conditions` do not
depend on what the caller imported.

Example::

    >>> from midas_nb.scorers import build_scorer
    >>> build_scorer("mlp", dim=192)(hidden, num_prefix=1).shape      # hidden: B x (1+N) x 192
    torch.Size([B, N])
"""
from __future__ import annotations

from .base import (MLPScorer, RandomScorer, ReferenceScorer, TokenScorer, build_scorer, cls_attention,
                   list_scorer_conditions, list_scorers, register_scorer, speed_scorers)
from .cropr import CroprScorer, cropr_forward, prune_tokens_llf
from .iared import IARedScorer, bernoulli_log_prob, iared_reward, masked_logits, reinforce_loss

__all__ = ["TokenScorer", "ReferenceScorer", "MLPScorer", "RandomScorer", "register_scorer", "list_scorers",
           "list_scorer_conditions", "build_scorer", "cls_attention", "speed_scorers", "CroprScorer", "cropr_forward",
           "prune_tokens_llf", "IARedScorer", "iared_reward", "bernoulli_log_prob", "reinforce_loss", "masked_logits"]
