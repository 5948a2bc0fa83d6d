"""Sweep cells: one cell = one protocol run for (dataset, backbone, L, b, condition, seed), keyed by
content (docs/decisions/0015-cell-identity.md). The grids of a profile: :func:`midas_nb.study.make_grid`."""
from __future__ import annotations

import functools
import json
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, Mapping

from ..identity import RESULT_FORMAT_VERSION, canonical_json, hash_json
from ..point import Budget

__all__ = ["SweepCell", "CellState", "ExecutorKind"]

ExecutorKind = Literal["local", "processes", "slurm"]
CellState = Literal["done", "failed", "running", "pending"]


@dataclass(frozen=True)
class SweepCell:
    """One protocol run: scorer depth ``L`` (1-based block), kept fraction ``b ∈ (0, 1]``, ``condition``
    (``"reference"``, ``"unsupervised"`` or a target id), ``seed``; ``checkpoint_id``
    (:func:`midas_nb.study.checkpoint_spec_id`), ``data_id`` (:func:`midas_nb.study.eval_data_id`) and
    ``params`` (JSON settings that change the result; not in ``hash()``). Every field is in :attr:`key`."""

    dataset: str
    backbone: str
    depth: int
    budget: float
    condition: str
    seed: int
    checkpoint_id: str = ""
    params: Mapping[str, Any] = field(default_factory=dict, hash=False)
    data_id: str = ""

    def __post_init__(self) -> None:
        # normalise types so that equal cells hash equally (e.g. numpy ints, 0.25 vs 0.2500000001)
        object.__setattr__(self, "depth", int(self.depth))
        object.__setattr__(self, "seed", int(self.seed))
        object.__setattr__(self, "budget", Budget(self.budget).keyed())
        object.__setattr__(self, "params", json.loads(canonical_json(dict(self.params))))
        if self.depth < 1:
            raise ValueError(f"depth must be >= 1 (1-based block index), got {self.depth}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: Mapping[str, Any]) -> "SweepCell":
        return cls(**{k: d[k] for k in ("dataset", "backbone", "depth", "budget", "condition", "seed")},
                   checkpoint_id=d.get("checkpoint_id", ""), params=d.get("params", {}),
                   data_id=d.get("data_id", ""))

    @functools.cached_property          # (a frozen cell: its key computed once)
    def key(self) -> str:
        """16 hex digits of the SHA-256 of every field and ``RESULT_FORMAT_VERSION`` (canonical JSON)."""
        return hash_json(dict(self.to_dict(), result_format=RESULT_FORMAT_VERSION), 16)

    @property
    def label(self) -> str:
        """Readable short name, e.g. ``cub/hybrid_lite0_vit L6 b0.25 T5 s0``."""
        return f"{self.dataset}/{self.backbone} L{self.depth} b{self.budget:g} {self.condition} s{self.seed}"
