"""What a cell's claim saves and what it costs (decision 0078).

Two sweeps started together over one store and one grid (``--cells`` cells of ``--cell-s`` seconds each,
a sleep standing in for the protocol): with claims (:meth:`midas_nb.sweeps.ResultStore.hold`, a kernel
``flock``) and with claims switched off (every hold succeeds). Prints the cells computed, the cell-seconds
spent and the wall time of each, what one claim costs (hold + release, mean of ``--n-claims``), and
``ratio:`` cell-seconds without claims / with them (2 means every cell computed twice without claims).

Usage: ``python bench/claims_cost.py [--cells 8] [--cell-s 0.3] [--n-claims 2000]``
"""
from __future__ import annotations

import argparse
import multiprocessing
import os
import sys
import tempfile
import time
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from midas_nb.sweeps import ResultStore, SweepCell, run_sweep  # noqa: E402


class SleepCell:
    """A cell function that sleeps ``seconds`` and leaves a ``start-*`` marker in ``marker_dir``."""

    def __init__(self, marker_dir: str, seconds: float) -> None:
        self.marker_dir, self.seconds = marker_dir, seconds

    def __call__(self, cell: SweepCell) -> dict:
        (Path(self.marker_dir) / f"start-{cell.key}-{uuid.uuid4().hex}").touch()
        time.sleep(self.seconds)
        return dict(value=cell.depth)


def _sweep(root: str, cells: list[SweepCell], fn: SleepCell, claims: bool, go) -> None:
    if not claims:      # every hold succeeds: a descriptor that locks nothing
        ResultStore.hold = lambda self, key, wait=False: os.open(os.devnull, os.O_RDONLY)
        ResultStore.release = lambda self, key, fd: os.close(fd)
    go.wait()
    run_sweep(cells, fn, root)


def two_sweeps(n_cells: int, cell_s: float, claims: bool) -> tuple[int, float]:
    """``(cells computed, wall seconds)`` of two sweeps started together over one grid."""
    cells = [SweepCell("synthetic", "bench", depth=L, budget=0.25, condition="reference", seed=0)
             for L in range(1, n_cells + 1)]
    with tempfile.TemporaryDirectory() as tmp:
        markers = Path(tmp) / "markers"
        markers.mkdir()
        ctx = multiprocessing.get_context("fork")
        go = ctx.Event()
        fn = SleepCell(str(markers), cell_s)
        procs = [ctx.Process(target=_sweep, args=(str(Path(tmp) / "store"), cells, fn, claims, go)) for _ in range(2)]
        for p in procs:
            p.start()
        time.sleep(0.5)
        start = time.perf_counter()
        go.set()
        for p in procs:
            p.join()
        wall = time.perf_counter() - start
        assert all(p.exitcode == 0 for p in procs) and ResultStore(Path(tmp) / "store").status(cells)["status"].eq(
            "done").all()
        return len(list(markers.iterdir())), wall


def claim_cost_s(n: int) -> float:
    """Seconds of one hold + release of an unheld claim (mean of ``n``)."""
    with tempfile.TemporaryDirectory() as tmp:
        store = ResultStore(tmp)
        start = time.perf_counter()
        for i in range(n):
            store.release(f"k{i % 16}", store.hold(f"k{i % 16}"))
        return (time.perf_counter() - start) / n


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--cells", type=int, default=8)
    ap.add_argument("--cell-s", type=float, default=0.3)
    ap.add_argument("--n-claims", type=int, default=2000)
    args = ap.parse_args(argv)
    spent = {}
    for claims in (True, False):
        n, wall = two_sweeps(args.cells, args.cell_s, claims)
        spent[claims] = n * args.cell_s
        print(f"two sweeps of {args.cells} cells, claims {'on ' if claims else 'off'}: {n} cells computed, "
              f"{spent[claims]:.1f} cell-s, wall {wall:.2f} s")
    cost = claim_cost_s(args.n_claims)
    print(f"one claim (hold + release, unheld): {cost * 1e6:.0f} us; on a cell of {args.cell_s:g} s: "
          f"{100 * cost / args.cell_s:.3f} %")
    print(f"ratio: {spent[False] / spent[True]:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
