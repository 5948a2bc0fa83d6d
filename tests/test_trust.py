"""Results that can be trusted (issue 15): content-addressed identities and caches, verified
cache files, defined edge cases, reproducible weights, and intervals that are what they say.

Each numbered case of the issue is a test here; every one of them fails on the code before the
fix (see the report of issue 15 for how).
"""
from __future__ import annotations

import math
import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import t as student_t
import torch

from midas_nb import backbones as bb
from midas_nb.data import load_dataset, make_synthetic_cub
from midas_nb.metrics import decoupling_D
from midas_nb.analysis import recommend_deployment
from midas_nb.results import aggregate_seeds, make_table

CUB_FILES = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "bounding_boxes.txt")


# ---------------------------------------------------------------------------------------- helpers


def copy_cub_classes(src: Path, dst: Path, classes: set[int]) -> Path:
    """A CUB-layout copy of ``src`` holding only the images of ``classes`` (1-based labels)."""
    labels = dict(line.split() for line in (src / "image_class_labels.txt").read_text().splitlines() if line.strip())
    keep = {i for i, c in labels.items() if int(c) in classes}
    (dst / "parts").mkdir(parents=True)
    for name in CUB_FILES:
        rows = [ln for ln in (src / name).read_text().splitlines() if ln.split() and ln.split()[0] in keep]
        (dst / name).write_text("\n".join(rows) + "\n")
    rows = [ln for ln in (src / "parts" / "part_locs.txt").read_text().splitlines()
            if ln.split() and ln.split()[0] in keep]
    (dst / "parts" / "part_locs.txt").write_text("\n".join(rows) + "\n")
    shutil.copy(src / "classes.txt", dst / "classes.txt")
    shutil.copy(src / "parts" / "parts.txt", dst / "parts" / "parts.txt")
    for line in (src / "images.txt").read_text().splitlines():
        if line.split() and line.split()[0] in keep:
            rel = line.split(maxsplit=1)[1]
            (dst / "images" / rel).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy(src / "images" / rel, dst / "images" / rel)
    return dst


def split_ids(root: Path, split: str) -> list[str]:
    flag = "1" if split == "train" else "0"
    return [ln.split()[0] for ln in (root / "train_test_split.txt").read_text().splitlines()
            if ln.split() and ln.split()[1] == flag]


def shift_keypoints(root: Path, dx: float, image_ids: set[str] | None = None, limit: int | None = None) -> int:
    """Shift visible keypoints by ``dx`` px in ``parts/part_locs.txt`` (only ``image_ids``; at
    most ``limit`` lines). Returns the number of lines changed."""
    path = root / "parts" / "part_locs.txt"
    out, changed = [], 0
    for line in path.read_text().splitlines():
        t = line.split()
        if (len(t) == 5 and t[4] == "1" and (image_ids is None or t[0] in image_ids)
                and (limit is None or changed < limit)):
            t[2] = f"{float(t[2]) + dx:.1f}"
            changed += 1
            line = " ".join(t)
        out.append(line)
    path.write_text("\n".join(out) + "\n")
    return changed


# ------------------------------------------------------------------- 1. stale caches: identity


def test_fingerprint_follows_keypoints_and_not_the_path(shared_data, tmp_path):
    """The issue's case: three CUB classes, every visible keypoint +40 px → another fingerprint;
    moving the directory keeps it; the checkpoint (which never reads keypoints) keeps its key."""
    root = copy_cub_classes(shared_data / "cub200_subset", tmp_path / "a", {1, 2, 3})
    before = load_dataset("cub", root, "test")
    fp0 = bb.dataset_fingerprint(before)
    assert shift_keypoints(root, 40.0) > 100
    shifted = load_dataset("cub", root, "test")
    fp1 = bb.dataset_fingerprint(shifted)
    assert fp1 != fp0, "the fingerprint ignores the part keypoints"
    from midas_nb.identity import dataset_identity
    inputs0 = dataset_identity(before).model_inputs
    assert dataset_identity(shifted).model_inputs == inputs0          # images, labels, transform
    moved = root.rename(tmp_path / "elsewhere")
    assert bb.dataset_fingerprint(load_dataset("cub", moved, "test")) == fp1
    # replacing the bytes of one test image changes the model inputs (and so the checkpoint)
    first_test = split_ids(moved, "test")[0]
    rel = dict(ln.split(maxsplit=1) for ln in (moved / "images.txt").read_text().splitlines())[first_test]
    img = moved / "images" / rel
    img.write_bytes(img.read_bytes() + b"\0")
    assert dataset_identity(load_dataset("cub", moved, "test")).model_inputs != inputs0


