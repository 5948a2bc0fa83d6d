"""Supervision targets of the MIDAS taxonomy (DESIGN.md §4), all from one capture.

Every target is a small function registered under its id::

    fn(capture: CaptureResult, depth: int, class_index: Tensor[B]) -> Tensor[B, N]

returning one float32 value per *patch* token (prefix tokens removed, row-major over the
patch grid), on the capture's device. ``depth`` is the 1-based depth ``L`` of the study:
block ``L`` is entry ``L-1`` of the capture's per-block lists; ``h_j`` is the output of block
``L`` for token ``j``, ``A_h`` the attention probabilities ``[T,T]`` of head ``h`` of block
``L``, ``cls`` = token 0, ``y_c`` the class logit and ``ℓ`` the cross-entropy loss.

========== ===================================================================================
id         definition (patch token ``j``)
========== ===================================================================================
T0         ``E_h A_h[cls, j]``
T1         ``E_h Σ_i A_h[i, j]``
T2         ``E_h [A_h ⊙ (−∂ℓ/∂A_h)]⁺[cls, j]``
T3         Chefer GAE over *all* blocks: ``R = I; R += E_h[(∂y_c/∂A_b) ⊙ A_b]⁺ · R``; ``R[cls,j]``
T4         ``E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂``
T5         ``Σ_d h_{j,d} · ∂y_c/∂h_{j,d}`` (signed)
rollout    attention rollout over blocks ``1..L`` (a target at depth ``L``)
rollout_full attention rollout over *all* blocks (explains the output, like T3 and TokenTM)
tokentm    TokenTM contribution map over all blocks (gradient of the probability ``p_c``)
last_votes LaSt-ViT stability votes on block ``L``'s output after the final norm
random     seeded uniform values (lower bound)
========== ===================================================================================

:func:`compute_targets` computes any set of them from **one** forward and the backward
passes on the same graph (:func:`midas_nb.capture.capture`); :func:`target_cache` stores the
maps of a whole dataset split on disk (safetensors) and reloads them.

References:
    1. Chefer, Gur, Wolf, 2021. Generic Attention-model Explainability for Interpreting
       Bi-Modal and Encoder-Decoder Transformers. https://arxiv.org/abs/2103.15679
    2. Abnar, Zuidema, 2020. Quantifying Attention Flow in Transformers.
       https://arxiv.org/abs/2005.00928
    3. Wu, Duan, Kang, Tang, Yan, 2024. Token Transformation Matters: Towards Faithful
       Post-hoc Explanation for Vision Transformer (TokenTM, CVPR 2024).
       https://arxiv.org/abs/2403.14552
    4. Shi, Yu, Yang. Vision Transformers Need More Than Registers (LaSt-ViT).
       https://arxiv.org/abs/2602.22394
    5. Shrikumar, Greenside, Shcherbina, Kundaje, 2016. Not Just a Black Box: Learning
       Important Features Through Propagating Activation Differences (input × gradient).
       https://arxiv.org/abs/1605.01713
"""
from __future__ import annotations

from .registry import (DEFAULT_RANDOM_SEED, get_target, list_targets, register_target, TargetFn, TargetInfo,
                       target_info, taxonomy_table)
from .rules import (LAST_STATISTIC, LAST_VOTES_K, attention_rollout, channel_lowpass, chefer_relevance,
                    cls_attention_map, gae_attention, last_window, necc, resolve_last_k, rollout_factor,
                    stability_ratio, stability_votes, tokentm_ffn_update, tokentm_mhsa_update, tokentm_relevance,
                    transformation_weight)
from . import maps  # noqa: F401 - registers T0–T5 and the related maps, in that order
from .cache import compute_targets, target_cache, target_caches, target_cache_path

__all__ = ["TargetFn", "TargetInfo", "register_target", "target_info", "taxonomy_table", "cls_attention_map",
    "list_targets", "get_target", "compute_targets", "target_cache", "target_caches", "target_cache_path",
    "gae_attention", "chefer_relevance", "rollout_factor", "attention_rollout", "necc", "transformation_weight",
    "tokentm_mhsa_update", "tokentm_ffn_update", "tokentm_relevance", "channel_lowpass", "stability_votes",
    "stability_ratio", "last_window", "resolve_last_k", "LAST_STATISTIC", "LAST_VOTES_K", "DEFAULT_RANDOM_SEED"]
