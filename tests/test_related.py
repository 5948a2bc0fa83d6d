"""Related systems: Cropr, IA-RED², LaSt-ViT aggregation, TokenTM's perturbation tests, the table."""
from __future__ import annotations

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
from midas_nb.protocol import list_conditions, run_protocol
from midas_nb.pruning import prune_tokens, pruned_forward, score_tokens
from midas_nb.related import (CroprScorer, IARedScorer, LaStViT, bernoulli_log_prob, cropr_forward,
                              iared_reward, last_aggregate, last_finetune, masked_logits, perturbation_table,
                              perturbation_test, pib_table, prune_tokens_llf, reinforce_loss, related_table,
                              token_stability)
from midas_nb.results import make_table
from midas_nb.scorers import build_scorer, list_scorer_conditions
from midas_nb.vit import embed_tokens, run_blocks
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
    assert isinstance(build_scorer("cropr", 32, num_classes=3), CroprScorer)
    assert isinstance(build_scorer("iared", 32, num_classes=3), IARedScorer)


# ------------------------------------------------------------------------------ Cropr
def test_cropr_scores_are_the_summed_query_key_products():
    torch.manual_seed(0)
    scorer = CroprScorer(12, num_classes=3, num_heads=3)
    x = torch.randn(2, 1 + 5, 12)
    ln = F.layer_norm(x[:, 1:], (12,), scorer.norm.weight, scorer.norm.bias, scorer.norm.eps)
    k = ln @ scorer.key.weight.T + scorer.key.bias                             # [B,N,D]
    expected = torch.zeros(2, 5)
    for h in range(3):
        kh = k[..., 4 * h:4 * (h + 1)]
        expected += (kh * scorer.query[h]).sum(-1) / 2.0                       # √d_h = 2
    torch.testing.assert_close(scorer(x, 1), expected)
    # the aggregator: per head, softmax over tokens of the same products weights that head's slice
    agg = torch.zeros(2, 12)
    for h in range(3):
        a = ((k[..., 4 * h:4 * (h + 1)] * scorer.query[h]).sum(-1) / 2.0).softmax(-1)
        agg[:, 4 * h:4 * (h + 1)] = (a[..., None] * ln[..., 4 * h:4 * (h + 1)]).sum(1)
    z = agg + scorer.agg_mlp(scorer.agg_norm(agg))
    torch.testing.assert_close(scorer.aux_logits(x, 1), scorer.head(scorer.head_norm(z)))


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
    assert scorer.query.grad is not None and scorer.query.grad.abs().sum() > 0
    assert scorer.key.weight.grad.abs().sum() > 0 and scorer.head.weight.grad.abs().sum() > 0


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


def test_iared_scores_are_head_averaged_sigmoids():
    torch.manual_seed(4)
    scorer = IARedScorer(8, num_heads=2, seed=0)
    x = torch.randn(2, 1 + 3, 8)
    ln = F.layer_norm(x[:, 1:], (8,), scorer.norm.weight, scorer.norm.bias, scorer.norm.eps)
    k = ln @ scorer.key.weight.T + scorer.key.bias
    q = scorer.query.weight @ scorer.policy_token + scorer.query.bias
    expected = sum(torch.sigmoid((k[..., 4 * h:4 * h + 4] * q[4 * h:4 * h + 4]).sum(-1) / 2.0) for h in range(2)) / 2
    torch.testing.assert_close(scorer(x, 1), expected)


# ------------------------------------------------------------------------------ protocol
def test_cropr_and_iared_rows_in_the_protocol(tmp_path):
    model = tiny_vit()
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
    from midas_nb.protocol import fused_attention
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


# ------------------------------------------------------------------------------ CUDA
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_related_methods_run_on_cuda(tmp_path):
    dev = torch.device("cuda")
    model = tiny_vit()
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        hidden = run_blocks(model, embed_tokens(model, images), 0, 1)
        keep = torch.rand(3, 16, generator=torch.Generator().manual_seed(0)) < 0.4
        cpu = masked_logits(model, hidden, keep, 1)
        torch.manual_seed(2)
        scorer = CroprScorer(32, num_classes=4, num_heads=2).eval()
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
