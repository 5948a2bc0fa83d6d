"""Tests of midas_nb.backbones: the Lite0 stem, weights files, prefix tokens, the hybrid ViT,
stem-feature and checkpoint caches, and training to above chance."""
from __future__ import annotations

import json
from dataclasses import replace

import pytest
import timm
import torch
import torch.nn.functional as F

from midas_nb import backbones as bb
from midas_nb.backbones import BackboneError, create_backbone
from midas_nb.capture import capture
from midas_nb.backbones.vit import embed_tokens, grid_size, num_patches, num_prefix_tokens

# ImageNet-1k class indices of birds (7-24, 80-100, 127-146)
IMAGENET_BIRDS = set(range(7, 25)) | set(range(80, 101)) | set(range(127, 147))


class ListDataset(torch.utils.data.Dataset):
    """A hand-built dataset of ``midas_nb.data.Sample`` (no files)."""

    def __init__(self, images: torch.Tensor, labels: list[int], classes: list[str], split: str):
        from midas_nb.data import Sample

        self.classes, self.labels, self.split, self.root = classes, list(labels), split, f"mem://{split}"
        self.samples = [Sample(image=im, label=int(y), parts=torch.zeros(0, 3), box=torch.zeros(4),
                               part_mask=torch.zeros(1, dtype=torch.bool), box_mask=torch.zeros(1, dtype=torch.bool),
                               image_id=f"{split}{i}", index=i) for i, (im, y) in enumerate(zip(images, labels))]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    def __len__(self) -> int:
        return len(self.samples)

    def __getitem__(self, i):
        return self.samples[i]


def skimage_224(name: str) -> torch.Tensor:
    skdata = pytest.importorskip("skimage.data")
    im = torch.tensor(getattr(skdata, name)()).permute(2, 0, 1).float() / 255.0
    im = F.interpolate(im[None], size=(224, 224), mode="bilinear", antialias=True, align_corners=False)
    return (im - 0.5) / 0.5


# ----------------------------------------------------------------------------- stem


def test_lite0_reproduces_imagenet_predictions():
    model = bb.lite0_classifier()
    with torch.no_grad():
        logits = model(torch.cat([skimage_224("chelsea"), skimage_224("coffee")]))
    assert logits.argmax(-1).tolist() == [285, 967]  # Egyptian cat, espresso


def test_stem_is_the_stride16_stage_of_lite0():
    x = skimage_224("chelsea")
    stem = bb.lite0_stem()
    feats_only = timm.create_model("tf_efficientnet_lite0", pretrained=False, features_only=True, out_indices=(3,))
    sd = bb.lite0_timm_state_dict()
    feats_only.load_state_dict({k: v for k, v in sd.items() if k in feats_only.state_dict()})
    with torch.no_grad():
        a, b = stem(x), feats_only.eval()(x)[0]
    assert a.shape == (1, 112, 14, 14)
    torch.testing.assert_close(a, b, atol=1e-4, rtol=1e-4)
    assert not any(p.requires_grad for p in stem.parameters())


# ----------------------------------------------------------------------------- timm ViTs and files

DEPTH = 4  # DeiT widths and heads, fewer blocks: fast, and every key kind is still present


def _deit_file(tmp_path, suffix: str, num_classes: int = 7, arch: str = "deit_tiny_patch16_224"):
    torch.manual_seed(3)
    src = timm.create_model(arch, pretrained=False, num_classes=num_classes, img_size=32, depth=DEPTH)
    sd = src.state_dict()
    path = tmp_path / f"{arch}{suffix}"
    if suffix == ".safetensors":
        from safetensors.torch import save_file

        save_file({k: v.contiguous() for k, v in sd.items()}, str(path))
    else:
        torch.save({"model": sd}, path)  # the DeiT release layout
    return path, sd


