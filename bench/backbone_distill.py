"""The distilled offline backbone next to the label-trained one: accuracy and build time from nothing.

Issue 18's goal: >= 72 % test top-1 on the 40-class CUB subset for ``hybrid_lite0_deit`` (the
DeiT-style student of the ImageNet EfficientNet-Lite0, :mod:`midas_nb.backbones.distilled`), its whole
build — stem features, teacher, student — <= 10 min on 2 CPU cores, with a recipe that holds on
other CUB classes. Both backbones are built with the quick profile's schedule, each in its own
empty cache (so each build includes its stem features), on the classes ``--classes`` of the CUB
copy (a CUB-layout directory holding only those classes is written under ``--work-dir``, the
images linked, not copied):

    python bench/backbone_distill.py                    # classes 1-40 of ../shared/data/cub200_subset
    python bench/backbone_distill.py --classes 21-40    # the check on other classes
    python bench/backbone_distill.py --skip-old         # the new backbone only
    python bench/backbone_distill.py --skip-old --seed 1                                 # another seed
    python bench/backbone_distill.py --skip-old --epochs 20 --coarse-epochs 0           # the earlier full-token recipe

Prints per-backbone accuracy, teacher accuracy, wall and CPU time (user + sys of this process,
``resource.getrusage``) and the 1-minute load average before and after each build (wall times
are inflated when other jobs share the CPU). The last line is ``ratio: <new / old test top-1>``
(``--skip-old`` compares against ``--old-accuracy``).
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from midas_nb.backbones import backbone_normalization, DISTILLED_RECIPES, load_or_finetune, machine_info, TrainingRecipe
from midas_nb.config import default_data_root, finetune_settings, get_profile
from midas_nb.data import load_dataset

_FILTERED = ("images.txt", "image_class_labels.txt", "train_test_split.txt", "bounding_boxes.txt")


def cub_class_subset(src: Path, first: int, last: int, dst: Path) -> Path:
    """Write a CUB-layout directory ``dst`` holding only the images of classes ``first..last``
    (original 1-based ids) of ``src``: the per-image files filtered by image id, ``classes.txt``
    and ``parts/parts.txt`` copied, ``parts/part_locs.txt`` filtered, ``images/`` a symlink."""
    labels = dict(line.split()[:2] for line in (src / "image_class_labels.txt").read_text().splitlines() if line.strip())
    keep = {i for i, c in labels.items() if first <= int(c) <= last}
    if not keep:
        raise SystemExit(f"{src}: no image of classes {first}-{last}")
    (dst / "parts").mkdir(parents=True, exist_ok=True)
    for name in _FILTERED + ("parts/part_locs.txt",):
        lines = [ln for ln in (src / name).read_text().splitlines() if ln.split() and ln.split()[0] in keep]
        (dst / name).write_text("\n".join(lines) + "\n")
    shutil.copy(src / "classes.txt", dst / "classes.txt")
    shutil.copy(src / "parts" / "parts.txt", dst / "parts" / "parts.txt")
    if not (dst / "images").exists():
        os.symlink((src / "images").resolve(), dst / "images")
    return dst


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def _load() -> float:
    return float(Path("/proc/loadavg").read_text().split()[0]) if Path("/proc/loadavg").exists() else float("nan")


def build(name: str, train, test, ft: dict, cache: Path, device: str, seed: int = 0) -> dict:
    """Build ``name`` from nothing in the empty cache ``cache``; accuracy, timings, load."""
    load0, t0, c0 = _load(), time.perf_counter(), _cpu()
    model, meta = load_or_finetune(name, train, test, TrainingRecipe(seed=seed, **ft), device=device, cache_dir=cache,
                                   progress=False)
    wall, cpu = time.perf_counter() - t0, _cpu() - c0
    assert not meta["loaded_from_cache"], f"{cache} was not empty"
    return dict(name=name, checkpoint_id=meta["checkpoint_id"], test_accuracy=meta["test_accuracy"],
                train_accuracy=meta["train_accuracy"], distillation=meta.get("distillation"),
                timings=meta["timings"], wall_s=wall, cpu_s=cpu, load_before=load0, load_after=_load(),
                precision=meta["precision"], attention=meta.get("attention"), machine=meta.get("machine"))


def main() -> None:
    prof = get_profile("quick")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=str(default_data_root() / "cub200_subset"), help="CUB-layout directory")
    ap.add_argument("--classes", default="1-40", help="first-last original class ids (1-based)")
    ap.add_argument("--old", default="hybrid_lite0_vit")
    ap.add_argument("--new", default="hybrid_lite0_deit")
    ap.add_argument("--skip-old", action="store_true")
    ap.add_argument("--old-accuracy", type=float, default=0.623,
                    help="with --skip-old: the old backbone's accuracy to compare with (62.3 %% on classes 1-40)")
    ap.add_argument("--work-dir", default=None, help="class subset and caches (default: a temporary directory)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0, help="the builds' seed (initialisation, batch order, MixToken)")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--epochs", type=int, default=None, help="the new backbone's epochs (default: the quick profile's)")
    ap.add_argument("--token-keep", type=float, default=None,
                    help="PatchDropout for the new backbone: fraction of teacher cells kept per step (DistillRecipe.token_keep)")
    ap.add_argument("--coarse-epochs", type=int, default=None,
                    help="progressive token resolution for the new backbone: epochs on the teacher's grid "
                         "first (DistillRecipe.coarse_epochs; default: the registry's, 18 for hybrid_lite0_deit)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    first, last = (int(v) for v in args.classes.split("-"))
    work = Path(args.work_dir or tempfile.mkdtemp(prefix="midas_distill_"))
    root = cub_class_subset(Path(args.root), first, last, work / f"cub_{first}_{last}")

    ft = {name: finetune_settings(prof, "cub", name) for name in (args.old, args.new)}
    if args.epochs is not None:
        ft[args.new]["epochs"] = args.epochs
    # the measured alternatives of docs/decisions/0001 and 0002 (default: the registry's recipe)
    variant = {k: v for k, v in dict(token_keep=args.token_keep, coarse_epochs=args.coarse_epochs).items()
               if v is not None}
    if variant:
        DISTILLED_RECIPES[args.new] = replace(DISTILLED_RECIPES[args.new], **variant)
    mean, std = backbone_normalization(args.new)
    data_kw = dict(image_size=prof["image_size"], patch_size=prof["patch_size"], mean=mean, std=std)
    train, test = load_dataset("cub", root, "train", **data_kw), load_dataset("cub", root, "test", **data_kw)
    print(f"classes {first}-{last}: {train.num_classes} classes, {len(train)} train / {len(test)} test images; "
          f"recipes {ft}; {args.threads} threads", flush=True)
    m = machine_info()  # build times differ several-fold between CPUs (AMX/AVX-512 bfloat16 vs AVX2 float32)
    print(f"machine: {m['cpu']}, {m['logical_cpus']} logical CPUs, kernels {m['cpu_capability']}, "
          f"native bfloat16 {'yes' if m['native_bfloat16'] else 'no'}", flush=True)
    results = {}
    for name in ([] if args.skip_old else [args.old]) + [args.new]:
        cache = work / f"cache_{name}_{int(time.time())}"
        r = build(name, train, test, ft[name], cache, args.device, args.seed)
        results[name] = r
        d = r["distillation"] or {}
        teacher = f", teacher {d['teacher_test_accuracy']:.3f}" if d else ""
        heads = (f" (class token {d['student_test_accuracy_cls']:.3f}, distillation token "
                 f"{d['student_test_accuracy_dist']:.3f})") if d else ""
        print(f"{name}: test top-1 {r['test_accuracy']:.3f}{heads}{teacher}; build {r['wall_s']:.0f} s wall, "
              f"{r['cpu_s']:.0f} s CPU, load {r['load_before']:.1f} -> {r['load_after']:.1f}, {r['precision']}, "
              f"attention {r['attention']}; "
              f"stages {json.dumps({k: round(v, 1) for k, v in r['timings'].items()})}", flush=True)
    new = results[args.new]["test_accuracy"]
    old = args.old_accuracy if args.skip_old else results[args.old]["test_accuracy"]
    print(f"{args.new} vs {args.old if not args.skip_old else 'given'}: {new:.3f} vs {old:.3f} "
          f"({100 * (new - old):+.1f} pp); goal >= 0.72 on classes 1-40, build <= 600 s on 2 cores")
    print(f"ratio: {new / old:.3f}")


if __name__ == "__main__":
    main()
