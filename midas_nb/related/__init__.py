"""The other seed systems of the MIDAS analysis, in the same tables at the same depth and budget.

- :mod:`~midas_nb.related.cropr` — **Token Cropr** (Bergner, Lippert & Mahendran, CVPR 2025,
  https://arxiv.org/abs/2412.00965): scorer family ``cropr`` (one learnable query over
  stop-gradient tokens, auxiliary head), optional last-layer fusion; follows the official
  ``benbergner/cropr``, ``cls/cropr.py``.
- :mod:`~midas_nb.related.iared` — **IA-RED²** (Pan et al., NeurIPS 2021,
  https://arxiv.org/abs/2106.12620): scorer family ``iared`` (multi-head interpreter with its
  query from the first token, REINFORCE), evaluated by top-``k`` and by its own 0.5 threshold;
  follows the authors' ``IA_RED_model.py`` (``PerBlockAgent``; as distributed in
  ``joon-stack/ltrp``, ``score_net/ia_red_utils/IA_RED_model.py``).
- :mod:`~midas_nb.related.last` — **LaSt-ViT** (Shi, Yu & Yang, 2026,
  https://arxiv.org/abs/2602.22394): selective aggregation of the most stable tokens, a short
  fine-tune with it, Patch Score and Point-in-Box before and after.
- :mod:`~midas_nb.related.perturbation` — **TokenTM**'s evaluation protocol (Wu et al., CVPR
  2024, https://arxiv.org/abs/2403.14552): positive and negative perturbation tests.
- :mod:`~midas_nb.related.table` — :func:`related_table` / :func:`run_related`, one table with
  the MIDAS conditions (notebook 06).

Importing this package registers ``cropr`` and ``iared`` with
:func:`midas_nb.scorers.register_scorer` (``condition=True``), which makes them conditions of
:func:`midas_nb.protocol.run_protocol` (:func:`midas_nb.scorers.list_scorer_conditions` imports
it on demand).

Example::

    >>> from midas_nb import related
    >>> res = related.run_related(study)          # protocol + perturbation + LaSt, one table
    >>> res.table[["kind", "method", "miou", "idauc", "D_pp", "pib", "accuracy", "throughput"]]
"""
from __future__ import annotations

from .cropr import CroprScorer, cropr_forward, prune_tokens_llf
from .iared import IARedScorer, bernoulli_log_prob, iared_reward, masked_logits, reinforce_loss
from .last import (LAST_FINETUNE_K, LaStHead, LaStViT, last_aggregate, last_finetune, patch_score_maps,
                   pib_columns, pib_table, token_stability)
from .perturbation import perturbation_curves, perturbation_table, perturbation_test
from .table import (FAMILY_COLUMNS, PERTURBATION_MAPS, RELATED_CONDITIONS, RelatedResults, family_table,
                    related_table, run_related, speed_note, speed_table)

__all__ = [
    "CroprScorer", "cropr_forward", "prune_tokens_llf",
    "IARedScorer", "iared_reward", "bernoulli_log_prob", "reinforce_loss", "masked_logits",
    "token_stability", "last_aggregate", "LaStHead", "LaStViT", "last_finetune", "patch_score_maps",
    "pib_table", "pib_columns", "LAST_FINETUNE_K",
    "perturbation_curves", "perturbation_test", "perturbation_table",
    "RELATED_CONDITIONS", "PERTURBATION_MAPS", "FAMILY_COLUMNS", "related_table", "RelatedResults",
    "run_related", "speed_table", "speed_note", "family_table",
]
