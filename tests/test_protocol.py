"""Scorer training (frozen backbone, caches) and the end-to-end three-condition protocol."""
from __future__ import annotations

import math
import os

import numpy as np
import pandas as pd
import pytest
import timm
import torch

from midas_nb.data import evaluation_subset
from midas_nb.analysis.protocol import list_conditions, protocol_params, run_protocol
from midas_nb.pruning import score_tokens
from midas_nb.scorers import MLPScorer, ReferenceScorer
from midas_nb.train import block_cache, load_or_train_scorer, train_scorers
from midas_nb.backbones.vit import disable_fused_attention
from tiny_data import TinyDataset as _Tiny


def tiny_vit(**kw):
    torch.manual_seed(0)
    args = dict(pretrained=False, img_size=32, patch_size=8, depth=3, embed_dim=32, num_heads=2,
                num_classes=4)
    args.update(kw)
    return timm.create_model("vit_tiny_patch16_224", **args).eval()


class TinyDataset(_Tiny):
    """:class:`tiny_data.TinyDataset` whose image 0 has no visible part."""

    def __init__(self, n: int, seed: int, has_parts: bool = True, num_classes: int = 4):
        super().__init__(n, seed, has_parts=has_parts, num_classes=num_classes, first_without_parts=True)


def test_block_cache_matches_the_staged_forward_and_is_reloaded(tmp_path):
    model, data = tiny_vit(), TinyDataset(10, 0)
    cache = block_cache(model, data, depth=2, key={"t": 1}, cache_dir=tmp_path, batch_size=4, progress=False)
    with torch.no_grad():
        hidden, t0 = score_tokens(model, data.images, ReferenceScorer(), 2)
        full = model(data.images)
    torch.testing.assert_close(cache.hidden, hidden, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(cache.cls_attn, t0, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(cache.logits, full, atol=1e-5, rtol=1e-5)
    assert cache.labels.tolist() == data.labels.tolist() and cache.indices.tolist() == list(range(10))
    assert torch.equal(cache.part_mask, data.part_mask)
    assert len(list((tmp_path / "blocks").glob("*.pt"))) == 1
    again = block_cache(model, data, depth=2, key={"t": 1}, cache_dir=tmp_path, progress=False)
    assert torch.equal(again.hidden, cache.hidden)


def test_backbone_is_bit_identical_and_only_the_scorer_trains(tmp_path):
    model, data = tiny_vit(), TinyDataset(12, 1)
    model.train()                                             # train_scorers must switch it to eval
    model.blocks[0].attn.qkv.weight.requires_grad_(True)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    cache = block_cache(model, data, depth=1, key=None, batch_size=6, progress=False)
    torch.manual_seed(0)
    scorer = MLPScorer(32)
    s_before = [p.clone() for p in scorer.parameters()]
    targets = torch.rand(12, 16)
    for relaxation in ("st", "soft"):
        res, = train_scorers(model, [scorer], cache, depth=1, budget=0.25, targets=[targets], seeds=[0],
                             relaxation=relaxation, epochs=2, batch_size=4, progress=False)
        assert len(res.loss) == 2 and all(math.isfinite(v) for v in res.loss + res.loss_ga)
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert all(p.grad is None for p in model.parameters())
    assert model.training and model.blocks[0].attn.qkv.weight.requires_grad   # flags restored
    assert any(not torch.equal(a, b) for a, b in zip(s_before, scorer.parameters()))


def test_supervised_training_reduces_the_distillation_loss():
    model, data = tiny_vit(), TinyDataset(16, 2)
    cache = block_cache(model, data, depth=2, key=None, progress=False)
    targets = cache.hidden[:, 1:, :3].sum(-1)                     # a target the MLP can express
    torch.manual_seed(0)
    res, = train_scorers(model, [MLPScorer(32)], cache, depth=2, budget=0.5, targets=[targets], seeds=[0], lam=5.0,
                         epochs=15, batch_size=8, lr=1e-2, progress=False)
    assert res.loss_ga[-1] < 0.5 * res.loss_ga[0]


def test_scorer_checkpoints_are_cached_by_key(tmp_path):
    model, data = tiny_vit(), TinyDataset(8, 3)
    cache = block_cache(model, data, depth=1, key=None, progress=False)
    kw = dict(key={"condition": "unsupervised"}, depth=1, budget=0.25, seed=1, cache_dir=tmp_path,
              progress=False, epochs=1, batch_size=4)
    a, res_a, loaded_a = load_or_train_scorer(model, cache, **kw)
    b, res_b, loaded_b = load_or_train_scorer(model, cache, **kw)
    c, _, loaded_c = load_or_train_scorer(model, cache, **dict(kw, seed=2))
    assert (loaded_a, loaded_b, loaded_c) == (False, True, False)
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters()))
    assert res_b.loss == res_a.loss
    assert any(not torch.equal(p, q) for p, q in zip(a.parameters(), c.parameters()))


