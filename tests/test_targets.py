"""Tests of midas_nb.targets against hand computations and independent implementations."""
from __future__ import annotations

import math

import pytest
import timm
import torch
import torch.nn.functional as F

from midas_nb.capture import CaptureResult, capture
from midas_nb.targets import (
    attention_rollout,
    chefer_relevance,
    compute_targets,
    get_target,
    list_targets,
    necc,
    stability_votes,
    target_cache,
    target_cache_path,
    target_info,
    tokentm_ffn_update,
    tokentm_mhsa_update,
    transformation_weight,
)

ALL_IDS = list_targets()


def _tiny_vit(depth: int = 3, seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    timm.layers.set_fused_attn(False)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                              depth=depth, num_classes=5).eval()
    # timm's init (std 0.02) gives near-uniform attention and tiny gradients; 1/sqrt(fan_in)
    # weights give maps and gradients well above float noise
    for m in model.modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=m.in_features ** -0.5)
    return model


@pytest.fixture(scope="module")
def model():
    # 3 blocks, targets at L = 1: at L = depth - 1 the patch tokens of a CLS-pooled pre-norm ViT
    # reach the logit only through LayerNorms, which are scale invariant, so h·∂y/∂h (T5) ≈ 0
    return _tiny_vit(depth=3)


@pytest.fixture(scope="module")
def images():
    return torch.randn(3, 3, 32, 32, generator=torch.Generator().manual_seed(1))


def _fake_capture(attn, attn_grad=None, num_prefix_tokens=1, hidden=None):
    """A CaptureResult built from hand-made attention tensors (other fields zero)."""
    B, H, T, _ = attn[0].shape
    D = 4 if hidden is None else hidden[0].shape[-1]
    zeros = [torch.zeros(B, T, D) for _ in attn]
    return CaptureResult(
        logits=torch.zeros(B, 2), class_index=torch.zeros(B, dtype=torch.long), labels=None,
        attn=list(attn), attn_grad=list(attn_grad) if attn_grad is not None else [torch.zeros_like(a) for a in attn],
        attn_grad_loss=[None] * len(attn), hidden_in=zeros, hidden=list(hidden) if hidden is not None else zeros,
        hidden_grad=zeros, hidden_grad_loss=[None] * len(attn), attn_in=zeros, attn_out=zeros,
        mlp_in=zeros, mlp_out=zeros, num_prefix_tokens=num_prefix_tokens, grid_size=(1, T - num_prefix_tokens),
    )


def test_registry_lists_every_id():
    assert ALL_IDS == ["T0", "T1", "T2", "T3", "T4", "T5", "rollout", "rollout_full", "tokentm", "last_votes",
                       "random"]
    with pytest.raises(ValueError, match="unknown target"):
        get_target("T9")


def test_targets_scorers_and_metrics_share_one_registry():
    """One class (targets.registry.Registry) holds all three: a name added twice and an unknown
    name fail alike, the message naming the kind (and the known names)."""
    import midas_nb.metrics.coverage  # noqa: F401 - registers part_miou (metrics load their modules lazily)
    from midas_nb.metrics.registry import _METRICS
    from midas_nb.scorers.base import _SCORERS
    from midas_nb.targets.registry import _REGISTRY, Registry
    for reg, kind, known in ((_REGISTRY, "target", "T0"), (_SCORERS, "scorer", "mlp"),
                             (_METRICS, "metric", "part_miou")):
        assert isinstance(reg, Registry) and known in reg
        with pytest.raises(ValueError, match=f"{kind} '{known}' is already registered"):
            reg.add(known, None)
        with pytest.raises(ValueError, match=f"unknown {kind} 'nope'; expected one of .*'{known}'"):
            reg["nope"]


@pytest.mark.parametrize("target_id", ALL_IDS)
def test_every_target_is_finite_b_by_n(model, images, target_id):
    c = torch.tensor([0, 3, 1])
    # L = 1 < depth: at the last block a CLS-pooled head gives patch tokens zero gradient
    out = compute_targets(model, images, [target_id], 1, c, labels=torch.tensor([1, 3, 4]))
    t = out[target_id]
    assert t.shape == (3, 16) and t.dtype == torch.float32
    assert torch.isfinite(t).all()
    assert t.abs().sum() > 0