@pytest.mark.parametrize("suffix", [".pth", ".safetensors"])
def test_local_file_round_trips_and_head_is_replaced(tmp_path, suffix):
    path, sd = _deit_file(tmp_path, suffix)
    model = create_backbone("deit_tiny_patch16_224.fb_in1k", num_classes=3, weights=path, img_size=32, depth=DEPTH)
    own = model.state_dict()
    assert own["head.weight"].shape == (3, 192)
    assert not torch.equal(own["head.weight"], sd["head.weight"][:3])
    for k, v in sd.items():
        if not k.startswith("head."):
            assert torch.equal(own[k], v), k
    same = create_backbone("deit_tiny_patch16_224.fb_in1k", num_classes=7, weights=path, img_size=32, depth=DEPTH)
    assert torch.equal(same.state_dict()["head.weight"], sd["head.weight"])  # head="auto" keeps a fitting head
    assert all(not m.fused_attn for m in model.modules() if hasattr(m, "fused_attn"))
    assert not model.training
    assert model.pretrained_cfg["file"] == str(path)


def test_weights_file_mismatch_gives_clear_error(tmp_path):
    path, sd = _deit_file(tmp_path, ".pth")
    broken = dict(sd)
    del broken["blocks.3.attn.qkv.weight"]
    broken["blocks.3.attn.qkv_typo.weight"] = sd["blocks.3.attn.qkv.weight"]
    bad = tmp_path / "broken.pth"
    torch.save(broken, bad)
    with pytest.raises(BackboneError, match=r"broken\.pth.*missing keys: blocks\.3\.attn\.qkv\.weight.*"
                                            r"unexpected keys: blocks\.3\.attn\.qkv_typo\.weight"):
        create_backbone("deit_tiny_patch16_224.fb_in1k", num_classes=3, weights=bad, img_size=32, depth=DEPTH)
    small, _ = _deit_file(tmp_path, ".pth", arch="deit_small_patch16_224")
    with pytest.raises(BackboneError, match=r"deit_small_patch16_224\.pth.*shape mismatches: .*\(384.*vs model \(192"):
        create_backbone("deit_tiny_patch16_224.fb_in1k", num_classes=3, weights=small, img_size=32, depth=DEPTH)
    with pytest.raises(BackboneError, match=r"classifier does not match num_classes=3.*head\.weight: file \(7, 192\)"):
        create_backbone("deit_tiny_patch16_224.fb_in1k", num_classes=3, weights=path, img_size=32, depth=DEPTH,
                        head="keep")
    with pytest.raises(BackboneError, match="does not exist"):
        create_backbone("deit_tiny_patch16_224.fb_in1k", num_classes=3, weights=tmp_path / "nope.pth")
    with pytest.raises(BackboneError, match="unknown backbone"):
        create_backbone("deit_tiny_patch16_224.no_such_tag_x", num_classes=3)
    with pytest.raises(BackboneError, match="not a timm VisionTransformer"):
        create_backbone("resnet18", num_classes=3)
    with pytest.raises(BackboneError, match="no hub weights"):
        create_backbone("vit_smoke", num_classes=3, weights="hub")


def test_distilled_deit_has_two_prefix_tokens():
    model = create_backbone("deit_tiny_distilled_patch16_224.fb_in1k", num_classes=4, img_size=32, depth=DEPTH)
    assert num_prefix_tokens(model) == 2
    x = torch.randn(2, 3, 32, 32)
    assert embed_tokens(model, x).shape == (2, 2 + 4, 192)
    res = capture(model, x)
    assert res.num_prefix_tokens == 2 and res.attn[0].shape == (2, 3, 6, 6)
    assert res.logits.shape == (2, 4)


def test_normalization_known_before_the_model():
    imagenet = ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225))
    mean, std = bb.backbone_normalization("deit_small_patch16_224.fb_in1k")
    assert mean == pytest.approx(imagenet[0]) and std == pytest.approx(imagenet[1])
    assert bb.backbone_normalization("vit_base_patch16_224.augreg_in21k_ft_in1k") == ((0.5,) * 3, (0.5,) * 3)
    assert bb.backbone_normalization("hybrid_lite0_vit") == ((0.5,) * 3, (0.5,) * 3)
    assert bb.backbone_normalization("vit_smoke") == ((0.5,) * 3, (0.5,) * 3)
    with pytest.raises(BackboneError):
        bb.backbone_normalization("not_a_model")
    assert set(bb.PAPER_BACKBONES) <= set(bb.list_backbones())