def test_evaluation_subset_is_seeded_sorted_and_spread():
    sub = evaluation_subset(100, 20, seed=0)
    assert sub == sorted(sub) and len(set(sub)) == 20 and max(sub) > 50
    assert sub == evaluation_subset(100, 20, seed=0) != evaluation_subset(100, 20, seed=1)
    assert evaluation_subset(5, None) == evaluation_subset(5, 10) == [0, 1, 2, 3, 4]


def test_protocol_params_rejects_unknown_settings():
    assert protocol_params(lam=2.0)["lam"] == 2.0
    with pytest.raises(ValueError, match="unknown protocol setting"):
        protocol_params(lamda=2.0)


@pytest.mark.parametrize("relaxation", ["st", "soft"])
def test_run_protocol_end_to_end(tmp_path, relaxation):
    model = disable_fused_attention(tiny_vit())       # as midas_nb.backbones builds them
    train, test = TinyDataset(16, 4), TinyDataset(10, 5)
    conditions, seeds = ["reference", "unsupervised", "T5", "random"], [0, 1]
    assert set(conditions) <= set(list_conditions())
    df = run_protocol(train, test, model, depth=2, budget=0.25, conditions=conditions, seeds=seeds,
                      dataset_name="tiny", backbone_name="vit_tiny_test", checkpoint_id="ck0",
                      relaxation=relaxation, epochs=1, batch_size=8, idauc_steps=4,
                      max_eval_images=8, bootstrap=50, cache_dir=tmp_path, progress=False,
                      throughput_repeats=1, throughput_batch=4)
    assert isinstance(df, pd.DataFrame) and len(df) == len(conditions) * len(seeds)
    assert sorted(zip(df.condition, df.seed)) == sorted((c, s) for c in conditions for s in seeds)
    assert (df.n_images == 8).all()
    # the tiny data set has one image without parts, and it is in the evaluated subset or not
    assert set(df.n_skipped_parts) <= {0, 1}
    assert df.set_index(["condition", "seed"]).loc[("T5", 0), "target"] == "T5"
    assert (df[df.condition.isin(["unsupervised", "T5"])].relaxation == relaxation).all()
    for col in ("miou", "idauc", "accuracy", "throughput", "ins_auc", "del_auc"):
        assert df[col].notna().all(), col
    assert ((df.miou_lo <= df.miou) & (df.miou <= df.miou_hi)).all()
    assert ((df.accuracy >= 0) & (df.accuracy <= 1)).all()
    # agreement with the full model, and |accuracy - full accuracy| <= 1 - agreement
    assert ((df.agreement >= 0) & (df.agreement <= 1)).all()
    assert ((df.accuracy - df.full_accuracy).abs() <= 1 - df.agreement + 1e-9).all()
    # reference is deterministic: the same metrics for every seed; random differs by seed
    ref = df[df.condition == "reference"]
    assert ref.miou.nunique() == 1 and ref.idauc.nunique() == 1
    assert 0.0 <= df.attrs["full_accuracy"] <= 1.0
    assert (df.full_accuracy == df.attrs["full_accuracy"]).all()
    assert df.attrs["params"]["relaxation"] == relaxation
    assert [blk.attn.fused_attn for blk in model.blocks] == [False] * 3           # restored
    assert all(p.requires_grad for p in model.parameters())                      # frozen() restored
    if relaxation == "soft":
        return
    # a rerun loads every trained scorer from the cache and gives the same table
    again = run_protocol(train, test, model, depth=2, budget=0.25, conditions=conditions, seeds=seeds,
                         dataset_name="tiny", backbone_name="vit_tiny_test", checkpoint_id="ck0",
                         relaxation=relaxation, epochs=1, batch_size=8, idauc_steps=4,
                         max_eval_images=8, bootstrap=50, cache_dir=tmp_path, progress=False,
                         throughput_repeats=1, throughput_batch=4)
    assert again[again.scorer == "mlp"].from_cache.all()
    pd.testing.assert_series_equal(again.accuracy, df.accuracy)
    pd.testing.assert_series_equal(again.miou, df.miou)


