"""Tests of midas_nb.metrics with hand-computed values and hand-built models."""
from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from midas_nb import metrics as M
from midas_nb.backbones.vit import forward_kept_tokens


# ---------------------------------------------------------------------------------------------
# a stand-in "ViT" whose answer is known
# ---------------------------------------------------------------------------------------------
class _PatchEmbed(nn.Module):
    """Token j = [mean of channel 0 over patch j, 0]."""

    def __init__(self, grid: int, patch: int):
        super().__init__()
        self.grid_size = (grid, grid)
        self.patch = patch

    def forward(self, images):
        v = F.avg_pool2d(images[:, :1], self.patch).flatten(1)          # [B,N]
        return torch.stack([v, torch.zeros_like(v)], dim=-1)            # [B,N,2]


class _EvidenceBlock(nn.Module):
    """CLS[0] += Σ_present_j token_j[0] · token_j[1] (value × position weight)."""

    def forward(self, x):
        out = x.clone()
        out[:, 0, 0] = out[:, 0, 0] + (x[:, 1:, 0] * x[:, 1:, 1]).sum(1)
        return out


class EvidenceViT(nn.Module):
    """Exposes what midas_nb.backbones.vit calls. The position embedding puts weight 1 on patch
    ``informative`` only, so logit_0 = value of that patch if it is in the sequence, else 0;
    logit_1 = 0. Hence p_0 = sigmoid(value) with the patch, 0.5 without it."""

    num_prefix_tokens = 1

    def __init__(self, grid: int = 4, patch: int = 4, informative: int = 5):
        super().__init__()
        n = grid * grid
        self.patch_embed = _PatchEmbed(grid, patch)
        w = torch.zeros(n)
        w[informative] = 1.0
        self.register_buffer("pos", torch.stack([torch.zeros(n), w], dim=-1))
        self.patch_drop = nn.Identity()
        self.norm_pre = nn.Identity()
        self.blocks = nn.Sequential(_EvidenceBlock())
        self.norm = nn.Identity()

    def _pos_embed(self, x):
        cls = torch.zeros(x.shape[0], 1, x.shape[2], dtype=x.dtype, device=x.device)
        return torch.cat([cls, x + self.pos], dim=1)

    def forward_head(self, x):
        z = x[:, 0, 0]
        return torch.stack([z, torch.zeros_like(z)], dim=-1)

    def forward(self, images):
        x = self._pos_embed(self.patch_embed(images))
        return self.forward_head(self.norm(self.blocks(x)))


def _tiny_vit(num_classes: int = 5):
    import timm

    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8,
                             depth=2, num_classes=num_classes).eval()


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------
def test_registry_metadata():
    names = M.list_metrics()
    for n in ("part_miou", "box_coverage", "insertion_deletion_auc", "decoupling_D",
              "point_in_box", "pruned_accuracy", "throughput"):
        assert n in names
    for n in names:
        spec = M.get_metric(n)
        assert isinstance(spec.higher_is_better, bool) and spec.reference and spec.summary
    insdel = M.get_metric("insertion_deletion_auc")
    assert insdel.field_directions == {"ins_auc": True, "del_auc": False, "idauc": True}
    assert M.part_miou.higher_is_better is True
    assert M.list_metrics("faithfulness") == ["insertion_deletion_auc"]
    with pytest.raises(ValueError, match="unknown metric 'nope'"):
        M.get_metric("nope")


# ---------------------------------------------------------------------------------------------
# part mIoU / box coverage
# ---------------------------------------------------------------------------------------------
def _grid(rows):
    return torch.tensor(rows, dtype=torch.bool).flatten()


