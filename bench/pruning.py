"""Throughput of the pruned forward vs the full forward (DESIGN.md §5; issue 5).

DeiT-S-shaped ViT (timm ``deit_small_patch16_224``, random weights: speed does not depend on
them), CPU, the same batch for both, depth ``L = 6``, budget ``b = 25 %`` (``k = 49`` of 196
patch tokens after block 6). Full and pruned calls are interleaved and the median time per
call is used, which is robust to other load on a shared machine. Goal: ratio ≥ 1.45.

Single-threaded by default: on a shared machine, multi-threaded timings of the short (pruned)
sequence are dominated by OpenMP barrier waits whenever another process holds a core (measured
here: 1.2× with 2 threads at load ≈ 3 on 2 cores, 1.6× single-threaded in the same minute).
Pass ``--threads 0`` (torch's default) on a dedicated machine.

Usage::

    python bench/pruning.py [--batch 16] [--repeats 5] [--threads 1]

The last line is ``ratio: <pruned throughput / unpruned throughput>`` for the MLP scorer (the
trained conditions); the reference (T0) scorer's ratio is printed above it.
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))   # run from a checkout, uninstalled

import timm
import torch

from midas_nb.pruning import pruned_forward
from midas_nb.scorers import MLPScorer, ReferenceScorer


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--budget", type=float, default=0.25)
    ap.add_argument("--threads", type=int, default=1,
                    help="torch.set_num_threads; 0 keeps torch's default (all cores)")
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = timm.create_model("deit_small_patch16_224", pretrained=False).eval()
    scorers = {"mlp": MLPScorer(model.embed_dim).eval(), "reference": ReferenceScorer()}
    images = torch.randn(args.batch, 3, 224, 224)
    fns = {"full": lambda: model(images)}
    fns.update({name: (lambda s=s: pruned_forward(model, images, s, args.depth, args.budget).logits)
                for name, s in scorers.items()})
    times: dict[str, list[float]] = {name: [] for name in fns}
    with torch.inference_mode():
        for _ in range(args.warmup):
            for fn in fns.values():
                fn()
        for _ in range(args.repeats):
            for name, fn in fns.items():
                t0 = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - t0)
    tput = {name: args.batch / statistics.median(t) for name, t in times.items()}
    print(f"deit_small_patch16_224 (random weights), CPU, {torch.get_num_threads()} threads, "
          f"batch {args.batch}, L={args.depth}, b={args.budget}, median of {args.repeats}")
    for name, v in tput.items():
        print(f"  {name:9s}: {v:7.2f} img/s")
    print(f"ratio (reference scorer): {tput['reference'] / tput['full']:.3f}")
    print(f"ratio: {tput['mlp'] / tput['full']:.3f}")


if __name__ == "__main__":
    main()
