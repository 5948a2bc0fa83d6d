"""Related systems: Cropr, IA-RED², LaSt-ViT aggregation, TokenTM's perturbation tests, the table."""
from __future__ import annotations

import functools
import math
import os

import numpy as np
import pandas as pd
import pytest
import timm
import torch
import torch.nn.functional as F
from torch import nn

from midas_nb.backbones import ATTENTION_KERNEL, UNFUSED_ATTENTION_KERNEL
from midas_nb.metrics import patch_score
from midas_nb.analysis.protocol import list_conditions, run_protocol
from midas_nb.pruning import prune_tokens, pruned_forward, score_tokens
from midas_nb.scorers import CroprScorer, IARedScorer, bernoulli_log_prob, cropr_forward, iared_reward, masked_logits, prune_tokens_llf, reinforce_loss
from midas_nb.analysis.last import LaStViT, last_aggregate, last_finetune, pib_table, token_stability
from midas_nb.metrics.perturbation import perturbation_table, perturbation_test
from midas_nb.analysis.related import related_table
from midas_nb.results import make_table
from midas_nb.scorers import build_scorer, list_scorer_conditions
from midas_nb.backbones.vit import embed_tokens, run_blocks
from tiny_data import TinyDataset


def tiny_vit(**kw):
    torch.manual_seed(0)
    args = dict(pretrained=False, img_size=32, patch_size=8, depth=3, embed_dim=32, num_heads=2,
                num_classes=4)
    args.update(kw)
    return timm.create_model("vit_tiny_patch16_224", **args).eval()




# ------------------------------------------------------------------------------ toy model
KEY_TOKEN = 5          # the decisive patch token of the toy model
SPIKE = 5.0


class SumBlock(nn.Module):
    """CLS channel 0 += Σ over the present patch tokens of channel 0 (honours a key mask)."""

    def forward(self, x, attn_mask=None):
        w = torch.ones(x.shape[0], x.shape[1] - 1, dtype=x.dtype, device=x.device)
        if attn_mask is not None:
            w = torch.isfinite(attn_mask[:, 0, 0, 1:]).to(x.dtype)
        out = x.clone()
        out[:, 0, 0] = x[:, 0, 0] + (x[:, 1:, 0] * w).sum(1)
        return out


class IdentityBlock(nn.Module):
    def forward(self, x, attn_mask=None):
        return x


def decisive_token_vit(n_blocks: int = 1) -> nn.Module:
    """A timm ViT (4×4 grid, D=8) that predicts class 0 iff patch token ``KEY_TOKEN`` is present.

    Patch embedding and CLS are zero, the position embedding puts ``SPIKE`` in channel 0 of
    ``KEY_TOKEN``; the last block adds channel 0 of the patch tokens to the CLS token; the head
    reads ``logit_0 = CLS_0`` and ``logit_1 = SPIKE / 2``.
    """
    m = tiny_vit(embed_dim=8, num_heads=1, depth=n_blocks, num_classes=2)
    with torch.no_grad():
        m.patch_embed.proj.weight.zero_()
        m.patch_embed.proj.bias.zero_()
        m.cls_token.zero_()
        m.pos_embed.zero_()
        m.pos_embed[0, 1 + KEY_TOKEN, 0] = SPIKE
        m.head.weight.zero_()
        m.head.weight[0, 0] = 1.0
        m.head.bias.copy_(torch.tensor([0.0, SPIKE / 2]))
    m.blocks = nn.Sequential(*([IdentityBlock() for _ in range(n_blocks - 1)] + [SumBlock()]))
    m.norm = nn.Identity()
    return m.eval()


# ------------------------------------------------------------------------------ registry
def test_cropr_and_iared_are_protocol_conditions():
    assert {"cropr", "iared"} <= set(list_scorer_conditions())
    assert {"cropr", "iared"} <= set(list_conditions())
    assert isinstance(build_scorer("cropr", 48, num_classes=3), CroprScorer)
    assert isinstance(build_scorer("iared", 48, num_classes=3), IARedScorer)


# ------------------------------------------------------------------------------ Cropr
class OfficialCroprCrossAttention(nn.Module):
    """``benbergner/cropr``, ``cls/cropr.py``: ``CrossAttention`` (``training=True``, no
    norm/projections as in ``cls/main.py``'s defaults) and ``ClassificationHead``, forwards copied;
    weights are loaded from the package's module below."""

    def __init__(self, embed_dim, num_heads, mlp_ratio, num_classes):
        super().__init__()
        self.num_queries, self.head_dim = 1, embed_dim // num_heads
        self.scale = self.head_dim ** -0.5
        self.queries = nn.Parameter(torch.empty(1, 1, embed_dim))
        self.q = self.k = self.v = self.attn_norm = nn.Identity()
        self.proj = nn.Linear(embed_dim, embed_dim) if num_heads > 1 else nn.Identity()
        self.mlp_norm = nn.LayerNorm(embed_dim, eps=1e-6)
        self.mlp = timm.layers.Mlp(embed_dim, int(embed_dim * mlp_ratio))
        self.head = nn.Sequential()
        self.head.norm = nn.LayerNorm(embed_dim)
        self.head.head = nn.Linear(embed_dim, num_classes)

    def forward_scorer(self, x):
        B, N = x.shape[:2]
        x = self.attn_norm(x)
        q_in = self.queries.expand(B, -1, -1)
        q = self.q(q_in).reshape(B, self.num_queries, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(B, N, -1, self.head_dim).transpose(1, 2)
        attn = q @ k.transpose(-2, -1)
        scores = attn.sum((1, 2))
        return scores

    def forward(self, x):
        B, N, D = x.shape
        x = self.attn_norm(x)
        q_in = self.queries.expand(B, -1, -1)
        M = q_in.shape[1]
        q = self.q(q_in).reshape(B, M, -1, self.head_dim).transpose(1, 2)
        k = self.k(x).reshape(B, N, -1, self.head_dim).transpose(1, 2)
        v = self.v(x).reshape(B, N, -1, self.head_dim).transpose(1, 2)
        attn = q @ k.transpose(-2, -1)  # B, H, M, N
        attn_sm = (attn * self.scale).softmax(dim=-1)
        x = attn_sm @ v
        x = x.transpose(1, 2).reshape(B, M, D).squeeze(1)
        x = self.proj(x)
        if hasattr(self, "mlp"):
            x = x + self.mlp(self.mlp_norm(x))
        scores = attn.sum((1, 2))  # B, N
        return x, scores

    def prune(self, x, scores, pruning_rate):          # ``Cropr.prune`` with ``scores[:, 0] = inf``
        scores = scores.clone()
        scores[:, 0] = math.inf
        M = x.shape[1]
        num_keep = M - pruning_rate
        idx = torch.argsort(scores, dim=1, descending=True, stable=False)
        return idx[:, :num_keep]


def official_cropr(scorer: CroprScorer) -> OfficialCroprCrossAttention:
    """The official module carrying ``scorer``'s weights (state-dict mapping of the names)."""
    off = OfficialCroprCrossAttention(scorer.dim, scorer.num_heads, scorer.mlp_ratio, scorer.num_classes)
    sd = {k.replace("head_norm.", "head.norm.").replace("head.weight", "head.head.weight")
          .replace("head.bias", "head.head.bias"): v for k, v in scorer.state_dict().items()}
    off.load_state_dict(sd, strict=True)
    return off.eval()


@functools.lru_cache(maxsize=1)
def vit64() -> nn.Module:
    """A random timm ViT-Ti at 64 px (4×4 patch grid, D = 192, 3 heads)."""
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=64, num_classes=10).eval()