# ----------------------------------------------------------------------------- hybrid


@pytest.fixture(scope="module")
def hybrid():
    torch.manual_seed(0)
    return create_backbone("hybrid_lite0_vit", num_classes=5)


def test_hybrid_is_a_timm_vit_with_frozen_eval_stem(hybrid):
    from timm.models.vision_transformer import VisionTransformer

    assert isinstance(hybrid, VisionTransformer)
    assert grid_size(hybrid) == (14, 14) and num_patches(hybrid) == 196 and num_prefix_tokens(hybrid) == 1
    assert len(hybrid.blocks) == 12 and hybrid.embed_dim == 192
    assert hybrid.patch_embed.patch_size == (16, 16) and hybrid.patch_embed.img_size == (224, 224)
    stem = hybrid.patch_embed.backbone
    assert not any(p.requires_grad for p in stem.parameters())
    assert all(p.requires_grad for n, p in hybrid.named_parameters() if not n.startswith("patch_embed.backbone"))
    x = torch.randn(3, 3, 224, 224)
    with torch.no_grad():
        f_eval = hybrid.patch_embed.stem(x)
        hybrid.train()
        try:
            assert hybrid.training and hybrid.blocks[0].training
            assert not any(m.training for m in stem.modules())
            f_train = hybrid.patch_embed.stem(x)
            f_alone = hybrid.patch_embed.stem(x[:1])
        finally:
            hybrid.eval()
    torch.testing.assert_close(f_train, f_eval)  # ImageNet BatchNorm statistics, not batch statistics
    torch.testing.assert_close(f_alone, f_eval[:1], atol=1e-5, rtol=1e-5)
    # its weights are the package's ImageNet stem
    torch.testing.assert_close(f_eval, bb.lite0_stem()(x), atol=1e-4, rtol=1e-4)


def test_tokens_from_stem_features_match_embed_tokens(tmp_path):
    torch.manual_seed(0)
    hybrid = create_backbone("hybrid_lite0_vit", num_classes=5, depth=2)
    x = torch.randn(3, 3, 224, 224)
    ds = ListDataset(x, [0, 1, 2], ["a", "b", "c"], "test")
    feats = bb.stem_features(hybrid, ds, flip=True, batch_size=2, cache_dir=tmp_path, progress=False)
    assert feats.shape == (3, 2, 112, 14, 14) and feats.dtype == torch.float16
    with torch.no_grad():
        direct = hybrid.patch_embed.stem(x)
        mirrored = hybrid.patch_embed.stem(x.flip(-1))
        torch.testing.assert_close(feats[:, 0].float(), direct, atol=2e-2, rtol=1e-3)
        torch.testing.assert_close(feats[:, 1].float(), mirrored, atol=2e-2, rtol=1e-3)
        tok = bb.tokens_from_stem_features(hybrid, direct)
        torch.testing.assert_close(tok, embed_tokens(hybrid, x), atol=1e-5, rtol=1e-5)
    cached = list((tmp_path / "stem_features").glob("*.pt"))
    assert len(cached) == 1
    again = bb.stem_features(hybrid, ds, flip=True, cache_dir=tmp_path, progress=False)
    assert torch.equal(again, feats)
    # capture on cached tokens equals capture on images
    a = capture(hybrid, x[:2], class_index=torch.tensor([1, 2]))
    b = capture(hybrid, None, class_index=torch.tensor([1, 2]),
                tokens=bb.tokens_from_stem_features(hybrid, direct[:2]).detach())
    torch.testing.assert_close(a.attn_grad[1], b.attn_grad[1], atol=1e-5, rtol=1e-4)


