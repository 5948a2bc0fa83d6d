"""Pruned forward: b=1 is the full model, the sequence after L really is shorter, top-k."""
from __future__ import annotations

import math

import pytest
import timm
import torch

from midas_nb.pruning import (PrunedViT, keep_mask_from_indices, prune_tokens, pruned_forward,
                              record_attention, score_tokens, select_top_k)
from midas_nb.scorers import MLPScorer, RandomScorer, ReferenceScorer
from midas_nb.backbones.vit import classify_tokens, embed_tokens, gather_tokens, run_blocks


def tiny_vit(arch="vit_tiny_patch16_224", **kw):
    torch.manual_seed(0)
    args = dict(pretrained=False, img_size=32, patch_size=8, depth=4, embed_dim=32, num_heads=2,
                num_classes=5)
    args.update(kw)
    return timm.create_model(arch, **args).eval()


MODELS = {
    "cls": lambda: tiny_vit(),                                              # P = 1
    "distilled": lambda: tiny_vit("deit_tiny_distilled_patch16_224"),       # P = 2 (cls + dist)
    "register": lambda: tiny_vit(reg_tokens=1),                             # P = 2 (cls + reg)
}


def scorers(dim):
    torch.manual_seed(2)
    return {"reference": ReferenceScorer(), "mlp": MLPScorer(dim), "random": RandomScorer(0)}


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("scorer_name", ["reference", "mlp", "random"])
def test_budget_one_equals_full_model(name, scorer_name):
    model = MODELS[name]()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        full = model(images)
        out = pruned_forward(model, images, scorers(32)[scorer_name], depth=2, budget=1.0)
    torch.testing.assert_close(out.logits, full, atol=1e-5, rtol=1e-5)
    assert out.keep_mask.all() and out.keep_idx.shape == (3, 16)


@pytest.mark.parametrize("name", list(MODELS))
@pytest.mark.parametrize("budget", [0.25, 0.3, 0.5])
def test_sequence_after_depth_is_prefix_plus_k(name, budget):
    model = MODELS[name]()
    P, N, depth = model.num_prefix_tokens, 16, 2
    seen = {}
    hooks = [model.blocks[i].register_forward_pre_hook(
        lambda m, a, i=i: seen.__setitem__(i, a[0].shape[1])) for i in range(len(model.blocks))]
    with torch.no_grad():
        out = pruned_forward(model, torch.randn(2, 3, 32, 32), scorers(32)["mlp"], depth, budget)
    for h in hooks:
        h.remove()
    k = math.ceil(budget * N)
    assert [seen[i] for i in range(4)] == [P + N] * depth + [P + k] * (4 - depth)
    assert out.keep_idx.shape == (2, k)
    assert out.keep_mask.sum(1).tolist() == [k, k]


@pytest.mark.parametrize("scorer_name", ["reference", "mlp"])
def test_kept_tokens_are_the_top_k_of_the_scores(scorer_name):
    model = MODELS["cls"]()
    with torch.no_grad():
        out = pruned_forward(model, torch.randn(4, 3, 32, 32), scorers(32)[scorer_name], 2, 0.25)
    k = 4
    for b in range(4):
        # independent: every kept score is >= every dropped score, and exactly k are kept
        kept, dropped = out.scores[b][out.keep_mask[b]], out.scores[b][~out.keep_mask[b]]
        assert kept.numel() == k and kept.min() >= dropped.max()
        assert set(out.keep_idx[b].tolist()) == set(torch.argsort(out.scores[b], descending=True)[:k].tolist())
    assert torch.all(out.keep_idx[:, 1:] > out.keep_idx[:, :-1])        # sorted by position


def test_pruned_logits_equal_masked_attention_forward():
    """Independent check of token dropping: a CLS-pooled ViT whose blocks after L mask the
    dropped tokens as keys (-inf bias) gives the same logits as the shortened sequence."""
    model = MODELS["cls"]()
    images = torch.randn(3, 3, 32, 32)
    depth, budget = 2, 0.25
    with torch.no_grad():
        out = pruned_forward(model, images, scorers(32)["mlp"], depth, budget)
        x = run_blocks(model, embed_tokens(model, images), 0, depth)
        bias = torch.zeros(3, 17)
        bias[:, 1:][~out.keep_mask] = float("-inf")
        for blk in model.blocks[depth:]:
            x = blk(x, attn_mask=bias[:, None, None, :])
        masked = classify_tokens(model, x)
    torch.testing.assert_close(out.logits, masked, atol=1e-5, rtol=1e-5)


def test_prune_tokens_from_cached_hidden_matches_pruned_forward():
    model = MODELS["distilled"]()
    images = torch.randn(2, 3, 32, 32)
    scorer = scorers(32)["mlp"]
    with torch.no_grad():
        hidden, scores = score_tokens(model, images, scorer, 3)
        a = prune_tokens(model, hidden, scores, 3, 0.5, return_tokens=True)
        b = pruned_forward(model, images, scorer, 3, 0.5)
        c = PrunedViT(model, scorer, 3, 0.5)(images)
    torch.testing.assert_close(a.logits, b.logits)
    torch.testing.assert_close(c, b.logits)
    assert a.tokens.shape == (2, 2 + 8, 32)
    # the gathered sequence is what the tail ran on
    x = gather_tokens(hidden, a.keep_idx, 2)
    torch.testing.assert_close(classify_tokens(model, run_blocks(model, x, 3, None)), a.logits)