def vit64_tokens(n_images: int = 3, depth: int = 2, seed: int = 0) -> torch.Tensor:
    """Block-``depth`` tokens ``[B,1+16,192]`` of :func:`vit64` on random images (``seed``)."""
    images = torch.randn(n_images, 3, 64, 64, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return run_blocks(vit64(), embed_tokens(vit64(), images), 0, depth)


@pytest.mark.parametrize("num_heads", [1, 3])
def test_cropr_equals_the_official_cross_attention(num_heads):
    hidden = vit64_tokens()
    torch.manual_seed(1)
    scorer = CroprScorer(192, num_classes=10, num_heads=num_heads).eval()
    if num_heads == 1:                                          # the official defaults
        assert isinstance(scorer.proj, nn.Identity) and scorer.mlp.fc1.out_features == 4 * 192
    off = official_cropr(scorer)
    with torch.no_grad():
        ours = scorer(hidden, 1)
        torch.testing.assert_close(ours, off.forward_scorer(hidden)[:, 1:])
        x_aggr, scores = off(hidden)
        torch.testing.assert_close(ours, scores[:, 1:])
        torch.testing.assert_close(scorer.aux_logits(hidden, 1), off.head.head(off.head.norm(x_aggr)))
        for budget in (0.25, 0.5):                              # the same kept tokens at each budget
            k = math.ceil(budget * 16)
            kept = off.prune(hidden, scores, 17 - (1 + k))[:, 1:] - 1
            assert torch.equal(ours.topk(k, dim=1).indices.sort(1).values, kept.sort(1).values)


def test_cropr_loss_leaves_the_backbone_without_gradient():
    model = tiny_vit()
    model.train()
    for p in model.parameters():
        p.requires_grad_(True)
    images, labels = torch.randn(4, 3, 32, 32), torch.tensor([0, 1, 2, 3])
    hidden = run_blocks(model, embed_tokens(model, images), 0, 1)              # graph to the backbone
    assert hidden.requires_grad
    torch.manual_seed(1)
    scorer = CroprScorer(32, num_classes=4, num_heads=2)
    loss, logits, scores = scorer.training_loss(model, hidden, labels, depth=1, budget=0.5, num_prefix=1)
    assert logits.shape == (4, 4) and scores.shape == (4, 16)
    loss.backward()
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())
    assert scorer.queries.grad is not None and scorer.queries.grad.abs().sum() > 0
    assert scorer.mlp.fc1.weight.grad.abs().sum() > 0 and scorer.head.weight.grad.abs().sum() > 0


def test_family_readouts_are_the_families_own_forwards():
    """metrics.family_readout: Cropr's LLF accuracy at L = n−1 is the full model's (nothing is pruned
    before the fused final block) and its aux accuracy the auxiliary head's; IA-RED²'s threshold rule
    keeps the tokens with π > 0.5 (here 3 of 16) and scores masked_logits; other scorers add nothing."""
    from midas_nb.metrics import family_readout
    from midas_nb.scorers import ReferenceScorer
    model, images, labels = tiny_vit(depth=4), torch.randn(6, 3, 32, 32), torch.tensor([0, 1, 2, 3, 0, 1])
    torch.manual_seed(2)
    cropr = CroprScorer(32, num_classes=4, num_heads=2).eval()
    with torch.no_grad():
        hidden, scores = score_tokens(model, images, cropr, 3)
        out = family_readout(cropr, model, hidden, labels, scores, depth=3, budget=0.25, num_prefix=1)
        assert out["accuracy_llf"] == pytest.approx(float((model(images).argmax(-1) == labels).float().mean()))
        assert out["aux_accuracy"] == float((cropr.aux_logits(hidden, 1).argmax(-1) == labels).float().mean())
        assert out["accuracy_llf_lo"] <= out["accuracy_llf"] <= out["accuracy_llf_hi"] and "throughput_llf" not in out
        iared, probs = IARedScorer(32, num_heads=2, seed=0), torch.full((6, 16), 0.4)
        probs[:, :3] = 0.9
        out = family_readout(iared, model, hidden, labels, probs, depth=3, budget=0.25, num_prefix=1)
        keep = torch.zeros(6, 16, dtype=torch.bool)
        keep[:, :3] = True
        expected = (masked_logits(model, hidden, keep, 3).argmax(-1) == labels).float().mean()
    assert out["threshold_keep_rate"] == pytest.approx(3 / 16) and out["threshold"] == 0.5
    assert out["threshold_accuracy"] == pytest.approx(float(expected))
    assert family_readout(ReferenceScorer(), model, hidden, labels, scores, depth=3, budget=0.25, num_prefix=1) == {}