def test_prefetched_targets_are_cached_in_the_same_pass_and_change_nothing(tmp_path):
    from safetensors import safe_open
    model = tiny_vit()
    train, test = TinyDataset(12, 8), TinyDataset(6, 9)
    kw = dict(depth=2, budget=0.25, seeds=[0], dataset_name="tiny", backbone_name="vit", checkpoint_id="ck",
              epochs=1, batch_size=8, idauc_steps=2, bootstrap=20, progress=False,
              throughput_repeats=1, throughput_batch=2)
    plain = run_protocol(train, test, model, conditions=["T1"], cache_dir=tmp_path / "a", **kw)
    fetched = run_protocol(train, test, model, conditions=["T1"], cache_dir=tmp_path / "b",
                           prefetch_targets=["T5", "T1", "rollout", "not-a-target"], **kw)
    for col in ("miou", "idauc", "accuracy", "train_loss"):
        assert plain[col].tolist() == fetched[col].tolist(), col
    files = list((tmp_path / "b" / "targets").glob("*.safetensors"))
    assert len(files) == 1
    with safe_open(str(files[0]), "pt") as f:
        assert set(f.keys()) == {"T1", "T5", "rollout"}


def test_throughput_is_one_interleaved_measurement_per_backbone_point(tmp_path, monkeypatch):
    """The pruned forward's cost depends on the architecture, L, b and the scorer kind, not on the
    scorer's weights: the full model and the scorer kinds of a call's rows are timed in one interleaved
    measurement (decision 0092), which later calls at that (backbone, L, b) and kind reuse."""
    import midas_nb.metrics.speed as speed
    import midas_nb.analysis.evaluation as evaluation
    calls, rates = [], []
    real = speed.measure_throughputs
    monkeypatch.setattr(speed, "measure_throughputs",
                        lambda fns, x, **k: calls.append(set(fns)) or rates.append(real(fns, x, **k)) or rates[-1])
    monkeypatch.setattr(evaluation, "_SPEED_MEMO", {})
    model = tiny_vit()
    train, test = TinyDataset(12, 8), TinyDataset(6, 9)
    kw = dict(depth=2, seeds=[0], dataset_name="tiny", backbone_name="vit", checkpoint_id="ck",
              epochs=1, batch_size=8, idauc_steps=2, bootstrap=20, progress=False, cache_dir=tmp_path,
              throughput_repeats=1, throughput_batch=2)
    a = run_protocol(train, test, model, budget=0.25, conditions=["reference", "T1"], **kw)
    assert calls == [{"full", (2, 0.25, "reference"), (2, 0.25, "mlp")}]     # the kinds of its rows only
    b = run_protocol(train, test, model, budget=0.25, conditions=["T5"], **kw)
    assert len(calls) == 1                          # T5 is an MLP scorer too: T1's measurement
    assert b["throughput"].iloc[0] == a.loc[a["condition"] == "T1", "throughput"].iloc[0]
    assert b["throughput_full"].iloc[0] == a["throughput_full"].iloc[0]
    speedup = a.set_index("condition")["speedup"]
    assert speedup["T1"] == pytest.approx(a.set_index("condition").loc["T1", "throughput"] / a["throughput_full"].iloc[0])
    run_protocol(train, test, model, budget=0.5, conditions=["T1"], **kw)
    assert len(calls) == 2                          # another b: another measurement
    c = run_protocol(train, test, model, budget=0.25, conditions=["random", "T5"], **kw)
    assert calls[2] == {"full", (2, 0.25, "random")}  # a kind not timed at that point yet: it alone, its own full
    rows = c.set_index("condition")
    assert rows.loc["T5", "throughput_full"] == a["throughput_full"].iloc[0] == rates[0]["full"]
    assert rows.loc["random", "throughput_full"] == rates[2]["full"]
    assert rows.loc["random", "speedup"] == pytest.approx(rows.loc["random", "throughput"]
                                                          / rows.loc["random", "throughput_full"])
    # the points of one protocol_cells call (a sweep's group): one measurement, the full model timed once
    from midas_nb.analysis.protocol import protocol_cells
    kw = {k: v for k, v in kw.items() if k not in ("depth", "seeds")}
    protocol_cells(train, test, model, cells=[(1, 0.25, "T1", 0), (1, 0.5, "T1", 0), (2, 0.75, "T5", 0)], **kw)
    assert calls[3] == {"full"} | {(L, b, "mlp") for L, b in ((1, 0.25), (1, 0.5), (2, 0.75))}
    assert len(calls) == 4