def test_all_targets_from_one_forward(model, images):
    calls = []
    handle = model.patch_embed.register_forward_hook(lambda m, a, o: calls.append(1))
    try:
        compute_targets(model, images, ALL_IDS, 2, torch.tensor([0, 1, 2]), torch.tensor([2, 1, 0]))
    finally:
        handle.remove()
    assert len(calls) == 1


def test_t0_equals_cls_row_recomputed_from_qkv(model, images):
    c = torch.tensor([0, 1, 2])
    cap = capture(model, images, c)
    for depth in (1, 3):
        attn = model.blocks[depth - 1].attn
        x = cap.attn_in[depth - 1]                                   # norm1 output, B x T x D
        B, T, D = x.shape
        H = attn.num_heads
        qkv = F.linear(x, attn.qkv.weight, attn.qkv.bias).reshape(B, T, 3, H, D // H)
        q, k = qkv[:, :, 0].transpose(1, 2), qkv[:, :, 1].transpose(1, 2)
        a = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(D // H), dim=-1)
        expected = a[:, :, 0, 1:].mean(1)
        torch.testing.assert_close(get_target("T0")(cap, depth, c), expected, rtol=1e-5, atol=1e-6)


def test_t1_is_attention_mass_received():
    # 1 image, 2 heads, 3 tokens; mass received by token j = column sums, mean over heads
    a = torch.tensor([[[[0.5, 0.5, 0.0], [0.0, 1.0, 0.0], [0.2, 0.2, 0.6]],
                       [[1.0, 0.0, 0.0], [0.0, 0.0, 1.0], [0.0, 0.5, 0.5]]]])
    cap = _fake_capture([a])
    # head 1 columns 1,2: 1.7, 0.6; head 2: 0.5, 1.5
    torch.testing.assert_close(get_target("T1")(cap, 1, cap.class_index), torch.tensor([[1.1, 1.05]]))


def test_t5_equals_captum_layer_gradient_x_activation(model, images):
    from captum.attr import LayerGradientXActivation

    c = torch.tensor([4, 0, 2])
    depth = 1
    out = compute_targets(model, images, ["T5"], depth, c)["T5"]
    lgxa = LayerGradientXActivation(model, model.blocks[depth - 1])
    attr = lgxa.attribute(images, target=c.tolist())                # B x T x D
    expected = attr[:, 1:].sum(-1)
    assert expected.abs().max() > 1e-3
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-6)


def _attention_and_grads_by_hand(model, images, c):
    """Attention maps and ∂y_c/∂A with retain_grad hooks, independent of midas_nb.capture."""
    store = []

    def hook(module, args, out):
        out.retain_grad()
        store.append(out)

    handles = [blk.attn.attn_drop.register_forward_hook(hook) for blk in model.blocks]
    try:
        x = images.clone().requires_grad_(True)
        logits = model(x)
        logits.gather(1, c[:, None]).sum().backward()
    finally:
        for h in handles:
            h.remove()
    return [a.detach() for a in store], [a.grad.detach() for a in store]


def _attention_and_hidden_by_hand(model, images, scalar_of_logits):
    """Attention maps and block outputs with ``retain_grad``, and their gradients of
    ``scalar_of_logits(logits)`` — plain autograd hooks, independent of midas_nb.capture."""
    attns, hiddens = [], []

    def keep(store):
        def hook(module, args, out):
            out.retain_grad()
            store.append(out)
        return hook

    handles = [blk.attn.attn_drop.register_forward_hook(keep(attns)) for blk in model.blocks]
    handles += [blk.register_forward_hook(keep(hiddens)) for blk in model.blocks]
    try:
        scalar_of_logits(model(images)).backward()
    finally:
        for h in handles:
            h.remove()
    return ([a.detach() for a in attns], [a.grad.detach() for a in attns],
            [h.detach() for h in hiddens], [h.grad.detach() for h in hiddens])


@pytest.mark.parametrize("depth", [1, 2])
def test_t2_equals_loss_gradient_attention_by_autograd(model, images, depth):
    """T2 = E_h [A_h ⊙ (−∂ℓ/∂A_h)]⁺[cls, j] with ℓ the summed cross-entropy on the labels."""
    labels = torch.tensor([2, 0, 4])
    attns, grads, _, _ = _attention_and_hidden_by_hand(
        model, images, lambda logits: F.cross_entropy(logits, labels, reduction="sum"))
    a, g = attns[depth - 1], grads[depth - 1]                          # [B,H,T,T]
    expected = (a[:, :, 0, 1:] * -g[:, :, 0, 1:]).clamp(min=0).mean(1)
    assert expected.abs().max() > 1e-6
    out = compute_targets(model, images, ["T2"], depth, torch.tensor([1, 1, 1]), labels=labels)["T2"]
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-7)
    # the labels, not the class index, define T2: other labels give another map
    other = compute_targets(model, images, ["T2"], depth, torch.tensor([1, 1, 1]),
                            labels=torch.tensor([0, 1, 2]))["T2"]
    assert not torch.allclose(other, out)