def test_cropr_last_layer_fusion():
    model = tiny_vit(depth=4)
    torch.manual_seed(2)
    scorer = CroprScorer(32, num_classes=4, num_heads=2).eval()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        full = model(images)
        # L = depth-1: nothing is pruned before the fused final block, so LLF is the full model
        torch.testing.assert_close(cropr_forward(model, images, scorer, 3, 0.25, fusion=True).logits, full,
                                   atol=1e-5, rtol=1e-5)
        torch.testing.assert_close(cropr_forward(model, images, scorer, 1, 1.0, fusion=True).logits, full,
                                   atol=1e-5, rtol=1e-5)
        plain = cropr_forward(model, images, scorer, 1, 0.25)
        torch.testing.assert_close(plain.logits, pruned_forward(model, images, scorer, 1, 0.25).logits)
        # by hand: kept tokens through blocks 2..3, all tokens (pruned ones at their block-1 state)
        # through block 4
        hidden, scores = score_tokens(model, images, scorer, 1)
        fused = prune_tokens_llf(model, hidden, scores, 1, 0.25)
        keep = scores.topk(4, dim=1).indices.sort(1).values
        x = hidden.clone()
        kept = torch.cat([hidden[:, :1], torch.stack([hidden[b, 1 + keep[b]] for b in range(3)])], 1)
        kept = model.blocks[2](model.blocks[1](kept))
        x[:, 0] = kept[:, 0]
        for b in range(3):
            x[b, 1 + keep[b]] = kept[b, 1:]
        expected = model.forward_head(model.norm(model.blocks[3](x)))
        torch.testing.assert_close(fused.logits, expected, atol=1e-5, rtol=1e-5)
        assert torch.equal(fused.keep_idx, plain.keep_idx)


# ------------------------------------------------------------------------------ IA-RED²
def test_masked_logits_equal_token_dropping():
    model = tiny_vit()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        hidden = run_blocks(model, embed_tokens(model, images), 0, 1)
        scores = torch.randn(3, 16)
        out = prune_tokens(model, hidden, scores, 1, 0.25)
        torch.testing.assert_close(masked_logits(model, hidden, out.keep_mask, 1), out.logits,
                                   atol=1e-5, rtol=1e-5)
        # a different number of kept tokens per image: each row equals its own token dropping
        keep = torch.rand(3, 16, generator=torch.Generator().manual_seed(0)) < torch.tensor([[0.2], [0.5], [0.9]])
        got = masked_logits(model, hidden, keep, 1)
        for b in range(3):
            idx = keep[b].nonzero().squeeze(1)[None]
            ref = prune_tokens(model, hidden[b:b + 1], keep[b:b + 1].float(), 1, idx.shape[1] / 16).logits
            torch.testing.assert_close(got[b:b + 1], ref, atol=1e-5, rtol=1e-5)


def test_reward_and_reinforce_loss_by_hand():
    r = iared_reward(torch.tensor([True, True, False]), torch.tensor([0.5, 0.1, 0.2]), penalty=2.0)
    torch.testing.assert_close(r, torch.tensor([0.75, 0.99, -2.0]))
    log_prob = torch.tensor([-1.0, -2.0, -3.0], requires_grad=True)
    loss = reinforce_loss(log_prob, r)
    loss.backward()
    torch.testing.assert_close(log_prob.grad, -(r - r.mean()) / 3)
    probs = torch.tensor([[0.2, 0.9]])
    torch.testing.assert_close(bernoulli_log_prob(probs, torch.tensor([[True, False]])),
                               torch.tensor([math.log(0.2) + math.log(0.1)]))


def test_reinforce_step_raises_the_keep_probability_of_the_decisive_token():
    model = decisive_token_vit(n_blocks=2)                     # block 1 identity, block 2 decides
    g = torch.Generator().manual_seed(0)
    one = torch.zeros(1, 17, 8)
    one[0, 1:, 1:] = torch.randn(16, 7, generator=g)          # distinct tokens, channel 0 free
    one[0, 1 + KEY_TOKEN, 0] = SPIKE
    hidden, labels = one.expand(128, -1, -1).clone(), torch.zeros(128, dtype=torch.long)
    with torch.no_grad():                                      # the toy model: correct iff kept
        keep = torch.ones(1, 16, dtype=torch.bool)
        assert masked_logits(model, one, keep, 1).argmax(-1).item() == 0
        keep[0, KEY_TOKEN] = False
        assert masked_logits(model, one, keep, 1).argmax(-1).item() == 1
    torch.manual_seed(3)
    scorer = IARedScorer(8, num_heads=2, seed=0)
    opt = torch.optim.SGD(scorer.parameters(), lr=0.5)
    before = scorer(one, 1)[0].detach()
    loss, logits, probs = scorer.training_loss(model, hidden, labels, depth=1, budget=0.25, num_prefix=1)
    correct = logits.argmax(-1) == 0                            # the samples saw both outcomes
    assert 0 < int(correct.sum()) < 128
    opt.zero_grad()
    loss.backward()
    opt.step()
    after = scorer(one, 1)[0].detach()
    assert after[KEY_TOKEN] > before[KEY_TOKEN] + 1e-3, (before[KEY_TOKEN], after[KEY_TOKEN])
    # the opposite reward (penalise correct predictions) lowers it: the sign follows the reward
    torch.manual_seed(3)
    flipped = IARedScorer(8, num_heads=2, seed=0)
    opt = torch.optim.SGD(flipped.parameters(), lr=0.5)
    probs = flipped(hidden, 1)
    keep = flipped.sample_keep(probs)
    with torch.no_grad():
        ok = masked_logits(model, hidden, keep, 1).argmax(-1) == 0
    loss = reinforce_loss(bernoulli_log_prob(probs, keep), (~ok).float())
    opt.zero_grad()
    loss.backward()
    opt.step()
    assert flipped(one, 1)[0, KEY_TOKEN] < before[KEY_TOKEN] - 1e-3