def test_part_miou_4x4_by_hand():
    keep = torch.stack([
        _grid([[1, 1, 0, 0], [1, 1, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
        _grid([[1, 1, 1, 1], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
        _grid([[1, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
        _grid([[0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]),
    ])
    part = torch.stack([
        _grid([[0, 1, 1, 0], [0, 1, 1, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),
        _grid([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 1]]),
        _grid([[0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0], [0, 0, 0, 0]]),   # no visible part
        _grid([[0, 0, 0, 0], [0, 1, 1, 0], [0, 0, 1, 0], [0, 0, 0, 0]]),
    ])
    # image 0: ∩ = {(0,1),(1,1)} = 2, ∪ = 4 + 4 − 2 = 6 → 1/3
    # image 1: ∩ = 0, ∪ = 4 + 1 = 5 → 0
    # image 2: no part patch → skipped (NaN), counted
    # image 3: identical masks of 3 patches → 1
    # mean over the 3 valid images = (1/3 + 0 + 1) / 3 = 4/9
    out = M.part_miou(keep, part)
    assert out.name == "part mIoU"
    assert out.n_images == 4 and out.n_skipped == 1 and out.n_used == 3
    assert out.per_image[0].item() == pytest.approx(1 / 3)
    assert out.per_image[1].item() == 0.0
    assert math.isnan(out.per_image[2].item())
    assert out.per_image[3].item() == 1.0
    assert out.mean == pytest.approx(4 / 9)

    box = M.box_coverage(keep, part)
    assert box.name == "box coverage" and box.mean == pytest.approx(4 / 9) and box.n_skipped == 1


def test_part_miou_all_skipped_and_shape_error():
    keep = torch.ones(2, 16, dtype=torch.bool)
    out = M.part_miou(keep, torch.zeros(2, 16, dtype=torch.bool))
    assert out.n_skipped == 2 and math.isnan(out.mean)
    with pytest.raises(ValueError, match="same shape"):
        M.part_miou(keep, torch.zeros(2, 9, dtype=torch.bool))


# ---------------------------------------------------------------------------------------------
# AUC helpers
# ---------------------------------------------------------------------------------------------
def test_insertion_counts_round_half_up():
    assert M.insertion_counts(16, 4) == [0, 4, 8, 12, 16]
    # s·10/4 = 0, 2.5, 5, 7.5, 10 → halves rounded up
    assert M.insertion_counts(10, 4) == [0, 3, 5, 8, 10]
    with pytest.raises(ValueError):
        M.insertion_counts(10, 0)


def test_curve_auc_known_curves():
    f = torch.tensor(M.insertion_counts(10, 5), dtype=torch.float32) / 10
    assert M.curve_auc(f.clone(), f).item() == pytest.approx(0.5)          # p = f
    assert M.curve_auc(torch.ones(6), f).item() == pytest.approx(1.0)
    # step: p = 0 for f < 0.5, 1 from f = 0.5 on; f = 0, .25, .5, .75, 1
    # trapezoids: 0 + (0+1)/2·.25 + .25 + .25 = 0.625
    f4 = torch.tensor([0.0, 0.25, 0.5, 0.75, 1.0])
    step = torch.tensor([[0.0, 0.0, 1.0, 1.0, 1.0]])
    assert M.curve_auc(step, f4).tolist() == pytest.approx([0.625])


def test_gaussian_blur_matches_scipy():
    from scipy.ndimage import gaussian_filter

    torch.manual_seed(0)
    x = torch.rand(2, 3, 16, 20, dtype=torch.float64)
    got = M.gaussian_blur(x, sigma=5.0, kernel_size=11)
    ref = np.stack([np.stack([gaussian_filter(x[b, c].numpy(), sigma=5.0, truncate=1.0, mode="mirror")
                              for c in range(3)]) for b in range(2)])
    np.testing.assert_allclose(got.numpy(), ref, atol=1e-12)
    with pytest.raises(ValueError, match="odd kernel_size"):
        M.gaussian_blur(x, kernel_size=4)


# ---------------------------------------------------------------------------------------------
# insertion / deletion on the stand-in model (answer known)
# ---------------------------------------------------------------------------------------------
Q = 1.0 / (1.0 + math.exp(-3.0))     # p_0 = sigmoid(3) with the informative patch present


def _ranking_with(pos_of_informative: int, n: int = 16, informative: int = 5):
    """Scores over patches such that patch ``informative`` has rank ``pos_of_informative``."""
    order = [j for j in range(n) if j != informative]
    order.insert(pos_of_informative, informative)
    scores = torch.empty(n)
    scores[torch.tensor(order)] = torch.arange(n, 0, -1, dtype=torch.float32)
    return scores


@pytest.mark.parametrize("batch_size", [None, 2])
def test_idauc_token_space_exact(batch_size):
    model = EvidenceViT()
    images = torch.full((4, 3, 16, 16), 3.0)                # every patch value 3
    ranking = torch.stack([
        _ranking_with(0),                # informative first
        _ranking_with(15),               # informative last
        _ranking_with(7),                # rank 7: inside the top 8, outside the top 4
        torch.zeros(16),                 # all tied → index order → rank 5, same as above
    ])
    out = M.insertion_deletion_auc(model, images, ranking, steps=4, batch_size=batch_size)
    assert out.class_index.tolist() == [0, 0, 0, 0]        # full model predicts class 0
    assert out.fractions.tolist() == [0.0, 0.25, 0.5, 0.75, 1.0]
    h = 0.5
    exp_ins = [[h, Q, Q, Q, Q], [h, h, h, h, Q], [h, h, Q, Q, Q], [h, h, Q, Q, Q]]
    exp_del = [[Q, h, h, h, h], [Q, Q, Q, Q, h], [Q, Q, h, h, h], [Q, Q, h, h, h]]
    torch.testing.assert_close(out.ins_curve, torch.tensor(exp_ins))
    torch.testing.assert_close(out.del_curve, torch.tensor(exp_del))
    # first: ins = .25·(.5+q)/2 + .75q, del = .25·(q+.5)/2 + .75·.5 → IDAUC = .75(q − .5)
    # last: the mirror image → −.75(q − .5); rank 7: .25(q − .5)
    d = Q - 0.5
    assert out.idauc.tolist() == pytest.approx([0.75 * d, -0.75 * d, 0.25 * d, 0.25 * d], abs=1e-6)
    assert out.ins_auc[0].item() == pytest.approx(0.25 * (0.5 + Q) / 2 + 0.75 * Q, abs=1e-6)
    assert out.del_auc[0].item() == pytest.approx(0.25 * (Q + 0.5) / 2 + 0.75 * 0.5, abs=1e-6)
    assert out.idauc[0] > 0 > out.idauc[1]


def test_idauc_explicit_class_flips_sign():
    model = EvidenceViT()
    images = torch.full((2, 3, 16, 16), 3.0)
    ranking = torch.stack([_ranking_with(0), _ranking_with(15)])
    out = M.insertion_deletion_auc(model, images, ranking, steps=4, class_index=torch.tensor([1, 1]))
    # p_1 = 1 − p_0 → every AUC difference changes sign
    d = Q - 0.5
    assert out.idauc.tolist() == pytest.approx([-0.75 * d, 0.75 * d], abs=1e-6)


def test_idauc_pixel_space_exact():
    from scipy.ndimage import gaussian_filter

    model = EvidenceViT()
    torch.manual_seed(1)
    images = torch.rand(2, 3, 16, 16) * 2 - 1
    ranking = torch.stack([_ranking_with(0), _ranking_with(15)])
    out = M.insertion_deletion_auc(model, images, ranking, steps=4, space="pixel")
    # logit_0 = mean of channel 0 over patch 5 (rows 4..7, cols 4..7) of whatever image is fed
    sig = lambda z: 1.0 / (1.0 + math.exp(-z))  # noqa: E731
    for b in range(2):
        img0 = images[b, 0].double().numpy()
        z_orig = img0[4:8, 4:8].mean()
        z_blur = gaussian_filter(img0, sigma=5.0, truncate=1.0, mode="mirror")[4:8, 4:8].mean()
        c = 0 if z_orig > 0 else 1
        assert out.class_index[b].item() == c
        p = (lambda z: sig(z)) if c == 0 else (lambda z: 1 - sig(z))
        pin, pout, pblur = p(z_orig), 0.5, p(z_blur)         # deleted patch → value 0 → p = .5
        if b == 0:   # informative first
            ins, dele = [pblur, pin, pin, pin, pin], [pin, pout, pout, pout, pout]
        else:        # informative last
            ins, dele = [pblur, pblur, pblur, pblur, pin], [pin, pin, pin, pin, pout]
        assert out.ins_curve[b].tolist() == pytest.approx(ins, abs=1e-5)
        assert out.del_curve[b].tolist() == pytest.approx(dele, abs=1e-5)
    assert out.space == "pixel"


def test_idauc_token_space_matches_naive_loop_on_timm_vit():
    model = _tiny_vit()
    torch.manual_seed(2)
    images = torch.randn(3, 3, 32, 32)
    ranking = torch.randn(3, 16)
    steps = 5
    out = M.insertion_deletion_auc(model, images, ranking, steps=steps)
    with torch.no_grad():
        c = model(images).argmax(-1)
        order = ranking.argsort(dim=1, descending=True)
        for b in range(3):
            for s, k in enumerate(M.insertion_counts(16, steps)):
                p_ins = forward_kept_tokens(model, images[b:b + 1], order[b:b + 1, :k]).softmax(-1)
                p_del = forward_kept_tokens(model, images[b:b + 1], order[b:b + 1, k:]).softmax(-1)
                assert out.ins_curve[b, s].item() == pytest.approx(p_ins[0, c[b]].item(), abs=1e-5)
                assert out.del_curve[b, s].item() == pytest.approx(p_del[0, c[b]].item(), abs=1e-5)
    assert out.class_index.tolist() == c.tolist()
    torch.testing.assert_close(out.idauc, out.ins_auc - out.del_auc)
    # batched by token count and chunked: same numbers
    out2 = M.insertion_deletion_auc(model, images, ranking, steps=steps, batch_size=1)
    torch.testing.assert_close(out.ins_curve, out2.ins_curve, atol=1e-5, rtol=0)


def test_idauc_from_tokens_embedded_once_is_the_same_for_every_ranking():
    """Tokens embedded once and p_c with all tokens computed once (the protocol shares them across its
    conditions, decision 0071) give the same curves, bit for bit, as the images themselves, for two rankings."""
    from midas_nb.backbones.vit import classify_tokens, embed_tokens, run_blocks
    model = _tiny_vit()
    torch.manual_seed(3)
    images = torch.randn(3, 3, 32, 32)
    with torch.no_grad():
        tokens = embed_tokens(model, images)
        logits = classify_tokens(model, run_blocks(model, tokens))
    c = logits.argmax(-1)
    full = logits.float().softmax(-1).gather(1, c[:, None]).squeeze(1)
    for ranking in (torch.randn(3, 16), torch.randn(3, 16)):
        a = M.insertion_deletion_auc(model, images, ranking, steps=4, class_index=c)
        b = M.insertion_deletion_auc(model, tokens, ranking, steps=4, class_index=c, full_probs=full)
        assert torch.equal(a.ins_curve, b.ins_curve) and torch.equal(a.del_curve, b.del_curve)
    with pytest.raises(ValueError, match="full_probs needs"):
        M.insertion_deletion_auc(model, tokens, ranking, steps=4, full_probs=full)


def test_idauc_pixel_space_runs_on_timm_vit_and_restores_mode():
    model = _tiny_vit().train()
    images = torch.randn(2, 3, 32, 32)
    out = M.insertion_deletion_auc(model, images, torch.randn(2, 16), steps=4, space="pixel")
    assert model.training                                   # mode restored
    with torch.no_grad():
        p = model.eval()(images).softmax(-1).gather(1, out.class_index[:, None]).squeeze(1)
    torch.testing.assert_close(out.ins_curve[:, -1], p, atol=1e-5, rtol=0)
    torch.testing.assert_close(out.del_curve[:, 0], p, atol=1e-5, rtol=0)


def test_idauc_input_errors():
    model = EvidenceViT()
    images = torch.zeros(2, 3, 16, 16)
    with pytest.raises(ValueError, match="ranking must be"):
        M.insertion_deletion_auc(model, images, torch.zeros(2, 15))
    with pytest.raises(ValueError, match="NaN"):
        M.insertion_deletion_auc(model, images, torch.full((2, 16), math.nan))
    with pytest.raises(ValueError, match="space"):
        M.insertion_deletion_auc(model, images, torch.zeros(2, 16), space="pixels")  # type: ignore[arg-type]


# ---------------------------------------------------------------------------------------------
# decoupling D
# ---------------------------------------------------------------------------------------------
def _d_table():
    base = dict(dataset="cub", backbone="deit_s", depth=6, budget=0.25)
    rows = [
        dict(condition="reference", target="T0", seed=0, miou=0.40, idauc=0.30),
        dict(condition="reference", target="T0", seed=1, miou=0.42, idauc=0.32),
        dict(condition="T5", target="T5", seed=0, miou=0.43, idauc=0.305),
        dict(condition="T5", target="T5", seed=1, miou=0.44, idauc=0.322),
        dict(condition="T1", target="T1", seed=0, miou=0.35, idauc=0.28),
        dict(condition="T1", target="T1", seed=1, miou=0.36, idauc=0.29),
        # seed 2 has no reference row → compared with the reference mean (.41, .31)
        dict(condition="unsupervised", target="", seed=2, miou=0.45, idauc=0.30),
    ]
    return pd.DataFrame([dict(base, **r) for r in rows])


def test_decoupling_D_band_and_seed_pairing():
    out = M.decoupling_D(_d_table()).set_index("condition")
    # T5: per seed D = 3, 2 pp → 2.5 ± 0.7071; ΔIDAUC = .005, .002 → .0035 ≥ −.01: in band
    assert out.loc["T5", "D_pp"] == pytest.approx(2.5)
    assert out.loc["T5", "D_pp_std"] == pytest.approx(math.sqrt(0.5))
    assert out.loc["T5", "delta_idauc"] == pytest.approx(0.0035)
    assert out.loc["T5", "n_seeds"] == 2 and out.loc["T5", "ref_paired"]
    assert out.loc["T5", "in_band"] and out.loc["T5", "status"] == "in band"
    assert out.loc["T5", "D_cell"] == "+2.50"
    # T1: D = −5, −6 → −5.5; ΔIDAUC = −.02, −.03 → −.025: outside, kept and flagged
    assert out.loc["T1", "D_pp"] == pytest.approx(-5.5)
    assert not out.loc["T1", "in_band"] and out.loc["T1", "status"] == "outside band"
    assert out.loc["T1", "D_cell"] == "-5.50 (outside band)"
    # unsupervised vs the reference mean: D = 4 pp, ΔIDAUC = −0.01 exactly → on the edge, inside
    assert out.loc["unsupervised", "D_pp"] == pytest.approx(4.0)
    assert out.loc["unsupervised", "delta_idauc"] == pytest.approx(-0.01)
    assert out.loc["unsupervised", "in_band"] and not out.loc["unsupervised", "ref_paired"]
    assert out.loc["reference", "D_pp"] == 0.0 and out.loc["reference", "in_band"]
    assert len(out) == 4                                   # nothing dropped


def test_decoupling_D_per_seed_units_and_errors():
    per = M.decoupling_D(_d_table(), per_seed=True)
    t5 = per[per.condition == "T5"].sort_values("seed")
    assert t5["D_pp"].tolist() == pytest.approx([3.0, 2.0])
    pct = _d_table().assign(miou=lambda d: d.miou * 100)
    out = M.decoupling_D(pct, miou_unit="percent").set_index("condition")
    assert out.loc["T5", "D_pp"] == pytest.approx(2.5)
    with pytest.raises(ValueError, match="no reference row"):
        M.decoupling_D(_d_table(), reference="T0")
    with pytest.raises(ValueError, match="missing column"):
        M.decoupling_D(_d_table().drop(columns="idauc"))


# ---------------------------------------------------------------------------------------------
# LaSt-ViT probes
# ---------------------------------------------------------------------------------------------
def test_patch_score_by_hand():
    h = torch.tensor([[[1.0, 0.0],        # CLS
                       [5.0, 5.0],        # distillation token (stripped with P=2)
                       [2.0, 0.0], [0.0, 3.0], [-1.0, 0.0], [1.0, 1.0]]])
    s = M.patch_score(h, num_prefix=2)
    assert s.shape == (1, 4)
    assert s[0].tolist() == pytest.approx([1.0, 0.0, -1.0, 1 / math.sqrt(2)])


def test_point_in_box_hand_built_map():
    scores = torch.tensor([[0.1, 0.9, 0.2, 0.3],
                           [0.5, 0.5, 0.1, 0.0],      # tie → the lower index (0) is the top
                           [0.0, 0.0, 0.0, 1.0]])
    box = torch.tensor([[0, 1, 0, 0], [0, 1, 1, 1], [1, 1, 1, 0]], dtype=torch.bool)
    assert M.point_in_box(scores, box).tolist() == [True, False, False]


# ---------------------------------------------------------------------------------------------
# accuracy, throughput, bootstrap
# ---------------------------------------------------------------------------------------------
def test_pruned_accuracy():
    logits = torch.tensor([[2.0, 1.0], [0.0, 3.0], [1.0, 0.5]])
    assert M.pruned_accuracy(logits, torch.tensor([0, 1, 1])) == pytest.approx(2 / 3)


def test_measure_throughput_calls():
    calls = []
    x = torch.zeros(4, 3)
    ips = M.measure_throughput(lambda b: calls.append(b.shape[0]), x, repeats=3, warmup=2)
    assert calls == [4] * 5 and ips > 0 and math.isfinite(ips)


def test_bootstrap_ci():
    m, lo, hi = M.bootstrap_ci(torch.full((50,), 0.1))
    assert hi - lo == 0.0 and m == pytest.approx(0.1)
    assert M.bootstrap_ci([1.0, math.nan, 1.0]) == (1.0, 1.0, 1.0)
    assert all(math.isnan(v) for v in M.bootstrap_ci([math.nan]))
    # Bernoulli(0.5), n = 400: standard error 0.025 → 95% CI ≈ 0.5 ± 0.049
    v = np.array([0.0, 1.0] * 200)
    m, lo, hi = M.bootstrap_ci(v, n_boot=2000, seed=3)
    assert m == 0.5 and lo == pytest.approx(0.451, abs=0.01) and hi == pytest.approx(0.549, abs=0.01)
    assert M.bootstrap_ci(v, seed=3) == M.bootstrap_ci(v, seed=3)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("space", ["token", "pixel"])
def test_idauc_cuda_matches_cpu(space):
    model = _tiny_vit()
    torch.manual_seed(4)
    images, ranking = torch.randn(3, 3, 32, 32), torch.randn(3, 16)
    cpu = M.insertion_deletion_auc(model, images, ranking, steps=4, space=space)
    gpu = M.insertion_deletion_auc(model.cuda(), images, ranking, steps=4, space=space, device="cuda")
    assert gpu.idauc.device.type == "cuda"
    torch.testing.assert_close(gpu.ins_curve.cpu(), cpu.ins_curve, atol=1e-4, rtol=0)
    torch.testing.assert_close(gpu.del_curve.cpu(), cpu.del_curve, atol=1e-4, rtol=0)
