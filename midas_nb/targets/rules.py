"""The operators behind the targets (DESIGN.md §4): CLS attention, GAE / Chefer relevance, attention
rollout, TokenTM's updates, LaSt-ViT's channel low-pass and stability votes; and the helpers that
read a capture."""
from __future__ import annotations

from typing import Sequence

import torch
from torch import Tensor


def cls_attention_map(attn: Tensor, num_prefix: int) -> Tensor:
    """CLS attention to patch tokens, mean over heads: ``E_h A_h[cls, j]`` (target T0; the
    reference scorer :class:`midas_nb.scorers.ReferenceScorer`; EViT's token attentiveness,
    Liang et al., 2022, https://arxiv.org/abs/2202.07800).

    Args:
        attn: ``[B,H,T,T]`` attention probabilities of one block (rows: queries).
        num_prefix: ``P``; the CLS token is token 0, patch tokens are ``P..T-1``.

    Returns:
        ``[B,N]`` with ``N = T - P``.

    Raises:
        ValueError: ``attn`` is not ``[B,H,T,T]``.
    """
    if attn.dim() != 4 or attn.shape[-1] != attn.shape[-2]:
        raise ValueError(f"attn must be [B,H,T,T], got {tuple(attn.shape)}")
    return attn[:, :, 0, num_prefix:].mean(dim=1)


def _eye_like(m: Tensor) -> Tensor:
    """Identity ``[T,T]`` broadcastable against ``m [B,T,T]``."""
    return torch.eye(m.shape[-1], dtype=m.dtype, device=m.device)


def _basis_row(batch: int, tokens: int, row: int, device: torch.device) -> Tensor:
    """Unit row vectors ``e_row`` as a batch ``[B,1,T]`` float32."""
    v = torch.zeros(batch, 1, tokens, dtype=torch.float32, device=device)
    v[:, 0, row] = 1.0
    return v


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


def chefer_relevance(attn: Sequence[Tensor], attn_grad: Sequence[Tensor], *, row: int | None = None) -> Tensor:
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
    """Normalised exponential cosine correlation of TokenTM (Wu et al., CVPR 2024,
    https://arxiv.org/abs/2403.14552, §3.2; DESIGN.md §4).

    ``NECC(i) = exp(cos(E_i, Ẽ_i)) / Σ_t exp(cos(E_t, Ẽ_t))``: a softmax over the tokens of
    each image of the cosine between a token's input ``E_i`` and its own transform ``Ẽ_i``.

    Args:
        e: ``[B,T,D]`` tokens entering the layer (the residual stream).
        e_tilde: ``[B,T,D]`` each token's own transform by the layer.

    Returns:
        ``[B,T]`` float32, each row summing to 1.

    Raises:
        ValueError: ``e`` and ``e_tilde`` are not both ``[B,T,D]`` of one shape.
    """
    if e.shape != e_tilde.shape or e.dim() != 3:
        raise ValueError(f"e and e_tilde must both be [B,T,D], got {tuple(e.shape)} and {tuple(e_tilde.shape)}")
    cos = torch.nn.functional.cosine_similarity(e.float(), e_tilde.float(), dim=-1, eps=eps)
    return cos.softmax(-1)


def transformation_weight(e: Tensor, e_tilde: Tensor, eps: float = 1e-12) -> Tensor:
    """Diagonal of TokenTM's transformation weight ``W = diag(‖Ẽ_i‖/‖E_i‖ · NECC(i))``
    (Wu et al., CVPR 2024, https://arxiv.org/abs/2403.14552, §3.2; DESIGN.md §4): the length
    ratio of a token's transform to its input times the direction term :func:`necc`.

    Args:
        e: ``[B,T,D]`` tokens entering the layer (the residual stream).
        e_tilde: ``[B,T,D]`` each token's own transform by the layer.

    Returns:
        ``[B,T]`` float32 ``w`` with ``W = diag(w)``.

    Raises:
        ValueError: shapes as in :func:`necc`.
    """
    w = necc(e, e_tilde, eps)
    return e_tilde.float().norm(dim=-1) / e.float().norm(dim=-1).clamp_min(eps) * w


