"""Scorers: registry, shapes, hand-computed MLP scores, T0 against the capture."""
from __future__ import annotations

import pytest
import timm
import torch
import torch.nn.functional as F

from midas_nb.capture import capture
from midas_nb.pruning import score_tokens
from midas_nb.scorers import (MLPScorer, RandomScorer, ReferenceScorer, TokenScorer, build_scorer,
                              cls_attention, list_scorers, register_scorer)


def tiny_vit(**kw):
    torch.manual_seed(0)
    args = dict(pretrained=False, img_size=32, patch_size=8, depth=3, embed_dim=32, num_heads=2,
                num_classes=5)
    args.update(kw)
    return timm.create_model("vit_tiny_patch16_224", **args).eval()


def test_registry_has_the_three_conditions_scorers():
    assert {"reference", "mlp", "random"} <= set(list_scorers())
    assert isinstance(build_scorer("reference", 32), ReferenceScorer)
    mlp = build_scorer("mlp", 32, hidden=7)
    assert isinstance(mlp, MLPScorer) and mlp.mlp[1].out_features == 7
    assert build_scorer("random", 32, seed=3).seed == 3
    with pytest.raises(ValueError, match="unknown scorer"):
        build_scorer("nope", 32)
    with pytest.raises(ValueError, match="already registered"):
        register_scorer("mlp")(lambda dim: MLPScorer(dim))


def test_mlp_scorer_matches_hand_computation():
    torch.manual_seed(1)
    scorer = MLPScorer(6, hidden=4)
    x = torch.randn(2, 1 + 5, 6)
    ln, l1, _, l2 = scorer.mlp
    h = F.layer_norm(x[:, 1:], (6,), ln.weight, ln.bias, ln.eps)
    h = h @ l1.weight.T + l1.bias
    h = 0.5 * h * (1 + torch.erf(h / 2 ** 0.5))                  # exact GELU
    expected = (h @ l2.weight.T + l2.bias).squeeze(-1)
    torch.testing.assert_close(scorer(x, 1), expected)
    # two prefix tokens: the two first tokens are not scored
    torch.testing.assert_close(scorer(x, 2), expected[:, 1:])


def test_reference_scorer_is_t0_of_the_capture():
    model = tiny_vit()
    images = torch.randn(3, 3, 32, 32)
    depth = 2
    _, scores = score_tokens(model, images, ReferenceScorer(), depth)
    cap = capture(model, images)
    expected = cap.attn[depth - 1][:, :, 0, 1:].mean(1)
    torch.testing.assert_close(scores, expected, atol=1e-6, rtol=1e-5)
    assert torch.allclose(scores.sum(1) + cap.attn[depth - 1][:, :, 0, 0].mean(1), torch.ones(3), atol=1e-5)


def test_reference_scorer_requires_attention():
    with pytest.raises(ValueError, match="needs the attention"):
        ReferenceScorer()(torch.randn(2, 5, 4), 1)


def test_cls_attention_hand_example():
    attn = torch.zeros(1, 2, 3, 3)
    attn[0, 0, 0] = torch.tensor([0.2, 0.3, 0.5])
    attn[0, 1, 0] = torch.tensor([0.6, 0.4, 0.0])
    torch.testing.assert_close(cls_attention(attn, 1), torch.tensor([[0.35, 0.25]]))


def test_random_scorer_is_seeded_and_resettable():
    x = torch.randn(2, 1 + 9, 4)
    a, b, c = RandomScorer(0), RandomScorer(0), RandomScorer(1)
    s_a = a(x, 1)
    assert s_a.shape == (2, 9)
    torch.testing.assert_close(s_a, b(x, 1))
    assert not torch.equal(s_a, c(x, 1))
    a.reset()
    torch.testing.assert_close(a(x, 1), s_a)


def test_base_class_checks_the_returned_shape():
    class Bad(TokenScorer):
        def score(self, tokens, num_prefix, attn=None):
            return tokens[:, :, 0]      # includes the prefix token: [B,T] instead of [B,N]

    with pytest.raises(RuntimeError, match="expected"):
        Bad()(torch.randn(2, 5, 3), 1)