def test_run_protocol_box_coverage_and_bad_condition(tmp_path):
    model = tiny_vit()                               # fused attention (timm's default)
    train, test = TinyDataset(8, 6), TinyDataset(6, 7, has_parts=False)
    df = run_protocol(train, test, model, depth=1, budget=0.5, conditions=["random"], seeds=[3],
                      dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", epochs=1,
                      idauc_steps=0, bootstrap=20, cache_dir=tmp_path, progress=False,
                      throughput_repeats=1, throughput_batch=2)
    assert len(df) == 1 and df.coverage_kind[0] == "box coverage" and df.seed[0] == 3
    assert all(blk.attn.fused_attn for blk in model.blocks)                      # restored
    with pytest.raises(ValueError, match="unknown or no conditions"):
        run_protocol(train, test, model, depth=1, budget=0.5, conditions=["T9"], seeds=[0],
                     dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", cache_dir=tmp_path,
                     progress=False)


def test_the_insertion_deletion_phase_shows_its_progress(tmp_path, monkeypatch):
    """A quick run's IDAUC over 300 images ran 20 minutes without one progress line."""
    import midas_nb.analysis.evaluation as evaluation

    seen, real = [], evaluation.tqdm

    def spy(iterable=None, *args, **kwargs):
        seen.append((kwargs.get("desc"), kwargs.get("disable"), None if iterable is None else len(iterable)))
        return real(iterable, *args, **kwargs)
    monkeypatch.setattr(evaluation, "tqdm", spy)
    model = tiny_vit()
    run_protocol(_Tiny(8, 6), _Tiny(6, 7), model, depth=1, budget=0.5, conditions=["random", "reference"],
                 seeds=[0], dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", epochs=1,
                 idauc_steps=2, bootstrap=20, cache_dir=tmp_path, progress=True, eval_batch_size=2,
                 throughput_repeats=1, throughput_batch=2)
    assert ("insertion/deletion, 2 rankings", False, 3) in seen     # 6 images in chunks of 2


def _idauc_by_hand(model, images: torch.Tensor, scores: torch.Tensor, steps: int, cls: torch.Tensor):
    """Insertion − deletion AUC of p_c per image, written here from the definition (DESIGN.md
    §6): tokens kept in rank order (ties to the lower index), positions kept, k_s = round(s·N/S)
    with halves up, trapezoid over k_s/N. Uses only timm's own modules."""
    with torch.no_grad():
        x = model.norm_pre(model._pos_embed(model.patch_embed(images)))          # [B,1+N,D]
        B, T, _ = x.shape
        N = T - 1
        counts = [math.floor(s * N / steps + 0.5) for s in range(steps + 1)]
        frac = np.array(counts, dtype=np.float64) / N
        out = []
        for b in range(B):
            order = sorted(range(N), key=lambda j: (-float(scores[b, j]), j))

            def p_c(patches):
                idx = [0] + [1 + j for j in sorted(patches)]
                logits = model.head(model.norm(model.blocks(x[b:b + 1, idx]))[:, 0])
                return float(torch.softmax(logits.double(), -1)[0, cls[b]])

            ins = np.array([p_c(order[:k]) for k in counts])
            dele = np.array([p_c(order[k:]) for k in counts])
            out.append(np.trapezoid(ins, frac) - np.trapezoid(dele, frac))
    return np.array(out)