class OfficialPerBlockAgent(nn.Module):
    """IA-RED²'s ``PerBlockAgent`` (``IA_RED_model.py``; ``joon-stack/ltrp``,
    ``score_net/ia_red_utils/IA_RED_model.py``), forward copied (``matmul`` module → ``@``)."""

    def __init__(self, dim, num_heads=2, qkv_bias=True, qk_scale=None):
        super().__init__()
        self.num_heads = num_heads
        head_dim = dim // num_heads
        self.scale = qk_scale or head_dim ** -0.5
        self.norm = nn.LayerNorm(dim, elementwise_affine=False)
        self.qk = nn.Linear(dim, dim * 3, bias=qkv_bias)
        self.act = nn.Sigmoid()

    def forward(self, x, prev_policy=None):
        B, N, C = x.shape
        if prev_policy is None:
            prev_policy = torch.ones(B, N, device=x.device)
        x = x * prev_policy.unsqueeze(2)
        x = self.norm(x)
        qk = self.qk(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
        q, k = qk[0], qk[1]  # B x num_head x N x C
        attn = (q[:, :, :1] @ k.transpose(-2, -1)) * self.scale
        attn = self.act(attn)
        attn = attn.squeeze(2).mean(1)
        attn = attn * prev_policy
        return attn


def official_agent(scorer: IARedScorer) -> OfficialPerBlockAgent:
    """The official interpreter carrying ``scorer``'s weights; its unused third ``qk`` block is
    random (it must not matter)."""
    off = OfficialPerBlockAgent(scorer.dim, num_heads=scorer.num_heads)
    with torch.no_grad():
        off.qk.weight[:2 * scorer.dim] = scorer.qk.weight
        off.qk.bias[:2 * scorer.dim] = scorer.qk.bias
    return off.eval()


def test_iared_equals_the_official_interpreter():
    hidden = vit64_tokens()
    torch.manual_seed(2)
    scorer = IARedScorer(192, seed=0).eval()
    assert scorer.num_heads == 6 and not scorer.norm.elementwise_affine       # AttnGroup's interpreter
    off = official_agent(scorer)
    with torch.no_grad():
        ours, probs = scorer(hidden, 1), off(hidden)
    torch.testing.assert_close(ours, probs[:, 1:])
    assert torch.equal(ours > 0.5, probs[:, 1:] > 0.5)                         # AttnGroup's policy_map
    for k in (4, 8):
        assert torch.equal(ours.topk(k, dim=1).indices.sort(1).values,
                           probs[:, 1:].topk(k, dim=1).indices.sort(1).values)


def test_iared_scores_depend_on_the_image_through_the_first_token():
    hidden = vit64_tokens()
    torch.manual_seed(3)
    scorer = IARedScorer(192, seed=0).eval()
    other = hidden.clone()
    other[:, 0] = vit64_tokens(seed=5)[:, 0]                    # another image's CLS, same patch tokens
    with torch.no_grad():
        a, b = scorer(hidden, 1), scorer(other, 1)
    assert (a - b).abs().max() > 1e-3                           # a per-token classifier would not move
    # two images, same patch token at one position: its score differs with the rest of the image
    same = vit64_tokens(seed=5)
    same[:, 1 + 3] = hidden[:, 1 + 3]
    with torch.no_grad():
        assert (scorer(same, 1)[:, 3] - a[:, 3]).abs().max() > 1e-3


def test_iared_rejects_a_width_its_heads_do_not_divide():
    with pytest.raises(ValueError, match="divisible by num_heads=6"):
        IARedScorer(32)
    with pytest.raises(ValueError, match="first .CLS. token"):
        IARedScorer(12, num_heads=2)(torch.randn(1, 4, 12), 0)


# ------------------------------------------------------------------------------ protocol
def test_cropr_and_iared_rows_in_the_protocol(tmp_path):
    model = tiny_vit(embed_dim=48, num_heads=3)                 # 48: divisible by IA-RED²'s 6 heads
    train, test = TinyDataset(16, 4), TinyDataset(8, 5)
    kw = dict(depth=2, budget=0.25, conditions=["reference", "cropr", "iared"], seeds=[0, 1],
              dataset_name="tiny", backbone_name="vit_tiny_test", checkpoint_id="ck0", epochs=1, batch_size=8,
              idauc_steps=2, bootstrap=20, cache_dir=tmp_path, progress=False, throughput_repeats=1,
              throughput_batch=4)
    df = run_protocol(train, test, model, **kw)
    assert sorted(zip(df.condition, df.seed)) == sorted((c, s) for c in kw["conditions"] for s in (0, 1))
    assert (df.scorer.isin(["reference", "cropr", "iared"])).all()
    assert df.pib.between(0, 1).all() and df.throughput.gt(0).all() and df.miou.notna().all()
    # Point-in-Box baselines of the 8 test images: the centre patch (2, 2) = 10 of the 4×4 grid,
    # and the box's share of patches
    assert df.pib_centre.eq(float(test.box_mask[:, 10].float().mean())).all()
    assert df.pib_box_area.sub(float(test.box_mask.float().mean())).abs().lt(1e-6).all()
    cropr, iared = df[df.condition == "cropr"], df[df.condition == "iared"]
    assert cropr.accuracy_llf.between(0, 1).all() and cropr.throughput_llf.gt(0).all()
    assert iared.threshold_keep_rate.between(0, 1).all() and iared.threshold_accuracy.between(0, 1).all()
    assert df[df.condition == "reference"].accuracy_llf.isna().all()
    assert (cropr.epochs == 1).all() and (cropr.target == "").all()
    # two seeds train two different scorers (their saved weights differ) ...
    assert not cropr.from_cache.any()
    from midas_nb.identity import load_torch_payload, load_verified
    blobs = [load_torch_payload(load_verified(f)) for f in sorted((tmp_path / "scorers").glob("*.pt"))]
    saved = {b["key"]["seed"]: b["state_dict"] for b in blobs if b["key"]["kind"] == "cropr_scorer"}
    assert sorted(saved) == [0, 1]
    assert any(not torch.equal(saved[0][k], saved[1][k]) for k in saved[0])
    # ... and each row's mIoU is the IoU of its own saved scorer's top-k with the part masks,
    # recomputed here (block-2 states by timm's modules, ties to the lower index)
    from midas_nb.analysis.protocol import fused_attention
    with torch.no_grad(), fused_attention(model):
        x = model.norm_pre(model._pos_embed(model.patch_embed(test.images)))
        hidden = model.blocks[:2](x)
    N, k = hidden.shape[1] - 1, math.ceil(0.25 * (hidden.shape[1] - 1))
    for seed, sd in saved.items():
        scorer = build_scorer("cropr", hidden.shape[-1], num_classes=4)
        scorer.load_state_dict(sd)
        with torch.no_grad():
            scores = scorer.eval()(hidden, 1)
        top = torch.argsort(-scores, dim=1, stable=True)[:, :k]
        keep = torch.zeros(len(scores), N, dtype=torch.bool).scatter_(1, top, True)
        part = test.part_mask
        inter, union = (keep & part).sum(1).float(), (keep | part).sum(1).float()
        iou = torch.where(part.any(1), inter / union, torch.tensor(float("nan")))
        row = cropr[cropr.seed == seed].iloc[0]
        np.testing.assert_allclose(row["miou_per_image"], iou.numpy(), rtol=1e-6, atol=1e-6)
        assert row["miou"] == pytest.approx(float(np.nanmean(iou.numpy())), abs=1e-6)
    again = run_protocol(train, test, model, **kw)
    assert again[again.condition.isin(["cropr", "iared"])].from_cache.all()
    pd.testing.assert_series_equal(again.accuracy, df.accuracy)


@pytest.mark.parametrize("family, cls", [("cropr", CroprScorer), ("iared", IARedScorer)])
def test_scorer_cache_is_keyed_by_the_architecture(tmp_path, monkeypatch, family, cls):
    from midas_nb.train import block_cache, load_or_train_scorer
    model = tiny_vit(embed_dim=48, num_heads=3)
    cache = block_cache(model, TinyDataset(8, 4), depth=1, key=None, progress=False, full_logits=False,
                        masks=False)
    kw = dict(key={"condition": family}, depth=1, budget=0.5, cache_dir=tmp_path, progress=False,
              scorer=family, scorer_kwargs=dict(num_classes=4), epochs=1, batch_size=8)
    assert not load_or_train_scorer(model, cache, **kw)[2]
    assert load_or_train_scorer(model, cache, **kw)[2]          # same architecture: from the cache
    monkeypatch.setattr(cls, "architecture", f"{family}/an-older-version", raising=False)
    assert not load_or_train_scorer(model, cache, **kw)[2]      # another architecture: trained anew
    assert len(list((tmp_path / "scorers").glob("*.pt"))) == 2


# ------------------------------------------------------------------------------ LaSt-ViT
def _ratio_np(h: np.ndarray) -> np.ndarray:
    """LaSt-ViT's ``x / |lowpass(x) − x|`` in numpy (official order: fft, fftshift, window, ifftshift, ifft)."""
    D = h.shape[-1]
    t = np.arange(-D // 2 + 1, D // 2 + 1)
    window = np.exp(-0.5 * (t / np.sqrt(D)) ** 2)
    low = np.fft.ifft(np.fft.ifftshift(np.fft.fftshift(np.fft.fft(h, axis=-1), axes=-1) * window, axes=-1), axis=-1)
    return h / np.abs(low.real - h)


def test_last_aggregate_picks_the_k_most_stable_tokens_per_channel():
    D = 7                        # odd: a constant token passes the low-pass unchanged
    rnd = torch.randn(D, generator=torch.Generator().manual_seed(3))
    # ratios: ±inf (up to float round-off) for the constants, by sign; moderate for the random token
    tokens = torch.stack([torch.full((D,), 1.0), torch.full((D,), -3.0), rnd])[None]
    stab = token_stability(tokens)
    assert (stab[0, 0] > 1e6).all() and (stab[0, 1] < -1e6).all() and (stab[0, 2].abs() < 1e3).all()
    torch.testing.assert_close(last_aggregate(tokens, 1), torch.full((1, D), 1.0))
    torch.testing.assert_close(last_aggregate(tokens), last_aggregate(tokens, 1))    # default K = 1 (official)
    torch.testing.assert_close(last_aggregate(tokens, 2), ((1.0 + rnd) / 2)[None])
    # against an independent numpy implementation on random tokens
    g = torch.Generator().manual_seed(0)
    h = torch.randn(2, 7, 10, generator=g)
    hn = h.double().numpy()
    r_np = _ratio_np(hn)
    expected = np.zeros((2, 10))
    for b in range(2):
        for d in range(10):
            top = np.argsort(-r_np[b, :, d], kind="stable")[:3]
            expected[b, d] = hn[b, top, d].mean()
    torch.testing.assert_close(last_aggregate(h, 3).double(), torch.from_numpy(expected), atol=1e-5, rtol=0)
    with pytest.raises(ValueError, match="K"):
        last_aggregate(h, 8)


def test_last_vit_cls_copy_equals_the_backbone_and_finetune_trains_only_the_copy(tmp_path):
    model = tiny_vit()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        copy_cls = LaStViT(model, tune_blocks=1, aggregation="cls")
        torch.testing.assert_close(copy_cls(images), model(images))
        x = model.norm(run_blocks(model, embed_tokens(model, images)))       # after the final norm
        torch.testing.assert_close(copy_cls.patch_scores(images), patch_score(x, 1))
    train, test = TinyDataset(16, 6), TinyDataset(8, 7)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    ft = last_finetune(model, train, aggregation="last", epochs=2, batch_size=8, lr=1e-2, progress=False,
                       key={"ck": "t"}, cache_dir=tmp_path)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert len(ft.history["loss"]) == 2 and all(math.isfinite(v) for v in ft.history["loss"])
    assert ft.history["precision"] == "float32" and ft.history["machine"]["logical_cpus"] == os.cpu_count()
    # the history names the attention path the tuned copies took: both settings of timm's flag
    for fused in (True, False):
        bb = tiny_vit()
        for m in bb.modules():
            if hasattr(m, "fused_attn"):
                m.fused_attn = fused
        h = last_finetune(bb, train, epochs=1, batch_size=8, progress=False).history
        assert h["attention"] == (ATTENTION_KERNEL if fused else UNFUSED_ATTENTION_KERNEL)
    assert any(not torch.equal(a, b) for a, b in zip(ft.blocks.parameters(), model.blocks[-1:].parameters()))
    with torch.no_grad():
        tokens = ft.forward_tokens(ft.trunk(images))
        expected = ft.head.head(last_aggregate(ft.head.norm(tokens)[:, 1:], 1))
        torch.testing.assert_close(ft(images), expected)
    again = last_finetune(model, train, aggregation="last", epochs=2, batch_size=8, lr=1e-2, progress=False,
                          key={"ck": "t"}, cache_dir=tmp_path)
    assert again.history["from_cache"] and all(torch.equal(a, b) for a, b in
                                               zip(again.parameters(), ft.parameters()))
    table = pib_table({"backbone": model, "LaSt": ft}, test, progress=False, n_boot=20)
    assert list(table.model) == ["backbone", "LaSt"] and list(table.aggregation) == ["cls", "last"]
    # PiB by hand for the backbone: top patch-score patch inside the box
    with torch.no_grad():
        ps = patch_score(model.norm(run_blocks(model, embed_tokens(model, test.images))), 1)
    hits = test.box_mask.gather(1, ps.argmax(1, keepdim=True)).float().mean()
    assert table.pib[0] == pytest.approx(float(hits))
    assert table.accuracy.between(0, 1).all() and (table.n_images == 8).all()


# ------------------------------------------------------------------------------ TokenTM tests
def test_positive_perturbation_drops_faster_than_negative_on_a_decisive_token():
    model = decisive_token_vit()
    images, labels = torch.zeros(3, 3, 32, 32), torch.zeros(3, dtype=torch.long)
    relevance = torch.rand(3, 16, generator=torch.Generator().manual_seed(0))
    relevance[:, KEY_TOKEN] = 2.0                                              # ranked first
    res = perturbation_test(model, (images, labels), relevance, steps=4)
    # removed fractions 0, .25, .5, .75, 1: positive loses the key token at once, negative last
    torch.testing.assert_close(res["pos_curve"], torch.tensor([1.0, 0, 0, 0, 0], dtype=torch.float64))
    torch.testing.assert_close(res["neg_curve"], torch.tensor([1.0, 1, 1, 1, 0], dtype=torch.float64))
    assert res["pos_auc"] == pytest.approx(0.125) and res["neg_auc"] == pytest.approx(0.875)
    # a map that ranks the key token last swaps the two tests
    relevance[:, KEY_TOKEN] = -1.0
    swapped = perturbation_test(model, (images, labels), relevance, steps=4)
    assert swapped["pos_auc"] == pytest.approx(0.875) and swapped["neg_auc"] == pytest.approx(0.125)
    # ten steps of 10 %: k_s = round(1.6 s), classes against the unperturbed prediction
    ten = perturbation_test(model, (images, None), torch.rand(3, 16).index_fill(1, torch.tensor([KEY_TOKEN]), 2.0),
                            steps=10, target="prediction")
    # k_1 = 2 of 16 tokens: the positive curve is 1 at 0 and 0 from 2/16 on
    assert ten["pos_auc"] < ten["neg_auc"] and ten["pos_auc"] == pytest.approx(0.5 * 2 / 16)


def test_perturbation_table_on_a_dataset():
    model = decisive_token_vit()
    data = TinyDataset(6, 0, num_classes=2, images=torch.zeros(6, 3, 32, 32), labels=torch.zeros(6, dtype=torch.long))
    good = torch.rand(6, 16, generator=torch.Generator().manual_seed(1))
    good[:, KEY_TOKEN] = 2.0
    bad = good.clone()
    bad[:, KEY_TOKEN] = -1.0
    table = perturbation_table(model, data, {"good": good, "bad": bad}, steps=4, max_images=4, n_boot=20,
                               progress=False)
    t = table.set_index("target")
    assert t.loc["good", "pos_auc"] == pytest.approx(0.125) and t.loc["good", "neg_auc"] == pytest.approx(0.875)
    assert t.loc["bad", "neg_minus_pos"] == pytest.approx(-0.75) and (table.n_images == 4).all()
    with pytest.raises(ValueError, match="len\\(test_set\\)"):
        perturbation_table(model, data, {"short": good[:3]}, progress=False)


def test_the_perturbation_bar_ticks_once_per_batch_and_map(monkeypatch, capsys):
    """A batch of every map can take minutes on a CPU: the bar counts (batch, map) pairs, not batches."""
    from midas_nb.metrics.perturbation import perturbation_curves
    monkeypatch.setenv("MIDAS_PROGRESS", "lines")
    monkeypatch.setenv("MIDAS_PROGRESS_INTERVAL", "0")
    model = decisive_token_vit()
    data = TinyDataset(6, 0, num_classes=2, images=torch.zeros(6, 3, 32, 32), labels=torch.zeros(6, dtype=torch.long))
    maps = {k: torch.rand(6, 16, generator=torch.Generator().manual_seed(i)) for i, k in enumerate("abc")}
    perturbation_table(model, data, maps, steps=4, batch_size=4, n_boot=5, progress=True)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("perturbation,")]
    assert lines[-1].startswith("perturbation, map 6/6 (")               # 2 batches x 3 maps
    seen = []
    perturbation_curves(model, torch.zeros(2, 3, 32, 32), {k: m[:2] for k, m in maps.items()}, 4,
                        labels=torch.zeros(2, dtype=torch.long), on_map=seen.append)
    assert seen == ["a", "b", "c"]


# ------------------------------------------------------------------------------ the table
def test_related_table_merges_the_three_kinds():
    base = dict(dataset="cub", backbone="b", checkpoint_id="c", depth=6, budget=0.25, n_images=10)
    rows = []
    for seed, (m_ref, m_cr) in enumerate([(0.30, 0.36), (0.30, 0.32)]):
        rows.append(dict(base, condition="reference", target="T0", seed=seed, miou=m_ref, idauc=0.20, accuracy=0.8,
                         pib=0.5, throughput=100.0))
        rows.append(dict(base, condition="cropr", seed=seed, miou=m_cr, idauc=0.21, accuracy=0.7, pib=0.6,
                         throughput=150.0, accuracy_llf=0.75 + 0.05 * seed))
        rows.append(dict(base, condition="last_votes", target="last_votes", seed=seed, miou=0.3, idauc=0.2,
                         accuracy=0.8, pib=0.5, throughput=100.0))
    for r in rows:
        r.update(pib_centre=0.9, pib_box_area=0.25)
    protocol = make_table(rows)
    pert = pd.DataFrame([dict(target="tokentm", pos_auc=0.2, neg_auc=0.6, pos_curve=[1.0, 0.0])])
    pib = pd.DataFrame([dict(model="backbone", aggregation="cls", pib=0.4, accuracy=0.8, last_K=float("nan")),
                        dict(model="LaSt fine-tune (K=1)", aggregation="last", pib=0.5, accuracy=0.8, last_K=1)])
    table = related_table(protocol, perturbation=pert, pib=pib)
    assert list(table.kind) == ["pruning"] * 3 + ["relevance map", "backbone", "backbone"]
    t = table.set_index("method")
    assert t.loc["cropr", "D_pp"] == pytest.approx(4.0) and t.loc["reference", "D_pp"] == 0
    assert t.loc["cropr", "D_status"] == "in band" and t.loc["cropr", "miou"] == pytest.approx(0.34)
    assert t.loc["cropr", "accuracy_llf"] == pytest.approx(0.775) and math.isnan(t.loc["reference", "accuracy_llf"])
    assert t.loc["tokentm", "neg_auc"] == 0.6 and "pos_curve" not in table.columns
    assert t.loc["backbone", "pib"] == 0.4 and math.isnan(t.loc["backbone", "miou"])
    # the Point-in-Box baselines stand beside every pruning row's pib; LaSt rows say their K
    assert (t.loc[["reference", "cropr", "last_votes"], "pib_centre"] == 0.9).all()
    assert (t.loc[["reference", "cropr", "last_votes"], "pib_box_area"] == 0.25).all()
    assert t.loc["last_votes", "last_K"] == "N//2" and t.loc["LaSt fine-tune (K=1)", "last_K"] == 1


def test_speed_table_sets_each_row_beside_the_full_models_throughput():
    from midas_nb.analysis.related import family_table, speed_note, speed_table
    from midas_nb.study import RunSettings

    pruning = pd.DataFrame({"method": ["reference", "cropr", "iared"], "accuracy": [0.8, 0.7, 0.6],
                            "accuracy_lo": [0.7, 0.6, 0.5], "accuracy_hi": [0.9, 0.8, 0.7],
                            "throughput": [150.0, 187.4, 120.0], "throughput_full": [100.0, 100.0, 100.0],
                            "train_seconds": [0.0, 12.345, math.nan], "accuracy_llf": [math.nan, 0.75, math.nan],
                            "threshold_keep_rate": [math.nan, math.nan, 0.31]})
    t = speed_table(pruning)
    assert list(t.columns) == ["accuracy", "img/s", "full img/s", "speed-up", "train s"]
    assert t.loc["cropr"].tolist() == ["0.700 [0.600, 0.800]", "187", "100", "1.87×", "12.35"]
    assert t.loc["iared", "train s"] == "0.00" and t.loc["reference", "speed-up"] == "1.50×"
    with pytest.raises(ValueError, match="throughput"):
        speed_table(pruning.assign(throughput=[1.0, math.nan, 2.0]))
    f = family_table(pruning)
    assert list(f.index) == ["cropr", "iared"] and list(f.columns) == ["accuracy_llf", "threshold_keep_rate"]
    assert f.loc["cropr", "accuracy_llf"] == "0.750" and f.loc["cropr", "threshold_keep_rate"] == "n/a"
    rows = pd.DataFrame({"n_images": [12, 12], "device": ["cpu", "cpu"], "depth": [2, 2], "budget": [0.25, 0.25],
                         "throughput_full": [100.0, 100.0]})
    smoke = RunSettings.build("smoke")        # its scorer_train: throughput_batch 4, throughput_repeats 1
    note = speed_note(rows, smoke.protocol)
    assert note == ("accuracy: 12 test images; throughput: the unpruned model and every pruned forward timed together "
                    "on 4 test images, 1 call per round, median of 3 interleaved rounds, on cpu; L = 2, b = 25%")
    plain = RunSettings.build("smoke", scorer_train=dict(epochs=2, batch_size=32, lr=1e-3))
    other = speed_note(rows.assign(throughput_full=[100.0, 97.0]), plain.protocol)  # PROTOCOL_DEFAULTS: 16, 3
    top = RunSettings.build("smoke", scorer_train=dict(epochs=2), throughput_batch=8).protocol  # the top level
    assert (top.throughput_batch, top.throughput_repeats, smoke.protocol.throughput_batch) == (8, 3, 4)
    assert speed_note(rows, smoke) == note                                # the whole settings read the same
    with pytest.raises(TypeError, match=r"speed_note\(rows, study.settings.protocol\)"):
        speed_note(rows, dict(smoke.values))                              # the old call: a profile mapping
    assert "on 16 test images, 3 calls per round" in other and "from 2 such measurements" in other
    assert ("gives it; img/s of rows from different measurements are not comparable (the machine's load changes "
            "between them): compare the speed-ups;") in other and "compare the speed-ups" not in note


def test_related_table_pools_builds_and_flags_a_scorer_below_random_top_k():
    """Issue 52: 06 gave T5 a speed-up of 1.77× where 07 gave 1.27×: the family columns (``throughput_full``,
    ``speedup``) were build 0's while ``throughput`` pooled every build, so the ratio mixed measurements. Each
    row's speed-up is now the mean of its runs' own ratios (07's). And Cropr at accuracy below random top-k's
    was shown without a word: :func:`training_caveats` names it, with the paired difference."""
    from midas_nb.analysis.related import speed_table, training_caveats
    ids = [f"i{k}" for k in range(8)]
    rows = []
    for build, full, fast in ((0, 20.0, 40.0), (1, 100.0, 110.0)):     # two measurements: 2.0× and 1.1×
        base = dict(dataset="cub", backbone="b", checkpoint_id=f"ck{build}", build=build, depth=6, budget=0.25,
                    n_images=8, image_ids=ids, throughput_full=full)
        for seed in (0, 1):
            for cond, acc, speed in (("reference", [1] * 6 + [0] * 2, fast), ("T5", [1] * 6 + [0] * 2, fast),
                                     ("random", [1] * 5 + [0] * 3, fast), ("cropr", [1] * 1 + [0] * 7, fast)):
                rows.append(dict(base, condition=cond, seed=seed, miou=0.3, idauc=0.2, accuracy=float(np.mean(acc)),
                                 accuracy_per_image=[float(a) for a in acc], throughput=speed,
                                 speedup=speed / full))
    table = related_table(make_table(rows), n_boot=200)
    t = table.set_index("method")
    assert t.loc["T5", "throughput"] == pytest.approx(75.0) and t.loc["T5", "throughput_full"] == pytest.approx(60.0)
    assert speed_table(table).loc["T5", "speed-up"] == "1.55×"           # mean(2.0, 1.1); was 75 / 20 = 3.75×
    assert t.loc["cropr", "random_accuracy"] == pytest.approx(0.625)
    assert t.loc["cropr", "accuracy_vs_random"] == pytest.approx(0.125 - 0.625)
    assert t.loc["T5", "accuracy_vs_random"] == pytest.approx(0.125)
    lines = training_caveats(table)
    assert len(lines) == 1 and lines[0].startswith(
        "cropr: did not train here (pruned accuracy 0.125 vs random top-k 0.625, paired difference -0.500 [")
    assert training_caveats(table[table["method"] != "cropr"]) == [
        "no scorer's pruned accuracy lies resolvably below random top-k's"]
    assert training_caveats(related_table(make_table([r for r in rows if r["condition"] != "random"]), n_boot=50)) == [
        "no random top-k rows: the scorers' pruned accuracy is not checked against it"]


# ------------------------------------------------------------------------------ CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_related_methods_run_on_cuda(tmp_path):
    dev = torch.device("cuda")
    model = tiny_vit(embed_dim=48, num_heads=3)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        hidden = run_blocks(model, embed_tokens(model, images), 0, 1)
        keep = torch.rand(3, 16, generator=torch.Generator().manual_seed(0)) < 0.4
        cpu = masked_logits(model, hidden, keep, 1)
        torch.manual_seed(2)
        scorer = CroprScorer(48, num_classes=4).eval()
        llf_cpu = cropr_forward(model, images, scorer, 1, 0.25, fusion=True).logits
        model.to(dev), scorer.to(dev)
        torch.testing.assert_close(masked_logits(model, hidden.to(dev), keep.to(dev), 1).cpu(), cpu,
                                   atol=1e-4, rtol=1e-4)
        torch.testing.assert_close(cropr_forward(model, images.to(dev), scorer, 1, 0.25, fusion=True).logits.cpu(),
                                   llf_cpu, atol=1e-4, rtol=1e-4)
    toy = decisive_token_vit().to(dev)
    relevance = torch.rand(3, 16)
    relevance[:, KEY_TOKEN] = 2.0
    res = perturbation_test(toy, (torch.zeros(3, 3, 32, 32), torch.zeros(3, dtype=torch.long)), relevance,
                            steps=4, device=dev)
    assert res["pos_auc"] == pytest.approx(0.125) and res["neg_auc"] == pytest.approx(0.875)
    train, test = TinyDataset(16, 4), TinyDataset(8, 5)
    df = run_protocol(train, test, model, depth=2, budget=0.25, conditions=["reference", "cropr", "iared"],
                      seeds=[0], dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", epochs=1,
                      batch_size=8, idauc_steps=2, bootstrap=20, cache_dir=tmp_path, progress=False,
                      throughput_repeats=1, throughput_batch=4, device="cuda")
    assert (df.device == "cuda").all() and df.accuracy.notna().all() and df.accuracy_llf.notna().any()
    ft = last_finetune(model, train, epochs=1, batch_size=8, device=dev, progress=False)
    table = pib_table({"backbone": model, "LaSt": ft}, test, device=dev, progress=False, n_boot=20)
    assert table.pib.between(0, 1).all()


def test_iared_condition_picks_heads_that_divide_the_width():
    from midas_nb.scorers.iared import default_heads
    from midas_nb.scorers import build_scorer
    assert (default_heads(384), default_heads(32), default_heads(33)) == (6, 2, 1)
    assert build_scorer("iared", 32, num_classes=4).num_heads == 2      # a narrow rehearsal backbone
    assert build_scorer("iared", 192, num_classes=4).num_heads == 6     # DeiT-Ti: the released 6


def test_related_rows_band_is_checked_against_the_random_ranking():
    """run_related runs the random ranking beside its conditions (the profile's protocol has it):
    each row's D_status tests the reference against it, and no random row is shown. A reference
    no more faithful than random gives 'uninformative', not 'in band'."""
    from types import SimpleNamespace

    from test_verdict import _table
    from midas_nb.analysis.related import run_related

    full = _table({"reference": (0.10, 0.05), "T5": (0.18, 0.10)}, random_idauc=0.05)
    asked = []

    def protocol(sweep, conditions=None, **kw):      # Study.protocol's cells: the catalogue's sweep
        cells = sweep_cells(study.settings.values, sweep, planned=True, conditions=conditions, **kw)
        asked.append(list(dict.fromkeys(c.condition for c in cells)))
        return full[full["condition"].isin(asked[-1])].reset_index(drop=True)
    from midas_nb.study import RunSettings, sweep_cells

    settings = RunSettings.build("smoke", conditions=["reference", "T5", "random"], bootstrap=200, max_eval_images=60)
    study = SimpleNamespace(settings=settings, protocol=protocol)
    res = run_related(study, conditions=["reference", "T5"], perturbation_maps=None, last=False)
    assert asked == [["reference", "T5", "random"]]
    pruning = res.table[res.table["kind"] == "pruning"].set_index("method")
    assert "random" not in pruning.index and "random" not in set(res.protocol["condition"])
    assert pruning.loc["T5", "D_status"] == "uninformative"
    # without the random ranking in the profile, nothing is added (the band is then untested)
    asked.clear()
    study.settings = RunSettings.build("smoke", conditions=["reference", "T5"], bootstrap=200, max_eval_images=60)
    run_related(study, conditions=["reference", "T5"], perturbation_maps=None, last=False)
    assert asked == [["reference", "T5"]]