def tokentm_mhsa_update(attn: Tensor, attn_grad: Tensor, w: Tensor) -> Tensor:
    """TokenTM's MHSA update ``U = I + E_h[(∂p_c/∂A_h)⁺ ⊙ A_h] · diag(w)`` (Wu et al., CVPR
    2024, https://arxiv.org/abs/2403.14552, §3.3; DESIGN.md §4).

    The gradient is clamped at zero per head, multiplied by that head's attention and then
    averaged over heads; ``diag(w)`` scales column ``t`` (the attended token) by ``w_t``. With
    ``w = 1`` this is Chefer's attention rule ``I + E_h[(∇A ⊙ A)⁺]`` (``A ≥ 0``).

    Args:
        attn: ``[B,H,T,T]`` attention probabilities ``A``.
        attn_grad: ``[B,H,T,T]`` gradient of the explained scalar w.r.t. ``A`` (TokenTM: of the
            class probability ``p_c``).
        w: ``[B,T]`` diagonal of ``W`` (:func:`transformation_weight` of the MHSA layer).

    Returns:
        ``[B,T,T]`` float32.

    Raises:
        ValueError: shapes other than ``[B,H,T,T]``, ``[B,H,T,T]``, ``[B,T]``.
    """
    if attn.shape != attn_grad.shape or attn.dim() != 4 or w.shape != (attn.shape[0], attn.shape[-1]):
        raise ValueError(f"expected attn, attn_grad [B,H,T,T] and w [B,T], got {tuple(attn.shape)}, "
                         f"{tuple(attn_grad.shape)}, {tuple(w.shape)}")
    a_bar = (attn_grad.float().clamp_min(0) * attn.float()).mean(1)
    return _eye_like(a_bar) + a_bar * w.float()[:, None, :]


def tokentm_ffn_update(w: Tensor) -> Tensor:
    """TokenTM's FFN update ``U = I + diag(w)`` (Wu et al., CVPR 2024,
    https://arxiv.org/abs/2403.14552, §3.3; DESIGN.md §4): ``[B,T] → [B,T,T]`` float32.

    Raises:
        ValueError: ``w`` is not ``[B,T]``.
    """
    if w.dim() != 2:
        raise ValueError(f"w must be [B,T], got {tuple(w.shape)}")
    return torch.diag_embed(1.0 + w.float())


#: version of the LaSt-ViT statistic; part of every cache key that holds LaSt results (target maps,
#: LaSt fine-tunes), so a change of the statistic never reuses a result of the old one
LAST_STATISTIC = "official-ratio-v2"
#: ``K`` of the ``last_votes`` target when the call gives none: ``N // 2`` (see :func:`stability_votes`)
LAST_VOTES_K = "N//2"


