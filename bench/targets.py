"""Benchmark: all supervision targets from one pass vs a plain pass vs one pass per target.

Prints, on the same batch and machine (best / median of ``--repeats`` runs):

1. one plain forward + backward: forward, then ``autograd.grad(Σ_b y_{b,c_b}, embedded tokens)``;
2. ``compute_targets`` for T0–T5 + rollout + tokentm (one capture: forward, logit backward,
   loss backward down to block L), split into the capture and the target arithmetic;
3. the naive way: one ``compute_targets`` call (forward + backward) per target.

Goal (issue 4): (2) ≤ 1.5 × (1) and (3) ≥ 4 × (2). Last line: ``ratio: <(2) / (1)>``.

Usage::

    python bench/targets.py                       # DeiT-Ti shape, 12 blocks, B=16, 224 px, L=6
    python bench/targets.py --batch 4 --repeats 2 # quicker
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import timm
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without install

from midas_nb.capture import capture
from midas_nb.targets import compute_targets, get_target
from midas_nb.backbones.vit import classify_tokens, embed_tokens

IDS = ["T0", "T1", "T2", "T3", "T4", "T5", "rollout", "tokentm"]


def timed(fns: dict, repeats: int, warmup: bool = True) -> dict[str, tuple[float, float]]:
    """(best, median) wall time in seconds of each ``fn()`` over ``repeats`` rounds.

    The functions run interleaved (one of each per round) so that load from other processes
    on a shared machine affects all of them alike.
    """
    if warmup:
        for fn in fns.values():
            fn()
    times: dict[str, list[float]] = {k: [] for k in fns}
    for _ in range(repeats):
        for k, fn in fns.items():
            t0 = time.perf_counter()
            fn()
            times[k].append(time.perf_counter() - t0)
    return {k: (min(v), statistics.median(v)) for k, v in times.items()}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default="vit_tiny_patch16_224", help="timm architecture (random init)")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--depth", type=int, default=6, help="1-based depth L")
    p.add_argument("--num-classes", type=int, default=200)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--naive-repeats", type=int, default=1, help="repeats of the (slow) naive way")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's). On a CPU shared with other jobs, "
                        "1 avoids OpenMP threads waiting on descheduled peers at every small op")
    args = p.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)

    torch.manual_seed(0)
    timm.layers.set_fused_attn(False)            # DESIGN.md §3: the study's backbones are unfused
    model = timm.create_model(args.model, pretrained=False, img_size=args.image_size,
                              num_classes=args.num_classes).eval().to(args.device)
    model.requires_grad_(False)                  # frozen backbone, as in the study
    images = torch.randn(args.batch, 3, args.image_size, args.image_size, device=args.device)
    c = torch.randint(0, args.num_classes, (args.batch,), device=args.device)
    labels = torch.randint(0, args.num_classes, (args.batch,), device=args.device)
    sync = torch.cuda.synchronize if str(args.device).startswith("cuda") else (lambda: None)
    print(f"{args.model}: {len(model.blocks)} blocks, B={args.batch}, {args.image_size} px, "
          f"L={args.depth}, device={args.device}, threads={torch.get_num_threads()}")

    def plain():
        with torch.enable_grad():
            x = embed_tokens(model, images).requires_grad_(True)
            logits = classify_tokens(model, model.blocks(x))
            torch.autograd.grad(logits.gather(1, c[:, None]).sum(), x)
        sync()

    def all_targets():
        compute_targets(model, images, IDS, args.depth, c, labels)
        sync()

    def capture_only():
        capture(model, images, c, labels, loss_blocks=[args.depth - 1], prob_grad="tokentm" in IDS)
        sync()

    cap = capture(model, images, c, labels, loss_blocks=[args.depth - 1], prob_grad="tokentm" in IDS)
    target_fns = [get_target(i) for i in IDS]

    def arithmetic_only():
        for fn in target_fns:
            fn(cap, args.depth, c)
        sync()

    def naive():
        for i in IDS:
            compute_targets(model, images, [i], args.depth, c, labels if i == "T2" else None)
        sync()

    t = timed(dict(plain=plain, all=all_targets, capture=capture_only, arith=arithmetic_only), args.repeats)
    t_plain, t_all, t_cap, t_arith = t["plain"], t["all"], t["capture"], t["arith"]
    t_naive = timed(dict(naive=naive), args.naive_repeats, warmup=False)["naive"]  # already warm
    fmt = lambda t: f"best {t[0]:.3f} s, median {t[1]:.3f} s"  # noqa: E731
    print(f"plain forward + backward:            {fmt(t_plain)}")
    print(f"compute_targets ({len(IDS)} targets, 1 pass): {fmt(t_all)}")
    print(f"  of which capture:                  {fmt(t_cap)}")
    print(f"  of which target arithmetic:        {fmt(t_arith)}")
    print(f"naive (1 pass per target):           {fmt(t_naive)}")
    print(f"naive / all-targets: {t_naive[0] / t_all[0]:.2f} (goal ≥ 4)")
    print(f"ratio: {t_all[0] / t_plain[0]:.3f}")


if __name__ == "__main__":
    main()
