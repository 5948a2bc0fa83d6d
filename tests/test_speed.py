"""Interleaved throughput measurement (metrics.measure_throughputs) on a deterministic clock."""
from __future__ import annotations

import pytest
import torch

from midas_nb.metrics import measure_throughputs
from midas_nb.metrics import speed as speed_mod


class _Clock:
    """perf_counter that advances only when a forward runs: each forward costs its own seconds,
    plus a load that grows over time (what separate measurements would pick up)."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_interleaved_rounds_rotate_and_take_the_median(monkeypatch):
    clock = _Clock()
    monkeypatch.setattr(speed_mod.time, "perf_counter", clock)
    calls: list[str] = []

    def forward(name: str, cost: float):
        def fn(x):
            calls.append(name)
            clock.t += cost * (1.0 + 0.01 * len(calls))      # the machine slows down as it runs
        return fn

    fns = {"full": forward("full", 0.10), "pruned": forward("pruned", 0.05)}
    x = torch.zeros(4, 3)
    out = measure_throughputs(fns, x, repeats=2, warmup=1, rounds=3)
    # warmup once each, then rounds in rotating order: full, pruned | pruned, full | full, pruned
    assert calls == ["full", "pruned"] + ["full"] * 2 + ["pruned"] * 2 + ["pruned"] * 2 + ["full"] * 2 \
        + ["full"] * 2 + ["pruned"] * 2
    # recompute the rates by hand from the same clock model
    t, rates, n = 0.0, {"full": [], "pruned": []}, 2
    for name in calls[:2]:
        n += 1
    order = [("full", 0.10), ("pruned", 0.05), ("pruned", 0.05), ("full", 0.10), ("full", 0.10), ("pruned", 0.05)]
    k = 2
    for name, cost in order:
        dt = 0.0
        for _ in range(2):
            k += 1
            dt += cost * (1.0 + 0.01 * k)
        rates[name].append(4 * 2 / dt)
    for name in ("full", "pruned"):
        assert out[name] == pytest.approx(sorted(rates[name])[1], rel=1e-12)
    assert out["pruned"] > out["full"]          # half the cost, measured side by side


def test_bad_arguments():
    with pytest.raises(ValueError, match="rounds ≥ 1"):
        measure_throughputs({"a": lambda x: x}, torch.zeros(1), rounds=0)
    with pytest.raises(ValueError, match="at least one forward"):
        measure_throughputs({}, torch.zeros(1))


def test_measure_throughput_names_only_the_repeats_it_was_given():
    from midas_nb.metrics import measure_throughput

    with pytest.raises(ValueError, match=r"^repeats must be ≥ 1, got 0$"):
        measure_throughput(lambda b: b, torch.zeros(2, 3), repeats=0)
    assert measure_throughput(lambda b: b, torch.zeros(2, 3), repeats=1) > 0
