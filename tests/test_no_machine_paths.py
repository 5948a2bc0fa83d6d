"""No committed text file names a path of one machine (``/tmp/…``, ``/home/…``, ``/work/…``, …):
the README, the docs, the committed results, the notebooks, the bench scripts and the package
are read on other machines. Example paths that the documentation and the CLI help name on
purpose are listed in ``ALLOWED``, each explicitly."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]

# what is scanned: the files a reader or another machine uses (tests may build paths of their own)
SCANNED = re.compile(r"^(README\.md|CHANGELOG\.md|docs/.*|results/.*\.(md|csv)|notebooks/.*\.ipynb|bench/.*|midas_nb/.*)$")

# an absolute path under a root that belongs to one machine or user, not preceded by a path or URL
MACHINE_PATH = re.compile(
    r"(?<![\w.~$})\]/:-])/(tmp|work|home|root|Users|mnt|scratch|private|var|opt|srv|media|nfs|gpfs|lustre|data|weights)"
    r"/[^\s`'\")\]},;|\\]*")

# documented example paths (CLI help, README, run-file examples), written out one by one
ALLOWED = {
    "/data/CUB_200_2011",
    "/data/fgvc-aircraft-2013b",
    "/data/stanford_cars",
    "/weights/deit_tiny_patch16_224-a1311bcf.pth",
    "/weights/deit_small_patch16_224-cd65a155.pth",
    "/weights/model.safetensors",
    "/weights/B_16-i21k-300ep-...-res_224.npz",
    "/weights/B_16-i21k-300ep-lr_0.001-aug_medium1-wd_0.1-do_0.0-sd_0.0--imagenet2012-steps_20k-lr_0.01-res_224.npz",
}


def _committed_text_files() -> list[Path]:
    names = subprocess.run(["git", "ls-files"], cwd=REPO, capture_output=True, text=True, check=True).stdout.split("\n")
    out = []
    for name in names:
        path = REPO / name
        if not name or not SCANNED.match(name) or not path.is_file():
            continue
        try:
            path.read_text(encoding="utf-8")
        except UnicodeDecodeError:                      # binary (figures, weights): not text
            continue
        out.append(path)
    return out


def machine_paths(text: str) -> list[str]:
    """The machine paths in ``text`` that are not documented examples."""
    return [m.group(0) for m in MACHINE_PATH.finditer(text) if m.group(0).rstrip(".:") not in ALLOWED]


def test_the_pattern_finds_machine_paths_and_spares_examples():
    assert machine_paths("store /tmp/q9/runs/sweeps/quick and `/home/me/x`") == ["/tmp/q9/runs/sweeps/quick",
                                                                               "/home/me/x"]
    assert machine_paths("(/Users/a/b.csv) root=/work/wt/x") == ["/Users/a/b.csv", "/work/wt/x"]
    assert machine_paths("--data-root cub=/data/CUB_200_2011 and https://example.org/tmp/x, runs/tmp/y") == []
    assert machine_paths("$MIDAS_CACHE_DIR/checkpoints/a.json, ~/.cache/midas_nb, cache_dir()/data/x") == []


def test_git_lists_files_to_scan():
    files = {p.relative_to(REPO).as_posix() for p in _committed_text_files()}
    assert {"README.md", "results/REPORT.md", "results/provenance.csv", "midas_nb/cli/__init__.py"} <= files


@pytest.mark.parametrize("path", _committed_text_files(), ids=lambda p: p.relative_to(REPO).as_posix())
def test_no_committed_file_names_a_machine_path(path):
    found = [(n, hit) for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
             for hit in machine_paths(line)]
    assert not found, "\n".join(f"{path.relative_to(REPO)}:{n}: {hit}" for n, hit in found)


def test_the_tests_write_under_runs_test_whatever_the_environment_says(tmp_path):
    """A user's exported MIDAS_RUNS_DIR / MIDAS_FIGURES_DIR / MIDAS_PROFILE never reach the tests: their
    cells would mix into that user's result store and nbval would run another profile."""
    env = dict(os.environ, MIDAS_RUNS_DIR=str(tmp_path / "mine"), MIDAS_FIGURES_DIR=str(tmp_path / "fig"),
               MIDAS_PROFILE="quick")
    out = subprocess.run([sys.executable, "-c", "import os, conftest; print(os.environ['MIDAS_RUNS_DIR']); "
                          "print(os.environ['MIDAS_FIGURES_DIR']); print(os.environ['MIDAS_PROFILE'])"],
                         cwd=REPO, env=env, capture_output=True, text=True, check=True).stdout.split()
    assert out == [str(REPO / "runs" / "test"), str(REPO / "runs" / "test" / "figures"), "smoke"]