def test_select_top_k_and_mask_hand_example():
    scores = torch.tensor([[0.1, 0.9, 0.3, 0.7], [5.0, -1.0, 2.0, 0.0]])
    idx = select_top_k(scores, 2)
    assert idx.tolist() == [[1, 3], [0, 2]]
    assert keep_mask_from_indices(idx, 4).tolist() == [[False, True, False, True], [True, False, True, False]]
    with pytest.raises(ValueError, match="k must be"):
        select_top_k(scores, 5)


def test_depth_and_budget_are_validated():
    model = MODELS["cls"]()
    images = torch.randn(1, 3, 32, 32)
    for depth in (0, 4):
        with pytest.raises(ValueError, match="depth L must be in 1..3"):
            pruned_forward(model, images, RandomScorer(), depth, 0.5)
    with pytest.raises(ValueError, match="budget"):
        pruned_forward(model, images, RandomScorer(), 2, 0.0)


def test_record_attention_restores_fused_flag():
    model = MODELS["cls"]()
    blk = model.blocks[1]
    blk.attn.fused_attn = True
    with record_attention(blk) as rec:
        assert blk.attn.fused_attn is False
        blk(torch.randn(2, 17, 32))
    assert blk.attn.fused_attn is True
    assert rec["attn"].shape == (2, 2, 17, 17)
    torch.testing.assert_close(rec["attn"].sum(-1), torch.ones(2, 2, 17))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu():
    model = MODELS["cls"]()
    images = torch.randn(2, 3, 32, 32)
    scorer = scorers(32)["mlp"]
    with torch.no_grad():
        cpu = pruned_forward(model, images, scorer, 2, 0.25)
        gpu = pruned_forward(model.cuda(), images.cuda(), scorer.cuda(), 2, 0.25)
    torch.testing.assert_close(gpu.logits.cpu(), cpu.logits, atol=1e-4, rtol=1e-4)
    assert torch.equal(gpu.keep_idx.cpu(), cpu.keep_idx)


# --------------------------------------------------------------------------------------------
# differentiable selection (midas_nb.train.relaxed_logits) and the distillation loss

from midas_nb.train import distill_loss, relaxed_logits, zscore  # noqa: E402


def _hidden_and_scores(model, depth=2, B=3, seed=3):
    torch.manual_seed(seed)
    with torch.no_grad():
        hidden = run_blocks(model, embed_tokens(model, torch.randn(B, 3, 32, 32)), 0, depth)
    scorer = MLPScorer(32)
    return hidden, scorer


def test_st_relaxation_forward_is_the_hard_pruned_forward_and_its_gradient_is_input_x_gradient():
    model = MODELS["cls"]().requires_grad_(False)
    hidden, scorer = _hidden_and_scores(model)
    labels = torch.tensor([0, 3, 1])
    scores = scorer(hidden, 1)
    scores.retain_grad()
    logits = relaxed_logits(model, hidden, scores, 2, 0.25, "st")
    with torch.no_grad():
        hard = prune_tokens(model, hidden, scores, 2, 0.25)
    torch.testing.assert_close(logits, hard.logits)
    loss = torch.nn.functional.cross_entropy(logits, labels)
    loss.backward()
    g = scores.grad
    assert torch.isfinite(g).all()
    assert (g[hard.keep_mask] != 0).all() and (g[~hard.keep_mask] == 0).all()
    # independent: <dL/dx_j, x_j> for the kept tokens of the hard pruned forward
    x = gather_tokens(hidden, hard.keep_idx, 1).clone().requires_grad_(True)
    loss2 = torch.nn.functional.cross_entropy(classify_tokens(model, run_blocks(model, x, 2, None)), labels)
    (gx,) = torch.autograd.grad(loss2, x)
    ixg = (gx[:, 1:] * x[:, 1:]).sum(-1)                   # [B,k]
    torch.testing.assert_close(g.gather(1, hard.keep_idx), ixg, atol=1e-6, rtol=1e-4)
    # and the gradient reaches the scorer's parameters
    grads = [p.grad for p in scorer.parameters()]
    assert all(gr is not None and torch.isfinite(gr).all() for gr in grads)
    assert any(gr.abs().sum() > 0 for gr in grads)


def test_soft_relaxation_gives_every_token_a_gradient():
    model = MODELS["cls"]().requires_grad_(False)
    hidden, scorer = _hidden_and_scores(model)
    scores = scorer(hidden, 1)
    scores.retain_grad()
    logits = relaxed_logits(model, hidden, scores, 2, 0.25, "soft")
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 3, 1])).backward()
    g = scores.grad
    keep = keep_mask_from_indices(select_top_k(scores, 4), 16)
    assert torch.isfinite(g).all()
    assert (g[~keep] != 0).all() and (g[keep] != 0).all()    # dropped tokens too
    assert all(p.grad is not None and p.grad.abs().sum() > 0 for p in scorer.parameters())


