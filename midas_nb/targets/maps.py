"""The registered targets: T0–T5 of the MIDAS taxonomy and the related methods' maps (rollout,
TokenTM, LaSt-ViT votes, random), each ``fn(capture, depth, class_index) -> [B,N]``."""
from __future__ import annotations


import torch
from torch import Tensor

from ..capture import CaptureResult
from .registry import DEFAULT_RANDOM_SEED, TargetInfo, register_target
from .rules import _basis_row, _block, _check_class, attention_rollout, chefer_relevance, cls_attention_map, stability_votes, tokentm_mhsa_update, transformation_weight


@register_target("T0", TargetInfo('CLS-attention', 'attention',
                 'CLS row (raw)', '—',
                 'E_h A_h[cls, j]', 'taxonomy'))
def cls_attention(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T0, CLS attention at block ``L``: ``E_h A_h[cls, j]`` → ``[B,N]``.

    The attention the CLS token pays to patch ``j``, mean over heads; also the training-free
    reference scorer (EViT's token attentiveness, Liang et al., 2022,
    https://arxiv.org/abs/2202.07800). Source: DESIGN.md §4.
    """
    return cls_attention_map(capture.attn[_block(capture, depth)].float(), capture.num_prefix_tokens)


@register_target("T1", TargetInfo('attention magnitude', 'attention',
                 'column sum (raw)', '—',
                 'E_h Σ_i A_h[i, j]', 'taxonomy'))
def attention_magnitude(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T1, attention mass received at block ``L``: ``E_h Σ_i A_h[i, j]`` → ``[B,N]``.

    Sum over every query token ``i`` (prefix tokens included). Source: DESIGN.md §4.
    """
    a = capture.attn[_block(capture, depth)]
    return a.float().sum(2).mean(1)[:, capture.num_prefix_tokens:]


@register_target("T2", TargetInfo('loss-gradient-modulated attention', 'attention',
                 'gradient ⊙ attention, positive part', 'loss ℓ',
                 'E_h [A_h ⊙ (−∂ℓ/∂A_h)]⁺[cls, j]', 'taxonomy'))
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


@register_target("T3", TargetInfo('Chefer attention-gradient product (GAE)', 'attention (all blocks)',
                 'gradient ⊙ attention, propagated', 'logit y_c',
                 'R = I; R += E_h[(∂y_c/∂A_b) ⊙ A_b]⁺ · R over blocks; R[cls, j]', 'taxonomy'))
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


@register_target("T4", TargetInfo('hidden-state attention-weighted gradient', 'hidden state (+ attention)',
                 'gradient norm × CLS attention', 'logit y_c',
                 'E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂', 'taxonomy'))
def attention_weighted_gradient(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T4, hidden-state attention-weighted gradient: ``E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂`` → ``[B,N]``.

    ``A`` and ``h`` of block ``L`` (``h`` its output). Source: DESIGN.md §4.
    """
    b = _block(capture, depth)
    _check_class(capture, class_index)
    P = capture.num_prefix_tokens
    grad_norm = capture.hidden_grad[b][:, P:].float().norm(dim=-1)
    return capture.attn[b][:, :, 0, P:].float().mean(1) * grad_norm


@register_target("T5", TargetInfo('hidden-state input × gradient', 'hidden state',
                 'input × gradient (signed)', 'logit y_c',
                 'Σ_d h_{j,d} · ∂y_c/∂h_{j,d}', 'taxonomy'))
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


@register_target("rollout", TargetInfo('attention rollout (Abnar & Zuidema, 2020)', 'attention (blocks 1..L)',
                 'identity-added, row-normalised product', '—',
                 'Π_b (0.5·I + 0.5·E_h A_b) row-normalised; [cls, j]', 'related'))
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


@register_target("tokentm", TargetInfo('TokenTM (Wu et al., 2024)', 'attention + token transformations',
                 'gradient ⊙ attention with length/direction weights', 'logit y_c',
                 'C^l = U^l C^{l-1}, U = I + E_h[(∂y_c/∂A)⁺ ⊙ A]·W (MHSA), I + W (FFN)', 'related'))
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


@register_target("last_votes", TargetInfo('LaSt-ViT stability votes (Shi et al.)', 'hidden state',
                 'channel low-pass stability, top-K votes', '—',
                 'votes of channels for their K≈N/2 most stable tokens', 'related'))
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


@register_target("random", TargetInfo('random map (lower bound; the random_map control distils it)', '—',
                 'seeded uniform, fixed per image', '—',
                 'u_j ~ U(0, 1), seeded by (seed, image index)', 'related'))
def random_target(capture: CaptureResult, depth: int, class_index: Tensor, *,
                  seed: int | None = None) -> Tensor:
    """Seeded uniform values in ``[0, 1)`` (the random-ranking lower bound) → ``[B,N]``.

    As a supervision target it is the protocol's ``random_map`` control
    (:mod:`midas_nb.protocol`): a full ranking of every token without any content.

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
