"""Tests of midas_nb.backbones.distilled (the DeiT-style student of the ImageNet Lite0) and of the MIDAS
pipeline on a distilled backbone: two prefix tokens (CLS, distillation), CLS-based targets read
token 0, prefix tokens are never pruned."""
from __future__ import annotations

import math

import pandas as pd
import pytest
import torch
import torch.nn.functional as F

from midas_nb import backbones as bb
from midas_nb import backbones as dl  # the distilled backbone's names (midas_nb.backbones.distilled)
from midas_nb.capture import capture
from midas_nb.analysis.protocol import run_protocol
from midas_nb.pruning import pruned_forward
from midas_nb.scorers import MLPScorer, ReferenceScorer
from midas_nb.targets import compute_targets, get_target, list_targets
from midas_nb.backbones.vit import embed_tokens, num_prefix_tokens, run_blocks
from tiny_data import TinyDataset


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """Tiny models and probes run faster on one thread (and far faster on a shared, busy CPU)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def _smoke_deit(seed: int = 0) -> torch.nn.Module:
    """The smoke-size distilled hybrid (Lite0 stride-8 stem, 4 blocks of width 48, 8x8 grid), with
    1/sqrt(fan_in) weights so attention maps and gradients are well above float noise."""
    torch.manual_seed(seed)
    model = bb.create_backbone("vit_smoke_deit", 4)
    for name, m in model.named_modules():
        if isinstance(m, torch.nn.Linear):
            torch.nn.init.normal_(m.weight, std=m.in_features ** -0.5)
    torch.nn.init.normal_(model.cls_token, std=1.0)
    torch.nn.init.normal_(model.dist_token, std=1.0)
    return model.eval()


@pytest.fixture(scope="module")
def smoke_deit() -> torch.nn.Module:
    return _smoke_deit()


def _images(n: int = 3, seed: int = 1) -> torch.Tensor:
    return torch.randn(n, 3, 64, 64, generator=torch.Generator().manual_seed(seed)).clamp(-1, 1)


class ImageSet(TinyDataset):
    """:class:`tiny_data.TinyDataset` with 64x64 images (the smoke backbones' size, 8x8 grid):
    a per-class colour shift, so the Lite0 features separate the classes."""

    def __init__(self, n: int, seed: int, num_classes: int = 4):
        g = torch.Generator().manual_seed(seed)
        labels = torch.arange(n) % num_classes
        colour = torch.tensor([[0.8, -0.6, -0.6], [-0.6, 0.8, -0.6], [-0.6, -0.6, 0.8], [0.6, 0.6, -0.8]])
        images = (0.3 * torch.randn(n, 3, 64, 64, generator=g) + colour[labels % 4][:, :, None, None]).clamp(-1, 1)
        super().__init__(n, seed, num_classes=num_classes, images=images, labels=labels)
        self.part_mask = torch.rand(n, 64, generator=g) < 0.3
        self.box_mask = torch.rand(n, 64, generator=g) < 0.5


# ----------------------------------------------------------------------------- the architecture


def test_distilled_backbones_are_timm_deit_with_two_prefix_tokens():
    for name, grid in (("vit_smoke_deit", (8, 8)), ("hybrid_lite0_deit", (14, 14))):
        assert name in bb.list_backbones() and bb.is_hybrid(name) and dl.is_distilled_name(name)
        model = bb.create_backbone(name, 5)
        from timm.models.deit import VisionTransformerDistilled

        assert isinstance(model, VisionTransformerDistilled)
        assert num_prefix_tokens(model) == 2 and tuple(model.patch_embed.grid_size) == grid
        assert bb.backbone_normalization(name) == ((0.5,) * 3, (0.5,) * 3)
        # the ViT initialiser did not touch the frozen ImageNet stem
        ref = bb.lite0_stem(model.patch_embed.patch_size[0])
        for a, b in zip(model.patch_embed.backbone.state_dict().values(), ref.state_dict().values()):
            assert torch.equal(a, b)
    assert not dl.is_distilled_name("hybrid_lite0_vit")
    with pytest.raises(KeyError, match="not a distilled backbone"):
        dl.distill_recipe("hybrid_lite0_vit")


def test_eval_logits_are_the_mean_of_the_class_and_distillation_heads(smoke_deit):
    model = smoke_deit
    x = _images()
    with torch.no_grad():
        z = model.norm(run_blocks(model, embed_tokens(model, x)))
        expected = (model.head(z[:, 0]) + model.head_dist(z[:, 1])) / 2
        torch.testing.assert_close(model(x), expected)


# ----------------------------------------------------------------------------- targets, pruning, protocol


@pytest.mark.parametrize("target_id", list_targets())
def test_every_target_on_the_distilled_backbone_is_patch_tokens_only(smoke_deit, target_id):
    model, x = smoke_deit, _images()
    out = compute_targets(model, x, [target_id], 1, torch.tensor([0, 3, 1]), labels=torch.tensor([1, 3, 2]))
    t = out[target_id]
    assert t.shape == (3, 64) and torch.isfinite(t).all() and t.abs().sum() > 0


def test_cls_based_targets_read_the_class_token_not_the_distillation_token(smoke_deit):
    model, x = smoke_deit, _images()
    c = torch.tensor([0, 1, 2])
    cap = capture(model, x, c)
    assert cap.num_prefix_tokens == 2 and cap.attn[0].shape[-1] == 2 + 64
    for depth in (1, 3):
        A = cap.attn[depth - 1]                                    # [B,H,T,T]
        t0 = get_target("T0")(cap, depth, c)
        torch.testing.assert_close(t0, A[:, :, 0, 2:].mean(1))     # row 0 (CLS), columns of patches
        assert not torch.allclose(t0, A[:, :, 1, 2:].mean(1))      # not the distillation row
        # T1: attention mass received by each patch token, all query rows (prefix included)
        torch.testing.assert_close(get_target("T1")(cap, depth, c), A.mean(1).sum(1)[:, 2:])


@pytest.mark.parametrize("budget", [0.1, 0.25, 0.5])
def test_pruning_never_drops_the_prefix_tokens(smoke_deit, budget):
    model, x, depth, N = smoke_deit, _images(2), 2, 64
    seen = {}
    hooks = [blk.register_forward_pre_hook(lambda m, a, i=i: seen.__setitem__(i, a[0].detach().clone()))
             for i, blk in enumerate(model.blocks)]
    torch.manual_seed(2)
    with torch.no_grad():
        out = pruned_forward(model, x, MLPScorer(model.embed_dim), depth, budget)
        full = run_blocks(model, embed_tokens(model, x), 0, depth)
    for h in hooks:
        h.remove()
    k = math.ceil(budget * N)
    assert [seen[i].shape[1] for i in range(4)] == [2 + N] * depth + [2 + k] * (4 - depth)
    # the tokens entering block L+1 start with the CLS and distillation tokens of block L's output
    torch.testing.assert_close(seen[depth][:, :2], full[:, :2])
    torch.testing.assert_close(seen[depth][:, 2:], full[:, 2:].gather(
        1, out.keep_idx[..., None].expand(-1, -1, full.shape[-1])))
    assert (out.keep_idx < N).all() and out.keep_idx.shape == (2, k)
    # budget 1 is the full model
    with torch.no_grad():
        torch.testing.assert_close(pruned_forward(model, x, ReferenceScorer(), depth, 1.0).logits, model(x),
                                   atol=1e-5, rtol=1e-5)


def test_three_condition_protocol_runs_on_the_distilled_backbone(tmp_path):
    model = _smoke_deit()
    train, test = ImageSet(16, 4), ImageSet(10, 5)
    conditions = ["reference", "unsupervised", "T1", "T5", "random"]
    df = run_protocol(train, test, model, depth=2, budget=0.25, conditions=conditions, seeds=[0],
                      dataset_name="tiny", backbone_name="vit_smoke_deit", checkpoint_id="ck_deit",
                      epochs=1, batch_size=8, idauc_steps=4, max_eval_images=8, bootstrap=50,
                      cache_dir=tmp_path, progress=False, throughput_repeats=1, throughput_batch=4)
    assert isinstance(df, pd.DataFrame) and sorted(df.condition) == sorted(conditions)
    for col in ("miou", "idauc", "accuracy", "ins_auc", "del_auc"):
        assert df[col].notna().all(), col
    assert ((df.accuracy - df.full_accuracy).abs() <= 1 - df.agreement + 1e-9).all()


# ----------------------------------------------------------------------------- teacher


def test_teacher_head_on_the_stem_is_lite0_forward_features():
    x = _images(2)
    full = bb.lite0_classifier()
    for stride in (8, 16):
        stem, head = bb.lite0_stem(stride), dl.lite0_teacher_head(stride)
        with torch.no_grad():
            torch.testing.assert_close(head(stem(x)), full.forward_features(x), atol=1e-4, rtol=1e-4)
        assert not any(p.requires_grad for p in head.parameters())
    with pytest.raises(ValueError, match="stride"):
        dl.lite0_teacher_head(32)


def test_teacher_features_keep_the_view_axis():
    head = dl.lite0_teacher_head(8)
    feats = torch.randn(3, 2, 40, 8, 8)
    out = dl.teacher_features(head, feats, batch_size=4)
    assert out.shape == (3, 2, 1280, 2, 2) and out.dtype == torch.float16
    with torch.no_grad():
        torch.testing.assert_close(out[2, 1].float(), head(feats[2, 1:2])[0], atol=2e-2, rtol=1e-2)


def test_linear_probe_separates_separable_classes_and_checks_labels():
    g = torch.Generator().manual_seed(0)
    y = torch.arange(60) % 3
    x = torch.randn(60, 5, generator=g) + 4.0 * F.one_hot(y, 5).float()
    probe = dl.fit_linear_probe(x, y, 3, steps=200)
    assert (probe(x).argmax(-1) == y).all()
    torch.testing.assert_close(probe.mean, x.mean(0))
    assert (probe.std >= 0.01 * x.std(0).mean()).all()
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 3\)"):
        dl.fit_linear_probe(x, y + 1, 3)


def test_out_of_fold_logits_never_see_their_own_image():
    g = torch.Generator().manual_seed(1)
    M, V = 20, 2
    y = torch.arange(M) % 4
    pooled = torch.randn(M, V, 6, generator=g) + F.one_hot(y, 6).float()[:, None]
    kw = dict(steps=30)
    base = dl.out_of_fold_logits(pooled, y, 4, 4, **kw)
    assert base.shape == (M, V, 4)
    for i in (0, 7):
        y2 = y.clone()
        y2[i] = (y[i] + 1) % 4
        other = dl.out_of_fold_logits(pooled, y2, 4, 4, **kw)
        assert torch.equal(other[i], base[i])                     # its own label never reached it
        assert not torch.allclose(other, base)                    # it did reach the other folds
    with pytest.raises(ValueError, match="folds"):
        dl.out_of_fold_logits(pooled[:3], y[:3], 4, 4)


def test_probe_maps_average_to_the_pooled_logits_and_oof_maps_too():
    g = torch.Generator().manual_seed(3)
    M, V, Fdim = 12, 2, 6
    maps = torch.randn(M, V, Fdim, 3, 3, generator=g)
    y = torch.arange(M) % 3
    pooled = maps.mean((-1, -2))
    probe = dl.fit_linear_probe(pooled.flatten(0, 1), y.repeat_interleave(V), 3, steps=20)
    dense = dl.probe_maps(probe, maps.flatten(0, 1))
    assert dense.shape == (M * V, 3, 3, 3)
    torch.testing.assert_close(dense.mean((-1, -2)), probe(pooled.flatten(0, 1)), atol=1e-5, rtol=1e-5)
    oof = dl.out_of_fold_logits(pooled, y, 3, 3, steps=20)
    oof_maps = dl.out_of_fold_logits(pooled, y, 3, 3, steps=20, maps=maps)
    assert oof_maps.shape == (M, V, 3, 3, 3)
    torch.testing.assert_close(oof_maps.mean((-1, -2)), oof, atol=1e-5, rtol=1e-5)


def test_mix_tokens_pastes_one_aligned_box_everywhere():
    g = torch.Generator().manual_seed(4)
    B = 6
    stem = torch.arange(B, dtype=torch.float)[:, None, None, None].expand(B, 2, 8, 8).clone()
    tgt = torch.arange(B, dtype=torch.float)[:, None, None, None].expand(B, 3, 4, 4).clone() + 100
    seen_partial = False
    for _ in range(20):
        x, (t,), perm, lam = dl.mix_tokens(stem, [tgt], g)
        assert sorted(perm.tolist()) == list(range(B))
        for i in range(B):
            own_t = t[i, 0] == 100 + i
            if perm[i] != i:
                assert 1.0 - own_t.float().mean().item() == pytest.approx(1.0 - lam)   # pasted area = 1 − λ
                seen_partial |= 0.0 < lam < 1.0
            # the stem box is the target box, upsampled by the grid ratio (2)
            own_x = x[i, 0] == i
            assert torch.equal(own_x, own_t.repeat_interleave(2, 0).repeat_interleave(2, 1))
        assert torch.equal(stem[:, :, 0, 0], torch.arange(B, dtype=torch.float)[:, None].expand(B, 2))  # no in-place
    assert seen_partial


def test_token_label_loss_is_zero_at_the_teacher_and_matches_the_formula():
    g = torch.Generator().manual_seed(5)
    s, t = torch.randn(2, 4, 3, 3, generator=g), torch.randn(2, 4, 3, 3, generator=g)
    assert float(dl.token_label_loss(t, t)) == pytest.approx(0.0, abs=1e-6)
    p, logq = t.softmax(1), s.log_softmax(1)
    torch.testing.assert_close(dl.token_label_loss(s, t), (p * (p.log() - logq)).sum(1).mean())


def test_drop_cells_keeps_the_prefix_and_whole_cells_and_the_kept_token_labels():
    """PatchDropout by teacher-grid cells: prefix tokens always kept, each kept cell's patch tokens
    in place, and the token-label loss on the kept cells equals the full one with every cell kept
    and the per-cell KL by hand otherwise."""
    from midas_nb.backbones.distilled import _token_maps, drop_cells, kept_token_label_loss
    g = torch.Generator().manual_seed(0)
    B, P, D, K = 3, 2, 5, 7
    tok = torch.randn(B, P + 4 * 6, D, generator=g)
    head = torch.nn.Linear(D, K)
    teacher = torch.randn(B, K, 2, 3, generator=g)
    kept, cells = drop_cells(tok, P, (4, 6), (2, 3), 1.0, g)
    assert cells.tolist() == [list(range(6))] * B
    torch.testing.assert_close(kept_token_label_loss(kept[:, P:], head, cells, teacher),
                               dl.token_label_loss(_token_maps(tok[:, P:], head, (4, 6), (2, 3)), teacher))
    kept, cells = drop_cells(tok, P, (4, 6), (2, 3), 0.5, g)
    assert kept.shape == (B, P + 3 * 4, D) and torch.equal(kept[:, :P], tok[:, :P])
    for b in range(B):
        assert cells[b].tolist() == sorted(set(cells[b].tolist()))
        for i, c in enumerate(cells[b].tolist()):
            r, q = divmod(c, 3)
            rows = [P + (2 * r + dy) * 6 + 2 * q + dx for dy in (0, 1) for dx in (0, 1)]
            assert torch.equal(kept[b, P + 4 * i:P + 4 * i + 4], tok[b, rows])
    s = head(kept[:, P:]).reshape(B, 3, 4, K).mean(2)
    t = torch.stack([teacher.flatten(2).transpose(1, 2)[b, cells[b]] for b in range(B)])
    p = t.softmax(-1)
    torch.testing.assert_close(kept_token_label_loss(kept[:, P:], head, cells, teacher),
                               (p * (p.log() - s.log_softmax(-1))).sum(-1).mean())
    with pytest.raises(ValueError, match="multiple of the cell grid"):
        drop_cells(tok, P, (4, 6), (3, 4), 0.5, g)
    # off by default: the recipe key of a checkpoint without PatchDropout is unchanged
    assert "token_keep" not in dl.DistillRecipe().key() and dl.DistillRecipe(token_keep=0.5).key()["token_keep"] == 0.5


def test_coarse_tokens_average_each_cell_and_keep_the_prefix():
    from midas_nb.backbones.token_schedules import coarse_tokens

    g = torch.Generator().manual_seed(4)
    B, P, D = 2, 2, 5
    tok = torch.randn(B, P + 4 * 6, D, generator=g)
    out = coarse_tokens(tok, P, (4, 6), (2, 3))
    assert out.shape == (B, P + 6, D) and torch.equal(out[:, :P], tok[:, :P])
    for c in range(6):                      # cell c = (r, q) of the 2x3 grid holds 2x2 patch tokens
        r, q = divmod(c, 3)
        rows = [P + (2 * r + dy) * 6 + 2 * q + dx for dy in (0, 1) for dx in (0, 1)]
        torch.testing.assert_close(out[:, P + c], tok[:, rows].mean(1))
    with pytest.raises(ValueError, match="multiple of the cell grid"):
        coarse_tokens(tok, P, (4, 6), (3, 4))
    # off by default: the key of a checkpoint without the coarse stage is unchanged
    assert "coarse_epochs" not in dl.DistillRecipe().key()
    assert dl.DistillRecipe(coarse_epochs=3).key()["coarse_epochs"] == 3
    with pytest.raises(ValueError, match="do not combine"):
        dl.DistillRecipe(coarse_epochs=3, token_keep=0.5)


def test_train_accuracy_leaves_out_mixed_batches(tmp_path, monkeypatch):
    """A MixToken batch has two labels: the bar's train_acc counts the unmixed batches only (None, shown "all mixed",
    where every batch of an epoch is mixed), so it does not swing with the number of mixed batches an epoch draws."""
    from dataclasses import replace

    train, test = ImageSet(20, 0), ImageSet(8, 1)
    for p, cache in ((1.0, "all"), (0.0, "none")):
        monkeypatch.setitem(bb.DISTILLED_RECIPES, "vit_smoke_deit", replace(dl.distill_recipe("vit_smoke_deit"),
                                                                             mix_prob=p))
        _, meta = bb.load_or_finetune("vit_smoke_deit", train, test, cache_dir=tmp_path / cache, **_recipe())
        steps = math.ceil(20 / 8)
        assert [h["mixed_batches"] for h in meta["history"]] == [steps if p else 0] * 2
        acc = [h["train_running_accuracy"] for h in meta["history"]]
        assert all(a is None for a in acc) if p else all(0 <= a <= 1 and a * 20 == round(a * 20) for a in acc)


def test_coarse_epochs_train_on_the_teacher_grid_first(tmp_path, monkeypatch):
    from dataclasses import replace

    recipe = replace(dl.distill_recipe("vit_smoke_deit"), coarse_epochs=1)
    monkeypatch.setitem(bb.DISTILLED_RECIPES, "vit_smoke_deit", recipe)
    from timm.models.vision_transformer import Block

    seen, orig = [], Block.forward

    def spy(self, x, *a, **kw):             # the token count each transformer block sees
        seen.append(x.shape[1])
        return orig(self, x, *a, **kw)

    monkeypatch.setattr(Block, "forward", spy)
    from midas_nb.backbones import features
    descs, bar = [], features._progress     # the bar says the first epochs are faster (its ETA rises after them)
    monkeypatch.setattr(features, "_progress", lambda it, total, desc, *a, **kw: descs.append(desc) or bar(
        it, total, desc, *a, **kw))
    train, test = ImageSet(20, 0), ImageSet(8, 1)
    model, meta = bb.load_or_finetune("vit_smoke_deit", train, test, cache_dir=tmp_path, **_recipe())
    assert [h["coarse"] for h in meta["history"]] == [True, False]
    assert meta["key"]["distill"]["coarse_epochs"] == 1
    n, depth, steps = model.patch_embed.num_patches, len(model.blocks), math.ceil(20 / 8)
    cells = (64 // 32) ** 2                 # the teacher's stride-32 grid at 64 px: 2x2 (patch grid 8x8)
    # epoch 1 on the teacher's grid, epoch 2 and evaluation on every patch token
    assert seen[:steps * depth] == [2 + cells] * (steps * depth)
    assert len(seen) > 2 * steps * depth and set(seen[steps * depth:]) == {2 + n}
    # another recipe, another checkpoint: the default request is not served the coarse build
    monkeypatch.setitem(bb.DISTILLED_RECIPES, "vit_smoke_deit", dl.DistillRecipe())
    _, plain = bb.load_or_finetune("vit_smoke_deit", train, test, cache_dir=tmp_path, **_recipe(epochs=1))
    assert plain["loaded_from_cache"] is False and "coarse_epochs" not in plain["key"]["distill"]
    assert [d for d in descs if d.startswith("distil")] == [
        "distil vit_smoke_deit, build 0 (coarse tokens to epoch 1: the ETA rises after)", "distil vit_smoke_deit, build 0"]
    # the registry's recipe is the only one a build takes (the key reads it); coarse < epochs
    with pytest.raises(ValueError, match="differs from DISTILLED_RECIPES"):
        dl.finetune_distilled("vit_smoke_deit", train, test, distill=recipe, **_recipe())
    monkeypatch.setitem(bb.DISTILLED_RECIPES, "vit_smoke_deit", replace(recipe, coarse_epochs=2))
    with pytest.raises(ValueError, match="coarse_epochs=2 must be < epochs=2"):
        bb.load_or_finetune("vit_smoke_deit", train, test, cache_dir=tmp_path, **_recipe())


def test_distillation_loss_by_hand():
    g = torch.Generator().manual_seed(2)
    lc, ld, t = torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g), torch.randn(5, 4, generator=g)
    y = torch.tensor([0, 1, 2, 3, 0])
    ce = F.cross_entropy(lc, y, label_smoothing=0.1)
    hard = dl.DistillRecipe(token="hard", alpha=0.5)
    torch.testing.assert_close(dl.distillation_loss(lc, ld, y, t, hard),
                               0.5 * ce + 0.5 * F.cross_entropy(ld, t.argmax(-1)))
    soft = dl.DistillRecipe(token="soft", alpha=0.3, tau=2.0)
    p, logq = torch.softmax(t / 2, -1), torch.log_softmax(ld / 2, -1)
    kl = (p * (p.log() - logq)).sum(-1).mean()
    torch.testing.assert_close(dl.distillation_loss(lc, ld, y, t, soft), 0.7 * ce + 0.3 * 4.0 * kl)
    # MixToken: every label cross-entropy is mixed by the kept area
    y2 = torch.tensor([1, 2, 3, 0, 1])
    mixed = 0.6 * ce + 0.4 * F.cross_entropy(lc, y2, label_smoothing=0.1)
    torch.testing.assert_close(dl.distillation_loss(lc, ld, y, t, hard, labels_mixed=y2, lam=0.6),
                               0.5 * mixed + 0.5 * F.cross_entropy(ld, t.argmax(-1)))
    # a student that equals the teacher pays only the class-token term
    torch.testing.assert_close(dl.distillation_loss(lc, t, y, t, soft), 0.7 * ce)
    with pytest.raises(ValueError, match="token"):
        dl.DistillRecipe(token="feature")


# ----------------------------------------------------------------------------- training and caching


def _recipe(**kw):
    """``recipe`` (a TrainingRecipe of the schedule keys in ``kw`` over the defaults) and the other
    keyword arguments of the training functions (``progress=False`` by default)."""
    fields = {k: kw.pop(k) for k in list(kw) if k in ("epochs", "batch_size", "lr", "warmup_epochs", "seed")}
    recipe = bb.TrainingRecipe(**dict(dict(epochs=2, batch_size=8, lr=2e-3, warmup_epochs=1, seed=0), **fields))
    return dict(dict(recipe=recipe, progress=False), **kw)


def test_finetune_distilled_trains_caches_and_reports_the_teacher(tmp_path):
    train, test = ImageSet(20, 0), ImageSet(8, 1)
    model, meta = bb.load_or_finetune("vit_smoke_deit", train, test, cache_dir=tmp_path, **_recipe())
    assert meta["loaded_from_cache"] is False and num_prefix_tokens(model) == 2
    d = meta["distillation"]
    assert d["token"] == "soft" and d["oof_folds"] == 5 and d["version"] == dl.DISTILL_VERSION
    for k in ("teacher_test_accuracy", "teacher_train_accuracy_out_of_fold", "student_test_accuracy_cls",
              "student_test_accuracy_dist", "student_test_accuracy"):
        assert 0.0 <= d[k] <= 1.0, k
    assert meta["test_accuracy"] == d["student_test_accuracy"]
    # the teacher separates these colour-coded classes; the reported number is its test accuracy
    assert d["teacher_test_accuracy"] >= 0.75
    assert len(meta["history"]) == 2 and meta["history"][0]["token_label_loss"] > 0
    assert meta["key"]["distill"] == dl.distill_recipe("vit_smoke_deit").key()
    # the test accuracy is the model's own forward (mean of both heads)
    from midas_nb.backbones import evaluate_accuracy

    assert evaluate_accuracy(model, test) == pytest.approx(meta["test_accuracy"])
    again, meta2 = bb.load_or_finetune("vit_smoke_deit", train, test, cache_dir=tmp_path, **_recipe())
    assert meta2["loaded_from_cache"] is True and meta2["checkpoint_id"] == meta["checkpoint_id"]
    for (ka, a), (kb, b) in zip(model.state_dict().items(), again.state_dict().items()):
        assert ka == kb and torch.equal(a, b), ka


@pytest.mark.parametrize("name", ["vit_smoke", "vit_smoke_deit"])
def test_backbone_training_runs_fused_attention_and_returns_the_model_unfused(tmp_path, monkeypatch, name):
    """Both training loops (labels, distillation) and their accuracy evaluation go through
    ``F.scaled_dot_product_attention``; the returned backbone is unfused again, so capture's hooks
    on ``attn_drop`` see the attention matrix."""
    from midas_nb.backbones.features import ATTENTION_KERNEL

    calls = {"train": 0, "eval": 0}
    real = F.scaled_dot_product_attention

    def counting(*a, **kw):
        calls["train" if torch.is_grad_enabled() else "eval"] += 1
        return real(*a, **kw)

    monkeypatch.setattr(F, "scaled_dot_product_attention", counting)
    from midas_nb.backbones import features
    descs, bar = [], features._progress
    monkeypatch.setattr(features, "_progress", lambda it, total, desc, *a, **kw: descs.append(desc) or bar(
        it, total, desc, *a, **kw))
    train, test = ImageSet(16, 0), ImageSet(8, 1)
    model, meta = bb.finetune(name, train, test, **_recipe(epochs=1, cache_dir=tmp_path, seed=3))
    # a fresh reader saw "distil hybrid_lite0_deit, epoch 7/24" three times, once per build: the bar names it
    assert f"{'distil' if name.endswith('deit') else 'finetune'} {name}, build 3" in descs, descs
    blocks = len(model.blocks)
    assert calls["train"] == 2 * blocks        # 16 images in batches of 8: 2 steps, one call per block
    assert calls["eval"] == 3 * blocks         # train (2 batches) and test (1 batch) accuracy
    # the kernel changes the bits of the weights, so it is part of the checkpoint's numerics
    assert meta["attention"] == meta["key"]["numerics"]["attention"] == ATTENTION_KERNEL
    assert meta["machine"]["logical_cpus"] >= 1 and meta["machine"]["cpu_capability"]
    assert not any(m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))
    maps = capture(model, _images(2)[:, :, :64, :64]).attn
    assert len(maps) == blocks and maps[0].shape[-1] == maps[0].shape[-2] == 64 + num_prefix_tokens(model)


def test_fused_attention_training_step_is_the_unfused_computation():
    """Speed only: loss and every parameter gradient of one training step agree between timm's
    fused and unfused attention (float32, same inputs)."""
    from midas_nb.backbones.vit import fused_attention

    model = _smoke_deit().train()
    tokens = torch.randn(4, 2 + 64, model.embed_dim, generator=torch.Generator().manual_seed(3))
    y = torch.tensor([0, 1, 2, 3])

    def step():
        model.zero_grad(set_to_none=True)
        z = model.norm(model.blocks(tokens))
        loss = F.cross_entropy(model.head(z[:, 0]), y) + F.cross_entropy(model.head_dist(z[:, 1]), y)
        loss.backward()
        return loss.detach(), {k: p.grad.clone() for k, p in model.named_parameters() if p.grad is not None}

    loss_u, grads_u = step()
    calls = []
    real = F.scaled_dot_product_attention
    with fused_attention(model), pytest.MonkeyPatch.context() as mp:
        mp.setattr(F, "scaled_dot_product_attention", lambda *a, **kw: calls.append(1) or real(*a, **kw))
        loss_f, grads_f = step()
    assert len(calls) == len(model.blocks)     # the second step really took the fused path
    assert grads_u.keys() == grads_f.keys() and any("attn.qkv" in k for k in grads_u)
    torch.testing.assert_close(loss_f, loss_u, rtol=1e-5, atol=1e-6)
    for k in grads_u:
        torch.testing.assert_close(grads_f[k], grads_u[k], rtol=1e-4, atol=1e-6, msg=k)


def test_checkpoint_key_names_the_distillation_recipe(monkeypatch):
    train, test = ImageSet(8, 0), ImageSet(4, 1)
    r = bb.TrainingRecipe(epochs=2, batch_size=8, lr=2e-3, warmup_epochs=1, seed=0)
    plain, _ = bb.checkpoint_key("vit_smoke", train, test, r)
    deit, key = bb.checkpoint_key("vit_smoke_deit", train, test, r)
    assert plain != deit and key["distill"]["mix_prob"] == dl.distill_recipe("vit_smoke_deit").mix_prob
    monkeypatch.setitem(dl.DISTILLED_RECIPES, "vit_smoke_deit", dl.DistillRecipe(mix_prob=0.0))
    changed, _ = bb.checkpoint_key("vit_smoke_deit", train, test, r)
    assert changed != deit


def test_finetune_distilled_rejects_initial_weights_and_plain_backbones(tmp_path):
    train, test = ImageSet(8, 0), ImageSet(4, 1)
    with pytest.raises(ValueError, match="weights must be None"):
        dl.finetune_distilled("vit_smoke_deit", train, test, weights=tmp_path / "w.pt", **_recipe())
    with pytest.raises(ValueError, match="distillation token"):
        dl.finetune_distilled("vit_smoke", train, test, distill=dl.DistillRecipe(), **_recipe())


def test_schedule_text_follows_the_recipe_of_the_dataset():
    """Notebooks 00 and 05 print one schedule: the quick profile trains hybrid_lite0_deit 60 epochs on the
    embedded synthetic set (``synthetic_finetune``, decision 0003) and 24 on a real CUB root, the first 18 of
    either on the teacher's grid (``DISTILLED_RECIPES``); the text reads the checkpoint's own ``meta``."""
    from midas_nb import config
    quick = config.get_profile("quick")
    assert config.finetune_settings(quick, "synthetic", "hybrid_lite0_deit")["epochs"] == 60
    assert config.finetune_settings(quick, "cub", "hybrid_lite0_deit")["epochs"] == 24
    coarse = bb.distill_recipe("hybrid_lite0_deit").key()["coarse_epochs"]
    assert bb.schedule_text(dict(epochs=60, distillation=dict(coarse_epochs=coarse))) == \
        "60 epochs, the first 18 on the teacher's stride-32 grid (coarse tokens)"
    assert bb.schedule_text(dict(epochs=15)) == "15 epochs"       # a label-trained backbone: no coarse stage
    assert bb.schedule_text({}) == "epochs unrecorded"


def test_a_distilled_students_summary_gives_its_teacher_and_each_head():
    """00 printed the student's top-1 at 136-147 % of its teacher's (the embedded synthetic set) with nothing to
    read it by: the summary now gives the teacher's top-1 and each head's, which 00's paragraph explains (the
    class-token head learns the labels with trainable blocks; the teacher is frozen ImageNet stages + a probe)."""
    from midas_nb.study import Study

    d = dict(teacher_test_accuracy=0.625, student_test_accuracy_cls=0.875, student_test_accuracy_dist=0.75)
    st = Study("smoke", backbone="vit_smoke_deit", progress=False)
    st.__dict__["_backbone"] = (bb.create_backbone("vit_smoke_deit", 4), dict(test_accuracy=0.8125, distillation=d))
    value = st.summary()["value"]
    assert (value["test accuracy"], value["test accuracy, teacher (frozen ImageNet stages + linear probe)"],
            value["test accuracy, class-token head (learns the labels)"],
            value["test accuracy, distillation head (learns the teacher's scores)"]) == ("0.812", "0.625", "0.875", "0.750")
    st.__dict__["_backbone"] = (bb.create_backbone("vit_smoke_deit", 4), dict(test_accuracy=0.8125))  # no teacher
    assert not any("teacher" in k or "head" in k for k in st.summary().index)
