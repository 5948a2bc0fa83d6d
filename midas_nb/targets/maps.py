"""The registered targets: T0–T5 of the MIDAS taxonomy and the related methods' maps (rollout over
blocks 1..L and over all blocks, TokenTM, LaSt-ViT votes, random), each ``fn(capture, depth, class_index) -> [B,N]``."""
from __future__ import annotations

import torch
from torch import Tensor

from ..capture import CaptureResult
from .registry import DEFAULT_RANDOM_SEED, TargetInfo, register_target
from .rules import attention_rollout, chefer_relevance, cls_attention_map, stability_votes, tokentm_relevance


def _block(capture: CaptureResult, depth: int) -> int:
    """0-based block index of the 1-based depth ``L``; checks ``1 ≤ L ≤ capture.num_blocks``."""
    if not (1 <= int(depth) <= capture.num_blocks):
        raise ValueError(f"depth L must be in 1..{capture.num_blocks} (1-based block), got {depth!r}")
    return int(depth) - 1


def _check_class(capture: CaptureResult, class_index: Tensor) -> None:
    """Gradient targets read ``∂y_c/∂·`` of the capture: its class must be ``class_index``."""
    c = torch.as_tensor(class_index, device=capture.class_index.device).long().reshape(-1)
    if c.shape != capture.class_index.shape or not torch.equal(c, capture.class_index):
        raise ValueError("class_index differs from the class whose logit the capture differentiated "
                         f"(capture.class_index={capture.class_index.tolist()}, got {c.tolist()}); "
                         "capture again with this class_index")


@register_target("T0", TargetInfo('CLS-attention', 'attention', 'CLS row (raw)', '—', 'E_h A_h[cls, j]', 'taxonomy'))
def cls_attention(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T0, CLS attention at block ``L``: ``E_h A_h[cls, j]`` → ``[B,N]``.

    The attention the CLS token pays to patch ``j``, mean over heads; also the training-free
    reference scorer (EViT's token attentiveness, Liang et al., 2022,
    https://arxiv.org/abs/2202.07800). Source: DESIGN.md §4.
    """
    return cls_attention_map(capture.attn[_block(capture, depth)].float(), capture.num_prefix_tokens)


@register_target("T1", TargetInfo('attention magnitude', 'attention', 'column sum (raw)', '—',
                 'E_h Σ_i A_h[i, j]', 'taxonomy'))
def attention_magnitude(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T1, attention mass received at block ``L``: ``E_h Σ_i A_h[i, j]`` → ``[B,N]``.

    Sum over every query token ``i`` (prefix tokens included). Source: DESIGN.md §4.
    """
    return capture.patch(capture.attn[_block(capture, depth)].float().sum(2).mean(1))


@register_target("T2", TargetInfo('loss-gradient-modulated attention', 'attention',
                 'gradient ⊙ attention, positive part', 'loss ℓ', 'E_h [A_h ⊙ (−∂ℓ/∂A_h)]⁺[cls, j]', 'taxonomy'))
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
    return (capture.attn[b][:, :, 0, P:].float() * -g[:, :, 0, P:].float()).clamp_min(0).mean(1)


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
    return capture.patch(chefer_relevance(capture.attn, capture.attn_grad, row=0))


@register_target("T4", TargetInfo('hidden-state attention-weighted gradient', 'hidden state (+ attention)',
                 'gradient norm × CLS attention', 'logit y_c', 'E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂', 'taxonomy'))
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
                 'input × gradient (signed)', 'logit y_c', 'Σ_d h_{j,d} · ∂y_c/∂h_{j,d}', 'taxonomy'))
