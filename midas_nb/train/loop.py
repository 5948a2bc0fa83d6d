"""The one optimisation loop over cached block states, shared by scorer training
(:func:`midas_nb.train.train_scorers`) and the LaSt fine-tune
(:func:`midas_nb.analysis.last.last_finetune`).

Both train a small module on block outputs computed once per split (:func:`midas_nb.train.block_cache`):
AdamW, the cosine learning-rate multiplier :func:`midas_nb.backbones.optim.cosine_lr` stepped once per
optimiser step, ``epochs`` passes over a batch order drawn from a generator seeded by ``seed``.
"""
from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Sequence

import torch
from torch import Tensor
from ..progress import tqdm

from ..backbones.optim import cosine_lr

__all__ = ["optimise_on_cache"]


def optimise_on_cache(params: Iterable[torch.nn.Parameter] | Sequence[Iterable[torch.nn.Parameter]], n: int,
                      step: Callable[[Any], Tensor], *, epochs: int, batch_size: int, lr: float, weight_decay: float,
                      seed: int | Sequence[int], desc: str, progress: bool = True,
                      end_epoch: Callable[[], None] | None = None, show_loss: bool = False) -> None:
    """Minimise ``step(idx)`` over ``epochs`` passes of ``n`` cached rows.

    Per epoch the rows are visited in ``torch.randperm(n)`` order (one ``torch.Generator``
    seeded with ``seed`` for the whole run) in batches of ``batch_size`` indices ``idx [≤B]``;
    ``step(idx)`` computes the batch's scalar loss (and records whatever statistics its caller
    keeps); then ``zero_grad``, ``backward``, an AdamW step and a scheduler step (``cosine_lr``
    over ``epochs·⌈n/B⌉`` steps). ``end_epoch()`` runs after each epoch.

    Several models in one loop (docs/decisions/0069): ``seed`` a list of seeds and ``params`` one
    parameter list per seed; each has its own AdamW, schedule and batch order (the ones it would
    have alone), ``step`` gets the list of their batches and returns the sum of their losses (a
    model's gradient is then its own loss's).

    Args:
        params: the parameters to optimise (AdamW with ``lr``, ``weight_decay``).
        n: number of cached rows.
        step: ``idx [≤B] long -> loss []`` with a graph to ``params``.
        epochs, batch_size, lr, weight_decay, seed: the recipe.
        desc, progress, show_loss: the tqdm bar (one tick per step; ``show_loss`` shows the
            batch loss).
        end_epoch: called after each epoch.
    """
    many = not isinstance(seed, int)
    groups = [list(p) for p in params] if many else [list(params)]
    opts = [torch.optim.AdamW(g, lr=lr, weight_decay=weight_decay) for g in groups]
    total = max(1, epochs * math.ceil(n / batch_size))
    scheds = [torch.optim.lr_scheduler.LambdaLR(o, cosine_lr(total)) for o in opts]
    gens = [torch.Generator().manual_seed(int(s)) for s in (seed if many else [seed])]
    with tqdm(total=total, desc=desc, disable=not progress, leave=False) as bar:
        for _ in range(epochs):
            for idx in zip(*(torch.randperm(n, generator=g).split(batch_size) for g in gens)):
                loss = step(list(idx) if many else idx[0])
                for opt in opts:
                    opt.zero_grad(set_to_none=True)
                loss.backward()
                for opt, sched in zip(opts, scheds):
                    opt.step()
                    sched.step()
                bar.update(1)
                if show_loss:
                    bar.set_postfix(loss=f"{loss.item():.3f}")
            if end_epoch is not None:
                end_epoch()
