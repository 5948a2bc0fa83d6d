"""The pruning point ``(L, b)`` as typed values checked where made (``Budget(1.5)`` raises ``ValueError``;
docs/decisions/0058-typed-point.md), the value helpers of settings messages, :class:`Registry` and
:func:`lazy_names`: torch-free, so that the report renders its tables without torch (decision 0080)."""
from __future__ import annotations

import difflib
import importlib
import math
import numbers
import sys
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

__all__ = ["MIN_BUDGET", "Budget", "Point", "is_int", "is_number", "show_value", "did_you_mean", "lazy_names"]

#: the smallest budget b: result cells key b to 6 decimals (:class:`midas_nb.sweeps.SweepCell`)
MIN_BUDGET = 1e-6


def is_int(v: Any) -> bool:
    """An integer (NumPy's too), not a bool."""
    return isinstance(v, numbers.Integral) and not isinstance(v, bool)


def is_number(v: Any) -> bool:
    """A finite real number, not a bool."""
    return isinstance(v, numbers.Real) and not isinstance(v, bool) and math.isfinite(float(v))


def show_value(v: Any) -> str:
    """A bad setting in a message: its ``repr``, another than a builtin type named beside it (``0.5 (Budget)``)."""
    builtin = type(v) in (str, int, float, bool, type(None), list, tuple, dict)
    return repr(v) if builtin else f"{v!r} ({type(v).__name__})"


def did_you_mean(names: Iterable[str], known: Iterable[str]) -> str:
    """``" (did you mean 'seeds'?)"`` for the names with a close match in ``known``, else ``""``."""
    known = sorted(set(known))
    pairs = [(n, m[0]) for n in names if (m := difflib.get_close_matches(n, known, n=1, cutoff=0.6))]
    if len(pairs) == 1:
        return f" (did you mean {pairs[0][1]!r}?)"
    return f" (did you mean: {', '.join(f'{n!r} -> {m!r}' for n, m in pairs)}?)" if pairs else ""


class Budget(float):
    """The kept fraction ``b`` of patch tokens, ``MIN_BUDGET ≤ b ≤ 1``: a ``float`` checked when made."""

    __slots__ = ()

    def __new__(cls, value: Any) -> "Budget":
        if isinstance(value, Budget):
            return value
        if not (is_number(value) and 0 < float(value) <= 1):
            raise ValueError(f"budget: expected a kept fraction b in (0, 1] (e.g. 0.25), got {show_value(value)}")
        if float(value) < MIN_BUDGET:
            raise ValueError(f"budget: {value!r} is below {MIN_BUDGET:g}, the resolution at which result cells "
                             f"key b (6 decimals; it would round to 0); expected b in [{MIN_BUDGET:g}, 1]")
        return super().__new__(cls, float(value))

    def keyed(self) -> "Budget":
        """``b`` rounded to the 6 decimals at which result cells key it (still ``≥ MIN_BUDGET``)."""
        return float.__new__(Budget, round(float(self), 6))

    def __repr__(self) -> str:
        return float.__repr__(self)


@dataclass(frozen=True)
class Point:
    """Depth ``L`` (the scorer reads block ``L``, 1-based) and budget ``b``; ``ValueError``, one line per problem."""

    depth: int
    budget: Budget

    def __post_init__(self) -> None:
        problems = []
        if not (is_int(self.depth) and self.depth >= 1):
            problems.append("depth: expected an integer L >= 1 (the scorer reads block L), "
                            f"got {show_value(self.depth)}")
        try:
            object.__setattr__(self, "budget", Budget(self.budget))
        except ValueError as e:
            problems.append(str(e))
        if problems:
            raise ValueError("\n".join(problems))
        object.__setattr__(self, "depth", int(self.depth))


class Registry(dict):
    """Targets, scorers or metrics (``kind``) by name: a name added twice or unknown raises ``ValueError``."""

    def __init__(self, kind: str):
        super().__init__()
        self.kind = kind

    def add(self, name: str, entry: Any) -> Any:
        if name in self:
            raise ValueError(f"{self.kind} {name!r} is already registered")
        return self.setdefault(name, entry)

    def __missing__(self, name: str) -> Any:
        raise ValueError(f"unknown {self.kind} {name!r}; expected one of {list(self)}")


def lazy_names(package: str, names: Mapping[str, str]) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """PEP 562 ``(__getattr__, __dir__)`` of ``package``: each of ``names`` (``{name: submodule}``, relative as
    ``".study"``) imported on first use and kept in the package's namespace; another name: ``AttributeError``."""
    def __getattr__(name: str) -> Any:
        if name not in names:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(names[name], package), name)
        setattr(sys.modules[package], name, value)
        return value

    return __getattr__, lambda: sorted(set(vars(sys.modules[package])) | set(names))