def test_one_keypoint_line_changes_only_the_split_that_holds_it(tmp_path):
    from midas_nb.identity import dataset_identity
    root = make_synthetic_cub(tmp_path / "syn", num_classes=2, images_per_class=4, image_size=64)

    def ids():
        return {s: dataset_identity(load_dataset("cub", root, s, image_size=64, patch_size=8))
                for s in ("train", "test")}

    base = ids()
    assert shift_keypoints(root, 3.0, set(split_ids(root, "test")[:1]), limit=1) == 1
    after_test = ids()
    assert after_test["test"].full != base["test"].full
    assert after_test["test"].model_inputs == base["test"].model_inputs
    assert after_test["train"] == base["train"]
    assert shift_keypoints(root, 3.0, set(split_ids(root, "train")[:1]), limit=1) == 1
    after_train = ids()
    assert after_train["test"] == after_test["test"]
    assert after_train["train"].full != base["train"].full
    assert after_train["train"].model_inputs == base["train"].model_inputs


@pytest.mark.slow
def test_a_test_keypoint_edit_recomputes_exactly_the_protocol_cells(tmp_path, monkeypatch):
    """Done-when of issue 15 at smoke scale: a rerun from a warm cache gives identical rows;
    editing one keypoint line of a test image recomputes the protocol cells (evaluation only:
    backbone, target maps and scorers come from the cache); a train-image keypoint recomputes
    nothing."""
    from midas_nb.identity import cache_events, reset_cache_events
    from midas_nb.study import Study
    from midas_nb.sweeps import ResultStore

    monkeypatch.setenv("MIDAS_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("MIDAS_RUNS_DIR", str(tmp_path / "runs"))
    root = make_synthetic_cub(tmp_path / "data", num_classes=4, images_per_class=8, image_size=96)
    settings = dict(data_root=str(root), dataset="cub", max_eval_images=8, bootstrap=20, idauc_steps=2,
                    scorer_train=dict(epochs=1, batch_size=32, lr=1e-3, throughput_repeats=1, throughput_batch=2))
    conds = ["reference", "unsupervised", "T5"]

    def run():
        reset_cache_events()
        study = Study("smoke", progress=False, **settings)
        table = study.protocol(conditions=conds)
        return study, table, cache_events()

    study, first, _ = run()
    keys = set(first["cell_key"])
    assert len(keys) == 3
    # the saved table is named readably (dataset, backbone, point), its content hash last
    saved = sorted(p.name for p in (tmp_path / "runs" / "tables").glob("protocol_*.csv"))
    assert len(saved) == 1 and saved[0].startswith("protocol_cub_vit_smoke_L2_b0.25_"), saved

    # the evaluated test images (a seeded subset of max_eval_images) and the others
    from midas_nb.data import evaluation_subset
    test_ids = study.test_set.image_ids
    evaluated = {test_ids[i] for i in evaluation_subset(len(test_ids), 8, 0)}
    not_evaluated = set(test_ids) - evaluated
    assert evaluated and not_evaluated

    # a keypoint of a test image that is not evaluated: the cells do not depend on it
    assert shift_keypoints(root, 5.0, not_evaluated, limit=1) == 1
    _, same, ev = run()
    assert set(same["cell_key"]) == keys and ev["built"] == 0 and ev["loaded"] == 0

    # one keypoint line of an evaluated test image: new cells, computed from the cached
    # backbone, target maps and scorers
    assert shift_keypoints(root, 5.0, evaluated, limit=1) == 1
    study2, edited, ev = run()
    assert not (set(edited["cell_key"]) & keys), "the cells keyed by the old keypoints were reused"
    assert study2.meta["loaded_from_cache"] and study2.meta["checkpoint_id"] == study.meta["checkpoint_id"]
    assert edited["from_cache"][edited["scorer"] == "mlp"].all()
    assert ev["built"] == 1          # the test split's block states (they hold the part masks)
    store = ResultStore(name="smoke")
    assert len(store.results()) == 6 and store.scan()[1] == []

    # one keypoint line of a training image: nothing is recomputed, the rows are the same
    cols = ["cell_key", "miou", "idauc", "accuracy", "miou_per_image", "idauc_per_image", "weights_digest"]
    assert shift_keypoints(root, 5.0, set(split_ids(root, "train")[:1]), limit=1) == 1
    _, same, ev = run()
    assert ev["built"] == 0 and ev["loaded"] == 0          # no cell ran: no cache was touched
    pd.testing.assert_frame_equal(same[cols], edited[cols])

    # a warm cache and a fresh store: every row again, bit for bit (scorers from the cache)
    shutil.rmtree(tmp_path / "runs" / "sweeps")
    _, again, ev = run()
    assert ev["built"] == 0 and ev["corrupt"] == 0
    assert again["from_cache"][again["scorer"] == "mlp"].all() and again["weights_digest"].nunique() == 1
    pd.testing.assert_frame_equal(again[cols], edited[cols])


# -------------------------------------------------------------- 3. undefined numbers


def _row(condition, seed=0, miou=0.3, idauc=0.2, **kw):
    return dict(dict(dataset="cub", backbone="b", checkpoint_id="c", condition=condition, depth=6,
                     budget=0.25, seed=seed, n_images=4, miou=miou, idauc=idauc,
                     target="" if condition in ("reference", "unsupervised") else condition), **kw)


def test_undefined_idauc_is_undefined_and_advice_says_no_recommendation():
    t = make_table([_row("reference", idauc=math.nan), _row("T5", miou=0.4, idauc=math.nan),
                    _row("T1", miou=0.35, idauc=math.nan)])
    D = decoupling_D(t).set_index("condition")
    assert (D["status"] == "undefined").all(), D["status"].to_dict()      # the reference too
    assert D["in_band"].isna().all() and D["band_resolved"].isna().all()
    assert all(c.startswith("undefined (IDAUC is NaN)") for c in D["D_cell"])
    advice, text = recommend_deployment(t)
    adv = advice.set_index("goal")
    assert not adv["recommended"].any()
    assert "no recommendation" in adv.loc["faithfulness-first", "reason"]
    assert "IDAUC is NaN" in adv.loc["faithfulness-first", "reason"]
    assert "no recommendation" in adv.loc["coverage-first", "reason"] and "undefined" in text


def test_nan_miou_is_never_printed_as_in_band():
    t = make_table([_row("reference", miou=math.nan, idauc=0.2), _row("T5", miou=math.nan, idauc=0.21)])
    D = decoupling_D(t).set_index("condition")
    assert (D["status"] == "undefined").all()
    assert not any("nan" in c.lower() and "in band" in c for c in D["D_cell"])
    assert all(c == "undefined (mIoU is NaN)" for c in D["D_cell"])
    # one seed undefined makes the mean over seeds undefined (never the mean of the others)
    t2 = make_table([_row("reference"), _row("T5", seed=0, miou=0.4), _row("T5", seed=1, miou=math.nan)])
    assert decoupling_D(t2).set_index("condition").loc["T5", "status"] == "undefined"


def test_protocol_without_idauc_gives_undefined_status(tmp_path):
    import timm

    from midas_nb.analysis.protocol import run_protocol
    from tiny_data import TinyDataset

    torch.manual_seed(0)
    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=3,
                              embed_dim=32, num_heads=2, num_classes=4).eval()
    df = run_protocol(TinyDataset(8, 1), TinyDataset(6, 2), model, depth=1, budget=0.5,
                      conditions=["reference", "random"], seeds=[0], dataset_name="tiny", backbone_name="vit",
                      checkpoint_id="ck", epochs=1, idauc_steps=0, bootstrap=20, cache_dir=tmp_path,
                      progress=False, throughput_repeats=1, throughput_batch=2)
    assert df["idauc"].isna().all() and df["miou"].notna().all()
    assert set(decoupling_D(df)["status"]) == {"undefined"}
    advice = recommend_deployment(df)[0].set_index("goal")
    assert not bool(advice.loc["faithfulness-first", "recommended"])