@pytest.mark.parametrize("depth", [1, 2])
def test_t4_equals_attention_weighted_hidden_gradient_by_autograd(model, images, depth):
    """T4 = E_h A_h[cls, j] · ‖∂y_c/∂h_j‖₂ with h the output of block L."""
    c = torch.tensor([3, 1, 0])
    attns, _, hidden, hgrad = _attention_and_hidden_by_hand(
        model, images, lambda logits: logits.gather(1, c[:, None]).sum())
    expected = attns[depth - 1][:, :, 0, 1:].mean(1) * hgrad[depth - 1][:, 1:].norm(dim=-1)
    assert expected.abs().max() > 1e-6
    out = compute_targets(model, images, ["T4"], depth, c)["T4"]
    torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-7)


def test_t3_equals_loop_per_block_chefer_rule(images):
    model = _tiny_vit(depth=2, seed=1)
    c = torch.tensor([1, 2, 3])
    attns, grads = _attention_and_grads_by_hand(model, images, c)
    B, _, T, _ = attns[0].shape
    r = torch.eye(T).repeat(B, 1, 1)
    for a, g in zip(attns, grads):                     # Chefer et al. 2021, eqs. 5-6
        cam = (g * a).clamp(min=0).mean(dim=1)
        r = r + torch.bmm(cam, r)
    expected = r[:, 0, 1:]
    for depth in (1, 2):                               # T3 always runs over every block
        out = compute_targets(model, images, ["T3"], depth, c)["T3"]
        torch.testing.assert_close(out, expected, rtol=1e-4, atol=1e-7)


def test_t3_hand_built_two_token_example():
    # 2 tokens (CLS + one patch), 2 blocks, 2 heads; head 2 has gradient −|g|, so its products
    # are ≤ 0 and vanish in the positive part, which is taken before the head mean (a mean
    # before the positive part would give Ā = 0 and R = I).
    a1 = torch.tensor([[0.5, 0.5], [0.25, 0.75]])
    g1 = torch.tensor([[2.0, -2.0], [0.0, 4.0]])       # g1 ⊙ a1 = [[1, -1], [0, 3]]
    a2 = torch.tensor([[0.5, 0.5], [1.0, 0.0]])
    g2 = torch.tensor([[0.0, 2.0], [-1.0, 5.0]])       # g2 ⊙ a2 = [[0, 1], [-1, 0]]
    attn = [torch.stack([a1, a1])[None], torch.stack([a2, a2])[None]]
    grad = [torch.stack([g1, -g1.abs()])[None], torch.stack([g2, -g2.abs()])[None]]
    # Ā1 = [[.5, 0], [0, 1.5]] → R1 = I + Ā1 = [[1.5, 0], [0, 2.5]]
    # Ā2 = [[0, .5], [0, 0]]   → R2 = R1 + Ā2·R1 = [[1.5, 1.25], [0, 2.5]]
    expected = torch.tensor([[[1.5, 1.25], [0.0, 2.5]]])
    torch.testing.assert_close(chefer_relevance(attn, grad), expected)
    torch.testing.assert_close(chefer_relevance(attn, grad, row=0), expected[:, 0])
    cap = _fake_capture(attn, grad)
    torch.testing.assert_close(get_target("T3")(cap, 1, cap.class_index), torch.tensor([[1.25]]))


