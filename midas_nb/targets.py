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
rollout    attention rollout over blocks ``1..L``
tokentm    TokenTM contribution map over all blocks
last_votes LaSt-ViT stability votes on the output of block ``L``
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

import json
import math
import os
from pathlib import Path
from typing import Any, Callable, Literal, Sequence

import torch
from torch import Tensor, nn

from .capture import CaptureResult, capture

__all__ = [
    "TargetFn",
    "register_target",
    "list_targets",
    "get_target",
    "compute_targets",
    "target_cache",
    "target_cache_path",
    "gae_attention",
    "chefer_relevance",
    "rollout_factor",
    "attention_rollout",
    "necc",
    "transformation_weight",
    "tokentm_mhsa_update",
    "tokentm_ffn_update",
    "channel_lowpass",
    "stability_votes",
    "DEFAULT_RANDOM_SEED",
]

TargetFn = Callable[[CaptureResult, int, Tensor], Tensor]

#: seed of the ``random`` target when neither the call nor ``capture.extras["seed"]`` gives one
DEFAULT_RANDOM_SEED = 0

_REGISTRY: dict[str, TargetFn] = {}


def register_target(name: str) -> Callable[[TargetFn], TargetFn]:
    """Decorator registering a target function under ``name`` (like timm's ``register_model``).

    Raises:
        ValueError: if ``name`` is already registered.
    """
    def deco(fn: TargetFn) -> TargetFn:
        if name in _REGISTRY:
            raise ValueError(f"target {name!r} is already registered")
        _REGISTRY[name] = fn
        fn.target_id = name  # type: ignore[attr-defined]
        return fn
    return deco


def list_targets() -> list[str]:
    """Ids of the registered targets, in registration order (``T0`` … ``T5``, ``rollout``, …)."""
    return list(_REGISTRY)


def get_target(name: str) -> TargetFn:
    """The target function registered under ``name``.

    Raises:
        ValueError: for an unknown id (the message lists the known ones).
    """
    if name not in _REGISTRY:
        raise ValueError(f"unknown target {name!r}; expected one of {list_targets()}")
    return _REGISTRY[name]


# ----------------------------------------------------------------------------- helpers

def _block(capture: CaptureResult, depth: int) -> int:
    """0-based block index of the 1-based depth ``L``; checks ``1 ≤ L ≤ capture.depth``."""
    if not (1 <= int(depth) <= capture.depth):
        raise ValueError(f"depth L must be in 1..{capture.depth} (1-based block), got {depth!r}")
    return int(depth) - 1


def _check_class(capture: CaptureResult, class_index: Tensor) -> None:
    """Gradient targets read ``∂y_c/∂·`` of the capture: its class must be ``class_index``."""
    c = torch.as_tensor(class_index, device=capture.class_index.device).long().reshape(-1)
    if c.shape != capture.class_index.shape or not torch.equal(c, capture.class_index):
        raise ValueError("class_index differs from the class whose logit the capture differentiated "
                         f"(capture.class_index={capture.class_index.tolist()}, got {c.tolist()}); "
                         "capture again with this class_index")


def _cls_patches(capture: CaptureResult, m: Tensor) -> Tensor:
    """CLS row, patch columns: ``[B,T,T] → [B,N]`` (float32)."""
    return m[:, 0, capture.num_prefix_tokens:].float()


def _eye_like(m: Tensor) -> Tensor:
    """Identity ``[T,T]`` broadcastable against ``m [B,T,T]``."""
    return torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)


def _basis_row(batch: int, tokens: int, row: int, device: torch.device) -> Tensor:
    """Unit row vectors ``e_row`` as a batch ``[B,1,T]`` float32."""
    v = torch.zeros(batch, 1, tokens, dtype=torch.float32, device=device)
    v[:, 0, row] = 1.0
    return v


# --------------------------------------------------------------------- rule functions

def gae_attention(attn: Tensor, attn_grad: Tensor) -> Tensor:
    """Gradient-weighted head mean of Chefer et al. (2021, eq. 5): ``Ā = E_h[(∇A ⊙ A)⁺]``.

    The positive part is taken per head, before the mean over heads (as in the paper and its
    code). Also used for T2 with ``∇A = −∂ℓ/∂A``.

    Args:
        attn: ``[B,H,T,T]`` attention probabilities ``A``.
        attn_grad: ``[B,H,T,T]`` gradient ``∇A`` of the explained scalar w.r.t. ``A``.

    Returns:
        ``[B,T,T]`` float32.
    """
    if attn.shape != attn_grad.shape or attn.dim() != 4:
        raise ValueError(f"attn and attn_grad must both be [B,H,T,T], got {tuple(attn.shape)} "
                         f"and {tuple(attn_grad.shape)}")
    return (attn_grad.float() * attn.float()).clamp_min(0).mean(1)


