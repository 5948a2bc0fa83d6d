"""Issue 54's guard: the refactors of the thin package keep the smoke store's rows. A small set of smoke
cells (the protocol at the point with two backbone builds, 02's soft control, a regime sweep of two depths,
the scale readout on two backbones) run through the notebooks' calls and are compared, key by key, with
``tests/data/smoke_store_rows.<numerics>.csv`` (cell keys, checkpoint ids, metrics to 6 significant digits), written
on the commit before the refactors by ``python tests/test_behaviour_unchanged.py``. Trained weights differ in their
last bits from one CPU to another (AVX2 against AVX-512 kernels), so a snapshot binds only where its float
arithmetic was made: the file is named by :func:`numerics`, and a machine without one skips, naming how to write it
(on the commit whose behaviour the test keeps)."""
from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

DATA = Path(__file__).with_name("data")
IDENTITY = ["cell_key", "dataset", "backbone", "checkpoint_id", "weights_digest", "build", "condition", "target",
            "relaxation", "depth", "budget", "seed", "n_images"]
METRICS = ["miou", "miou_lo", "miou_hi", "idauc", "idauc_lo", "idauc_hi", "ins_auc", "del_auc", "accuracy",
           "accuracy_lo", "accuracy_hi", "pib", "pib_centre", "pib_box_area", "full_accuracy", "iou_ceiling",
           "agreement", "train_loss", "train_accuracy"]


def smoke_rows() -> pd.DataFrame:
    """The rows of the small smoke set, one per cell, sorted by cell key, as text (metrics ``%.6g``)."""
    from midas_nb.study import Study

    st = Study("smoke", progress=False, synthetic=dict(num_classes=4, images_per_class=6, image_size=64, seed=0),
               max_eval_images=6, bootstrap=20, idauc_steps=2, depths=[1, 2], budgets=[0.25],
               sweep_conditions=["reference", "T5"], scale_backbones=["vit_smoke", "vit_smoke_wide"],
               finetune=dict(epochs=2, batch_size=32, lr=2e-3, warmup_epochs=0),
               scorer_train=dict(epochs=1, batch_size=32, lr=1e-3, throughput_repeats=1, throughput_batch=2))
    parts = [st.protocol(conditions=["reference", "unsupervised", "T5", "random"], builds=2),
             st.protocol(conditions=["reference", "T5"], relaxation="soft", builds=1),
             st.sweep("regime")[0], st.sweep("scale")[0]]
    rows = pd.concat(parts, ignore_index=True).drop_duplicates("cell_key")
    out = rows.reindex(columns=IDENTITY + METRICS).sort_values("cell_key").reset_index(drop=True)
    for c in METRICS + ["budget"]:
        out[c] = [f"{float(v):.6g}" for v in out[c]]
    return out.astype(str)


def numerics() -> str:
    """This machine's float arithmetic, as 12 hex digits: the weights after three seeded AdamW steps of a
    GELU layer (torch alone, no midas_nb code), whose matmul kernels set the last bits as the study's do."""
    import hashlib

    import torch

    g = torch.Generator().manual_seed(0)
    x, w = torch.randn(64, 96, generator=g), torch.randn(96, 48, generator=g).requires_grad_()
    opt = torch.optim.AdamW([w], lr=1e-2)
    for _ in range(3):
        opt.zero_grad()
        torch.nn.functional.gelu(x @ w).log_softmax(-1).sum().backward()
        opt.step()
    return hashlib.sha256(w.detach().numpy().tobytes()).hexdigest()[:12]


def test_the_smoke_store_rows_are_the_snapshots(tmp_path, monkeypatch):
    import pytest

    snapshot = DATA / f"smoke_store_rows.{numerics()}.csv"
    if not snapshot.exists():
        pytest.skip(f"no snapshot of this machine's float arithmetic ({snapshot.name}): write it with `python "
                    "tests/test_behaviour_unchanged.py` on the commit whose behaviour the test keeps")
    monkeypatch.setenv("MIDAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    want = pd.read_csv(snapshot, dtype=str, keep_default_na=False)
    got = smoke_rows()
    assert list(got["cell_key"]) == list(want["cell_key"])          # the same cells, keyed the same
    diff = [(k, c, w, g) for k, (_, w_row), (_, g_row) in zip(got["cell_key"], want.iterrows(), got.iterrows())
            for c, w, g in zip(want.columns, w_row, g_row[want.columns]) if w != g]
    assert not diff, f"{len(diff)} values differ from the snapshot (cell, column, snapshot, now): {diff[:10]}"


if __name__ == "__main__":     # write the snapshot (on the commit whose behaviour the test keeps)
    import os
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        os.environ.update(MIDAS_CACHE_DIR=f"{d}/cache", MIDAS_RUNS_DIR=f"{d}/runs")
        smoke_rows().to_csv(sys.argv[1] if len(sys.argv) > 1 else DATA / f"smoke_store_rows.{numerics()}.csv", index=False)
