"""Tests of midas_nb.capture against independent recomputations.

Independent reference: a hand-written forward of every timm block from its own weights
(LayerNorm → qkv → softmax(QKᵀ/√d) → AV → proj → residual → MLP → residual) that exposes the
attention matrices as graph nodes, differentiated with ``torch.autograd.grad`` directly.
"""
from __future__ import annotations

import gc
import math
import weakref

import pytest
import timm
import torch
import torch.nn.functional as F

from midas_nb.capture import Capture, capture
from midas_nb.backbones.vit import classify_tokens, embed_tokens, gather_tokens, run_blocks

ATOL = 1e-5


def tiny_vit(distilled: bool = False, num_classes: int = 5, depth: int = 3) -> torch.nn.Module:
    torch.manual_seed(0)
    name = "deit_tiny_distilled_patch16_224" if distilled else "vit_tiny_patch16_224"
    model = timm.create_model(name, pretrained=False, img_size=32, patch_size=8, depth=depth,
                              num_classes=num_classes, embed_dim=48, num_heads=3)
    # non-trivial weights: random init of timm leaves biases at 0 and the head tiny
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def images(batch: int = 3, seed: int = 1) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(batch, 3, 32, 32, generator=g)


def manual_block(blk, x: torch.Tensor, A: torch.Tensor | None = None):
    """One pre-norm ViT block from its weights; returns ``(output, A)``."""
    B, T, D = x.shape
    H = blk.attn.num_heads
    d = D // H
    y = blk.norm1(x)
    qkv = F.linear(y, blk.attn.qkv.weight, blk.attn.qkv.bias).reshape(B, T, 3, H, d)
    q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))  # [B,H,T,d]
    if A is None:
        A = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(d), dim=-1)
    o = (A @ v).transpose(1, 2).reshape(B, T, D)
    x = x + F.linear(o, blk.attn.proj.weight, blk.attn.proj.bias)
    return x + blk.mlp(blk.norm2(x)), A


def manual_forward(model, x, prune=None):
    """Manual forward from tokens; ``prune=(L, keep_idx, P)`` drops tokens after block L."""
    As, hs = [], []
    for i, blk in enumerate(model.blocks):
        if prune is not None and i == prune[0]:
            x = gather_tokens(x, prune[1], prune[2])
        x, A = manual_block(blk, x)
        As.append(A)
        hs.append(x)
    return classify_tokens(model, x), As, hs


def count_hooks(model) -> int:
    return sum(len(m._forward_hooks) + len(m._forward_pre_hooks) + len(m._backward_hooks)
               for m in model.modules())


@pytest.mark.parametrize("distilled", [False, True], ids=["cls", "distilled"])
def test_attention_equals_softmax_qk_from_block_weights(distilled):
    model = tiny_vit(distilled)
    x = images()
    res = capture(model, x, class_index=torch.tensor([0, 1, 2]))
    P = 2 if distilled else 1
    assert res.num_prefix_tokens == P and res.grid_size == (4, 4)
    assert res.num_blocks == 3
    for b, blk in enumerate(model.blocks):
        assert res.attn[b].shape == (3, 3, P + 16, P + 16)
        out, A = manual_block(blk, res.hidden_in[b])
        torch.testing.assert_close(res.attn[b], A, atol=ATOL, rtol=0)
        torch.testing.assert_close(res.hidden[b], out, atol=ATOL, rtol=0)
        torch.testing.assert_close(res.attn[b].sum(-1), torch.ones(3, 3, P + 16), atol=ATOL, rtol=0)
        if b + 1 < res.num_blocks:
            torch.testing.assert_close(res.hidden_in[b + 1], res.hidden[b])
    # the first block's input is the embedding; the logits are the model's
    torch.testing.assert_close(res.hidden_in[0], embed_tokens(model, x).detach())
    with torch.no_grad():
        torch.testing.assert_close(res.logits, model(x), atol=ATOL, rtol=0)