def chefer_relevance(
    attn: Sequence[Tensor], attn_grad: Sequence[Tensor], *, row: int | None = None
) -> Tensor:
    """Chefer et al. (2021, https://arxiv.org/abs/2103.15679, eqs. 5–6) relevance ``R``.

    ``R⁰ = I``; for every block ``b = 1, 2, …`` in forward order:
    ``R ← R + Ā_b · R`` with ``Ā_b = E_h[(∇A_b ⊙ A_b)⁺]`` (:func:`gae_attention`). Hence
    ``R = (I + Ā_n) ⋯ (I + Ā_1)``.

    Args:
        attn: per block ``[B,H,T,T]`` attention probabilities, forward order.
        attn_grad: per block ``[B,H,T,T]`` ``∂y_c/∂A``.
        row: when given, return only row ``row`` of ``R`` (``[B,T]``), computed as a row vector
            times the product (``O(T²)`` per block instead of ``O(T³)``; same value).

    Returns:
        ``[B,T,T]`` (or ``[B,T]`` with ``row``) float32.
    """
    if len(attn) != len(attn_grad) or len(attn) == 0:
        raise ValueError(f"need one attn_grad per attn and at least one block, got {len(attn)} "
                         f"and {len(attn_grad)}")
    if row is None:
        a0 = attn[0]
        r = _eye_like(a0.float()).expand(a0.shape[0], -1, -1)
        for a, g in zip(attn, attn_grad):
            r = r + gae_attention(a, g) @ r
        return r
    # row · (I + Ā_n) ⋯ (I + Ā_1): walk the blocks backwards
    v = _basis_row(attn[0].shape[0], attn[0].shape[-1], row, attn[0].device)
    for a, g in zip(reversed(attn), reversed(attn_grad)):
        v = v + v @ gae_attention(a, g)
    return v[:, 0]


def rollout_factor(attn: Tensor) -> Tensor:
    """One rollout factor (Abnar & Zuidema, 2020): ``Â = rownorm(E_h A + I) = ½(E_h A + I)``.

    Args:
        attn: ``[B,H,T,T]`` attention probabilities (rows sum to 1).

    Returns:
        ``[B,T,T]`` float32, rows summing to 1.
    """
    if attn.dim() != 4:
        raise ValueError(f"attn must be [B,H,T,T], got {tuple(attn.shape)}")
    a = attn.float().mean(1) + _eye_like(attn.float())
    return a / a.sum(-1, keepdim=True)


def attention_rollout(attn: Sequence[Tensor], *, row: int | None = None) -> Tensor:
    """Attention rollout (Abnar & Zuidema, 2020, https://arxiv.org/abs/2005.00928, §3).

    ``R = Â_n ⋯ Â_2 · Â_1`` for the given blocks in forward order (``R ← Â_b · R`` going up),
    ``Â_b`` from :func:`rollout_factor`. Row ``i`` of ``R`` is how much each input token
    flowed into token ``i`` at the output of the last given block.

    Args:
        attn: per block ``[B,H,T,T]``, forward order (at least one).
        row: when given, return only row ``row`` (``[B,T]``), computed as a row vector.

    Returns:
        ``[B,T,T]`` (or ``[B,T]``) float32.
    """
    if len(attn) == 0:
        raise ValueError("attention_rollout needs at least one block")
    if row is None:
        r = rollout_factor(attn[0])
        for a in attn[1:]:
            r = rollout_factor(a) @ r
        return r
    v = _basis_row(attn[0].shape[0], attn[0].shape[-1], row, attn[0].device)
    for a in reversed(attn):
        v = v @ rollout_factor(a)
    return v[:, 0]


def necc(e: Tensor, e_tilde: Tensor, eps: float = 1e-12) -> Tensor:
    """Normalised exponential cosine correlation of TokenTM (Wu et al., 2024).

    ``NECC(i) = exp(cos(E_i, Ẽ_i)) / Σ_t exp(cos(E_t, Ẽ_t))``: a softmax over the tokens of
    each image of the cosine between a token before (``E``) and after (``Ẽ``) a transformation.

    Args:
        e: ``[B,T,D]`` tokens before the transformation.
        e_tilde: ``[B,T,D]`` tokens after it.

    Returns:
        ``[B,T]`` float32, each row summing to 1.
    """
    if e.shape != e_tilde.shape or e.dim() != 3:
        raise ValueError(f"e and e_tilde must both be [B,T,D], got {tuple(e.shape)} and {tuple(e_tilde.shape)}")
    cos = torch.nn.functional.cosine_similarity(e.float(), e_tilde.float(), dim=-1, eps=eps)
    return cos.softmax(-1)


