"""LaSt-ViT against its official code, and Point-in-Box beside its baselines.

The official computation is transcribed below from github.com/ChengShiest/LAST-ViT,
``cls_pretrain/conf.py``, class ``dense_vit`` (``gaussian_kernel_1d`` and the part of ``forward``
after ``self.encoder``), with the hard-coded ``768`` replaced by the width ``D`` and ``k=1`` by a
parameter.
"""
from __future__ import annotations

import math

import pytest
import timm
import torch
from torch import nn

from midas_nb.metrics import box_share, centre_in_box, centre_patch, point_in_box
from midas_nb.analysis.last import LaStViT, last_aggregate, last_finetune
from midas_nb.analysis.last import pib_columns, pib_table
from midas_nb.targets import (channel_lowpass, compute_targets, get_target, last_window, stability_ratio,
                              stability_votes)
from midas_nb.targets import cache as target_cache_module
from midas_nb.analysis import last as last_module
from tiny_data import TinyDataset


# ------------------------------------------------------------------ official code, transcribed
class _Official(nn.Module):
    def __init__(self, hidden_dim: int, k: int = 1):
        super().__init__()
        self.hidden_dim, self.k = hidden_dim, k
        self.cached_kernel = None

    def gaussian_kernel_1d(self, kernel_size, sigma):
        kernel = torch.exp(-0.5 * (torch.arange(-kernel_size // 2 + 1, kernel_size // 2 + 1).float() / sigma) ** 2)
        kernel = kernel / torch.max(kernel)
        return kernel

    def forward(self, x):          # x = self.encoder(x): all tokens after the final LayerNorm
        if self.cached_kernel is None:
            self.cached_kernel = self.gaussian_kernel_1d(self.hidden_dim, self.hidden_dim ** 0.5).to(
                x.device).unsqueeze(0).unsqueeze(0)
        x_detach = x[:, 1:]
        x = torch.fft.fft(x[:, 1:], dim=-1)
        gs_k = self.cached_kernel.to(x.device)
        x = torch.fft.fftshift(x, dim=-1)
        x = x * (gs_k)
        x = torch.fft.ifftshift(x, dim=-1)
        x = torch.fft.ifft(x, dim=-1).real
        diff = x_detach / torch.abs(x - x_detach)
        _, indices = torch.topk(diff, k=self.k, dim=1, largest=True)
        sel_p = torch.gather(x_detach, 1, indices)
        cls_token = torch.mean(sel_p, dim=1)
        return cls_token, indices, diff


def _vit(name: str = "vit_tiny_patch16_224"):
    torch.manual_seed(0)
    model = timm.create_model(name, pretrained=False, img_size=64, num_classes=10, depth=2)
    with torch.no_grad():                       # non-trivial norm and head weights
        for p in model.parameters():
            p.add_(0.05 * torch.randn_like(p))
    return model.eval()


def _votes(indices: torch.Tensor, n: int) -> torch.Tensor:
    B = indices.shape[0]
    return torch.zeros(B, n).scatter_add_(1, indices.reshape(B, -1), torch.ones(B, indices.numel() // B))


@pytest.mark.parametrize("k", [1, 8])
def test_package_matches_the_official_dense_vit_on_a_timm_vit(k):
    torch.set_num_threads(1)
    model = _vit()
    images = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        x = model.forward_features(images)                  # blocks, then the final LayerNorm
        official = _Official(x.shape[-1], k)
        cls_token, indices, diff = official(x)
        patches = x[:, 1:]
        torch.testing.assert_close(stability_ratio(patches), diff, rtol=0, atol=0)
        assert torch.equal(stability_ratio(patches).topk(k, dim=1).indices, indices)
        assert torch.equal(stability_votes(patches, num_votes=k), _votes(indices, patches.shape[1]))
        torch.testing.assert_close(last_aggregate(patches, k), cls_token, rtol=0, atol=0)
        # the LaSt head on the last block's output: heads(cls_token) of the official forward
        last = LaStViT(model, tune_blocks=1, aggregation="last", num_tokens=k)
        torch.testing.assert_close(last(images), model.head(cls_token), rtol=1e-5, atol=1e-6)
        # the target at L = depth: votes of the official selection on the same tokens
        votes = compute_targets(model, images, ["last_votes"], len(model.blocks), torch.tensor([0, 1, 2]))
    off_n2 = _Official(x.shape[-1], patches.shape[1] // 2)(x)[1]
    assert torch.equal(votes["last_votes"], _votes(off_n2, patches.shape[1]))


def test_a_distilled_backbone_keeps_both_heads():
    """A distilled ViT (timm VisionTransformerDistilled) answers (head(CLS) + head_dist(dist))/2:
    the "cls" control before any step is that backbone, and LaSt averages both heads on ``z``."""
    model = _vit("deit_tiny_distilled_patch16_224")
    assert (model.head.weight - model.head_dist.weight).abs().max() > 0.05
    images = torch.randn(3, 3, 64, 64, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        cls = LaStViT(model, tune_blocks=1, aggregation="cls")
        torch.testing.assert_close(cls(images), model(images), rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(cls.scores_and_logits(images)[1], model(images), rtol=1e-5, atol=1e-6)
        z = last_aggregate(model.forward_features(images)[:, 2:], 1)
        expected = (model.head(z) + model.head_dist(z)) / 2
        torch.testing.assert_close(LaStViT(model, tune_blocks=1)(images), expected, rtol=1e-5, atol=1e-6)


def test_window_is_the_official_one_off_centre_for_even_width():
    for d in (6, 7, 192):
        torch.testing.assert_close(last_window(d), _Official(d).gaussian_kernel_1d(d, d ** 0.5), rtol=0, atol=0)
    # a channel-constant token lives in the zero-frequency bin: for odd D the window's peak is on
    # it (kept), for even D the peak is one bin below, so the constant is scaled by exp(−1/(2D))
    torch.testing.assert_close(channel_lowpass(torch.full((1, 1, 7), 2.0)), torch.full((1, 1, 7), 2.0))
    torch.testing.assert_close(channel_lowpass(torch.full((1, 1, 8), 2.0)),
                               torch.full((1, 1, 8), 2.0 * math.exp(-1 / 16)))


def test_last_votes_needs_the_final_norm():
    model = _vit()
    with torch.no_grad():
        h = model.blocks(model._pos_embed(model.patch_embed(torch.randn(2, 3, 64, 64))))
    from midas_nb.capture import CaptureResult
    cap = CaptureResult(logits=torch.zeros(2, 10), class_index=torch.zeros(2, dtype=torch.long), labels=None,
                        attn=[torch.zeros(2, 1, 17, 17)], attn_grad=[], attn_grad_loss=[], hidden_in=[h], hidden=[h], hidden_grad=[],
                        hidden_grad_loss=[], attn_in=[], attn_out=[], mlp_in=[], mlp_out=[], num_prefix_tokens=1,
                        grid_size=(4, 4))
    with pytest.raises(ValueError, match="final norm"):
        get_target("last_votes")(cap, 1, cap.class_index)
    cap.extras["final_norm"] = model.norm
    with torch.no_grad():
        expected = stability_votes(model.norm(h)[:, 1:])
    assert torch.equal(get_target("last_votes")(cap, 1, cap.class_index), expected)


# ------------------------------------------------------------------ cache keys
def test_the_statistic_version_is_in_the_cache_keys(tmp_path, monkeypatch):
    key = target_cache_module._cache_key({"d": 1}, 1, "label", _vit(), 0)
    assert key["last_statistic"] == target_cache_module.LAST_STATISTIC
    monkeypatch.setattr(target_cache_module, "LAST_STATISTIC", "another")
    other = target_cache_module._cache_key({"d": 1}, 1, "label", _vit(), 0)
    assert target_cache_module.target_cache_path(key, tmp_path) != target_cache_module.target_cache_path(other, tmp_path)
    monkeypatch.undo()

    torch.manual_seed(0)
    bb = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                           embed_dim=32, num_heads=2, num_classes=4).eval()
    train = TinyDataset(8, 0)
    kw = dict(epochs=1, batch_size=8, progress=False, key={"ck": "t"}, cache_dir=tmp_path)
    first = last_finetune(bb, train, **kw)
    assert first.history["settings"]["statistic"] == last_module.LAST_STATISTIC
    assert first.history["settings"]["num_tokens"] == 1                  # the official K
    assert last_finetune(bb, train, **kw).history["from_cache"]
    monkeypatch.setattr(last_module, "LAST_STATISTIC", "another")
    assert not last_finetune(bb, train, **kw).history["from_cache"]


# ------------------------------------------------------------------ Point-in-Box baselines
def test_pib_baselines_and_paired_comparison_by_hand():
    assert centre_patch((3, 3)) == 4 and centre_patch((2, 2)) == 3 and centre_patch((2, 4)) == 6
    # 3 images on a 3×3 grid
    box = torch.zeros(3, 9, dtype=torch.bool)
    box[0, [4, 5]] = True            # centre in, share 2/9
    box[1, [0, 1, 2]] = True         # centre out, share 3/9
    box[2, :] = True                 # centre in, share 1
    assert centre_in_box(box, (3, 3)).tolist() == [True, False, True]
    torch.testing.assert_close(box_share(box), torch.tensor([2 / 9, 3 / 9, 1.0]))
    scores = torch.zeros(3, 9)
    scores[0, 5] = scores[1, 8] = scores[2, 0] = 1.0
    hits = point_in_box(scores, box)                                       # [True, False, True]
    ref = torch.tensor([False, False, True])
    cols = pib_columns(hits, box, (3, 3), reference_hits=ref, n_boot=50)
    assert cols["pib"] == pytest.approx(2 / 3) and cols["pib_centre"] == pytest.approx(2 / 3)
    assert cols["pib_box_area"] == pytest.approx((2 / 9 + 3 / 9 + 1) / 3)
    assert cols["pib_delta"] == pytest.approx(1 / 3) and cols["pib_agreement"] == pytest.approx(2 / 3)
    assert 0 <= cols["pib_delta_lo"] <= cols["pib_delta"] <= cols["pib_delta_hi"] <= 1
    with pytest.raises(ValueError, match="grid_size"):
        centre_in_box(box, (2, 2))
    with pytest.raises(ValueError, match="same images"):
        pib_columns(hits[:2], box, (3, 3))


def test_pib_table_reports_baselines_K_and_agreement():
    torch.manual_seed(0)
    bb = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=2,
                           embed_dim=32, num_heads=2, num_classes=4).eval()
    test = TinyDataset(6, 3)
    last = LaStViT(bb, aggregation="last", num_tokens=2)
    table = pib_table({"backbone": bb, "LaSt": last}, test, progress=False, n_boot=20)
    box = test.box_mask.bool()
    assert table.pib_centre.tolist() == pytest.approx([centre_in_box(box, (4, 4)).float().mean().item()] * 2)
    assert table.pib_box_area.tolist() == pytest.approx([box.float().mean(1).mean().item()] * 2)
    assert math.isnan(table.last_K[0]) and table.last_K[1] == 2
    assert table.pib_delta[0] == 0 and table.pib_agreement[0] == 1
    with torch.no_grad():
        x = bb.norm(bb.blocks(bb._pos_embed(bb.patch_embed(test.images))))
        z = last_aggregate(x[:, 1:], 2)
        hits_last = point_in_box(torch.cosine_similarity(x[:, 1:], z[:, None], dim=-1), box)
        hits_bb = point_in_box(torch.cosine_similarity(x[:, 1:], x[:, :1], dim=-1), box)
    assert table.pib[1] == pytest.approx(hits_last.float().mean().item())
    assert table.pib_agreement[1] == pytest.approx((hits_last == hits_bb).float().mean().item())
    with pytest.raises(ValueError, match="reference"):
        pib_table({"backbone": bb}, test, reference="nope", progress=False)
