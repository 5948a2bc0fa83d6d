"""Accuracy of the pruned model, device-synchronised throughput and the scorer families' own
readouts (Cropr's last-layer fusion, IA-RED²'s threshold rule: :func:`family_readout`)."""
from __future__ import annotations

import statistics
import time
from typing import Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..progress import tqdm
from ..pruning import TokenScorer, pruned_forward
from ..scorers import CroprScorer, IARedScorer, cropr_forward, masked_logits, prune_tokens_llf
from .registry import register_metric
from .stats import bootstrap_ci


@register_metric("pruned_accuracy", higher_is_better=True, category="accuracy", reference="top-1 accuracy",
                 summary="fraction of images whose pruned-model prediction equals the label")
def pruned_accuracy(logits: Tensor, labels: Tensor) -> float:
    """Top-1 accuracy of ``logits [B,C]`` against ``labels [B]`` (a fraction in ``[0,1]``).

    Per-image correctness for :func:`bootstrap_ci` is ``(logits.argmax(-1) == labels)``.
    """
    if logits.dim() != 2 or labels.shape != logits.shape[:1]:
        raise ValueError(f"logits must be [B,C] and labels [B], got {tuple(logits.shape)} and "
                         f"{tuple(labels.shape)}")
    return float((logits.argmax(-1) == labels.to(logits.device)).float().mean())


def _sync(device: torch.device | None) -> None:
    if device is not None and device.type == "cuda":
        torch.cuda.synchronize(device)


def _num_images(batch: Any) -> int:
    if hasattr(batch, "images"):
        return int(batch.images.shape[0])
    if isinstance(batch, Tensor):
        return int(batch.shape[0])
    return len(batch)


@register_metric("throughput", higher_is_better=True, category="efficiency",
                 reference="wall-clock images per second (device-synchronised)",
                 summary="images per second of the pruned forward")
def measure_throughput(fn: Callable[[Any], Any], batch: Any, repeats: int = 10, warmup: int = 2, *,
                       device: torch.device | str | None = None) -> float:
    """Images per second of ``fn(batch)``, timed over ``repeats`` calls after ``warmup`` calls.

    Runs under ``torch.no_grad``; on CUDA the device is synchronised before starting and
    stopping the clock (kernels are asynchronous).

    Args:
        fn: callable taking ``batch``.
        batch: a ``[B,...]`` tensor, a ``Batch`` (``.images``), or a sized sequence.
        repeats: timed calls (≥ 1).
        warmup: untimed calls first.
        device: device to synchronise; ``None`` → that of ``batch`` (``batch.images``).

    Returns:
        ``B · repeats / seconds`` (images/s).
    """
    if repeats < 1:     # its own message: measure_throughputs' would name rounds and forwards it was not given
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    return measure_throughputs({"fn": fn}, batch, repeats, warmup, rounds=1, device=device)["fn"]