def test_soft_relaxation_tends_to_hard_pruning_as_the_mask_sharpens():
    model = MODELS["cls"]()
    hidden, scorer = _hidden_and_scores(model)
    with torch.no_grad():
        scores = scorer(hidden, 1)
        hard = prune_tokens(model, hidden, scores, 2, 0.25).logits
        sharp = relaxed_logits(model, hidden, scores, 2, 0.25, "soft", mask_temperature=1e-4)
        blunt = relaxed_logits(model, hidden, scores, 2, 0.25, "soft", mask_temperature=10.0)
    torch.testing.assert_close(sharp, hard, atol=1e-4, rtol=1e-4)
    assert (blunt - hard).abs().max() > 1e-3


def test_soft_relaxation_math_kernel_matches_the_default_kernel():
    """The CUDA guard (math SDPA kernel) computes the same logits and score gradients."""
    from midas_nb.backbones.vit import math_sdpa as _math_sdpa
    model = MODELS["cls"]().requires_grad_(False)
    hidden, scorer = _hidden_and_scores(model)
    out = []
    for math_only in (False, True):
        scores = scorer(hidden, 1).detach().requires_grad_(True)
        with _math_sdpa(math_only):
            logits = relaxed_logits(model, hidden, scores, 2, 0.25, "soft")
        (g,) = torch.autograd.grad(logits.logsumexp(-1).sum(), scores)
        out.append((logits.detach(), g))
    torch.testing.assert_close(out[0][0], out[1][0], atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out[0][1], out[1][1], atol=1e-5, rtol=1e-4)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA (the kernel choice only matters there)")
def test_soft_relaxation_backward_runs_on_cuda():
    model = MODELS["cls"]().requires_grad_(False)
    hidden, scorer = _hidden_and_scores(model)  # built on the CPU, then moved with the model
    model = model.cuda()
    scores = scorer(hidden, 1).detach().cuda().requires_grad_(True)
    logits = relaxed_logits(model, hidden.cuda(), scores, 2, 0.25, "soft")
    (g,) = torch.autograd.grad(logits.logsumexp(-1).sum(), scores)
    assert torch.isfinite(g).all() and (g != 0).any()


def test_soft_relaxation_refuses_average_pooling():
    model = MODELS["cls"]()
    model.global_pool = "avg"
    hidden, scorer = _hidden_and_scores(model)
    with pytest.raises(ValueError, match="CLS pooling"):
        relaxed_logits(model, hidden, scorer(hidden, 1), 2, 0.25, "soft")


def test_kl_distillation_is_zero_at_the_zscored_target_and_matches_the_formula():
    torch.manual_seed(0)
    target = torch.rand(4, 10) * 5
    z = (target - target.mean(1, keepdim=True)) / target.std(1, unbiased=False, keepdim=True)
    torch.testing.assert_close(zscore(target), z, atol=1e-5, rtol=1e-5)
    assert distill_loss(z, target).abs() < 1e-6
    assert distill_loss(z + 3.0, target).abs() < 1e-6           # softmax is shift-invariant
    for tau in (0.5, 1.0, 2.0):
        scores = torch.randn(4, 10)
        p = torch.softmax(z / tau, 1)
        q = torch.softmax(scores / tau, 1)
        expected = (p * (p.log() - q.log())).sum(1).mean()
        torch.testing.assert_close(distill_loss(scores, target, "kl", tau), expected, atol=1e-5, rtol=1e-5)
        assert distill_loss(scores, target, "kl", tau) > distill_loss(z, target, "kl", tau)


def test_kl_distillation_minimum_by_gradient_descent_is_the_zscored_target():
    torch.manual_seed(1)
    target = torch.rand(2, 8)
    s = torch.zeros(2, 8, requires_grad=True)
    opt = torch.optim.Adam([s], lr=0.1)
    for _ in range(500):
        opt.zero_grad()
        distill_loss(s, target).backward()
        opt.step()
    torch.testing.assert_close(zscore(s.detach()), zscore(target), atol=1e-2, rtol=1e-2)


def test_mse_and_rank_distillation_forms():
    torch.manual_seed(2)
    target = torch.rand(3, 12)
    assert distill_loss(2.0 * target + 1.0, target, "mse_z") < 1e-8
    assert distill_loss(-target, target, "mse_z") > 3.9                   # z(-T) = -z(T): mean (2z)^2 = 4
    good = distill_loss(50 * target, target, "rank")
    bad = distill_loss(-50 * target, target, "rank")
    assert good < 0.05 < 1.0 < bad
    # hand example: two tokens, T = [1, 0], s = [0, 0] -> one pair, softplus(0) = log 2
    torch.testing.assert_close(distill_loss(torch.zeros(1, 2), torch.tensor([[1.0, 0.0]]), "rank"),
                               torch.tensor(math.log(2.0)))
    with pytest.raises(ValueError, match="unknown distillation form"):
        distill_loss(target, target, "l1")