def test_rollout_hand_computation_two_blocks_three_tokens():
    eye = torch.eye(3)
    shift = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    a1 = torch.stack([eye, shift])[None]                               # head mean [[.5,.5,0],[0,1,0],[0,0,1]]
    a2 = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])[None, None]
    # Â1 = [[.75,.25,0],[0,1,0],[0,0,1]], Â2 = [[.5,0,.5],[0,1,0],[0,0,1]]
    # row cls of Â2·Â1 = .5·[.75,.25,0] + .5·[0,0,1] = [.375, .125, .5]
    cap = _fake_capture([a1, a2])
    torch.testing.assert_close(get_target("rollout")(cap, 2, cap.class_index), torch.tensor([[0.125, 0.5]]))
    torch.testing.assert_close(get_target("rollout")(cap, 1, cap.class_index), torch.tensor([[0.25, 0.0]]))
    full = attention_rollout([a1, a2])
    torch.testing.assert_close(full[:, 0], torch.tensor([[0.375, 0.125, 0.5]]))
    torch.testing.assert_close(full.sum(-1), torch.ones(1, 3))


def test_tokentm_necc_and_updates():
    g = torch.Generator().manual_seed(3)
    e, e_t = torch.randn(2, 5, 8, generator=g), torch.randn(2, 5, 8, generator=g)
    n = necc(e, e_t)
    torch.testing.assert_close(n.sum(-1), torch.ones(2))
    cos = (e * e_t).sum(-1) / (e.norm(dim=-1) * e_t.norm(dim=-1))
    torch.testing.assert_close(n, cos.exp() / cos.exp().sum(-1, keepdim=True))
    torch.testing.assert_close(transformation_weight(e, e_t), e_t.norm(dim=-1) / e.norm(dim=-1) * n)

    attn = torch.softmax(torch.randn(2, 3, 5, 5, generator=g), -1)
    grad = torch.randn(2, 3, 5, 5, generator=g)
    chefer = torch.eye(5) + (grad.clamp(min=0) * attn).mean(1)
    torch.testing.assert_close(tokentm_mhsa_update(attn, grad, torch.ones(2, 5)), chefer)
    w = torch.rand(2, 5, generator=g)
    torch.testing.assert_close(tokentm_mhsa_update(attn, grad, w),
                               torch.eye(5) + (grad.clamp(min=0) * attn).mean(1) @ torch.diag_embed(w))
    torch.testing.assert_close(tokentm_ffn_update(w), torch.eye(5) + torch.diag_embed(w))


def test_tokentm_equals_full_matrix_product(model, images):
    c = torch.tensor([0, 4, 2])
    cap = capture(model, images, c, prob_grad=True)
    C = torch.diag_embed(cap.hidden_in[0].norm(dim=-1))           # C⁰ = diag(‖E⁰_i‖)
    for b in range(cap.num_blocks):                                    # MHSA then FFN, per block
        C = tokentm_mhsa_update(cap.attn[b], cap.attn_grad_prob[b],
                                transformation_weight(cap.hidden_in[b], cap.value_proj[b])) @ C
        C = tokentm_ffn_update(transformation_weight(cap.hidden_mid[b], cap.mlp_out[b])) @ C
    torch.testing.assert_close(get_target("tokentm")(cap, 1, c), C[:, 0, 1:], rtol=1e-5, atol=1e-6)
    with pytest.raises(ValueError, match="prob_grad=True"):
        get_target("tokentm")(capture(model, images, c), 1, c)


