"""The one learning-rate schedule of the package: (linear warm-up then) cosine decay per step.

Scorer training (:func:`midas_nb.train.train_scorers`), the LaSt fine-tune
(:func:`midas_nb.analysis.last.last_finetune`) and the backbone fine-tunes
(:func:`midas_nb.backbones.finetune`, :func:`midas_nb.backbones.distilled.finetune_distilled`) all use
:func:`cosine_lr` as the multiplier of a ``torch.optim.lr_scheduler.LambdaLR`` stepped once per
optimiser step (SGDR, Loshchilov & Hutter, 2017, https://arxiv.org/abs/1608.03983, without
restarts; warm-up as in Goyal et al., 2017, https://arxiv.org/abs/1706.02677).
"""
from __future__ import annotations

import math
from typing import Callable

__all__ = ["cosine_lr"]


def cosine_lr(total_steps: int, warmup_steps: int = 0) -> Callable[[int], float]:
    """LR multiplier of step ``i`` (0-based): ``(i+1)/w`` for ``i < w`` warm-up steps, then
    ``½(1 + cos(π·s/n))`` with ``s = min(i − w, n)``, ``n = max(1, total_steps − w)``; 0 after
    ``total_steps``.

    The two branches keep the exact floating-point order each recipe was measured and cached
    with — ``π·s/n`` without warm-up, ``π·min(1, s/n)`` with it (they differ in the last bit
    for about a quarter of the steps) — so trained scorers, LaSt heads and fine-tuned
    checkpoints stay bit-identical to their cached copies.

    Raises:
        ValueError: ``total_steps < 1`` or ``warmup_steps < 0``.
    """
    if total_steps < 1 or warmup_steps < 0:
        raise ValueError(f"cosine_lr needs total_steps >= 1 and warmup_steps >= 0, got {total_steps}, {warmup_steps}")
    if warmup_steps == 0:
        n = total_steps
        return lambda i: 0.5 * (1 + math.cos(math.pi * min(i, n) / n))

    def f(step: int) -> float:
        if step < warmup_steps:
            return (step + 1) / warmup_steps
        t = (step - warmup_steps) / max(1, total_steps - warmup_steps)
        return 0.5 * (1.0 + math.cos(math.pi * min(1.0, t)))
    return f