def last_window(d: int, sigma: float | None = None, device: torch.device | None = None) -> Tensor:
    """LaSt-ViT's Gaussian window over the ``fftshift``-ed channel spectrum: ``[D]`` float32.

    Transcribes ``dense_vit.gaussian_kernel_1d(kernel_size, sigma)`` of the official code
    (github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``, class ``dense_vit``):
    ``g_i = exp(−½ (t_i/σ)²) / max g`` over ``t = arange(−D//2 + 1, D//2 + 1)`` (Python floor
    division, so ``−D//2 = ⌊−D/2⌋``), ``σ = √D`` by default (the official ``768 ** 0.5`` for
    ``D = 768``). For even ``D`` the peak ``t = 0`` sits at index ``D/2 − 1``, one bin below the
    zero frequency of the shifted spectrum (index ``D/2``): the window is off-centre by one bin,
    as in the official code, and is kept so.

    Raises:
        ValueError: ``d < 1`` or ``sigma ≤ 0``.
    """
    if int(d) < 1:
        raise ValueError(f"the channel count D must be ≥ 1, got {d}")
    sigma = int(d) ** 0.5 if sigma is None else float(sigma)
    if not sigma > 0:
        raise ValueError(f"sigma must be > 0, got {sigma}")
    kernel = torch.exp(-0.5 * (torch.arange(-int(d) // 2 + 1, int(d) // 2 + 1, device=device).float() / sigma) ** 2)
    return kernel / torch.max(kernel)


def tokentm_relevance(hidden_in: Sequence[Tensor], value_proj: Sequence[Tensor], hidden_mid: Sequence[Tensor],
        mlp_out: Sequence[Tensor], attn: Sequence[Tensor], attn_grad_prob: Sequence[Tensor], *, row: int = 0) -> Tensor:
    """TokenTM contribution ``C = U_n^ffn U_n^mhsa ⋯ U_1^ffn U_1^mhsa · C⁰``, row ``row``
    (Wu et al., CVPR 2024, https://arxiv.org/abs/2403.14552, §3; DESIGN.md §4).

    Per block ``b`` (forward order; MHSA, then FFN):

    - MHSA: ``E = hidden_in[b]`` (block input, residual stream, before ``norm1``),
      ``Ẽ = value_proj[b]`` (each token's ``attn.proj(v_j)``),
      ``U = I + E_h[(∂p_c/∂A)⁺ ⊙ A]·diag(w)`` (:func:`tokentm_mhsa_update`);
    - FFN: ``E = hidden_mid[b]`` (residual stream entering the FFN, before ``norm2``),
      ``Ẽ = mlp_out[b]``, ``U = I + diag(w)`` (:func:`tokentm_ffn_update`);

    ``w`` = :func:`transformation_weight` ``(E, Ẽ)``; ``C⁰ = diag(‖hidden_in[0]_i‖)``. Computed as
    a row vector times the product, walked from the top block down (``O(T²)`` per update).

    Args:
        hidden_in, value_proj, hidden_mid, mlp_out: per block ``[B,T,D]``
            (:class:`midas_nb.capture.CaptureResult` fields of those names).
        attn: per block ``[B,H,T,T]``.
        attn_grad_prob: per block ``[B,H,T,T]`` ``∂p_c/∂A``.
        row: the read-out token (the CLS token, 0).

    Returns:
        ``[B,T]`` float32, row ``row`` of ``C``.

    Raises:
        ValueError: lists of different lengths, empty, or holding ``None``.
    """
    lists = (hidden_in, value_proj, hidden_mid, mlp_out, attn, attn_grad_prob)
    if len({len(x) for x in lists}) != 1 or len(attn) == 0 or any(t is None for x in lists for t in x):
        raise ValueError("TokenTM needs, for every block, hidden_in, value_proj, hidden_mid, mlp_out, attn and "
                         f"∂p_c/∂A; got lengths {[len(x) for x in lists]} (capture with prob_grad=True, timm blocks)")
    B, T, _ = hidden_in[0].shape
    v = _basis_row(B, T, row, hidden_in[0].device)
    for b in reversed(range(len(attn))):
        v = v * (1.0 + transformation_weight(hidden_mid[b], mlp_out[b])[:, None, :])   # v · (I + diag(w))
        w_attn = transformation_weight(hidden_in[b], value_proj[b])
        v = v @ tokentm_mhsa_update(attn[b], attn_grad_prob[b], w_attn)
    return v[:, 0] * hidden_in[0].float().norm(dim=-1)                                 # · C⁰


def channel_lowpass(h: Tensor, sigma: float | None = None) -> Tensor:
    """Low-pass each token's feature vector along the channel axis (LaSt-ViT).

    ``lowpass(h) = Re ifft(ifftshift(fftshift(fft(h)) · g))`` along the last axis with the
    window ``g`` of :func:`last_window` — the official code's order of operations
    (github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``, class ``dense_vit``, ``forward``),
    real part taken (the window is not symmetric about the zero frequency for even ``D``, so
    the inverse transform has an imaginary part, which the official code drops).

    Args:
        h: ``[…,D]`` features (LayerNorm-ed tokens in LaSt-ViT).
        sigma: window width in frequency bins; ``None`` means ``√D``.

    Returns:
        ``[…,D]`` float32.
    """
    window = last_window(h.shape[-1], sigma, h.device)
    spectrum = torch.fft.fftshift(torch.fft.fft(h.float(), dim=-1), dim=-1) * window
    return torch.fft.ifft(torch.fft.ifftshift(spectrum, dim=-1), dim=-1).real


def stability_ratio(h: Tensor, sigma: float | None = None) -> Tensor:
    """LaSt-ViT's per-channel stability ``r = h / |lowpass(h) − h|`` (signed; larger = more stable).

    The official ``diff = x_detach / torch.abs(x - x_detach)`` (github.com/ChengShiest/LAST-ViT,
    ``cls_pretrain/conf.py``, class ``dense_vit``), :func:`channel_lowpass` for ``x``; no
    epsilon, as there: a value equal to its low-passed copy gives ``±inf`` (``nan`` for 0/0).

    Args:
        h: ``[B,N,D]`` patch tokens (prefix tokens removed), after the final LayerNorm.
        sigma: see :func:`channel_lowpass`.

    Returns:
        ``[B,N,D]`` float32.

    Raises:
        ValueError: ``h`` not 3-D.
    """
    if h.dim() != 3:
        raise ValueError(f"h must be [B,N,D] patch tokens, got {tuple(h.shape)}")
    h = h.float()
    return h / torch.abs(channel_lowpass(h, sigma) - h)


def resolve_last_k(k: int | None, n: int, default: int | None = None) -> int:
    """``K`` tokens per channel: ``k``, else ``default``, else ``N // 2`` (at least 1); checks ``1 ≤ K ≤ N``."""
    k = default if k is None else k
    k = max(1, n // 2) if k is None else int(k)
    if not 1 <= k <= n:
        raise ValueError(f"K (tokens selected per channel) must be in 1..{n} (patch tokens), got {k}")
    return k


def stability_votes(h: Tensor, num_votes: int | None = None, sigma: float | None = None) -> Tensor:
    """LaSt-ViT stability votes: each channel votes for its ``K`` most stable tokens.

    Channel ``d`` selects the ``K`` tokens of largest :func:`stability_ratio` ``r_{·,d}``
    (``torch.topk(r, K, dim=1, largest=True)``, the official selection of
    github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``, class ``dense_vit``, where
    ``K = 1``); ``score_j`` = number of channels that select token ``j``, so every image's scores
    sum to ``K·D``. Ties are broken as ``torch.topk`` breaks them.

    Args:
        h: ``[B,N,D]`` patch tokens after the final LayerNorm.
        num_votes: ``K`` tokens per channel, ``1 ≤ K ≤ N``; ``None`` means ``N // 2`` (at least 1).
        sigma: see :func:`channel_lowpass`.

    Returns:
        ``[B,N]`` float32 vote counts in ``0 … D``.

    Raises:
        ValueError: ``h`` not 3-D or ``K`` outside ``1..N``.
    """
    if h.dim() != 3:
        raise ValueError(f"h must be [B,N,D], got {tuple(h.shape)}")
    B, N, D = h.shape
    k = resolve_last_k(num_votes, N)
    winners = stability_ratio(h, sigma).topk(k, dim=1, largest=True).indices     # B x K x D
    votes = torch.zeros(B, N, dtype=torch.float32, device=h.device)
    return votes.scatter_add_(1, winners.reshape(B, -1), torch.ones(B, k * D, device=h.device))