def hidden_input_x_gradient(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """T5, input × gradient of the block-``L`` output: ``Σ_d h_{j,d} · ∂y_c/∂h_{j,d}`` → ``[B,N]``.

    Signed. Equals captum's ``LayerGradientXActivation`` on block ``L`` summed over channels.
    Source: DESIGN.md §4; Shrikumar et al., 2016, https://arxiv.org/abs/1605.01713.

    NOTE: in a pre-norm ViT with CLS pooling (``n`` blocks), patch token ``j`` after block ``n−1`` reaches
    the logit only through the last block's ``norm1``, which is scale invariant, so
    ``h_j·∂y_c/∂h_j = d/dα y_c(LN((1+α)h_j)) ≈ 0`` (LayerNorm ``eps`` only): T5 is degenerate at
    ``L = n−1``, and T4/T5 vanish at ``L = n`` (no gradient reaches patch tokens).

    """
    b = _block(capture, depth)
    _check_class(capture, class_index)
    P = capture.num_prefix_tokens
    return (capture.hidden[b][:, P:].float() * capture.hidden_grad[b][:, P:].float()).sum(-1)


@register_target("rollout", TargetInfo('attention rollout, blocks 1..L (Abnar & Zuidema, 2020)',
                 'attention (blocks 1..L)', 'identity-added, row-normalised product', '—',
                 'Π_{b=1..L} rownorm(E_h A_b + I); [cls, j]', 'related'))
def rollout(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """Attention rollout over blocks ``1..L``, CLS row: ``(Â_L ⋯ Â_1)[cls, j]`` → ``[B,N]``.

    ``Â_b = rownorm(E_h A_b + I)``; the product runs over blocks ``1 … L`` only (what reached
    the tokens at the output of block ``L``, where the scorer reads them) — a target at depth
    ``L``, not an explanation of the model output; :func:`rollout_full` is the latter, the one to
    set beside T3 and TokenTM. Source: Abnar & Zuidema, 2020, https://arxiv.org/abs/2005.00928,
    §3, as in Chefer's ``compute_rollout_attention`` / ``GradCam.generate_rollout``
    (hila-chefer/Transformer-Explainability, ``baselines/ViT/ViT_explanation_generator.py``); :func:`attention_rollout`.
    """
    return capture.patch(attention_rollout(capture.attn[: _block(capture, depth) + 1], row=0))


@register_target("rollout_full", TargetInfo('attention rollout, all blocks (Abnar & Zuidema, 2020)',
                 'attention (all blocks)', 'identity-added, row-normalised product', '—',
                 'Π_{b=1..n} rownorm(E_h A_b + I); [cls, j]', 'related'))
def rollout_full(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """Attention rollout over **every** block ``1..n`` of the model, CLS row → ``[B,N]``.

    ``(Â_n ⋯ Â_1)[cls, j]`` with ``Â_b = rownorm(E_h A_b + I)``: like T3 and TokenTM it explains
    the model output, so ``depth`` is only validated (the relevance-map comparison of notebook
    06 uses this one). Source: Abnar & Zuidema, 2020, https://arxiv.org/abs/2005.00928, §3, as
    Chefer's ``GradCam.generate_rollout`` with ``start_layer=0`` (hila-chefer/
    Transformer-Explainability, ``baselines/ViT/ViT_explanation_generator.py``);
    :func:`attention_rollout`.
    """
    _block(capture, depth)
    return capture.patch(attention_rollout(capture.attn, row=0))


@register_target("tokentm", TargetInfo('TokenTM (Wu et al., 2024)', 'attention + token transformations (all blocks)',
                 'gradient ⊙ attention with length/direction weights', 'probability p_c',
                 'C^l = U^l C^{l-1}, U = I + E_h[(∂p_c/∂A)⁺ ⊙ A]·W (MHSA), I + W (FFN); '
                 'W = diag(‖Ẽ_i‖/‖E_i‖·NECC(i)); C⁰ = diag(‖E⁰_i‖); C[cls, j]', 'related'))
def tokentm(capture: CaptureResult, depth: int, class_index: Tensor) -> Tensor:
    """TokenTM contribution map over all blocks, CLS row → ``[B,N]``.

    Per block (MHSA, then FFN), with ``E`` the residual stream entering the layer and ``Ẽ``
    each token's own transform by it: MHSA ``E`` = block input, ``Ẽ_j = attn.proj(v_j)``; FFN
    ``E`` = block input + MHSA output, ``Ẽ`` = FFN output (LayerNorms act only inside ``Ẽ``).
    ``W = diag(‖Ẽ_i‖/‖E_i‖ · NECC(i))``, ``U_mhsa = I + E_h[(∂p_c/∂A)⁺ ⊙ A]·W`` with ``p_c`` the
    softmax probability of class ``c``, ``U_ffn = I + W``; ``C⁰ = diag(‖E⁰_i‖)``, ``Cˡ = Uˡ·Cˡ⁻¹``;
    the map is ``C[cls, j]`` (:func:`tokentm_relevance`). Like T3 it explains the output, so
    ``depth`` is only validated. Source: Wu, Duan, Kang, Tang, Yan, CVPR 2024,
    https://arxiv.org/abs/2403.14552, §3 (eqs. of the transformation weight and the
    aggregation); DESIGN.md §4.

    Raises:
        ValueError: ``depth`` out of range, another class than the capture's, or a capture
            without ``∂p_c/∂A`` (capture with ``prob_grad=True``; :func:`compute_targets` does).
    """
    _block(capture, depth)
    _check_class(capture, class_index)
    if not capture.attn_grad_prob or any(g is None for g in capture.attn_grad_prob):
        raise ValueError("tokentm needs ∂p_c/∂A of every block: capture with prob_grad=True")
    return capture.patch(tokentm_relevance(capture.hidden_in, capture.value_proj, capture.hidden_mid,
                                           capture.mlp_out, capture.attn, capture.attn_grad_prob, row=0))


@register_target("last_votes", TargetInfo('LaSt-ViT stability votes (Shi et al.)', 'hidden state',
                 'channel low-pass ratio, top-K votes', '—',
                 'votes of channels for their K (default N//2) tokens of largest x/|lowpass(x)−x|', 'related'))
def last_votes(capture: CaptureResult, depth: int, class_index: Tensor, *,
               num_votes: int | None = None, sigma: float | None = None) -> Tensor:
    """LaSt-ViT stability votes on block ``L``'s patch tokens after the final norm → ``[B,N]``.

    ``x = norm(h_L)`` with the backbone's final norm (``capture.extras["final_norm"]``, set by
    :func:`~midas_nb.targets.compute_targets` and :func:`~midas_nb.targets.target_cache`): the
    official statistic reads the encoder output after its final LayerNorm
    (github.com/ChengShiest/LAST-ViT, ``cls_pretrain/conf.py``, class ``dense_vit``); at
    ``L = depth`` this is exactly that input, at ``L < depth`` the same norm is applied to block
    ``L``'s tokens (docs/decisions/0017-last-votes-definition.md). Prefix tokens are dropped before the
    ranking, as the official ``x[:, 1:]``. Then :func:`stability_votes` with ``K = num_votes``
    (default ``N // 2``, :data:`midas_nb.targets.LAST_VOTES_K`: the paper's ablation favours ``K ≈ N/2``, and
    ``K·D`` votes give a graded map to distil, where ``K = 1`` leaves most tokens at 0) and
    ``σ = √D``; each image's scores sum to ``K·D``. Source: Shi, Yu, Yang, LaSt-ViT,
    https://arxiv.org/abs/2602.22394; DESIGN.md §4.

    Raises:
        ValueError: the capture carries no final norm.
    """
    norm = capture.extras.get("final_norm")
    if norm is None:
        raise ValueError("last_votes needs the backbone's final norm in capture.extras['final_norm'] "
                         "(compute_targets and target_cache set it); got a capture without it")
    with torch.no_grad():
        x = norm(capture.hidden[_block(capture, depth)].float())
    return stability_votes(capture.patch(x), num_votes=num_votes, sigma=sigma)


def _image_seed(seed: int, index: int) -> int:
    # splitmix-style mixing so that (seed, index) pairs give unrelated streams
    x = (int(seed) * 0x9E3779B97F4A7C15 + int(index) * 0xBF58476D1CE4E5B9 + 1) % (1 << 64)
    x ^= x >> 31
    return x % (1 << 63)


@register_target("random", TargetInfo('random map (lower bound; the random_map control distils it)', '—',
                 'seeded uniform, fixed per image', '—', 'u_j ~ U(0, 1), seeded by (seed, image index)', 'related'))
def random_target(capture: CaptureResult, depth: int, class_index: Tensor, *, seed: int | None = None) -> Tensor:
    """Seeded uniform values in ``[0, 1)`` (the random-ranking lower bound) → ``[B,N]``.

    As a supervision target it is the protocol's ``random_map`` control
    (:mod:`midas_nb.analysis.protocol`): a full ranking of every token without any content.

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
    B, N = capture.hidden[0].shape[0], capture.hidden[0].shape[1] - capture.num_prefix_tokens
    indices = capture.extras.get("indices")
    indices = list(range(B)) if indices is None else [int(i) for i in torch.as_tensor(indices).reshape(-1)]
    if len(indices) != B:
        raise ValueError(f"capture.extras['indices'] must hold one index per image ({B}), got {len(indices)}")
    g = torch.Generator()
    rows = [torch.rand(N, generator=g.manual_seed(_image_seed(seed, i))) for i in indices]
    return torch.stack(rows).to(capture.hidden[0].device)
