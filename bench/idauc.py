"""Cost of token-space IDAUC relative to plain forwards.

Times ``insertion_deletion_auc(space="token", steps=S)`` on a randomly initialised timm ViT
(DeiT-S shape by default: 224 px, patch 16, width 384, 12 blocks, 6 heads) and one plain
forward of the same batch, and prints

    ratio: <IDAUC time per image / (S × plain forward time per image)>

Goal ≤ 1: the S insertion and S deletion forwards together see ≈ S·N patch tokens (each step's
insertion keeps k_s tokens and its deletion N − k_s), the patch embedding runs once, the
"all tokens" and "prefix only" points are each computed once, and attention on shorter
sequences costs less than on the full one.

Usage: ``python bench/idauc.py [--model deit_small_patch16_224] [--batch 8] [--steps 10]
[--device cpu] [--repeats 2]``
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))   # run from a checkout

import timm
import torch

from midas_nb.metrics import insertion_counts, insertion_deletion_auc
from midas_nb.backbones.vit import num_patches, num_prefix_tokens


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _time(fn, repeats: int, device: torch.device) -> float:
    fn()                                                    # warm-up
    _sync(device)
    t0 = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - t0) / repeats


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="deit_small_patch16_224")
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--num-classes", type=int, default=200)
    args = ap.parse_args()

    device = torch.device(args.device)
    torch.manual_seed(0)
    model = timm.create_model(args.model, pretrained=False, num_classes=args.num_classes).eval().to(device)
    images = torch.randn(args.batch, 3, 224, 224, device=device)
    N, P = num_patches(model), num_prefix_tokens(model)
    ranking = torch.randn(args.batch, N, device=device)

    with torch.no_grad():
        t_plain = _time(lambda: model(images), args.repeats, device)
    t_idauc = _time(lambda: insertion_deletion_auc(model, images, ranking, steps=args.steps),
                    args.repeats, device)

    counts = insertion_counts(N, args.steps)
    # distinct sequences per image: all tokens once, prefix only once, then ins k / del N−k
    seq_tokens = (P + N) + P + sum(P + k for k in counts if 0 < k < N) \
        + sum(P + N - k for k in counts if 0 < k < N)
    per_img_plain = t_plain / args.batch
    per_img_idauc = t_idauc / args.batch
    print(f"model {args.model}  device {device}  batch {args.batch}  S={args.steps}  "
          f"N={N}  P={P}  threads={torch.get_num_threads()}")
    print(f"plain forward: {per_img_plain * 1e3:.2f} ms/image")
    print(f"token IDAUC (S={args.steps}): {per_img_idauc * 1e3:.2f} ms/image "
          f"= {per_img_idauc / per_img_plain:.2f} plain forwards")
    print(f"tokens through the blocks: {seq_tokens} = "
          f"{seq_tokens / (args.steps * (P + N)):.3f} × S full sequences")
    print(f"ratio: {per_img_idauc / (args.steps * per_img_plain):.3f}")


if __name__ == "__main__":
    main()