# ------------------------------------------------- 4. same seed, different numbers / 5. cache files


@pytest.fixture
def smoke_splits(tmp_path):
    root = make_synthetic_cub(tmp_path / "syn", num_classes=2, images_per_class=4, image_size=72)
    mean, std = bb.backbone_normalization("vit_smoke")
    return [load_dataset("cub", root, s, image_size=64, patch_size=8, mean=mean, std=std)
            for s in ("train", "test")]


def test_a_read_only_cache_serves_the_checkpoints_it_holds(tmp_path, smoke_splits, monkeypatch):
    """A lab's prepared, read-only cache: the checkpoint lock was made even for a cached checkpoint
    (``OSError: Read-only file system: …/checkpoints/….lock``); one it lacks is named in one line."""
    import errno
    import sys

    train, test = smoke_splits
    kw = dict(progress=False, cache_dir=tmp_path / "cache")
    recipe = bb.TrainingRecipe(epochs=1, batch_size=4, lr=1e-3, warmup_epochs=0, seed=0)
    _, meta = bb.load_or_finetune("vit_smoke", train, test, recipe, **kw)
    before = sorted(p.name for p in (tmp_path / "cache").iterdir())

    def read_only(path):
        raise OSError(errno.EROFS, "Read-only file system", str(path))
    monkeypatch.setattr(sys.modules["midas_nb.backbones.finetune"], "file_lock", read_only)
    model, again = bb.load_or_finetune("vit_smoke", train, test, recipe, **kw)
    assert again["loaded_from_cache"] and again["weights_digest"] == meta["weights_digest"]
    with pytest.raises(OSError, match=r"cannot be written \(Read-only file system\) and lacks vit_smoke-\w+\.pt"):
        bb.load_or_finetune("vit_smoke", train, test, bb.TrainingRecipe(epochs=1, batch_size=4, lr=1e-3, seed=1), **kw)
    assert sorted(p.name for p in (tmp_path / "cache").iterdir()) == before


