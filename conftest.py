"""Shared test configuration.

- Notebooks validated by nbval run in the smoke profile (``MIDAS_PROFILE=smoke``) without widgets
  (``MIDAS_HEADLESS=1``), set here before any kernel starts so the kernels inherit them.
- Caches (checkpoints, targets, scorers) go to ``<repo>/.cache/midas_nb_test``, result stores and tables
  to ``<repo>/runs/test`` and figures to ``<repo>/runs/test/figures`` whatever the environment says, so
  the tests never read or write a user's cache or the results of a user's ``midas-nb run`` (a fresh user
  who had exported ``MIDAS_CACHE_DIR`` found the tests' smoke checkpoints in their run's cache).
- ``shared_data`` locates ``../shared/data``; tests that need it skip with a clear reason.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent
SHARED_DATA = REPO.parent / "shared" / "data"

# set, not defaulted: a user's exported MIDAS_PROFILE / MIDAS_*_DIR would make nbval run another profile, and the
# tests' cells, checkpoints and figures mix into that user's result store, cache and figures
os.environ["MIDAS_PROFILE"] = "smoke"
os.environ["MIDAS_CACHE_DIR"] = str(REPO / ".cache" / "midas_nb_test")
os.environ["MIDAS_RUNS_DIR"] = str(REPO / "runs" / "test")
os.environ["MIDAS_FIGURES_DIR"] = str(REPO / "runs" / "test" / "figures")
os.environ.setdefault("MPLBACKEND", "Agg")
os.environ.setdefault("TQDM_DISABLE", "1")
os.environ.setdefault("MIDAS_HEADLESS", "1")      # nbval's kernels: the explorer draws its static still


@pytest.fixture(scope="session")
def shared_data() -> Path:
    """``../shared/data``; skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"real data not found at {SHARED_DATA} (../shared/data relative to the repo root)")
    return SHARED_DATA