@pytest.mark.parametrize("distilled", [False, True], ids=["cls", "distilled"])
def test_gradients_equal_direct_autograd(distilled):
    model = tiny_vit(distilled)
    x = images()
    c = torch.tensor([4, 0, 2])
    labels = torch.tensor([1, 0, 3])
    res = capture(model, x, class_index=c, labels=labels)

    tokens = embed_tokens(model, x).detach()
    logits, As, hs = manual_forward(model, tokens)
    y = logits.gather(1, c[:, None]).sum()
    g = torch.autograd.grad(y, As + hs, retain_graph=True)
    loss = F.cross_entropy(logits, labels, reduction="sum")
    gl = torch.autograd.grad(loss, As + hs)
    n = len(As)
    for b in range(n):
        torch.testing.assert_close(res.attn_grad[b], g[b], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(res.hidden_grad[b], g[n + b], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(res.attn_grad_loss[b], gl[b], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(res.hidden_grad_loss[b], gl[n + b], atol=ATOL, rtol=1e-4)
    # the last block's patch tokens do not reach the CLS-pooled logits: zero gradient there
    P = model.num_prefix_tokens
    assert torch.count_nonzero(res.hidden_grad[-1][:, P:]) == 0
    assert torch.count_nonzero(res.hidden_grad[0]) > 0
    # logit gradients are of y_c for the requested class: differ from the loss gradients
    assert not torch.allclose(res.hidden_grad[0], res.hidden_grad_loss[0])


def test_default_class_is_prediction_and_loss_blocks_subset():
    model = tiny_vit()
    x = images()
    res = capture(model, x, labels=torch.tensor([0, 1, 2]), loss_blocks=[2])
    torch.testing.assert_close(res.class_index, res.logits.argmax(-1))
    assert res.attn_grad_loss[0] is None and res.attn_grad_loss[1] is None
    full = capture(model, x, labels=torch.tensor([0, 1, 2]))
    torch.testing.assert_close(res.attn_grad_loss[2], full.attn_grad_loss[2])
    torch.testing.assert_close(res.hidden_grad_loss[2], full.hidden_grad_loss[2])


def test_hooks_removed_and_mode_restored():
    model = tiny_vit()
    before = count_hooks(model)
    with Capture(model) as cap:
        assert count_hooks(model) > before
        with torch.no_grad():
            model(images())
        assert all(a is not None for a in cap.records["attn"])
    assert count_hooks(model) == before
    model.train()
    capture(model, images())
    assert count_hooks(model) == before
    assert model.training, "capture must restore the caller's train/eval mode"
    # an exception inside the context still removes the hooks
    with pytest.raises(RuntimeError, match="boom"):
        with Capture(model):
            raise RuntimeError("boom")
    assert count_hooks(model) == before


def test_results_do_not_depend_on_batch_composition():
    model = tiny_vit()
    x = images(4)
    c = torch.tensor([3, 1, 0, 2])
    labels = torch.tensor([0, 1, 2, 3])
    batch = capture(model, x, class_index=c, labels=labels)
    for i in (0, 2):
        alone = capture(model, x[i:i + 1], class_index=c[i:i + 1], labels=labels[i:i + 1])
        for field in ("attn", "attn_grad", "attn_grad_loss", "hidden", "hidden_grad", "hidden_grad_loss",
                      "attn_in", "attn_out", "mlp_in", "mlp_out"):
            for b in range(batch.num_blocks):
                torch.testing.assert_close(getattr(batch, field)[b][i:i + 1], getattr(alone, field)[b],
                                           atol=ATOL, rtol=1e-4, msg=f"{field}[{b}] image {i}")
    # and a different companion image leaves image 0 unchanged
    other = capture(model, torch.cat([x[:1], images(1, seed=9)]), class_index=torch.tensor([3, 0]))
    torch.testing.assert_close(other.attn_grad[1][:1], batch.attn_grad[1][:1], atol=ATOL, rtol=1e-4)


def test_tokentm_inputs_and_outputs():
    model = tiny_vit()
    res = capture(model, images())
    for b, blk in enumerate(model.blocks):
        with torch.no_grad():
            torch.testing.assert_close(res.attn_in[b], blk.norm1(res.hidden_in[b]))
            torch.testing.assert_close(res.attn_out[b], blk.attn(res.attn_in[b]), atol=ATOL, rtol=0)
            mid = res.hidden_in[b] + res.attn_out[b]
            torch.testing.assert_close(res.mlp_in[b], blk.norm2(mid), atol=ATOL, rtol=0)
            torch.testing.assert_close(res.hidden[b], mid + res.mlp_out[b], atol=ATOL, rtol=0)
            torch.testing.assert_close(res.hidden_mid[b], mid, atol=ATOL, rtol=0)
            # each token's own value through the output projection, from the block's weights
            B, T, D = res.hidden_in[b].shape
            qkv = F.linear(res.attn_in[b], blk.attn.qkv.weight, blk.attn.qkv.bias).reshape(B, T, 3, D)
            own = F.linear(qkv[:, :, 2], blk.attn.proj.weight, blk.attn.proj.bias)
            torch.testing.assert_close(res.value_proj[b], own, atol=ATOL, rtol=0)
            # the MHSA output is each head's attention-weighted mix of those values
            H = blk.attn.num_heads
            v = qkv[:, :, 2].reshape(B, T, H, D // H).transpose(1, 2)
            mixed = (res.attn[b] @ v).transpose(1, 2).reshape(B, T, D)
            torch.testing.assert_close(res.attn_out[b], F.linear(mixed, blk.attn.proj.weight, blk.attn.proj.bias),
                                       atol=ATOL, rtol=0)
    assert res.attn_grad_prob == [None] * len(model.blocks)        # only captured with prob_grad=True


def test_probability_gradient_by_autograd():
    model = tiny_vit()
    x, c = images(), torch.tensor([0, 3, 1])
    res = capture(model, x, class_index=c, labels=torch.tensor([1, 1, 2]), prob_grad=True)
    logits, As, _ = manual_forward(model, embed_tokens(model, x))
    grads = torch.autograd.grad(logits.softmax(-1).gather(1, c[:, None]).sum(), As)
    for b, g in enumerate(grads):
        torch.testing.assert_close(res.attn_grad_prob[b], g, atol=1e-6, rtol=1e-4)
    assert not torch.allclose(res.attn_grad_prob[-1], res.attn_grad[-1])


@pytest.mark.parametrize("distilled", [False, True], ids=["cls", "distilled"])
def test_pruned_sequence_via_forward_fn(distilled):
    model = tiny_vit(distilled)
    P = model.num_prefix_tokens
    x = images()
    keep = torch.tensor([[0, 5, 9, 15], [1, 2, 3, 4], [15, 14, 7, 6]])
    L = 1

    def pruned(m, tokens):
        t = run_blocks(m, tokens, 0, L)
        t = gather_tokens(t, keep, P)
        return classify_tokens(m, run_blocks(m, t, L))

    c = torch.tensor([1, 2, 3])
    res = capture(model, x, class_index=c, forward_fn=pruned)
    assert res.attn[0].shape[-1] == P + 16
    assert res.attn[1].shape[-1] == P + 4 and res.hidden[2].shape[1] == P + 4
    for b in range(res.num_blocks):
        _, A = manual_block(model.blocks[b], res.hidden_in[b])
        torch.testing.assert_close(res.attn[b], A, atol=ATOL, rtol=0)
    logits, As, hs = manual_forward(model, embed_tokens(model, x).detach(), prune=(L, keep, P))
    torch.testing.assert_close(res.logits, logits.detach(), atol=ATOL, rtol=0)
    g = torch.autograd.grad(logits.gather(1, c[:, None]).sum(), As + hs)
    for b in range(res.num_blocks):
        torch.testing.assert_close(res.attn_grad[b], g[b], atol=ATOL, rtol=1e-4)
        torch.testing.assert_close(res.hidden_grad[b], g[res.num_blocks + b], atol=ATOL, rtol=1e-4)
    # dropped tokens of block L's output get no gradient
    dropped = torch.ones(3, 16, dtype=torch.bool)
    dropped[torch.arange(3)[:, None], keep] = False
    assert torch.count_nonzero(res.hidden_grad[L - 1][:, P:][dropped]) == 0


def test_no_graph_kept_alive():
    model = tiny_vit()
    ref = {}

    def fwd(m, tokens):
        out = run_blocks(m, tokens)
        ref["last"] = weakref.ref(out)
        return classify_tokens(m, out)

    res = capture(model, images(), forward_fn=fwd)
    gc.collect()
    # the last block's output is saved by the final LayerNorm's backward: it dies with the graph
    assert ref["last"]() is None, "the autograd graph outlived capture()"
    for name in ("logits", "attn", "attn_grad", "hidden", "hidden_grad", "hidden_in", "mlp_out"):
        v = getattr(res, name)
        for t in (v if isinstance(v, list) else [v]):
            assert not t.requires_grad and t.grad_fn is None, name
    assert all(p.grad is None for p in model.parameters()), "capture must not accumulate .grad"


def test_capture_rejects_missing_input():
    with pytest.raises(ValueError, match="images"):
        capture(tiny_vit(), None)