def test_hybrid_checkpoint_round_trips_through_the_cache(tmp_path):
    g = torch.Generator().manual_seed(0)
    train = ListDataset(torch.randn(6, 3, 224, 224, generator=g), [0, 1, 0, 1, 0, 1], ["a", "b"], "train")
    test = ListDataset(torch.randn(2, 3, 224, 224, generator=g), [0, 1], ["a", "b"], "test")
    recipe = bb.TrainingRecipe(epochs=1, batch_size=4, lr=1e-3, warmup_epochs=0.5, seed=0)
    kw = dict(recipe=recipe, device="cpu", cache_dir=tmp_path, progress=False, backbone_kwargs=dict(depth=2))
    m1, meta1 = bb.load_or_finetune("hybrid_lite0_vit", train, test, **kw)
    assert meta1["loaded_from_cache"] is False
    m2, meta2 = bb.load_or_finetune("hybrid_lite0_vit", train, test, **kw)
    assert meta2["loaded_from_cache"] is True
    assert meta2["checkpoint_id"] == meta1["checkpoint_id"] and len(meta1["checkpoint_id"]) == 12
    s1, s2 = m1.state_dict(), m2.state_dict()
    assert s1.keys() == s2.keys() and all(torch.equal(s1[k], s2[k]) for k in s1)
    assert len(m2.blocks) == 2 and not m2.training
    on_disk = json.loads((tmp_path / f"hybrid_lite0_vit-{meta1['checkpoint_id']}.json").read_text())
    for key in ("backbone", "train_set", "test_set", "classes", "seed", "epochs", "train_accuracy",
                "test_accuracy", "versions"):
        assert key in on_disk, key
    assert on_disk["classes"] == ["a", "b"] and on_disk["train_set"]["num_images"] == 6
    assert on_disk["versions"]["timm"] == timm.__version__
    assert 0.0 <= on_disk["test_accuracy"] <= 1.0
    # another seed is another checkpoint
    _, meta3 = bb.load_or_finetune("hybrid_lite0_vit", train, test, **dict(kw, recipe=replace(recipe, seed=1)))
    assert meta3["loaded_from_cache"] is False and meta3["checkpoint_id"] != meta1["checkpoint_id"]


def test_dataset_fingerprint_follows_content_not_location():
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 3, 16, 16, generator=g)
    a = ListDataset(x, [0, 1, 0, 1], ["a", "b"], "train")
    b = ListDataset(x.clone(), [0, 1, 0, 1], ["a", "b"], "train")
    b.root = "/elsewhere/same/data"
    assert bb.dataset_fingerprint(a) == bb.dataset_fingerprint(b)
    y = x.clone()
    y[3, 0, 0, 0] += 1e-3  # another normalisation or crop of the last image
    assert bb.dataset_fingerprint(ListDataset(y, [0, 1, 0, 1], ["a", "b"], "train")) != bb.dataset_fingerprint(a)
    assert bb.dataset_fingerprint(ListDataset(x, [0, 1, 1, 1], ["a", "b"], "train")) != bb.dataset_fingerprint(a)
    assert bb.dataset_fingerprint(ListDataset(x, [0, 1, 0, 1], ["a", "b"], "test")) != bb.dataset_fingerprint(a)


# ----------------------------------------------------------------------------- smoke backbone


