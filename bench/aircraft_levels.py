"""The offline teacher's test accuracy on the FGVC-Aircraft subset at each label level.

The quick profile's ``aircraft_level`` is the level at which the backbone learns something the
label frequencies alone do not give: this script prints, per level, the number of classes, the
chance level (1 / classes present), the majority-class fraction of the test split and the
teacher's test top-1 (the ImageNet EfficientNet-Lite0 above the stem + a linear probe, the
distilled student's teacher, :mod:`midas_nb.backbones.distilled`), so the choice is measured.

Usage::

    python bench/aircraft_levels.py --root ../shared/data/fgvc_aircraft_subset/fgvc-aircraft-2013b
"""
from __future__ import annotations

import argparse
from collections import Counter

import torch

from midas_nb import config
from midas_nb.backbones import create_backbone, stem_features
from midas_nb.backbones.distilled import fit_linear_probe, lite0_teacher_head, teacher_features
from midas_nb.data import AircraftDataset
from midas_nb.data.transforms import EvalTransform


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", required=True)
    ap.add_argument("--seeds", type=int, default=3)
    args = ap.parse_args()
    torch.manual_seed(0)
    model = create_backbone("hybrid_lite0_deit", num_classes=2)
    head = lite0_teacher_head(model.patch_embed.patch_size[0])
    norm = dict(mean=model.pretrained_cfg["mean"], std=model.pretrained_cfg["std"])
    print(f"{'level':12s} {'classes':>7s} {'chance':>7s} {'majority':>8s} {'teacher top-1 (seeds)':>24s}")
    for level in config.AIRCRAFT_LEVELS:
        sets = {s: AircraftDataset(args.root, s, EvalTransform(224, **norm), annotation_level=level)
                for s in ("trainval", "test")}
        labels = {s: torch.tensor(d.labels) for s, d in sets.items()}
        feats = {s: stem_features(model, d, flip=False, batch_size=32, device="cpu",
                                  cache_dir=config.cache_dir(), progress=False) for s, d in sets.items()}
        pooled = {s: teacher_features(head, f, 32, torch.device("cpu")).float().mean((-1, -2))
                  for s, f in feats.items()}
        present = sorted(set(labels["test"].tolist()))
        majority = Counter(labels["test"].tolist()).most_common(1)[0][1] / len(labels["test"])
        accs = []
        for seed in range(args.seeds):
            probe = fit_linear_probe(pooled["trainval"], labels["trainval"], int(max(labels["trainval"].max(),
                                     labels["test"].max())) + 1, seed=seed, steps=100, lr=1e-2,
                                     weight_decay=0.1, label_smoothing=0.1)
            accs.append(float((probe(pooled["test"]).argmax(-1) == labels["test"]).float().mean()))
        print(f"{level:12s} {len(present):7d} {1 / len(present):7.3f} {majority:8.3f} "
              f"{' '.join(f'{a:.3f}' for a in accs):>24s}")


if __name__ == "__main__":
    main()
