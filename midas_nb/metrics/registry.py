"""The metric registry: each metric with its direction, category and source (Quantus-style metadata)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping

from ..point import Registry

MetricCategory = Literal["localisation", "faithfulness", "decoupling", "accuracy", "efficiency"]


# ---------------------------------------------------------------------------------------------
# registry
# ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class MetricSpec:
    """A registered metric: the function and its metadata.

    Attributes:
        name: registry key.
        fn: the function computing it.
        higher_is_better: direction of the headline value.
        category: ``"localisation" | "faithfulness" | "decoupling" | "accuracy" | "efficiency"``.
        reference: the source (paper and arXiv link, or the MIDAS definition).
        summary: a one-line definition.
        field_directions: for metrics that return several values, ``{field: higher_is_better}``
            (e.g. ``insertion_deletion_auc``: ``ins_auc`` ↑, ``del_auc`` ↓, ``idauc`` ↑).
    """

    name: str
    fn: Callable[..., Any]
    higher_is_better: bool
    category: MetricCategory
    reference: str
    summary: str
    field_directions: Mapping[str, bool] = field(default_factory=dict)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)


_METRICS = Registry("metric")


def register_metric(name: str, *, higher_is_better: bool, category: MetricCategory, reference: str, summary: str,
        field_directions: Mapping[str, bool] | None = None) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Decorator registering ``fn`` under ``name``; also sets ``fn.higher_is_better``."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        _METRICS.add(name, MetricSpec(name, fn, higher_is_better, category, reference, summary,
                                      dict(field_directions or {})))
        fn.higher_is_better = higher_is_better  # type: ignore[attr-defined]
        return fn

    return deco


def list_metrics(category: MetricCategory | None = None) -> list[str]:
    """Names of the registered metrics (optionally of one ``category``), in registration order."""
    return [n for n, m in _METRICS.items() if category is None or m.category == category]


def get_metric(name: str) -> MetricSpec:
    """The :class:`MetricSpec` registered under ``name`` (``ValueError`` for an unknown name, listing
    the known ones)."""
    return _METRICS[name]