def test_a_protocol_row_is_recomputed_from_its_saved_scorer(tmp_path):
    """mIoU and IDAUC of one row, recomputed here from the scorer the protocol saved: the
    block-L states by timm's modules, the top-k and the IoU by hand, and insertion/deletion
    from the definition — per image and as the row's means."""
    from midas_nb.identity import load_torch_payload, load_verified

    model = disable_fused_attention(tiny_vit())
    train, test = TinyDataset(16, 4), TinyDataset(6, 5)
    depth, budget, steps = 2, 0.25, 4
    df = run_protocol(train, test, model, depth=depth, budget=budget, conditions=["unsupervised"], seeds=[0],
                      dataset_name="tiny", backbone_name="vit", checkpoint_id="ck0", epochs=1, batch_size=8,
                      idauc_steps=steps, bootstrap=20, cache_dir=tmp_path, progress=False,
                      throughput_repeats=1, throughput_batch=2)
    row = df.iloc[0]
    (blob,) = [load_torch_payload(load_verified(f)) for f in (tmp_path / "scorers").glob("*.pt")]
    assert blob["key"]["condition"] == "unsupervised" and blob["key"]["seed"] == 0
    scorer = MLPScorer(32)
    scorer.load_state_dict(blob["state_dict"])
    with torch.no_grad():
        x = model.norm_pre(model._pos_embed(model.patch_embed(test.images)))
        scores = scorer.eval()(model.blocks[:depth](x), 1)                   # [B,N]
        full_pred = model(test.images).argmax(-1)
    N = scores.shape[1]
    k = math.ceil(budget * N)
    keep = torch.zeros_like(test.part_mask)
    for b in range(len(scores)):
        for j in sorted(range(N), key=lambda j: (-float(scores[b, j]), j))[:k]:
            keep[b, j] = True
    part = test.part_mask
    iou = [float((keep[b] & part[b]).sum() / (keep[b] | part[b]).sum()) if part[b].any() else math.nan
           for b in range(len(part))]
    assert math.isnan(iou[0])                                    # image 0 has no visible part
    np.testing.assert_allclose(row["miou_per_image"], iou, rtol=1e-6, atol=1e-7)
    assert row["miou"] == pytest.approx(np.nanmean(iou), abs=1e-7)
    assert row["n_skipped_parts"] == 1
    idauc = _idauc_by_hand(model, test.images, scores, steps, full_pred)
    assert row["idauc_image_ids"] == [str(i) for i in range(6)]
    np.testing.assert_allclose(row["idauc_per_image"], idauc, rtol=1e-4, atol=1e-5)
    assert row["idauc"] == pytest.approx(idauc.mean(), abs=1e-5)
    assert np.abs(idauc).max() > 1e-3                             # a non-trivial check


def test_bfloat16_protocol_runs_every_condition_keyed_apart_and_agrees_with_float32(tmp_path):
    """``precision="bfloat16"`` (the paper profile's; autocast on CPU here, as on CUDA): every
    condition — scorer families and the random_map control included — trains and runs its
    insertion/deletion under autocast, rows record the precision, trained scorers are cached
    apart from float32 ones, and the reference's token selection stays exact (float32 T0 and
    kept tokens: the same coverage and accuracy) while its IDAUC agrees within bfloat16 error."""
    model = tiny_vit()
    train, test = TinyDataset(16, 4), TinyDataset(8, 5)
    conditions = ["reference", "unsupervised", "T2", "T5", "random", "random_map", "cropr", "iared"]
    kw = dict(depth=2, budget=0.25, conditions=conditions, seeds=[0], dataset_name="tiny", backbone_name="vit",
              checkpoint_id="ck", epochs=1, batch_size=8, idauc_steps=4, bootstrap=20, cache_dir=tmp_path,
              progress=False, throughput_repeats=1, throughput_batch=2)
    f32 = run_protocol(train, test, model, **kw).set_index("condition")
    bf16 = run_protocol(train, test, model, precision="bfloat16", **kw).set_index("condition")
    assert (f32.precision == "float32").all() and (bf16.precision == "bfloat16").all()
    assert not bf16.from_cache.any()                    # keyed apart: every scorer trained again
    for col in ("miou", "idauc", "accuracy"):
        assert bf16[col].notna().all(), col
    assert bf16.drop(index=["reference", "random"]).train_loss.map(math.isfinite).all()
    for col in ("miou", "accuracy", "pib"):
        assert bf16.loc["reference", col] == f32.loc["reference", col], col
    assert bf16.loc["reference", "idauc"] != f32.loc["reference", "idauc"]       # computed under autocast
    assert abs(bf16.loc["reference", "idauc"] - f32.loc["reference", "idauc"]) < 0.02
    with pytest.raises(ValueError, match=r"precision: expected one of \['float32', 'bfloat16'\], got 'fp16'"):
        run_protocol(train, test, model, precision="fp16", **kw)


