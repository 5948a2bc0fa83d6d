"""The target registry (:class:`TargetInfo` metadata) and :class:`Registry`, that of targets, scorers and metrics."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Literal

import pandas as pd
from torch import Tensor

from ..capture import CaptureResult
from ..point import Registry

TargetFn = Callable[[CaptureResult, int, Tensor], Tensor]

#: seed of the ``random`` target when neither the call nor ``capture.extras["seed"]`` gives one
DEFAULT_RANDOM_SEED = 0


_REGISTRY = Registry("target")


@dataclass(frozen=True)
class TargetInfo:
    """Where a target sits in the MIDAS taxonomy (DESIGN.md §4): its ``name``, ``source``
    (attention or hidden state), ``operator``, what it is the ``gradient_of`` (``"—"`` when it
    needs no gradient), its ``definition`` for patch token ``j``, and its ``group``
    (``"taxonomy"``: T0–T5; ``"related"``: the related methods' maps)."""

    name: str
    source: str
    operator: str
    gradient_of: str
    definition: str
    group: Literal["taxonomy", "related"] = "taxonomy"


_INFO = Registry("target with taxonomy metadata")


def register_target(name: str, info: TargetInfo | None = None) -> Callable[[TargetFn], TargetFn]:
    """Decorator registering a target function under ``name`` (like timm's ``register_model``),
    with its taxonomy metadata ``info`` (:func:`target_info`, :func:`taxonomy_table`).

    Raises:
        ValueError: if ``name`` is already registered.
    """
    def deco(fn: TargetFn) -> TargetFn:
        _REGISTRY.add(name, fn)
        if info is not None:
            _INFO[name] = info
        fn.target_id = name  # type: ignore[attr-defined]
        return fn
    return deco


def target_info(name: str) -> TargetInfo:
    """The taxonomy metadata of a registered target.

    Raises:
        ValueError: an unknown target, or one registered without metadata.
    """
    return _INFO[name]


def taxonomy_table(related: bool = False) -> pd.DataFrame:
    """The MIDAS supervision-target taxonomy T0–T5 (source × operator, DESIGN.md §4), read
    from the registered targets' :class:`TargetInfo`.

    Args:
        related: also list the related-method targets (rollout, TokenTM, LaSt-ViT votes,
            random).

    Returns:
        DataFrame indexed by target id with columns ``name``, ``source``, ``operator``,
        ``gradient of`` and ``definition (patch token j)``.
    """
    groups = ("taxonomy", "related") if related else ("taxonomy",)
    rows = [(tid, i.name, i.source, i.operator, i.gradient_of, i.definition)
            for g in groups for tid, i in _INFO.items() if i.group == g]
    df = pd.DataFrame(rows, columns=["id", "name", "source", "operator", "gradient of", "definition (patch token j)"])
    return df.set_index("id")


def list_targets() -> list[str]:
    """Ids of the registered targets, in registration order (``T0`` … ``T5``, ``rollout``, …)."""
    return list(_REGISTRY)


def get_target(name: str) -> TargetFn:
    """The target function registered under ``name`` (``ValueError`` for an unknown id, listing the known ones)."""
    return _REGISTRY[name]