@pytest.mark.slow
def test_same_seed_gives_bit_identical_weights_and_a_corrupt_checkpoint_is_rebuilt(tmp_path, smoke_splits):
    train, test = smoke_splits
    recipe = bb.TrainingRecipe(epochs=2, batch_size=4, lr=1e-3, warmup_epochs=1, seed=0)
    kw = dict(recipe=recipe, progress=False)
    # the first backbone of a process used to draw its init after the Lite0 loader had consumed
    # the global RNG (a throw-away model built once per process): start from that state
    bb.lite0_timm_state_dict.cache_clear()
    m1, meta1 = bb.load_or_finetune("vit_smoke", train, test, cache_dir=tmp_path / "a", **kw)
    sd1 = {k: v.clone() for k, v in m1.state_dict().items()}
    m2, meta2 = bb.load_or_finetune("vit_smoke", train, test, cache_dir=tmp_path / "b", **kw)
    assert not meta1["loaded_from_cache"] and not meta2["loaded_from_cache"]
    differ = [k for k in sd1 if not torch.equal(sd1[k], m2.state_dict()[k])]
    assert not differ, f"same seed, same machine, different weights: {differ[:5]}"
    assert meta1["checkpoint_id"] == meta2["checkpoint_id"]
    from midas_nb.identity import CacheIntegrityWarning, state_dict_digest
    assert meta1["weights_digest"] == meta2["weights_digest"] == state_dict_digest(m1)
    # a truncated weights file is detected, reported and retrained — into the same bits
    pt = Path(meta1["checkpoint_path"])
    pt.write_bytes(pt.read_bytes()[: pt.stat().st_size // 2])
    with pytest.warns(CacheIntegrityWarning, match="checkpoint"):
        m3, meta3 = bb.load_or_finetune("vit_smoke", train, test, cache_dir=tmp_path / "a", **kw)
    assert meta3["loaded_from_cache"] is False
    assert all(torch.equal(sd1[k], v) for k, v in m3.state_dict().items())
    m4, meta4 = bb.load_or_finetune("vit_smoke", train, test, cache_dir=tmp_path / "a", **kw)
    assert meta4["loaded_from_cache"] and meta4["weights_digest"] == meta1["weights_digest"]
    # the thread count changes float sums, so it is part of the checkpoint key
    n = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = bb.checkpoint_key("vit_smoke", train, test, recipe)
        torch.set_num_threads(3)
        three = bb.checkpoint_key("vit_smoke", train, test, recipe)
    finally:
        torch.set_num_threads(n)
    assert one[0] != three[0] and one[1]["numerics"]["num_threads"] == 1


def _tiny_vit():
    import timm
    torch.manual_seed(0)
    return timm.create_model("vit_tiny_patch16_224", pretrained=False, img_size=32, patch_size=8, depth=3,
                             embed_dim=32, num_heads=2, num_classes=4).eval()


def _damage(path: Path, how: str) -> None:
    data = bytearray(path.read_bytes())
    if how == "truncate":
        path.write_bytes(bytes(data[: len(data) // 2]))
    else:                                   # flip one byte in the payload's middle
        data[len(data) * 3 // 4] ^= 0xFF
        path.write_bytes(bytes(data))


@pytest.mark.parametrize("how", ["truncate", "flip"])
def test_damaged_cache_files_are_reported_and_rebuilt(tmp_path, how):
    from midas_nb.identity import CacheIntegrityWarning, cache_events, reset_cache_events
    from midas_nb.targets import target_cache
    from midas_nb.train import block_cache, load_or_train_scorer
    from tiny_data import TinyDataset

    from midas_nb.backbones.vit import disable_fused_attention

    # unfused from the start, as midas_nb builds backbones (capture unfuses in place otherwise)
    model, data = disable_fused_attention(_tiny_vit()), TinyDataset(6, 0)
    cache = block_cache(model, data, depth=2, key={"t": 1}, cache_dir=tmp_path, progress=False)
    scorer, _, loaded = load_or_train_scorer(model, cache, key={"t": 1}, depth=2, budget=0.5, seed=0,
                                             cache_dir=tmp_path, progress=False, epochs=1, batch_size=4)
    maps = target_cache(model, data, ids=["T0"], depth=2, class_rule="label", key={"t": 1}, cache_dir=tmp_path,
                        progress=False)
    assert not loaded
    files = {"blocks": sorted((tmp_path / "blocks").glob("*.pt")), "scorers": sorted((tmp_path / "scorers").glob("*.pt")),
             "targets": sorted((tmp_path / "targets").glob("*.safetensors"))}
    assert [len(v) for v in files.values()] == [1, 1, 1]
    for group in files.values():
        for f in group:
            _damage(f, how)
    reset_cache_events()
    with pytest.warns(CacheIntegrityWarning):
        again = block_cache(model, data, depth=2, key={"t": 1}, cache_dir=tmp_path, progress=False)
    torch.testing.assert_close(again.hidden, cache.hidden)
    with pytest.warns(CacheIntegrityWarning):
        s2, _, loaded2 = load_or_train_scorer(model, again, key={"t": 1}, depth=2, budget=0.5, seed=0,
                                              cache_dir=tmp_path, progress=False, epochs=1, batch_size=4)
    assert not loaded2                         # retrained, not read from the damaged file
    assert all(torch.equal(a, b) for a, b in zip(scorer.state_dict().values(), s2.state_dict().values()))
    with pytest.warns(CacheIntegrityWarning, match="target cache"):
        maps2 = target_cache(model, data, ids=["T0"], depth=2, class_rule="label", key={"t": 1},
                             cache_dir=tmp_path, progress=False)
    torch.testing.assert_close(maps2["T0"], maps["T0"])
    ev = cache_events()
    assert ev["corrupt"] == 3 and len(ev["problems"]) == 3
    # rebuilt files are valid: a third call loads everything without a warning
    import warnings
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheIntegrityWarning)
        block_cache(model, data, depth=2, key={"t": 1}, cache_dir=tmp_path, progress=False)


def _hammer(path: str, tag: int, n: int) -> None:
    from midas_nb.identity import save_verified
    for i in range(n):
        save_verified(path, bytes([tag]) * (200_000 + 37 * i), key={"k": 1})


def test_concurrent_writers_never_share_a_temporary_file(tmp_path):
    """Two processes writing one cache entry (two sweep workers at the same depth): the file is
    always one writer's complete payload, and no temporary file is left behind."""
    from midas_nb.identity import atomic_write, load_verified

    target = tmp_path / "entry.pt"
    ctx = multiprocessing.get_context("spawn")
    procs = [ctx.Process(target=_hammer, args=(str(target), tag, 25)) for tag in (1, 2)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(120)
    assert [p.exitcode for p in procs] == [0, 0]
    payload = load_verified(target, key={"k": 1})
    assert len(set(payload)) == 1 and payload[0] in (1, 2)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["entry.pt"]
    # the writer's temporary names are unique per call, in the target's directory
    seen = []
    real_replace = os.replace

    def spy(src, dst):
        seen.append(Path(src))
        return real_replace(src, dst)

    import midas_nb.identity as ident
    orig = ident.os.replace
    ident.os.replace = spy
    try:
        atomic_write(target, lambda f: f.write(b"a"))
        atomic_write(target, lambda f: f.write(b"b"))
    finally:
        ident.os.replace = orig
    assert len(set(seen)) == 2 and all(p.parent == tmp_path and p.name.startswith(".entry.pt.") for p in seen)


# ------------------------------------------------------- 6. intervals that are what they say


def _per_image_row(condition, seed, ids, miou, idauc, **kw):
    return _row(condition, seed=seed, miou=float(np.nanmean(miou)), idauc=float(np.mean(idauc)),
                image_ids=list(ids), miou_per_image=[float(v) for v in miou],
                idauc_image_ids=list(ids), idauc_per_image=[float(v) for v in idauc], **kw)


def test_aggregate_seeds_interval_covers_seed_variation_not_the_mean_of_bounds():
    rng = np.random.default_rng(0)
    n = 200
    ids = [str(i) for i in range(n)]
    x = rng.normal(0.5, 0.1, n)
    rows = []
    for seed, shift in ((0, 0.0), (1, 0.2)):
        m = x + shift
        lo, hi = m.mean() - 1.96 * m.std() / math.sqrt(n), m.mean() + 1.96 * m.std() / math.sqrt(n)
        rows.append(_per_image_row("T5", seed, ids, m, m, miou_lo=lo, miou_hi=hi))
    t = make_table(rows)
    agg = aggregate_seeds(t).iloc[0]
    mean_of_bounds = (t["miou_lo"].mean(), t["miou_hi"].mean())
    assert agg["ci_method"].startswith("t over 2 seeds")
    # two seeds 0.2 apart: mean ± t_1 · s/√2 with s² = 0.02 (the images add little), cut at [0, 1]
    half = student_t.ppf(0.975, 1) * math.sqrt(0.02 / 2)
    assert half > 1 and agg["miou_lo"] == 0.0 and agg["miou_hi"] == 1.0
    assert (agg["miou_hi"] - agg["miou_lo"]) > 3 * (mean_of_bounds[1] - mean_of_bounds[0])
    # one seed: the bootstrap over images, ≈ mean ± 1.96·sd/√n (an independent normal check)
    one = aggregate_seeds(t[t["seed"] == 0]).iloc[0]
    half = 1.96 * x.std() / math.sqrt(n)
    assert one["miou_lo"] == pytest.approx(x.mean() - half, abs=0.25 * half)
    assert one["miou_hi"] == pytest.approx(x.mean() + half, abs=0.25 * half)


def test_a_one_seed_condition_reads_the_interval_its_row_shows():
    """One seed: the condition's interval is its row's own bootstrap over images (summarise_metrics),
    not a second draw of the same bootstrap that moves the third digit ("0.255" in the row and in the
    band text, "0.254" in the summary); D's reference interval in the band text is that row's too."""
    from midas_nb.metrics import bootstrap_ci, decoupling_D
    from midas_nb.results import summarise_metrics

    rng = np.random.default_rng(3)
    n, ids = 64, [f"img{i}" for i in range(64)]
    rows = []
    for cond, seed, shift in (("reference", 0, 0.0), ("T5", 0, 0.05), ("T5", 1, 0.06), ("random", 0, -0.3)):
        v = np.clip(rng.normal(0.3 + shift, 0.2, n), -1, 1)
        m = summarise_metrics(correct=(v > 0.3).astype(float), n_boot=1000)
        rows.append(_per_image_row(cond, seed, ids, v, v, **m, miou_lo=bootstrap_ci(v)[1], miou_hi=bootstrap_ci(v)[2],
                                   idauc_lo=bootstrap_ci(v)[1], idauc_hi=bootstrap_ci(v)[2]))
    t = make_table(rows)
    agg = aggregate_seeds(t).set_index("condition")
    ref = t[t["condition"] == "reference"].iloc[0]
    for m in ("miou", "idauc"):
        assert (agg.loc["reference", f"{m}_lo"], agg.loc["reference", f"{m}_hi"]) == (ref[f"{m}_lo"], ref[f"{m}_hi"])
    # the second draw the summary used to make: close, not equal (so the test can tell them apart)
    from midas_nb.metrics import hierarchical_bootstrap
    redraw = hierarchical_bootstrap(np.array([t.iloc[0]["idauc_per_image"]]), 1000)
    assert redraw != (ref["idauc_lo"], ref["idauc_hi"]) and redraw == pytest.approx((ref["idauc_lo"], ref["idauc_hi"]),
                                                                                      abs=0.02)
    assert agg.loc["reference", "ci_method"] == "images bootstrap (one seed)"
    assert agg.loc["T5", "ci_method"].startswith("t over 2 seeds")          # several seeds: unchanged
    D = decoupling_D(t, n_boot=1000)
    text = D.loc[D["condition"] == "T5", "band_reason"].iloc[0]
    assert f"reference IDAUC {ref['idauc']:.3f} [{ref['idauc_lo']:.3f}, {ref['idauc_hi']:.3f}]" in text, text


def _band_table(delta: float, noise: float, n: int = 64, seed: int = 0) -> pd.DataFrame:
    """Reference IDAUC per image widely spread (as the issue's CUB subset: 0.185 [0.125, 0.246]
    on 64 images) and a condition = reference + delta + noise on the same images."""
    rng = np.random.default_rng(seed)
    ids = [f"img{i}" for i in range(n)]
    ref = rng.normal(0.185, 0.245, n)
    cond = ref + delta + rng.normal(0.0, noise, n)
    m_ref = rng.uniform(0.0, 0.2, n)
    m_cond = m_ref + 0.04 + rng.normal(0, 0.02, n)
    return make_table([_per_image_row("reference", 0, ids, m_ref, ref),
                       _per_image_row("T5", 0, ids, m_cond, cond)])


def test_D_has_paired_intervals_and_says_when_the_band_is_not_resolved():
    # resolved inside the band: the paired interval is narrow although the IDAUCs spread widely
    t = _band_table(delta=0.02, noise=0.005)
    D = decoupling_D(t).set_index("condition")
    t5 = D.loc["T5"]
    diff = np.array(t.iloc[1]["idauc_per_image"]) - np.array(t.iloc[0]["idauc_per_image"])
    half = 1.96 * diff.std() / math.sqrt(len(diff))
    assert t5["delta_idauc_lo"] == pytest.approx(diff.mean() - half, abs=0.3 * half)
    assert t5["delta_idauc_hi"] == pytest.approx(diff.mean() + half, abs=0.3 * half)
    assert t5["delta_idauc_hi"] - t5["delta_idauc_lo"] < 0.01      # unpaired would be ~0.17 wide
    assert t5["status"] == "in band" and bool(t5["band_resolved"]) and bool(t5["in_band"])
    dpp = (np.array(t.iloc[1]["miou_per_image"]) - np.array(t.iloc[0]["miou_per_image"])) * 100
    assert t5["D_pp_lo"] < dpp.mean() < t5["D_pp_hi"] and t5["D_pp_hi"] - t5["D_pp_lo"] < 2.0
    ref = D.loc["reference"]
    assert (ref["D_pp"], ref["D_pp_lo"], ref["D_pp_hi"], ref["delta_idauc_lo"]) == (0, 0, 0, 0)
    assert ref["status"] == "in band"
    # resolved outside
    out = decoupling_D(_band_table(delta=-0.05, noise=0.005)).set_index("condition").loc["T5"]
    assert out["status"] == "outside band" and bool(out["band_resolved"]) and not bool(out["in_band"])
    # the case: ΔIDAUC ≈ −0.006 on 64 images with per-image noise: not resolved
    nr = decoupling_D(_band_table(delta=-0.006, noise=0.1)).set_index("condition").loc["T5"]
    assert nr["delta_idauc_lo"] < -0.01 < nr["delta_idauc_hi"]
    assert nr["status"] == "not resolved" and not bool(nr["band_resolved"])
    h = (nr["delta_idauc_hi"] - nr["delta_idauc_lo"]) / 2      # what this sample can tell from the band's edge
    assert nr["D_cell"].endswith(f"(band not resolved: this sample resolves |ΔIDAUC| ≥ {h:.3f})")


def test_D_over_seeds_resamples_seeds_and_images():
    ids = [str(i) for i in range(100)]
    rng = np.random.default_rng(1)
    ref = rng.normal(0.2, 0.1, 100)
    rows = [_per_image_row("reference", 0, ids, ref * 0 + 0.1, ref)]
    for seed, d in ((0, 0.0), (1, 0.04)):       # the two seeds disagree by 0.04 IDAUC
        rows.append(_per_image_row("T5", seed, ids, ref * 0 + 0.12, ref + d))
    D = decoupling_D(make_table(rows)).set_index("condition").loc["T5"]
    assert D["delta_idauc"] == pytest.approx(0.02)
    # exact paired differences per seed are 0 and 0.04, no image spread: the seed component alone,
    # 0.02 ± t_{1, 0.975}·s/√2 with s = 0.04/√2 (not the range [0, 0.04] of two seeds)
    from scipy.stats import t as student_t
    half = student_t.ppf(0.975, 1) * 0.02
    assert D["delta_idauc_lo"] == pytest.approx(0.02 - half, abs=1e-12)
    assert D["delta_idauc_hi"] == pytest.approx(0.02 + half, abs=1e-12)
    from midas_nb.metrics import hierarchical_bootstrap
    assert hierarchical_bootstrap(np.array([[0.0] * 5, [0.04] * 5]), resample_seeds=False) == \
        pytest.approx((0.02, 0.02))


def test_tables_written_and_read_keep_the_per_image_values(tmp_path):
    from midas_nb.results import load_table, save_table

    t = _band_table(0.01, 0.01, n=5)
    t.loc[0, "miou_per_image"][2] = math.nan
    save_table(t, "pim", tmp_path)
    back = load_table("pim", tmp_path)
    assert back["idauc_per_image"][1] == pytest.approx(t["idauc_per_image"][1])
    assert math.isnan(back["miou_per_image"][0][2]) and back["image_ids"][0] == t["image_ids"][0]
    D1, D2 = decoupling_D(t), decoupling_D(back)
    pd.testing.assert_series_equal(D1["delta_idauc_lo"], D2["delta_idauc_lo"])


@pytest.mark.parametrize("umask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)])
def test_written_files_and_generated_folders_honour_the_umask(tmp_path, umask, file_mode, dir_mode):
    """mkstemp gives 0600 and mkdtemp 0700 whatever the umask: a store or cache shared by a lab
    group would be unreadable to the others. Atomic writes and the generated synthetic set take
    the umask's modes, as open() and mkdir() do."""
    from midas_nb.data.synthetic import make_synthetic_cub
    from midas_nb.identity import atomic_write_bytes, atomic_write_text

    old = os.umask(umask)
    try:
        text = atomic_write_text(tmp_path / "store" / "row.json", "{}")
        data = atomic_write_bytes(tmp_path / "cache.bin", b"x")
        root = make_synthetic_cub(tmp_path / "synthetic", num_classes=2, images_per_class=2, image_size=16)
    finally:
        os.umask(old)
    assert oct(text.stat().st_mode & 0o777) == oct(file_mode)
    assert oct(data.stat().st_mode & 0o777) == oct(file_mode)
    assert oct(root.stat().st_mode & 0o777) == oct(dir_mode)
    images = [p for p in root.rglob("*") if p.is_file()]
    assert images and {oct(p.stat().st_mode & 0o777) for p in images} == {oct(file_mode)}


def test_new_file_mode_reads_the_umask_without_changing_it():
    from midas_nb.identity import new_file_mode

    old = os.umask(0o027)
    try:
        assert (new_file_mode(), new_file_mode(directory=True)) == (0o640, 0o750)
        assert os.umask(0o027) == 0o027  # left as it was
    finally:
        os.umask(old)