def _transcribed_tokentm(model, images, class_index):
    """TokenTM written out independently of the package (its hooks, capture and rules): one
    explicit forward through timm's ``Block``/``Attention`` modules keeping every ``A`` (with
    ``retain_grad``), each token's value through ``attn.proj`` and the residual stream before
    each layer; ``p_c = softmax(logits)_c`` is back-propagated; then, in forward order and with
    full ``[T,T]`` matrices: ``W = diag(‖Ẽ‖/‖E‖ · softmax_tokens(cos(E, Ẽ)))``,
    ``C ← (I + E_h[(∂p_c/∂A_h).clamp(min=0) * A_h] @ W) @ C`` (MHSA) and ``C ← (I + W) @ C``
    (FFN), from ``C⁰ = diag(‖E⁰‖)``; the CLS row, patch columns (Wu et al., CVPR 2024, §3)."""
    x = model.norm_pre(model.patch_drop(model._pos_embed(model.patch_embed(images))))
    e0, layers = x, []
    for blk in model.blocks:
        at = blk.attn
        B, T, D = x.shape
        qkv = at.qkv(blk.norm1(x)).reshape(B, T, 3, at.num_heads, at.head_dim).permute(2, 0, 3, 1, 4)
        q, k, v = qkv.unbind(0)
        q, k = at.q_norm(q), at.k_norm(k)
        attn = ((q * at.scale) @ k.transpose(-2, -1)).softmax(dim=-1)
        attn.retain_grad()
        own = at.proj(v.transpose(1, 2).reshape(B, T, D))                  # Ẽ_j = proj(v_j)
        mixed = at.proj((attn @ v).transpose(1, 2).reshape(B, T, D))
        layers.append(("mhsa", x, own, attn))
        x = x + mixed
        ffn = blk.mlp(blk.norm2(x))
        layers.append(("ffn", x, ffn, None))
        x = x + ffn
    logits = model.forward_head(model.norm(x))
    torch.testing.assert_close(logits, model(images), rtol=1e-4, atol=1e-5)
    logits.softmax(-1).gather(1, class_index[:, None]).sum().backward()

    def weight(e, e_t):
        cos = F.cosine_similarity(e, e_t, dim=-1)
        return torch.diag_embed(e_t.norm(dim=-1) / e.norm(dim=-1) * cos.exp() / cos.exp().sum(-1, keepdim=True))

    with torch.no_grad():
        eye = torch.eye(e0.shape[1])
        C = torch.diag_embed(e0.norm(dim=-1))
        for kind, e, e_t, attn in layers:
            W = weight(e, e_t)
            if kind == "mhsa":
                C = (eye + (attn.grad.clamp(min=0) * attn).mean(dim=1) @ W) @ C
            else:
                C = (eye + W) @ C
    return C[:, 0, model.num_prefix_tokens:]


def test_tokentm_equals_transcription_on_timm_vit():
    torch.manual_seed(0)
    timm.layers.set_fused_attn(False)
    vit = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, num_classes=10).eval()
    for m in vit.modules():            # weights well above float noise (see _tiny_vit)
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=m.in_features ** -0.5)
    x = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(4))
    c = torch.tensor([3, 7])
    expected = _transcribed_tokentm(vit, x, c)
    got = compute_targets(vit, x, ["tokentm"], 1, c)["tokentm"]
    assert got.shape == (2, 16) and bool((expected > 0).all())
    torch.testing.assert_close(got, expected, rtol=2e-4, atol=0)