def test_consecutive_calls_read_the_evaluation_split_once_and_give_the_same_rows(tmp_path, monkeypatch):
    """The test split's block-L states and IDAUC images are read once for consecutive calls at one
    (backbone, L) — a sweep worker's cells — and the rows are those of a fresh process."""
    import midas_nb.analysis.evaluation as proto
    reads = []
    real = proto._read_evaluation_split
    monkeypatch.setattr(proto, "_read_evaluation_split", lambda *a: reads.append(1) or real(*a))
    monkeypatch.setattr(proto, "_EVAL_MEMO", {})
    model = tiny_vit()
    train, test = TinyDataset(12, 8), TinyDataset(6, 9)
    kw = dict(depth=2, dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", epochs=1, batch_size=8,
              idauc_steps=2, bootstrap=20, progress=False, cache_dir=tmp_path, throughput_repeats=1,
              throughput_batch=2)
    a = run_protocol(train, test, model, budget=0.25, conditions=["T1"], seeds=[0], **kw)
    b = run_protocol(train, test, model, budget=0.5, conditions=["T5"], seeds=[1], **kw)
    assert len(reads) == 1
    run_protocol(train, test, model, budget=0.25, conditions=["T1"], seeds=[0], **dict(kw, depth=1))
    assert len(reads) == 2                                  # another L: another split
    monkeypatch.setattr(proto, "_EVAL_MEMO", {})
    fresh = run_protocol(train, test, model, budget=0.5, conditions=["T5"], seeds=[1], **kw)
    for col in ("miou", "idauc", "accuracy", "pib"):
        assert fresh[col].tolist() == b[col].tolist(), col
    assert a["idauc_image_ids"].iloc[0] == fresh["idauc_image_ids"].iloc[0]


def test_a_ranking_met_before_in_a_split_is_not_measured_again(tmp_path, monkeypatch):
    """The reference ranks tokens the same at every budget of one L: its IDAUC is measured once for two
    budgets (decision 0071), with the rows of a fresh process; a trained scorer's ranking is measured."""
    import midas_nb.analysis.evaluation as proto
    calls = []
    real = proto.insertion_deletion_auc
    monkeypatch.setattr(proto, "insertion_deletion_auc", lambda *a, **k: calls.append(1) or real(*a, **k))
    monkeypatch.setattr(proto, "_EVAL_MEMO", {})
    kw = dict(depth=2, dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", epochs=1, batch_size=8,
              idauc_steps=2, bootstrap=20, progress=False, cache_dir=tmp_path, throughput_repeats=1,
              throughput_batch=2, seeds=[0])
    model, train, test = tiny_vit(), TinyDataset(12, 8), TinyDataset(6, 9)
    a = run_protocol(train, test, model, budget=0.25, conditions=["reference"], **kw)
    n = len(calls)
    b = run_protocol(train, test, model, budget=0.5, conditions=["reference"], **kw)
    assert n > 0 and len(calls) == n and a["idauc_per_image"].tolist() == b["idauc_per_image"].tolist()
    run_protocol(train, test, model, budget=0.5, conditions=["T5"], **kw)
    assert len(calls) > n