def transformation_weight(e: Tensor, e_tilde: Tensor, eps: float = 1e-12) -> Tensor:
    """Diagonal of TokenTM's transformation weight ``W = diag(‖Ẽ_i‖/‖E_i‖ · NECC(i))``.

    Args:
        e: ``[B,T,D]`` tokens before the transformation.
        e_tilde: ``[B,T,D]`` tokens after it.

    Returns:
        ``[B,T]`` float32 ``w`` with ``W = diag(w)``.
    """
    ratio = e_tilde.float().norm(dim=-1) / e.float().norm(dim=-1).clamp_min(eps)
    return ratio * necc(e, e_tilde, eps)


def tokentm_mhsa_update(attn: Tensor, attn_grad: Tensor, w: Tensor) -> Tensor:
    """TokenTM's MHSA update ``U = I + E_h[(∂y_c/∂A)⁺ ⊙ A] · diag(w)``.

    With ``w = 1`` this is Chefer's attention rule ``I + E_h[(∂y_c/∂A)⁺ ⊙ A]``.

    Args:
        attn: ``[B,H,T,T]`` attention probabilities.
        attn_grad: ``[B,H,T,T]`` ``∂y_c/∂A``.
        w: ``[B,T]`` diagonal of ``W`` (:func:`transformation_weight` of the MHSA module).

    Returns:
        ``[B,T,T]`` float32.
    """
    if attn.shape != attn_grad.shape or attn.dim() != 4 or w.shape != (attn.shape[0], attn.shape[-1]):
        raise ValueError(f"expected attn, attn_grad [B,H,T,T] and w [B,T], got {tuple(attn.shape)}, "
                         f"{tuple(attn_grad.shape)}, {tuple(w.shape)}")
    a_bar = (attn_grad.float().clamp_min(0) * attn.float()).mean(1)
    # M · diag(w) scales column t of M by w_t
    return _eye_like(a_bar) + a_bar * w.float()[:, None, :]


def tokentm_ffn_update(w: Tensor) -> Tensor:
    """TokenTM's FFN update ``U = I + diag(w)``: ``[B,T] → [B,T,T]`` float32."""
    if w.dim() != 2:
        raise ValueError(f"w must be [B,T], got {tuple(w.shape)}")
    return torch.diag_embed(1.0 + w.float())