def test_probability_gradient_is_softmax_jacobian_of_logit_gradients(model, images):
    # ∂p_c/∂A = p_c (∂y_c/∂A − Σ_k p_k ∂y_k/∂A): from one logit-gradient capture per class
    c = torch.tensor([1, 4, 0])
    cap = capture(model, images, c, prob_grad=True)
    p = cap.logits.softmax(-1)
    per_class = [capture(model, images, torch.full((3,), k)).attn_grad for k in range(p.shape[1])]
    for b in range(cap.num_blocks):
        gy = torch.stack([g[b] for g in per_class], 1)                     # B x K x H x T x T
        mean = (p[:, :, None, None, None] * gy).sum(1)
        own = gy[torch.arange(3), c]
        expected = p.gather(1, c[:, None])[:, :, None, None] * (own - mean)
        # a difference of near-equal terms: tolerance relative to the block's largest gradient
        torch.testing.assert_close(cap.attn_grad_prob[b], expected, rtol=1e-3,
                                   atol=1e-4 * float(expected.abs().max()))
        assert float(expected.abs().max()) > 1e-4
    # and by torch.autograd.grad on a fresh forward that keeps A
    kept = []
    hook = model.blocks[0].attn.attn_drop.register_forward_hook(lambda m, a, o: kept.append(o))
    try:
        logits = model(images.clone())
    finally:
        hook.remove()
    (g,) = torch.autograd.grad(logits.softmax(-1).gather(1, c[:, None]).sum(), kept[0])
    torch.testing.assert_close(cap.attn_grad_prob[0], g, rtol=1e-4, atol=1e-9)


def test_rollout_full_is_product_over_every_block(model, images):
    cap = capture(model, images, torch.tensor([0, 1, 2]))
    R = torch.eye(cap.attn[0].shape[-1]).expand(3, -1, -1)
    for a in cap.attn:                                               # independent loop, forward order
        m = a.mean(1) + torch.eye(a.shape[-1])
        R = (m / m.sum(-1, keepdim=True)) @ R
    for L in (1, 2, 3):
        torch.testing.assert_close(get_target("rollout_full")(cap, L, cap.class_index), R[:, 0, 1:])
    torch.testing.assert_close(get_target("rollout")(cap, 3, cap.class_index), R[:, 0, 1:])
    assert not torch.allclose(get_target("rollout")(cap, 1, cap.class_index), R[:, 0, 1:])
    assert "1..L" in target_info("rollout").name and "all blocks" in target_info("rollout_full").name
    assert target_info("tokentm").gradient_of == "probability p_c"


def test_relevance_map_comparison_explains_the_output(model, images):
    # the maps of notebook 06's perturbation table that stand for "the model output" (all but
    # T5, a block-L map) must not change with the depth L
    from midas_nb.analysis.related import PERTURBATION_MAPS

    c = torch.tensor([0, 1, 2])
    ids = [i for i in PERTURBATION_MAPS if i != "T5"]
    assert any("rollout" in i for i in ids)
    at1, at2 = compute_targets(model, images, ids, 1, c), compute_targets(model, images, ids, 2, c)
    for i in ids:
        torch.testing.assert_close(at1[i], at2[i], msg=f"{i} depends on the depth L")