@pytest.fixture
def one_thread():
    """Tiny models train faster on one thread (and far faster on a shared, busy CPU)."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


def test_smoke_backbone_trains_well_above_chance(tmp_path, one_thread):
    from midas_nb.data import load_dataset

    mean, std = bb.backbone_normalization("vit_smoke")
    kw = dict(image_size=64, patch_size=8, mean=mean, std=std, num_classes=4, images_per_class=12,
              synthetic_image_size=96)
    train = load_dataset("synthetic", tmp_path / "synthetic", "train", **kw)
    test = load_dataset("synthetic", tmp_path / "synthetic", "test", **kw)
    model, meta = bb.finetune("vit_smoke", train, test, bb.TrainingRecipe(epochs=100, batch_size=8, lr=1e-3,
                                                                         warmup_epochs=5, seed=0),
                              device="cpu", cache_dir=tmp_path, progress=False, amp=False)
    assert grid_size(model) == (8, 8) and len(model.blocks) == 4 and num_prefix_tokens(model) == 1
    assert meta["test_accuracy"] >= 0.6, meta["history"][-1]  # 4 classes: chance 0.25
    # the accuracy reported from cached stem features is the model's accuracy on the images
    assert meta["test_accuracy"] == pytest.approx(bb.evaluate_accuracy(model, test, batch_size=8), abs=1 / 24)
    wide = create_backbone("vit_smoke_wide", num_classes=4)
    assert wide.embed_dim > model.embed_dim and grid_size(wide) == (8, 8)


# ----------------------------------------------------------------------------- real data


def test_stem_sees_birds_in_the_real_cub_subset(shared_data):
    from midas_nb.data import load_dataset

    root = shared_data / "cub200_subset"
    if not root.is_dir():
        pytest.skip(f"CUB subset not found at {root}")
    mean, std = bb.backbone_normalization("hybrid_lite0_vit")
    ds = load_dataset("cub", root, "test", image_size=224, patch_size=16, mean=mean, std=std)
    idx = torch.linspace(0, len(ds) - 1, 16).long().tolist()
    x = torch.stack([ds[i].image for i in idx])
    with torch.no_grad():
        pred = bb.lite0_classifier()(x).argmax(-1).tolist()
    birds = sum(p in IMAGENET_BIRDS for p in pred)
    assert birds >= 13, f"only {birds}/16 CUB images classified as ImageNet birds: {pred}"


def test_training_recipe_names_every_bad_field_at_once():
    with pytest.raises(ValueError, match=r"got epochs=0, lr=-1, label_smoothing=1\.0$"):
        bb.TrainingRecipe(epochs=0, batch_size=4, lr=-1, label_smoothing=1.0)
    with pytest.raises(ValueError, match=r"got batch_size=2\.5"):
        bb.TrainingRecipe(epochs=1, batch_size=2.5, lr=1e-3)
    with pytest.raises(ValueError, match=r"got epochs=True, lr=inf, weight_decay=None$"):
        bb.TrainingRecipe(epochs=True, batch_size=4, lr=float("inf"), weight_decay=None)
    r = bb.TrainingRecipe(epochs=3, batch_size=8, lr=1e-3)
    assert r.key() == dict(epochs=3, batch_size=8, lr=1e-3, warmup_epochs=0.0, seed=0, label_smoothing=0.1,
                           weight_decay=0.05)


def test_checkpoint_key_is_the_hash_of_its_documented_fields():
    """An independent writing of the key (checkpoint_key's docstring): model, weights, kwargs, both
    splits' model-input identities, the recipe's seven fields, its version and the numerics."""
    from midas_nb.identity import dataset_identity, hash_json

    g = torch.Generator().manual_seed(0)
    train = ListDataset(torch.randn(4, 3, 64, 64, generator=g), [0, 1, 0, 1], ["a", "b"], "train")
    test = ListDataset(torch.randn(2, 3, 64, 64, generator=g), [0, 1], ["a", "b"], "test")
    recipe = bb.TrainingRecipe(epochs=2, batch_size=4, lr=1e-3, warmup_epochs=1, seed=3)
    cid, key = bb.checkpoint_key("vit_smoke", train, test, recipe, backbone_kwargs=dict(depth=2), amp=False)
    by_hand = dict(model_name="vit_smoke", weights=None, backbone_kwargs=dict(depth=2),
                   train=dataset_identity(train).model_inputs, test=dataset_identity(test).model_inputs,
                   epochs=2, batch_size=4, lr=0.001, warmup_epochs=1.0, seed=3, label_smoothing=0.1,
                   weight_decay=0.05, recipe_version=1,
                   numerics=dict(device_type="cpu", precision="float32", attention=bb.ATTENTION_KERNEL,
                                 num_threads=torch.get_num_threads()))
    assert key == json.loads(json.dumps(by_hand, default=str)) and cid == hash_json(by_hand, 12)