def measure_throughputs(fns: dict[str, Callable[[Any], Any]], batch: Any, repeats: int = 5, warmup: int = 1,
                        rounds: int = 3, *, device: torch.device | str | None = None,
                        progress: bool = False) -> dict[str, float]:
    """Images per second of several forwards measured together, so that they can be compared.

    Timing each forward on its own lets the machine's load drift between them (a pruned
    forward measured under load can come out slower than the full model measured idle).
    Here every round times each forward once (``repeats`` calls, device-synchronised), in an
    order that rotates from round to round, and each forward's throughput is the median over
    the ``rounds`` rounds; a speed-up is then a ratio of two medians measured side by side.

    Args:
        fns: ``{name: fn}``, each taking ``batch`` (e.g. ``"full"`` and one pruned forward per
            scorer kind).
        batch: a ``[B,...]`` tensor, a ``Batch`` (``.images``), or a sized sequence.
        repeats: calls timed per forward per round (≥ 1).
        warmup: untimed calls of every forward first.
        rounds: interleaved rounds (≥ 1).
        device: device to synchronise; ``None`` → that of ``batch``.
        progress: a bar over the forwards (minutes on a CPU for a regime sweep's points).

    Returns:
        ``{name: images/s}`` (median over rounds of ``B · repeats / seconds``).

    Raises:
        ValueError: ``repeats`` or ``rounds`` below 1, or no forward.
    """
    if repeats < 1 or rounds < 1 or not fns:
        raise ValueError(f"need repeats ≥ 1, rounds ≥ 1 and at least one forward, got repeats={repeats}, "
                         f"rounds={rounds}, {len(fns)} forward(s)")
    if device is None:
        t = batch.images if hasattr(batch, "images") else batch
        device = t.device if isinstance(t, Tensor) else None
    dev = torch.device(device) if device is not None else None
    n = _num_images(batch)
    names = list(fns)
    rates: dict[str, list[float]] = {k: [] for k in names}
    with torch.no_grad(), tqdm(total=len(names) * (warmup + rounds), desc=f"throughput of {len(names)} forwards",
                               unit="forward", disable=not progress) as bar:
        for k in names:
            for _ in range(warmup):
                fns[k](batch)
            bar.update(warmup)
        for r in range(rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                _sync(dev)
                t0 = time.perf_counter()
                for _ in range(repeats):
                    fns[k](batch)
                _sync(dev)
                rates[k].append(n * repeats / max(time.perf_counter() - t0, 1e-12))
                bar.update()
    return {k: float(statistics.median(v)) for k, v in rates.items()}


#: interleaved rounds of every throughput measurement of the protocol (:func:`measure_speed`)
SPEED_ROUNDS = 3


def measure_speed(backbone: nn.Module, images: Tensor, points: Sequence[tuple[int, float]],
                  scorers: dict[str, TokenScorer], *, repeats: int = 2, rounds: int = SPEED_ROUNDS,
                  progress: bool = False) -> tuple[float, dict[tuple[int, float], dict[str, float]]]:
    """Throughput (images/s) of the full model and of the pruned forward with each scorer at each point
    ``(L, b)``, measured together in interleaved rounds (:func:`midas_nb.metrics.measure_throughputs`)
    so that every speed-up is a ratio of two numbers taken under the same load.

    Args:
        backbone: the frozen ViT (its attention setting is left as the caller set it).
        images: ``[B,3,H,W]`` on the measuring device.
        points: the ``(L, b)`` of the pruned forwards.
        scorers: ``{kind: scorer}``; the weights do not matter, only the architecture.
        repeats, rounds: timed calls per round, interleaved rounds.

    Returns:
        ``(full, {(L, b): {kind: …}})`` in images/s.
    """
    fns: dict[Any, Callable[[Any], Any]] = {"full": backbone}
    fns.update({(L, b, k): (lambda x, s=s, L=L, b=b: pruned_forward(backbone, x, s, L, b).logits)
                for L, b in points for k, s in scorers.items()})
    rates = measure_throughputs(fns, images, repeats=repeats, warmup=1, rounds=rounds, progress=progress)
    return rates["full"], {(L, b): {k: rates[(L, b, k)] for k in scorers} for L, b in points}


def _cropr_readout(scorer: CroprScorer, backbone: nn.Module, hidden: Tensor, labels: Tensor, scores: Tensor, *,
                   depth: int, budget: float, num_prefix: int, images: Tensor | None) -> dict[str, Any]:
    device = next(backbone.parameters()).device
    llf, aux = [], []
    with torch.no_grad():
        for i in range(0, hidden.shape[0], 64):
            h = hidden[i:i + 64].to(device, torch.float32)
            llf.append(prune_tokens_llf(backbone, h, scores[i:i + 64].to(device), depth, budget)
                       .logits.argmax(-1).cpu())
            aux.append(scorer.aux_logits(h, num_prefix).argmax(-1).cpu())
    labels = labels.cpu()
    mean, lo, hi = bootstrap_ci((torch.cat(llf) == labels).float())
    out: dict[str, Any] = dict(accuracy_llf=mean, accuracy_llf_lo=lo, accuracy_llf_hi=hi,
                               aux_accuracy=float((torch.cat(aux) == labels).float().mean()))
    if images is not None:
        speed = {True: 0.0, False: 0.0}
        for _ in range(2):
            for fusion in (False, True):
                speed[fusion] = max(speed[fusion], measure_throughput(
                    lambda x, f=fusion: cropr_forward(backbone, x, scorer, depth, budget, fusion=f).logits,
                    images, repeats=3, warmup=1))
        out.update(throughput_llf=speed[True], llf_speed_ratio=speed[True] / speed[False])
    return out


def _iared_readout(scorer: IARedScorer, backbone: nn.Module, hidden: Tensor, labels: Tensor, scores: Tensor, *,
                   depth: int, budget: float, num_prefix: int, images: Tensor | None) -> dict[str, Any]:
    device = next(backbone.parameters()).device
    keep = scores > scorer.threshold
    with torch.no_grad():
        preds = [masked_logits(backbone, hidden[i:i + 64].to(device, torch.float32), keep[i:i + 64].to(device),
                               depth).argmax(-1).cpu() for i in range(0, hidden.shape[0], 64)]
    mean, lo, hi = bootstrap_ci((torch.cat(preds) == labels.cpu()).float())
    return dict(threshold_keep_rate=float(keep.float().mean()), threshold_accuracy=mean,
                threshold_accuracy_lo=lo, threshold_accuracy_hi=hi, threshold=scorer.threshold)


def family_readout(scorer: TokenScorer, backbone: nn.Module, hidden: Tensor, labels: Tensor, scores: Tensor, *,
                   depth: int, budget: float, num_prefix: int, images: Tensor | None = None) -> dict[str, Any]:
    """A scorer family's own columns of its protocol rows (DESIGN.md §5); ``{}`` for other scorers.

    - Cropr (:class:`~midas_nb.scorers.CroprScorer`): ``accuracy_llf`` (+ bootstrap CI,
      ``accuracy_llf_lo``/``_hi``) of the last-layer-fusion forward
      (:func:`~midas_nb.scorers.prune_tokens_llf`), ``aux_accuracy`` of the auxiliary head and,
      given ``images``, ``throughput_llf`` (images/s) with ``llf_speed_ratio`` = LLF / plain Cropr
      pruning, both timed in alternation (the best of two rounds each) so that the ratio does not
      depend on the machine's load. Bergner et al., 2025, https://arxiv.org/abs/2412.00965.
    - IA-RED² (:class:`~midas_nb.scorers.IARedScorer`): the interpreter's own rule, keep
      ``π_j > threshold`` (:func:`~midas_nb.scorers.masked_logits`): ``threshold_keep_rate`` (mean
      kept fraction), ``threshold_accuracy`` (+ bootstrap CI) and ``threshold``. Pan et al., 2021,
      https://arxiv.org/abs/2106.12620.

    Args:
        scorer: the trained scorer.
        backbone: the frozen timm ViT.
        hidden: ``[n,P+N,D]`` block-``L`` states of the evaluated test images (CPU cache).
        labels: ``[n]`` long labels.
        scores: ``[n,N]`` this scorer's scores of those images.
        depth, budget, num_prefix: ``L``, ``b``, ``P``.
        images: ``[B,3,H,W]`` a batch on the backbone's device for throughput, or ``None``.

    Returns:
        ``{column: value}``, merged into the row.
    """
    readout = (_cropr_readout if isinstance(scorer, CroprScorer) else _iared_readout if isinstance(scorer, IARedScorer)
               else None)
    return {} if readout is None else readout(scorer, backbone, hidden, labels, scores, depth=depth, budget=budget,
                                              num_prefix=num_prefix, images=images)