def test_last_votes_sum_and_constant_token():
    g = torch.Generator().manual_seed(5)
    B, N, D = 2, 10, 15       # odd D: the window's peak is on the zero frequency
    h = torch.randn(B, N, D, generator=g)
    # a positive channel-constant token is its own low-pass copy: ratio +inf, every channel votes
    # for it; a negative one gets −inf and no vote (the official ratio is signed)
    h[0, 3], h[0, 6] = 2.5, -2.5
    votes = stability_votes(h)
    torch.testing.assert_close(votes.sum(-1), torch.full((B,), float(N // 2 * D)))
    assert votes[0, 3] == D and votes[0, 6] == 0
    torch.testing.assert_close(stability_votes(h, num_votes=3).sum(-1), torch.full((B,), 3.0 * D))
    cap = _fake_capture([torch.full((B, 1, N + 1, N + 1), 1.0 / (N + 1))],
                        hidden=[torch.cat([torch.zeros(B, 1, D), h], 1)])
    cap.extras["final_norm"] = torch.nn.Identity()
    torch.testing.assert_close(get_target("last_votes")(cap, 1, cap.class_index), votes)


def test_targets_same_alone_and_in_batch(model, images):
    c = torch.tensor([2, 0, 4])
    labels = torch.tensor([1, 0, 3])
    idx = torch.tensor([10, 11, 12])
    together = compute_targets(model, images, ALL_IDS, 1, c, labels, indices=idx)
    for i in range(3):
        alone = compute_targets(model, images[i:i + 1], ALL_IDS, 1, c[i:i + 1], labels[i:i + 1],
                                indices=idx[i:i + 1])
        for t in ALL_IDS:
            torch.testing.assert_close(alone[t], together[t][i:i + 1], rtol=1e-4, atol=1e-6, msg=t)


def test_random_reproducible_by_seed(model, images):
    c = torch.tensor([0, 1, 2])
    idx = torch.tensor([0, 1, 2])
    a = compute_targets(model, images, ["random"], 1, c, indices=idx, seed=7)["random"]
    b = compute_targets(model, images, ["random"], 1, c, indices=idx, seed=7)["random"]
    other = compute_targets(model, images, ["random"], 1, c, indices=idx, seed=8)["random"]
    assert torch.equal(a, b)
    assert not torch.allclose(a, other)
    assert not torch.allclose(a[0], a[1])      # images get different values
    assert ((a >= 0) & (a < 1)).all()


def test_t2_needs_labels_and_gradient_class_checked(model, images):
    c = torch.tensor([0, 1, 2])
    with pytest.raises(ValueError, match="T2 needs labels"):
        compute_targets(model, images, ["T2"], 1, c)
    cap = capture(model, images, c)
    with pytest.raises(ValueError, match="class_index differs"):
        get_target("T5")(cap, 1, torch.tensor([1, 1, 1]))
    with pytest.raises(ValueError, match="depth L must be in 1..3"):
        get_target("T0")(cap, 4, c)


class _SampleList(torch.utils.data.Dataset):
    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.images)

    def __getitem__(self, i):
        from midas_nb.data.sample import Sample
        return Sample(image=self.images[i], label=int(self.labels[i]), parts=torch.zeros(0, 3),
                      box=torch.zeros(4), part_mask=torch.zeros(16, dtype=torch.bool),
                      box_mask=torch.zeros(16, dtype=torch.bool), image_id=str(i), index=i)


def test_cache_round_trip(model, images, tmp_path, monkeypatch):
    ds = _SampleList(images, torch.tensor([1, 0, 3]))
    key = dict(dataset="toy", split="train", checkpoint="tiny-seed0")
    first = target_cache(model, ds, ids=["T0", "T5"], depth=1, class_rule="label", key=key,
                         cache_dir=tmp_path, batch_size=2, progress=False)
    direct = compute_targets(model, images, ["T0", "T5"], 1, torch.tensor([1, 0, 3]))
    for t in ("T0", "T5"):
        torch.testing.assert_close(first[t], direct[t], rtol=1e-4, atol=1e-6)
    files = list((tmp_path / "targets").glob("*.safetensors"))
    assert len(files) == 1 and files[0].with_suffix(".json").exists()

    import midas_nb.targets.cache as targets_mod

    def no_compute(*args, **kwargs):
        raise AssertionError("the cache should have been loaded, not recomputed")

    monkeypatch.setattr(targets_mod, "_capture_and_compute", no_compute)
    second = target_cache(model, ds, ids=["T5", "T0"], depth=1, class_rule="label", key=key,
                          cache_dir=tmp_path, batch_size=2, progress=False)
    for t in ("T0", "T5"):
        assert torch.equal(first[t], second[t])
    monkeypatch.undo()

    # a missing id is added to the same file; a different class rule is a different file
    third = target_cache(model, ds, ids=["T0", "T1"], depth=1, class_rule="label", key=key,
                         cache_dir=tmp_path, batch_size=3, progress=False)
    assert torch.equal(third["T0"], first["T0"]) and third["T1"].shape == (3, 16)
    assert len(list((tmp_path / "targets").glob("*.safetensors"))) == 1
    pred = target_cache(model, ds, ids=["T5"], depth=1, class_rule="prediction", key=key,
                        cache_dir=tmp_path, batch_size=3, progress=False)
    argmax = model(images).argmax(-1)
    torch.testing.assert_close(pred["T5"], compute_targets(model, images, ["T5"], 1, argmax)["T5"],
                               rtol=1e-4, atol=1e-6)
    assert len(list((tmp_path / "targets").glob("*.safetensors"))) == 2
    assert target_cache_path(dict(a=1), tmp_path) != target_cache_path(dict(a=2), tmp_path)


def test_cache_key_carries_target_definitions_version(model, images, tmp_path, monkeypatch):
    # maps cached under an older definition (e.g. TokenTM before version 2) must not be reused
    import midas_nb.targets.cache as targets_mod

    ds = _SampleList(images, torch.tensor([1, 0, 3]))
    key = dict(dataset="toy", split="train", checkpoint="tiny-seed0")
    kw = dict(ids=["tokentm"], depth=1, class_rule="label", key=key, cache_dir=tmp_path, batch_size=3,
              progress=False)
    monkeypatch.setattr(targets_mod, "TARGET_DEFINITIONS_VERSION", 1)
    stale = {"tokentm": torch.zeros(3, 16)}
    monkeypatch.setattr(targets_mod, "_capture_and_compute", lambda *a, **k: {1: stale})
    old = target_cache(model, ds, **kw)
    assert torch.equal(old["tokentm"], stale["tokentm"])
    monkeypatch.undo()
    assert targets_mod.TARGET_DEFINITIONS_VERSION >= 2
    new = target_cache(model, ds, **kw)                     # recomputed, not the stale file
    torch.testing.assert_close(new["tokentm"], compute_targets(model, images, ["tokentm"], 1,
                                                               torch.tensor([1, 0, 3]))["tokentm"])
    files = sorted((tmp_path / "targets").glob("*.json"))
    assert len(files) == 2
    import json
    versions = sorted(json.loads(f.read_text())["target_definitions"] for f in files)
    assert versions == [1, targets_mod.TARGET_DEFINITIONS_VERSION]


def test_targets_of_several_depths_come_from_one_pass_and_equal_one_depth_each(model, images, tmp_path,
                                                                               monkeypatch):
    """``target_caches`` (decision 0069): the maps of every depth from one capture per batch, equal to
    ``target_cache`` at each depth alone (the loss gradient of T2 only where asked), one file per depth."""
    import midas_nb.targets.cache as targets_mod
    from midas_nb.targets import target_caches

    ds = _SampleList(images, torch.tensor([1, 0, 3]))
    kw = dict(class_rule="label", key=dict(dataset="toy"), batch_size=2, progress=False)
    calls = []
    real = targets_mod.capture
    monkeypatch.setattr(targets_mod, "capture", lambda *a, **k: calls.append(k) or real(*a, **k))
    both = target_caches(model, ds, ids_by_depth={1: ["T1", "T2"], 2: ["T5", "tokentm"]}, cache_dir=tmp_path / "a",
                         **kw)
    assert len(calls) == 2 and calls[0]["loss_blocks"] == [0] and calls[0]["prob_grad"]   # 2 batches, 1 pass
    for L, ids in ((1, ["T1", "T2"]), (2, ["T5", "tokentm"])):
        alone = target_cache(model, ds, ids=ids, depth=L, cache_dir=tmp_path / "b", **kw)
        assert list(both[L]) == ids
        for t in ids:
            assert torch.equal(both[L][t], alone[t]), (L, t)
    assert len(list((tmp_path / "a" / "targets").glob("*.safetensors"))) == 2
    monkeypatch.setattr(targets_mod, "_capture_and_compute", lambda *a, **k: pytest.fail("recomputed"))
    again = target_cache(model, ds, ids=["T5"], depth=2, cache_dir=tmp_path / "a", **kw)
    assert torch.equal(again["T5"], both[2]["T5"])
