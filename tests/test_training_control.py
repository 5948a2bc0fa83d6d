"""The ``random_map`` control for the training signal (issue 27): the same scorer, loss and λ as
supervised(Tk), distilling the seeded random map; and D against it beside D against the reference."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from midas_nb.identity import load_torch_payload, load_verified, tensor_digest
from midas_nb.analysis.protocol import condition_target, list_conditions, run_protocol
from midas_nb import results
from midas_nb.analysis.control import decoupling_with_controls
from midas_nb.targets import target_cache
from midas_nb.backbones.vit import disable_fused_attention
from test_protocol import TinyDataset, tiny_vit


def test_random_map_distils_the_seeded_random_target_with_the_supervised_loss(tmp_path):
    torch.set_num_threads(1)
    model = disable_fused_attention(tiny_vit())
    train, test = TinyDataset(16, 4), TinyDataset(6, 5)
    assert {"random", "random_map"} <= set(list_conditions())
    assert condition_target("random_map") == "random" and condition_target("random") == ""
    df = run_protocol(train, test, model, depth=2, budget=0.25, conditions=["unsupervised", "random_map"],
                      seeds=[0], dataset_name="tiny", backbone_name="vit", checkpoint_id="ck0", lam=0.5,
                      epochs=1, batch_size=8, idauc_steps=2, bootstrap=20, cache_dir=tmp_path, progress=False,
                      throughput_repeats=1, throughput_batch=2)
    row = df.set_index("condition").loc["random_map"]
    assert (row["target"], row["scorer"], row["relaxation"], row["lambda_ga"]) == ("random", "mlp", "st", 0.5)
    assert df.set_index("condition").loc["unsupervised", "lambda_ga"] == 0.0
    # the saved scorer was trained on the random target's maps of the train split (computed
    # here on their own, in another cache): per image fixed, different between images
    maps = target_cache(model, train, ids=["random"], depth=2, class_rule="label", key=dict(x=1),
                        cache_dir=tmp_path / "other", progress=False)["random"]
    assert maps.shape == (16, 16) and not torch.equal(maps[0], maps[1])
    blobs = {b["key"]["condition"]: b for b in
             (load_torch_payload(load_verified(f)) for f in (tmp_path / "scorers").glob("*.pt"))}
    key = blobs["random_map"]["key"]
    assert key["target"] == "random" and key["lam"] == 0.5 and key["supervised"] is True
    assert key["targets_digest"] == tensor_digest(maps)
    assert blobs["unsupervised"]["key"]["targets_digest"] is None
    # the distillation term changed the scorer: same initialisation and batches, other weights
    sd_map, sd_uns = blobs["random_map"]["state_dict"], blobs["unsupervised"]["state_dict"]
    assert any(not torch.equal(sd_map[k], sd_uns[k]) for k in sd_map)


def _row(cond: str, seed: int, miou: float, idauc: float) -> dict:
    return dict(dataset="d", backbone="b", depth=2, budget=0.25, condition=cond,
                target={"reference": "T0", "random_map": "random"}.get(cond, cond),
                relaxation="" if cond == "reference" else "st", seed=seed, miou=miou, idauc=idauc)


def test_decoupling_with_controls_puts_D_against_random_map_beside_D_against_the_reference():
    table = pd.DataFrame([_row("reference", 0, 0.30, 0.20), _row("reference", 1, 0.30, 0.20),
                          _row("random_map", 0, 0.34, 0.15), _row("random_map", 1, 0.36, 0.17),
                          _row("T5", 0, 0.40, 0.21), _row("T5", 1, 0.44, 0.19)])
    out = decoupling_with_controls(table, n_boot=20).set_index("condition")
    # by hand: D(T5) vs reference = 100·(0.42 − 0.30); vs random_map = 100·(0.42 − 0.35) (seed-paired)
    assert out.loc["T5", "D_pp"] == pytest.approx(12.0)
    assert out.loc["T5", "D_pp_vs_random_map"] == pytest.approx(7.0)
    assert out.loc["T5", "delta_idauc_vs_random_map"] == pytest.approx(0.20 - 0.16)
    assert out.loc["random_map", "D_pp_vs_random_map"] == pytest.approx(0.0)
    assert out.loc["reference", "D_pp_vs_random_map"] == pytest.approx(-5.0)
    assert out.loc["random_map", "D_pp"] == pytest.approx(5.0)
    # ΔIDAUC of random_map vs the reference is −0.04: outside the band; T5 vs random_map inside
    assert out.loc["T5", "status_vs_random_map"] == "in band"
    assert out.loc["random_map", "status"] == "outside band"
    assert list(out.index) == ["reference", "random_map", "T5"]
    assert np.isfinite(out["D_pp_vs_random_map"]).all()


def test_decoupling_with_controls_refuses_a_table_without_the_control():
    table = pd.DataFrame([_row("reference", 0, 0.3, 0.2), _row("T5", 0, 0.4, 0.2)])
    with pytest.raises(ValueError, match="no 'random_map' rows.*study.protocol"):
        decoupling_with_controls(table, n_boot=10)
    with pytest.raises(ValueError, match="is the reference itself"):
        decoupling_with_controls(table, ["reference"], n_boot=10)


def test_the_band_against_the_control_rests_on_the_controls_own_check():
    # per image: the reference is no more faithful than random (equal IDAUC), random_map is
    # (0.10 above random on every image): the band against the reference is uninformative,
    # the band against the control speaks
    rows = []
    for seed in (0, 1):
        for cond, idauc in (("reference", 0.20), ("random", 0.20), ("random_map", 0.30), ("T5", 0.30)):
            r = _row(cond, seed, {"reference": 0.30, "random": 0.25, "random_map": 0.35, "T5": 0.45}[cond], idauc)
            r.update(idauc_per_image=[idauc + 0.01 * k for k in range(6)],
                     miou_per_image=[r["miou"]] * 6, image_ids=list(range(6)), idauc_image_ids=list(range(6)))
            rows.append(r)
    out = decoupling_with_controls(pd.DataFrame(rows), n_boot=50).set_index("condition")
    assert out.loc["T5", "status"] == "uninformative"
    assert out.loc["T5", "status_vs_random_map"] == "in band"
    assert out.loc["T5", "band_reason_vs_random_map"].startswith("random_map IDAUC 0.300")
    assert "above random 0.200 (Δ +0.100 [+0.100, +0.100], 6 paired images)" in out.loc["T5", "band_reason_vs_random_map"]
    text = results.band_checks(out.reset_index())
    assert text.splitlines() == [f"band against reference: {out.loc['T5', 'band_reason']}",
                                 f"band against random_map: {out.loc['T5', 'band_reason_vs_random_map']}"]
    assert "reference IDAUC 0.200" in text and "not above random 0.200" in text

    # two cells: each check after its cell's name; an undefined row's reason is no check
    two = pd.concat([out.reset_index(), out.reset_index().assign(depth=3)], ignore_index=True)
    two.loc[(two["depth"] == 3) & (two["condition"] == "T5"), ["status", "band_reason"]] = ["undefined", "IDAUC is NaN"]
    lines = results.band_checks(two).splitlines()
    assert lines[0].startswith("band against reference: dataset=d, backbone=b, depth=2, budget=0.25: reference IDAUC")
    assert "IDAUC is NaN" not in lines[0] and "depth=3, budget=0.25: reference IDAUC" in lines[0]  # its random row
    assert " | dataset=d, backbone=b, depth=3, budget=0.25: random_map IDAUC 0.300" in lines[1]