def channel_lowpass(h: Tensor, sigma: float | None = None) -> Tensor:
    """Low-pass each token's feature vector along the channel axis (LaSt-ViT).

    ``lowpass(h) = irfft(rfft(h, dim=-1) · g, n=D)`` with the Gaussian window
    ``g_f = exp(−f² / (2σ²))`` over the rfft frequency index ``f = 0 … ⌊D/2⌋`` (``f = 0`` is the
    channel mean, kept unchanged), ``σ = √D`` by default. This is the real-input form of the
    official code's window centred on the zero frequency of the ``fftshift``-ed spectrum.

    Args:
        h: ``[…,D]`` features.
        sigma: window width in frequency bins; ``None`` means ``√D``.

    Returns:
        ``[…,D]`` float32.
    """
    d = h.shape[-1]
    sigma = math.sqrt(d) if sigma is None else float(sigma)
    if sigma <= 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    f = torch.arange(d // 2 + 1, device=h.device, dtype=torch.float32)
    window = torch.exp(-f.square() / (2.0 * sigma ** 2))
    return torch.fft.irfft(torch.fft.rfft(h.float(), dim=-1) * window, n=d, dim=-1)


def stability_votes(h: Tensor, num_votes: int | None = None, sigma: float | None = None) -> Tensor:
    """LaSt-ViT stability votes: each channel votes for its ``K`` most stable tokens.

    ``stability_{j,d} = −|h_{j,d} − lowpass(h_j)_d|`` (closeness to the channel-low-passed copy,
    :func:`channel_lowpass`); channel ``d`` votes for the ``K`` tokens of highest stability;
    ``score_j`` = number of votes token ``j`` receives, so every image's scores sum to ``K·D``.
    (The official code ranks ``h / |lowpass(h) − h|`` and keeps the top-1 token per channel;
    MIDAS uses the closeness itself and ``K ≈ N/2`` votes, DESIGN.md §4.)

    Args:
        h: ``[B,N,D]`` patch tokens.
        num_votes: ``K`` tokens per channel, ``1 ≤ K ≤ N``; ``None`` means ``N // 2`` (at least 1).
        sigma: see :func:`channel_lowpass`.

    Returns:
        ``[B,N]`` float32 vote counts in ``0 … D``.
    """
    if h.dim() != 3:
        raise ValueError(f"h must be [B,N,D], got {tuple(h.shape)}")
    B, N, D = h.shape
    k = max(1, N // 2) if num_votes is None else int(num_votes)
    if not (1 <= k <= N):
        raise ValueError(f"num_votes K must be in 1..{N} (patch tokens), got {num_votes!r}")
    stability = -(h.float() - channel_lowpass(h, sigma)).abs()            # B x N x D
    winners = stability.topk(k, dim=1).indices                              # B x K x D
    votes = torch.zeros(B, N, dtype=torch.float32, device=h.device)
    return votes.scatter_add_(1, winners.reshape(B, -1), torch.ones(B, k * D, device=h.device))


# ----------------------------------------------------------------------------- targets

@register_target("T0")
def cls_attention(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T0, CLS attention at block ``L``: ``E_h A_h[cls, j]`` → ``[B,N]``.

    The attention the CLS token pays to patch ``j``, mean over heads; also the training-free
    reference scorer (EViT's token attentiveness, Liang et al., 2022,
    https://arxiv.org/abs/2202.07800). Source: DESIGN.md §4.
    """
    a = capture.attn[_block(capture, depth)]
    return a[:, :, 0, capture.num_prefix_tokens:].float().mean(1)


@register_target("T1")
def attention_magnitude(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T1, attention mass received at block ``L``: ``E_h Σ_i A_h[i, j]`` → ``[B,N]``.

    Sum over every query token ``i`` (prefix tokens included). Source: DESIGN.md §4.
    """
    a = capture.attn[_block(capture, depth)]
    return a.float().sum(2).mean(1)[:, capture.num_prefix_tokens:]


@register_target("T2")
def loss_gradient_attention(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T2, loss-gradient-modulated attention: ``E_h [A_h ⊙ (−∂ℓ/∂A_h)]⁺[cls, j]`` → ``[B,N]``.

    ``ℓ`` is the cross-entropy on ``capture.labels`` (``reduction="sum"``, so per image);
    positive part per head, then the head mean (as Chefer's eq. 5, with the descent direction
    ``−∂ℓ/∂A``). Source: DESIGN.md §4.

    Raises:
        ValueError: if the capture holds no loss gradient for block ``L`` (capture with labels
            and ``loss_blocks`` including ``L-1``).
    """
    b = _block(capture, depth)
    g = capture.attn_grad_loss[b]
    if g is None:
        raise ValueError(f"T2 needs ∂ℓ/∂A of block {depth}: capture with labels and loss_blocks=[{b}]")
    P = capture.num_prefix_tokens
    a = capture.attn[b]
    return (a[:, :, 0, P:].float() * -g[:, :, 0, P:].float()).clamp_min(0).mean(1)


@register_target("T3")
def chefer_gae(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T3, Chefer's attention-gradient relevance (GAE), ``R[cls, j]`` → ``[B,N]``.

    ``R = I``; for every block ``b = 1 … n`` of the model (``n`` = model depth, **not** ``L``:
    GAE explains the output, so ``depth`` is ignored beyond validation):
    ``R ← R + E_h[(∂y_c/∂A_b) ⊙ A_b]⁺ · R``. Source: Chefer et al., 2021,
    https://arxiv.org/abs/2103.15679, eqs. 5–6; :func:`chefer_relevance`.
    """
    _block(capture, depth)
    _check_class(capture, class_index)
    r = chefer_relevance(capture.attn, capture.attn_grad, row=0)
    return r[:, capture.num_prefix_tokens:]


@register_target("T4")
def attention_weighted_gradient(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T4, hidden-state attention-weighted gradient: ``E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂`` → ``[B,N]``.

    ``A`` and ``h`` of block ``L`` (``h`` its output). Source: DESIGN.md §4.
    """
    b = _block(capture, depth)
    _check_class(capture, class_index)
    P = capture.num_prefix_tokens
    grad_norm = capture.hidden_grad[b][:, P:].float().norm(dim=-1)
    return capture.attn[b][:, :, 0, P:].float().mean(1) * grad_norm


@register_target("T5")
def hidden_input_x_gradient(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T5, input × gradient of the block-``L`` output: ``Σ_d h_{j,d} · ∂y_c/∂h_{j,d}`` → ``[B,N]``.

    Signed. Equals captum's ``LayerGradientXActivation`` on block ``L`` summed over channels.
    Source: DESIGN.md §4; Shrikumar et al., 2016, https://arxiv.org/abs/1605.01713.

    NOTE: in a pre-norm ViT with CLS pooling, patch token ``j`` after block ``depth−1`` reaches
    the logit only through the last block's ``norm1``, which is scale invariant, so
    ``h_j·∂y_c/∂h_j = d/dα y_c(LN((1+α)h_j)) ≈ 0`` (LayerNorm ``eps`` only): T5 is degenerate at
    ``L = depth−1``, and T4/T5 vanish at ``L = depth`` (no gradient reaches patch tokens).

    """
    b = _block(capture, depth)
    _check_class(capture, class_index)
    P = capture.num_prefix_tokens
    return (capture.hidden[b][:, P:].float() * capture.hidden_grad[b][:, P:].float()).sum(-1)


@register_target("rollout")
def rollout(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """Attention rollout up to block ``L``, CLS row: ``(Â_L ⋯ Â_1)[cls, j]`` → ``[B,N]``.

    ``Â_b = rownorm(E_h A_b + I)``; the product runs over blocks ``1 … L`` (what reached the
    tokens at the output of block ``L``, where the scorer reads them), unlike T3 and TokenTM,
    which explain the model output and run over all blocks. Source: Abnar & Zuidema, 2020,
    https://arxiv.org/abs/2005.00928; :func:`attention_rollout`.
    """
    b = _block(capture, depth)
    r = attention_rollout(capture.attn[: b + 1], row=0)
    return r[:, capture.num_prefix_tokens:]


@register_target("tokentm")
def tokentm(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """TokenTM contribution map over all blocks, CLS row → ``[B,N]``.

    Per block ``b`` (MHSA then FFN): ``W = diag(‖Ẽ_i‖/‖E_i‖ · NECC(i))``
    (:func:`transformation_weight`) with ``E``/``Ẽ`` the input (after ``norm1``) / output of the
    MHSA module, resp. the input (after ``norm2``) / output of the FFN;
    ``U_mhsa = I + E_h[(∂y_c/∂A)⁺ ⊙ A]·W`` (:func:`tokentm_mhsa_update`),
    ``U_ffn = I + W`` (:func:`tokentm_ffn_update`). ``C⁰ = diag(‖E⁰_i‖)`` with ``E⁰`` the input of
    block 1; ``Cˡ = Uˡ·Cˡ⁻¹`` over all updates; the map is ``C[cls, j]``. Like T3, it runs over
    every block of the model (it explains the output); ``depth`` is only validated.
    Source: Wu et al., CVPR 2024, https://arxiv.org/abs/2403.14552 (§3); DESIGN.md §4.
    """
    _block(capture, depth)
    _check_class(capture, class_index)
    B, T, _ = capture.hidden_in[0].shape
    v = _basis_row(B, T, 0, capture.hidden_in[0].device)
    # row vector e_clsᵀ · U_n^ffn U_n^mhsa ⋯ U_1^ffn U_1^mhsa, walked from the top block down
    for b in reversed(range(capture.depth)):
        w_ffn = transformation_weight(capture.mlp_in[b], capture.mlp_out[b])
        v = v * (1.0 + w_ffn[:, None, :])                      # v · (I + diag(w))
        w_attn = transformation_weight(capture.attn_in[b], capture.attn_out[b])
        v = v @ tokentm_mhsa_update(capture.attn[b], capture.attn_grad[b], w_attn)
    c0 = capture.hidden_in[0].float().norm(dim=-1)               # diag of C⁰, [B,T]
    return (v[:, 0] * c0)[:, capture.num_prefix_tokens:]


@register_target("last_votes")
def last_votes(capture: CaptureResult, depth: int, class_index: Tensor, *,
               num_votes: int | None = None, sigma: float | None = None) -> Tensor:
    """LaSt-ViT stability votes on the patch tokens of block ``L``'s output → ``[B,N]``.

    :func:`stability_votes` with ``K = num_votes`` (default ``N // 2``) and ``σ = √D`` by
    default; each image's scores sum to ``K·D``. Source: Shi, Yu, Yang, LaSt-ViT,
    https://arxiv.org/abs/2602.22394; DESIGN.md §4.
    """
    h = capture.patch(capture.hidden[_block(capture, depth)])
    return stability_votes(h, num_votes=num_votes, sigma=sigma)


def _image_seed(seed: int, index: int) -> int:
    # splitmix-style mixing so that (seed, index) pairs give unrelated streams
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(index) * 0xBF58476D1CE4E5B9 + 1) % (1 << 64)
    x ^= x >> 31
    return x % (1 << 63)


@register_target("random")
def random_target(capture: CaptureResult, depth: int, class_index: Tensor, *,
                  seed: int | None = None) -> Tensor:
    """Seeded uniform values in ``[0, 1)`` (the random-ranking lower bound) → ``[B,N]``.

    Image ``i`` draws from its own CPU generator seeded from ``(seed, index_i)``: ``seed`` is the
    keyword, else ``capture.extras["seed"]``, else :data:`DEFAULT_RANDOM_SEED`; ``index_i`` is
    ``capture.extras["indices"][i]`` (the dataset index, set by :func:`compute_targets` /
    :func:`target_cache`) when present, else the position ``i`` in the batch — then the values
    depend on the batch layout. The same (seed, index) gives the same values on any device and
    in any batch. Source: DESIGN.md §4.
    """
    _block(capture, depth)
    seed = capture.extras.get("seed", DEFAULT_RANDOM_SEED) if seed is None else seed
    seed = DEFAULT_RANDOM_SEED if seed is None else int(seed)
    B = capture.hidden[0].shape[0]
    N = capture.hidden[0].shape[1] - capture.num_prefix_tokens
    indices = capture.extras.get("indices")
    indices = list(range(B)) if indices is None else [int(i) for i in torch.as_tensor(indices).reshape(-1)]
    if len(indices) != B:
        raise ValueError(f"capture.extras['indices'] must hold one index per image ({B}), got {len(indices)}")
    g = torch.Generator()
    rows = [torch.rand(N, generator=g.manual_seed(_image_seed(seed, i))) for i in indices]
    return torch.stack(rows).to(capture.hidden[0].device)


# ----------------------------------------------------------------- one-pass computation

def _check_ids(ids: Sequence[str]) -> list[str]:
    ids = list(ids)
    unknown = [i for i in ids if i not in _REGISTRY]
    if unknown or not ids:
        raise ValueError(f"unknown or no target ids {unknown or ids}; expected some of {list_targets()}")
    return list(dict.fromkeys(ids))


def _capture_and_compute(
    backbone: nn.Module, images: Tensor | None, ids: list[str], depth: int,
    class_index: Tensor | None, labels: Tensor | None, tokens: Tensor | None,
    indices: Tensor | None, seed: int | None,
) -> dict[str, Tensor]:
    n_blocks = len(backbone.blocks)
    if not (1 <= int(depth) <= n_blocks):
        raise ValueError(f"depth L must be in 1..{n_blocks} (1-based block of the backbone), got {depth!r}")
    want_loss = "T2" in ids
    if want_loss:
        if labels is None:
            raise ValueError("T2 needs labels [B] (ground truth) for the cross-entropy loss")
        if bool((torch.as_tensor(labels) < 0).any()):
            raise ValueError("T2 needs ground-truth labels ≥ 0; this split has unlabelled images (-1)")
    cap = capture(backbone, images, class_index, labels if want_loss else None, tokens=tokens,
                  loss_blocks=[int(depth) - 1] if want_loss else None)
    if indices is not None:
        cap.extras["indices"] = torch.as_tensor(indices).reshape(-1).cpu()
    if seed is not None:
        cap.extras["seed"] = int(seed)
    return {i: _REGISTRY[i](cap, depth, cap.class_index) for i in ids}


def compute_targets(
    backbone: nn.Module,
    images: Tensor | None,
    ids: Sequence[str],
    depth: int,
    class_index: Tensor,
    labels: Tensor | None = None,
    *,
    tokens: Tensor | None = None,
    indices: Tensor | None = None,
    seed: int | None = None,
) -> dict[str, Tensor]:
    """Targets ``ids`` of a batch from **one** forward and its backward passes.

    One :func:`midas_nb.capture.capture` call: the logit gradient ``∂y_c/∂·`` and, only when
    ``"T2"`` is requested, the loss gradient ``∂ℓ/∂·`` come from two ``autograd.grad`` calls on
    the same graph; the loss backward stops at block ``L`` (``loss_blocks=[L-1]``).

    Args:
        backbone: timm ViT (eval mode is used; fused attention is switched off in place).
        images: ``[B,3,H,W]`` normalised images (or ``None`` with ``tokens``).
        ids: target ids from :func:`list_targets`.
        depth: 1-based depth ``L``, ``1 ≤ L ≤ len(backbone.blocks)``.
        class_index: ``[B]`` long, the class ``c`` (ground truth on the train split, the
            prediction otherwise; DESIGN.md §3). Required, no default rule here.
        labels: ``[B]`` long ground-truth labels; required for ``"T2"``, unused otherwise.
        tokens: ``[B,T,D]`` embedded tokens instead of ``images`` (see ``capture``).
        indices: ``[B]`` dataset indices of the images (seed the ``random`` target per image).
        seed: seed of the ``random`` target (default :data:`DEFAULT_RANDOM_SEED`).

    Returns:
        ``{id: [B,N] float32}`` on the backbone's device, patch tokens only, row-major.

    Raises:
        ValueError: unknown ids, ``depth`` out of range, ``class_index`` missing, or ``"T2"``
            without labels.
    """
    ids = _check_ids(ids)
    if class_index is None:
        raise ValueError("class_index [B] is required (ground truth on the train split, prediction otherwise)")
    return _capture_and_compute(backbone, images, ids, depth, class_index, labels, tokens, indices, seed)


# ------------------------------------------------------------------------ disk cache

def _cache_key(key: dict, depth: int, class_rule: str, backbone: nn.Module, seed: int) -> dict:
    from .vit import grid_size, num_prefix_tokens
    full = dict(key)
    full.update(depth=int(depth), class_rule=class_rule, grid_size=list(grid_size(backbone)),
                num_prefix_tokens=num_prefix_tokens(backbone), random_seed=int(seed), format=1)
    return full


def target_cache_path(full_key: dict, cache_dir: str | os.PathLike | None = None) -> Path:
    """``<cache_dir>/targets/targets-<sha256(key JSON)[:16]>.safetensors`` for a full cache key."""
    from .identity import hash_json
    if cache_dir is None:
        from .config import cache_dir as default_cache_dir
        cache_dir = default_cache_dir()
    return Path(cache_dir) / "targets" / f"targets-{hash_json(full_key)}.safetensors"


def _maps_digest(maps: dict[str, Tensor]) -> str:
    """SHA-256 over the maps (sorted ids; dtype, shape, bytes): the target cache's integrity record."""
    from .identity import hash_json, tensor_digest
    return hash_json({k: tensor_digest(maps[k], None) for k in sorted(maps)}, 64)


def _read_verified_maps(path: Path, key_text: str, load_bytes) -> dict[str, Tensor]:
    """The maps of a target cache file after checking its key and its digest.

    Raises:
        CacheIntegrityError: unreadable (truncated) file, another key, or a digest mismatch.
    """
    from .identity import CacheIntegrityError
    data = path.read_bytes()
    try:
        maps = load_bytes(data)
        header_len = int.from_bytes(data[:8], "little")
        meta = json.loads(data[8:8 + header_len]).get("__metadata__", {}) or {}
    except Exception as e:  # noqa: BLE001 - safetensors raises its own error types
        raise CacheIntegrityError(f"unreadable safetensors file ({type(e).__name__}: {e})") from None
    if meta.get("key") != key_text:
        raise CacheIntegrityError(f"holds key {meta.get('key')!r}, expected {key_text!r}")
    if meta.get("sha256") != _maps_digest(maps):
        raise CacheIntegrityError("the maps' SHA-256 differs from the one recorded when the file was written")
    return maps


def _collate():
    try:
        from .data import collate_samples
    except ImportError:  # the package may expose it only from its sample module
        from .data.sample import collate_samples
    return collate_samples


def target_cache(
    backbone: nn.Module,
    dataset: torch.utils.data.Dataset,
    *,
    ids: Sequence[str],
    depth: int,
    class_rule: Literal["label", "prediction"],
    key: dict[str, Any],
    cache_dir: str | os.PathLike | None = None,
    batch_size: int = 32,
    device: torch.device | str = "cpu",
    progress: bool = True,
    seed: int | None = None,
) -> dict[str, Tensor]:
    """Target maps of a whole dataset split, computed once and stored on disk.

    The file is one safetensors file per cache key: ``key`` (the caller's dataset name, split,
    backbone checkpoint id, …) plus the dataset's content identity
    (:attr:`midas_nb.identity.DatasetIdentity.model_inputs`: images, labels, transform — target
    maps do not read the part keypoints), the backbone's weights digest, ``depth``,
    ``class_rule``, the backbone's patch grid and prefix count and the ``random`` seed, hashed
    into the file name (:func:`target_cache_path`); the key JSON is stored beside it (``.json``)
    and in the file's metadata with the SHA-256 of the maps. The file holds one
    ``[len(dataset), N]`` tensor per target id, in dataset order. An existing file is loaded
    after its key and digest are checked (a truncated or corrupt file is reported with
    :class:`midas_nb.identity.CacheIntegrityWarning` and recomputed); ids missing from it are
    computed (one pass over the dataset for all missing ids together) and added to the file
    (atomic rewrite) — stored maps are never recomputed.

    Args:
        backbone: timm ViT; moved to ``device``.
        dataset: ``Dataset`` of :class:`midas_nb.data.Sample` (batched with
            ``collate_samples``); iterated in order, without shuffling.
        ids: target ids from :func:`list_targets`.
        depth: 1-based depth ``L``.
        class_rule: ``"label"`` — ``c`` is the ground-truth label (train split);
            ``"prediction"`` — ``c`` is the backbone's argmax, from the same forward.
        key: JSON-serialisable description of dataset, split and backbone checkpoint.
        cache_dir: root of the cache (default :func:`midas_nb.config.cache_dir`).
        batch_size: images per forward.
        device: where the backbone runs (``"cpu"``, ``"cuda"``…). Maps are stored on CPU.
        progress: show a tqdm bar while filling.
        seed: seed of the ``random`` target (default :data:`DEFAULT_RANDOM_SEED`); the image's
            dataset index (``Sample.index``) seeds it per image.

    Returns:
        ``{id: [len(dataset), N] float32}`` on CPU.

    Raises:
        ValueError: bad ``class_rule``, unknown ids, missing labels for ``"label"``/``"T2"``.
    """
    from safetensors.torch import load as load_bytes
    from safetensors.torch import save as save_bytes
    from tqdm.auto import tqdm

    from .identity import (CacheIntegrityError, atomic_write_bytes, atomic_write_text, dataset_identity,
                           report_corrupt, state_dict_digest)

    ids = _check_ids(ids)
    if class_rule not in ("label", "prediction"):
        raise ValueError(f"class_rule must be 'label' or 'prediction', got {class_rule!r}")
    seed = DEFAULT_RANDOM_SEED if seed is None else int(seed)
    full_key = _cache_key(dict(key, data=dataset_identity(dataset).model_inputs,
                               weights=state_dict_digest(backbone)), depth, class_rule, backbone, seed)
    path = target_cache_path(full_key, cache_dir)
    key_text = json.dumps(full_key, sort_keys=True, default=str)

    stored: dict[str, Tensor] = {}
    if path.exists():
        try:
            stored = _read_verified_maps(path, key_text, load_bytes)
            for name, t in stored.items():
                if t.shape[0] != len(dataset):
                    raise CacheIntegrityError(f"{name} has {t.shape[0]} rows, the dataset {len(dataset)} images")
        except (CacheIntegrityError, OSError, ValueError, RuntimeError) as e:
            report_corrupt(path, str(e), "target cache")
            stored = {}
    missing = [i for i in ids if i not in stored]
    if missing:
        collate = _collate()
        loader = torch.utils.data.DataLoader(dataset, batch_size=batch_size, shuffle=False,
                                             collate_fn=collate)
        backbone.to(device)
        new: dict[str, list[Tensor]] = {i: [] for i in missing}
        for batch in tqdm(loader, desc=f"targets L={depth}", disable=not progress):
            images = batch.images.to(device)
            labels = batch.labels.to(device)
            if class_rule == "label":
                if bool((labels < 0).any()):
                    raise ValueError("class_rule='label' needs ground-truth labels ≥ 0; "
                                     "use class_rule='prediction' on unlabelled splits")
                class_index = labels
            else:
                class_index = None          # capture() takes the argmax of the same forward
            maps = _capture_and_compute(backbone, images, missing, depth, class_index, labels,
                                        None, batch.indices, seed)
            for i in missing:
                new[i].append(maps[i].detach().float().cpu())
        stored.update({i: torch.cat(v).contiguous() for i, v in new.items()})
        atomic_write_bytes(path, save_bytes(stored, metadata={"key": key_text, "sha256": _maps_digest(stored)}))
        atomic_write_text(path.with_suffix(".json"),
                          json.dumps(dict(full_key, ids=sorted(stored)), indent=2, sort_keys=True, default=str))
    return {i: stored[i] for i in ids}
