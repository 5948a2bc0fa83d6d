"""Accuracy of the pruned model and device-synchronised throughput."""
from __future__ import annotations

import statistics
import time
from typing import TYPE_CHECKING, Any, Callable, Sequence

import torch
from torch import Tensor, nn

from ..pruning import pruned_forward
from .registry import register_metric

if TYPE_CHECKING:  # annotations only: the scorers sit above the metrics
    from ..scorers import TokenScorer


@register_metric("pruned_accuracy", higher_is_better=True, category="accuracy",
                 reference="top-1 accuracy",
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
    for attr in ("images",):
        if hasattr(batch, attr):
            return int(getattr(batch, attr).shape[0])
    if isinstance(batch, Tensor):
        return int(batch.shape[0])
    return len(batch)


@register_metric("throughput", higher_is_better=True, category="efficiency",
                 reference="wall-clock images per second (device-synchronised)",
                 summary="images per second of the pruned forward")
def measure_throughput(
    fn: Callable[[Any], Any],
    batch: Any,
    repeats: int = 10,
    warmup: int = 2,
    *,
    device: torch.device | str | None = None,
) -> float:
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
    if repeats < 1:
        raise ValueError(f"repeats must be ≥ 1, got {repeats}")
    if device is None:
        t = batch.images if hasattr(batch, "images") else batch
        device = t.device if isinstance(t, Tensor) else None
    dev = torch.device(device) if device is not None else None
    n = _num_images(batch)
    with torch.no_grad():
        for _ in range(warmup):
            fn(batch)
        _sync(dev)
        t0 = time.perf_counter()
        for _ in range(repeats):
            fn(batch)
        _sync(dev)
        elapsed = time.perf_counter() - t0
    return n * repeats / max(elapsed, 1e-12)


def measure_throughputs(
    fns: dict[str, Callable[[Any], Any]],
    batch: Any,
    repeats: int = 5,
    warmup: int = 1,
    rounds: int = 3,
    *,
    device: torch.device | str | None = None,
) -> dict[str, float]:
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
    with torch.no_grad():
        for k in names:
            for _ in range(warmup):
                fns[k](batch)
        for r in range(rounds):
            for k in names[r % len(names):] + names[:r % len(names)]:
                _sync(dev)
                t0 = time.perf_counter()
                for _ in range(repeats):
                    fns[k](batch)
                _sync(dev)
                rates[k].append(n * repeats / max(time.perf_counter() - t0, 1e-12))
    return {k: float(statistics.median(v)) for k, v in rates.items()}


#: interleaved rounds of every throughput measurement of the protocol (:func:`measure_speed`)
SPEED_ROUNDS = 3


def measure_speed(backbone: nn.Module, images: Tensor, points: Sequence[tuple[int, float]],
                  scorers: dict[str, TokenScorer], *, repeats: int = 2, rounds: int = SPEED_ROUNDS
                  ) -> tuple[float, dict[tuple[int, float], dict[str, float]]]:
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
    rates = measure_throughputs(fns, images, repeats=repeats, warmup=1, rounds=rounds)
    return rates["full"], {(L, b): {k: rates[(L, b, k)] for k in scorers} for L, b in points}