def test_block_cache_is_read_once_per_process_until_its_file_changes(tmp_path, monkeypatch):
    import midas_nb.train.cache as bc
    reads = []
    real = bc.load_or_build
    monkeypatch.setattr(bc, "load_or_build", lambda *a, **k: reads.append(1) or real(*a, **k))
    monkeypatch.setattr(bc, "_LOADED", {})
    model, data = tiny_vit(), TinyDataset(6, 0)
    first = block_cache(model, data, depth=2, key={"t": 1}, cache_dir=tmp_path, progress=False)
    again = block_cache(model, data, depth=2, key={"t": 1}, cache_dir=tmp_path, progress=False)
    assert len(reads) == 1 and again is first
    other = TinyDataset(6, 1)
    block_cache(model, other, depth=2, key={"t": 1}, cache_dir=tmp_path, progress=False)
    block_cache(model, data, depth=1, key={"t": 1}, cache_dir=tmp_path, progress=False)
    assert len(reads) == 3 and len(bc._LOADED) == 2                  # the two most recent are kept
    path = next(p for p, (_, c) in bc._LOADED.items() if c.depth == 1)
    os.utime(path, ns=(1, 1))                                           # the file changed: read again
    reread = block_cache(model, data, depth=1, key={"t": 1}, cache_dir=tmp_path, progress=False)
    assert len(reads) == 4
    torch.testing.assert_close(reread.hidden, bc._LOADED[path][1].hidden)


def test_a_sweep_cells_single_condition_draws_no_protocol_bar(tmp_path, monkeypatch, capsys):
    """A sweep cell is one (condition, seed): its bar would sit at 0/1 for the whole cell and hide
    the sweep's own bar (cells done, time left) in a batch run's status line; two pairs draw one."""
    monkeypatch.setenv("MIDAS_PROGRESS", "lines")
    model = tiny_vit()
    train, test = TinyDataset(12, 8), TinyDataset(6, 9)
    kw = dict(depth=2, budget=0.25, dataset_name="tiny", backbone_name="vit", checkpoint_id="ck", epochs=1,
              batch_size=8, idauc_steps=2, bootstrap=20, progress=True, cache_dir=tmp_path, throughput_repeats=1,
              throughput_batch=2)
    run_protocol(train, test, model, conditions=["reference"], seeds=[0], **kw)
    assert not [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("protocol,")]
    run_protocol(train, test, model, conditions=["reference", "random"], seeds=[0], **kw)
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("protocol,")]
    assert lines and lines[-1].startswith("protocol, condition 2/2 (")


def test_block_states_of_several_depths_come_from_one_pass_with_the_values_of_one_depth_each(tmp_path):
    """``block_caches`` (decision 0069): every depth's states from one pass over the split (each image read
    once), bit for bit those of a pass for that depth alone, a file per depth that ``block_cache`` reads;
    the full model's logits are the fused forward's, the same at every L."""
    from midas_nb.backbones.vit import fused_attention
    from midas_nb.train import block_caches

    class Counted(TinyDataset):
        reads: list[int] = []

        def __getitem__(self, i):
            self.reads.append(i)
            return super().__getitem__(i)

    model, data = tiny_vit(), Counted(6, 4)
    with fused_attention(model):
        both = block_caches(model, data, depths=[2, 1], key=None, batch_size=4, progress=False)
        assert sorted(data.reads) == list(range(6))                 # one pass for both depths
        alone = {L: block_cache(model, data, depth=L, key=None, batch_size=4, progress=False) for L in (1, 2)}
        keyed = block_caches(model, data, depths=[1, 2], key={"t": 1}, cache_dir=tmp_path, batch_size=4,
                             progress=False)
        reread = block_cache(model, data, depth=1, key={"t": 1}, cache_dir=tmp_path, progress=False)
        with torch.no_grad():
            fused_logits = model(data.images)
    assert set(both) == {1, 2} and len(list((tmp_path / "blocks").glob("*.pt"))) == 2
    for L in (1, 2):
        assert both[L].depth == L
        for name in ("hidden", "cls_attn", "logits", "labels", "part_mask"):
            assert torch.equal(getattr(both[L], name), getattr(alone[L], name)), (L, name)
            assert torch.equal(getattr(keyed[L], name), getattr(alone[L], name)), (L, name)
    assert not torch.equal(both[1].hidden[:, 1:], both[2].hidden[:, 1:])
    assert torch.equal(both[1].logits, both[2].logits)
    torch.testing.assert_close(both[1].logits, fused_logits, atol=1e-6, rtol=1e-6)
    assert torch.equal(reread.hidden, keyed[1].hidden)
